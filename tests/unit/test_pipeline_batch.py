"""Guard.send_batch outside transactions: one decision, one write, one settlement.

Pure logic on a recording loopback adapter; the STOMP adapter's side runs against real
brokers in tests/adapters.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mqguard import hookimpl
from mqguard.context import HookContext
from mqguard.errors import AdapterError, MessageRejected
from mqguard.events import read_events
from mqguard.message import Message, derived_message_id
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import Verdict


class RecordingAdapter(LoopbackAdapter):
    """Loopback adapter that logs what happens when."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        #: The error ``send_many`` raises (after the broker took nothing).
        self.fail_with: str | None = None

    def send_many(self, messages: list[Message], *, transaction: str | None = None) -> None:
        self.log.append(("write", len(messages)))
        if self.fail_with is not None:
            raise AdapterError(self.fail_with)
        super().send_many(messages, transaction=transaction)


class Recorder:
    """Logs each before_send (by body) into the adapter's log, so order is visible."""

    def __init__(self, adapter: RecordingAdapter,
                 verdict: Callable[[Message], Verdict | None] = lambda m: None) -> None:
        self.adapter = adapter
        self.verdict = verdict
        self.batches: list[tuple[int, bool]] = []
        self.after: list[bytes] = []
        self.after_batches: list[int] = []
        self.failed: list[bytes] = []

    @hookimpl
    def before_send(self, message: Message) -> Verdict | None:
        self.adapter.log.append(("decide", int(message.body)))
        return self.verdict(message)

    @hookimpl
    def before_send_batch(self, messages: list[Message], ctx: HookContext) -> None:
        self.batches.append((len(messages), ctx.batch))

    @hookimpl
    def after_send(self, message: Message) -> None:
        self.after.append(message.body)

    @hookimpl
    def after_send_batch(self, messages: list[Message]) -> None:
        self.after_batches.append(len(messages))

    @hookimpl
    def on_send_exception(self, message: Message) -> None:
        self.failed.append(message.body)


def _messages(producer: GuardedProducer, count: int) -> list[Message]:
    return [producer.message("q", b"%d" % i) for i in range(count)]


def _terminal(guard: Guard) -> dict[str, list[int]]:
    guard.events.flush()
    out: dict[str, list[int]] = {}
    by_id: dict[str, int] = {}
    for event in read_events(guard.events.directory):
        out.setdefault(event["type"], []).append(event["seq"])
        by_id[event["message_id"]] = by_id.get(event["message_id"], 0) + 1
    # Exactly one terminal event per message that got one.
    assert set(by_id.values()) <= {1}
    return out


@pytest.fixture
def recording() -> RecordingAdapter:
    return RecordingAdapter()


def test_a_batch_is_decided_then_written_in_one_send_many(
        guard: Guard, recording: RecordingAdapter) -> None:
    recorder = Recorder(recording)
    guard.plugins.register(recorder)
    producer = GuardedProducer(recording, guard)
    results = producer.send_batch(_messages(producer, 100))

    # Every message is decided before the one write of the whole batch.
    assert recording.log == [*(("decide", i) for i in range(100)), ("write", 100)]
    assert recorder.batches == [(100, True)]
    assert all(r.sent for r in results)
    ids = [r.message.message_id for r in results]
    # The producer drew its own id: its messages' ids are derived from it, in order.
    assert ids == [derived_message_id(producer.producer_id, n) for n in range(1, 101)]
    assert [m.body for m in recording.loop.drain("q")] == [b"%d" % i for i in range(100)]
    assert recorder.after == [b"%d" % i for i in range(100)]
    assert recorder.after_batches == [100]
    assert _terminal(guard) == {"sent": list(range(1, 101))}


def test_a_reject_sends_what_came_before_and_decides_nothing_after(
        guard: Guard, recording: RecordingAdapter) -> None:
    bad = 11
    recorder = Recorder(recording,
                        lambda m: Verdict.reject("bad") if int(m.body) == bad else None)
    guard.plugins.register(recorder)
    producer = GuardedProducer(recording, guard)
    with pytest.raises(MessageRejected, match="bad"):
        producer.send_batch(_messages(producer, 100))

    assert [m.body for m in recording.loop.drain("q")] == [b"%d" % i for i in range(bad)]
    decided = [n for kind, n in recording.log if kind == "decide"]
    assert decided == list(range(bad + 1))  # nothing after the rejected message is decided
    assert recorder.batches == [(bad, True)]
    assert _terminal(guard) == {"sent": list(range(1, bad + 1)), "rejected": [bad + 1]}


def test_a_batch_hook_reject_keeps_what_it_accepted(
        guard: Guard, recording: RecordingAdapter) -> None:
    class RejectTenth:
        @hookimpl
        def before_send_batch(self, messages: list[Message]) -> dict[int, Verdict] | None:
            return {9: Verdict.reject("batch says no")}

    guard.plugins.register(RejectTenth())
    producer = GuardedProducer(recording, guard)
    with pytest.raises(MessageRejected, match="batch says no"):
        producer.send_batch(_messages(producer, 100))
    expected = [i for i in range(100) if i != 9]
    assert [int(m.body) for m in recording.loop.drain("q")] == expected
    assert _terminal(guard) == {"sent": [i + 1 for i in expected], "rejected": [10]}


def test_a_failed_write_fails_every_message_of_the_batch(
        guard: Guard, recording: RecordingAdapter) -> None:
    recorder = Recorder(recording)
    guard.plugins.register(recorder)
    recording.fail_with = "no RECEIPT"
    producer = GuardedProducer(recording, guard)
    with pytest.raises(AdapterError, match="no RECEIPT"):
        producer.send_batch(_messages(producer, 100))

    assert recorder.after == [] and recorder.after_batches == []
    assert [int(b) for b in recorder.failed] == list(range(100))
    assert _terminal(guard) == {"send_failed": list(range(1, 101))}


def test_a_plugin_error_while_deciding_writes_nothing(
        guard: Guard, recording: RecordingAdapter) -> None:
    boom = 13

    class Broken:
        @hookimpl
        def before_send(self, message: Message) -> None:
            if int(message.body) == boom:
                raise RuntimeError("plugin bug")

    guard.plugins.register(Broken())
    producer = GuardedProducer(recording, guard)
    with pytest.raises(RuntimeError, match="plugin bug"):
        producer.send_batch(_messages(producer, 100))
    assert recording.log == [] and recording.loop.depth("q") == 0
    assert _terminal(guard) == {}


def test_one_message_is_sent_on_its_own_without_the_batch_hook(
        guard: Guard, recording: RecordingAdapter) -> None:
    recorder = Recorder(recording)
    guard.plugins.register(recorder)
    producer = GuardedProducer(recording, guard)
    (result,) = producer.send_batch(_messages(producer, 1))
    assert result.sent and not result.ctx.batch
    assert recorder.batches == [] and recorder.after_batches == []
    assert ("write", 1) not in recording.log  # adapter.send, not send_many
    assert _terminal(guard) == {"sent": [1]}
