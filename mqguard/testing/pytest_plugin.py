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

import atexit
import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from mqguard.servers import (
    ServerHandle,
    ServerUnavailable,
    docker_available,
    start,
    start_in_docker,
    start_redis,
)
from mqguard.servers.docker import DOCKER_KINDS

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

# Every handle this plugin started, so that an interpreter exit that skips fixture teardown
# (e.g. pytest.exit from a hook, or an internal error) still does not leak servers.
_started: list[ServerHandle] = []
_kept_state_dirs: list[str] = []


def _stop_all() -> None:
    for handle in _started:
        with contextlib.suppress(Exception):
            handle.stop()


atexit.register(_stop_all)


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"required server unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _provide(kind: str, **kw: Any) -> ServerHandle:
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
        _unavailable(f"{kind} server unavailable: {exc}{docker_error}")
    _started.append(handle)
    return handle


def _release(handle: ServerHandle, session: pytest.Session) -> None:
    try:
        handle.stop()
        # A restart in the same state dir (see mqguard_fresh_redis_server) leaves the newest server
        # in handle.json; stop that one too.
        with contextlib.suppress(ServerUnavailable, OSError, ValueError):
            ServerHandle.load(handle.state_dir).stop()
    finally:
        if handle in _started:
            _started.remove(handle)
        if os.environ.get("MQGUARD_KEEP_STATE") or session.testsfailed:
            _kept_state_dirs.append(f"{handle.kind}: {handle.state_dir}")
        else:
            shutil.rmtree(handle.state_dir, ignore_errors=True)


def _server(kind: str, request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    handle = _provide(kind)
    try:
        yield handle
    finally:
        _release(handle, request.session)


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
    try:
        handle = start_redis(appendonly=True)
    except ServerUnavailable as exc:
        _unavailable(f"redis server unavailable: {exc}")
    _started.append(handle)
    try:
        yield handle
    finally:
        _release(handle, request.session)


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
    if _kept_state_dirs:
        terminalreporter.write_sep("-", "mqguard server state dirs (logs) kept")
        for line in _kept_state_dirs:
            terminalreporter.write_line(line)
