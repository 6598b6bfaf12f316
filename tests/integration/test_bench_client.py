"""``mqguard bench client`` end to end against the session's REAL brokers, small: it runs
both directions and what it reports is consistent (the figures themselves are in the README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from mqguard_tests.brokers import BROKERS, broker_of

from mqguard.cli import main

MESSAGES = 200
ROUNDS = 2


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    return broker_of(request)


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_bench_client_reports_both_directions(broker_url: tuple[str, str],
                                              tmp_path: Path) -> None:
    broker, url = broker_url
    path = tmp_path / "client.json"
    result = CliRunner().invoke(main, [
        "bench", "client", "--broker", broker, f"--{broker}-url", url, "--store", "memory",
        "-n", str(MESSAGES), "--batch", "50", "--prefetch", "50", "--rounds", str(ROUNDS),
        "--warmup", "100", "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert report["benchmark"] == "client"
    assert report["goals"] == {"ratio_redis": 0.9, "ratio_memory": 0.95}
    assert report["parameters"]["warmup"] == 100
    cases = {case["direction"]: case for case in report["cases"]}
    assert set(cases) == {"produce", "consume"}
    for case in cases.values():
        assert (case["broker"], case["store"], case["messages"]) == (broker, "memory", MESSAGES)
        assert len(case["raw_runs"]) == len(case["guarded_runs"]) == ROUNDS
        assert min(case["raw_runs"] + case["guarded_runs"]) > 0
        assert case["ratio"] == pytest.approx(case["guarded_per_s"] / case["raw_per_s"])
