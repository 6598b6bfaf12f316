"""consumer_audit plugin on the loopback adapter (failover on real brokers: tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mqguard_tests.consumer_audit import consume_a_duplicate, events, make_guard, send_twice

from mqguard.adapter import Delivery
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import ConfigError, Nack
from mqguard.message import MOVE_REASON_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.stores.memory import MemoryStore
from mqguard.testing.loopback import LoopbackAdapter


def test_duplicate_delivery_is_acked_without_the_handler(tmp_path: Path) -> None:
    guard, adapter, sent, handled = consume_a_duplicate(tmp_path)
    assert [m.message_id for m in handled] == [sent.message_id]
    assert len(adapter.acked) == 2
    kinds = [e for e in events(guard) if e["type"] == "duplicate_delivery_suppressed"]
    assert len(kinds) == 1 and kinds[0]["producer_id"] == sent.producer_id
    acks = [e["ack_reason"] for e in events(guard) if e["type"] == "acked"]
    assert acks == ["normal", "normal"]
    guard.close()


def test_poison_action_moves_the_duplicate_to_the_dla(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, action="poison")
    adapter = LoopbackAdapter()
    send_twice(adapter, guard)
    handled: list[Message] = []
    with GuardedConsumer(adapter, "q", handled.append, guard):
        adapter.pump()
    assert len(handled) == 1
    (dead,) = adapter.loop.drain("DLA")
    assert dead.headers[MOVE_REASON_HEADER].startswith(
        "Suppressing duplicate delivery on connection, consumer ")
    guard.close()


def test_log_action_delivers_anyway(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    guard = make_guard(tmp_path, action="log")
    adapter = LoopbackAdapter()
    send_twice(adapter, guard)
    handled: list[Message] = []
    with GuardedConsumer(adapter, "q", handled.append, guard):
        adapter.pump()
    assert len(handled) == 2
    assert [e["type"] for e in events(guard)].count("duplicate_delivery_logged") == 1
    assert "delivered anyway" in caplog.text
    guard.close()


def test_a_failed_delivery_is_not_marked(tmp_path: Path) -> None:
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    GuardedProducer(adapter, guard).send("q", b"flaky")
    attempts: list[int] = []

    def handler(message: Message) -> None:
        attempts.append(message.delivery_count)
        if len(attempts) == 1:
            raise Nack("first attempt fails")

    with GuardedConsumer(adapter, "q", handler, guard):
        adapter.pump()
    assert attempts == [1, 2]
    assert "duplicate_delivery_suppressed" not in [e["type"] for e in events(guard)]
    guard.close()


def test_unguarded_messages_are_not_audited(tmp_path: Path) -> None:
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    for _ in range(2):
        adapter.loop.enqueue(Message("q", b"same", message_id="m1"))
    handled: list[Message] = []
    with GuardedConsumer(adapter, "q", handled.append, guard):
        adapter.pump()
    assert len(handled) == 2
    guard.close()


def test_window_slides_like_activemq(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, window=4)
    adapter = LoopbackAdapter()
    producer = GuardedProducer(adapter, guard)
    first = producer.send("q", b"0").message
    for i in range(1, 6):
        producer.send("q", b"%d" % i)
    # Sequence 0 is older than the window of 4 once 5 was handled: no longer suppressed.
    adapter.loop.enqueue(Message.from_wire("q", first.body, first.wire_headers()), 1)
    handled: list[bytes] = []
    with GuardedConsumer(adapter, "q", lambda m: handled.append(m.body), guard):
        adapter.pump()
    assert handled == [b"0", b"1", b"2", b"3", b"4", b"5", b"0"]
    guard.close()


def test_shared_audit_covers_a_consumer_that_takes_over(tmp_path: Path) -> None:
    store = MemoryStore()
    crashed = make_guard(tmp_path, "a", store, shared=True)
    successor = make_guard(tmp_path, "b", store, shared=True)
    adapter = LoopbackAdapter()
    sent = send_twice(adapter, crashed)
    handled: list[str] = []
    consumer = GuardedConsumer(adapter, "q", lambda m: handled.append("crashed"), crashed)
    consumer.start()
    adapter.pump(limit=1)
    consumer.stop()
    with GuardedConsumer(adapter, "q", lambda m: handled.append("successor"), successor):
        adapter.pump()
    assert handled == ["crashed"]
    assert store.audit_seen("q", sent.producer_id or "", [sent.sequence or 0]) == [True]
    crashed.close()
    successor.close()


def test_options_are_validated() -> None:
    config = parse_config({"plugins": {"consumer_audit": {"action": "explode"}}}, "x.toml")
    with pytest.raises(ConfigError, match=r"plugins\.consumer_audit\.action = .explode."):
        Guard(config)


def test_a_copy_is_suppressed_while_another_copy_is_in_flight(tmp_path: Path) -> None:
    """Two copies of one message (a producer's send reached the broker, its retry too),
    both delivered before either was handled: the second is a duplicate."""
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    first = GuardedProducer(adapter, guard).message("q", b"twice")
    second = Message.from_wire("q", first.body, first.wire_headers())
    first.message_id, second.message_id = "copy-1", "copy-2"
    deliveries = [Delivery(Message.from_wire("q", m.body, m.wire_headers()), "s", str(n))
                  for n, m in enumerate((first, second))]
    ctx = guard.open_delivery(adapter, deliveries[0], queue="q")
    assert ctx is not None  # in flight: handed to the application, not yet settled
    assert guard.open_delivery(adapter, deliveries[1], queue="q") is None  # suppressed
    # The same copy redelivered (its consumer failed) is not a duplicate of itself.
    assert guard.open_delivery(adapter, deliveries[0], queue="q") is not None
    suppressed = [e for e in events(guard) if e["type"] == "duplicate_delivery_suppressed"]
    assert [e["message_id"] for e in suppressed] == ["copy-2"]
    guard.close()


def test_a_failed_copy_leaves_the_in_flight_table(tmp_path: Path) -> None:
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    message = GuardedProducer(adapter, guard).message("q", b"m")
    copies = []
    for n in range(2):
        copy = Message.from_wire("q", message.body, message.wire_headers())
        copy.message_id = f"copy-{n}"
        copies.append(Delivery(copy, "s", str(n)))
    ctx = guard.open_delivery(adapter, copies[0], queue="q")
    assert ctx is not None
    guard.finish_delivery(adapter, copies[0], ctx, RuntimeError("handler failed"))
    # Not marked (the handler failed) and no longer in flight: the other copy is handled.
    assert guard.open_delivery(adapter, copies[1], queue="q") is not None
    guard.close()
