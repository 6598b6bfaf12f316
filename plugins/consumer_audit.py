"""``consumer_audit``: suppress duplicate deliveries (ActiveMQ Classic's message audit).

Guarded producers stamp a producer id and a per-producer increasing sequence
(``mqguard-producer`` / ``mqguard-seq``). The consumer keeps, per destination
(LRU of ``max-destinations``, default 1000) and per producer (LRU of
``max-producers``, default 64), a window of ``window`` (default 2048) sequence
numbers (:mod:`mqguard.sequence_window`, ActiveMQ ``ActiveMQMessageAudit``).

A sequence is *marked* once the handler has succeeded, before the ack. A later
delivery of a marked sequence is a duplicate delivery -- typically the broker
redelivering, after a failover or a lost connection, messages whose handler
ran but whose ack never arrived. ``action`` decides what happens to it:

``ack`` (default)
    acknowledge it silently; the handler is not called. This avoids the
    dead-letter flood ActiveMQ Classic produces after a failover.
``poison``
    ActiveMQ-compatible: move it to the dead-letter target with the cause
    ``Suppressing duplicate delivery on connection, consumer <id>``.
``log``
    deliver it anyway, with a WARN line and a ``duplicate_delivery_logged`` event.

Every suppression writes ``duplicate_delivery_suppressed``.

A copy is also a duplicate while another copy of the same (producer, sequence),
with another message id, is in flight in this guard: delivered, not yet settled.
Two copies of one message reach the broker when a producer's send reached it but
the producer died before learning so and its retry went out too; a consumer with
a prefetch can hold both before it handled either. The copy in flight still has
its own fate (acked, or redelivered by the broker when its consumer fails), so
suppressing the second loses nothing. (ActiveMQ's audit records a sequence at
dispatch for the same reason.) The in-flight table is bounded (``MAX_IN_FLIGHT``,
oldest forgotten first: a forgotten entry can only let a duplicate through).

A failed delivery is never marked, so the redeliveries of the redelivery policy
are not duplicates. Messages without a producer id and sequence (not sent
through a guarded producer) are not audited.

With ``shared = true`` the marks are also written to the store (one round trip
after each successful handler, one check per delivery), so a consumer that
takes over from a crashed one suppresses what that one had already handled. The
window that remains: a crash after the handler succeeded and before its mark
was written -- the next consumer runs the handler again. A store that cannot be
reached is logged and the local audit alone decides (availability first: the
mark is a safety net, not a lock).
"""

from __future__ import annotations

import logging
import threading
from typing import Final, Literal

from pydantic import Field

from mqguard import hookimpl
from mqguard.config import MqguardConfig, PluginOptions, parse_plugin_options
from mqguard.context import HookContext
from mqguard.errors import StoreError
from mqguard.events import EventType
from mqguard.message import Message
from mqguard.sequence_window import ConsumerAudit
from mqguard.verdict import AckReason, Verdict

log = logging.getLogger("mqguard.plugins.consumer_audit")

NAME = "consumer_audit"
#: Deliveries remembered as in flight (delivered, not yet settled) per guard.
MAX_IN_FLIGHT: Final = 100_000


class ConsumerAuditOptions(PluginOptions):
    """``[plugins.consumer_audit]``."""

    #: What a duplicate delivery gets: ``ack`` (acknowledged unhandled), ``poison``
    #: (moved to the dead-letter address), ``log`` (a WARN, then handled anyway).
    action: Literal["ack", "poison", "log"] = "ack"
    #: Sequence numbers remembered per producer (older ones pass, as in ActiveMQ).
    window: int = Field(2048, ge=1, le=1 << 20)
    #: Producers remembered per destination (LRU).
    max_producers: int = Field(64, ge=1, le=1 << 20)
    #: Destinations remembered per consumer guard (LRU).
    max_destinations: int = Field(1000, ge=1, le=1 << 20)
    #: Also keep the marks in the store, for consumers that take over from crashed ones.
    shared: bool = False
    #: A producer's shared window is forgotten this long after its last mark.
    shared_ttl_ms: int = Field(24 * 3600 * 1000, ge=1000)


