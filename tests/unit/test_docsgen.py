"""The generated reference pages (docs/configuration.md, docs/hooks.md) match the code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard import docsgen, hookspecs
from mqguard.cli import main
from mqguard.config import MqguardConfig, parse_config
from mqguard.settings import AddressSettingsTable

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_pages_are_current() -> None:
    result = CliRunner().invoke(main, ["docs", "generate", "--check", "--docs-dir", str(DOCS)])
    assert result.exit_code == 0, (
        f"{result.output}\nThe generated docs are stale: run `mqguard docs generate` and "
        "commit docs/configuration.md and docs/hooks.md.")


def test_check_names_a_stale_page_and_generate_fixes_it(tmp_path: Path) -> None:
    runner = CliRunner()
    written = runner.invoke(main, ["docs", "generate", "--docs-dir", str(tmp_path)])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configuration.md", "hooks.md"]
    page = tmp_path / "hooks.md"
    page.write_text(page.read_text().replace("before_send", "before_sned"))
    stale = runner.invoke(main, ["docs", "generate", "--check", "--docs-dir", str(tmp_path)])
    assert stale.exit_code == 1
    assert "hooks.md" in stale.output and "configuration.md" not in stale.output
    rewritten = runner.invoke(main, ["docs", "generate", "--docs-dir", str(tmp_path)])
    assert "wrote" in rewritten.output and "hooks.md" in rewritten.output
    again = runner.invoke(main, ["docs", "generate", "--check", "--docs-dir", str(tmp_path)])
    assert again.exit_code == 0, again.output


def _all_models() -> list[tuple[str, type]]:
    return [*docsgen.config_sections(), ('[address-settings."<match>"]', AddressSettingsTable),
            *((f"[plugins.{name}]", model) for name, model in docsgen.plugin_option_models())]


@pytest.mark.parametrize(("table", "model"), _all_models(), ids=lambda v: str(v))
def test_every_key_has_a_description_and_is_documented(table: str, model: type) -> None:
    text = docsgen.configuration_markdown()
    section = text.split(f"`{table}`", 1)[1]
    rows = list(docsgen.model_rows(model))
    assert rows
    for key, field, description in rows:
        assert description.strip(), f"{table} {key}: add a `#:` comment above the field"
        if docsgen._type_name(field.annotation) != "table":
            assert f"| `{key}` |" in section, f"{table} {key} missing from configuration.md"


def _documented_defaults(text: str, table: str) -> dict[str, str]:
    section = text.split(f"## `{table}`", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        match = re.match(r"\| `([a-z-]+)` \| [^|]+ \| ([^|]+) \|", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def test_documented_defaults_are_the_loaders_defaults() -> None:
    # Write a TOML file from the page's default column; the loader must accept it and
    # produce exactly the configuration it uses when the file is empty.
    text = docsgen.configuration_markdown()
    toml_lines = []
    tables = [table for table, _ in docsgen.config_sections() if "<name>" not in table]
    assert "[mqguard.sidecar]" in tables
    for table in tables:
        toml_lines.append(table)
        defaults = _documented_defaults(text, table)
        assert defaults, table
        for key, cell in defaults.items():
            if cell != "unset":
                value = re.match(r"`([^`]*)`", cell)
                assert value, f"{table}.{key}: default cell {cell!r} is not a TOML value"
                toml_lines.append(f"{key} = {value.group(1)}")
    parsed = parse_config(tomllib.loads("\n".join(toml_lines)), "docs/configuration.md")
    assert parsed.core == MqguardConfig().core


def test_every_hookspec_is_documented_with_its_marks() -> None:
    text = docsgen.hooks_markdown()
    specs = docsgen.hookspec_functions()
    assert {f.__name__ for _, f, _ in specs} == {
        name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "mqguard_spec")}
    for _, function, options in specs:
        block = text.split(f"### `{function.__name__}`", 1)[1].split("\n### ", 1)[0]
        assert f"def {function.__name__}(" in block
        assert ("`firstresult`" in block) == bool(options["firstresult"]), function.__name__
        assert ("`historic`" in block) == bool(options["historic"]), function.__name__
        first_line = (function.__doc__ or "").strip().splitlines()[0]
        assert docsgen._rst_to_md(first_line) in block


def test_attribute_comments_reads_hash_colon_lines_only() -> None:
    class Sample:
        # an ordinary comment: not documentation
        plain: int = 1
        #: First line
        #: second line.
        documented: str = "x"
        undocumented = 3

    assert docsgen.attribute_comments(Sample) == {"documented": "First line second line."}
