"""Which dead letters an operation takes: ``--id``, ``--original``, ``--older-than``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from mqguard.dlq.model import DeadLetter
from mqguard.matching import is_wildcard, matches

__all__ = ["Selection"]


@dataclass(frozen=True, slots=True)
class Selection:
    """A filter on dead letters; empty, it takes every one."""

    #: Dead-letter ids, original message ids or broker message ids (any of them matches).
    ids: frozenset[str] = field(default_factory=frozenset)
    #: Original address, or an address-settings match key (``orders.#``).
    original: str | None = None
    #: Only dead letters moved at least this long ago (ms); ones without a known move time
    #: never qualify.
    older_than_ms: int | None = None

    @classmethod
    def of(cls, ids: Collection[str] = (), original: str | None = None,
           older_than_ms: int | None = None) -> Selection:
        return cls(frozenset(ids), original, older_than_ms)

    def accepts(self, letter: DeadLetter, now: int) -> bool:
        if self.ids and not self.ids & {letter.message_id, letter.original_message_id,
                                        letter.message.broker_message_id}:
            return False
        if self.original is not None:
            source = letter.original_address
            if source is None:
                return False
            if source != self.original and not (is_wildcard(self.original)
                                                and matches(self.original, source)):
                return False
        if self.older_than_ms is not None:
            age = letter.age_ms(now)
            if age is None or age < self.older_than_ms:
                return False
        return True
