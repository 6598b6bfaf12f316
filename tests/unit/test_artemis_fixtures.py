"""The Artemis fixtures follow the plugin's rules: prefixed, documented, loaded by this suite;
an Artemis that cannot be had skips a test locally and fails it under CI."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqguard.testing.artemis as artemis_plugin

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"

pytest_plugins = ["pytester"]


def test_this_suite_loads_it_by_name(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("mqguard.testing.artemis") is artemis_plugin


@pytest.mark.parametrize("name", artemis_plugin.__all__)
def test_fixture_is_prefixed_and_documented(name: str) -> None:
    assert name.startswith("mqguard_")
    assert f"`{name}`" in GUIDE.read_text(encoding="utf-8")


@pytest.mark.parametrize(("ci", "outcome"), [("", {"skipped": 1}), ("true", {"errors": 1})])
def test_an_artemis_that_cannot_be_had_is_a_failure_under_ci(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str,
        outcome: dict[str, int]) -> None:
    # An installation without bin/artemis stands for Maven or the network being unavailable;
    # under CI the fixture fails, so the test errors at setup (red, never skipped).
    pytester.makeconftest('pytest_plugins = ["mqguard.testing.artemis"]')
    pytester.makepyfile("def test_needs_it(mqguard_artemis_server):\n    pass\n")
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("MQGUARD_ARTEMIS_HOME", str(pytester.path / "no-artemis"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rsf")
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines(["*artemis server unavailable: MQGUARD_ARTEMIS_HOME=*"
                                 "no bin/artemis there*"])
    if ci:
        result.stdout.fnmatch_lines(["*required server unavailable in CI*"])
