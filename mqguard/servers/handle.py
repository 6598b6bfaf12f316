"""The :class:`ServerHandle` returned by every launcher, and the process plumbing behind it.

A handle is the only thing that knows which operating-system processes a launcher started, so
it is also the only thing allowed to end them.  Every process is recorded by PID *and* by its
kernel start time (field 22 of ``/proc/PID/stat``): a handle re-read from ``handle.json`` by a
later CLI invocation may refer to PIDs that have since been reused, and we must never signal a
process that we did not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

__all__ = [
    "HANDLE_FILE",
    "ServerHandle",
    "ServerStartError",
    "ServerUnavailable",
    "log_tail",
    "make_state_dir",
    "pid_alive",
    "process_start_time",
    "spawn",
    "terminate_pid",
]

HANDLE_FILE = "handle.json"
LOG_TAIL_LINES = 30
_STACK_FRAME = re.compile(r"^\s+(at \S+\(.*\)|\.\.\. \d+ more)\s*$")

# Popen objects of the children started by *this* interpreter.  Keeping them lets stop() reap
# the child (otherwise it stays a zombie and still looks alive to kill(pid, 0)); handles
# restored from JSON in another process simply have no entry here.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class ServerUnavailable(RuntimeError):
    """A server cannot be provided on this machine (missing package, not root, apt failure...)."""


class ServerStartError(ServerUnavailable):
    """A server was launched but did not become ready; the message carries its log tail."""


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of ``path`` ('' if it does not exist or is unreadable)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as fh:
            # Reading only the end matters for ActiveMQ/RabbitMQ logs that can grow large
            # during long tests; a failed start should not pay for reading all of it.
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    # Java stack frames would fill the whole tail of a failed ActiveMQ start and push out the
    # exception messages ("Caused by: ...") that actually explain the failure.
    kept = [line for line in text.splitlines() if not _STACK_FRAME.match(line)]
    return "\n".join(kept[-lines:])


def format_failure(message: str, *logs: Path | None) -> str:
    """Build an error message that ends with the tail of each existing log."""
    parts = [message]
    for log in logs:
        tail = log_tail(log)
        if log is not None and tail:
            parts.append(f"--- last {LOG_TAIL_LINES} lines of {log} ---\n{tail}")
    return "\n".join(parts)


def make_state_dir(kind: str, state_dir: Path | str | None = None) -> Path:
    """Create (or reuse) the state directory of a server.

    Fresh directories live under :func:`tempfile.gettempdir` with the prefix
    ``mqguard-<kind>-`` so that leftovers of crashed runs are easy to identify and remove.
    """
    if state_dir is not None:
        path = Path(state_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"mqguard-{kind}-", dir=tempfile.gettempdir()))


def process_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` in clock ticks, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses, so split after the
    # last ')' rather than naively on whitespace.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is therefore rest[19].
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _process_state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split(" ", 1)[0]


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True if ``pid`` runs, is not a zombie and (if given) has the recorded start time."""
    if pid <= 0:
        return False
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    state = _process_state(pid)
    # A zombie has already exited; only its parent's wait() is missing.  Treating it as alive
    # would make stop() wait for a timeout on every server whose parent is not us.
    if state is None or state == "Z":
        return False
    return start_time is None or process_start_time(pid) == start_time


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=0.05)
        if child.returncode is not None:
            _CHILDREN.pop(pid, None)


def terminate_pid(pid: int, start_time: int | None, timeout: float = 15.0) -> None:
    """End one process we started (and its process group), politely first.

    The process group is only signalled while its leader is verifiably our process (same PID
    *and* start time, and it is still the group leader): launchers start every server with
    ``start_new_session=True``, so the group holds exactly the server and the helpers it forked
    (``erl_child_setup``, ``inet_gethost``...), never anything of the caller's.
    """
    if not pid_alive(pid, start_time):
        _reap(pid)
        return
    group = _own_group(pid)
    _signal(pid, group, signal.SIGTERM)
    if _wait_gone(pid, start_time, timeout):
        _sweep_group(group)
        return
    _signal(pid, group, signal.SIGKILL)
    _wait_gone(pid, start_time, 5.0)
    _sweep_group(group)


def _own_group(pid: int) -> int | None:
    try:
        return pid if os.getpgid(pid) == pid else None
    except ProcessLookupError:
        return None


