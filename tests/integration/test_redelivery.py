"""Delivery counting, redelivery and dead letters through REAL brokers.

ActiveMQ 5 (STOMP: broker-delay through its scheduler, copy then ack), RabbitMQ
(STOMP: NACK / held NACK; classic and quorum queues) and Mosquitto (MQTT 5: held local
redelivery).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.adapter import SubscribeOptions
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
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

BROKERS = [
    pytest.param(("activemq", "stomp", False), marks=pytest.mark.activemq, id="activemq"),
    pytest.param(("rabbitmq", "stomp", False), marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param(("rabbitmq", "stomp", True), marks=pytest.mark.rabbitmq, id="rabbitmq-quorum"),
    pytest.param(("mosquitto", "mqtt", False), marks=pytest.mark.mosquitto, id="mosquitto"),
]


class Broker:
    def __init__(self, url: str, kind: str, quorum: bool) -> None:
        self.url, self.kind, self.quorum = url, kind, quorum

    def send_address(self, address: str) -> str:
        # A SEND to /queue/X re-declares X as a classic queue (PRECONDITION_FAILED on a
        # quorum queue); /amq/queue/X sends to the existing queue as it is.
        return f"/amq/queue/{address}" if self.quorum else address

    def options(self) -> SubscribeOptions:
        headers = {"x-queue-type": "quorum", "durable": "true", "auto-delete": "false"}
        return SubscribeOptions(headers=headers) if self.quorum else SubscribeOptions()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Broker:
    kind, scheme, quorum = request.param
    return Broker(request.getfixturevalue(f"mqguard_{kind}_server").urls[scheme], kind, quorum)


def make_guard(tmp_path: Path, address: str, name: str = "events", store: str = "memory",
               **settings: Any) -> Guard:
    config = parse_config({
        "mqguard": {"store": store, "node-id": name,
                    "event-log": {"directory": str(tmp_path / name), "flush-interval-ms": 20}},
        "address-settings": {address: {"dead-letter-address": f"{address}.DLA", **settings}},
    })
    return Guard(config).start()


def events(guard: Guard) -> list[dict[str, Any]]:
    guard.events.flush()
    return list(read_events(guard.config.core.event_log.directory))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Recorder:
    """A handler that records (monotonic time, delivery count) and fails while told to."""

    def __init__(self, fail_first: int | None = None) -> None:
        self.calls: list[tuple[float, int, str]] = []
        self.fail_first = fail_first  # None: always fail
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls.append((time.monotonic(), message.delivery_count, message.message_id))
            n = len(self.calls)
        if self.fail_first is None or n <= self.fail_first:
            raise Nack(f"attempt {n} fails")


@pytest.fixture
def dla_inbox(broker: Broker, mqguard_unique_name: str) -> Iterator[list[Message]]:
    """Consumes the dead-letter address (subscribed first: MQTT keeps nothing otherwise)."""
    got: list[Message] = []
    with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as guard, \
            GuardedConsumer(open_adapter(broker.url), f"{mqguard_unique_name}.DLA", got.append,
                            guard):
        yield got


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_poison_reaches_the_dla_after_exactly_max_attempts(
        broker: Broker, dla_inbox: list[Message], tmp_path: Path, mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name, **{"max-delivery-attempts": 3})
    recorder = Recorder()
    with GuardedConsumer(open_adapter(broker.url), mqguard_unique_name, recorder, guard,
                         options=broker.options()):
        # Subscribed first: it declares the (quorum) queue, and MQTT keeps nothing otherwise.
        with GuardedProducer(open_adapter(broker.url), guard) as producer:
            sent = producer.send(broker.send_address(mqguard_unique_name), b"poison",
                                 headers={"app": "kept"}).message
        wait_until(lambda: len(dla_inbox) >= 1, 30, "the dead letter")
        time.sleep(0.5)  # nothing more may arrive
    assert [count for _, count, _ in recorder.calls] == [1, 2, 3]
    assert len(dla_inbox) == 1
    dead = dla_inbox[0]
    assert dead.body == b"poison" and dead.headers["app"] == "kept"
    assert dead.headers[ORIG_ADDRESS_HEADER] == mqguard_unique_name
    assert dead.headers[ORIG_QUEUE_HEADER] == mqguard_unique_name
    assert dead.headers[ORIG_MESSAGE_ID_HEADER] == sent.message_id
    assert "max-delivery-attempts (3)" in dead.headers[MOVE_REASON_HEADER]
    assert "attempt 3 fails" in dead.headers[MOVE_REASON_HEADER]
    assert dead.message_id != sent.message_id
    delivered = [e for e in events(guard) if e["type"] == "delivered"]
    assert [e["delivery_count"] for e in delivered] == [1, 2, 3]
    if broker.quorum:
        # The broker's own count (x-delivery-count + 1) and mqguard's agree.
        assert [e["native_delivery_count"] for e in delivered] == [1, 2, 3]
    kinds = [e["type"] for e in events(guard)]
    assert kinds.count("dead_lettered") == 1 and kinds.count("redelivery_scheduled") == 2
    guard.close()


DELAY_MS, MULTIPLIER = 300, 2


@pytest.mark.parametrize("broker", [b for b in BROKERS if b.id != "rabbitmq-quorum"],
                         indirect=True)
def test_redelivery_delays_follow_the_policy(broker: Broker, dla_inbox: list[Message],
                                            tmp_path: Path, mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name, **{
        "max-delivery-attempts": 4, "redelivery-delay": DELAY_MS,
        "redelivery-delay-multiplier": MULTIPLIER})
    recorder = Recorder()
    with GuardedConsumer(open_adapter(broker.url), mqguard_unique_name, recorder, guard):
        with GuardedProducer(open_adapter(broker.url), guard) as producer:
            producer.send(mqguard_unique_name, b"slow poison")
        wait_until(lambda: len(dla_inbox) >= 1, 30, "the dead letter")
    times = [t for t, _, _ in recorder.calls]
    gaps = [round((b - a) * 1000) for a, b in itertools.pairwise(times)]
    expected = [DELAY_MS * MULTIPLIER ** n for n in range(3)]  # 300, 600, 1200
    print(f"{broker.kind} redelivery gaps ms: measured {gaps}, policy {expected}")
    assert len(gaps) == 3
    # Early is a bug; late is bounded by a loaded 2-core box and the broker's timer. ActiveMQ's
    # job scheduler works in whole-second ticks: measured +200..+520 ms, up to +1 s possible.
    late = 1000 if broker.kind == "activemq" else 300
    for gap, want in zip(gaps, expected, strict=True):
        assert want - 25 <= gap <= want + late, (gaps, expected)
    guard.close()


@pytest.mark.parametrize("broker", BROKERS[:2] + BROKERS[3:], indirect=True)
def test_unlimited_attempts_never_dead_letter(broker: Broker, dla_inbox: list[Message],
                                              tmp_path: Path, mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name, **{"max-delivery-attempts": -1})
    recorder = Recorder(fail_first=14)
    with GuardedConsumer(open_adapter(broker.url), mqguard_unique_name, recorder, guard):
        with GuardedProducer(open_adapter(broker.url), guard) as producer:
            producer.send(mqguard_unique_name, b"stubborn")
        wait_until(lambda: len(recorder.calls) >= 15, 30, "15 deliveries")
        time.sleep(0.5)
    assert [count for _, count, _ in recorder.calls] == list(range(1, 16))
    assert dla_inbox == []
    acked = [e for e in events(guard) if e["type"] == "acked"]
    assert [e["ack_reason"] for e in acked] == ["normal"]
    guard.close()
