"""Production commands load neither the benchmarks nor the test support.

``mqguard.bench`` (benchmark drivers) and ``mqguard.testing`` (pytest fixtures, chaos
workers) are for measuring and testing mqguard; a production command, the shipped demo
included, must run without them. Each module is imported in a fresh interpreter, since
this test process has long loaded both.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: The production commands' modules; importing one loads the whole ``mqguard`` CLI.
COMMANDS = ("sidecar", "reap", "audit", "dedup", "config_cmd", "demo", "redistribute")
#: The shipped demo, command and scenario.
DEMO = ("mqguard.demo", "mqguard.demo.scenario", "mqguard.demo.faultproxy", "mqguard.cli.demo")

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""

_HELP = """
import json, sys
from mqguard.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_by(*modules: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def under(modules: list[str], package: str) -> list[str]:
    return [m for m in modules if m == package or m.startswith(f"{package}.")]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_production_command_does_not_import_the_benchmarks(command: str) -> None:
    modules = loaded_by(f"mqguard.cli.{command}")
    assert f"mqguard.cli.{command}" in modules
    assert under(modules, "mqguard.bench") == []
    assert under(modules, "mqguard.testing") == []


def test_mqguard_help_imports_neither_benchmarks_nor_test_support() -> None:
    done = subprocess.run([sys.executable, "-c", _HELP], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "Usage:" in done.stdout
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    assert under(modules, "mqguard.bench") == []
    assert under(modules, "mqguard.testing") == []


@pytest.mark.parametrize("module", DEMO)
def test_the_demo_does_not_import_test_support(module: str) -> None:
    modules = loaded_by(module)
    assert module in modules
    assert under(modules, "mqguard.testing") == []
