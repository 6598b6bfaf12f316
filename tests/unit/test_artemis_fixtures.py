"""The Artemis fixtures follow the plugin's rules: prefixed, documented, loaded by this suite."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqguard.testing.artemis as artemis_plugin

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"


def test_this_suite_loads_it_by_name(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("mqguard.testing.artemis") is artemis_plugin


@pytest.mark.parametrize("name", artemis_plugin.__all__)
def test_fixture_is_prefixed_and_documented(name: str) -> None:
    assert name.startswith("mqguard_")
    assert f"`{name}`" in GUIDE.read_text(encoding="utf-8")
