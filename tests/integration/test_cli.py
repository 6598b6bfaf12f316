"""The command line against real servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqguard import __version__
from mqguard.cli import main


def test_version_and_help() -> None:
    runner = CliRunner()
    assert __version__ in runner.invoke(main, ["--version"]).output
    out = runner.invoke(main, ["--help"]).output
    for command in ("demo", "bench", "config", "dedup"):
        assert command in out


@pytest.mark.activemq
def test_demo_round_trip(activemq_server: Any, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--url", activemq_server.urls["stomp"],
                                       "-n", "200", "--events-dir", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "OK: 200 messages" in text and "20 duplicate sends rejected" in text


def test_config_check_reports_errors(tmp_path: Path) -> None:
    bad = tmp_path / "mqguard.toml"
    bad.write_text('[address-settings."#"]\nredelivery-delay = -5\n')
    result = CliRunner().invoke(main, ["config", "check", str(bad)])
    assert result.exit_code != 0
    assert 'address-settings."#".redelivery-delay = -5' in result.output


def test_config_check_validates_plugin_tables(tmp_path: Path) -> None:
    bad = tmp_path / "mqguard.toml"
    bad.write_text('[plugins.consumer_audit]\naction = "nope"\n')
    result = CliRunner().invoke(main, ["config", "check", str(bad)])
    assert result.exit_code == 1
    assert "plugins.consumer_audit.action = 'nope'" in result.output
    good = tmp_path / "good.toml"
    good.write_text('[plugins.consumer_audit]\naction = "poison"\n')
    result = CliRunner().invoke(main, ["config", "check", str(good)])
    assert result.exit_code == 0 and "consumer_audit, delivery_counting" in result.output


def test_config_show_effective_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "mqguard.toml"
    cfg.write_text('[address-settings."orders.#"]\nmax-delivery-attempts = 3\n')
    result = CliRunner().invoke(main, ["config", "show", "orders.eu", "-c", str(cfg)])
    assert result.exit_code == 0
    assert '"max_delivery_attempts": 3' in result.output and '"orders.#"' in result.output
