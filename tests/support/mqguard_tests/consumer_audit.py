"""A guarded consumer that receives one message twice, and the events its guard wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.stores.memory import MemoryStore
from mqguard.testing.loopback import LoopbackAdapter


def make_guard(tmp_path: Path, name: str = "events", store: MemoryStore | None = None,
               **options: Any) -> Guard:
    config = parse_config({
        "mqguard": {"event-log": {"directory": str(tmp_path / name)}},
        "address-settings": {"q": {"dead-letter-address": "DLA"}},
        "plugins": {"consumer_audit": options},
    })
    return Guard(config, store=store).start()


def events(guard: Guard) -> list[dict[str, Any]]:
    guard.events.flush()
    return list(read_events(guard.config.core.event_log.directory))


def send_twice(adapter: LoopbackAdapter, guard: Guard, body: bytes = b"once") -> Message:
    """A guarded send, then the same message again: what a broker redelivery looks like."""
    message = GuardedProducer(adapter, guard).send("q", body).message
    adapter.loop.enqueue(Message.from_wire("q", message.body, message.wire_headers()), 1)
    return message


def consume_a_duplicate(tmp_path: Path) -> tuple[Guard, LoopbackAdapter, Message,
                                                  list[Message]]:
    """A message delivered twice to a guarded consumer with the default audit; returns the
    guard, the adapter, the message sent and what the handler received."""
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    sent = send_twice(adapter, guard)
    handled: list[Message] = []
    with GuardedConsumer(adapter, "q", handled.append, guard):
        assert adapter.pump() == 2
    return guard, adapter, sent, handled
