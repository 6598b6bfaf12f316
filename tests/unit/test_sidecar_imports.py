"""The sidecar reaches adapters only through the registry: it imports no adapter module.

Its broker facts come from :mod:`mqguard.stomp_brokers`, and its reaper opens an adapter with
:func:`mqguard.registry.open_adapter`, so importing the sidecar loads neither
``mqguard.adapters.*`` nor stomp.py. Checked in a fresh interpreter, since this test process
may have loaded the adapters long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

SIDECAR_MODULES = ("mqguard.sidecar.server", "mqguard.sidecar.native_bridge",
                   "mqguard.sidecar.upstream", "mqguard.sidecar.frames")

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(*modules: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                          text=True, timeout=120, check=True)
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def _adapters(modules: list[str]) -> list[str]:
    return [name for name in modules
            if name == "mqguard.adapters" or name.startswith("mqguard.adapters.")
            or name == "stomp" or name.startswith("stomp.")]


def test_the_sidecar_imports_no_adapter() -> None:
    modules = _loaded_by(*SIDECAR_MODULES)
    assert set(SIDECAR_MODULES) <= set(modules)
    assert "mqguard.stomp_brokers" in modules
    assert _adapters(modules) == []


@pytest.mark.parametrize("module", SIDECAR_MODULES)
def test_no_sidecar_module_imports_an_adapter_on_its_own(module: str) -> None:
    assert _adapters(_loaded_by(module)) == []


def test_the_reaper_opens_its_adapter_through_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mqguard.config import MqguardConfig
    from mqguard.sidecar import server

    opened: list[str] = []

    class _Refused(Exception):
        pass

    def open_adapter(url: str) -> object:
        opened.append(url)
        raise _Refused

    monkeypatch.setattr(server, "open_adapter", open_adapter)
    # Only what _start_reaper reads: no guard, store or event log is made.
    sidecar = SimpleNamespace(mqguard_config=MqguardConfig(),
                              upstream=server.parse_upstream("stomp://127.0.0.1:61613"))
    with pytest.raises(_Refused):
        server.Sidecar._start_reaper(sidecar)  # type: ignore[arg-type]
    assert opened == ["stomp://127.0.0.1:61613"]
