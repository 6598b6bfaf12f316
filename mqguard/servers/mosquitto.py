"""A local Mosquitto 2.0 broker.

Facts that matter to tests (Mosquitto 2.0.11, paho-mqtt 2.x, MQTT v5, QoS 1):

* user properties round-trip; the Message Expiry Interval is honoured and expired messages are
  silently dropped (no expiry topic, no dead-letter, no delivery count);
* manual acks work with ``Client(..., manual_ack=True)`` and ``client.ack(mid, qos)``;
* the log (``mosquitto.log`` in the state dir) has ISO timestamps
  (``log_timestamp_format %Y-%m-%dT%H:%M:%S``) and logs every connect/disconnect.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    make_state_dir,
    spawn,
    terminate_pid,
)
from mqguard.servers.install import ensure_installed, find_binary
from mqguard.servers.ports import LOOPBACK, free_port, wait_until

__all__ = ["mosquitto_version", "start_mosquitto"]

_START_TIMEOUT = 30.0


def _binary() -> str:
    path = find_binary("mosquitto")
    if path is None:
        raise ServerStartError("mosquitto not found")
    return path


def mosquitto_version() -> str:
    """Version of the installed broker (e.g. ``2.0.11``)."""
    # `mosquitto -h` prints the usage (with the version on the first line) and exits 3.
    out = subprocess.run([_binary(), "-h"], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1] if "version" in first else first


def _log_types(debug: bool) -> list[str]:
    if debug:
        return ["log_type all"]
    kinds = ("error", "warning", "notice", "information", "subscribe", "unsubscribe")
    return [f"log_type {kind}" for kind in kinds]


def _running(log: Path, offset: int) -> bool:
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            return b" running" in fh.read()
    except OSError:
        return False


def start_mosquitto(
    state_dir: Path | None = None, port: int | None = None, *, debug_log: bool = False
) -> ServerHandle:
    """Start Mosquitto on 127.0.0.1 with persistence and a timestamped log in the state dir.

    ``debug_log=True`` also logs every PUBLISH/PUBACK; it is off by default because it costs
    a large share of the broker's throughput.
    """
    ensure_installed(["mosquitto"])
    sd = make_state_dir("mosquitto", state_dir)
    port = port or free_port()
    log = sd / "mosquitto.log"
    data = sd / "data"
    data.mkdir(exist_ok=True)
    conf = sd / "mosquitto.conf"
    conf.write_text(
        "\n".join(
            [
                f"listener {port} {LOOPBACK}",
                "allow_anonymous true",
                # As root, mosquitto otherwise drops to the `mosquitto` user, which cannot
                # write our temp state dir (persistence and log would fail).
                "user root",
                "persistence true",
                f"persistence_location {data}/",
                f"log_dest file {log}",
                *_log_types(debug_log),
                "log_timestamp true",
                "log_timestamp_format %Y-%m-%dT%H:%M:%S",
                "connection_messages true",
                # Mosquitto's default of 1000 queued QoS 1 messages per offline session
                # silently drops the rest; tests and benchmarks preload more than that.
                "max_queued_messages 1000000",
                # Without it a burst of small PUBACKs waits on Nagle and the peer's delayed
                # ACK (40 ms on Linux) whenever a client pipelines QoS 1 publishes.
                "set_tcp_nodelay true",
            ]
        )
        + "\n"
    )
    # On a restart in the same state dir the log already holds an old "running" line.
    offset = log.stat().st_size if log.exists() else 0
    proc = spawn([_binary(), "-c", str(conf)], state_dir=sd)
    try:
        # The "running" line is written once every listener is bound; waiting for it rather
        # than probing the port keeps a spurious client connection out of mosquitto.log,
        # which tests parse.  Config errors go to stderr (console.log), hence both logs.
        wait_until(
            lambda: _running(log, offset),
            _START_TIMEOUT,
            what="mosquitto 'running' log line",
            proc=proc,
            log_path=[log, sd / "console.log"],
            interval=0.02,
        )
    except BaseException:
        terminate_pid(proc.pid, None, timeout=5.0)
        raise
    handle = ServerHandle(
        kind="mosquitto",
        urls={"mqtt": f"mqtt://{LOOPBACK}:{port}"},
        pid=proc.pid,
        state_dir=sd,
        log_path=log,
        version=mosquitto_version(),
    )
    handle.record_pid(proc.pid, extra=False)
    handle.save()
    return handle
