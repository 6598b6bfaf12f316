"""A small stomp.py client for tests against the local Artemis (anonymous login)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import stomp  # type: ignore[import-untyped]

from mqguard.servers import ServerHandle

__all__ = ["ArtemisStomp", "artemis_stomp"]


class ArtemisStomp(stomp.ConnectionListener):  # type: ignore[misc]
    """One STOMP 1.2 connection; MESSAGE frames and receipts are queued for the test."""

    def __init__(self, port: int) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()
        self.errors: list[Any] = []
        self.conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
        self.conn.set_listener("test", self)
        self.conn.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def send(self, destination: str, body: str, receipt: str, **headers: str) -> None:
        """Send a persistent message and wait for its receipt."""
        self.conn.send(destination, body=body,
                       headers={"persistent": "true", "receipt": receipt, **headers})
        assert self.receipts.get(timeout=10) == receipt

    def subscribe(self, destination: str, sub_id: str, ack: str = "auto") -> None:
        """Subscribe and wait until the broker has set the subscription up (its receipt)."""
        self.conn.subscribe(destination, id=sub_id, ack=ack, headers={"receipt": sub_id})
        assert self.receipts.get(timeout=10) == sub_id

    def next(self, timeout: float = 10.0) -> Any:
        """The next MESSAGE frame (queue.Empty after ``timeout``)."""
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        self.conn.disconnect()


@contextmanager
def artemis_stomp(server: ServerHandle) -> Iterator[ArtemisStomp]:
    """A connected :class:`ArtemisStomp` to ``server``, disconnected afterwards."""
    client = ArtemisStomp(server.port("stomp"))
    try:
        yield client
    finally:
        client.close()
