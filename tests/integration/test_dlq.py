"""``mqguard dlq`` on real brokers: ``list`` / ``show`` JSON, ``purge`` with filters. The
retry (SIGKILLed halfway, then run again, then audited) is in tests/audit/test_dlq_audit.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mqguard_tests.dlq import BROKERS, Scenario, broker_url

from mqguard.message import ORIG_ADDRESS_HEADER
from mqguard.testing.waiting import wait_for


@pytest.mark.parametrize("kind", BROKERS)
def test_list_show_and_filtered_purge(kind: str, request: pytest.FixtureRequest,
                                      tmp_path: Path, mqguard_unique_name: str) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    bodies = scenario.dead_letter(6)

    listing = json.loads(scenario.run("list", "--json"))
    (summary,) = [a for a in listing["addresses"] if a["address"] == scenario.dla]
    assert summary["messages"] == 6
    assert summary["by_original"] == {scenario.name: 6}
    assert list(summary["by_reason"].values()) == [6]
    assert "poison" in next(iter(summary["by_reason"]))
    assert summary["oldest"] <= summary["newest"]

    shown = json.loads(scenario.run("show", scenario.dla, "--limit", "3", "--json"))
    assert len(shown["messages"]) == 3
    for row in shown["messages"]:
        assert row["original_address"] == scenario.name
        assert row["original_queue"] == scenario.name
        assert row["delivery_count"] == 1
        assert row["moved_at"] > 0
        assert row["body"]["text"].encode() in bodies
        assert row["headers"][ORIG_ADDRESS_HEADER] == scenario.name
    # Reading consumed nothing.
    assert len(scenario.dla_contents()) == 6

    # Filters: nothing is older than a day; another original address matches nothing.
    out = json.loads(scenario.run("purge", scenario.dla, "--older-than", "1d", "--yes",
                                  "--json"))
    assert out["purged"] == 0 and out["skipped"] == 6
    out = json.loads(scenario.run("purge", scenario.dla, "--original", "elsewhere", "--yes",
                                  "--json"))
    assert out["purged"] == 0
    victim = shown["messages"][0]["message_id"]
    out = json.loads(scenario.run("purge", scenario.dla, "--id", victim, "--yes", "--json"))
    assert out["purged"] == 1
    time.sleep(0.2)
    left = scenario.dla_contents()
    assert len(left) == 5 and victim not in {x.message_id for x in left}
    out = json.loads(scenario.run("purge", scenario.dla, "--original", scenario.name,
                                  "--older-than", "0s", "--yes", "--json"))
    assert out["purged"] == 5
    assert scenario.dla_contents() == []
    kinds = [e["type"] for e in scenario.read_events()]
    assert kinds.count("dlq_purged") == 6
    assert "dlq_inspected" in kinds


def test_purge_refuses_a_bad_duration_and_asks_first(tmp_path: Path) -> None:
    scenario = Scenario("activemq", "stomp://127.0.0.1:9", "q", tmp_path)
    result = scenario.cli("purge", "q.DLA", "--older-than", "10 parsecs")
    assert result.exit_code == 2 and "--older-than" in result.output and "7d" in result.output
    result = scenario.cli("purge", "q.DLA", stdin="n\n")
    assert result.exit_code == 1 and "Delete every message in q.DLA" in result.output


@pytest.mark.parametrize("kind", BROKERS)
def test_retry_filters_dry_run_and_to(kind: str, request: pytest.FixtureRequest,
                                      tmp_path: Path, mqguard_unique_name: str) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    scenario.dead_letter(4)
    out = json.loads(scenario.run("retry", scenario.dla, "--dry-run", "--json"))
    assert (out["retried"], out["dry_run"], out["by_target"]) == (4, True, {scenario.name: 4})
    assert len(scenario.dla_contents()) == 4  # nothing moved
    assert "dlq_retried" not in {e["type"] for e in scenario.read_events()}

    out = json.loads(scenario.run("retry", scenario.dla, "--original", "elsewhere", "--json"))
    assert (out["retried"], out["skipped"]) == (0, 4)

    letters = scenario.dla_contents()
    chosen = letters[0].original_message_id
    other = f"{scenario.name}.fixed"
    if kind == "mosquitto":  # a topic keeps nothing without a subscribed session
        holder = scenario.adapter("holder")
        holder.connect()
        holder.subscribe(other, lambda delivery: None)
        holder.close()
    out = json.loads(scenario.run("retry", scenario.dla, "--id", str(chosen), "--to", other,
                                  "--json"))
    assert (out["retried"], out["by_target"]) == (1, {other: 1})
    left = scenario.dla_contents()
    assert len(left) == 3 and chosen not in {x.original_message_id for x in left}
    received = []
    reader = scenario.adapter("holder")
    reader.connect()
    try:
        reader.subscribe(other, received.append)
        wait_for(lambda: received, 10, "the copy at --to")
    finally:
        reader.close()
    (copy,) = [d.message for d in received]
    assert copy.headers[ORIG_ADDRESS_HEADER] == scenario.dla
    assert copy.message_id.endswith("~r") and copy.expiration == 0
    assert copy.body in {f"m-{i}".encode() for i in range(4)}

    out = json.loads(scenario.run("retry", scenario.dla, "--limit", "2", "--json"))
    assert out["retried"] == 2
    assert len(scenario.dla_contents()) == 1
