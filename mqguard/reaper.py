"""The expiry reaper: messages that expire while at rest (Artemis ``ExpiryReaper``).

Every ``message-expiry-scan-period`` ms (``[mqguard]``; -1 turns it off) the
reaper scans its addresses and moves what has expired to the expiry target, as
at delivery (:mod:`mqguard.plugins.expiry`): a copy with ``_AMQ_ORIG_*`` and
``_AMQ_ACTUAL_EXPIRY``, no expiration; the original acknowledged with reason
EXPIRED. Hooks ``before_expiry_scan`` / ``after_expiry_scan`` /
``message_expired`` fire and ``expired`` events are written. A scan that runs
longer than the period makes the reaper skip the ticks it overran.

How it finds expired messages without consuming, reordering or delaying the
others depends on the broker (``Capabilities.expiry_reaping``):

``selector`` (ActiveMQ)
    a subscription with the selector ``MQGUARD_EXPIRES <= now`` receives only
    expired messages; each batch of at most ``batch_size`` is moved in one
    broker transaction (copies + acks commit together).
``dead-letter`` (RabbitMQ)
    RabbitMQ expires messages itself (the ``expiration`` the adapter sets) and
    dead-letters them, through a policy on the guarded queues, to one holding
    queue (default ``mqguard.expired``); the reaper drains it and routes each
    message on by ``x-first-death-queue`` / ``x-first-death-reason``: expired
    ones to the expiry target of their queue, others to its dead-letter target.
    RabbitMQ has no transactional acks over STOMP: copies are confirmed before
    the acks (a crash in between leaves two copies, never none).
``native-drop`` (MQTT 5)
    the broker drops expired messages itself and reports nothing: nothing to
    reap; the scan says so (``ScanResult.note``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.context import HookContext
from mqguard.events import EventType
from mqguard.hookcall import observe
from mqguard.message import Message, now_ms
from mqguard.pipeline import Guard
from mqguard.verdict import AckReason

__all__ = ["DEFAULT_HOLDING_QUEUE", "MAX_BATCH", "ExpiryReaper", "ScanResult"]

log = logging.getLogger("mqguard.reaper")

#: Artemis moves expired references in batches of this size at most.
MAX_BATCH = 1000
#: RabbitMQ queue the expiry policy dead-letters to (see docs/expiry.md).
DEFAULT_HOLDING_QUEUE = "mqguard.expired"


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one scan of one address did."""

    address: str
    expired: int
    seconds: float
    strategy: str
    note: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"address": self.address, "expired": self.expired,
                "seconds": round(self.seconds, 3), "strategy": self.strategy,
                "note": self.note}


