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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import MqguardConfig
from mqguard.servers import (
    ServerHandle,
    reload_artemis_config,
    start_artemis,
)
from mqguard.testing.serving import adopt, serve, summarize

__all__ = ["mqguard_artemis_config", "mqguard_artemis_server"]

#: What ``mqguard_artemis_config`` yields: give the session broker a configuration.
ApplyConfig = Callable[[MqguardConfig | str | Path | None], None]


@pytest.fixture(scope="session")
def mqguard_artemis_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """Artemis 2.40 with stomp/mqtt/core URLs (anonymous, or mqguard/mqguard); STOMP
    ``/queue/X`` is the anycast address ``X``; log in ``log_path``."""
    yield from serve(adopt(start_artemis, "artemis server"), request)


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
    """List the kept state dirs (the Artemis log explains failures)."""
    summarize(terminalreporter)
