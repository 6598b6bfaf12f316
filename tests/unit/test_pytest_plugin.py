"""The pytest plugin is opt-in and its fixtures carry the ``mqguard_`` prefix."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

import mqguard.testing.cluster as cluster
import mqguard.testing.pytest_plugin as plugin

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"


def test_no_entry_point_loads_it_into_every_pytest_run() -> None:
    assert not [ep for ep in entry_points(group="pytest11") if ep.value.startswith("mqguard")]


def test_this_suite_loads_it_by_name(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("mqguard.testing.pytest_plugin") is plugin


@pytest.mark.parametrize("name", [*plugin.__all__, *cluster.__all__])
def test_fixture_names_are_prefixed(name: str) -> None:
    assert name.startswith("mqguard_")


@pytest.mark.parametrize("name", plugin.__all__)
def test_the_plugin_guide_lists_every_fixture(name: str) -> None:
    assert f"`{name}`" in GUIDE.read_text(encoding="utf-8")
