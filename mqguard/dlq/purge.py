"""``mqguard dlq purge``: delete dead letters (Artemis ``QueueControl.removeMessages``).

Each selected dead letter gets a ``dlq_purged`` event, then its acknowledgement (reason
KILLED, as Artemis's ``removeMessages`` acknowledges), then an ``acked`` event. The event
comes first: a kill between the two leaves the message in place with its event written,
and the next purge writes it again. Unselected messages are left unacknowledged and come
back to the address when the connection closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqguard.adapter import Adapter
from mqguard.dlq.model import DeadLetter
from mqguard.dlq.reader import DEFAULT_IDLE_MS, DEFAULT_WINDOW, FIRST_WAIT_FACTOR, consuming
from mqguard.dlq.selection import Selection
from mqguard.events import EventType
from mqguard.message import now_ms
from mqguard.pipeline import Guard
from mqguard.verdict import AckReason

__all__ = ["PurgeOptions", "PurgeResult", "purge"]


@dataclass(frozen=True, slots=True)
class PurgeOptions:
    selection: Selection = field(default_factory=Selection)
    limit: int | None = None
    dry_run: bool = False
    batch: int = 100
    idle_ms: int = DEFAULT_IDLE_MS
    #: None: FIRST_WAIT_FACTOR x idle_ms.
    first_wait_ms: int | None = None
    window: int = DEFAULT_WINDOW


@dataclass(slots=True)
class PurgeResult:
    address: str
    purged: int = 0
    skipped: int = 0
    by_original: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "purged": self.purged, "skipped": self.skipped,
                "by_original": self.by_original, "dry_run": self.dry_run,
                "seconds": round(self.seconds, 3)}


def purge(guard: Guard, adapter: Adapter, address: str, options: PurgeOptions | None = None,
          *, progress: Callable[[int], None] | None = None) -> PurgeResult:
    """Delete the selected dead letters of ``address`` on the connected ``adapter``."""
    options = options or PurgeOptions()
    result = PurgeResult(address, dry_run=options.dry_run)
    started = time.perf_counter()
    events = guard.events
    with consuming(adapter, address, window=options.window) as queue:
        first_s = (FIRST_WAIT_FACTOR * options.idle_ms if options.first_wait_ms is None
                   else options.first_wait_ms) / 1000.0
        while options.limit is None or result.purged < options.limit:
            deliveries = queue.take(options.batch, options.idle_ms / 1000.0, first_s)
            first_s = 0.0
            if not deliveries:
                break
            now = now_ms()
            chosen: list[DeadLetter] = []
            for delivery in deliveries:
                letter = DeadLetter.from_delivery(delivery, address)
                full = options.limit is not None and result.purged + len(chosen) >= options.limit
                if full or not options.selection.accepts(letter, now):
                    result.skipped += 1
                else:
                    chosen.append(letter)
            if not options.dry_run and chosen:
                for letter in chosen:
                    events.emit(EventType.DLQ_PURGED, letter.message, queue=address,
                                original_message_id=letter.original_message_id,
                                reason=letter.reason)
                events.flush()
                for letter in chosen:
                    adapter.ack(letter.delivery)
                    events.emit(EventType.ACKED, letter.message, queue=address,
                                ack_reason=AckReason.KILLED.value, handled=False)
            for letter in chosen:
                source = letter.original_address or "(unknown)"
                result.by_original[source] = result.by_original.get(source, 0) + 1
            result.purged += len(chosen)
            if progress is not None and chosen:
                progress(len(chosen))
    result.seconds = time.perf_counter() - started
    return result
