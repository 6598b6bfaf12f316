"""``duplicate_detection``: Artemis's duplicate-ID cache, shared through the store.

Semantics follow ActiveMQ Artemis (``PostOfficeImpl.checkDuplicateID``,
``InMemoryDuplicateIDCache`` / ``PersistentDuplicateIDCache``):

* On an address with ``duplicate-id-from = "content"`` a message carrying no id gets
  one from its content (:func:`mqguard.digest.content_id`: the body and the headers named
  in ``duplicate-id-headers``), stamped as its ``_AMQ_DUPL_ID`` before the check below;
  an mqguard extension (Artemis has no content-based detection).
* A message carrying ``_AMQ_DUPL_ID`` (or one of the extra header names in
  ``[plugins.duplicate_detection] headers``; over MQTT 5 a user property of the
  same name) is checked against the circular cache of its address, of size
  ``id-cache-size`` (0 turns detection off for that address). The cache holds
  8-byte digests (:mod:`mqguard.digest`); ids leave only when overwritten or
  cleared, never on acknowledgement or expiry.
* Outside a transaction a duplicate is not routed; the send still succeeds
  for the client (Artemis behaviour), with a WARN line and a
  ``duplicate_rejected`` event.
* Inside a transaction the ids become visible only at COMMIT, atomically with
  a re-check (another producer may have sent the same id meanwhile); a
  duplicate makes the transaction rollback-only and COMMIT fails with
  ``DUPLICATE_ID_REJECTED``. ABORT adds nothing.
* ``_AMQ_BRIDGE_DUP`` is checked first, against the separate cache
  ``BRIDGE.<address>``, with an immediate check-and-add (Artemis
  ``atomicVerify``, in a transaction too); when present, ``_AMQ_DUPL_ID`` is not
  checked. ``BRIDGE.<address>`` is a cache of its own: its size is the
  ``id-cache-size`` of the address settings matching ``BRIDGE.<address>``
  (Artemis ``PostOfficeImpl.getDuplicateIDCache``), not ``<address>``'s, so bridge
  ids are checked even where ``<address>`` turns detection off.
* Every id a transaction reserved, of both kinds, is confirmed when its COMMIT is
  confirmed and released when it rolls back, is aborted or fails (Artemis
  ``AddDuplicateIDOperation.beforeRollback`` -> ``deleteFromCache``), so a committed
  bridge id is never left "in flight" and a rolled-back one never blocks the retry.

Where this differs from Artemis on purpose, see docs/artemis-compat.md.

Two-phase ids (where mqguard cannot be Artemis): Artemis adds an id to the cache in
the same storage transaction as the message, so a send that fails adds nothing. Here the
cache (the store) and the message (the broker) are two systems, so an id is *reserved*
when its send is decided, *confirmed* once the broker confirmed the send
(``after_send``; confirmations are coalesced: piggybacked on the next reservation of the
same cache, else flushed by a background thread within ``confirm-flush-ms``) and
*released* when the send failed (``on_send_exception``), so a retry of a send that never
reached the broker is not mistaken for a duplicate and lost. A second send of an id whose
first send is still unconfirmed is refused (``DUPLICATE_ID_IN_FLIGHT``: its fate is
unknown, so it can be neither routed nor dropped; the sender retries). A reservation
older than ``pending-timeout-ms`` belongs to a sender presumed dead (killed between the
reservation and the broker's confirmation) and is taken over by the next sender.

The plugin runs ``trylast``: a message another plugin rejects does not take a
slot in the cache.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from mqguard import hookimpl
from mqguard.config import MqguardConfig, PluginOptions, parse_plugin_options
from mqguard.context import HookContext
from mqguard.digest import CONTENT_ID_PREFIX, content_id, id_digest
from mqguard.errors import StoreError
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER, DUPLICATE_ID_HEADER, Message
from mqguard.stores.base import RingOutcome, Store
from mqguard.verdict import Verdict

if TYPE_CHECKING:
    from mqguard.pipeline import Guard

log = logging.getLogger("mqguard.plugins.duplicate_detection")

NAME = "duplicate_detection"
DUPLICATE_EVENT = "duplicate_rejected"
#: Artemis's error code for a transaction that carried a duplicate.
TX_ERROR_CODE = "DUPLICATE_ID_REJECTED"
#: Error code of a send refused because the same id's earlier send is not confirmed yet.
IN_FLIGHT_CODE = "DUPLICATE_ID_IN_FLIGHT"
IN_FLIGHT_EVENT = "duplicate_in_flight"
#: Longest duplicate id accepted; longer ones are refused (ids come from the network).
MAX_ID_LENGTH = 4096
#: Confirmations kept for a later flush while the store is unreachable; beyond this the
#: oldest are dropped (their reservations then go stale and may be taken over).
MAX_OWED_CONFIRMATIONS = 100_000
#: Digests of batch-reserved ids kept for their ``after_send`` (see
#: :attr:`DuplicateDetectionPlugin._reserved_digests`); past this many the memo is cleared.
MAX_MEMO_DIGESTS = 50_000


def bridge_cache_name(address: str) -> str:
    return f"BRIDGE.{address}"


@dataclass
class _StagedTransaction:
    """Ids sent inside one transaction, per cache, in order."""

    #: ``_AMQ_DUPL_ID`` digests per address: reserved only at COMMIT.
    ids: dict[str, list[bytes]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    duplicate_ids: dict[bytes, str] = field(default_factory=dict)
    #: Caches whose ids were reserved at COMMIT (released again if the COMMIT fails).
    reserved: list[str] = field(default_factory=list)
    #: ``_AMQ_BRIDGE_DUP`` digests per ``BRIDGE.<address>`` cache, reserved when sent (as
    #: Artemis adds them at once): confirmed at COMMIT, released on rollback.
    bridge: dict[str, list[bytes]] = field(default_factory=dict)
    bridge_capacity: dict[str, int] = field(default_factory=dict)
    bridge_ids: dict[tuple[str, bytes], str] = field(default_factory=dict)


#: Open transactions are told apart by sender and transaction id: sidecar clients choose
#: their own transaction ids, and two connections may both use ``tx1``.
_TxKey = tuple[str | None, str]


class DuplicateDetectionOptions(PluginOptions):
    """``[plugins.duplicate_detection]``."""

    #: Further header names (MQTT 5 user properties) whose values are duplicate ids, besides
    #: ``_AMQ_DUPL_ID``; the first one a message carries is used.
    headers: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    #: A reserved id whose send was not confirmed within this time (ms) belongs to a sender
    #: presumed dead, and the next sender of the id takes it over. Longer than any send's
    #: confirmation takes; shorter means a crashed sender's retries wait less.
    pending_timeout_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    #: Longest a confirmation waits (ms) before a background flush when no reservation of
    #: the same cache carries it first.
    confirm_flush_ms: int = Field(default=20, ge=1, le=10_000)


class DuplicateDetectionPlugin:
    """One instance per guard: the staged ids of open transactions and the confirmations
    owed to the store."""

    def __init__(self) -> None:
        self.extra_headers: tuple[str, ...] = ()
        self.pending_ms = DuplicateDetectionOptions().pending_timeout_ms
        self._staged: dict[_TxKey, _StagedTransaction] = {}
        # (cache, digest) -> sender, for reservations of senders with ordered confirmations.
        self._held: dict[tuple[str, bytes], str] = {}
        self._lock = threading.Lock()
        self._confirmations = _Confirmations(DuplicateDetectionOptions().confirm_flush_ms)
        #: duplicate id -> its digest, for ids reserved by a batch and not settled yet: the
        #: digest ``after_send`` confirms is then looked up instead of hashed again (the
        #: settling of a batch is on its critical path). A memo only: a missing entry is
        #: recomputed, so entries of messages that never settle are merely cleared in bulk.
        self._reserved_digests: dict[str, bytes] = {}

    @hookimpl
    def configure(self, config: MqguardConfig) -> None:
        options = parse_plugin_options(config, NAME, DuplicateDetectionOptions)
        self.extra_headers = tuple(h for h in options.headers if h != DUPLICATE_ID_HEADER)
        self.pending_ms = options.pending_timeout_ms
        self._confirmations.flush_s = options.confirm_flush_ms / 1000

    @hookimpl
    def guard_stopping(self, guard: Guard) -> None:
        self._confirmations.stop()

    def duplicate_id_of(self, message: Message) -> str | None:
        if message.duplicate_id is not None:
            return message.duplicate_id
        for header in self.extra_headers:
            value = message.headers.get(header)
            if value is not None:
                return value
        return None

    @staticmethod
    def _bridge_capacity(ctx: HookContext, address: str) -> int:
        """``id-cache-size`` of ``BRIDGE.<address>``: the settings matching that name, not
        ``address``'s (Artemis ``resolveIdCacheSize(BRIDGE.<address>)``)."""
        return ctx.guard.settings.resolve(bridge_cache_name(address)).id_cache_size

    @hookimpl(trylast=True)
    def before_send(self, message: Message, ctx: HookContext) -> Verdict | None:
        bridge_id = message.headers.get(BRIDGE_DUPLICATE_ID_HEADER)
        if bridge_id is not None:
            # Artemis: with a bridge id present _AMQ_DUPL_ID is not looked at, even when the
            # bridge cache is off (size 0: a NoOp cache).
            capacity = self._bridge_capacity(ctx, message.address)
            if capacity == 0:
                return None
            if ctx.transaction is not None:
                return self._stage_bridge(message, ctx, bridge_id, capacity)
            return self._check_now(message, ctx, bridge_cache_name(message.address), bridge_id,
                                   capacity)
        capacity = ctx.settings.id_cache_size
        if capacity == 0:
            return None
        duplicate_id = self.duplicate_id_of(message)
        if duplicate_id is None:
            if ctx.settings.duplicate_id_from != "content":
                return None
            # Stamped as the message's _AMQ_DUPL_ID: the batch check, after_send, the events,
            # consumers and a downstream Artemis all see the one id (docs/duplicate-detection.md).
            duplicate_id = message.duplicate_id = content_id(
                message.body, message.headers, ctx.settings.duplicate_id_headers)
        if ctx.transaction is not None:
            return self._stage(message, ctx, duplicate_id, capacity)
        if ctx.batch:
            # Checked with the rest of the batch in one store call per address.
            return self._too_long(duplicate_id)
        return self._check_now(message, ctx, message.address, duplicate_id, capacity)

    @hookimpl
    def before_send_batch(self, messages: list[Message], ctx: HookContext
                          ) -> dict[int, Verdict] | None:
        """One atomic check-and-add per address for every duplicate id of the batch."""
        groups: dict[str, list[tuple[int, str]]] = {}
        for index, message in enumerate(messages):
            if BRIDGE_DUPLICATE_ID_HEADER in message.headers:
                continue  # checked at once in before_send
            duplicate_id = self.duplicate_id_of(message)
            if duplicate_id is not None:
                groups.setdefault(message.address, []).append((index, duplicate_id))
        verdicts: dict[int, Verdict] = {}
        memo = self._reserved_digests
        if len(memo) > MAX_MEMO_DIGESTS:
            memo.clear()
        for address, entries in groups.items():
            capacity = ctx.guard.settings.resolve(address).id_cache_size
            if capacity == 0:
                continue
            digests = [id_digest(dup) for _, dup in entries]
            found = self._reserve(ctx.store, address, digests, capacity, sender=ctx.sender)
            for (index, duplicate_id), digest, outcome in zip(entries, digests, found,
                                                              strict=True):
                if outcome is RingOutcome.NEW:
                    memo[duplicate_id] = digest
                elif outcome is RingOutcome.DUPLICATE:
                    verdicts[index] = self._duplicate(messages[index], address, duplicate_id)
                elif outcome is RingOutcome.IN_FLIGHT:
                    verdicts[index] = self._in_flight(address, duplicate_id)
        return verdicts or None

    def _reserve(self, store: Store, cache: str, digests: list[bytes], capacity: int, *,
                 all_or_none: bool = False, sender: str | None = None) -> list[RingOutcome]:
        """Reserve ``digests``, carrying the confirmations owed to ``cache``."""
        owed = self._confirmations.take(cache)
        try:
            found = store.ring_reserve(cache, digests, capacity, self.pending_ms, confirm=owed,
                                       all_or_none=all_or_none)
        except BaseException:
            self._confirmations.give_back(cache, owed)
            raise
        if sender is None:
            return found
        with self._lock:
            for index, (digest, outcome) in enumerate(zip(digests, found, strict=True)):
                if outcome is RingOutcome.NEW:
                    self._held[(cache, digest)] = sender
                elif (outcome is RingOutcome.IN_FLIGHT
                      and self._held.get((cache, digest)) == sender):
                    # The same ordered stream: this send's fate follows the earlier one's
                    # (if that fails, so does the receipt of this one), so it is a duplicate.
                    found[index] = RingOutcome.DUPLICATE
        return found

    def _settled(self, cache: str, digest: bytes) -> None:
        if self._held:
            with self._lock:
                self._held.pop((cache, digest), None)

    def _confirm_owed(self, store: Store, cache: str) -> None:
        owed = self._confirmations.take(cache)
        if owed:
            try:
                store.ring_confirm(cache, owed)
            except BaseException:
                self._confirmations.give_back(cache, owed)
                raise

    def _in_flight(self, cache: str, duplicate_id: str) -> Verdict:
        log.warning("Duplicate id in flight - message refused, retry later: address=%s "
                    "duplicate_id=%r", cache, duplicate_id)
        return Verdict.reject(
            f"{IN_FLIGHT_CODE}: duplicate id {duplicate_id!r} is reserved in {cache} by a send "
            f"not confirmed yet; retry (a sender silent for {self.pending_ms} ms is taken "
            f"over)", event=IN_FLIGHT_EVENT)

    def _cache_key(self, message: Message, ctx: HookContext) -> tuple[str, bytes] | None:
        """The cache and digest ``before_send`` reserved for ``message``, if any."""
        bridge_id = message.headers.get(BRIDGE_DUPLICATE_ID_HEADER)
        if bridge_id is not None:
            if len(bridge_id) > MAX_ID_LENGTH or self._bridge_capacity(ctx,
                                                                       message.address) == 0:
                return None
            return bridge_cache_name(message.address), id_digest(bridge_id)
        settings = (ctx.settings if ctx.address == message.address
                    else ctx.guard.settings.resolve(message.address))
        if settings.id_cache_size == 0:
            return None
        duplicate_id = self.duplicate_id_of(message)
        if duplicate_id is None or len(duplicate_id) > MAX_ID_LENGTH:
            return None
        digest = self._reserved_digests.pop(duplicate_id, None)
        return message.address, digest if digest is not None else id_digest(duplicate_id)

    @hookimpl
    def after_send(self, message: Message, ctx: HookContext) -> None:
        # A transaction's ids are confirmed together in transaction_ended, a batch's in
        # after_send_batch.
        if ctx.batch or ctx.transaction is not None:
            return
        if (key := self._cache_key(message, ctx)) is not None:
            self._settled(*key)
            self._confirmations.owe(ctx.store, *key)

    @hookimpl
    def after_send_batch(self, messages: list[Message], ctx: HookContext) -> None:
        """Confirm the batch's reserved ids: one lock for all, not one per message."""
        keys = [key for message in messages if (key := self._cache_key(message, ctx)) is not None]
        if not keys:
            return
        if self._held:
            with self._lock:
                for key in keys:
                    self._held.pop(key, None)
        self._confirmations.owe_many(ctx.store, keys)

    @hookimpl
    def on_send_exception(self, message: Message, ctx: HookContext,
                          exception: BaseException) -> None:
        # The broker may or may not have the message; releasing lets a retry through, which
        # at worst sends it twice (the consumer audit's business) instead of losing it.
        if ctx.transaction is not None:
            return  # released, with the rest of the transaction, in transaction_ended
        if (key := self._cache_key(message, ctx)) is not None:
            self._settled(*key)
            self._release(ctx.store, key[0], [key[1]])

    def _release(self, store: Store, cache: str, digests: list[bytes]) -> None:
        try:
            store.ring_release(cache, digests)
        except StoreError as exc:
            log.warning("Could not release %d reserved id(s) of %s after a failed send (%s); "
                        "a retry is refused as in flight until pending-timeout-ms passes",
                        len(digests), cache, exc)

    def _duplicate(self, message: Message, cache: str, duplicate_id: str) -> Verdict:
        log.warning("Duplicate message detected - message will not be routed: address=%s "
                    "duplicate_id=%r message_id=%s", message.address, duplicate_id,
                    message.message_id)
        return Verdict.drop(f"duplicate {_kind(duplicate_id)} {duplicate_id!r} already in the "
                            f"cache of {cache}", event=DUPLICATE_EVENT)

    def _too_long(self, duplicate_id: str) -> Verdict | None:
        if len(duplicate_id) > MAX_ID_LENGTH:
            return Verdict.reject(f"duplicate id is {len(duplicate_id)} characters long; "
                                  f"the limit is {MAX_ID_LENGTH}")
        return None

    def _check_now(self, message: Message, ctx: HookContext, cache: str, duplicate_id: str,
                   capacity: int) -> Verdict | None:
        if (refusal := self._too_long(duplicate_id)) is not None:
            return refusal
        (outcome,) = self._reserve(ctx.store, cache, [id_digest(duplicate_id)], capacity,
                                   sender=ctx.sender)
        if outcome is RingOutcome.NEW:
            return None
        if outcome is RingOutcome.IN_FLIGHT:
            return self._in_flight(cache, duplicate_id)
        if ctx.transaction is not None:
            reason = f"duplicate id {duplicate_id!r} already in the cache of {cache}"
            return Verdict.reject(f"{TX_ERROR_CODE}: {reason}", event=DUPLICATE_EVENT)
        return self._duplicate(message, cache, duplicate_id)

    def _stage(self, message: Message, ctx: HookContext, duplicate_id: str,
               capacity: int) -> Verdict | None:
        if (refusal := self._too_long(duplicate_id)) is not None:
            return refusal
        digest = id_digest(duplicate_id)
        assert ctx.transaction is not None
        with self._lock:
            staged = self._staged.setdefault((ctx.sender, ctx.transaction),
                                             _StagedTransaction())
            in_tx = digest in staged.duplicate_ids
        found = RingOutcome.NEW
        if not in_tx:
            # What this guard sent and the broker confirmed counts as confirmed here.
            self._confirm_owed(ctx.store, message.address)
            found = ctx.store.ring_lookup(message.address, [digest], self.pending_ms)[0]
            if (found is RingOutcome.IN_FLIGHT and ctx.sender is not None
                    and self._held.get((message.address, digest)) == ctx.sender):
                # The same ordered stream as the unconfirmed send (see _reserve): if that send
                # fails, so does this transaction's COMMIT, which comes after it.
                found = RingOutcome.DUPLICATE
        if found is RingOutcome.IN_FLIGHT:
            return self._in_flight(message.address, duplicate_id)
        if in_tx or found is RingOutcome.DUPLICATE:
            where = "this transaction" if in_tx else f"the cache of {message.address}"
            log.warning("Duplicate message detected in transaction %s - transaction is "
                        "rollback-only: address=%s duplicate_id=%r", ctx.transaction,
                        message.address, duplicate_id)
            return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {duplicate_id!r} already "
                                  f"in {where}", event=DUPLICATE_EVENT)
        with self._lock:
            staged.ids.setdefault(message.address, []).append(digest)
            staged.capacity[message.address] = capacity
            staged.duplicate_ids[digest] = duplicate_id
        return None

    def _stage_bridge(self, message: Message, ctx: HookContext, bridge_id: str,
                      capacity: int) -> Verdict | None:
        """A bridge id inside a transaction: reserved at once (Artemis ``atomicVerify`` adds
        it to the cache at once) and remembered, so that the end of the transaction confirms
        it (COMMIT) or releases it (rollback, ABORT, a failed COMMIT, a lost connection)."""
        if (refusal := self._too_long(bridge_id)) is not None:
            return refusal
        assert ctx.transaction is not None
        cache, digest = bridge_cache_name(message.address), id_digest(bridge_id)
        with self._lock:
            staged = self._staged.setdefault((ctx.sender, ctx.transaction),
                                             _StagedTransaction())
            in_tx = (cache, digest) in staged.bridge_ids
        outcome = RingOutcome.DUPLICATE
        if not in_tx:
            # No sender: the same-sender rule (a repeat shares the first send's fate) does not
            # hold here, where the first send's fate is the COMMIT's, not its receipt's.
            (outcome,) = self._reserve(ctx.store, cache, [digest], capacity)
        if outcome is RingOutcome.IN_FLIGHT:
            return self._in_flight(cache, bridge_id)
        if outcome is RingOutcome.DUPLICATE:
            # Artemis rolls the transaction back (checkBridgeDuplicateID); here it becomes
            # rollback-only and its COMMIT fails, which sends nothing of it either.
            where = "this transaction" if in_tx else f"the cache of {cache}"
            log.warning("Duplicate bridge id in transaction %s - transaction is rollback-only: "
                        "address=%s bridge_id=%r", ctx.transaction, message.address, bridge_id)
            return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {bridge_id!r} already in "
                                  f"{where}", event=DUPLICATE_EVENT)
        with self._lock:
            staged.bridge.setdefault(cache, []).append(digest)
            staged.bridge_capacity[cache] = capacity
            staged.bridge_ids[(cache, digest)] = bridge_id
        return None

    def _recheck_bridge(self, staged: _StagedTransaction, transaction: str,
                        ctx: HookContext) -> Verdict | None:
        """At COMMIT, the transaction's bridge ids once more. A reservation carries no owner,
        so an open transaction's reservation older than pending-timeout-ms may have been
        taken over; if that sender's copy was confirmed meanwhile, this one must not go."""
        for cache, digests in staged.bridge.items():
            # NEW: ours had gone stale (or was overwritten) and is reserved again; IN_FLIGHT:
            # ours, or a taker's whose fate is not known yet (let through, as before).
            found = self._reserve(ctx.store, cache, digests, staged.bridge_capacity[cache])
            for digest, outcome in zip(digests, found, strict=True):
                if outcome is RingOutcome.DUPLICATE:
                    bridge_id = staged.bridge_ids.get((cache, digest), "?")
                    ctx.events.emit(DUPLICATE_EVENT, None, address=cache,
                                    duplicate_id=bridge_id, transaction=transaction,
                                    reason="committed meanwhile by another sender")
                    return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {bridge_id!r} was "
                                          f"committed to {cache} by another sender")
        return None

    def _staged_of(self, transaction: str, ctx: HookContext, *, pop: bool = False
                   ) -> _StagedTransaction | None:
        """The staged ids of ``transaction``, found by its sender and id. A caller that names
        no sender at COMMIT/ABORT although its sends had one gets the one open transaction
        of that id, if there is exactly one (an ambiguous id finds none)."""
        with self._lock:
            key: _TxKey = (ctx.sender, transaction)
            if key not in self._staged and ctx.sender is None:
                keys = [k for k in self._staged if k[1] == transaction]
                if len(keys) == 1:
                    key = keys[0]
            return self._staged.pop(key, None) if pop else self._staged.get(key)

    @hookimpl
    def transaction_committing(self, transaction: str, ctx: HookContext) -> Verdict | None:
        staged = self._staged_of(transaction, ctx)
        if staged is None:
            return None
        if staged.bridge and (verdict := self._recheck_bridge(staged, transaction, ctx)):
            return verdict
        # Re-check and add atomically per address: another producer may have
        # committed the same id since it was staged. (Addresses in different
        # Redis Cluster slots cannot share one script; see docs/duplicate-detection.md.)
        for address, digests in staged.ids.items():
            found = self._reserve(ctx.store, address, digests, staged.capacity[address],
                                  all_or_none=True)
            refused = [(d, o) for d, o in zip(digests, found, strict=True)
                       if o is not RingOutcome.NEW]
            if refused:
                first, outcome = refused[0]
                duplicate_id = staged.duplicate_ids.get(first, "?")
                if outcome is RingOutcome.IN_FLIGHT:
                    return self._in_flight(address, duplicate_id)
                ctx.events.emit(DUPLICATE_EVENT, None, address=address,
                                duplicate_id=duplicate_id, transaction=transaction,
                                reason="committed concurrently by another producer")
                return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {duplicate_id!r} was "
                                      f"committed to {address} by another producer")
            with self._lock:
                staged.reserved.append(address)
        return None

    @hookimpl
    def transaction_ended(self, transaction: str, committed: bool, ctx: HookContext) -> None:
        """Confirm every id the transaction reserved (COMMIT confirmed by the broker), or
        release them all (rolled back, aborted, COMMIT failed, connection gone): Artemis
        ``AddDuplicateIDOperation.beforeRollback`` -> ``deleteFromCache``."""
        staged = self._staged_of(transaction, ctx, pop=True)
        if staged is None:
            return
        reserved = [(address, staged.ids[address]) for address in staged.reserved]
        reserved += staged.bridge.items()
        for cache, digests in reserved:
            if committed:
                self._confirmations.owe_many(ctx.store, [(cache, d) for d in digests])
            else:
                self._release(ctx.store, cache, digests)


