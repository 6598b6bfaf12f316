"""Pipeline logic on the in-process loopback broker (pure logic; real brokers elsewhere)."""

from __future__ import annotations

import pytest

from mqguard import hookimpl
from mqguard.consumer import GuardedConsumer
from mqguard.context import HookContext
from mqguard.errors import MessageRejected, Nack, TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import ORIG_ADDRESS_HEADER, ORIG_MESSAGE_ID_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import AckReason, Verdict


def events(guard: Guard) -> list[dict]:
    guard.events.flush()
    return list(read_events(guard.events.directory))


def test_send_stamps_id_producer_and_sequence(guard: Guard, adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard, producer_id="p1")
    first = producer.send("q", b"a")
    second = producer.send("q", b"b")
    assert first.sent and first.message.message_id
    assert (first.message.sequence, second.message.sequence) == (1, 2)
    queued = adapter.loop.drain("q")
    assert [m.producer_id for m in queued] == ["p1", "p1"]
    assert [m.message_id for m in queued] == [first.message.message_id, second.message.message_id]
    assert [e["type"] for e in events(guard)] == ["sent", "sent"]


def test_reject_raises_and_nothing_is_sent(guard: Guard, adapter: LoopbackAdapter) -> None:
    class Refuse:
        @hookimpl
        def before_send(self, message: Message) -> Verdict | None:
            return Verdict.reject("no thanks") if message.body == b"bad" else None

    guard.plugins.register(Refuse())
    producer = GuardedProducer(adapter, guard)
    with pytest.raises(MessageRejected, match="no thanks"):
        producer.send("q", b"bad")
    assert adapter.loop.depth("q") == 0
    assert [e["type"] for e in events(guard)] == ["rejected"]


def test_drop_succeeds_for_the_caller(guard: Guard, adapter: LoopbackAdapter) -> None:
    class Drop:
        @hookimpl
        def before_send(self) -> Verdict:
            return Verdict.drop("dup", event="duplicate_rejected")

    guard.plugins.register(Drop())
    result = GuardedProducer(adapter, guard).send("q", b"x")
    assert not result.sent
    assert adapter.loop.depth("q") == 0
    (event,) = events(guard)
    assert event["type"] == "duplicate_rejected" and event["reason"] == "dup"


def test_transaction_commit_and_rollback_only(guard: Guard, adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard)
    with producer.transaction() as tx:
        producer.send("q", b"1", transaction=tx)
        assert adapter.loop.depth("q") == 0  # held until COMMIT
    assert adapter.loop.depth("q") == 1

    class RejectTwo:
        @hookimpl
        def before_send(self, message: Message) -> Verdict | None:
            return Verdict.reject("bad two") if message.body == b"2" else None

    guard.plugins.register(RejectTwo())
    with pytest.raises(TransactionRolledBack, match="bad two"), producer.transaction() as tx:
        producer.send("q", b"ok", transaction=tx)  # does not raise inside a transaction
        producer.send("q", b"2", transaction=tx)
    assert adapter.loop.depth("q") == 1  # nothing of the failed transaction arrived
    types = [e["type"] for e in events(guard)]
    assert types.count("tx_committed") == 1 and types.count("tx_rolled_back") == 1


def test_consumer_acks_on_success_and_nacks_on_failure(guard: Guard,
                                                       adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard)
    producer.send("q", b"ok")
    producer.send("q", b"fail")
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)
        if message.body == b"fail" and message.delivery_count == 1:
            raise Nack("try again")

    with GuardedConsumer(adapter, "q", handler, guard):
        assert adapter.pump() == 3  # ok, fail, fail again (requeued by the NACK)
    assert seen == [b"ok", b"fail", b"fail"]
    assert [m.body for m in adapter.acked] == [b"ok", b"fail"]
    assert [m.body for m in adapter.nacked] == [b"fail"]
    kinds = [e["type"] for e in events(guard) if e["type"] != "sent"]
    assert kinds == ["delivered", "acked", "delivered", "handler_failed",
                     "redelivery_scheduled", "nacked", "delivered", "acked"]


def test_move_verdict_copies_with_orig_headers(guard: Guard, adapter: LoopbackAdapter) -> None:
    class DeadLetterAll:
        @hookimpl
        def before_deliver(self, ctx: HookContext) -> Verdict:
            assert ctx.settings.dead_letter_address == "DLA"
            return Verdict.move("DLA", "poison", event="dead_lettered")

    guard.plugins.register(DeadLetterAll())
    sent = GuardedProducer(adapter, guard).send("moved.x", b"p").message
    handled: list[Message] = []
    with GuardedConsumer(adapter, "moved.x", handled.append, guard):
        adapter.pump()
    assert handled == []
    (copy,) = adapter.loop.drain("DLA")
    assert copy.headers[ORIG_ADDRESS_HEADER] == "moved.x"
    assert copy.headers[ORIG_MESSAGE_ID_HEADER] == sent.message_id
    assert copy.message_id != sent.message_id
    kinds = [e["type"] for e in events(guard)]
    assert kinds == ["sent", "moved", "dead_lettered", "acked"]
    assert events(guard)[-1]["ack_reason"] == AckReason.KILLED.value


def test_broken_plugin_leaves_message_unacked(guard: Guard, adapter: LoopbackAdapter) -> None:
    class Broken:
        @hookimpl
        def before_deliver(self) -> None:
            raise RuntimeError("plugin bug")

    guard.plugins.register(Broken())
    GuardedProducer(adapter, guard).send("q", b"x")
    with GuardedConsumer(adapter, "q", lambda m: None, guard):
        adapter.pump()
    assert adapter.acked == [] and adapter.nacked == []


def test_send_failure_is_recorded_and_raised(guard: Guard, adapter: LoopbackAdapter) -> None:
    adapter.fail_sends = True
    with pytest.raises(Exception, match="fail_sends"):
        GuardedProducer(adapter, guard).send("q", b"x")
    assert [e["type"] for e in events(guard)] == ["send_failed"]


def test_disabled_plugin_is_not_registered(tmp_path) -> None:
    from mqguard.config import parse_config
    from mqguard.errors import ConfigError

    cfg = parse_config({"mqguard": {"disabled-plugins": ["logging"],
                                    "event-log": {"enabled": False}}})
    with Guard(cfg) as g:
        assert g.plugins.get_plugin("logging") is None
        assert g.plugins.is_blocked("logging")
    with pytest.raises(ConfigError, match="unknown plugin"):
        Guard(parse_config({"mqguard": {"disabled-plugins": ["nope"]}}))


def test_batch_ids_are_unique_and_differ_in_a_forked_child() -> None:
    import base64
    import multiprocessing

    from mqguard.message import ID_BYTES, ID_LENGTH
    from mqguard.pipeline import _stamp_ids

    def stamp(count: int) -> list[str]:
        messages = [Message("q") for _ in range(count)]
        _stamp_ids(messages)
        return [message.message_id for message in messages]

    ids = stamp(1000)
    assert len(set(ids)) == 1000
    # 120 bits as URL-safe base64: 20 characters, every one of them a valid digit.
    assert all(len(i) == ID_LENGTH and len(base64.urlsafe_b64decode(i)) == ID_BYTES
               for i in ids)
    # A child forked now would draw the parent's next ids without the reseed at fork.
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()
    child = context.Process(target=lambda: child_end.send(stamp(10)))
    child.start()
    child_ids = parent_end.recv()
    child.join(10)
    assert set(child_ids).isdisjoint(stamp(10))
