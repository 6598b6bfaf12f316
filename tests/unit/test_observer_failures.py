"""An observer plugin that raises never changes a message's fate (hookspecs docstring)."""

from __future__ import annotations

import logging

import pytest

from mqguard import hookimpl
from mqguard.consumer import GuardedConsumer
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import AckReason


class Broken:
    """Raises from every observer it implements."""

    @hookimpl
    def after_send(self, message: Message) -> None:
        raise RuntimeError("after_send is broken")

    @hookimpl
    def after_deliver(self, message: Message) -> None:
        raise RuntimeError("after_deliver is broken")

    @hookimpl
    def message_acknowledged(self, message: Message) -> None:
        raise RuntimeError("message_acknowledged is broken")


class Counting:
    def __init__(self) -> None:
        self.acknowledged: list[AckReason] = []
        self.sent = 0

    @hookimpl(tryfirst=True)
    def after_send(self, message: Message) -> None:
        self.sent += 1

    @hookimpl(trylast=True)
    def message_acknowledged(self, message: Message, reason: AckReason) -> None:
        self.acknowledged.append(reason)


def test_raising_observers_are_logged_and_change_nothing(
        guard: Guard, adapter: LoopbackAdapter, caplog: pytest.LogCaptureFixture) -> None:
    counting = Counting()
    guard.plugins.register(Broken(), "broken")
    guard.plugins.register(counting, "counting")
    caplog.set_level(logging.ERROR, logger="mqguard.plugins")
    # The broker has the message: the send succeeds although after_send raised.
    result = GuardedProducer(adapter, guard).send("q", b"x")
    assert result.message.body == b"x" and adapter.loop.depth("q") == 1
    handled: list[bytes] = []
    with GuardedConsumer(adapter, "q", lambda m: handled.append(m.body), guard):
        adapter.pump()
    # Handled once, acknowledged (not left unacked, not redelivered), the other
    # observers still called.
    assert handled == [b"x"]
    assert [m.body for m in adapter.acked] == [b"x"] and adapter.loop.depth("q") == 0
    assert counting.sent == 1 and counting.acknowledged == [AckReason.NORMAL]
    failures = [r.getMessage() for r in caplog.records if r.name == "mqguard.plugins"]
    assert len(failures) == 3, failures
    assert any("after_send" in text and "Broken.after_send" in text for text in failures)
