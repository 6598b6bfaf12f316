"""pytest fixtures that provide real servers.

Opt-in: a project loads the plugin from the ``conftest.py`` at the root of its tests (pytest
refuses ``pytest_plugins`` in deeper conftest files)::

    pytest_plugins = ["mqguard.testing.pytest_plugin"]

Session-scoped: ``mqguard_redis_server``, ``mqguard_redis_cluster_server``,
``mqguard_activemq_server``, ``mqguard_rabbitmq_server``, ``mqguard_mosquitto_server`` (each a
:class:`~mqguard.servers.ServerHandle`). Function-scoped: ``mqguard_redis_url`` /
``mqguard_redis_cluster_url`` (flushed before each test), ``mqguard_fresh_redis_server`` (a private
Redis with AOF, for restart tests) and ``mqguard_unique_name``.

A server comes from Docker when an engine answers (see :mod:`mqguard.servers.docker`),
otherwise from the local launchers, which install Debian packages on demand.  If neither
works the test is skipped, except when ``CI`` is set: in CI a missing server must break the
build, not silently skip the integration tests.

Environment knobs: ``MQGUARD_BACKEND=local`` ignores Docker; ``MQGUARD_KEEP_STATE=1`` keeps the
servers' state dirs (config, data, logs) even after a green session (they are always kept when
a test failed, and their paths are printed in the terminal summary).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mqguard.servers import ServerHandle, start_redis
from mqguard.testing.serving import adopt, provide, serve, summarize

__all__ = [
    "mqguard_activemq_server",
    "mqguard_fresh_redis_server",
    "mqguard_mosquitto_server",
    "mqguard_rabbitmq_server",
    "mqguard_redis_cluster_server",
    "mqguard_redis_cluster_url",
    "mqguard_redis_server",
    "mqguard_redis_url",
    "mqguard_unique_name",
]

def _server(kind: str, request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    yield from serve(provide(kind), request)


@pytest.fixture(scope="session")
def mqguard_redis_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A standalone Redis 7 for the whole session (urls["redis"] = redis://127.0.0.1:P/0)."""
    yield from _server("redis", request)


@pytest.fixture(scope="session")
def mqguard_redis_cluster_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A 3-master Redis Cluster (urls["redis"] = redis+cluster://127.0.0.1:P)."""
    yield from _server("redis-cluster", request)


@pytest.fixture(scope="session")
def mqguard_activemq_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """ActiveMQ Classic 5.17 with stomp/mqtt/openwire URLs; log in ``log_path``."""
    yield from _server("activemq", request)


@pytest.fixture(scope="session")
def mqguard_rabbitmq_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """RabbitMQ 3.10 with STOMP+MQTT (guest/guest, vhost '/'); see ``rabbitmqctl``."""
    yield from _server("rabbitmq", request)


@pytest.fixture(scope="session")
def mqguard_mosquitto_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """Mosquitto 2.0 (MQTT 3.1.1 and 5), anonymous; log in ``log_path``."""
    yield from _server("mosquitto", request)


@pytest.fixture
def mqguard_redis_url(mqguard_redis_server: ServerHandle) -> str:
    """URL of the session Redis, emptied (FLUSHALL) before the test."""
    import redis

    url = mqguard_redis_server.urls["redis"]
    client = redis.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()
    return url


@pytest.fixture
def mqguard_redis_cluster_url(mqguard_redis_cluster_server: ServerHandle) -> str:
    """``redis+cluster://`` URL of the session cluster, every primary flushed before the test."""
    import redis

    url = mqguard_redis_cluster_server.urls["redis"]
    client = redis.RedisCluster.from_url(url.replace("redis+cluster://", "redis://", 1))
    try:
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()
    return url


@pytest.fixture
def mqguard_fresh_redis_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A private Redis with ``appendonly yes`` for this test only.

    Restart it with :func:`mqguard.servers.restart_redis` (same state dir and port, data kept);
    the fixture also stops the restarted server.
    """
    yield from serve(adopt(lambda: start_redis(appendonly=True), "redis server"), request)


_UNSAFE = re.compile(r"[^a-z0-9]+")


@pytest.fixture
def mqguard_unique_name(request: pytest.FixtureRequest) -> str:
    """A name unique to this test run, safe as a STOMP queue, MQTT topic level or Redis key.

    Only ``[a-z0-9-]``: no ``.``/``/`` (hierarchy separators in ActiveMQ and MQTT), no wildcards
    (``*``, ``>``, ``#``, ``+``) and nothing RabbitMQ's STOMP destination parser treats
    specially.
    """
    base = _UNSAFE.sub("-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"mqg-{base}-{uuid.uuid4().hex[:10]}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List kept server state dirs (their logs explain failures)."""
    summarize(terminalreporter)
