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


@pytest.mark.activemq
def test_sidecar_command_serves_and_stops_on_sigterm(mqguard_activemq_server: Any,
                                                     tmp_path: Path) -> None:
    """`mqguard sidecar` as a process: JSON logs, a round trip through it, SIGTERM drains
    and exits 0."""
    import json
    import signal
    import subprocess
    import sys
    import time

    import stomp  # type: ignore[import-untyped]

    (tmp_path / "mqguard.toml").write_text(
        '[mqguard]\nmessage-expiry-scan-period = -1\n'
        f'[mqguard.event-log]\ndirectory = "{tmp_path / "events"}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqguard.cli", "sidecar", "--listen", "127.0.0.1:0",
         "--upstream", mqguard_activemq_server.urls["stomp"], "--config",
         str(tmp_path / "mqguard.toml"),
         "--admin", "127.0.0.1:0", "--log-format", "json"],
        stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = 0
        deadline = time.monotonic() + 30
        while not port and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the sidecar exited before listening"
            if line.startswith("mqguard sidecar listening on"):
                port = int(line.split(":")[1].split(",")[0])
            elif line.startswith("{"):
                assert "level" in json.loads(line)  # structured log lines
        got: list[str] = []
        conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        listener = stomp.ConnectionListener()
        listener.on_message = lambda frame: got.append(frame.body)  # type: ignore[method-assign]
        conn.set_listener("l", listener)
        conn.connect("guest", "secret-passcode", wait=True)
        conn.subscribe("/queue/cli-sidecar", id="s", ack="auto")
        conn.send("/queue/cli-sidecar", "through the process", receipt="r")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == ["through the process"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        rest = proc.stderr.read()
        assert "stopping" in rest
        assert "secret-passcode" not in rest  # credentials never reach a log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sidecar_command_rejects_bad_arguments() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["sidecar", "--upstream", "http://x:1"])
    assert result.exit_code == 1 and "scheme must be stomp://" in result.output
    result = runner.invoke(main, ["sidecar", "--upstream", "stomp://x:1", "--listen", "nope"])
    assert result.exit_code == 1 and "--listen must be HOST:PORT" in result.output
    result = runner.invoke(main, ["sidecar", "--help"])
    assert result.exit_code == 0 and "--upstream" in result.output


def test_config_check_lists_disabled_plugins_apart(tmp_path: Path) -> None:
    cfg = tmp_path / "mqguard.toml"
    cfg.write_text('[mqguard]\ndisabled-plugins = ["consumer_audit"]\n')
    result = CliRunner().invoke(main, ["config", "check", str(cfg)])
    assert result.exit_code == 0, result.output
    loaded, _, disabled = " ".join(result.output.split()).partition("; disabled:")
    assert "consumer_audit" not in loaded and "delivery_counting" in loaded
    assert "consumer_audit" in disabled
