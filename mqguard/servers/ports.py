"""Free loopback ports and readiness waits.

Ports come from the kernel (bind to ``127.0.0.1:0``) rather than from a fixed range, so several
test sessions, CI jobs or engineers can run servers side by side on one machine.  There is an
unavoidable window between closing our probe socket and the server binding the port; we keep
it small and never hand out the same port twice from one interpreter.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mqguard.servers.handle import ServerStartError, format_failure, pid_alive

__all__ = ["LOOPBACK", "free_port", "free_ports", "port_open", "wait_for_port", "wait_until"]

LOOPBACK = "127.0.0.1"

# Ports already handed out by this interpreter.  The kernel may return a port again as soon as
# our probe socket is closed, i.e. before the server we configured with it has bound it.
_handed_out: set[int] = set()
# Launchers may run in parallel threads (e.g. several servers started at once); without the
# lock one thread could receive a port another thread has just closed but not yet recorded.
_lock = threading.Lock()


def free_ports(count: int, *, max_port: int = 65535) -> list[int]:
    """Return ``count`` distinct currently-free TCP ports on 127.0.0.1, all ``<= max_port``.

    All probe sockets stay open until every port is chosen, which is what makes the ports
    distinct.  ``max_port`` exists for servers that derive a second port by adding an offset
    (e.g. Redis Cluster's implicit bus port, port + 10000) and would overflow 65535 otherwise.
    """
    with _lock:
        return _free_ports_locked(count, max_port)


def _free_ports_locked(count: int, max_port: int) -> list[int]:
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > count * 200:
                raise ServerStartError(f"could not find {count} free loopback ports")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
            if port > max_port or port in _handed_out:
                continue
            ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    _handed_out.update(ports)
    return ports


def free_port(*, max_port: int = 65535) -> int:
    """One free TCP port on 127.0.0.1."""
    return free_ports(1, max_port=max_port)[0]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


Logs = Path | Sequence[Path] | None


def _logs(log_path: Logs) -> list[Path]:
    if log_path is None:
        return []
    return [log_path] if isinstance(log_path, Path) else list(log_path)


def _check_alive(proc: subprocess.Popen[bytes] | int | None, what: str, log: Logs) -> None:
    if proc is None:
        return
    if isinstance(proc, int):
        dead = not pid_alive(proc)
        code = "?"
    else:
        dead = proc.poll() is not None
        code = str(proc.returncode)
    if dead:
        raise ServerStartError(
            format_failure(
                f"{what}: the server process exited (code {code}) before ready", *_logs(log)
            )
        )


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    *,
    what: str,
    proc: subprocess.Popen[bytes] | int | None = None,
    log_path: Logs = None,
    interval: float = 0.1,
) -> None:
    """Poll ``predicate`` until it is true; fail early (with the log tail) if ``proc`` died."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        _check_alive(proc, what, log_path)
        if time.monotonic() >= deadline:
            raise ServerStartError(
                format_failure(f"{what}: not ready after {timeout:.0f} s", *_logs(log_path))
            )
        time.sleep(interval)


def wait_for_port(
    host: str,
    port: int,
    timeout: float,
    proc: subprocess.Popen[bytes] | int | None = None,
    log_path: Logs = None,
) -> None:
    """Wait until ``host:port`` accepts TCP connections.

    Raises :class:`ServerStartError` (with the last lines of each ``log_path``) as soon as ``proc``
    exits rather than after the full timeout: a server that failed on a config error would
    otherwise cost its whole start budget (120 s for RabbitMQ) before reporting.
    """
    wait_until(
        lambda: port_open(host, port),
        timeout,
        what=f"port {host}:{port}",
        proc=proc,
        log_path=log_path,
    )
