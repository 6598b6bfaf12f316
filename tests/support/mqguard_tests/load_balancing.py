"""Consumers of load-balancing tests: draining a queue and recording what each node got."""

from __future__ import annotations

import threading
import time

from mqguard.adapter import Delivery, SubscribeOptions
from mqguard.message import Message
from mqguard.registry import open_adapter


def drain(url: str, queue: str, idle_s: float = 1.0, first_s: float = 2.0) -> list[Message]:
    """Consume everything in ``queue`` on ``url`` (unguarded): the broker's own count."""
    got: list[Message] = []
    cond = threading.Condition()

    def collect(delivery: Delivery) -> None:
        with cond:
            got.append(delivery.message)
            cond.notify_all()

    adapter = open_adapter(url)
    adapter.connect()
    try:
        adapter.subscribe(queue, collect, SubscribeOptions(ack="auto", prefetch=1000))
        with cond:
            wait, seen = first_s, -1
            while len(got) != seen:
                seen = len(got)
                cond.wait(wait)
                wait = idle_s
    finally:
        adapter.close()
    return got


class Received:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.messages.append(message)

    def wait(self, count: int, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.messages) < count:
            time.sleep(0.05)
        return len(self.messages)
