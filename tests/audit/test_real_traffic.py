"""A clean run from REAL guarded traffic through a real ActiveMQ audits clean.

The traffic exercises every path the audit must not mistake for an anomaly:
duplicate ids rejected at send, a duplicate delivery at the broker suppressed by
the consumer audit, a committed and a rolled-back transaction, a poison message
redelivered up to max-delivery-attempts and dead-lettered, and its dead-letter
copy consumed by a guarded consumer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqguard.audit.checks import CheckOptions
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.events import read_events
from mqguard.message import Message, now_ms
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter

pytestmark = [pytest.mark.spark, pytest.mark.activemq]


class Handler:
    """Handles everything but the poison message, which always fails."""

    def __init__(self, expected: int) -> None:
        self.calls: Counter[str] = Counter()
        self.poison_attempts = 0
        self.expected = expected
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            if message.body == b"poison":
                self.poison_attempts += 1
                raise Nack("poison")
            self.calls[message.message_id] += 1
            if len(self.calls) >= self.expected:
                self.done.set()


def test_guarded_traffic_through_activemq_audits_clean(
        spark: Any, mqguard_activemq_server: Any, tmp_path: Path, mqguard_unique_name: str) -> None:
    url = mqguard_activemq_server.urls["stomp"]
    events = tmp_path / "events"
    dla = f"{mqguard_unique_name}.DLA"
    config = parse_config({
        "mqguard": {"node-id": "audit-real",
                    "event-log": {"directory": str(events), "flush-interval-ms": 20}},
        "address-settings": {mqguard_unique_name: {"max-delivery-attempts": 3,
                                           "dead-letter-address": dla}},
    })
    handler = Handler(expected=22)
    dead_letters: list[Message] = []
    with Guard(config) as guard:
        with GuardedConsumer(open_adapter(url), dla, dead_letters.append, guard), \
                GuardedConsumer(open_adapter(url), mqguard_unique_name, handler, guard), \
                GuardedProducer(open_adapter(url), guard, producer_id="audit-p") as producer:
            sent = [producer.send(mqguard_unique_name, f"m{i}", duplicate_id=f"d{i}").message
                    for i in range(20)]
            again = [producer.send(mqguard_unique_name, "again", duplicate_id=f"d{i}")
                     for i in range(3)]
            assert not any(result.sent for result in again)
            # The same message once more, past the guard: a duplicate at the broker.
            producer.adapter.send(sent[0])
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, "tx-1", transaction=tx)
                producer.send(mqguard_unique_name, "tx-2", transaction=tx)
            with pytest.raises(RuntimeError), producer.transaction() as tx:
                producer.send(mqguard_unique_name, "rolled-back", transaction=tx)
                raise RuntimeError("abort")
            producer.send(mqguard_unique_name, "poison")
            assert handler.done.wait(30), f"handled {len(handler.calls)} of 22"
            deadline = time.monotonic() + 30
            while not dead_letters and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the last acks reach the broker; nothing more may arrive
    assert len(dead_letters) == 1 and handler.poison_attempts == 3
    assert set(handler.calls.values()) == {1}, "a handler ran twice: the guard failed"
    kinds = Counter(e["type"] for e in read_events(events))
    assert kinds["duplicate_rejected"] == 3
    assert kinds["duplicate_delivery_suppressed"] == 1
    assert kinds["dead_lettered"] == 1 and kinds["tx_rolled_back"] == 1

    result = run_audit(spark, AuditOptions(
        [str(events)], out=str(tmp_path / "out"), config=config, watermark=now_ms(),
        checks=CheckOptions(assume_drained=True)))
    summary = result.summary
    found = {name: entry["by_address"] for name, entry in summary["classes"].items()
             if entry["count"]}
    assert found == {}, found
    assert result.exit_code == 0 and summary["ok"]
    # 23 accepted (20 + 2 in the transaction + poison), 3 rejected, 1 dead-letter copy.
    assert summary["addresses"][mqguard_unique_name]["sent"] == 23
    assert summary["addresses"][mqguard_unique_name]["with_fate"] == 23
    assert summary["addresses"][dla] == {"messages": 1, "sent": 0, "deliveries": 1,
                                         "with_fate": 1}
    assert summary["bad_lines"] == 0 and summary["events"] == sum(kinds.values())


@pytest.mark.redis
def test_guarded_traffic_with_redis_store_and_broker_log_audits_clean(
        spark: Any, mqguard_activemq_server: Any, mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """The same kind of traffic with the Redis store, small duplicate-ID rings (ids are
    evicted) and the broker's own log: --redis and --broker-log find nothing either."""
    from mqguard.audit.cross_checks import CrossInputs

    url = mqguard_activemq_server.urls["stomp"]
    events = tmp_path / "events"
    dla = f"{mqguard_unique_name}.DLA"
    config = parse_config({
        "mqguard": {"node-id": "audit-redis", "store": mqguard_redis_url,
                    "event-log": {"directory": str(events), "flush-interval-ms": 20}},
        "address-settings": {mqguard_unique_name: {"max-delivery-attempts": 3, "id-cache-size": 8,
                                           "dead-letter-address": dla}},
    })
    handler = Handler(expected=21)
    dead_letters: list[Message] = []
    with Guard(config) as guard:
        with GuardedConsumer(open_adapter(url), dla, dead_letters.append, guard), \
                GuardedConsumer(open_adapter(url), mqguard_unique_name, handler, guard), \
                GuardedProducer(open_adapter(url), guard, producer_id="audit-r") as producer:
            for i in range(20):
                producer.send(mqguard_unique_name, f"m{i}", duplicate_id=f"d{i}")
            # d17..d19 are among the last 8 ids: rejected. d0 was evicted: accepted again.
            again = [producer.send(mqguard_unique_name, "again", duplicate_id=f"d{i}")
                     for i in (17, 18, 19)]
            assert not any(result.sent for result in again)
            assert producer.send(mqguard_unique_name, "evicted", duplicate_id="d0").sent
            producer.send(mqguard_unique_name, "poison")
            assert handler.done.wait(30), f"handled {len(handler.calls)} of 21"
            deadline = time.monotonic() + 30
            while not dead_letters and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the last acks reach the broker; nothing more may arrive
    assert len(dead_letters) == 1 and handler.poison_attempts == 3
    kinds = Counter(e["type"] for e in read_events(events))
    assert kinds["duplicate_rejected"] == 3 and kinds["dead_lettered"] == 1

    result = run_audit(spark, AuditOptions(
        [str(events)], out=str(tmp_path / "out"), config=config, watermark=now_ms(),
        checks=CheckOptions(assume_drained=True),
        cross=CrossInputs(redis_url=mqguard_redis_url,
                          broker_logs=(str(mqguard_activemq_server.log_path),))))
    summary = result.summary
    found = {name: entry["by_address"] for name, entry in summary["classes"].items()
             if entry["count"]}
    assert found == {}, found
    assert result.exit_code == 0
    assert "ring_mismatch" in summary["classes"]  # the Redis checks ran
    assert summary["redis"]["rings"] >= 1 and summary["redis"]["ring_ids"] >= 8
    logs = summary["broker_logs"]
    assert [f["broker"] for f in logs["files"]] == ["activemq"]
    assert logs["files"][0]["parsed"] > 0 and logs["unknown_lines"] == 0
