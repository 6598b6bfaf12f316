"""pytest fixtures for broker groups: a second ActiveMQ beside the session one.

Load as a plugin from a test module: ``pytest_plugins = ["mqguard.testing.cluster"]``.
``mqguard_activemq_pair`` is session-scoped: node A is the session ``mqguard_activemq_server``, node
B a second local broker on its own free ports (same launcher, own state dir), stopped at the
end of the session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqguard.servers import ServerHandle
from mqguard.testing.serving import provide, serve

__all__ = ["mqguard_activemq_pair", "mqguard_activemq_second"]


@pytest.fixture(scope="session")
def mqguard_activemq_second(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A second ActiveMQ Classic, independent of ``mqguard_activemq_server``."""
    yield from serve(provide("activemq"), request)


@pytest.fixture(scope="session")
def mqguard_activemq_pair(
        mqguard_activemq_server: ServerHandle, mqguard_activemq_second: ServerHandle
) -> tuple[ServerHandle, ServerHandle]:
    """Two independent ActiveMQ nodes (A, B) on loopback."""
    return mqguard_activemq_server, mqguard_activemq_second
