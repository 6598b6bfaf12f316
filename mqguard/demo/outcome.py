"""What the clients of one demo address saw, and waiting for it (shared by every leg)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from mqguard.demo.plan import Kind, Planned

__all__ = ["LegOutcome", "wait_for"]


@dataclass
class LegOutcome:
    """What the clients of one address saw (the audit judges the event log separately)."""

    address: str
    planned: list[Planned]
    #: Handler invocations per planned index (normal and poison messages).
    handled: Counter[int] = field(default_factory=Counter)
    dead_letters: int = 0
    expired_copies: int = 0
    #: Messages the failover left handled but unacknowledged on the broker.
    failover_unacked: int = 0

    def handled_twice(self) -> int:
        normal = {p.index for p in self.planned if p.kind is Kind.NORMAL}
        return sum(1 for index, n in self.handled.items() if index in normal and n > 1)

    def progress(self) -> str:
        want = Counter(p.kind for p in self.planned)
        normal_done = sum(1 for p in self.planned
                          if p.kind is Kind.NORMAL and self.handled[p.index])
        return (f"{self.address}: handled {normal_done}/{want[Kind.NORMAL]}, dead-lettered "
                f"{self.dead_letters}/{want[Kind.POISON]}, expired "
                f"{self.expired_copies}/{want[Kind.SHORT_LIVED]}")

    def complete(self) -> bool:
        want = Counter(p.kind for p in self.planned)
        normal_done = sum(1 for p in self.planned
                          if p.kind is Kind.NORMAL and self.handled[p.index])
        return (normal_done == want[Kind.NORMAL] and self.dead_letters == want[Kind.POISON]
                and self.expired_copies == want[Kind.SHORT_LIVED])


def wait_for(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
    """Poll ``condition`` until it holds; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            told = what() if callable(what) else what
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {told}")
        time.sleep(0.05)
