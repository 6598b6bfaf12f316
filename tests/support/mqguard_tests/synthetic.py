"""Synthetic event logs written by the real :class:`~mqguard.events.EventLog`.

Each method emits the events the guard pipeline writes for one step
(mqguard/pipeline.py), so the audit is tested against the real format and the
real sequences; a fake clock makes the timestamps exact.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

import mqguard.events
from mqguard.events import EventLog, EventType
from mqguard.message import Message

T0 = 1_700_000_000_000


class FakeClock:
    """Stands in for the ``time`` module inside mqguard.events."""

    def __init__(self, start_ms: int = T0) -> None:
        self.now_ms = start_ms

    def time_ns(self) -> int:
        return self.now_ms * 1_000_000

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    def advance(self, ms: int = 1) -> int:
        self.now_ms += ms
        return self.now_ms


class Cluster:
    """Event logs of a producer node and consumer nodes sharing one directory."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch, *,
                 max_bytes: int = 64 * 1024 * 1024, flush_each: bool = False,
                 legacy: bool = False, rotated_format: str = "parquet") -> None:
        self.clock = FakeClock()
        monkeypatch.setattr(mqguard.events, "time", self.clock)
        self.directory = directory
        self.max_bytes = max_bytes
        #: Write every event at once (the writer batches otherwise, and a file only
        #: rotates between batches).
        self.flush_each = flush_each
        #: Write ``acked`` as writers before ``handled`` / ``delivered_ts`` did: the
        #: audit must then pair deliveries with their outcome by writing order.
        self.legacy = legacy
        #: The writer's rotated segments: ``parquet`` (its default) or ``jsonl.gz``.
        self.rotated_format = rotated_format
        self.logs: dict[str, EventLog] = {}
        self._copies = itertools.count(1)
        self._sequence = itertools.count(1)

    def log(self, node: str) -> EventLog:
        if node not in self.logs:
            self.logs[node] = EventLog(self.directory, node_id=node, max_bytes=self.max_bytes,
                                       backup_count=0, rotated_format=self.rotated_format)
        return self.logs[node]

    def emit(self, node: str, event: str, message: Message | None = None,
             **fields: Any) -> None:
        self.clock.advance(1)
        log = self.log(node)
        log.emit(event, message, **fields)
        if self.flush_each:
            log.flush()

    def close(self) -> None:
        for log in self.logs.values():
            log.close()

    # -- send path ------------------------------------------------------------------

    def message(self, message_id: str, address: str = "orders", *,
                expiration: int = 0) -> Message:
        return Message(address=address, body=b"x", message_id=message_id,
                       producer_id="producer-1", sequence=next(self._sequence),
                       expiration=expiration)

    def send(self, message_id: str, address: str = "orders", *, expiration: int = 0,
             node: str = "producer") -> Message:
        message = self.message(message_id, address, expiration=expiration)
        self.emit(node, EventType.SENT, message)
        return message

    def send_failed(self, message_id: str, address: str = "orders") -> Message:
        message = self.message(message_id, address)
        self.emit("producer", EventType.SEND_FAILED, message, reason="TimeoutError()")
        return message

    def commit(self, tx: str, messages: list[Message]) -> None:
        for message in messages:
            self.emit("producer", EventType.SENT, message, transaction=tx)
        self.emit("producer", EventType.TX_COMMITTED, transaction=tx, count=len(messages))

    def roll_back(self, tx: str, count: int) -> None:
        self.emit("producer", EventType.TX_ROLLED_BACK, transaction=tx, reason="aborted",
                  count=count)

    def duplicate_rejected(self, message_id: str, address: str = "orders") -> Message:
        message = self.message(message_id, address)
        message.duplicate_id = "dup-" + message_id
        self.emit("producer", EventType.DUPLICATE_REJECTED, message,
                  reason="duplicate id already in the cache")
        return message

    # -- deliver path -------------------------------------------------------------------

    def _delivery(self, message: Message, count: int) -> Message:
        message.delivery_count = count
        return message

    def delivered(self, message: Message, *, node: str = "consumer-1", count: int = 1,
                  queue: str | None = None) -> None:
        self.emit(node, EventType.DELIVERED, self._delivery(message, count),
                  queue=queue or message.address)

    def acked(self, message: Message, *, node: str = "consumer-1", reason: str = "normal",
              queue: str | None = None, delivered_ts: int | None = None) -> None:
        """``delivered_ts``: the ack ends a successful handling of the delivery written then."""
        fields: dict[str, Any] = {}
        if not self.legacy:
            fields = {"handled": delivered_ts is not None, "delivered_ts": delivered_ts}
        self.emit(node, EventType.ACKED, message, queue=queue or message.address,
                  ack_reason=reason, **fields)

    def handled(self, message: Message, *, node: str = "consumer-1", count: int = 1,
                queue: str | None = None) -> None:
        """delivered, the handler returned, acked (normal)."""
        self.delivered(message, node=node, count=count, queue=queue)
        self.acked(message, node=node, queue=queue, delivered_ts=self.clock.now_ms)

    def failed(self, message: Message, *, node: str = "consumer-1", count: int = 1,
               delay_ms: int = 100) -> None:
        """delivered, the handler raised, a redelivery is scheduled (broker NACK)."""
        self.delivered(message, node=node, count=count)
        queue = message.address
        self.emit(node, EventType.HANDLER_FAILED, message, queue=queue, reason="Nack: no")
        self.emit(node, EventType.REDELIVERY_SCHEDULED, message, queue=queue,
                  delay_ms=delay_ms, mechanism="nack", delivery_count=count)
        self.emit(node, EventType.NACKED, message, queue=queue, requeue=True)

    def dead_lettered(self, message: Message, *, target: str = "DLA", count: int = 3,
                      node: str = "consumer-1", moved: bool = True) -> Message:
        """The last delivery failed: copy to ``target``, dead_lettered, acked (killed)."""
        self.delivered(message, node=node, count=count)
        queue = message.address
        self.emit(node, EventType.HANDLER_FAILED, message, queue=queue, reason="Nack: no")
        copy = Message(address=target, body=message.body,
                       message_id=f"copy-{next(self._copies)}-of-{message.message_id}",
                       producer_id=message.producer_id, sequence=message.sequence)
        if moved:
            self.emit(node, EventType.MOVED, message, queue=queue, target=target,
                      new_message_id=copy.message_id, reason="max-delivery-attempts")
        self.emit(node, EventType.DEAD_LETTERED, message, queue=queue, target=target,
                  reason="max-delivery-attempts")
        self.acked(message, node=node, reason="killed")
        return copy

    def expired(self, message: Message, *, target: str | None = "EXP", moved: bool = True,
                node: str = "consumer-1") -> Message | None:
        """Found expired at delivery: [moved] expired, acked (expired)."""
        queue = message.address
        copy = None
        if target is not None:
            copy = Message(address=target, body=message.body,
                           message_id=f"copy-{next(self._copies)}-of-{message.message_id}")
            if moved:
                self.emit(node, EventType.MOVED, message, queue=queue, target=target,
                          new_message_id=copy.message_id, reason="expired")
        self.emit(node, EventType.EXPIRED, message, queue=queue, target=target,
                  reason="expired")
        self.acked(message, node=node, reason="expired")
        return copy

    def suppressed(self, message: Message, *, node: str = "consumer-1", count: int = 2) -> None:
        """The consumer audit kept a duplicate delivery from the handler (action ack)."""
        message.delivery_count = count
        self.emit(node, EventType.DUPLICATE_DELIVERY_SUPPRESSED, message, queue=message.address,
                  reason="duplicate delivery")
        self.acked(message, node=node)

    def logged_duplicate(self, message: Message, *, node: str = "consumer-1") -> None:
        """The consumer audit let a duplicate through (action log), then it was handled."""
        self.emit(node, EventType.DUPLICATE_DELIVERY_LOGGED, message, queue=message.address)
        self.handled(message, node=node, count=2)
