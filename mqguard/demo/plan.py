"""What the demo sends: a seeded mix of normal, duplicate, poison and short-lived messages.

Pure logic, so the expected fate of every message is known before anything is sent and
the demo (and its tests) can compare what the servers did with what should happen.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from dataclasses import dataclass

#: Header the demo's consumers read to decide that a message is poison (handler fails).
POISON_HEADER = "demo-poison"
#: Header carrying the planned message's index (for the consumers' bookkeeping).
INDEX_HEADER = "demo-index"


class Kind(enum.Enum):
    """The fate a planned message is meant to meet."""

    NORMAL = "normal"  # handled once, acknowledged
    POISON = "poison"  # every delivery fails: dead-lettered after max-delivery-attempts
    SHORT_LIVED = "short-lived"  # expires before any consumer runs: moved to the expiry address


@dataclass(frozen=True, slots=True)
class Planned:
    index: int
    kind: Kind
    duplicate_id: str
    #: Sent a second time with the same duplicate id (duplicate detection drops the copy).
    resent: bool


@dataclass(frozen=True)
class DemoPlan:
    """``messages`` distinct messages; the ratios are of that number."""

    messages: int
    duplicate_ratio: float = 0.10
    poison_ratio: float = 0.05
    short_lived_ratio: float = 0.05
    seed: int = 20261121

    def __post_init__(self) -> None:
        if self.messages < 1:
            raise ValueError("the demo needs at least one message")
        for name in ("duplicate_ratio", "poison_ratio", "short_lived_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.poison_ratio + self.short_lived_ratio > 1.0:
            raise ValueError("poison_ratio + short_lived_ratio must not exceed 1")

    def messages_for(self, prefix: str) -> list[Planned]:
        """The plan for one address; ``prefix`` keeps duplicate ids apart per address."""
        rng = random.Random(f"{self.seed}:{prefix}")
        n = self.messages
        indexes = list(range(n))
        rng.shuffle(indexes)
        poison = set(indexes[:round(n * self.poison_ratio)])
        short = set(indexes[len(poison):len(poison) + round(n * self.short_lived_ratio)])
        resent = set(rng.sample(range(n), round(n * self.duplicate_ratio)))
        planned = []
        for i in range(n):
            kind = Kind.POISON if i in poison else Kind.SHORT_LIVED if i in short else Kind.NORMAL
            planned.append(Planned(i, kind, f"{prefix}-{i}", i in resent))
        return planned


def expected_fates(planned: list[Planned]) -> Counter[str]:
    """How many messages should end handled, dead-lettered, expired; and copies rejected."""
    fates: Counter[str] = Counter()
    for item in planned:
        fates[{Kind.NORMAL: "handled", Kind.POISON: "dead_lettered",
               Kind.SHORT_LIVED: "expired"}[item.kind]] += 1
        fates["duplicate_rejected"] += item.resent
    return fates