class ConsumerAuditPlugin:
    """One instance per guard: the guard's consumers share one audit (like a connection)."""

    def __init__(self) -> None:
        self.options = ConsumerAuditOptions()
        self.audit = ConsumerAudit()
        # (destination, producer, sequence) -> message id of the copy in flight; a plain
        # dict, oldest first (insertion order), cheaper per delivery than an OrderedDict.
        self._in_flight: dict[tuple[str, str, int], str] = {}
        self._lock = threading.Lock()

    @hookimpl
    def configure(self, config: MqguardConfig) -> None:
        self.options = options = parse_plugin_options(config, NAME, ConsumerAuditOptions)
        self.audit = ConsumerAudit(options.max_destinations, options.max_producers,
                                   options.window)

    @hookimpl(tryfirst=True)
    def before_deliver(self, message: Message, ctx: HookContext) -> Verdict | None:
        producer, sequence = message.producer_id, message.sequence
        if producer is None or sequence is None:
            return None
        destination = ctx.queue or message.address
        duplicate = self.audit.seen(destination, producer, sequence)
        if not duplicate and self.options.shared:
            try:
                duplicate = ctx.store.audit_seen(destination, producer, [sequence])[0]
            except StoreError as exc:
                log.warning("shared consumer audit unavailable, local audit only: %s", exc)
        if not duplicate:
            duplicate = self._hold(destination, producer, sequence, message.message_id)
        if not duplicate:
            return None
        return self._on_duplicate(message, ctx, destination)

    @hookimpl(tryfirst=True)
    def before_deliver_batch(self, messages: list[Message], contexts: list[HookContext]
                             ) -> dict[int, Verdict] | None:
        """:meth:`before_deliver` on each message in order, with one store read per
        destination and producer (``shared``) and the in-flight table locked once.

        Exact because nothing this checks changes while a batch is decided: marks are
        written after handling (``after_deliver``), the store is only read here, and the
        guard never puts two copies of one send in one batch."""
        audited: list[tuple[int, str, str, int]] = []
        duplicates: dict[int, bool] = {}
        seen = self.audit.seen
        for index, (message, ctx) in enumerate(zip(messages, contexts, strict=True)):
            producer, sequence = message.producer_id, message.sequence
            if producer is None or sequence is None:
                continue
            destination = ctx.queue or message.address
            audited.append((index, destination, producer, sequence))
            if seen(destination, producer, sequence):
                duplicates[index] = True
        if not audited:
            return None
        if self.options.shared:
            self._seen_in_store(audited, duplicates, contexts[0])
        with self._lock:
            for index, destination, producer, sequence in audited:
                if index not in duplicates and self._hold_locked(
                        destination, producer, sequence, messages[index].message_id):
                    duplicates[index] = True
        verdicts: dict[int, Verdict] = {}
        for index, destination, _, _ in audited:
            if index in duplicates:
                verdict = self._on_duplicate(messages[index], contexts[index], destination)
                if verdict is not None:
                    verdicts[index] = verdict
        return verdicts or None

    def _seen_in_store(self, audited: list[tuple[int, str, str, int]],
                       duplicates: dict[int, bool], ctx: HookContext) -> None:
        """The shared marks of the deliveries not marked locally: one read per destination
        and producer. Unreachable store: the local audit alone decides (as one by one)."""
        groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for index, destination, producer, sequence in audited:
            if index not in duplicates:
                groups.setdefault((destination, producer), []).append((index, sequence))
        for (destination, producer), entries in groups.items():
            try:
                found = ctx.store.audit_seen(destination, producer,
                                             [sequence for _, sequence in entries])
            except StoreError as exc:
                log.warning("shared consumer audit unavailable, local audit only: %s", exc)
                continue
            for (index, _), marked in zip(entries, found, strict=True):
                if marked:
                    duplicates[index] = True

    def _hold(self, destination: str, producer: str, sequence: int, message_id: str) -> bool:
        """Record the delivery as in flight; True when another copy already is."""
        with self._lock:
            return self._hold_locked(destination, producer, sequence, message_id)

    def _hold_locked(self, destination: str, producer: str, sequence: int,
                     message_id: str) -> bool:
        key = (destination, producer, sequence)
        in_flight = self._in_flight
        holder = in_flight.get(key)
        if holder is not None:
            if holder != message_id:
                return True
            del in_flight[key]  # the same copy redelivered: it becomes the newest
        in_flight[key] = message_id
        if len(in_flight) > MAX_IN_FLIGHT:
            del in_flight[next(iter(in_flight))]
        return False

    def _settled(self, message: Message, ctx: HookContext) -> None:
        producer, sequence = message.producer_id, message.sequence
        if producer is None or sequence is None:
            return
        key = (ctx.queue or message.address, producer, sequence)
        message_id = message.message_id
        # Looked at without the lock first: a handled delivery was settled by after_deliver
        # already, so its ack finds nothing. This delivery's entry was put there before (by
        # its before_deliver), so a miss cannot be a race with that insertion.
        if self._in_flight.get(key) != message_id:
            return
        with self._lock:
            if self._in_flight.get(key) == message_id:
                del self._in_flight[key]

    @hookimpl
    def message_acknowledged(self, message: Message, ctx: HookContext,
                             reason: AckReason) -> None:
        self._settled(message, ctx)

    @hookimpl
    def message_acknowledged_batch(self, messages: list[Message], contexts: list[HookContext],
                                   reason: AckReason) -> None:
        for message, ctx in zip(messages, contexts, strict=True):
            self._settled(message, ctx)

    @hookimpl
    def message_nacked(self, message: Message, ctx: HookContext, requeue: bool) -> None:
        self._settled(message, ctx)

    @hookimpl
    def after_deliver(self, message: Message, ctx: HookContext,
                      error: BaseException | None) -> None:
        producer, sequence = message.producer_id, message.sequence
        if producer is None or sequence is None:
            return
        if error is not None:
            self._settled(message, ctx)  # failed: its redelivery is no duplicate
            return
        destination = ctx.queue or message.address
        self.audit.mark(destination, producer, sequence)
        self._settled(message, ctx)  # after the mark: a copy arriving now is seen either way
        if self.options.shared:
            try:
                ctx.store.audit_mark(destination, producer, [sequence], self.options.window,
                                     self.options.shared_ttl_ms)
            except StoreError as exc:
                log.warning("shared consumer audit mark of %s/%s on %s not written (a consumer "
                            "taking over after a crash could handle it again): %s", producer,
                            sequence, destination, exc)

    @hookimpl
    def after_deliver_batch(self, messages: list[Message], contexts: list[HookContext]) -> None:
        """:meth:`after_deliver` of successful handlings: marks in order, the in-flight
        entries released under one lock, the shared marks in one write per destination
        and producer."""
        handled: list[tuple[str, str, int, str]] = []
        mark = self.audit.mark
        for message, ctx in zip(messages, contexts, strict=True):
            producer, sequence = message.producer_id, message.sequence
            if producer is None or sequence is None:
                continue
            destination = ctx.queue or message.address
            mark(destination, producer, sequence)
            handled.append((destination, producer, sequence, message.message_id))
        if not handled:
            return
        in_flight = self._in_flight
        with self._lock:  # after the marks: a copy arriving now is seen either way
            for destination, producer, sequence, message_id in handled:
                key = (destination, producer, sequence)
                if in_flight.get(key) == message_id:
                    del in_flight[key]
        if self.options.shared:
            groups: dict[tuple[str, str], list[int]] = {}
            for destination, producer, sequence, _ in handled:
                groups.setdefault((destination, producer), []).append(sequence)
            store = contexts[0].store
            for (destination, producer), sequences in groups.items():
                try:
                    store.audit_mark(destination, producer, sequences, self.options.window,
                                     self.options.shared_ttl_ms)
                except StoreError as exc:
                    log.warning("shared consumer audit marks of %s/%s on %s not written (a "
                                "consumer taking over after a crash could handle them "
                                "again): %s", producer, sequences, destination, exc)

    def _on_duplicate(self, message: Message, ctx: HookContext,
                      destination: str) -> Verdict | None:
        what = (f"duplicate delivery of {message.message_id} (producer {message.producer_id}, "
                f"sequence {message.sequence}) on {destination}")
        action = self.options.action
        if action == "log":
            log.warning("%s: delivered anyway (consumer_audit action = log)", what)
            ctx.events.emit(EventType.DUPLICATE_DELIVERY_LOGGED, message, queue=ctx.queue)
            return None
        if action == "ack":
            log.info("%s: acknowledged without handling", what)
            return Verdict.drop(what, event=EventType.DUPLICATE_DELIVERY_SUPPRESSED,
                                ack_reason=AckReason.NORMAL)
        cause = (f"Suppressing duplicate delivery on connection, consumer "
                 f"{ctx.guard.node_id}:{destination}")
        target = ctx.settings.dead_letter_target(message.address)
        if target is None:
            log.warning("%s: no dead-letter-address for action = poison, dropped", what)
            return Verdict.drop(f"{cause} (no dead-letter-address)",
                                event=EventType.DUPLICATE_DELIVERY_SUPPRESSED)
        return Verdict.move(target, cause, event=EventType.DUPLICATE_DELIVERY_SUPPRESSED)