def _signal(pid: int, group: int | None, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group is not None:
            os.killpg(group, sig)
        else:
            os.kill(pid, sig)


def _sweep_group(group: int | None) -> None:
    # Helpers forked by the server (e.g. erl_child_setup) may outlive a leader killed with
    # SIGKILL.  Linux does not recycle a PID while it is still used as a process-group id, so
    # right after seeing our leader exit the group id can only still denote our own helpers.
    if group is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _wait_gone(pid: int, start_time: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if not pid_alive(pid, start_time):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def spawn(
    argv: Sequence[str],
    *,
    state_dir: Path,
    env: Mapping[str, str] | None = None,
    console_log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server process detached from the caller's session and terminal.

    The server gets its own session (so ``stop()`` can signal its whole process group, and so a
    Ctrl-C in the caller's terminal does not reach a server the CLI left running), stdin from
    /dev/null and stdout/stderr appended to ``console.log`` in the state dir.  Inheriting the
    caller's pipes instead would make ``$(python -m mqguard.servers start ...)`` hang until the
    server exits.
    """
    console = console_log or state_dir / "console.log"
    with console.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=state_dir,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc


@dataclass
class ServerHandle:
    """A running (or stopped) server started by :mod:`mqguard.servers`.

    ``pid`` is the main process; ``extra_pids`` holds the other processes that belong to the
    same server (the other Redis Cluster nodes, RabbitMQ's private epmd).  ``pid_start_times``
    maps ``str(pid)`` to the kernel start time so that a handle loaded from JSON never signals
    a recycled PID.  ``meta`` holds launcher-specific strings (ports, node name, backend).
    """

    kind: str
    urls: dict[str, str]
    pid: int
    state_dir: Path
    log_path: Path
    version: str
    extra_pids: list[int] = field(default_factory=list)
    pid_start_times: dict[str, int] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    # -- identity -----------------------------------------------------------------------------

    def record_pid(self, pid: int, *, extra: bool = True) -> None:
        """Remember ``pid`` (and its start time) as belonging to this server."""
        if extra and pid not in self.extra_pids:
            self.extra_pids.append(pid)
        start = process_start_time(pid)
        if start is not None:
            self.pid_start_times[str(pid)] = start

    def all_pids(self) -> list[int]:
        """Main PID first, then the extra ones."""
        return [p for p in [self.pid, *self.extra_pids] if p > 0]

    def is_running(self) -> bool:
        """True while the main process (or, for docker, the container) is alive."""
        if self.meta.get("backend") == "docker":
            from mqguard.servers.docker import container_running

            return container_running(self)
        return pid_alive(self.pid, self.pid_start_times.get(str(self.pid)))

    def port(self, scheme: str | None = None) -> int:
        """Port of the URL named ``scheme`` (default: the first URL)."""
        url = self.urls[scheme] if scheme is not None else next(iter(self.urls.values()))
        port = urlsplit(url).port
        if port is None:
            raise ValueError(f"URL {url!r} has no port")
        return port

    # -- lifecycle ----------------------------------------------------------------------------

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the server at once (a crash, for fault injection); no orderly shutdown.

        Only processes this handle started are signalled (PID and start time checked), with
        their process groups; the state dir is left as the crash left it, so a restart on it
        replays whatever the server had made durable.
        """
        if self.meta.get("backend") == "docker":
            raise ServerUnavailable("kill() is for local processes, not docker containers")
        for pid in self.all_pids():
            start = self.pid_start_times.get(str(pid))
            if not pid_alive(pid, start):
                _reap(pid)
                continue
            group = _own_group(pid)
            _signal(pid, group, signal.SIGKILL)
            _wait_gone(pid, start, timeout)
            _sweep_group(group)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server; safe to call repeatedly and on handles restored from JSON.

        RabbitMQ is asked to shut down through ``rabbitmqctl shutdown`` first because SIGTERM
        skips its orderly shutdown of queues; docker-backed handles remove their container.
        Whatever is still alive afterwards is ended by PID (SIGTERM, then SIGKILL after
        ``timeout`` seconds).  The main process goes first, extra PIDs (epmd) last, because the
        Erlang node needs its epmd until it is gone.
        """
        if self.meta.get("backend") == "docker":
            from mqguard.servers.docker import stop_container

            stop_container(self)
            return
        if self.kind == "rabbitmq" and self.is_running():
            from mqguard.servers.rabbitmq import shutdown_node

            shutdown_node(self, timeout=max(timeout, 30.0))
        for pid in self.all_pids():
            terminate_pid(pid, self.pid_start_times.get(str(pid)), timeout)
        self.meta["stopped"] = "true"
        if self._owns_state_file():
            with contextlib.suppress(OSError):
                self.save()

    def _owns_state_file(self) -> bool:
        # After a restart in the same state dir, handle.json describes the *new* server;
        # stopping the old handle again must not overwrite it, or the new server would
        # become unstoppable from the CLI.
        try:
            on_disk = json.loads((self.state_dir / HANDLE_FILE).read_text())
        except (OSError, ValueError):
            return True
        return bool(on_disk.get("pid") == self.pid and on_disk.get("kind") == self.kind)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- persistence --------------------------------------------------------------------------

    def to_json(self) -> str:
        """Serialise to JSON (paths as strings)."""
        data: dict[str, Any] = asdict(self)
        data["state_dir"] = str(self.state_dir)
        data["log_path"] = str(self.log_path)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServerHandle:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        return cls(
            kind=str(data["kind"]),
            urls={str(k): str(v) for k, v in data["urls"].items()},
            pid=int(data["pid"]),
            state_dir=Path(data["state_dir"]),
            log_path=Path(data["log_path"]),
            version=str(data.get("version", "")),
            extra_pids=[int(p) for p in data.get("extra_pids", [])],
            pid_start_times={str(k): int(v) for k, v in data.get("pid_start_times", {}).items()},
            meta={str(k): str(v) for k, v in data.get("meta", {}).items()},
        )

    def save(self) -> Path:
        """Write ``handle.json`` into the state dir (atomically) and return its path."""
        target = self.state_dir / HANDLE_FILE
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(target)
        return target

    @classmethod
    def load(cls, state_dir: Path | str) -> ServerHandle:
        """Read ``handle.json`` from ``state_dir``."""
        path = Path(state_dir) / HANDLE_FILE
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            raise ServerUnavailable(f"no {HANDLE_FILE} in {state_dir}") from None
