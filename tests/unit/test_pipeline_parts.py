"""Guard.send_batch outside transactions: a batch is decided and written in parts.

Pure logic on a recording adapter (the loopback broker plus ``send_many_nowait``);
the STOMP adapter's side runs against real brokers in tests/adapters.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mqguard import hookimpl
from mqguard.context import HookContext
from mqguard.errors import AdapterError, MessageRejected
from mqguard.events import read_events
from mqguard.message import Message, derived_message_id
from mqguard.pipeline import FIRST_PART, MAX_PART, PART_GROWTH, Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import Verdict


class _Pending:
    def __init__(self, adapter: PartsAdapter, messages: list[Message], error: str | None) -> None:
        self.adapter, self.messages, self.error = adapter, messages, error

    def wait(self) -> None:
        self.adapter.log.append(("wait", len(self.messages)))
        if self.error is not None:
            raise AdapterError(self.error)


class PartsAdapter(LoopbackAdapter):
    """Loopback adapter that writes parts without waiting and logs what happens when."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        #: Part number (0-based) -> error its wait() raises.
        self.fail_wait: dict[int, str] = {}
        #: Part number whose write raises.
        self.fail_write: int | None = None
        self.parts: list[list[Message]] = []

    def send_many_nowait(self, messages: list[Message]) -> _Pending:
        number = len(self.parts)
        if number == self.fail_write:
            raise AdapterError("connection lost while writing")
        self.parts.append(list(messages))
        self.log.append(("write", len(messages)))
        error = self.fail_wait.get(number)
        if error is None:  # a part whose receipts never come is not in the queue either
            self.send_many(list(messages))
        return _Pending(self, list(messages), error)


class Recorder:
    """Logs each before_send (by body) into the adapter's log, so order is visible."""

    def __init__(self, adapter: PartsAdapter,
                 verdict: Callable[[Message], Verdict | None] = lambda m: None) -> None:
        self.adapter = adapter
        self.verdict = verdict
        self.batches: list[tuple[int, bool]] = []
        self.after: list[bytes] = []
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


def _part_sizes(total: int) -> list[int]:
    sizes, size = [], FIRST_PART
    while total > 0:
        sizes.append(min(size, total))
        total -= sizes[-1]
        size = min(size * PART_GROWTH, MAX_PART)
    return sizes


@pytest.fixture
def parts(guard: Guard) -> PartsAdapter:
    guard.send_in_parts = True  # off by default (see Guard.send_in_parts)
    return PartsAdapter()


def test_batch_is_written_in_growing_parts_before_the_rest_is_decided(
        guard: Guard, parts: PartsAdapter) -> None:
    recorder = Recorder(parts)
    guard.plugins.register(recorder)
    producer = GuardedProducer(parts, guard)
    results = producer.send_batch(_messages(producer, 100))

    assert [len(p) for p in parts.parts] == _part_sizes(100)
    assert sum(_part_sizes(100)) == 100 and len(parts.parts) > 2
    # The first part is on the wire before the second part's first message is decided,
    # and every receipt is awaited only after the last part was written.
    assert parts.log.index(("write", FIRST_PART)) < parts.log.index(("decide", FIRST_PART))
    kinds = [kind for kind, _ in parts.log]
    assert kinds.index("wait") > len(kinds) - 1 - kinds[::-1].index("write")
    assert recorder.batches == [(size, True) for size in _part_sizes(100)]
    assert all(r.sent for r in results)
    ids = [r.message.message_id for r in results]
    # The producer drew its own id: its messages' ids are derived from it, in order.
    assert ids == [derived_message_id(producer.producer_id, n) for n in range(1, 101)]
    assert [m.body for m in parts.loop.drain("q")] == [b"%d" % i for i in range(100)]
    assert recorder.after == [b"%d" % i for i in range(100)]
    assert _terminal(guard) == {"sent": list(range(1, 101))}


def test_reject_in_a_later_part_sends_what_came_before_and_nothing_after(
        guard: Guard, parts: PartsAdapter) -> None:
    bad = FIRST_PART + 3
    recorder = Recorder(parts, lambda m: Verdict.reject("bad") if int(m.body) == bad else None)
    guard.plugins.register(recorder)
    producer = GuardedProducer(parts, guard)
    with pytest.raises(MessageRejected, match="bad"):
        producer.send_batch(_messages(producer, 100))

    assert [m.body for m in parts.loop.drain("q")] == [b"%d" % i for i in range(bad)]
    decided = [n for kind, n in parts.log if kind == "decide"]
    assert decided == list(range(bad + 1))  # nothing after the rejected message is decided
    assert _terminal(guard) == {"sent": list(range(1, bad + 1)), "rejected": [bad + 1]}


