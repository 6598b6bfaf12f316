"""The batch deliver path (``Guard.open_deliveries`` / ``finish_deliveries``) against the
one-message path (``open_delivery`` / ``finish_delivery``) on the same inputs.

Both runs get fresh, byte-identical deliveries in the same reads: first deliveries, two
copies of one send in one read (the second suppressed as in flight), a copy of a send
that is handled once the first copy was settled by a verdict in the same read (expired
copy, then a live one), redeliveries (counted in the store, dead-lettered past
max-delivery-attempts), a repeat of an already handled send (suppressed), the same
message twice in one read, unguarded messages, handler failures (NACK and redelivery),
expired messages with and without an expiry address. What must match: the verdicts
(which deliveries reach the application), the broker-side outcome (acks, nacks, moved
copies), every event per message (all fields but times and the moved copies' random
ids), and the store's state (delivery counts; the shared consumer audit's marks), on the
memory store and on a real Redis.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from mqguard import hookimpl
from mqguard.adapter import Delivery
from mqguard.config import parse_config
from mqguard.context import HookContext
from mqguard.errors import Nack
from mqguard.message import PRIOR_DELIVERIES_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import Verdict

QUEUE = "orders"
OTHER = "audit.in"  # no expiry address: expired messages are dropped
PAST = 1_000  # an expiration long gone (epoch ms)
NOW = re.compile(r"\(now \d+\)")  # the clock in an expiry reason

# Reads of deliveries: (message id, producer, sequence, expired, redelivered, queue,
# handler error, extra headers). The same scenario runs one message at a time and in
# batches.
Spec = tuple[str, str | None, int | None, bool, bool, str, bool, dict[str, str]]

READS: list[list[Spec]] = [
    [  # first deliveries, two copies of one send, the same message twice
        ("p1.1", "p1", 1, False, False, QUEUE, False, {}),
        ("p1.2", "p1", 2, False, False, QUEUE, False, {}),
        ("retry-of-p1.2", "p1", 2, False, False, QUEUE, False, {}),  # in flight: suppressed
        ("p1.3", "p1", 3, False, False, QUEUE, True, {}),  # handler fails: NACK
        ("p1.4", "p1", 4, False, False, OTHER, False, {}),
        ("p1.4", "p1", 4, False, True, OTHER, False, {}),  # same message again, redelivered
        ("", None, None, False, False, QUEUE, False, {}),  # unguarded: stand-in id
    ],
    [  # a copy settled by delivery counting's verdict, then another copy of the send: the
        # consumer audit held the first, and only its settlement lets the second through
        ("p4.1", "p4", 1, False, True, QUEUE, False, {PRIOR_DELIVERIES_HEADER: "5"}),  # DLA
        ("retry-of-p4.1", "p4", 1, False, False, QUEUE, False, {}),
        ("p4.2", "p4", 2, False, True, OTHER, False, {PRIOR_DELIVERIES_HEADER: "5"}),  # drop
        ("retry-of-p4.2", "p4", 2, False, False, OTHER, False, {}),
    ],
    [  # an expired copy settled by its verdict, then a live copy of the same send
        ("p2.1", "p2", 1, True, False, QUEUE, False, {}),  # expired: moved to EXP
        ("retry-of-p2.1", "p2", 1, False, False, QUEUE, False, {}),
        ("p2.2", "p2", 2, True, False, OTHER, False, {}),  # expired, no address: dropped
        ("p2.3", "p2", 3, False, False, OTHER, False, {}),
        ("p1.1", "p1", 1, False, True, QUEUE, False, {}),  # handled before: suppressed
        ("p1.3", "p1", 3, False, True, QUEUE, True, {}),  # redelivered, fails again
    ],
    [  # past max-delivery-attempts, prior deliveries of a delayed copy, more redeliveries
        ("p1.3", "p1", 3, False, True, QUEUE, True, {}),  # fails a 3rd time: dead-lettered
        ("p3.1", "p3", 1, False, False, QUEUE, False, {PRIOR_DELIVERIES_HEADER: "1"}),
        ("p3.2", "p3", 2, False, True, QUEUE, False, {}),
        ("p3.3", "p3", 3, False, False, QUEUE, False, {}),
        ("p3.3", "p3", 3, False, True, QUEUE, False, {}),  # the same, not handled yet
        ("p3.4", "p3", 4, False, False, OTHER, True, {}),
        ("p3.5", "p3", 5, False, False, OTHER, False, {}),
    ],
]


def build(spec: Spec, number: int) -> tuple[Delivery, str, BaseException | None]:
    message_id, producer, sequence, expired, redelivered, queue, fails, extra = spec
    message = Message(queue, f"body {number}".encode(), dict(extra), message_id=message_id,
                      duplicate_id=f"dup-{message_id}" if message_id else None,
                      expiration=PAST if expired else 0, producer_id=producer,
                      sequence=sequence, broker_message_id=f"ID:broker-{number}")
    # The loopback adapter's ack token: what a NACK puts back on its queue.
    token = (Message(queue, message.body, message_id=message_id), int(redelivered))
    delivery = Delivery(message, "sub-1", token, redelivered=redelivered,
                        raw_headers={"message-id": f"ID:broker-{number}"})
    return delivery, queue, Nack("handler failed") if fails else None


def config(tmp: Path, store: str, shared: bool) -> dict[str, Any]:
    return {
        "mqguard": {"store": store, "node-id": "n1",
                    "event-log": {"directory": str(tmp), "flush-interval-ms": 20}},
        "address-settings": {
            QUEUE: {"dead-letter-address": "DLA", "expiry-address": "EXP",
                    "max-delivery-attempts": 3},
            OTHER: {"max-delivery-attempts": 3},
        },
        "plugins": {"consumer_audit": {"shared": shared}},
    }


def run(tmp: Path, store: str, *, shared: bool, batch: bool) -> dict[str, Any]:
    guard = Guard(parse_config(config(tmp, store, shared))).start()
    adapter = LoopbackAdapter()
    adapter.connect()
    handed: list[list[str]] = []
    number = 0
    try:
        for read in READS:
            items = []
            for spec in read:
                number += 1
                items.append(build(spec, number))
            deliveries = [delivery for delivery, _, _ in items]
            if batch:
                contexts = guard.open_deliveries(adapter, deliveries,
                                                 [queue for _, queue, _ in items])
            else:
                contexts = [guard.open_delivery(adapter, delivery, queue=queue)
                            for delivery, queue, _ in items]
            handed.append([plain(delivery.message.message_id) if ctx is not None else "-"
                           for delivery, ctx in zip(deliveries, contexts, strict=True)])
            finished = [(delivery, ctx, error) for (delivery, _, error), ctx
                        in zip(items, contexts, strict=True) if ctx is not None]
            if batch:
                guard.finish_deliveries(adapter, finished)
            else:
                for delivery, ctx, error in finished:
                    guard.finish_delivery(adapter, delivery, ctx, error)
        guard.events.flush()
        return {
            "handed": handed,
            "acked": [plain(m.message_id) for m in adapter.acked],
            "nacked": [plain(m.message_id) for m in adapter.nacked],
            "moved": {address: sorted((m.headers.get("_AMQ_ORIG_MESSAGE_ID"), m.body)
                                      for m in adapter.loop.drain(address))
                      for address in ("DLA", "EXP")},
            "events": events_of(tmp),
            "store": store_state(guard, shared),
        }
    finally:
        guard.close()


def plain(message_id: str) -> str:
    """A stand-in id is unique per process and call: the same for both runs' comparison."""
    return "unguarded" if message_id.startswith("unguarded:") else message_id


