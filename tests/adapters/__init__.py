"""Adapter tests against real brokers (fixtures from ``mqguard.testing.pytest_plugin``).

:class:`Inbox` collects deliveries from an adapter's receiver thread so that a test can wait
for them with a timeout instead of sleeping.
"""

from __future__ import annotations

import threading
import time

from mqguard.adapter import Delivery


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
