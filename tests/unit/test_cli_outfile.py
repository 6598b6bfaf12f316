"""A --json file a long command could not write at its end is refused before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.cli import main

COMMANDS = [["conformance", "--examples", "1"], ["bench", "peer", "-n", "100"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_json_file_in_a_missing_directory_is_refused(command: list[str],
                                                       tmp_path: Path) -> None:
    target = tmp_path / "missing" / "out.json"
    result = CliRunner().invoke(main, [*command, "--json", str(target)])
    assert result.exit_code == 2
    assert f"Invalid value for '--json': {target}: no directory {target.parent}" in result.output
    assert "starting" not in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_is_refused(command: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [*command, "--json", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path} is a directory" in result.output
