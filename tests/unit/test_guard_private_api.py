"""Front ends drive the guard through its public API only.

Wrappers, the sidecar, plugins and adapters must not reach into ``Guard`` (a private
attribute of a guard, a private name of mqguard.pipeline): what they need is public,
documented in docs/embedding.md, and free to change inside pipeline.py otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "mqguard" / "pipeline.py"
SOURCES = ("mqguard", "plugins", "adapters")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def guard_private_names() -> set[str]:
    """Private methods and attributes of Guard, and private names of mqguard.pipeline."""
    tree = ast.parse(PIPELINE.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name) and _private(t.id))
        if isinstance(node, ast.ClassDef) and node.name == "Guard":
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef) and _private(item.name):
                    names.add(item.name)
                elif (isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name)
                      and item.value.id == "self" and _private(item.attr)):
                    names.add(item.attr)
    return names


def _names_a_guard(node: ast.expr) -> bool:
    """``guard``, ``self.guard``, ``ctx.guard``, ``self._guard``, or the class itself
    (``self`` of another class is that class's own business)."""
    text = ast.unparse(node)
    return text == "Guard" or text.rsplit(".", 1)[-1].lstrip("_").lower().endswith("guard")


def private_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, expression) of every private use of the guard in ``source``, in order."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = ast.unparse(node.value)
            if _names_a_guard(node.value) or (
                    node.attr in names and owner in ("pipeline", "mqguard.pipeline")):
                found.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif (isinstance(node, ast.ImportFrom) and node.module == "mqguard.pipeline"
              and any(_private(alias.name) for alias in node.names)):
            imported = ", ".join(alias.name for alias in node.names)
            found.append((node.lineno, node.col_offset,
                          f"from mqguard.pipeline import {imported}"))
    return [(line, text) for line, _, text in sorted(found)]


def test_no_module_outside_the_pipeline_uses_a_private_guard_name() -> None:
    names = guard_private_names()
    assert {"_record_verdict", "_decide_batch", "_stamp_ids", "_started"} <= names
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for source in SOURCES for path in sorted((ROOT / source).rglob("*.py"))
             if path != PIPELINE
             for line, text in private_uses(path.read_text(encoding="utf-8"), names)]
    assert found == [], "use the Guard's public API (docs/embedding.md):\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for() -> None:
    source = ("from mqguard.pipeline import Guard, _stamp_ids\n"
              "def f(self, guard, ctx):\n"
              "    self.guard._decide_batch()\n"
              "    guard._started = True\n"
              "    ctx.guard._record_verdict()\n"
              "    Guard._send_context\n"
              "    self._closed = True\n"          # the module's own attribute: fine
              "    self._guard.decide_sends()\n")  # public: fine
    assert private_uses(source, guard_private_names()) == [
        (1, "from mqguard.pipeline import Guard, _stamp_ids"),
        (3, "self.guard._decide_batch"), (4, "guard._started"),
        (5, "ctx.guard._record_verdict"), (6, "Guard._send_context")]
