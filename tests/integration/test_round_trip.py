"""Guarded round trips through REAL brokers: send -> deliver -> ack, every event checked."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter

BROKERS = [
    pytest.param(("activemq", "stomp"), marks=pytest.mark.activemq, id="activemq-stomp"),
    pytest.param(("rabbitmq", "stomp"), marks=pytest.mark.rabbitmq, id="rabbitmq-stomp"),
    pytest.param(("mosquitto", "mqtt"), marks=pytest.mark.mosquitto, id="mosquitto-mqtt5"),
]


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    kind, scheme = request.param
    handle = request.getfixturevalue(f"{kind}_server")
    return handle.urls[scheme]


def make_guard(tmp_path: Path, store: str = "memory") -> Guard:
    config = parse_config({"mqguard": {"store": store, "node-id": "round-trip",
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
                                    unique_name: str) -> None:
    count = 25
    collector = Collector(count)
    with GuardedConsumer(open_adapter(broker_url), unique_name, collector, guard) as consumer:
        with GuardedProducer(open_adapter(broker_url), guard, producer_id="p-1") as producer:
            sent = [producer.send(unique_name, f"body-{i}".encode() + b"\x00\xff",
                                  headers={"app-header": f"v{i}"}).message
                    for i in range(count - 5)]
            batch = [producer.message(unique_name, f"batch-{i}".encode()) for i in range(5)]
            producer.send_batch(batch)
            sent += batch
        assert collector.done.wait(20), f"got {len(collector.messages)} of {count}"
        time.sleep(0.3)  # let the last acks reach the broker before the consumer leaves
        assert consumer.queue == unique_name
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
        assert acked["ack_reason"] == "normal" and acked["queue"] == unique_name
    totals = Counter(e["type"] for e in read_events(tmp_path / "events"))
    assert totals == {"sent": count, "delivered": count, "acked": count}


@pytest.mark.parametrize("broker_url", BROKERS[:2], indirect=True)
def test_transaction_round_trip(broker_url: str, guard: Guard, tmp_path: Path,
                                unique_name: str) -> None:
    collector = Collector(3)
    with GuardedConsumer(open_adapter(broker_url), unique_name, collector, guard):
        with GuardedProducer(open_adapter(broker_url), guard) as producer:
            with producer.transaction() as tx:
                for i in range(3):
                    producer.send(unique_name, f"tx-{i}".encode(), transaction=tx)
            with pytest.raises(RuntimeError), producer.transaction() as tx:
                producer.send(unique_name, b"aborted", transaction=tx)
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
def test_round_trip_with_redis_store(activemq_server: Any, redis_url: str, tmp_path: Path,
                                     unique_name: str) -> None:
    url = activemq_server.urls["stomp"]
    collector = Collector(10)
    with make_guard(tmp_path, store=redis_url) as guard:
        assert type(guard.store).__name__ == "RedisStore"
        with GuardedConsumer(open_adapter(url), unique_name, collector, guard), \
                GuardedProducer(open_adapter(url), guard) as producer:
            for i in range(10):
                producer.send(unique_name, str(i).encode())
            assert collector.done.wait(20)
            time.sleep(0.2)
    assert sorted(int(m.body) for m in collector.messages) == list(range(10))
    totals = Counter(e["type"] for e in read_events(tmp_path / "events"))
    assert totals == {"sent": 10, "delivered": 10, "acked": 10}


@pytest.mark.parametrize("broker_url", BROKERS[:2], indirect=True)
def test_handler_failure_without_plugins_loses_nothing(broker_url: str, guard: Guard,
                                                      tmp_path: Path, unique_name: str) -> None:
    """No redelivery plugin: RabbitMQ gets a requeueing NACK; ActiveMQ (NACK = poison ack to
    ActiveMQ.DLQ) gets none, the message stays unacknowledged and comes back on reconnect."""
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
