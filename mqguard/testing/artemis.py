"""pytest fixture for a real Apache ActiveMQ Artemis 2.40 broker.

Load it beside the main plugin, from the ``conftest.py`` at the root of the tests::

    pytest_plugins = ["mqguard.testing.pytest_plugin", "mqguard.testing.artemis"]

``mqguard_artemis_server`` is session-scoped: one broker serves every test (a cold start costs
2-3 s of a busy CI machine, a JVM several hundred MB), with Artemis's built-in address-settings
defaults. A test that needs other settings gives the broker an ``mqguard.toml``
through ``mqguard_artemis_config`` (a reload, no restart; the defaults come back after the
test); distinct address names per test
(``mqguard_unique_name``) keep tests apart. A broker that cannot start skips the test locally and
fails it when ``CI`` is set; the state dir (logs included) is kept when a test failed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import MqguardConfig
from mqguard.servers import (
    ServerHandle,
    ServerUnavailable,
    reload_artemis_config,
    start_artemis,
)

__all__ = ["mqguard_artemis_config", "mqguard_artemis_server"]

#: What ``mqguard_artemis_config`` yields: give the session broker a configuration.
ApplyConfig = Callable[[MqguardConfig | str | Path | None], None]

# Handles started here, so that an interpreter exit that skips fixture teardown still does
# not leave a JVM behind.
_started: list[ServerHandle] = []
_kept_state_dirs: list[str] = []


def _stop_all() -> None:
    for handle in _started:
        with contextlib.suppress(Exception):
            handle.stop()


atexit.register(_stop_all)


@pytest.fixture(scope="session")
def mqguard_artemis_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """Artemis 2.40 with stomp/mqtt/core URLs (anonymous, or mqguard/mqguard); STOMP
    ``/queue/X`` is the anycast address ``X``; log in ``log_path``."""
    try:
        handle = start_artemis()
    except ServerUnavailable as exc:
        reason = f"artemis server unavailable: {exc}"
        if os.environ.get("CI"):
            pytest.fail(f"required server unavailable in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    _started.append(handle)
    try:
        yield handle
    finally:
        try:
            handle.stop()
        finally:
            _started.remove(handle)
            if os.environ.get("MQGUARD_KEEP_STATE") or request.session.testsfailed:
                _kept_state_dirs.append(f"artemis: {handle.state_dir}")
            else:
                shutil.rmtree(handle.state_dir, ignore_errors=True)


@pytest.fixture
def mqguard_artemis_config(mqguard_artemis_server: ServerHandle) -> Iterator[ApplyConfig]:
    """A function that gives the session broker an ``mqguard.toml``'s address settings
    (a config, a path, or None for the defaults); the defaults are back after the test."""
    applied = False

    def apply(config: MqguardConfig | str | Path | None) -> None:
        nonlocal applied
        applied = True
        reload_artemis_config(mqguard_artemis_server, config)

    yield apply
    if applied:
        reload_artemis_config(mqguard_artemis_server, None)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the kept Artemis state dir (its log explains failures)."""
    if _kept_state_dirs:
        terminalreporter.write_sep("-", "mqguard Artemis state dir (logs) kept")
        for line in _kept_state_dirs:
            terminalreporter.write_line(line)