def events_of(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """Every event, per message id in the order written, without times and random ids."""
    per_message: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            for key in ("ts", "delivered_ts", "new_message_id"):
                record.pop(key, None)
            if "reason" in record:
                record["reason"] = NOW.sub("(now ...)", record["reason"])
            message_id = record["message_id"] = plain(record.get("message_id", ""))
            per_message.setdefault(message_id, []).append(record)
    return per_message


def store_state(guard: Guard, shared: bool) -> dict[str, Any]:
    """Delivery counts (read by counting once more, on both runs alike) and audit marks."""
    counts = {}
    for read in READS:
        for message_id, _, _, _, _, queue, _, _ in read:
            if message_id and f"{queue}/{message_id}" not in counts:
                counts[f"{queue}/{message_id}"] = guard.store.delivery_count_incr(queue,
                                                                                  message_id)
    marks = {}
    if shared:
        for queue in (QUEUE, OTHER):
            for producer in ("p1", "p2", "p3", "p4"):
                marks[f"{queue}/{producer}"] = guard.store.audit_seen(queue, producer,
                                                                      list(range(1, 6)))
    return {"counts": counts, "marks": marks}


STORES = [pytest.param("memory", False, id="memory"),
          pytest.param("memory", True, id="memory-shared-audit"),
          pytest.param("redis", True, id="redis-shared-audit", marks=pytest.mark.redis)]


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("mqguard_redis_url") if request.param == "redis" else "memory"


@pytest.mark.parametrize(("store_url", "shared"), STORES, indirect=["store_url"])
def test_batches_decide_as_one_message_at_a_time(tmp_path: Path, store_url: str,
                                                 shared: bool, request: pytest.FixtureRequest
                                                 ) -> None:
    single = run(tmp_path / "single", store_url, shared=shared, batch=False)
    if store_url != "memory":
        store_url = request.getfixturevalue("mqguard_redis_url")  # flushed again
        import redis

        client = redis.Redis.from_url(store_url)
        try:
            client.flushall()
        finally:
            client.close()
    batched = run(tmp_path / "batch", store_url, shared=shared, batch=True)
    # The scenario does what it says (so that the comparison below means something).
    first, settled, second, third = single["handed"]
    assert first == ["p1.1", "p1.2", "-", "p1.3", "p1.4", "p1.4", "unguarded"]
    assert settled == ["-", "retry-of-p4.1", "-", "retry-of-p4.2"]
    assert second == ["-", "retry-of-p2.1", "-", "p2.3", "-", "p1.3"]
    assert third == ["p1.3", "p3.1", "p3.2", "p3.3", "p3.3", "p3.4", "p3.5"]
    assert single["moved"]["DLA"] == [("p1.3", b"body 18"), ("p4.1", b"body 8")]
    assert single["moved"]["EXP"] == [("p2.1", b"body 12")]
    assert "p1.3" in single["nacked"]
    assert [e["type"] for e in single["events"]["retry-of-p1.2"]] == [
        "duplicate_delivery_suppressed", "acked"]
    assert single["store"]["counts"]["orders/p1.3"] == 4  # 3 deliveries, then the read
    # ... and the batches do the same.
    for key in single:
        assert batched[key] == single[key], key


class Recording:
    """A plugin with the per-message hooks only: its presence makes the guard decide one
    message at a time (it may rely on any order), and it sees every message."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def before_deliver(self, message: Message, ctx: HookContext) -> Verdict | None:
        self.seen.append(message.message_id)
        return Verdict.drop("odd") if message.sequence and message.sequence % 2 else None


def test_a_plugin_without_batch_twin_is_asked_per_message(tmp_path: Path) -> None:
    guard = Guard(parse_config(config(tmp_path, "memory", False))).start()
    plugin = Recording()
    guard.plugins.register(plugin)
    adapter = LoopbackAdapter()
    adapter.connect()
    try:
        items = [build((f"p9.{n}", "p9", n, False, False, QUEUE, False, {}), n)
                 for n in range(1, 5)]
        contexts = guard.open_deliveries(adapter, [d for d, _, _ in items], [QUEUE] * 4)
        assert plugin.seen == ["p9.1", "p9.2", "p9.3", "p9.4"]
        assert [ctx is not None for ctx in contexts] == [False, True, False, True]
        assert [m.message_id for m in adapter.acked] == ["p9.1", "p9.3"]
    finally:
        guard.close()

