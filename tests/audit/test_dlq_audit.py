"""The audit reads ``mqguard dlq retry`` as one message with a second life: the retried
copy is neither unexpected, nor duplicated, nor over max-delivery-attempts, and must
reach a fate like any sent message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mqguard.audit.checks import CheckOptions
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.config import parse_config

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
