"""The code samples of the docs run as written.

Fenced blocks whose info string is ``python tested`` are executed in order, one
namespace per page, in a temporary working directory; ``toml tested`` blocks must
parse. The plugin guide's entry-point example is installed for real (a
``.dist-info`` on ``sys.path``) and loaded through the ``mqguard`` group.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from mqguard.config import parse_config
from mqguard.errors import MessageRejected
from mqguard.pipeline import Guard
from mqguard.plugin_manager import make_plugin_manager
from mqguard.producer import GuardedProducer
from mqguard.registry import PLUGIN_ENTRY_POINT_GROUP
from mqguard.testing.loopback import LoopbackAdapter

DOCS = Path(__file__).resolve().parents[2] / "docs"
_FENCE = re.compile(r"^```(\w+) tested\n(.*?)^```$", re.M | re.S)


def marked_blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every block marked as tested on ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)]


PAGES = sorted(p for p in DOCS.glob("*.md") if marked_blocks(p))


def test_the_plugin_guide_has_tested_examples() -> None:
    assert DOCS / "writing-plugins.md" in PAGES
    languages = [lang for lang, _, _ in marked_blocks(DOCS / "writing-plugins.md")]
    assert languages.count("python") >= 5 and "toml" in languages


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for language, code, line in marked_blocks(page):
        if language == "toml":
            tomllib.loads(code)
        elif language == "python":
            # Line numbers in tracebacks point into the page.
            compiled = compile("\n" * line + code, str(page), "exec")
            exec(compiled, namespace)
        else:
            pytest.fail(f"{page.name}:{line}: no runner for '{language} tested' blocks")


def _guide_block(needle: str, language: str = "python") -> str:
    return next(code for lang, code, _ in marked_blocks(DOCS / "writing-plugins.md")
                if lang == language and needle in code)


def test_entry_point_example_registers_and_disables(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    entry_points = tomllib.loads(_guide_block("[project.entry-points", "toml"))
    group = entry_points["project"]["entry-points"]
    assert list(group) == [PLUGIN_ENTRY_POINT_GROUP]
    (name, target), = group[PLUGIN_ENTRY_POINT_GROUP].items()
    # Install the guide's module plugin as a distribution with that entry point.
    (tmp_path / f"{target}.py").write_text(_guide_block("WeakKeyDictionary"))
    dist = tmp_path / f"{target}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {target}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{PLUGIN_ENTRY_POINT_GROUP}]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        events = {"event-log": {"directory": str(tmp_path / "events")}}
        with Guard(parse_config({"mqguard": events})) as guard:
            assert guard.plugins.get_plugin(name) is sys.modules[target]
            producer = GuardedProducer(LoopbackAdapter(), guard=guard)
            producer.send("q", b"ok")
            with pytest.raises(MessageRejected):
                producer.send("q", b"x" * 2000)
            assert sys.modules[target]._refused[guard] == 1
        disabled = parse_config({"mqguard": {**events, "disabled-plugins": [name]}})
        assert make_plugin_manager(disabled).get_plugin(name) is None
        with Guard(disabled) as guard:
            GuardedProducer(LoopbackAdapter(), guard=guard).send("q", b"x" * 2000)
    finally:
        sys.modules.pop(target, None)


def test_operations_page_names_exactly_the_metrics_the_code_registers() -> None:
    sidecar_sources = (Path(__file__).resolve().parents[2] / "mqguard" / "sidecar").glob("*.py")
    registered = {name for source in sidecar_sources
                  for name in re.findall(r'"(mqguard_[a-z_]+)"', source.read_text())}
    assert "mqguard_sidecar_open_connections" in registered
    documented = set(re.findall(r"`(mqguard_[a-z_]+)`",
                                (DOCS / "operations.md").read_text(encoding="utf-8")))
    documented = {n for n in documented if not n.endswith(("_bucket", "_sum", "_count"))}
    assert documented == registered, (f"missing from docs/operations.md: "
                                      f"{registered - documented}; not in the code: "
                                      f"{documented - registered}")


def test_broker_capability_table_matches_the_adapters() -> None:
    import dataclasses

    from mqguard.adapter import Capabilities
    from mqguard.adapters.mqtt import MqttAdapter
    from mqguard.adapters.stomp import BROKER_CAPABILITIES

    text = (DOCS / "brokers.md").read_text(encoding="utf-8")
    table = text.split("<!-- capability-flags: begin -->")[1].split("<!-- capability-flags: end")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()]
    header, body = rows[0], rows[2:]
    code = {**{name: BROKER_CAPABILITIES[name] for name in ("activemq", "rabbitmq", "artemis")},
            "mosquitto": MqttAdapter("mqtt://127.0.0.1:1883").capabilities}
    assert header[1:] == ["activemq", "rabbitmq", "mosquitto", "artemis"]
    assert [row[0].strip("`") for row in body] == [f.name for f in
                                                   dataclasses.fields(Capabilities)]
    for row in body:
        flag = row[0].strip("`")
        for broker, cell in zip(header[1:], row[1:], strict=True):
            value = getattr(code[broker], flag)
            expected = ("yes" if value else "no") if isinstance(value, bool) else f"`{value}`"
            assert cell == expected, f"{flag} on {broker}: page says {cell}, code {expected}"
