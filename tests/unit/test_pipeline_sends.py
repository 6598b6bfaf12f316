"""The guard's two-phase send: ``Guard.decide_sends`` and ``Guard.settle_sends``.

Pure logic on the loopback adapter; duplicate-ID reservation against both stores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqguard import hookimpl
from mqguard.config import parse_config
from mqguard.context import HookContext
from mqguard.errors import AdapterError, TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard, SendDecision, SendResult, TransactionState
from mqguard.plugins.duplicate_detection import IN_FLIGHT_CODE
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import Action, Verdict


def _types(guard: Guard) -> list[str]:
    guard.events.flush()
    return [event["type"] for event in read_events(guard.events.directory)]


def _events(guard: Guard) -> list[dict]:
    guard.events.flush()
    return list(read_events(guard.events.directory))


def _messages(count: int, address: str = "q") -> list[Message]:
    return [Message(address, b"%d" % i) for i in range(count)]


class Recorder:
    """Records the send hooks; ``verdicts`` maps a body to its ``before_send`` verdict."""

    def __init__(self, verdicts: dict[bytes, Verdict] | None = None,
                 batch_verdicts: dict[int, Verdict] | None = None) -> None:
        self.verdicts = verdicts or {}
        self.batch_verdicts = batch_verdicts
        self.decided: list[bytes] = []
        self.batches: list[list[Message]] = []
        self.contexts: list[HookContext] = []
        self.after: list[bytes] = []
        self.after_batches: list[list[bytes]] = []
        self.failed: list[tuple[bytes, str]] = []

    @hookimpl
    def before_send(self, message: Message, ctx: HookContext) -> Verdict | None:
        self.decided.append(message.body)
        self.contexts.append(ctx)
        return self.verdicts.get(message.body)

    @hookimpl
    def before_send_batch(self, messages: list[Message]) -> dict[int, Verdict] | None:
        self.batches.append(list(messages))
        return self.batch_verdicts

    @hookimpl
    def after_send(self, message: Message) -> None:
        self.after.append(message.body)

    @hookimpl
    def after_send_batch(self, messages: list[Message]) -> None:
        self.after_batches.append([message.body for message in messages])

    @hookimpl
    def on_send_exception(self, message: Message, exception: BaseException) -> None:
        self.failed.append((message.body, str(exception)))


def test_results_and_outgoing_keep_the_order_given(guard: Guard,
                                                   adapter: LoopbackAdapter) -> None:
    recorder = Recorder()
    guard.plugins.register(recorder)
    messages = [Message("a", b"0"), Message("b", b"1"), Message("a", b"2")]
    decision = guard.decide_sends(messages, adapter.capabilities, broker="activemq",
                                  role="sidecar", sender="connection-1")

    assert [result.message for result in decision.results] == messages
    assert decision.outgoing == decision.results
    assert [result.forward for result in decision.outgoing] == messages
    assert decision.rejected is None and decision.undecided == 0
    assert all(message.message_id for message in messages)  # stamped
    assert len({message.message_id for message in messages}) == 3
    assert recorder.decided == [b"0", b"1", b"2"]
    assert [[m.body for m in batch] for batch in recorder.batches] == [[b"0", b"1", b"2"]]
    # One context per address, shared by the batch's messages to it.
    ctx_a, ctx_b, ctx_a2 = recorder.contexts
    assert ctx_a is ctx_a2 and ctx_a is not ctx_b
    assert (ctx_a.role, ctx_a.sender, ctx_a.batch, ctx_a.broker) == (
        "sidecar", "connection-1", True, "activemq")
    assert all(result.ctx is recorder.contexts[i] for i, result in enumerate(decision.results))
    # Deciding writes nothing and records nothing for accepted messages.
    assert adapter.loop.depth("a") == 0 and _types(guard) == []


def test_a_message_that_has_an_id_keeps_it(guard: Guard, adapter: LoopbackAdapter) -> None:
    message = Message("q", b"x", message_id="given-id")
    decision = guard.decide_sends([message], adapter.capabilities)
    assert decision.results[0].message.message_id == "given-id"


def test_the_first_reject_stops_deciding(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder({b"2": Verdict.reject("no two")})
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(5), adapter.capabilities)

    assert recorder.decided == [b"0", b"1", b"2"]
    assert [r.message.body for r in decision.results] == [b"0", b"1", b"2"]
    assert decision.undecided == 2
    rejected = decision.rejected
    assert rejected is decision.results[2]
    assert rejected.rejected and not rejected.sent and rejected.reason == "no two"
    assert rejected.forward is None
    # The batch hook sees what was accepted before the REJECT, and nothing after it.
    assert [[m.body for m in batch] for batch in recorder.batches] == [[b"0", b"1"]]
    assert [r.message.body for r in decision.outgoing] == [b"0", b"1"]
    assert _types(guard) == ["rejected"]


def test_drop_and_move_verdicts(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder({b"1": Verdict.drop("dup", event="duplicate_rejected"),
                         b"2": Verdict.move("elsewhere", "rerouted")})
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(4), adapter.capabilities)

    kept, dropped, moved, last = decision.results
    assert kept.forward is kept.message and not kept.moved
    assert kept.verdict.action is Action.CONTINUE
    assert dropped.dropped and not dropped.sent and dropped.reason == "dup"
    assert moved.moved and moved.sent and moved.reason == "rerouted"
    copy = moved.forward
    assert copy is not None and copy is not moved.message
    assert copy.address == "elsewhere" and copy.body == b"2"
    assert copy.message_id == moved.message.message_id  # a moved copy keeps the mqguard id
    assert [r.forward for r in decision.outgoing] == [kept.message, copy, last.message]
    # The batch hook decides about what goes to the broker: the copy, not the original.
    assert [m.address for m in recorder.batches[0]] == ["q", "elsewhere", "q"]
    assert _types(guard) == ["duplicate_rejected", "moved"]


def test_batch_verdicts_replace_the_results_they_refuse(guard: Guard,
                                                        adapter: LoopbackAdapter) -> None:
    # Indexes count what went to the batch hook: the moved copy of b"1" is index 1.
    recorder = Recorder({b"1": Verdict.move("elsewhere", "rerouted")},
                        {1: Verdict.drop("copy refused"), 3: Verdict.reject("three refused"),
                         4: Verdict(Action.CONTINUE)})
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(5), adapter.capabilities)

    verdicts = [(r.verdict.action, r.reason) for r in decision.results]
    assert verdicts == [(Action.CONTINUE, ""), (Action.DROP, "copy refused"),
                        (Action.CONTINUE, ""), (Action.REJECT, "three refused"),
                        (Action.CONTINUE, "")]
    assert [r.message.body for r in decision.outgoing] == [b"0", b"2", b"4"]
    assert decision.rejected is decision.results[3]
    assert decision.undecided == 0
    events = _events(guard)
    assert [e["type"] for e in events] == ["moved", "dropped", "rejected"]
    assert events[1]["address"] == "elsewhere"  # recorded for the copy it refused


def test_the_first_reject_in_order_is_the_decision_s_rejection(
        guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder({b"3": Verdict.reject("before_send says no")},
                        {0: Verdict.reject("batch says no")})
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(5), adapter.capabilities)
    assert decision.rejected is decision.results[0]
    assert decision.rejected.reason == "batch says no"
    assert [r.reason for r in decision.results if r.rejected] == ["batch says no",
                                                                  "before_send says no"]


def test_without_batch_each_message_has_its_own_context_and_no_batch_hook(
        guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder()
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(2), adapter.capabilities, batch=False)
    assert recorder.batches == []
    first, second = recorder.contexts
    assert first is not second and not first.batch
    guard.settle_sends(decision.outgoing)
    assert recorder.after == [b"0", b"1"] and recorder.after_batches == []


def test_settle_confirmed_sends(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder({b"1": Verdict.drop("dup")})
    guard.plugins.register(recorder)
    first = guard.decide_sends(_messages(3), adapter.capabilities)
    second = guard.decide_sends([Message("other", b"3"), Message("other", b"4")],
                                adapter.capabilities)
    # Confirmations may come in groups of any decisions; results without a forward (the
    # drop) are ignored.
    guard.settle_sends([*first.results, *second.outgoing])

    assert recorder.after == [b"0", b"2", b"3", b"4"]
    assert recorder.after_batches == [[b"0", b"2", b"3", b"4"]]
    events = _events(guard)
    assert [e["type"] for e in events] == ["dropped", "sent", "sent", "sent", "sent"]
    sent = [r.message.message_id for r in (*first.outgoing, *second.outgoing)]
    assert [e["message_id"] for e in events[1:]] == sent
    assert len({e["ts"] for e in events[1:]}) == 1  # one append


def test_settle_failed_sends(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder()
    guard.plugins.register(recorder)
    decision = guard.decide_sends(_messages(3), adapter.capabilities)
    confirmed, *failed = decision.outgoing
    with pytest.raises(ValueError, match="error"):
        guard.settle_sends(failed=failed)
    guard.settle_sends([confirmed], failed, error=AdapterError("no RECEIPT"))

    assert recorder.after == [b"0"]
    assert recorder.failed == [(b"1", "no RECEIPT"), (b"2", "no RECEIPT")]
    events = _events(guard)
    assert [e["type"] for e in events] == ["sent", "send_failed", "send_failed"]
    assert "no RECEIPT" in events[1]["reason"]


def test_transaction_path(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = Recorder({b"1": Verdict.reject("bad one"), b"3": Verdict.reject("bad three")})
    guard.plugins.register(recorder)
    state = guard.begin(adapter)
    decision = guard.decide_sends(_messages(4), adapter.capabilities, broker=adapter.broker,
                                  transaction=state)

    # In a transaction a REJECT does not stop deciding: it makes the transaction
    # rollback-only (the first reason is kept), and there is no batch hook.
    assert recorder.decided == [b"0", b"1", b"2", b"3"] and recorder.batches == []
    assert decision.undecided == 0 and decision.transaction is state
    assert state.rollback_reason == "bad one"
    assert decision.rejected is decision.results[1]
    assert all(r.transaction is state and r.ctx.transaction == state.transaction_id
               and not r.ctx.batch for r in decision.results)
    assert [r.message.body for r in decision.outgoing] == [b"0", b"2"]
    # Confirmed inside a transaction: held for the COMMIT, not sent yet.
    guard.settle_sends(decision.outgoing)
    assert state.messages == [r.message for r in decision.outgoing]
    assert recorder.after == [] and _types(guard) == ["rejected", "rejected"]
    with pytest.raises(TransactionRolledBack, match="bad one"):
        guard.commit(adapter, state)
    assert _types(guard)[-1] == "tx_rolled_back"


def test_transaction_commit_sends_what_was_settled(guard: Guard,
                                                   adapter: LoopbackAdapter) -> None:
    recorder = Recorder()
    guard.plugins.register(recorder)
    state = guard.begin(adapter)
    decision = guard.decide_sends(_messages(2), adapter.capabilities, broker=adapter.broker,
                                  transaction=state)
    adapter.send_many([r.forward for r in decision.outgoing if r.forward is not None],
                      transaction=state.transaction_id)
    guard.settle_sends(decision.outgoing)
    guard.commit(adapter, state)
    assert [m.body for m in adapter.loop.drain("q")] == [b"0", b"1"]
    assert recorder.after == [b"0", b"1"]
    assert _types(guard) == ["sent", "sent", "tx_committed"]


def test_a_failed_send_in_a_transaction_names_it(guard: Guard,
                                                 adapter: LoopbackAdapter) -> None:
    state = guard.begin(adapter)
    decision = guard.decide_sends(_messages(1), adapter.capabilities, transaction=state)
    guard.settle_sends(failed=decision.outgoing, error=AdapterError("write failed"))
    (event,) = _events(guard)
    assert event["type"] == "send_failed" and event["transaction"] == state.transaction_id
    assert state.messages == []


def test_result_types_are_frozen_and_slotted(guard: Guard, adapter: LoopbackAdapter) -> None:
    decision = guard.decide_sends(_messages(1), adapter.capabilities)
    for value in (decision, decision.results[0], TransactionState("t")):
        assert not hasattr(value, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.undecided = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.results[0].forward = None  # type: ignore[misc]
    assert isinstance(decision, SendDecision) and isinstance(decision.results[0], SendResult)


def test_plain_data_in(guard: Guard, adapter: LoopbackAdapter) -> None:
    # What a front end with only a frame at hand has: address, body, headers.
    message = Message.from_wire("orders", b"{}", {"_AMQ_DUPL_ID": "order-1", "k": "v"})
    decision = guard.decide_sends([message], adapter.capabilities, broker="rabbitmq")
    (result,) = decision.outgoing
    assert result.forward is message and message.duplicate_id == "order-1"
    assert message.headers["k"] == "v" and message.message_id


# -- duplicate-ID reservation, on both stores -----------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def store_guard(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Guard]:
    store = "memory" if request.param == "memory" else request.getfixturevalue("mqguard_redis_url")
    config = parse_config({"mqguard": {"store": store,
                                       "event-log": {"directory": str(tmp_path / "ev")}}})
    with Guard(config) as guard:
        yield guard


def _dup(body: bytes) -> Message:
    return Message("orders", body, duplicate_id="order-1")


def test_a_decided_duplicate_id_is_in_flight_until_settled(store_guard: Guard) -> None:
    guard, caps = store_guard, LoopbackAdapter().capabilities
    first = guard.decide_sends([_dup(b"1")], caps, sender="connection-1")
    assert len(first.outgoing) == 1
    # Another sender: the first send's fate is unknown, so the repeat is refused.
    other = guard.decide_sends([_dup(b"2")], caps, sender="connection-2")
    assert other.rejected is not None and IN_FLIGHT_CODE in other.rejected.reason
    # The same ordered stream: the repeat follows the original's fate (dropped).
    same = guard.decide_sends([_dup(b"3")], caps, sender="connection-1")
    assert same.rejected is None and same.results[0].dropped
    guard.settle_sends(first.outgoing)
    # Confirmed: any later send of the id is a duplicate, dropped.
    later = guard.decide_sends([_dup(b"4")], caps, sender="connection-2")
    assert later.outgoing == () and later.results[0].dropped


def test_a_failed_send_releases_its_duplicate_id(store_guard: Guard) -> None:
    guard, caps = store_guard, LoopbackAdapter().capabilities
    first = guard.decide_sends([_dup(b"1"), Message("orders", b"plain")], caps)
    assert len(first.outgoing) == 2
    guard.settle_sends(failed=first.outgoing, error=AdapterError("connection lost"))
    # The broker may not have it: a retry must not be mistaken for a duplicate.
    retry = guard.decide_sends([_dup(b"1")], caps)
    assert len(retry.outgoing) == 1
    guard.settle_sends(retry.outgoing)
    assert guard.decide_sends([_dup(b"1")], caps).results[0].dropped


def test_a_batch_repeating_an_id_sends_it_once(store_guard: Guard) -> None:
    guard, caps = store_guard, LoopbackAdapter().capabilities
    decision = guard.decide_sends([_dup(b"1"), Message("orders", b"x"), _dup(b"2")], caps,
                                  sender="connection-1")
    assert [r.message.body for r in decision.outgoing] == [b"1", b"x"]
    assert decision.results[2].dropped