def test_batch_hook_reject_keeps_what_it_accepted_in_that_part(
        guard: Guard, parts: PartsAdapter) -> None:
    class RejectSecondOfSecondPart:
        calls = 0

        @hookimpl
        def before_send_batch(self, messages: list[Message]) -> dict[int, Verdict] | None:
            self.calls += 1
            return {1: Verdict.reject("batch says no")} if self.calls == 2 else None

    guard.plugins.register(RejectSecondOfSecondPart())
    producer = GuardedProducer(parts, guard)
    with pytest.raises(MessageRejected, match="batch says no"):
        producer.send_batch(_messages(producer, 100))
    second = _part_sizes(100)[1]
    sent = [int(m.body) for m in parts.loop.drain("q")]
    expected = [i for i in range(FIRST_PART + second) if i != FIRST_PART + 1]
    assert sent == expected
    assert _terminal(guard) == {"sent": [i + 1 for i in expected], "rejected": [FIRST_PART + 2]}


def test_a_failed_part_fails_its_messages_only_and_every_part_is_settled(
        guard: Guard, parts: PartsAdapter) -> None:
    recorder = Recorder(parts)
    guard.plugins.register(recorder)
    parts.fail_wait[1] = "no RECEIPT"
    producer = GuardedProducer(parts, guard)
    with pytest.raises(AdapterError, match="no RECEIPT"):
        producer.send_batch(_messages(producer, 100))

    sizes = _part_sizes(100)
    failed = list(range(sizes[0], sizes[0] + sizes[1]))
    confirmed = [i for i in range(100) if i not in failed]
    assert [int(m.body) for m in parts.loop.drain("q")] == confirmed
    assert [int(b) for b in recorder.after] == confirmed
    assert [int(b) for b in recorder.failed] == failed
    assert _terminal(guard) == {"sent": [i + 1 for i in confirmed],
                                "send_failed": [i + 1 for i in failed]}


def test_a_write_failure_stops_the_batch_after_settling_earlier_parts(
        guard: Guard, parts: PartsAdapter) -> None:
    recorder = Recorder(parts)
    guard.plugins.register(recorder)
    parts.fail_write = 1
    producer = GuardedProducer(parts, guard)
    with pytest.raises(AdapterError, match="connection lost"):
        producer.send_batch(_messages(producer, 100))

    sizes = _part_sizes(100)
    assert [int(m.body) for m in parts.loop.drain("q")] == list(range(sizes[0]))
    failed = list(range(sizes[0], sizes[0] + sizes[1]))
    assert [int(b) for b in recorder.failed] == failed
    assert max(n for kind, n in parts.log if kind == "decide") == sizes[0] + sizes[1] - 1
    assert _terminal(guard) == {"sent": list(range(1, sizes[0] + 1)),
                                "send_failed": [i + 1 for i in failed]}


def test_a_plugin_error_while_deciding_settles_the_written_parts_first(
        guard: Guard, parts: PartsAdapter) -> None:
    boom = FIRST_PART + 5

    class Broken:
        @hookimpl
        def before_send(self, message: Message) -> None:
            if int(message.body) == boom:
                raise RuntimeError("plugin bug")

    guard.plugins.register(Broken())
    producer = GuardedProducer(parts, guard)
    with pytest.raises(RuntimeError, match="plugin bug"):
        producer.send_batch(_messages(producer, 100))
    # Only the first part was written; it was confirmed and recorded before the error.
    assert [int(m.body) for m in parts.loop.drain("q")] == list(range(FIRST_PART))
    assert _terminal(guard) == {"sent": list(range(1, FIRST_PART + 1))}


def test_adapter_without_nowait_gets_the_whole_batch_in_one_send_many(
        guard: Guard, adapter: LoopbackAdapter) -> None:
    calls: list[int] = []
    original = adapter.send_many

    def send_many(messages: list[Message], *, transaction: str | None = None) -> None:
        calls.append(len(messages))
        original(messages, transaction=transaction)

    adapter.send_many = send_many  # type: ignore[method-assign]
    producer = GuardedProducer(adapter, guard)
    producer.send_batch(_messages(producer, 100))
    assert calls == [100]
    assert _terminal(guard) == {"sent": list(range(1, 101))}


def test_by_default_the_batch_is_one_part_written_without_waiting(
        guard: Guard) -> None:
    adapter = PartsAdapter()
    assert Guard.send_in_parts is False
    recorder = Recorder(adapter)
    guard.plugins.register(recorder)
    producer = GuardedProducer(adapter, guard)
    results = producer.send_batch(_messages(producer, 100))
    assert [len(p) for p in adapter.parts] == [100]
    assert [kind for kind, _ in adapter.log if kind != "decide"] == ["write", "wait"]
    assert recorder.batches == [(100, True)]
    assert all(r.sent for r in results)
    assert _terminal(guard) == {"sent": list(range(1, 101))}
