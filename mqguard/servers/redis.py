"""Local Redis 7 servers: a standalone instance and a 3-master Redis Cluster.

Both are plain ``redis-server CONFIG`` processes bound to 127.0.0.1 with their data, config and
``redis.log`` in the state dir.  Redis is ready within ~0.1 s, so these are cheap enough for
function-scoped fixtures.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    format_failure,
    make_state_dir,
    spawn,
    terminate_pid,
)
from mqguard.servers.install import ensure_installed, find_binary
from mqguard.servers.ports import LOOPBACK, free_port, free_ports, wait_for_port, wait_until

__all__ = ["redis_version", "restart_redis", "start_redis", "start_redis_cluster"]

_START_TIMEOUT = 30.0


def redis_version() -> str:
    """Version of the installed ``redis-server`` (e.g. ``7.0.15``)."""
    out = subprocess.run(
        [_binary("redis-server"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    for token in out.split():
        if token.startswith("v="):
            return token[2:]
    return out.strip()


def _binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise ServerStartError(f"{name} not found")
    return path


def _quote(value: str | Path) -> str:
    # redis.conf uses sds-style quoting: double quotes with backslash escapes.
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _ping(port: int) -> bool:
    # A raw PING instead of redis-cli: it is 50x cheaper in a polling loop, and a server
    # still replaying its AOF answers "-LOADING", which must not count as ready.
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _write_config(
    node_dir: Path,
    port: int,
    *,
    appendonly: bool,
    cluster_port: int | None = None,
    appendfsync: str = "everysec",
) -> Path:
    lines = [
        "bind 127.0.0.1",
        "protected-mode yes",
        f"port {port}",
        "daemonize no",
        f"dir {_quote(node_dir)}",
        f"logfile {_quote(node_dir / 'redis.log')}",
        "loglevel notice",
        f"appendonly {'yes' if appendonly else 'no'}",
        f"appendfsync {appendfsync}",
    ]
    if not appendonly:
        # Without AOF the tests do not want persistence at all; RDB snapshots would only fork
        # the server in the middle of benchmarks.
        lines.append('save ""')
    if cluster_port is not None:
        # cluster-port (Redis >= 7) pins the bus port instead of the implicit port+10000,
        # which overflows 65535 for kernel-chosen ephemeral ports and may be taken.
        lines += [
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-port {cluster_port}",
            "cluster-node-timeout 5000",
            "cluster-announce-ip 127.0.0.1",
        ]
    conf = node_dir / "redis.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _launch_node(node_dir: Path, conf: Path, port: int) -> tuple[int, Path]:
    log = node_dir / "redis.log"
    proc = spawn([_binary("redis-server"), str(conf)], state_dir=node_dir)
    try:
        wait_for_port(LOOPBACK, port, _START_TIMEOUT, proc, [log, node_dir / "console.log"])
        wait_until(
            lambda: _ping(port),
            _START_TIMEOUT,
            what=f"redis PING on {port}",
            proc=proc,
            log_path=log,
        )
    except BaseException:
        # No handle exists yet, so nobody else could ever stop this process.
        terminate_pid(proc.pid, None, timeout=5.0)
        raise
    return proc.pid, log


_APPENDFSYNC = ("always", "everysec", "no")


def start_redis(
    appendonly: bool = False,
    state_dir: Path | None = None,
    port: int | None = None,
    appendfsync: str = "everysec",
) -> ServerHandle:
    """Start a standalone Redis on 127.0.0.1.

    Passing the ``state_dir`` and ``port`` of a stopped handle restarts "the same" server: the
    data (AOF with ``appendonly=True``) is replayed and clients can reuse their URL, which is
    what persistence tests need.  See :func:`restart_redis`.  ``appendfsync="always"`` makes
    every acknowledged write survive a SIGKILL of the server (the fault-injection suite needs
    that); the default ``everysec`` may lose the last second.
    """
    if appendfsync not in _APPENDFSYNC:
        raise ValueError(f"appendfsync must be one of {', '.join(_APPENDFSYNC)}, "
                         f"got {appendfsync!r}")
    ensure_installed(["redis"])
    sd = make_state_dir("redis", state_dir)
    port = port or free_port()
    conf = _write_config(sd, port, appendonly=appendonly, appendfsync=appendfsync)
    pid, log = _launch_node(sd, conf, port)
    handle = ServerHandle(
        kind="redis",
        urls={"redis": f"redis://{LOOPBACK}:{port}/0"},
        pid=pid,
        state_dir=sd,
        log_path=log,
        version=redis_version(),
        meta={"appendonly": "yes" if appendonly else "no", "appendfsync": appendfsync},
    )
    handle.record_pid(pid, extra=False)
    handle.save()
    return handle


def restart_redis(handle: ServerHandle) -> ServerHandle:
    """Stop ``handle`` and start a new server on the same state dir and port."""
    handle.stop()
    return start_redis(
        appendonly=handle.meta.get("appendonly") == "yes",
        state_dir=handle.state_dir,
        port=handle.port("redis"),
        appendfsync=handle.meta.get("appendfsync", "everysec"),
    )


def _cluster_cli(port: int, *args: str, timeout: float = 60.0) -> str:
    result = subprocess.run(
        [_binary("redis-cli"), "-h", LOOPBACK, "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise ServerStartError(
            f"redis-cli {' '.join(args)} failed ({result.returncode}): "
            f"{result.stdout}{result.stderr}"
        )
    return result.stdout


def _cluster_ok(port: int) -> bool:
    try:
        info = _cluster_cli(port, "cluster", "info", timeout=10.0)
    except (ServerStartError, subprocess.TimeoutExpired):
        return False
    return "cluster_state:ok" in info


def start_redis_cluster(masters: int = 3, state_dir: Path | None = None) -> ServerHandle:
    """Start a Redis Cluster of ``masters`` primaries (no replicas) on 127.0.0.1.

    The handle's ``pid`` is the first node, ``extra_pids`` the others, ``log_path`` the first
    node's log (each node logs to ``<state_dir>/node-<port>/redis.log``) and ``meta["ports"]``
    lists every node port.  Its URL uses the ``redis+cluster://`` scheme with the first node as
    seed; redis-py wants ``redis://`` for ``RedisCluster.from_url``.
    """
    if masters < 3:
        raise ValueError("Redis Cluster needs at least 3 masters")
    ensure_installed(["redis-cluster"])
    sd = make_state_dir("redis-cluster", state_dir)
    all_ports = free_ports(2 * masters)
    ports, bus_ports = all_ports[:masters], all_ports[masters:]
    handle = ServerHandle(
        kind="redis-cluster",
        urls={"redis": f"redis+cluster://{LOOPBACK}:{ports[0]}"},
        pid=0,
        state_dir=sd,
        log_path=sd / f"node-{ports[0]}" / "redis.log",
        version=redis_version(),
        meta={"ports": ",".join(str(p) for p in ports)},
    )
    logs: list[Path] = []
    t0 = time.monotonic()
    try:
        for port, bus in zip(ports, bus_ports, strict=True):
            node_dir = sd / f"node-{port}"
            node_dir.mkdir(parents=True, exist_ok=True)
            conf = _write_config(node_dir, port, appendonly=False, cluster_port=bus)
            pid, log = _launch_node(node_dir, conf, port)
            logs.append(log)
            if handle.pid == 0:
                handle.pid = pid
                handle.record_pid(pid, extra=False)
            else:
                handle.record_pid(pid)
            # Save after every node so a failure half-way still leaves a stoppable handle.
            handle.save()
        _cluster_cli(
            ports[0],
            "--cluster",
            "create",
            *(f"{LOOPBACK}:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        )
        remaining = max(5.0, _START_TIMEOUT - (time.monotonic() - t0))
        # Gossip must reach every node, not just the seed: a client that happens to ask a
        # node still in cluster_state:fail gets CLUSTERDOWN errors.
        wait_until(
            lambda: all(_cluster_ok(p) for p in ports),
            remaining,
            what="redis cluster_state:ok",
            interval=0.2,
        )
    except BaseException as exc:
        handle.stop()
        if isinstance(exc, ServerStartError) and "--- last" not in str(exc):
            raise ServerStartError(format_failure(str(exc), *logs)) from exc
        raise
    return handle
