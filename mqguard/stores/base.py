"""The one protocol behind all shared state.

Everything the plugins must share between processes, or keep across restarts,
goes through a :class:`Store`: duplicate-ID rings, delivery counts, scheduled
redeliveries, consumer audit windows and consumer presence (more arrive with later features:
the expiry index). :class:`~mqguard.stores.memory.MemoryStore`
is the embedded default for one process; :class:`~mqguard.stores.redis.RedisStore`
serves anything shared or restart-proof. ``tests/stores/test_contract.py`` runs
the same suite against both, so the semantics below are the contract.

Names (``cache``, ``queue``, ``scope``) are opaque strings chosen by the plugins, usually
an address or queue name. Every key of one name lives in one Redis Cluster hash slot.

Failure semantics: a :class:`~mqguard.errors.StoreError` from a call that changes
state (``ring_check_and_add``, ``ring_add_all_or_none``, ``ring_reserve``, ``delivery_count_incr``,
``schedule_claim_due``) means the change may or may not have been applied; callers
must treat the outcome as unknown (the pipeline leaves the message unacknowledged,
so the broker redelivers it). ``audit_mark`` and ``audit_forget`` are idempotent, so
after a StoreError they may simply be called again. Every process sharing a store
must agree on a ring's capacity (``id-cache-size``): a call with another capacity
resizes the ring; likewise on an audit window's size: a mark with another size
starts that window afresh.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

#: Audit sequence numbers must stay below this: RedisStore's scripts compute in Lua doubles,
#: exact for integers up to 2**53. A producer numbering from 0 never gets near it.
AUDIT_SEQUENCE_LIMIT: Final = 2**53


@dataclass(frozen=True, slots=True)
class RingStats:
    """Capacity and fill of one duplicate-ID ring."""

    name: str
    capacity: int
    count: int


class RingOutcome(enum.IntEnum):
    """What :meth:`Store.ring_reserve` (or :meth:`Store.ring_lookup`) found for one id."""

    #: Not held, or held by a reservation older than ``pending_ms`` (its sender is
    #: presumed dead): ``ring_reserve`` reserved it for the caller.
    NEW = 0
    #: Held and confirmed, or earlier in the same call: a duplicate.
    DUPLICATE = 1
    #: Reserved by a send that is not confirmed yet (younger than ``pending_ms``): the
    #: outcome of that send is unknown, so this one can be neither accepted nor dropped.
    IN_FLIGHT = 2


def check_pending_ms(pending_ms: int) -> None:
    """ValueError unless ``pending_ms`` >= 1 (reservations, all stores)."""
    if pending_ms < 1:
        raise ValueError(f"ring pending_ms must be >= 1, got {pending_ms}")


@dataclass(frozen=True, slots=True)
class ScheduledItem:
    """A payload due at ``due_ms`` (epoch ms), e.g. a message awaiting redelivery."""

    item_id: str
    payload: bytes
    due_ms: int


def check_audit_sequences(sequences: Sequence[int]) -> None:
    """ValueError unless every sequence is in ``[0, AUDIT_SEQUENCE_LIMIT)`` (all stores)."""
    for seq in sequences:
        if not 0 <= seq < AUDIT_SEQUENCE_LIMIT:
            raise ValueError(f"audit sequence numbers must be >= 0 and < 2**53, got {seq}")


def check_presence_ttl(ttl_ms: int) -> None:
    """ValueError unless ``ttl_ms`` >= 1 (:meth:`Store.presence_beat`, all stores)."""
    if ttl_ms < 1:
        raise ValueError(f"presence ttl_ms must be >= 1, got {ttl_ms}")


def check_audit_mark(sequences: Sequence[int], window: int, ttl_ms: int) -> None:
    """The argument checks of :meth:`Store.audit_mark`, the same in every store."""
    check_audit_sequences(sequences)
    if window < 1:
        raise ValueError(f"audit window must be >= 1, got {window}")
    if ttl_ms < 1:
        raise ValueError(f"audit ttl_ms must be >= 1, got {ttl_ms}")


@runtime_checkable
class Store(Protocol):
    """Shared state. Implementations must be safe to call from several threads."""

    # -- duplicate-ID rings (Artemis DuplicateIDCacheImpl) -----------------------
    #
    # A ring is a fixed-capacity circular cache of ids (opaque bytes, in practice
    # fixed-size digests). Adding to a full ring overwrites the oldest slot; ids
    # leave only by overwrite, resize or clear. Every call that takes ``capacity``
    # first brings the ring to that capacity: if it shrank, the newest ids are kept
    # and the oldest deleted (Artemis load()). ``capacity`` must be >= 1.

    def ring_check_and_add(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        """Atomically, for each id in order: report whether it is a duplicate (already in
        the ring, or earlier in ``ids``) and add it when it is not. One flag per id."""
        ...

    def ring_add_all_or_none(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        """Atomically: when no id is a duplicate, add them all; otherwise add none.
        Returns the duplicate flags (all False means they were added). Used for a
        transaction's ids at COMMIT."""
        ...

    def ring_contains(self, name: str, ids: Sequence[bytes]) -> list[bool]:
        """Membership of each id (reserved or confirmed), without changing anything."""
        ...

    # Two-phase use (the duplicate_detection plugin): an id is *reserved* when its send is
    # decided and *confirmed* once the broker has the message, or *released* when the send
    # failed, so that a retry of a send that never reached the broker is not taken for a
    # duplicate (Artemis deletes the id from the cache when the storing transaction rolls
    # back: DuplicateIDCacheImpl.deleteFromCache). A reservation older than ``pending_ms``
    # belongs to a sender presumed dead and may be taken over. Reservation times are
    # measured on one clock per store (Redis: the server's ``TIME``).

    def ring_reserve(self, name: str, ids: Sequence[bytes], capacity: int, pending_ms: int, *,
                     confirm: Sequence[bytes] = (), all_or_none: bool = False
                     ) -> list[RingOutcome]:
        """Atomically: first confirm the ids of ``confirm`` (as :meth:`ring_confirm`: a
        caller piggybacks the confirmations it owes on its next reservation), then, for each
        id of ``ids`` in order, reserve it when it is NEW (taking a slot, as
        :meth:`ring_check_and_add` adds) and report what was found. With ``all_or_none``
        nothing is reserved unless every id is NEW (a transaction's ids at COMMIT).
        ``pending_ms`` < 1 raises ValueError before anything changes."""
        ...

    def ring_confirm(self, name: str, ids: Sequence[bytes]) -> None:
        """Turn reservations into confirmed entries. Ids not reserved (confirmed already,
        released, evicted, unknown) are left alone, so a retry is safe."""
        ...

    def ring_release(self, name: str, ids: Sequence[bytes]) -> int:
        """Delete reserved (not confirmed) ids from the ring, freeing their slots; returns how
        many were deleted. Confirmed and unknown ids are left alone; idempotent."""
        ...

    def ring_lookup(self, name: str, ids: Sequence[bytes], pending_ms: int
                    ) -> list[RingOutcome]:
        """What :meth:`ring_reserve` would find for each id (duplicates within ``ids`` not
        counted), without changing anything."""
        ...

    def ring_ids(self, name: str) -> list[bytes]:
        """The ids held, oldest first."""
        ...

    def ring_stats(self, name: str) -> RingStats | None:
        """Capacity and count, or None when the ring does not exist."""
        ...

    def ring_names(self) -> list[str]:
        """Names of every existing ring, sorted."""
        ...

    def ring_resize(self, name: str, capacity: int) -> int:
        """Change the capacity, keeping the newest ids; returns how many were deleted."""
        ...

    def ring_clear(self, name: str) -> bool:
        """Delete the ring; True when it existed."""
        ...

    # -- delivery counts -------------------------------------------------------

    def delivery_count_incr(self, queue: str, message_id: str) -> int:
        """Add one delivery of ``message_id`` on ``queue``; returns the new count."""
        ...

    def delivery_count_get(self, queue: str, message_id: str) -> int:
        """Deliveries recorded so far (0 when none; a settled count still counts)."""
        ...

    def delivery_count_settle(self, queue: str, message_ids: Sequence[str],
                              grace_ms: int) -> None:
        """The messages reached their fate: forget their counts after ``grace_ms``.

        Until then a redelivery (:meth:`delivery_count_incr`) goes on counting from the
        settled count, as the ack that settled it may never reach the broker. Each call also
        forgets counts whose grace has passed (the store's clock), so counts settled by a
        process that died are forgotten all the same. Ids without a count are ignored.
        """
        ...

    def delivery_count_clear(self, queue: str, message_id: str) -> None:
        """Forget the count now."""
        ...

    # -- scheduled items (redeliveries) --------------------------------------------

    def schedule_add(self, queue: str, item_id: str, payload: bytes, due_ms: int) -> None:
        """Schedule (or re-schedule) ``item_id`` for ``due_ms``."""
        ...

    def schedule_claim_due(self, queue: str, now_ms: int, limit: int,
                           lease_ms: int) -> list[ScheduledItem]:
        """Atomically take up to ``limit`` items due at ``now_ms``, oldest due first, and
        push their due time to ``now_ms + lease_ms``: a claimer that dies before
        :meth:`schedule_remove` loses nothing, the items fall due again."""
        ...

    def schedule_remove(self, queue: str, item_id: str) -> bool:
        """Remove an item (done with it); True when it was there."""
        ...

    def schedule_count(self, queue: str) -> int:
        """Items scheduled on ``queue``, due or not."""
        ...

    # -- consumer audit windows (ActiveMQ ActiveMQMessageAudit) -----------------------
    #
    # The store-backed twin of :class:`~mqguard.sequence_window.SequenceWindow`: a
    # consumer taking over from a crashed one suppresses what the crashed one handled.
    # ``scope`` is usually the destination. Per (scope, producer id) a window remembers
    # which of the newest ``window`` sequence numbers are marked (ints from 0 to below
    # AUDIT_SEQUENCE_LIMIT). Marking above the highest marked sequence slides the window
    # forward and forgets the marks that fall out of it; a sequence older than the
    # window reads as not marked, and marking it changes nothing. A window is forgotten
    # whole ``ttl_ms`` after its last mark, which bounds the memory of producers that
    # went away; an implementation may also forget the least recently marked windows
    # when it holds very many. A mark with a ``window`` other than the stored window's
    # size drops the stored marks and starts afresh with the new size. A sequence out of
    # range, ``window`` < 1 or ``ttl_ms`` < 1 raises ValueError before anything changes.

    def audit_seen(self, scope: str, producer_id: str, sequences: Sequence[int]) -> list[bool]:
        """For each sequence, whether it is marked in the window of (scope, producer id).
        Reads only: an unknown or expired window has nothing marked."""
        ...

    def audit_mark(self, scope: str, producer_id: str, sequences: Sequence[int], window: int,
                   ttl_ms: int) -> None:
        """Atomically mark the sequences (the handler succeeded for them), creating the
        window if needed, and forget the window ``ttl_ms`` from now unless marked again.
        The outcome does not depend on the order of ``sequences``, and repeating a call
        only extends the expiry again, so a retry is safe. An empty batch changes nothing."""
        ...

    def audit_forget(self, scope: str, producer_id: str, sequences: Sequence[int]) -> None:
        """Un-mark the sequences (a rolled-back delivery): the window neither moves nor
        has its expiry extended. Unknown windows and sequences are ignored; idempotent."""
        ...

    # -- consumer presence (load balancing, docs/load-balancing.md) -----------------------
    #
    # Who consumes a queue, shared by every process: each consumer (``member``, an opaque
    # string unique to it) beats with some ``info`` (bytes; mqguard stores its group, node and
    # selector as JSON) and is live until ``ttl_ms`` after its last beat. ``scope`` is the
    # queue name, so presence shares the hash slot of the address's other keys. Expiry is
    # measured on one clock per store (Redis: the server's ``TIME``), so processes with skewed
    # clocks agree. ``ttl_ms`` < 1 raises ValueError before anything changes.

    def presence_beat(self, scope: str, member: str, info: bytes, ttl_ms: int) -> None:
        """Register ``member`` (or refresh it and replace its info) until ``ttl_ms`` from now.
        Idempotent: a retry only extends the expiry again."""
        ...

    def presence_live(self, scope: str) -> dict[str, bytes]:
        """The live members of ``scope`` and their info; expired members are forgotten."""
        ...

    def presence_leave(self, scope: str, member: str) -> bool:
        """Forget ``member`` at once (a consumer that closed); True when it was live."""
        ...

    # -- lifecycle ---------------------------------------------------------------

    def ping(self) -> None:
        """Raise :class:`~mqguard.errors.StoreError` when the store is unreachable."""
        ...

    def close(self) -> None:
        """Release connections. Safe to call twice."""
        ...
