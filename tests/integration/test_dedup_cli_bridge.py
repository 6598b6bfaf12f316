"""``mqguard dedup stats`` reports each cache's own configured size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.cli import main
from mqguard.digest import id_digest
from mqguard.stores.redis import RedisStore


@pytest.mark.redis
def test_bridge_cache_reports_the_settings_matching_its_own_name(mqguard_redis_url: str,
                                                                 tmp_path: Path) -> None:
    store = RedisStore.from_url(mqguard_redis_url)
    store.ring_check_and_add("orders", [id_digest("a")], 300)
    store.ring_check_and_add("BRIDGE.orders", [id_digest("b")], 40)
    store.close()
    config = tmp_path / "mqguard.toml"
    config.write_text('[address-settings."orders"]\nid-cache-size = 300\n'
                      '[address-settings."BRIDGE.#"]\nid-cache-size = 40\n')
    result = CliRunner().invoke(main, ["dedup", "stats", "orders", "--store", mqguard_redis_url,
                                       "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["cache"]: row for row in json.loads(result.output)}
    assert rows["orders"]["configured_id_cache_size"] == 300
    assert rows["BRIDGE.orders"]["configured_id_cache_size"] == 40
    assert rows["BRIDGE.orders"]["capacity"] == 40
