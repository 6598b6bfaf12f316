"""The names ``mqguard`` exports: present at run time, typed as themselves for checkers.

``mqguard/__init__.py`` loads its public names lazily (``import mqguard`` for ``hookimpl``
must stay cheap) and imports the same names under ``TYPE_CHECKING`` so that mypy sees the
real classes. These tests keep the two lists and ``__all__`` in step, and run mypy on a
small program to check what a user's type checker sees.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mqguard

ROOT = Path(__file__).resolve().parents[2]
EAGER = {"__version__", "hookimpl"}


def _type_checking_imports() -> dict[str, str]:
    """{name: module} of the ``if TYPE_CHECKING:`` imports in ``mqguard/__init__.py``."""
    tree = ast.parse((ROOT / "mqguard" / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                for alias in statement.names:
                    found[alias.asname or alias.name] = statement.module
    return found


def test_all_lists_the_lazy_names_and_the_eager_ones() -> None:
    assert len(mqguard.__all__) == len(set(mqguard.__all__))
    assert set(mqguard.__all__) == set(mqguard._LAZY) | EAGER


def test_type_checkers_import_each_lazy_name_from_where_it_loads() -> None:
    assert _type_checking_imports() == mqguard._LAZY


@pytest.mark.parametrize("name", sorted(mqguard.__all__))
def test_each_public_name_resolves(name: str) -> None:
    value = getattr(mqguard, name)
    assert value is not None
    if name in mqguard._LAZY:
        assert value is getattr(importlib.import_module(mqguard._LAZY[name]), name)
    assert name in dir(mqguard)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        mqguard.no_such_name  # noqa: B018


def test_import_stays_cheap() -> None:
    # A fresh interpreter: this process has long loaded the pipeline.
    probe = "import json, sys, mqguard; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    loaded = set(json.loads(out))
    assert not {"mqguard.pipeline", "mqguard.stores", "pydantic", "redis"} & loaded


def _mypy(tmp_path: Path, program: str) -> list[str]:
    """mypy's notes and errors about ``program``, checked with the project's settings."""
    source = tmp_path / "mqguard_public_api_probe.py"
    source.write_text(program)
    # From the repository root, with the project's configuration: the cache is the one
    # the test command's own mypy run leaves, so this takes seconds.
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", str(source)],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    # By file name: mypy may replay a cached result under the path of an earlier run.
    prefix = re.compile(rf"^\S*\b{re.escape(source.name)}:")
    return [prefix.sub("", line) for line in run.stdout.splitlines() if prefix.match(line)]


def test_mypy_sees_the_real_classes(tmp_path: Path) -> None:
    names = sorted(set(mqguard.__all__) - {"__version__"})
    program = "\n".join([
        "import mqguard",
        "from mqguard import GuardedProducer",
        "",
        "reveal_type(GuardedProducer)",
        *(f"reveal_type(mqguard.{name})" for name in names),
        "mqguard.NoSuchName",
        "",
        "def use(producer: GuardedProducer) -> None:",
        "    producer.close()",
        "    producer.no_such_method()",
        "",
    ])
    lines = _mypy(tmp_path, program)
    revealed = {int(m.group(1)): m.group(2) for line in lines
                if (m := re.match(r'(\d+): note: Revealed type is "(.*)"$', line))}
    assert revealed[4].endswith("-> mqguard.producer.GuardedProducer")
    for number, name in enumerate(names, start=5):
        shown, value = revealed[number], getattr(mqguard, name)
        if isinstance(value, type):  # the class itself, not object or Any
            assert shown.endswith(f"-> {value.__module__}.{value.__qualname__}"), shown
        elif inspect.isfunction(value):
            assert shown.startswith("def ("), (name, shown)
        else:
            assert shown.endswith(f".{type(value).__qualname__}"), (name, shown)
    errors = [line for line in lines if ": error:" in line]
    no_such_name = 5 + len(names)
    assert errors == [
        f'{no_such_name}: error: Module has no attribute "NoSuchName"  [attr-defined]',
        f'{no_such_name + 4}: error: "GuardedProducer" has no attribute "no_such_method"'
        "  [attr-defined]",
    ]
