"""``mqguard bench reap`` end to end against the session's REAL brokers, small: its figures
must add up (the bench itself checks every message; this checks what it reports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mqguard_tests.brokers import BROKERS, broker_of

from mqguard.bench.reap import expiring_plan
from mqguard.cli import main

MESSAGES = 200


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    return broker_of(request)


def run_bench(broker: str, url: str, json_path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, [
        "bench", "reap", "--broker", broker, f"--{broker}-url", url, "-n", str(MESSAGES),
        "--native-wait", "0.5", "--timeout", "60", "--reaper-timeout", "60",
        "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(json_path.read_text())
    assert report["benchmark"] == "reap"
    assert report["parameters"]["messages"] == MESSAGES
    (case,) = report["cases"]
    return case


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_bench_reap_figures_add_up(broker_url: tuple[str, str], tmp_path: Path) -> None:
    broker, url = broker_url
    case = run_bench(broker, url, tmp_path / "reap.json")
    print(json.dumps(case, indent=1))
    assert case["broker"] == broker
    assert (case["messages"], case["expired"], case["remaining"]) == (MESSAGES, 100, 100)
    assert case["fill_s"] > 0
    # The broker's own expiry got rid of every expired message, and was timed.
    assert case["native_expired"] == case["expired"]
    assert case["native_s"] > 0 and case["native_per_s"] > 0
    assert case["native_mechanism"]
    if broker == "mosquitto":
        assert case["reaper_strategy"] == "native-drop"
        assert case["reaper_moved"] is None and case["reaper_s"] is None
        assert "reaper: not applicable" in case["notes"]
        return
    assert case["reaper_strategy"] == ("selector" if broker == "activemq" else "dead-letter")
    assert case["reaper_complete"] is True
    assert case["reaper_moved"] == case["expired"]
    assert case["reaper_s"] > 0 and case["reaper_per_s"] > 0 and case["reaper_scans"] >= 1
    if broker == "activemq":
        # The selector reaper works at rest: nothing had to consume the queue.
        assert case["reaper_at_rest_moved"] == case["expired"]
        assert case["native_expired_at_send"] == 0  # the native half expired at rest
    else:
        # RabbitMQ expires at the queue head only: at rest just the first message (expired;
        # an unexpired one is behind it), the rest once a consumer walked the queue.
        assert case["reaper_at_rest_moved"] == case["native_at_rest_expired"] == 1


def test_expiring_plan_spreads_the_expired_evenly() -> None:
    assert expiring_plan(6, 0.5) == [True, False, True, False, True, False]
    plan = expiring_plan(1000, 0.25)
    assert sum(plan) == 250
    assert [i for i, expiring in enumerate(plan) if expiring][:3] == [0, 4, 8]
    assert sum(expiring_plan(101, 0.5)) == 51  # ceil: the first message is always expired
    assert sum(expiring_plan(100_000, 0.3)) == 30_000
