"""In-process store: the embedded default, for one process only.

Fast (a dict and a list per ring) and exact, but private to the process and gone
when it exits: use :class:`~mqguard.stores.redis.RedisStore` for anything shared
by several producers, consumers or sidecars, or that must survive a restart.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from mqguard.sequence_window import SequenceWindow
from mqguard.stores.base import (
    RingOutcome,
    RingStats,
    ScheduledItem,
    check_audit_mark,
    check_audit_sequences,
    check_pending_ms,
    check_presence_ttl,
)

#: Most audit windows kept at once; beyond it the least recently marked one is forgotten, as
#: its TTL would forget it eventually. A 2048-sequence window with its keys costs ~550 bytes
#: (measured), so ~55 MB at most.
MAX_AUDIT_WINDOWS: Final = 100_000


class _Ring:
    """Fixed-capacity FIFO id cache: an insertion-ordered membership dict.

    ``pending`` maps reserved (unconfirmed) ids to their reservation time (monotonic
    seconds). A released id leaves the FIFO, freeing its place, as in RedisStore.
    """

    __slots__ = ("capacity", "members", "pending")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # OrderedDict (not dict) because evicting the oldest entry must stay O(1).
        self.members: OrderedDict[bytes, None] = OrderedDict()
        self.pending: dict[bytes, float] = {}

    def add(self, item: bytes) -> None:
        members = self.members
        if len(members) >= self.capacity:
            old, _ = members.popitem(last=False)
            if self.pending:
                self.pending.pop(old, None)
        members[item] = None

    def remove(self, item: bytes) -> None:
        del self.members[item]
        self.pending.pop(item, None)

    def outcome(self, item: bytes, now: float, pending_s: float) -> RingOutcome:
        if item not in self.members:
            return RingOutcome.NEW
        since = self.pending.get(item)
        if since is None:
            return RingOutcome.DUPLICATE
        return RingOutcome.NEW if now - since >= pending_s else RingOutcome.IN_FLIGHT

    def ordered(self) -> list[bytes]:
        return list(self.members)

    def resized(self, capacity: int) -> tuple[_Ring, int]:
        items = self.ordered()
        keep = items[-capacity:] if capacity < len(items) else items
        ring = _Ring(capacity)
        for item in keep:
            ring.add(item)
            if item in self.pending:
                ring.pending[item] = self.pending[item]
        return ring, len(items) - len(keep)


def _check_capacity(capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"ring capacity must be >= 1, got {capacity}")


class _Audit:
    """One (scope, producer) audit window and when it expires (monotonic seconds)."""

    __slots__ = ("expires", "window")

    def __init__(self, window: SequenceWindow, expires: float) -> None:
        self.window = window
        self.expires = expires



class MemoryStore:
    """:class:`~mqguard.stores.base.Store` kept in this process's memory."""

    def __init__(self, *, max_audit_windows: int = MAX_AUDIT_WINDOWS) -> None:
        if max_audit_windows < 1:
            raise ValueError(f"max_audit_windows must be >= 1, got {max_audit_windows}")
        self._lock = threading.Lock()
        self._rings: dict[str, _Ring] = {}
        self._counts: dict[tuple[str, str], int] = {}
        # Settled counts waiting out their grace: key -> end of it (monotonic seconds), in
        # settling order (a later settle moves the key to the end; ends only grow with it,
        # as the grace is the caller's constant in practice, so the oldest come first).
        self._settled: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._scheduled: dict[str, dict[str, ScheduledItem]] = {}
        # Least recently marked first: an LRU bound, and roughly expiry order too.
        self._audits: OrderedDict[tuple[str, str], _Audit] = OrderedDict()
        self._max_audit_windows = max_audit_windows
        # scope -> member -> (expires, monotonic seconds; info)
        self._presence: dict[str, dict[str, tuple[float, bytes]]] = {}

    # -- rings -------------------------------------------------------------------

    def _ring(self, name: str, capacity: int) -> _Ring:
        _check_capacity(capacity)
        ring = self._rings.get(name)
        if ring is None:
            ring = self._rings[name] = _Ring(capacity)
        elif ring.capacity != capacity:
            ring = self._rings[name] = ring.resized(capacity)[0]
        return ring

    def ring_check_and_add(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        with self._lock:
            ring = self._ring(name, capacity)
            # _Ring.add inlined: this loop is the hot path of every guarded send.
            members, pending, popitem = ring.members, ring.pending, ring.members.popitem
            out: list[bool] = []
            append = out.append
            for item in ids:
                if item in members:
                    append(True)
                    continue
                if len(members) >= capacity:
                    evicted, _ = popitem(last=False)
                    if pending:
                        pending.pop(evicted, None)
                members[item] = None
                append(False)
            return out

    def ring_add_all_or_none(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        with self._lock:
            ring = self._ring(name, capacity)
            seen: set[bytes] = set()
            flags: list[bool] = []
            for item in ids:
                flags.append(item in ring.members or item in seen)
                seen.add(item)
            if not any(flags):
                for item in ids:
                    ring.add(item)
            return flags

    def ring_reserve(self, name: str, ids: Sequence[bytes], capacity: int, pending_ms: int, *,
                     confirm: Sequence[bytes] = (), all_or_none: bool = False
                     ) -> list[RingOutcome]:
        check_pending_ms(pending_ms)
        now, pending_s = time.monotonic(), pending_ms / 1000
        with self._lock:
            ring = self._ring(name, capacity)
            pending = ring.pending
            for item in confirm:
                pending.pop(item, None)
            if all_or_none:
                seen: set[bytes] = set()
                out: list[RingOutcome] = []
                for item in ids:
                    out.append(RingOutcome.DUPLICATE if item in seen
                               else ring.outcome(item, now, pending_s))
                    seen.add(item)
                if all(o is RingOutcome.NEW for o in out):
                    for item in ids:
                        self._reserve(ring, item, now)
                return out
            return self._reserve_each(ring, ids, capacity, now, pending_s)

    @staticmethod
    def _reserve_each(ring: _Ring, ids: Sequence[bytes], capacity: int, now: float,
                      pending_s: float) -> list[RingOutcome]:
        # _Ring.add and outcome inlined: this loop is the hot path of every guarded send.
        new, duplicate, in_flight = RingOutcome.NEW, RingOutcome.DUPLICATE, RingOutcome.IN_FLIGHT
        members, pending, popitem = ring.members, ring.pending, ring.members.popitem
        fresh: set[bytes] = set()  # reserved by this call: a repeat is a duplicate
        out: list[RingOutcome] = []
        append = out.append
        for item in ids:
            if item in members:
                since = pending.get(item)
                if since is None or item in fresh:
                    append(duplicate)
                elif now - since < pending_s:
                    append(in_flight)
                else:  # a stale reservation, taken over in place
                    pending[item] = now
                    fresh.add(item)
                    append(new)
                continue
            if len(members) >= capacity:
                evicted, _ = popitem(last=False)
                pending.pop(evicted, None)
            members[item] = None
            pending[item] = now
            fresh.add(item)
            append(new)
        return out

    @staticmethod
    def _reserve(ring: _Ring, item: bytes, now: float) -> None:
        if item not in ring.members:  # else a stale reservation, taken over in place
            ring.add(item)
        ring.pending[item] = now

    def ring_confirm(self, name: str, ids: Sequence[bytes]) -> None:
        with self._lock:
            ring = self._rings.get(name)
            if ring is not None:
                for item in ids:
                    ring.pending.pop(item, None)

    def ring_release(self, name: str, ids: Sequence[bytes]) -> int:
        with self._lock:
            ring = self._rings.get(name)
            if ring is None:
                return 0
            released = 0
            for item in ids:
                if item in ring.pending:
                    ring.remove(item)
                    released += 1
            return released

    def ring_lookup(self, name: str, ids: Sequence[bytes], pending_ms: int
                    ) -> list[RingOutcome]:
        check_pending_ms(pending_ms)
        now, pending_s = time.monotonic(), pending_ms / 1000
        with self._lock:
            ring = self._rings.get(name)
            if ring is None:
                return [RingOutcome.NEW] * len(ids)
            return [ring.outcome(item, now, pending_s) for item in ids]

    def ring_contains(self, name: str, ids: Sequence[bytes]) -> list[bool]:
        with self._lock:
            ring = self._rings.get(name)
            if ring is None:
                return [False] * len(ids)
            return [item in ring.members for item in ids]

    def ring_ids(self, name: str) -> list[bytes]:
        with self._lock:
            ring = self._rings.get(name)
            return ring.ordered() if ring else []

    def ring_stats(self, name: str) -> RingStats | None:
        with self._lock:
            ring = self._rings.get(name)
            return RingStats(name, ring.capacity, len(ring.members)) if ring else None

    def ring_names(self) -> list[str]:
        with self._lock:
            return sorted(self._rings)

    def ring_resize(self, name: str, capacity: int) -> int:
        _check_capacity(capacity)
        with self._lock:
            ring = self._rings.get(name)
            if ring is None:
                self._rings[name] = _Ring(capacity)
                return 0
            self._rings[name], deleted = ring.resized(capacity)
            return deleted

    def ring_clear(self, name: str) -> bool:
        with self._lock:
            return self._rings.pop(name, None) is not None

    # -- delivery counts -------------------------------------------------------

    def delivery_count_incr(self, queue: str, message_id: str) -> int:
        key = (queue, message_id)
        with self._lock:
            count = self._counts.get(key, 0) + 1
            self._counts[key] = count
            self._settled.pop(key, None)  # a redelivery after all: counting goes on
            return count

    def delivery_count_get(self, queue: str, message_id: str) -> int:
        return self._counts.get((queue, message_id), 0)

    def delivery_count_settle(self, queue: str, message_ids: Sequence[str],
                              grace_ms: int) -> None:
        now = time.monotonic()
        end = now + max(0, grace_ms) / 1000
        with self._lock:
            settled, counts = self._settled, self._counts
            for message_id in message_ids:
                key = (queue, message_id)
                if key in counts:
                    settled[key] = end
                    settled.move_to_end(key)
            while settled:
                key, due = next(iter(settled.items()))
                if due > now:
                    break
                del settled[key]
                counts.pop(key, None)

    def delivery_count_clear(self, queue: str, message_id: str) -> None:
        with self._lock:
            self._counts.pop((queue, message_id), None)
            self._settled.pop((queue, message_id), None)

    # -- scheduled items ---------------------------------------------------------

    def schedule_add(self, queue: str, item_id: str, payload: bytes, due_ms: int) -> None:
        with self._lock:
            self._scheduled.setdefault(queue, {})[item_id] = ScheduledItem(item_id, payload, due_ms)

    def schedule_claim_due(self, queue: str, now_ms: int, limit: int,
                           lease_ms: int) -> list[ScheduledItem]:
        with self._lock:
            items = self._scheduled.get(queue, {})
            due = [item for item in items.values() if item.due_ms <= now_ms]
            claimed = heapq.nsmallest(limit, due, key=lambda i: (i.due_ms, i.item_id))
            for item in claimed:
                items[item.item_id] = ScheduledItem(item.item_id, item.payload, now_ms + lease_ms)
            return claimed

    def schedule_remove(self, queue: str, item_id: str) -> bool:
        with self._lock:
            return self._scheduled.get(queue, {}).pop(item_id, None) is not None

    def schedule_count(self, queue: str) -> int:
        return len(self._scheduled.get(queue, {}))

    # -- consumer audit windows ----------------------------------------------------------

    def _live_audit(self, key: tuple[str, str], now: float) -> _Audit | None:
        # Expiry is lazy: a window past its TTL is dropped when next looked at (or evicted).
        audit = self._audits.get(key)
        if audit is not None and audit.expires <= now:
            del self._audits[key]
            return None
        return audit

    def audit_seen(self, scope: str, producer_id: str, sequences: Sequence[int]) -> list[bool]:
        check_audit_sequences(sequences)
        with self._lock:
            audit = self._live_audit((scope, producer_id), time.monotonic())
            if audit is None:
                return [False] * len(sequences)
            return [audit.window.seen(seq) for seq in sequences]

    def audit_mark(self, scope: str, producer_id: str, sequences: Sequence[int], window: int,
                   ttl_ms: int) -> None:
        check_audit_mark(sequences, window, ttl_ms)
        if not sequences:
            return
        key = (scope, producer_id)
        with self._lock:
            now = time.monotonic()
            audit = self._live_audit(key, now)
            if audit is None or audit.window.size != window:
                audit = self._audits[key] = _Audit(SequenceWindow(window), now)
            for seq in sequences:
                audit.window.mark(seq)
            audit.expires = now + ttl_ms / 1000
            self._audits.move_to_end(key)
            # Drop expired windows from the old end (cheap, and keeps memory near the live
            # set when TTLs are alike), then enforce the bound.
            while self._audits:
                oldest = next(iter(self._audits.values()))
                if oldest.expires > now and len(self._audits) <= self._max_audit_windows:
                    break
                self._audits.popitem(last=False)

    def audit_forget(self, scope: str, producer_id: str, sequences: Sequence[int]) -> None:
        check_audit_sequences(sequences)
        with self._lock:
            audit = self._live_audit((scope, producer_id), time.monotonic())
            if audit is not None:
                for seq in sequences:
                    audit.window.forget(seq)

    # -- consumer presence -------------------------------------------------------------

    def presence_beat(self, scope: str, member: str, info: bytes, ttl_ms: int) -> None:
        check_presence_ttl(ttl_ms)
        with self._lock:
            members = self._presence.setdefault(scope, {})
            members[member] = (time.monotonic() + ttl_ms / 1000, bytes(info))

    def presence_live(self, scope: str) -> dict[str, bytes]:
        with self._lock:
            members = self._presence.get(scope)
            if not members:
                return {}
            now = time.monotonic()
            for member in [m for m, (expires, _) in members.items() if expires <= now]:
                del members[member]
            if not members:
                del self._presence[scope]
                return {}
            return {member: info for member, (_, info) in members.items()}

    def presence_leave(self, scope: str, member: str) -> bool:
        with self._lock:
            members = self._presence.get(scope, {})
            entry = members.pop(member, None)
            return entry is not None and entry[0] > time.monotonic()

    # -- lifecycle ---------------------------------------------------------------

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None
