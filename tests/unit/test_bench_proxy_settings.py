"""The configuration ``mqguard bench proxy`` gives the sidecars it measures (pure logic:
the runs themselves are in tests/integration/test_bench_proxy.py)."""

from __future__ import annotations

import tomllib

import pytest

from mqguard.bench.proxy import _alternate, _toml, sidecar_settings
from mqguard.config import parse_config
from mqguard.registry import BUILTIN_PLUGINS


@pytest.mark.parametrize("bare", [False, True])
def test_sidecar_settings_survive_the_toml_file(bare: bool) -> None:
    settings = sidecar_settings("redis://127.0.0.1:1/0", '/tmp/a "quoted" dir', bare=bare)
    assert tomllib.loads(_toml({"mqguard": settings})) == {"mqguard": settings}
    config = parse_config({"mqguard": settings}, "test")
    assert config.core.event_log.directory == '/tmp/a "quoted" dir'
    if bare:
        assert sorted(config.core.disabled_plugins) == sorted(BUILTIN_PLUGINS)
        assert config.core.event_log.enabled is False
    else:
        assert config.core.disabled_plugins == []
        assert config.core.event_log.enabled is True


def test_rounds_alternate_the_order_of_every_path() -> None:
    calls: list[str] = []

    def run(side: str) -> float:
        calls.append(side)
        return float(len(calls))

    results = _alternate(3, run, ["direct", "proxy", "bare"])
    assert calls == ["direct", "proxy", "bare", "bare", "proxy", "direct",
                     "direct", "proxy", "bare"]
    assert results == {"direct": [1.0, 6.0, 7.0], "proxy": [2.0, 5.0, 8.0],
                       "bare": [3.0, 4.0, 9.0]}
