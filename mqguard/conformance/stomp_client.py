"""A small synchronous STOMP 1.2 client for the conformance runs (stomp.py underneath).

It plays a plain application: it sends with receipts, runs transactions, and consumes one
message at a time (prefetch 1 on every broker, so a dropped connection hands back exactly the
message in hand). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import stomp  # type: ignore[import-untyped]

__all__ = ["SUBSCRIBE_PREFETCH_1", "Frame", "StompEndpoint", "StompSession"]

#: One unacknowledged message in flight, in each broker's words: Artemis counts credits in
#: bytes (one byte of credit lets exactly one message through), ActiveMQ and RabbitMQ in
#: messages. Each broker ignores the others' headers.
SUBSCRIBE_PREFETCH_1: dict[str, str] = {
    "consumer-window-size": "1",
    "activemq.prefetchSize": "1",
    "prefetch-count": "1",
}


@dataclass(frozen=True)
class StompEndpoint:
    """Where to connect, with which login (None: anonymous)."""

    host: str
    port: int
    login: str | None = None
    passcode: str | None = None


@dataclass(frozen=True)
class Frame:
    command: str
    headers: dict[str, str]
    body: str


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.messages: queue.Queue[Frame] = queue.Queue()
        self.receipts: set[str] = set()
        self.errors: list[Frame] = []
        self.changed = threading.Condition()

    def on_message(self, frame: Any) -> None:
        self.messages.put(Frame("MESSAGE", dict(frame.headers), frame.body))

    def on_receipt(self, frame: Any) -> None:
        with self.changed:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.changed.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.changed:
            self.errors.append(Frame("ERROR", dict(frame.headers), frame.body))
            self.changed.notify_all()

    def on_disconnected(self) -> None:
        with self.changed:
            self.changed.notify_all()


class StompSession:
    """One connection. ``send``/``commit`` return False when the broker answered ERROR
    (the connection is then over) or no RECEIPT came in ``timeout`` seconds."""

    def __init__(self, endpoint: StompEndpoint, *, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._listener = _Listener()
        self._conn = stomp.Connection12([(endpoint.host, endpoint.port)], vhost="/",
                                        heartbeats=(0, 0), auto_content_length=True)
        self._conn.set_listener("conformance", self._listener)
        self._conn.connect(endpoint.login, endpoint.passcode, wait=True)
        self._receipt = 0

    @property
    def failed(self) -> bool:
        return bool(self._listener.errors) or not self._conn.is_connected()

    def _next_receipt(self) -> str:
        self._receipt += 1
        return f"r{self._receipt}"

    def wait_receipt(self, receipt: str) -> bool:
        """True once the RECEIPT ``receipt`` came; False on ERROR, a lost connection or
        after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        with self._listener.changed:
            while receipt not in self._listener.receipts:
                if self._listener.errors or not self._conn.is_connected():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._listener.changed.wait(left)
        return True

    def send(self, destination: str, body: str, headers: dict[str, str],
             transaction: str | None = None) -> bool:
        if self.failed:
            return False
        if transaction is not None:
            # No receipt inside a transaction: RabbitMQ sends it only at COMMIT, so a client
            # waiting for it would wait forever; the COMMIT's receipt covers every send.
            try:
                self._conn.send(destination, body,
                                headers={**headers, "transaction": transaction})
            except stomp.exception.StompException:
                return False
            return not self.failed
        receipt = self._next_receipt()
        try:
            self._conn.send(destination, body, headers=headers, receipt=receipt)
        except stomp.exception.StompException:
            return False
        return self.wait_receipt(receipt)

    def send_frame(self, destination: str, body: str, headers: dict[str, str]) -> None:
        """A SEND exactly as given (``receipt`` and ``transaction`` headers included),
        without waiting for anything."""
        self._conn.send(destination, body, headers=headers)

    def begin(self, transaction: str) -> None:
        self._conn.begin(transaction)

    def commit(self, transaction: str) -> bool:
        if self.failed:
            return False
        receipt = self._next_receipt()
        try:
            self._conn.commit(transaction, headers={"receipt": receipt})
        except stomp.exception.StompException:
            return False
        return self.wait_receipt(receipt)

    def abort(self, transaction: str) -> bool:
        if self.failed:
            return False
        receipt = self._next_receipt()
        try:
            self._conn.abort(transaction, headers={"receipt": receipt})
        except stomp.exception.StompException:
            return False
        return self.wait_receipt(receipt)

    def subscribe(self, destination: str, sub_id: str, *, prefetch_1: bool = True) -> None:
        headers = dict(SUBSCRIBE_PREFETCH_1) if prefetch_1 else {}
        receipt = self._next_receipt()
        self._conn.subscribe(destination, id=sub_id, ack="client-individual",
                             headers={**headers, "receipt": receipt})
        self.wait_receipt(receipt)

    def next_message(self, timeout: float) -> Frame | None:
        try:
            return self._listener.messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def ack(self, frame: Frame) -> None:
        self._conn.ack(frame.headers["ack"])

    def nack(self, frame: Frame) -> None:
        self._conn.nack(frame.headers["ack"])

    def close(self) -> None:
        """DISCONNECT (waiting for its receipt): unacknowledged messages go back."""
        if self._conn.is_connected():
            with contextlib.suppress(stomp.exception.StompException):
                self._conn.disconnect(receipt=self._next_receipt())
        else:
            # Stop the receiver thread of a connection the broker ended.
            with contextlib.suppress(stomp.exception.StompException):
                self._conn.disconnect()
