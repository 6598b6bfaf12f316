"""pytest fixture for a 3-node RabbitMQ cluster on loopback: ``mqguard_rabbitmq_cluster``.

Load it beside the main plugin (from the ``conftest.py`` at the top of the tests)::

    pytest_plugins = ["mqguard.testing.pytest_plugin", "mqguard.testing.rabbitmq_cluster"]

The cluster is started once per test module (``mqguard_rabbitmq_cluster_module``): it costs
about half a minute, and tests that kill nodes leave it in a state (restarted nodes, queue
leaders moved) that other modules should not inherit.  ``mqguard_rabbitmq_cluster`` gives a
test that cluster as a :class:`~mqguard.servers.rabbitmq_cluster.RabbitMQCluster` with every
node running: a node an earlier test killed is restarted first.  As with the
other server fixtures a cluster that cannot start skips the test, except under ``CI``, where
it fails.  State dirs are kept when a test failed (or ``MQGUARD_KEEP_STATE`` is set) and named
in the terminal summary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqguard.servers import ServerUnavailable
from mqguard.servers.rabbitmq_cluster import RabbitMQCluster, start_rabbitmq_cluster
from mqguard.testing.serving import keep_or_remove, summarize, unavailable

__all__ = ["mqguard_rabbitmq_cluster", "mqguard_rabbitmq_cluster_module"]


@pytest.fixture(scope="module")
def mqguard_rabbitmq_cluster_module(request: pytest.FixtureRequest) -> Iterator[RabbitMQCluster]:
    """The cluster of the current test module (started once per module, stopped after it)."""
    try:
        handle = start_rabbitmq_cluster()
    except ServerUnavailable as exc:
        unavailable(f"rabbitmq cluster unavailable: {exc}")
    failed_before = request.session.testsfailed
    try:
        yield RabbitMQCluster(handle)
    finally:
        try:
            handle.stop()
        finally:
            keep_or_remove("rabbitmq-cluster", handle.state_dir,
                           request.session.testsfailed > failed_before)


@pytest.fixture
def mqguard_rabbitmq_cluster(mqguard_rabbitmq_cluster_module: RabbitMQCluster) -> RabbitMQCluster:
    """A 3-node RabbitMQ 3.10 cluster with every node running (a node an earlier test of the
    module killed is restarted first): ``stomp_url(i)``, ``kill_node(i)``, ``restart_node(i)``,
    ``rabbitmqctl(i, ...)``."""
    cluster = mqguard_rabbitmq_cluster_module
    for index in range(1, cluster.size + 1):
        if not cluster.node(index).is_running():
            try:
                cluster.restart_node(index)
            except ServerUnavailable as exc:
                unavailable(f"rabbitmq cluster node {index} did not come back: {exc}")
    return cluster


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the state dirs kept for inspection."""
    summarize(terminalreporter)
