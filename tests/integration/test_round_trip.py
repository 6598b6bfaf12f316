"""Guarded round trips through REAL brokers: send -> deliver -> ack, every event checked."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.brokers import BROKERS, broker_of

import mqguard
from mqguard.adapter import Delivery, SubscribeOptions
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.context import HookContext
from mqguard.events import read_events
from mqguard.message import (
    MOVE_REASON_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    Message,
)
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.verdict import Verdict


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    return broker_of(request)[1]


def make_guard(tmp_path: Path, store: str = "memory", disabled: tuple[str, ...] = ()) -> Guard:
    config = parse_config({"mqguard": {"store": store, "node-id": "round-trip",
                                       "disabled-plugins": list(disabled),
                                       "event-log": {"directory": str(tmp_path / "events"),
                                                     "flush-interval-ms": 20}}})
    return Guard(config)


class Collector:
    def __init__(self, expected: int) -> None:
        self.messages: list[Message] = []
        self.expected = expected
        self.done = threading.Event()

    def __call__(self, message: Message) -> None:
        self.messages.append(message)
        if len(self.messages) >= self.expected:
            self.done.set()


def events_by_message(directory: Path) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read_events(directory):
        if "message_id" in event:
            grouped[event["message_id"]].append(event)
    return grouped


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    with make_guard(tmp_path) as g:
        yield g


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_round_trip_events_complete(broker_url: str, guard: Guard, tmp_path: Path,
                                    mqguard_unique_name: str) -> None:
    count = 25
    collector = Collector(count)
    with GuardedConsumer(open_adapter(broker_url), mqguard_unique_name, collector,
                         guard) as consumer:
        with GuardedProducer(open_adapter(broker_url), guard, producer_id="p-1") as producer:
            sent = [producer.send(mqguard_unique_name, f"body-{i}".encode() + b"\x00\xff",
                                  headers={"app-header": f"v{i}"}).message
                    for i in range(count - 5)]
            batch = [producer.message(mqguard_unique_name, f"batch-{i}".encode()) for i in range(5)]
            producer.send_batch(batch)
            sent += batch
        assert collector.done.wait(20), f"got {len(collector.messages)} of {count}"
        time.sleep(0.3)  # let the last acks reach the broker before the consumer leaves
        assert consumer.queue == mqguard_unique_name
    guard.events.flush()

    by_id = {m.message_id: m for m in collector.messages}
    assert set(by_id) == {m.message_id for m in sent}, "message ids not stable end to end"
    for original in sent:
        got = by_id[original.message_id]
        assert got.body == original.body
        assert got.headers.get("app-header") == original.headers.get("app-header")
        assert (got.producer_id, got.sequence) == ("p-1", original.sequence)
        assert got.delivery_count == 1

    grouped = events_by_message(tmp_path / "events")
    for original in sent:
        kinds = [e["type"] for e in grouped[original.message_id]]
        # "sent" is written when the broker's receipt arrives, which may be after the
        # consumer already got the message: only the deliver path has a fixed order.
        assert sorted(kinds) == ["acked", "delivered", "sent"], (original.message_id, kinds)
        assert kinds.index("delivered") < kinds.index("acked")
        acked = next(e for e in grouped[original.message_id] if e["type"] == "acked")
        assert acked["ack_reason"] == "normal" and acked["queue"] == mqguard_unique_name
    totals = Counter(e["type"] for e in read_events(tmp_path / "events"))
    assert totals == {"sent": count, "delivered": count, "acked": count}


@pytest.mark.parametrize("broker_url", BROKERS[:2], indirect=True)
def test_transaction_round_trip(broker_url: str, guard: Guard, tmp_path: Path,
                                mqguard_unique_name: str) -> None:
    collector = Collector(3)
    with GuardedConsumer(open_adapter(broker_url), mqguard_unique_name, collector, guard):
        with GuardedProducer(open_adapter(broker_url), guard) as producer:
            with producer.transaction() as tx:
                for i in range(3):
                    producer.send(mqguard_unique_name, f"tx-{i}".encode(), transaction=tx)
            with pytest.raises(RuntimeError), producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"aborted", transaction=tx)
                raise RuntimeError("application failure inside the transaction")
        assert collector.done.wait(20)
        time.sleep(1.0)  # an aborted message would have arrived by now
    assert sorted(m.body for m in collector.messages) == [b"tx-0", b"tx-1", b"tx-2"]
    guard.events.flush()
    totals = Counter(e["type"] for e in read_events(tmp_path / "events"))
    assert totals["tx_committed"] == 1 and totals["tx_rolled_back"] == 1
    assert totals["sent"] == 3 and totals["acked"] == 3


@pytest.mark.redis
@pytest.mark.activemq
def test_round_trip_with_redis_store(mqguard_activemq_server: Any, mqguard_redis_url: str,
                                     tmp_path: Path,
                                     mqguard_unique_name: str) -> None:
    url = mqguard_activemq_server.urls["stomp"]
    collector = Collector(10)
    with make_guard(tmp_path, store=mqguard_redis_url) as guard:
        assert type(guard.store).__name__ == "RedisStore"
        with GuardedConsumer(open_adapter(url), mqguard_unique_name, collector, guard), \
                GuardedProducer(open_adapter(url), guard) as producer:
            for i in range(10):
                producer.send(mqguard_unique_name, str(i).encode())
            assert collector.done.wait(20)
            time.sleep(0.2)
    assert sorted(int(m.body) for m in collector.messages) == list(range(10))
    totals = Counter(e["type"] for e in read_events(tmp_path / "events"))
    assert totals == {"sent": 10, "delivered": 10, "acked": 10}


@pytest.mark.parametrize("broker_url", BROKERS[:2], indirect=True)
def test_handler_failure_without_plugins_loses_nothing(broker_url: str, tmp_path: Path,
                                                      mqguard_unique_name: str) -> None:
    """No redelivery plugin: RabbitMQ gets a requeueing NACK; ActiveMQ (NACK = poison ack to
    ActiveMQ.DLQ) gets none, the message stays unacknowledged and comes back on reconnect."""
    with make_guard(tmp_path, disabled=("delivery_counting",)) as guard:
        _handler_failure_without_plugins(broker_url, guard, tmp_path, mqguard_unique_name)


def _handler_failure_without_plugins(broker_url: str, guard: Guard, tmp_path: Path,
                                     unique_name: str) -> None:
    failures: list[Message] = []

    def fail(message: Message) -> None:
        failures.append(message)
        raise RuntimeError("handler failure")

    with GuardedProducer(open_adapter(broker_url), guard) as producer:
        sent = producer.send(unique_name, b"precious").message
    with GuardedConsumer(open_adapter(broker_url), unique_name, fail, guard):
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
    assert failures and failures[0].message_id == sent.message_id
    collector = Collector(1)
    with GuardedConsumer(open_adapter(broker_url), unique_name, collector, guard):
        assert collector.done.wait(15), "the failed message was lost"
        time.sleep(0.2)
    assert collector.messages[0].message_id == sent.message_id
    assert collector.messages[0].delivery_count >= 2
    guard.events.flush()
    nacked = [e for e in read_events(tmp_path / "events") if e["type"] == "nacked"]
    probe = open_adapter(broker_url)
    probe.connect()
    requeues = probe.capabilities.nack_requeue
    probe.close()
    assert requeues is (probe.broker == "rabbitmq")
    assert nacked and all(e["requeue"] is requeues for e in nacked)


class MoveEverything:
    """Dead-letters every delivery from ``before_deliver``; records where the moves ran."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.move_threads: list[str] = []

    @mqguard.hookimpl
    def before_deliver(self, message: Message) -> Verdict:
        return Verdict.move(self.target, "test")

    @mqguard.hookimpl
    def message_moved(self, original: Message, ctx: HookContext) -> None:
        self.move_threads.append(threading.current_thread().name)


