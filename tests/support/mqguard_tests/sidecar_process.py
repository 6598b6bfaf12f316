"""``mqguard sidecar`` as a process of its own, for tests that measure it from outside
(resident memory, file descriptors, resource limits) or attack it over loopback."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The TOML every such sidecar gets, before the test's own ``[mqguard.sidecar]`` keys.
_BASE_TOML = """[mqguard]
node-id = "sidecar-process-test"
message-expiry-scan-period = -1
[mqguard.event-log]
directory = "{events}"
[mqguard.sidecar]
"""


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, int) else f'"{value}"'


class SidecarProcess:
    """A running ``python -m mqguard.cli sidecar``; its stderr (log) goes to a file."""

    def __init__(self, upstream: str, tmp_path: Path, *, event_loop: str = "asyncio",
                 sidecar: dict[str, object] | None = None,
                 nofile: tuple[int, int] | None = None) -> None:
        """``sidecar``: ``[mqguard.sidecar]`` keys; ``nofile``: the (soft, hard)
        RLIMIT_NOFILE the process starts with."""
        config = tmp_path / "mqguard.toml"
        config.write_text(_BASE_TOML.format(events=tmp_path / "events") + "".join(
            f"{key} = {_toml_value(value)}\n" for key, value in (sidecar or {}).items()))
        self.log_path = tmp_path / f"sidecar-{event_loop}.log"
        preexec: Callable[[], Any] | None = None
        if nofile is not None:
            limits = nofile

            def preexec() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mqguard.cli", "sidecar", "--listen", "127.0.0.1:0",
                 "--upstream", upstream, "--config", str(config), "--event-loop", event_loop],
                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=preexec)
        self.port = 0
        deadline = time.monotonic() + 60
        while not self.port:
            for line in self.log().splitlines():
                if line.startswith("mqguard sidecar listening on"):
                    self.port = int(line.split(":")[1].split(",")[0])
            if self.port:
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"the sidecar exited before listening:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the sidecar did not listen in time:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_mib(self) -> float:
        """Resident set size now, in MiB (Linux)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def open_fds(self) -> int:
        return len(list(Path(f"/proc/{self.proc.pid}/fd").iterdir()))

    def nofile_limits(self) -> tuple[int, int]:
        """The (soft, hard) limit on open files the running process has."""
        for line in Path(f"/proc/{self.proc.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
        raise AssertionError("no 'Max open files' line")

    def stop(self) -> int:
        """SIGTERM, then its exit status (killed after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> SidecarProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
