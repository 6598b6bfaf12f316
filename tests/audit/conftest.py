"""One local SparkSession for every audit test: starting Spark costs seconds."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("pyspark") is None:
    if os.environ.get("CI"):
        raise RuntimeError("pyspark is required in CI: pip install -e '.[spark]'")
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mqguard.audit.session import build_session

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    # Adaptive execution re-plans between stages: worth it on big shuffles, pure
    # overhead on test logs of a few hundred events (measured: ~2x per audit).
    session = build_session("local[2]", shuffle_partitions=2, driver_memory="1g",
                            conf={"spark.sql.adaptive.enabled": "false"}, log_path=str(log))
    try:
        yield session
    finally:
        session.stop()