class Deliveries:
    """A raw adapter callback that keeps what it got."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        with self.cond:
            self.deliveries.append(delivery)
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float) -> list[Delivery]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.deliveries) >= count, timeout)
            return list(self.deliveries)


def wait_for_events(guard: Guard, directory: Path, kind: str, count: int,
                    timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        guard.events.flush()
        found = [e for e in read_events(directory) if e["type"] == kind]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_move_verdict_in_the_delivery_callback(broker_url: str, guard: Guard, tmp_path: Path,
                                               mqguard_unique_name: str) -> None:
    """A MOVE decided on the adapter's delivery thread: the copy's send cannot wait there, so
    the guard defers move + ack to the adapter's dispatcher thread. The copy arrives with the
    ``_AMQ_ORIG_*`` headers and the original is acknowledged for good."""
    count = 3
    dla = f"{mqguard_unique_name}.dla"
    mover = MoveEverything(dla)
    guard.plugins.register(mover)
    mqtt = broker_url.startswith("mqtt")
    # MQTT: a stable client id and a persistent session, so that "not redelivered after a
    # reconnect" means something (a topic keeps nothing for absent subscribers).
    options: dict[str, Any] = {"client_id": f"mover-{uuid.uuid4().hex[:8]}"} if mqtt else {}

    dead = Deliveries()
    watcher = open_adapter(broker_url)
    watcher.connect()
    try:
        watcher.subscribe(dla, dead, SubscribeOptions(ack="auto"))
        handled: list[Message] = []
        with GuardedConsumer(open_adapter(broker_url, **options), mqguard_unique_name,
                             handled.append,
                             guard):
            with GuardedProducer(open_adapter(broker_url), guard) as producer:
                sent = [producer.send(mqguard_unique_name, f"poison-{i}".encode()).message
                        for i in range(count)]
            copies = dead.wait_for(count, 20)
            assert len(copies) == count, f"{len(copies)} of {count} copies arrived"
            acked = wait_for_events(guard, tmp_path / "events", "acked", count)
            assert len(acked) == count
        assert handled == []
    finally:
        watcher.close()
    assert mover.move_threads and all("dispatcher" in name for name in mover.move_threads), \
        mover.move_threads

    by_original = {d.message.headers[ORIG_MESSAGE_ID_HEADER]: d.message for d in copies}
    assert set(by_original) == {m.message_id for m in sent}
    for original in sent:
        copy = by_original[original.message_id]
        assert copy.address == dla
        assert copy.body == original.body
        assert copy.headers[ORIG_ADDRESS_HEADER] == mqguard_unique_name
        assert copy.headers[ORIG_QUEUE_HEADER] == mqguard_unique_name
        assert copy.headers[MOVE_REASON_HEADER] == "test"
        assert copy.message_id and copy.message_id != original.message_id

    guard.events.flush()
    grouped = events_by_message(tmp_path / "events")
    for original in sent:
        events = grouped[original.message_id]
        kinds = [e["type"] for e in events]
        # "sent" is written when the broker confirmed the send, which may come after the
        # consumer got it; the deliver path itself is ordered: moved, then acked.
        assert sorted(kinds) == ["acked", "moved", "sent"], kinds
        assert [k for k in kinds if k != "sent"] == ["moved", "acked"], kinds
        moved = next(e for e in events if e["type"] == "moved")
        acked = next(e for e in events if e["type"] == "acked")
        assert moved["target"] == dla and moved["reason"] == "test"
        assert moved["new_message_id"] == by_original[original.message_id].message_id
        assert acked["ack_reason"] == "killed" and acked["queue"] == mqguard_unique_name

    # The originals were acknowledged: a new consumer (MQTT: the same session) gets nothing.
    again = Deliveries()
    probe = open_adapter(broker_url, **options)
    probe.connect()
    try:
        probe.subscribe(mqguard_unique_name, again)
        time.sleep(1.0)
    finally:
        probe.close()
    assert again.deliveries == [], [d.message.body for d in again.deliveries]
