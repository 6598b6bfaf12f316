"""The Spark cluster fixture follows the plugin's rules: prefixed, documented, loaded by this
suite; and the launcher refuses a cluster without workers before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqguard.testing.spark_cluster as spark_plugin
from mqguard.servers.spark import start_spark_cluster

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"


def test_this_suite_loads_it_by_name(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("mqguard.testing.spark_cluster") is spark_plugin


@pytest.mark.parametrize("name", spark_plugin.__all__)
def test_fixture_is_prefixed_and_documented(name: str) -> None:
    assert name.startswith("mqguard_")
    assert f"`{name}`" in GUIDE.read_text(encoding="utf-8")


def test_no_workers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers"):
        start_spark_cluster(tmp_path, workers=0)
    assert list(tmp_path.iterdir()) == []
