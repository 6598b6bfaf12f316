"""How every mqguard fixture module starts, tracks and releases a server.

One place for what each server fixture needs: a server that cannot start skips the test
locally and fails it when ``CI`` is set; every handle started is stopped at interpreter
exit even if fixture teardown is skipped; a state dir is removed after a green session
and kept (and listed in the terminal summary) when a test failed or
``MQGUARD_KEEP_STATE`` is set. The fixture modules (:mod:`mqguard.testing.pytest_plugin`,
:mod:`~mqguard.testing.artemis`, :mod:`~mqguard.testing.spark_cluster`,
:mod:`~mqguard.testing.rabbitmq_cluster`, :mod:`~mqguard.testing.cluster`) share it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from mqguard.servers import (
    ServerHandle,
    ServerUnavailable,
    docker_available,
    start,
    start_in_docker,
)
from mqguard.servers.docker import DOCKER_KINDS

__all__ = [
    "adopt",
    "keep_or_remove",
    "provide",
    "release",
    "serve",
    "summarize",
    "unavailable",
]

# Every handle started through this module, so that an interpreter exit that skips fixture
# teardown (pytest.exit from a hook, an internal error) still leaves no server behind.
_started: list[ServerHandle] = []
_kept_state_dirs: list[str] = []


def _stop_all() -> None:
    for handle in _started:
        with contextlib.suppress(Exception):
            handle.stop()


atexit.register(_stop_all)


def unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it under ``CI``: there a missing server must break the build."""
    if os.environ.get("CI"):
        pytest.fail(f"required server unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def adopt(starter: Callable[[], ServerHandle], what: str) -> ServerHandle:
    """Start a server with ``starter`` and track it; ``what`` names it when it cannot start."""
    try:
        handle = starter()
    except ServerUnavailable as exc:
        unavailable(f"{what} unavailable: {exc}")
    _started.append(handle)
    return handle


def provide(kind: str, **kw: Any) -> ServerHandle:
    """A server of ``kind``: from Docker when an engine answers (and no launcher options are
    given), otherwise from the local launchers."""
    docker_error = ""
    if not kw and kind in DOCKER_KINDS and docker_available():
        try:
            handle = start_in_docker(kind)
        except ServerUnavailable as exc:
            # An engine that answers pings may still be unable to pull images; the local
            # launchers are a complete fallback, so try them before giving up.
            docker_error = f" (docker failed first: {exc})"
        else:
            _started.append(handle)
            return handle
    try:
        handle = start(kind, **kw)
    except ServerUnavailable as exc:
        unavailable(f"{kind} server unavailable: {exc}{docker_error}")
    _started.append(handle)
    return handle


def keep_or_remove(label: str, state_dir: Path | str, failed: bool) -> None:
    """Keep ``state_dir`` for inspection (listed in the summary) or remove it."""
    if os.environ.get("MQGUARD_KEEP_STATE") or failed:
        _kept_state_dirs.append(f"{label}: {state_dir}")
    else:
        shutil.rmtree(state_dir, ignore_errors=True)


def release(handle: ServerHandle, session: pytest.Session) -> None:
    """Stop ``handle`` (and a server restarted in its state dir since), then keep or remove
    its state dir."""
    try:
        handle.stop()
        # A restart in the same state dir (see mqguard_fresh_redis_server) leaves the newest
        # server in handle.json; stop that one too.
        with contextlib.suppress(ServerUnavailable, OSError, ValueError):
            ServerHandle.load(handle.state_dir).stop()
    finally:
        if handle in _started:
            _started.remove(handle)
        keep_or_remove(handle.kind, handle.state_dir, bool(session.testsfailed))


def serve(handle: ServerHandle, request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """The body of a server fixture: yield ``handle``, release it afterwards."""
    try:
        yield handle
    finally:
        release(handle, request.session)


def summarize(terminalreporter: Any) -> None:
    """List the kept state dirs (their logs explain failures) once per session."""
    if _kept_state_dirs:
        terminalreporter.write_sep("-", "mqguard server state dirs (logs) kept")
        for line in _kept_state_dirs:
            terminalreporter.write_line(line)
        _kept_state_dirs.clear()
