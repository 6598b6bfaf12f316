"""pytest fixture for a Spark standalone cluster on loopback (:mod:`mqguard.servers.spark`).

Load it beside the main plugin, from the ``conftest.py`` at the root of the tests::

    pytest_plugins = ["mqguard.testing.pytest_plugin", "mqguard.testing.spark_cluster"]

``mqguard_spark_cluster`` is session-scoped: a master and two workers (1 core, 1 GB each), one
JVM apiece, started once (about 10 s on 2 cores) from the installed PySpark. Applications
connect with ``urls["master"]``; the master's ``/json/`` (``urls["ui"]``) lists workers and
applications, and ``meta["work_dir"]`` holds every executor's stdout/stderr. A cluster that
cannot start skips the test locally and fails it when ``CI`` is set; its state dir (logs
included) is kept when a test failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mqguard.servers.handle import ServerHandle
from mqguard.servers.spark import start_spark_cluster
from mqguard.testing.serving import adopt, serve, summarize

__all__ = ["mqguard_spark_cluster"]


@pytest.fixture(scope="session")
def mqguard_spark_cluster(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A Spark master and two workers on 127.0.0.1 (``urls``: ``master``, ``ui``,
    ``worker-N-ui``; ``meta``: ``work_dir``, ``start_seconds``)."""
    yield from serve(adopt(lambda: start_spark_cluster(workers=2, worker_cores=1,
                                                     worker_memory="1g"),
                           "spark cluster"), request)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the kept state dirs (master, worker and executor logs)."""
    summarize(terminalreporter)
