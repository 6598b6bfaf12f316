"""What the adapter tests share.

:class:`Inbox` collects deliveries from an adapter's receiver thread so that a test can wait
for them with a timeout instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mqguard.adapter import Delivery
from mqguard.errors import AdapterError
from mqguard.message import Message


class Inbox:
    """A delivery callback that records deliveries and lets the test wait for them."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        with self._cond:
            self.deliveries.append(delivery)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Delivery]:
        """Wait until ``count`` deliveries arrived; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.deliveries) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"expected {count} deliveries within {timeout}s, got "
                        f"{len(self.deliveries)}: {[d.message.body for d in self.deliveries]}")
                self._cond.wait(remaining)
            return list(self.deliveries)

    def quiet(self, seconds: float) -> list[Delivery]:
        """Wait ``seconds`` and return everything received (to show nothing more arrives)."""
        time.sleep(seconds)
        with self._cond:
            return list(self.deliveries)


class DeferContract:
    """The delivery-thread contract shared by both adapters, as a callback plus its checks.

    Inside the callback each of ``calls`` (blocking adapter methods) must raise AdapterError
    at once; a job passed to ``adapter.defer()`` then runs on the dispatcher thread and may
    wait for the broker: it sends ``make_copy(body)`` and acks the original.
    """

    def __init__(self, adapter: Any, calls: dict[str, Callable[[], object]],
                 make_copy: Callable[[bytes], Message]) -> None:
        self.adapter = adapter
        self.calls = calls
        self.make_copy = make_copy
        self.refused: list[tuple[str, float, str]] = []
        self.jobs: list[tuple[bytes, bool, str]] = []

    def __call__(self, delivery: Delivery) -> None:
        for name, call in self.calls.items():
            started = time.monotonic()
            try:
                call()
            except AdapterError as exc:
                self.refused.append((name, time.monotonic() - started, str(exc)))

        def job() -> None:
            self.jobs.append((delivery.message.body, self.adapter.on_delivery_thread(),
                              threading.current_thread().name))
            self.adapter.send(self.make_copy(delivery.message.body))  # waits for confirmation
            self.adapter.ack(delivery)

        self.adapter.defer(job)

    def check(self, moved: Inbox, bodies: list[bytes]) -> None:
        assert [d.message.body for d in moved.wait_for(len(bodies))] == bodies
        assert [d.message.body for d in moved.quiet(0.3)] == bodies  # no "direct" send
        assert [(body, inline) for body, inline, _ in self.jobs] == [(b, False) for b in bodies]
        assert all("dispatcher" in name for _, _, name in self.jobs)
        assert [name for name, _, _ in self.refused] == list(self.calls) * len(bodies)
        for name, seconds, text in self.refused:
            assert seconds < 1.0, (name, seconds)
            assert "on the delivery thread" in text and "adapter.defer()" in text, text
        assert self.adapter.connected
