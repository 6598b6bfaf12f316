"""``mqguard bench dedup`` end to end at a small size, against the test Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.cli import main


@pytest.mark.redis
def test_bench_dedup_writes_every_figure(mqguard_redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "dedup.json"
    result = CliRunner().invoke(main, ["bench", "dedup", "--redis", mqguard_redis_url, "--ids",
                                       "5000",
                                       "--batch", "500", "--memory-ids", "20000",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    for rate in ("batched_ids_per_s", "reserve_ids_per_s", "pipelined_ids_per_s",
                 "redis_benchmark_per_s", "memory_store_ops_per_s",
                 "memory_store_ops_per_cpu_s", "memory_store_reserve_ops_per_s"):
        assert figures[rate] > 0, rate
    assert figures["ratio"] == pytest.approx(
        figures["batched_ids_per_s"] / figures["redis_benchmark_per_s"])
    # 8-byte digests in listpack shards: far below the 64-byte goal even at this size.
    assert 5 < figures["bytes_per_id"] <= 64
    assert figures["goals"] == {"ratio": 1.0, "bytes_per_id": 64,
                                "memory_store_ops_per_s": 1_000_000}
    assert figures["parameters"]["ids"] == 5000
