"""A local Apache ActiveMQ Artemis 2.40 broker: an instance created in the state dir, run as Java.

The distribution comes from Maven Central once (:mod:`mqguard.servers.artemis_dist`); each
start with a fresh state dir ``$S`` runs ``artemis create $S/instance`` (no web console, no AMQP
or HornetQ acceptor, NIO journal, the journal and other data in ``$S/data``) and then rewrites
``etc/broker.xml``:

* three acceptors on free 127.0.0.1 ports: CORE, STOMP and MQTT. The STOMP acceptor takes
  ``/queue/X`` as the anycast address ``X`` and ``/topic/X`` as the multicast address ``X``
  (``anycastPrefix`` / ``multicastPrefix``), so a STOMP client names queues the way it does on
  ActiveMQ and RabbitMQ, and mqguard's address ``orders`` is Artemis's address ``orders``;
* the ``<address-settings>`` (and the global ``id-cache-size`` and
  ``message-expiry-scan-period``) rendered from an ``mqguard.toml`` by :mod:`mqguard.artemis_xml`,
  by default from an empty one: then Artemis's built-in defaults apply (no dead-letter or expiry
  address: what ``artemis create`` writes for ``#`` is replaced), the same as mqguard's;
* the ``journal-buffer-timeout`` that ``artemis create``'s auto-tuning measures on this
  machine (measured once and cached: :func:`~mqguard.servers.artemis_dist.journal_buffer_timeout`),
  so the journal batches its syncs as a user's installation would;
* ``max-disk-usage`` 100 (a developer's fuller disk must not block producers) and a
  ``configuration-file-refresh-period`` of 500 ms, so :func:`reload_artemis_config` takes
  effect quickly without a restart.

Security: anonymous connections are allowed (the instance's guest login has the ``amq`` role,
which may do everything); the fixed user :data:`ARTEMIS_USER` / :data:`ARTEMIS_PASSWORD` also
exists for clients that always log in. The JVM gets a small heap (``heap``, 256 MB by default;
Artemis sizes its ``global-max-size`` to half of it) and the serial collector.

Facts seen with stomp.py 9 (STOMP 1.2): a SEND carrying ``_AMQ_DUPL_ID`` already in the
address's duplicate-ID cache is not routed, its receipt still comes, and the broker logs
``AMQ222059: Duplicate message detected``; STOMP messages are durable only with
``persistent:true``; a MESSAGE carries ``destination-type`` (ANYCAST/MULTICAST) and echoes the
SEND's ``receipt`` header. A STOMP NACK discards the message: no redelivery, nothing on the
dead-letter address (ARTEMIS-1983); a consumer that disconnects without ACK makes a
redelivery (``redelivered:true``) and counts towards ``max-delivery-attempts``, after which
the message moves to the dead-letter address with ``_AMQ_ORIG_ADDRESS`` /
``_AMQ_ORIG_QUEUE``. Queues and addresses that STOMP auto-creates are auto-deleted once
empty and without consumers (Artemis's defaults); tests subscribe to a dead-letter address
before anything can be moved there, so that it exists.

Log (log4j2, file only): ``$S/instance/log/artemis.log``, lines like
``2026-11-26 17:10:41,645 INFO  [org.apache.activemq.artemis.core.server] AMQ221007: Server is
now active``. A start (instance creation included) takes ~3-4 s, ~0.6 s of it ``artemis
create``; SIGTERM stops it in 0.2-2 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from mqguard.artemis_xml import apply_to_broker_xml, set_core_element
from mqguard.config import MqguardConfig, load_config
from mqguard.servers.artemis_dist import ARTEMIS_VERSION, artemis_home, journal_buffer_timeout
from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    format_failure,
    make_state_dir,
    spawn,
    terminate_pid,
)
from mqguard.servers.install import ensure_installed, find_binary
from mqguard.servers.ports import LOOPBACK, free_ports, port_open, wait_until

__all__ = [
    "ARTEMIS_PASSWORD",
    "ARTEMIS_USER",
    "artemis_ports",
    "reload_artemis_config",
    "restart_artemis",
    "start_artemis",
]

ARTEMIS_USER = "mqguard"
ARTEMIS_PASSWORD = "mqguard"  # a local test broker's fixed, documented login

_START_TIMEOUT = 120.0
_CREATE_TIMEOUT = 120.0
_ACTIVE = re.compile(r"AMQ221007: Server is now active")
_VERSION = re.compile(r"AMQ221001: Apache ActiveMQ Artemis Message Broker version (\S+)")
_RELOADED = re.compile(r"AMQ221056: Reloading configuration: address settings")
_ACCEPTORS = re.compile(r"<acceptors>.*?</acceptors>", re.S)

# Heap bounds and collector: the defaults of artemis.profile (-Xms512M, G1) are sized for a
# dedicated server; a test broker shares its machine with the clients it serves.
_JAVA_ARGS = (
    "-XX:AutoBoxCacheMax=20000 -XX:+UseSerialGC -Xms64m -Xmx{heap} "
    "-Dlog4j2.disableJmx=true --add-opens java.base/jdk.internal.misc=ALL-UNNAMED"
)


def _java_env(java: str, heap: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARTEMIS_", "JAVA_ARGS"))}
    env["JAVACMD"] = java
    env["JAVA_ARGS"] = _JAVA_ARGS.format(heap=heap)
    return env


def _create_instance(home: Path, instance: Path, data: Path, java: str, heap: str) -> None:
    argv = [
        str(home / "bin" / "artemis"), "create", str(instance),
        "--user", ARTEMIS_USER, "--password", ARTEMIS_PASSWORD, "--allow-anonymous",
        "--no-web", "--no-autotune", "--silent", "--host", LOOPBACK, "--nio",
        "--no-amqp-acceptor", "--no-hornetq-acceptor", "--data", str(data),
    ]
    try:
        result = subprocess.run(argv, env=_java_env(java, heap), capture_output=True,
                                text=True, timeout=_CREATE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerStartError(f"artemis create failed: {exc}") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise ServerStartError(f"artemis create exited with {result.returncode}:\n{tail}")
    log4j = instance / "etc" / "log4j2.properties"
    # The log file is the one record; a console copy would double every line's cost (and
    # Artemis logs every duplicate it rejects at WARN).
    log4j.write_text("\n".join(line for line in log4j.read_text().splitlines()
                               if not line.startswith("rootLogger.appenderRef.console"))
                     + "\n")


def _acceptors(stomp: int, mqtt: int, core: int) -> str:
    def acceptor(name: str, port: int, params: str) -> str:
        return f'<acceptor name="{name}">tcp://{LOOPBACK}:{port}?{params}</acceptor>'

    return "\n".join([
        "<acceptors>",
        "         " + acceptor("core", core, "protocols=CORE"),
        "         " + acceptor("stomp", stomp, "protocols=STOMP;anycastPrefix=/queue/;"
                               "multicastPrefix=/topic/"),
        "         " + acceptor("mqtt", mqtt, "protocols=MQTT"),
        "      </acceptors>",
    ])


def _configure(broker_xml: Path, config: MqguardConfig, ports: tuple[int, int, int],
               buffer_timeout: str) -> None:
    text = broker_xml.read_text()
    text = _ACCEPTORS.sub(lambda _m: _acceptors(*ports), text, count=1)
    text = apply_to_broker_xml(text, config)
    text = set_core_element(text, "max-disk-usage", "100")
    text = set_core_element(text, "configuration-file-refresh-period", "500")
    text = set_core_element(text, "journal-buffer-timeout", buffer_timeout)
    _write(broker_xml, text)


def _write(path: Path, text: str) -> None:
    # Artemis rereads broker.xml while it runs: it must never see half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _log_text(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _resolve_config(config: MqguardConfig | str | os.PathLike[str] | None) -> MqguardConfig:
    if config is None:
        return MqguardConfig()
    if isinstance(config, MqguardConfig):
        return config
    return load_config(config)


def start_artemis(
    state_dir: Path | None = None,
    *,
    config: MqguardConfig | str | os.PathLike[str] | None = None,
    heap: str = "256m",
    ports: tuple[int, int, int] | None = None,
) -> ServerHandle:
    """Start Artemis with STOMP, MQTT and CORE acceptors on 127.0.0.1.

    ``config`` (an :class:`~mqguard.config.MqguardConfig` or the path of an ``mqguard.toml``)
    gives the broker its address settings, so one file drives mqguard and Artemis alike.
    Reusing ``state_dir`` keeps the instance and its journal (durable messages and the
    persisted duplicate-ID caches survive); new ports are chosen unless ``ports`` (STOMP,
    MQTT, CORE) are given (see :func:`restart_artemis`).
    """
    settings = _resolve_config(config)
    ensure_installed(["artemis"])
    home = artemis_home()
    java = find_binary("java")
    if java is None:
        raise ServerStartError("java not found")
    base = make_state_dir("artemis", state_dir)
    instance, data = base / "instance", base / "data"
    if not (instance / "bin" / "artemis").is_file():
        _create_instance(home, instance, data, java, heap)
    chosen = ports if ports is not None else tuple(free_ports(3))
    stomp, mqtt, core = chosen
    buffer_timeout = journal_buffer_timeout(home, _java_env(java, heap))
    _configure(instance / "etc" / "broker.xml", settings, (stomp, mqtt, core), buffer_timeout)
    log = instance / "log" / "artemis.log"
    offset = _size(log)  # a previous run's "now active" must not satisfy the wait
    proc = spawn([str(instance / "bin" / "artemis"), "run"], state_dir=base,
                 env=_java_env(java, heap))
    try:
        wait_until(
            lambda: bool(_ACTIVE.search(_log_text(log, offset))) and port_open(LOOPBACK, stomp),
            _START_TIMEOUT,
            what="Artemis 'AMQ221007: Server is now active' + STOMP port",
            proc=proc,
            log_path=[log, base / "console.log"],
            interval=0.1,
        )
    except BaseException:
        terminate_pid(proc.pid, None, timeout=10.0)
        raise
    found = _VERSION.search(_log_text(log, offset))
    handle = ServerHandle(
        kind="artemis",
        urls={
            "stomp": f"stomp://{LOOPBACK}:{stomp}",
            "mqtt": f"mqtt://{LOOPBACK}:{mqtt}",
            "core": f"tcp://{LOOPBACK}:{core}",
        },
        pid=proc.pid,
        state_dir=base,
        log_path=log,
        version=found.group(1) if found else ARTEMIS_VERSION,
        meta={"instance": str(instance), "user": ARTEMIS_USER, "heap": heap,
              "journal_buffer_timeout_ns": buffer_timeout},
    )
    handle.record_pid(proc.pid, extra=False)
    handle.save()
    return handle


def artemis_ports(handle: ServerHandle) -> tuple[int, int, int]:
    """The (STOMP, MQTT, CORE) ports of an Artemis handle."""
    return handle.port("stomp"), handle.port("mqtt"), handle.port("core")


def restart_artemis(handle: ServerHandle, **kw: object) -> ServerHandle:
    """Stop ``handle`` (if it still runs) and start Artemis on the same state dir and ports.

    The journal is replayed: durable messages and persisted duplicate ids are there again.
    ``kw`` go to :func:`start_artemis` (``config``, ``heap``).
    """
    handle.stop()
    return start_artemis(handle.state_dir, ports=artemis_ports(handle), **kw)  # type: ignore[arg-type]


def reload_artemis_config(handle: ServerHandle,
                          config: MqguardConfig | str | os.PathLike[str] | None,
                          timeout: float = 30.0) -> None:
    """Give the running broker ``config``'s address settings, without a restart.

    Artemis rereads ``broker.xml`` when it changes and swaps in the new address settings
    (the global ``id-cache-size`` needs a restart); this returns once its log says so.
    """
    settings = _resolve_config(config)
    broker_xml = Path(handle.meta["instance"]) / "etc" / "broker.xml"
    offset = _size(handle.log_path)
    text = apply_to_broker_xml(broker_xml.read_text(), settings)
    # The reload is triggered by a newer modification time: same-millisecond writes of
    # different content would otherwise go unseen.
    before = broker_xml.stat().st_mtime_ns
    _write(broker_xml, text)
    if broker_xml.stat().st_mtime_ns <= before:
        os.utime(broker_xml, ns=(before + 1_000_000, before + 1_000_000))
    deadline = time.monotonic() + timeout
    while not _RELOADED.search(_log_text(handle.log_path, offset)):
        if not handle.is_running():
            raise ServerStartError(format_failure("Artemis exited during a config reload",
                                                  handle.log_path))
        if time.monotonic() >= deadline:
            raise ServerStartError(format_failure(
                f"Artemis did not reload its address settings within {timeout:.0f} s",
                handle.log_path))
        time.sleep(0.05)
