"""The audit reads ``mqguard dlq retry`` as one message with a second life: the retried
copy is neither unexpected, nor duplicated, nor over max-delivery-attempts, and must
reach a fate like any sent message. On real brokers: 20 poison messages dead-lettered,
the handler fixed, a retry SIGKILLed halfway and ``mqguard dlq retry`` run again: every
message handled exactly once, the dead-letter address empty, the audit clean."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.dlq import (
    BROKERS,
    POISON,
    Scenario,
    broker_url,
    once_each,
    retry_in_child,
    wait_handled,
)

from mqguard.audit.checks import CheckOptions
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.config import parse_config
from mqguard.message import now_ms
from mqguard.testing.waiting import wait_for

Q, DLA = "orders", "orders.DLA"


def _events(message: str, dead: str, t: int, *, handled: bool) -> list[dict[str, Any]]:
    """A message sent, failed once, dead-lettered as ``dead``, retried as ``dead~r``."""
    base = {"v": 1, "node": "n"}
    first = {**base, "address": Q, "message_id": message, "producer_id": "P", "seq": t}
    copy = {**base, "address": DLA, "message_id": dead, "producer_id": "P", "seq": t}
    second = {**base, "address": Q, "message_id": dead + "~r", "producer_id": "P", "seq": t}
    rows = [
        {**first, "ts": t, "type": "sent"},
        {**first, "ts": t + 1, "type": "delivered", "queue": Q, "delivery_count": 1},
        {**first, "ts": t + 2, "type": "handler_failed", "queue": Q, "delivery_count": 1},
        {**first, "ts": t + 3, "type": "moved", "queue": Q, "target": DLA,
         "new_message_id": dead},
        {**first, "ts": t + 3, "type": "dead_lettered", "queue": Q, "target": DLA,
         "delivery_count": 1},
        {**first, "ts": t + 3, "type": "acked", "queue": Q, "ack_reason": "killed",
         "handled": False},
        {**copy, "ts": t + 10, "type": "dlq_retried", "queue": DLA, "target": Q,
         "new_message_id": dead + "~r", "bridge_id": "dlq:" + dead},
        {**copy, "ts": t + 10, "type": "acked", "queue": DLA, "ack_reason": "normal",
         "handled": False},
    ]
    if handled:
        rows += [
            {**second, "ts": t + 11, "type": "delivered", "queue": Q, "delivery_count": 1},
            {**second, "ts": t + 12, "type": "acked", "queue": Q, "ack_reason": "normal",
             "handled": True, "delivered_ts": t + 11},
        ]
    return rows


def test_a_retried_message_is_one_message_with_a_second_life(spark: Any, tmp_path: Path
                                                               ) -> None:
    events = tmp_path / "events"
    events.mkdir()
    t = 1_700_000_000_000
    rows = (_events("P.1", "D1", t, handled=True) + _events("P.2", "D2", t + 100, handled=True)
            + _events("P.3", "D3", t + 200, handled=False))
    (events / "events-n.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = parse_config({"address-settings": {Q: {"max-delivery-attempts": 1,
                                                    "dead-letter-address": DLA}}})
    summary = run_audit(spark, AuditOptions(
        [str(events)], out=str(tmp_path / "out"), config=config, watermark=t + 10_000,
        checks=CheckOptions(assume_drained=True), html=False)).summary
    found = {name: entry["count"] for name, entry in summary["classes"].items()
             if entry["count"]}
    # Only the second life that never reached a fate is reported: as lost.
    assert found == {"lost": 1}, found
    examples = json.dumps(summary["classes"]["lost"])
    assert "D3~r" in examples


@pytest.mark.redis
@pytest.mark.parametrize("kind", BROKERS)
def test_retry_killed_halfway_then_again_handles_each_message_once(
        spark: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path,
        mqguard_unique_name: str, mqguard_redis_url: str) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path,
                        store=mqguard_redis_url)
    bodies = scenario.dead_letter()
    assert len(scenario.dla_contents()) == POISON

    context = multiprocessing.get_context("spawn")
    with scenario.fixed_consumer() as handled:
        first = context.Process(target=retry_in_child, daemon=True, args=(
            scenario.url, scenario.dla, scenario.config("dlq-1"), 8.0, 1))
        first.start()
        try:
            wait_for(lambda: len(handled) >= 5 or not first.is_alive(), 60, "the first retries")
        finally:
            os.kill(first.pid or 0, signal.SIGKILL)
            first.join(10)
        assert 5 <= len(handled) < POISON, "the kill must land halfway"
        # Run again as an operator does: `mqguard dlq retry`.
        second = json.loads(scenario.run("retry", scenario.dla, "--json", node="dlq-2"))
        wait_handled(scenario, bodies)
    assert once_each(handled, bodies) == {}
    assert second["retried"] + second["completed"] >= 1 and second["no_origin"] == 0
    assert scenario.dla_contents() == []
    events = scenario.read_events()
    retried = {e["new_message_id"] for e in events if e["type"] == "dlq_retried"}
    assert len(retried) == POISON
    dead = {e["message_id"] for e in events if e["type"] == "dlq_retried"}
    acked = {e["message_id"] for e in events if e["type"] == "acked"
             and e.get("queue") == scenario.dla}
    assert dead == acked

    summary = run_audit(spark, AuditOptions(
        [str(scenario.events)], out=str(tmp_path / "out"),
        config=parse_config(scenario.config("audit")), watermark=now_ms(),
        html=False)).summary
    found = {name: entry["count"] for name, entry in summary["classes"].items()
             if entry["count"] and name not in ("unseen", "recovered", "indeterminate",
                                                "unguarded")}
    assert found == {}, found
    assert summary["anomalies"] == 0
