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

import atexit
import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from mqguard.servers.handle import ServerHandle, ServerUnavailable
from mqguard.servers.spark import start_spark_cluster

__all__ = ["mqguard_spark_cluster"]

# Handles started here, so that an interpreter exit that skips fixture teardown still does
# not leave three JVMs behind.
_started: list[ServerHandle] = []
_kept_state_dirs: list[str] = []


def _stop_all() -> None:
    for handle in _started:
        with contextlib.suppress(Exception):
            handle.stop()


atexit.register(_stop_all)


@pytest.fixture(scope="session")
def mqguard_spark_cluster(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A Spark master and two workers on 127.0.0.1 (``urls``: ``master``, ``ui``,
    ``worker-N-ui``; ``meta``: ``work_dir``, ``start_seconds``)."""
    try:
        handle = start_spark_cluster(workers=2, worker_cores=1, worker_memory="1g")
    except ServerUnavailable as exc:
        reason = f"spark cluster unavailable: {exc}"
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
                _kept_state_dirs.append(f"spark: {handle.state_dir}")
            else:
                shutil.rmtree(handle.state_dir, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the kept Spark state dir (master, worker and executor logs)."""
    if _kept_state_dirs:
        terminalreporter.write_sep("-", "mqguard Spark cluster state dir (logs) kept")
        for line in _kept_state_dirs:
            terminalreporter.write_line(line)