class _Collector:
    """Delivery callback that gathers deliveries for the reaper thread."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        with self.cond:
            self.deliveries.append(delivery)
            self.cond.notify_all()

    def take(self, limit: int, idle_s: float, first_s: float = 0.0) -> list[Delivery]:
        """Up to ``limit`` deliveries, waiting until none arrived for ``idle_s`` (for the
        very first one, up to ``first_s`` if that is longer)."""
        with self.cond:
            wait = max(idle_s, first_s) if not self.deliveries else idle_s
            while len(self.deliveries) < limit:
                seen = len(self.deliveries)
                self.cond.wait(wait)
                wait = idle_s
                if len(self.deliveries) == seen:
                    break
            taken, self.deliveries = self.deliveries[:limit], self.deliveries[limit:]
            return taken


class ExpiryReaper:
    """Scans ``addresses`` on one broker connection; see the module documentation."""

    def __init__(self, guard: Guard, adapter: Adapter, addresses: Sequence[str], *,
                 batch_size: int = MAX_BATCH, idle_ms: int = 300, first_wait_ms: int = 0,
                 holding_queue: str = DEFAULT_HOLDING_QUEUE) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}, got {batch_size}")
        if idle_ms < 1:
            raise ValueError(f"idle_ms must be >= 1, got {idle_ms}")
        self.guard = guard
        self.adapter = adapter
        self.addresses = list(dict.fromkeys(addresses))
        self.batch_size = batch_size
        self.idle_s = idle_ms / 1000.0
        if first_wait_ms < 0:
            raise ValueError(f"first_wait_ms must be >= 0, got {first_wait_ms}")
        #: How long a scan waits for its first match (a deep queue takes the broker time).
        self.first_wait_s = first_wait_ms / 1000.0
        self.holding_queue = holding_queue
        self._scan_lock = threading.Lock()

    def watch(self, address: str) -> None:
        """Scan ``address`` too from the next pass on (the sidecar learns addresses from
        traffic). Appending is atomic, so a scan running meanwhile is not disturbed."""
        if address not in self.addresses:
            self.addresses.append(address)

    # -- scanning ----------------------------------------------------------------------

    def scan(self) -> list[ScanResult]:
        """One pass over every address (``dead-letter``: one drain of the holding queue)."""
        if not self._scan_lock.acquire(blocking=False):
            log.info("expiry scan still running: this tick is skipped")
            return []
        try:
            self.adapter.connect()
            strategy = self.adapter.capabilities.expiry_reaping
            if strategy == "dead-letter":
                return [self._scan(self.holding_queue, strategy, self._drain_holding_queue)]
            if strategy == "selector":
                return [self._scan(a, strategy, self._reap_by_selector) for a in self.addresses]
            note = ("the broker drops expired messages itself (MQTT 5 Message Expiry Interval) "
                    "and reports nothing: only messages expiring in flight are moved, at "
                    "delivery") if strategy == "native-drop" else (
                    "this broker offers no way to find expired messages at rest: they are "
                    "moved when a guarded consumer receives them")
            return [ScanResult(a, 0, 0.0, strategy, note) for a in self.addresses]
        finally:
            self._scan_lock.release()

    def _scan(self, address: str, strategy: str, reap: object) -> ScanResult:
        ctx = self._context(address)
        observe(self.guard.hook.before_expiry_scan, address=address, ctx=ctx)
        started = time.perf_counter()
        expired = reap(address, ctx)  # type: ignore[operator]
        seconds = time.perf_counter() - started
        observe(self.guard.hook.after_expiry_scan, address=address, ctx=ctx, expired=expired)
        if expired:
            log.info("expiry scan of %s: %d expired message(s) moved in %.2f s", address,
                     expired, seconds)
        return ScanResult(address, expired, seconds, strategy)

    def _context(self, address: str) -> HookContext:
        return self.guard.context(address, self.adapter.capabilities, role="reaper",
                                  queue=address, broker=self.adapter.broker)

    def run(self, stop: threading.Event, period_ms: int | None = None) -> None:
        """Scan every ``period_ms`` (default: ``message-expiry-scan-period``) until ``stop``."""
        period = self.guard.config.core.message_expiry_scan_period if period_ms is None \
            else period_ms
        if period < 0:
            log.info("expiry reaper off (message-expiry-scan-period = %d)", period)
            return
        interval = max(period, 1) / 1000.0
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                self.scan()
            except Exception:
                log.exception("expiry scan failed; retrying at the next tick")
            next_tick += interval
            now = time.monotonic()
            if now > next_tick:
                skipped = int((now - next_tick) // interval) + 1
                log.info("expiry scan overran its period: %d tick(s) skipped", skipped)
                next_tick += skipped * interval
            stop.wait(max(0.0, next_tick - time.monotonic()))

    # -- ActiveMQ: selector subscription, transactional batches ---------------------------

    def _drain(self, queue: str, selector: str | None,
               handle: Callable[[list[Delivery]], int]) -> int:
        """Subscribe to ``queue`` and hand its deliveries to ``handle`` in batches until it
        stays quiet for ``idle_ms``; returns the sum of what ``handle`` counted."""
        collector = _Collector()
        options = SubscribeOptions(selector=selector, prefetch=self.batch_size)
        subscription = self.adapter.subscribe(queue, collector, options)
        total = 0
        try:
            # The broker may take a while to find the first match in a deep queue (ActiveMQ
            # evaluates the selector over the paged-in messages): wait longer for it.
            first_s = self.first_wait_s
            while batch := collector.take(self.batch_size, self.idle_s, first_s):
                total += handle(batch)
                first_s = 0.0
            return total
        finally:
            self.adapter.unsubscribe(subscription)

    def _reap_by_selector(self, address: str, ctx: HookContext) -> int:
        selector = self.adapter.expired_selector(now_ms())  # type: ignore[attr-defined]
        return self._drain(address, selector,
                           lambda batch: self._expire_in_transaction(batch, ctx))

    def _expire_in_transaction(self, batch: list[Delivery], ctx: HookContext) -> int:
        adapter, guard = self.adapter, self.guard
        tx = adapter.begin()
        moves: list[tuple[Message, Message | None, str | None]] = []
        try:
            for delivery in batch:
                message = delivery.message
                target = ctx.settings.expiry_target(message.address)
                copy = None
                if target is not None:
                    copy = guard.move(adapter, message, target, ctx, _reason(message),
                                      expiry=True, transaction=tx)
                adapter.ack(delivery, transaction=tx)
                moves.append((message, copy, target))
        except BaseException:
            adapter.abort(tx)
            raise
        # The events go first: a kill between the COMMIT and the events would leave messages
        # moved with no trace in the log (the fault suite measured 10 such, which the audit
        # then rightly called lost). Written before, a kill or a failed COMMIT leaves the
        # messages in the queue with their events: the next scan moves them and writes them
        # again, and a message's fate is in the log either way.
        for message, copy, target in moves:
            self._record_events(message, copy, target, ctx)
        try:
            adapter.commit(tx)
        except Exception:
            log.warning("expiry of %d message(s) on %s not committed: they stay in the queue "
                        "and are expired again by a later scan (their events are written "
                        "again then)", len(moves), ctx.queue)
            raise
        for message, copy, target in moves:
            self._notify(message, copy, target, ctx)
        return len(moves)

    # -- RabbitMQ: drain the holding queue the broker dead-letters to --------------------

    def _drain_holding_queue(self, holding: str, ctx: HookContext) -> int:
        return self._drain(holding, None, self._route_dead_letters)

    def _route_dead_letters(self, batch: list[Delivery]) -> int:
        expired = 0
        for delivery in batch:
            headers = delivery.raw_headers
            queue = headers.get("x-first-death-queue")
            why = headers.get("x-first-death-reason", "")
            message = delivery.message
            if not queue:
                log.warning("message %s in %s has no x-first-death-queue: left there",
                            message.message_id, self.holding_queue)
                continue
            message.address = queue
            ctx = self._context(queue)
            if why == "expired":
                target = ctx.settings.expiry_target(queue)
                copy = None if target is None else self.guard.move(
                    self.adapter, message, target, ctx, _reason(message), expiry=True)
                # Events before the ack (a kill in between: redelivered, moved again).
                self._record_events(message, copy, target, ctx, moved=True)
                self.adapter.ack(delivery)
                self._notify(message, copy, target, ctx, moved=True)
                expired += 1
            else:
                target = ctx.settings.dead_letter_target(queue)
                reason = f"dead-lettered by RabbitMQ ({why or 'unknown reason'})"
                if target is not None:
                    self.guard.move(self.adapter, message, target, ctx, reason)
                    self.guard.events.emit(EventType.DEAD_LETTERED, message, queue=queue,
                                           target=target, reason=reason)
                else:
                    log.warning("message %s of %s %s and no dead-letter-address: dropped",
                                message.message_id, queue, reason)
                    self.guard.events.emit(EventType.DELIVERY_DROPPED, message, queue=queue,
                                           reason=reason)
                self.adapter.ack(delivery)
        return expired

    # -- bookkeeping -------------------------------------------------------------------

    def _record_events(self, message: Message, copy: Message | None, target: str | None,
                       ctx: HookContext, *, moved: bool = False) -> None:
        """The ``moved`` (unless written already), ``expired`` and ``acked`` events."""
        guard = self.guard
        if copy is not None and not moved:
            guard.events.emit(EventType.MOVED, message, queue=ctx.queue, target=copy.address,
                              new_message_id=copy.message_id, reason=_reason(message))
        if target is None:
            log.warning("expired message %s of %s dropped: no expiry-address is configured "
                        "for it", message.message_id, message.address)
        guard.events.emit(EventType.EXPIRED, message, queue=ctx.queue, target=target,
                          reason=_reason(message) + ("" if target else "; no expiry-address"))
        guard.events.emit(EventType.ACKED, message, queue=ctx.queue,
                          ack_reason=AckReason.EXPIRED.value)

    def _notify(self, message: Message, copy: Message | None, target: str | None,
                ctx: HookContext, *, moved: bool = False) -> None:
        """The hooks, once the move is done."""
        guard = self.guard
        if copy is not None and not moved:
            observe(guard.hook.message_moved, original=message, copy=copy, ctx=ctx,
                    reason=_reason(message))
        observe(guard.hook.message_expired, message=message, ctx=ctx, moved_to=target)


def _reason(message: Message) -> str:
    return f"expired at {message.expiration} (found at rest by the expiry reaper)"
