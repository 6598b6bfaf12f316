"""``GuardedProducer``: send through the guard pipeline from application code."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from mqguard.adapter import Adapter
from mqguard.message import Message, derived_message_id, new_message_id, now_ms
from mqguard.pipeline import Guard, SendResult, TransactionState
from mqguard.registry import open_adapter


class GuardedProducer:
    """Sends messages through the guard. Use it as a context manager.

    >>> with GuardedProducer("stomp://127.0.0.1:61613") as producer:  # doctest: +SKIP
    ...     producer.send("orders", b"{}", duplicate_id="order-42")

    Every message gets the producer's id and the next sequence number, which the
    consumer audit uses to recognise duplicate deliveries.
    """

    def __init__(self, adapter: Adapter | str, guard: Guard | None = None, *,
                 producer_id: str | None = None) -> None:
        self.adapter = open_adapter(adapter) if isinstance(adapter, str) else adapter
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(role="producer")
        self.producer_id = producer_id or new_message_id()
        # An id drawn here is this instance's alone: its messages' ids can be derived from
        # it (derived_message_id); an application's own producer id may come back after a
        # restart with the sequence starting over, so its messages get random ids.
        self._derives_ids = producer_id is None
        # itertools.count is atomic under the GIL: threads may share a producer.
        self._sequence = itertools.count(1)
        self._connected = False
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> GuardedProducer:
        with self._lock:
            if not self._connected:
                self.adapter.connect()
                self._connected = True
                self.guard.start()
        return self

    def close(self) -> None:
        with self._lock:
            if self._connected:
                self._connected = False
                self.adapter.close()
            if self._owns_guard:
                self.guard.close()

    def __enter__(self) -> GuardedProducer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sending --------------------------------------------------------------------

    def message(self, address: str, body: bytes | str, *,
                headers: Mapping[str, str] | None = None, duplicate_id: str | None = None,
                ttl_ms: int | None = None, expiration: int | None = None) -> Message:
        """Build a stamped message without sending it."""
        if ttl_ms is not None and expiration is not None:
            raise ValueError("give ttl_ms or expiration, not both")
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be > 0, got {ttl_ms}")
        if isinstance(body, str):
            body = body.encode("utf-8")
        sequence = next(self._sequence)
        return Message(
            address=address,
            body=body,
            headers=dict(headers or {}),
            message_id=(derived_message_id(self.producer_id, sequence)
                        if self._derives_ids else ""),
            duplicate_id=duplicate_id,
            expiration=(now_ms() + ttl_ms) if ttl_ms is not None else (expiration or 0),
            producer_id=self.producer_id,
            sequence=sequence,
        )

    def send(self, address: str, body: bytes | str, *,
             headers: Mapping[str, str] | None = None, duplicate_id: str | None = None,
             ttl_ms: int | None = None, expiration: int | None = None,
             transaction: TransactionState | None = None) -> SendResult:
        """Send one message; returns once the broker confirmed it (or a plugin decided).

        Raises :class:`~mqguard.errors.MessageRejected` when a plugin rejects it and
        :class:`~mqguard.errors.AdapterError` when the broker does not confirm it.
        """
        message = self.message(address, body, headers=headers, duplicate_id=duplicate_id,
                               ttl_ms=ttl_ms, expiration=expiration)
        return self.send_message(message, transaction=transaction)

    def send_message(self, message: Message, *,
                     transaction: TransactionState | None = None) -> SendResult:
        self._ensure_started()
        return self.guard.send(self.adapter, message, transaction=transaction)

    def send_batch(self, messages: Sequence[Message], *,
                   transaction: TransactionState | None = None) -> list[SendResult]:
        """Send several messages pipelined: all frames first, then all confirmations."""
        self._ensure_started()
        return self.guard.send_batch(self.adapter, messages, transaction=transaction)

    @contextmanager
    def transaction(self) -> Iterator[TransactionState]:
        """A broker transaction: committed when the block ends, aborted if it raises.

        A plugin may make the transaction rollback-only (a duplicate id inside it,
        for instance); the commit then raises
        :class:`~mqguard.errors.TransactionRolledBack` and nothing reaches the broker.
        """
        self._ensure_started()
        state = self.guard.begin(self.adapter)
        try:
            yield state
        except BaseException:
            self.guard.abort(self.adapter, state, "the transaction block raised")
            raise
        self.guard.commit(self.adapter, state)

    def _ensure_started(self) -> None:
        if not self._connected:
            self.start()