def _kind(duplicate_id: str) -> str:
    """How a rejection names the id: a digest of the content or an id the producer set."""
    return "content id" if duplicate_id.startswith(CONTENT_ID_PREFIX) else "id"


class _Confirmations:
    """Confirmations owed to the store, per cache, sent in as few calls as possible.

    A confirmation rides on the next reservation of its cache when one comes soon (no
    extra round trip for a steady sender); otherwise a background thread, started on the
    first confirmation, sends it ``flush_s`` after it was owed. Until then a second send of
    the id is refused as in flight rather than dropped as a duplicate, which is why the
    delay is short. ``stop`` (the guard stopping) flushes what is left.
    """

    #: Pause before retrying a flush that failed (the store unreachable).
    RETRY_S = 1.0

    def __init__(self, flush_ms: int) -> None:
        self.flush_s = flush_ms / 1000
        self._owed: dict[str, list[bytes]] = {}
        #: What the flush under way is sending (see :meth:`take`).
        self._in_transit: dict[str, list[bytes]] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._store: Store | None = None
        self._thread: threading.Thread | None = None
        #: The flusher was woken for confirmations not flushed yet: further ones owed
        #: before its flush ride along without waking it again (Event.set per
        #: confirmation cost ~1.5 us on the send path).
        self._signalled = False

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join(timeout=10)
            self._stopping.clear()
        self._flush()

    def owe(self, store: Store, cache: str, digest: bytes) -> None:
        self.owe_many(store, [(cache, digest)])

    def owe_many(self, store: Store, keys: Sequence[tuple[str, bytes]]) -> None:
        """Owe the confirmation of each (cache, digest) of ``keys``."""
        with self._lock:
            self._store = store
            owed = self._owed
            for cache, digest in keys:
                owed.setdefault(cache, []).append(digest)
            self._count += len(keys)
            while self._count > MAX_OWED_CONFIRMATIONS:
                self._drop_oldest()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="mqguard-dedup-confirm")
                self._thread.start()
            wake, self._signalled = not self._signalled, True
        if wake:
            self._wake.set()

    def take(self, cache: str) -> list[bytes]:
        """The confirmations owed to ``cache``, for a reservation to carry: also those a
        flush is sending right now (confirming twice is harmless; a reservation that
        overtook the flush would otherwise find a confirmed id still "in flight")."""
        with self._lock:
            owed = self._owed.pop(cache, None)
            in_transit = self._in_transit.get(cache)
            if owed is None:
                return list(in_transit) if in_transit else []
            self._count -= len(owed)
            return [*in_transit, *owed] if in_transit else owed

    def give_back(self, cache: str, digests: Sequence[bytes]) -> None:
        if not digests:
            return
        with self._lock:
            self._owed.setdefault(cache, [])[:0] = digests
            self._count += len(digests)

    def _drop_oldest(self) -> None:
        cache = next(iter(self._owed))
        dropped = self._owed.pop(cache)
        self._count -= len(dropped)
        log.warning("Dropped %d duplicate-id confirmations of %s: the store has been "
                    "unreachable too long (their ids are taken over after pending-timeout-ms)",
                    len(dropped), cache)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            # Give the next reservation of the cache the chance to carry the confirmations.
            if self._stopping.wait(self.flush_s):
                return
            if not self._flush():
                self._wake.set()
                self._stopping.wait(self.RETRY_S)

    def _flush(self) -> bool:
        """Send every owed confirmation; False when some could not be sent (kept for later)."""
        with self._lock:
            owed, self._owed, self._count = self._owed, {}, 0
            store = self._store
            # What is owed from now on wakes the flusher again.
            self._signalled = False
            if store is not None:
                self._in_transit = owed
        if store is None or not owed:
            return True
        try:
            return self._send(store, owed)
        finally:
            with self._lock:
                self._in_transit = {}

    def _send(self, store: Store, owed: dict[str, list[bytes]]) -> bool:
        ok = True
        for cache, digests in owed.items():
            try:
                store.ring_confirm(cache, digests)
            except StoreError as exc:
                if ok:
                    log.warning("Could not confirm %d duplicate id(s) of %s (%s); retrying",
                                len(digests), cache, exc)
                ok = False
                self.give_back(cache, digests)
        return ok
