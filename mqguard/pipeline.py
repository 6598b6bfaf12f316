"""The guard pipeline: the send path and the deliver/ack path.

:class:`Guard` owns the configuration, the store, the event log and the plugin
manager, and turns hook verdicts into broker actions through an adapter. The
producer and consumer wrappers, and the sidecar, are thin shells around it.
Every outcome writes exactly one terminal event per message and path, which is
what makes the event log auditable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from mqguard.adapter import Adapter, Capabilities, Delivery
from mqguard.config import MqguardConfig, load_config
from mqguard.context import HookContext
from mqguard.errors import ConfigError, MessageRejected, TransactionRolledBack
from mqguard.events import EventLog, EventType, NullEventLog
from mqguard.hookcall import BatchCall, HotCall, observe, orphan_twins
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    ID_BYTES,
    MOVE_REASON_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    PRIOR_DELIVERIES_HEADER,
    Message,
    encode_ids,
    new_message_id,
    now_ms,
    per_process_unique_id,
)
from mqguard.plugin_manager import check_plugins, make_plugin_manager
from mqguard.redelivery import Mechanism, RedeliveryTimer, choose_mechanism
from mqguard.stores import Store, open_store
from mqguard.verdict import AckReason, Action, Verdict

if TYPE_CHECKING:
    import pluggy

log = logging.getLogger("mqguard.pipeline")

Handler = Callable[[Message], object]

_DEFAULT_EVENT = {
    Action.REJECT: EventType.REJECTED,
    Action.DROP: EventType.DROPPED,
    Action.MOVE: EventType.MOVED,
}


#: Messages in the first part of a batch written before the rest is decided (see
#: :meth:`Guard._send_in_parts`); each further part is PART_GROWTH times as large, up to
#: MAX_PART messages.
FIRST_PART = 8
PART_GROWTH = 4
MAX_PART = 256


#: The verdict of a send no hook objected to (Verdict is frozen: one instance serves all).
_CONTINUE = Verdict(Action.CONTINUE)


#: The generator of a batch's mqguard ids (see :func:`_stamp_ids`): seeded from
#: ``os.urandom`` (Random() does that), and again in a forked child, whose ids must differ
#: from its parent's.
_ID_BITS = random.Random()
os.register_at_fork(after_in_child=lambda: _ID_BITS.seed(os.urandom(32)))


def _stamp_ids(messages: Sequence[Message]) -> None:
    """Give the messages without one an mqguard id, 120 random bits each from one call.

    Same form as :func:`~mqguard.message.new_message_id` (:func:`encode_ids`). The bits
    come from a per-process Mersenne Twister seeded with 256 random bits rather than
    from ``os.urandom``: ids must be unique, not unpredictable (any client can write the
    header), and ``os.urandom`` releases the GIL, which on a busy machine let another
    thread in and stalled the send path for up to milliseconds (RabbitMQ produce at load
    9: a batch's ids took 216-284 us on average, 2.3-4.5 ms at worst, against 47-60 us).
    """
    missing = [message for message in messages if not message.message_id]
    if missing:
        count = len(missing)
        pool = _ID_BITS.getrandbits(8 * ID_BYTES * count).to_bytes(ID_BYTES * count, "big")
        for message, message_id in zip(missing, encode_ids(pool), strict=True):
            message.message_id = message_id


class PendingSend(Protocol):
    """Frames an adapter has written and whose confirmations are outstanding."""

    def wait(self) -> None:
        """Return once the broker confirmed them all; raise AdapterError otherwise.
        May be called more than once, with the same outcome each time."""


@dataclass(slots=True)
class SendResult:
    """What happened to one guarded send."""

    message: Message
    #: The deciding verdict; ``action`` CONTINUE when the message went to the broker.
    verdict: Verdict

    @property
    def sent(self) -> bool:
        """True when the broker has the message (or, in a transaction, will at COMMIT)."""
        return self.verdict.action in (Action.CONTINUE, Action.MOVE)


@dataclass(slots=True)
class TransactionState:
    """The guard's view of one broker transaction."""

    transaction_id: str
    address_hint: str = ""
    messages: list[Message] = field(default_factory=list)
    rollback_reason: str | None = None


def make_event_log(config: MqguardConfig) -> EventLog:
    settings = config.core.event_log
    if not settings.enabled:
        return NullEventLog(config.node_id)
    return EventLog(settings.directory, node_id=config.node_id, max_bytes=settings.max_bytes,
                    backup_count=settings.backup_count,
                    flush_interval_ms=settings.flush_interval_ms,
                    buffer_events=settings.buffer_events, fsync=settings.fsync,
                    sync=settings.sync, rotated_format=settings.rotated_format)


class Guard:
    """Runs the hooks around sends and deliveries and applies their verdicts."""

    #: Decide and write a batch in parts, so that the broker works on one part while the
    #: next is decided (see :meth:`_send_in_parts`). Off: on this project's shared 2-core
    #: machine (load 6-12) it measured no gain, the extra hook calls, store round trips and
    #: wake-ups cost more than the overlap won (RabbitMQ produce, same runs: ratio 0.90
    #: in parts vs 0.95 in one with MemoryStore over 16 alternations; 0.70-0.89 vs
    #: 0.83-0.98 with Redis). Worth measuring again on an idle machine, where the
    #: broker's idle time is what the overlap saves.
    send_in_parts: bool = False

    def __init__(
        self,
        config: MqguardConfig | None = None,
        *,
        store: Store | None = None,
        events: EventLog | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
        role: str = "app",
    ) -> None:
        self.config = config if config is not None else load_config()
        self.settings = self.config.address_settings_repository()
        self.node_id = self.config.node_id
        self.role = role
        self._owns_store = store is None
        self._owns_events = events is None
        self.store: Store = store if store is not None else open_store(self.config.core.store)
        self.events: EventLog = events if events is not None else make_event_log(self.config)
        self.plugins = plugin_manager or make_plugin_manager(self.config)
        self.hook = self.plugins.hook
        # The hooks called once per message, without pluggy's per-call overhead.
        self._before_send = HotCall(self.hook.before_send, self.plugins)
        self._after_send = HotCall(self.hook.after_send, self.plugins)
        self._after_send_batch = HotCall(self.hook.after_send_batch, self.plugins)
        self._before_deliver = HotCall(self.hook.before_deliver, self.plugins)
        self._after_deliver = HotCall(self.hook.after_deliver, self.plugins)
        self._acknowledged = HotCall(self.hook.message_acknowledged,
                                    self.plugins)
        # The deliver path's batch twins (open_deliveries / finish_deliveries).
        self._before_deliver_batch = BatchCall(self.hook.before_deliver,
                                               self.hook.before_deliver_batch, self.plugins)
        self._after_deliver_batch = BatchCall(self.hook.after_deliver,
                                              self.hook.after_deliver_batch, self.plugins)
        self._acknowledged_batch = BatchCall(self.hook.message_acknowledged,
                                             self.hook.message_acknowledged_batch, self.plugins)
        #: Holds deliveries whose redelivery waits in this process (see mqguard.redelivery).
        self.redelivery_timer = RedeliveryTimer()
        # One lock per subscription: a held redelivery runs the handler on the timer
        # thread, and must never overlap a delivery on the adapter's thread.
        self._serial: dict[tuple[int, str], threading.Lock] = {}
        self._serial_guard = threading.Lock()
        self._started = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> Guard:
        if not self._started:
            # A misspelled @hookimpl would never be called: refuse to guard without it.
            check_plugins(self.plugins)
            self._check_batch_twins()
            self._started = True
            self.hook.guard_started(guard=self)
        return self

    def _check_batch_twins(self) -> None:
        """A batch twin without its per-message hook would be skipped by the one-message
        paths: refuse to start rather than guard some deliveries differently."""
        hook = self.hook
        for single, batch in ((hook.before_deliver, hook.before_deliver_batch),
                              (hook.after_deliver, hook.after_deliver_batch),
                              (hook.message_acknowledged, hook.message_acknowledged_batch)):
            orphans = orphan_twins(single, batch)
            if orphans:
                raise ConfigError(
                    f"plugin(s) {', '.join(orphans)} implement {batch.name} but not "
                    f"{single.name}: a batch hook is only used in addition to its "
                    "per-message hook")

    def close(self) -> None:
        """Stop plugins, write pending events, release the store (if the guard made them)."""
        if self._closed:
            return
        self._closed = True
        dropped = self.redelivery_timer.close()
        if dropped:
            log.info("%d held redeliveries dropped at close: still unacknowledged, the broker "
                     "redelivers them", dropped)
        if self._started:
            self.hook.guard_stopping(guard=self)
        if self._owns_events:
            self.events.close()
        else:
            self.events.flush()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Guard:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------

    def context(self, address: str, capabilities: Capabilities, *, role: str | None = None,
                queue: str | None = None, transaction: str | None = None,
                broker: str = "unknown", raw_headers: dict[str, str] | None = None
                ) -> HookContext:
        return HookContext(self, address, self.settings.resolve(address), capabilities,
                           role or self.role, queue, transaction, broker, raw_headers)

    def _record_verdict(self, message: Message, verdict: Verdict, ctx: HookContext) -> None:
        event = verdict.event or _DEFAULT_EVENT.get(verdict.action)
        if event is not None:
            self.events.emit(event, message, reason=verdict.reason or None,
                             target=verdict.address, transaction=ctx.transaction,
                             queue=ctx.queue)

    # -- send path ------------------------------------------------------------------------

    def decide_send(self, message: Message, ctx: HookContext) -> Verdict:
        """Stamp the message id and ask the ``before_send`` hooks; record non-CONTINUE verdicts."""
        if not message.message_id:
            message.message_id = new_message_id()
        verdict = self._before_send.first(message, ctx)
        if verdict is None:
            return _CONTINUE
        if verdict.action is not Action.CONTINUE:
            self._record_verdict(message, verdict, ctx)
        return verdict

    def send(self, adapter: Adapter, message: Message, *,
             transaction: TransactionState | None = None) -> SendResult:
        """Guard and send one message. Raises MessageRejected on a REJECT verdict."""
        return self.send_batch(adapter, [message], transaction=transaction)[0]

    def send_batch(self, adapter: Adapter, messages: Sequence[Message], *,
                   transaction: TransactionState | None = None) -> list[SendResult]:
        """Guard several messages and send the accepted ones pipelined; return once the
        broker confirmed them (or, in a transaction, once they are written).

        Outside a transaction a REJECT raises :class:`MessageRejected` after the
        accepted messages before it were sent; nothing after it is decided or sent.
        Inside a transaction a REJECT marks the transaction rollback-only (Artemis
        semantics): COMMIT will fail. Every message that reached the adapter gets
        exactly one ``sent`` or ``send_failed`` event before this returns or raises.
        """
        if transaction is None and len(messages) > 1:
            return self._send_in_parts(adapter, messages)
        tx_id = transaction.transaction_id if transaction else None
        results: list[SendResult] = []
        outgoing: list[tuple[Message, HookContext]] = []
        for message in messages:
            ctx = self.context(message.address, adapter.capabilities, role="producer",
                               transaction=tx_id, broker=adapter.broker)
            verdict = self.decide_send(message, ctx)
            results.append(SendResult(message, verdict))
            if verdict.action is Action.REJECT:
                if transaction is None:
                    raise MessageRejected(message.address, verdict.reason)
                transaction.rollback_reason = transaction.rollback_reason or verdict.reason
                continue
            if (accepted := self._accepted(message, verdict)) is not None:
                outgoing.append((accepted, ctx))
        self._transmit(adapter, outgoing, transaction)
        return results

    @staticmethod
    def _accepted(message: Message, verdict: Verdict) -> Message | None:
        """What goes to the broker for a ``before_send`` verdict: the message, its moved
        copy (same mqguard id), or nothing (DROP, REJECT)."""
        if verdict.action is Action.CONTINUE:
            return message
        if verdict.action is Action.MOVE and verdict.address:
            moved = message.copy_for(verdict.address)
            moved.message_id = message.message_id
            return moved
        return None

    def _send_in_parts(self, adapter: Adapter, messages: Sequence[Message]
                       ) -> list[SendResult]:
        """The batch path outside transactions: decide, write, then await the receipts.

        With :attr:`send_in_parts` the batch is decided and written in parts, growing
        from :data:`FIRST_PART` to :data:`MAX_PART` messages (8, 32, 60 for a batch of
        100): the broker works on part n while the guard decides part n+1 (hooks and one
        ``before_send_batch``, i.e. one duplicate-ID reservation, per part). Otherwise
        (the default) the whole batch is one part.

        Receipts are awaited once every part is written (the last part first, so the
        thread wakes once per batch), then the parts are settled in order: ``sent``
        events and ``after_send`` hooks, or ``send_failed`` and ``on_send_exception``
        for the messages of a part that failed. Adapters without ``send_many_nowait`` get
        the whole batch as one part, sent with ``send_many``.
        """
        send_nowait: Callable[[list[Message]], PendingSend] | None = getattr(
            adapter, "send_many_nowait", None)
        results: list[SendResult] = []
        written: list[tuple[PendingSend, list[tuple[Message, HookContext]]]] = []
        rejected: MessageRejected | None = None
        failure: BaseException | None = None
        position = 0
        in_parts = send_nowait is not None and self.send_in_parts
        size = FIRST_PART if in_parts else len(messages)
        try:
            while position < len(messages) and rejected is None:
                part = messages[position:position + size]
                position += len(part)
                size = min(size * PART_GROWTH, MAX_PART)
                outgoing, rejected = self._decide_part(adapter, part, results)
                if not outgoing:
                    continue
                if send_nowait is None:
                    self._transmit(adapter, outgoing, None)
                    continue
                try:
                    pending = send_nowait([message for message, _ in outgoing])
                except Exception as exc:
                    for message, ctx in outgoing:
                        self.send_failed(message, ctx, exc)
                    raise
                written.append((pending, outgoing))
        except BaseException as exc:
            # Earlier parts are on their way: settle them (events, hooks) before raising.
            failure = exc
        if len(written) > 1:
            # The broker confirms in order: once the last part is in, so are the others
            # (normally), and the thread wakes up once per batch instead of once per part.
            # Its outcome is looked at again, in order, below.
            with contextlib.suppress(Exception):
                written[-1][0].wait()
        for pending, outgoing in written:
            try:
                pending.wait()
            except Exception as exc:
                for message, ctx in outgoing:
                    self.send_failed(message, ctx, exc)
                failure = failure or exc
                continue
            self._settle_sent(outgoing)
        if failure is not None:
            raise failure
        if rejected is not None:
            raise rejected
        return results

    def _decide_part(self, adapter: Adapter, part: Sequence[Message],
                     results: list[SendResult]
                     ) -> tuple[list[tuple[Message, HookContext]], MessageRejected | None]:
        """Run ``before_send`` over ``part`` (up to the first REJECT) and then
        ``before_send_batch`` over what it accepted. Appends to ``results``; returns what
        goes to the broker and the first rejection, if any."""
        outgoing: list[tuple[Message, HookContext]] = []
        capabilities, broker = adapter.capabilities, adapter.broker
        _stamp_ids(part)
        # One context per address and part: the messages of a part to one address share
        # everything a context holds (settings, capabilities, role), and building one per
        # message cost ~2 us each on the send path.
        contexts: dict[str, HookContext] = {}
        for message in part:
            ctx = contexts.get(message.address)
            if ctx is None:
                ctx = self.context(message.address, capabilities, role="producer",
                                   broker=broker)
                ctx.batch = True
                contexts[message.address] = ctx
            verdict = self.decide_send(message, ctx)
            results.append(SendResult(message, verdict))
            if verdict.action is Action.REJECT:
                # Decided so far is sent; nothing after the rejected message is.
                rejected = MessageRejected(message.address, verdict.reason)
                return self._decide_batch(adapter, outgoing, results)[0], rejected
            if (accepted := self._accepted(message, verdict)) is not None:
                outgoing.append((accepted, ctx))
        return self._decide_batch(adapter, outgoing, results)

    def _decide_batch(self, adapter: Adapter, outgoing: list[tuple[Message, HookContext]],
                      results: list[SendResult]
                      ) -> tuple[list[tuple[Message, HookContext]], MessageRejected | None]:
        """Run ``before_send_batch`` over the accepted messages; returns what it did not
        refuse, and the first REJECT among its verdicts (its messages are not sent)."""
        if not outgoing:
            return outgoing, None
        ctx = self.context(outgoing[0][0].address, adapter.capabilities, role="producer",
                           broker=adapter.broker)
        ctx.batch = True
        # One ordered stream (a producer, a sidecar connection) sends the whole batch: the
        # duplicate detection's same-sender rule needs it here as on the one-message path,
        # or a pipelined duplicate of an unconfirmed original in an earlier batch is
        # refused as in flight instead of being dropped as a duplicate.
        senders = {message_ctx.sender for _, message_ctx in outgoing}
        if len(senders) == 1:
            ctx.sender = senders.pop()
        verdicts: dict[int, Verdict] = {}
        for answer in self.hook.before_send_batch(messages=[m for m, _ in outgoing], ctx=ctx):
            for index, verdict in (answer or {}).items():
                verdicts.setdefault(index, verdict)
        if not verdicts:
            return outgoing, None
        by_message = {id(result.message): result for result in results}
        kept: list[tuple[Message, HookContext]] = []
        rejected: MessageRejected | None = None
        for index, (message, message_ctx) in enumerate(outgoing):
            verdict = verdicts.get(index)
            if verdict is None or verdict.action is Action.CONTINUE:
                kept.append((message, message_ctx))
                continue
            self._record_verdict(message, verdict, message_ctx)
            result = by_message.get(id(message))
            if result is not None:
                result.verdict = verdict
            if verdict.action is Action.REJECT and rejected is None:
                rejected = MessageRejected(message.address, verdict.reason)
        return kept, rejected

    def _transmit(self, adapter: Adapter, outgoing: list[tuple[Message, HookContext]],
                  transaction: TransactionState | None) -> None:
        if not outgoing:
            return
        batch = [message for message, _ in outgoing]
        tx_id = transaction.transaction_id if transaction else None
        try:
            if len(batch) > 1:
                adapter.send_many(batch, transaction=tx_id)
            else:
                adapter.send(batch[0], transaction=tx_id)
        except Exception as exc:
            for message, ctx in outgoing:
                self.send_failed(message, ctx, exc)
            raise
        if transaction is not None:
            transaction.messages.extend(batch)
            return
        self._settle_sent(outgoing)

    def sent(self, message: Message, ctx: HookContext) -> None:
        """The broker confirmed a send (outside a transaction): event and ``after_send``."""
        self.events.emit(EventType.SENT, message)
        self._after_send.each(message, ctx)

    def _settle_sent(self, outgoing: list[tuple[Message, HookContext]]) -> None:
        """:meth:`sent` for a confirmed batch: its ``sent`` events in one append (one
        timestamp), ``after_send`` per message, then ``after_send_batch`` once for the
        messages decided as a batch (``ctx.batch``). This runs after the last receipt,
        with nothing else for the broker to do, so its cost is the batch's latency."""
        self.events.emit_many(EventType.SENT, [message for message, _ in outgoing])
        after_send = self._after_send
        if after_send:
            for message, ctx in outgoing:
                after_send.each(message, ctx)
        if self._after_send_batch:
            batched = [(message, ctx) for message, ctx in outgoing if ctx.batch]
            if batched:
                self._after_send_batch.each([message for message, _ in batched], batched[0][1])

    def send_failed(self, message: Message, ctx: HookContext, exc: BaseException) -> None:
        """A send was not confirmed. The broker may or may not have it: the audit
        classifies it as "unknown outcome" and reconciles it with deliveries later."""
        self.events.emit(EventType.SEND_FAILED, message, reason=repr(exc),
                         transaction=ctx.transaction)
        observe(self.hook.on_send_exception, message=message, ctx=ctx, exception=exc)

    # -- transactions ------------------------------------------------------------------

    def begin(self, adapter: Adapter) -> TransactionState:
        return TransactionState(adapter.begin())

    def commit(self, adapter: Adapter, transaction: TransactionState) -> None:
        """Commit, unless a plugin made the transaction rollback-only; then abort and raise."""
        tx_id = transaction.transaction_id
        ctx = self.transaction_context(adapter.capabilities, adapter.broker, transaction)
        reason = self.commit_check(transaction, ctx)
        if reason is not None:
            self._rollback(adapter, transaction, ctx, reason)
            raise TransactionRolledBack(tx_id, reason)
        try:
            adapter.commit(tx_id)
        except Exception as exc:
            self.commit_failed(transaction, ctx, repr(exc))
            raise
        self.committed(transaction, ctx)

    def transaction_context(self, capabilities: Capabilities, broker: str,
                            transaction: TransactionState) -> HookContext:
        address = transaction.messages[0].address if transaction.messages else ""
        return self.context(address, capabilities, role="producer",
                            transaction=transaction.transaction_id, broker=broker)

    def commit_check(self, transaction: TransactionState, ctx: HookContext) -> str | None:
        """Ask ``transaction_committing``; the rollback reason, or None when COMMIT may go on."""
        if transaction.rollback_reason is None:
            verdict = self.hook.transaction_committing(
                transaction=transaction.transaction_id, messages=list(transaction.messages),
                ctx=ctx)
            if verdict is not None and verdict.action is not Action.CONTINUE:
                transaction.rollback_reason = verdict.reason or "rejected at commit"
        return transaction.rollback_reason

    def commit_failed(self, transaction: TransactionState, ctx: HookContext,
                      reason: str) -> None:
        """The broker did not confirm a COMMIT: its sends have an unknown outcome."""
        tx_id = transaction.transaction_id
        for message in transaction.messages:
            self.events.emit(EventType.SEND_FAILED, message, reason=reason, transaction=tx_id)
        self.events.emit(EventType.TX_ROLLED_BACK, transaction=tx_id, reason=reason)
        observe(self.hook.transaction_ended, transaction=tx_id, committed=False, ctx=ctx)

    def committed(self, transaction: TransactionState, ctx: HookContext) -> None:
        """The broker confirmed a COMMIT: its messages count as sent."""
        tx_id = transaction.transaction_id
        for message in transaction.messages:
            self.events.emit(EventType.SENT, message, transaction=tx_id)
            observe(self.hook.after_send, message=message, ctx=self.context(
                message.address, ctx.capabilities, role="producer", transaction=tx_id,
                broker=ctx.broker))
        self.events.emit(EventType.TX_COMMITTED, transaction=tx_id,
                         count=len(transaction.messages))
        observe(self.hook.transaction_ended, transaction=tx_id, committed=True, ctx=ctx)

    def abort(self, adapter: Adapter, transaction: TransactionState,
              reason: str = "aborted by the application") -> None:
        ctx = self.transaction_context(adapter.capabilities, adapter.broker, transaction)
        self._rollback(adapter, transaction, ctx, reason)

    def _rollback(self, adapter: Adapter, transaction: TransactionState, ctx: HookContext,
                  reason: str) -> None:
        try:
            adapter.abort(transaction.transaction_id)
        finally:
            self.rolled_back(transaction, ctx, reason)

    def rolled_back(self, transaction: TransactionState, ctx: HookContext, reason: str) -> None:
        """Record a transaction that ended without a commit (the abort went to the broker)."""
        self.events.emit(EventType.TX_ROLLED_BACK, transaction=transaction.transaction_id,
                         reason=reason, count=len(transaction.messages))
        observe(self.hook.transaction_ended, transaction=transaction.transaction_id,
                                    committed=False, ctx=ctx)

    # -- deliver path ------------------------------------------------------------------

    def deliver(self, adapter: Adapter, delivery: Delivery, handler: Handler, *,
                queue: str) -> None:
        """Run one delivery through the hooks, the handler, and ack/nack/move.

        Called on the adapter's delivery thread (its network thread), where
        nothing may wait for the broker: hooks, handler, ack, nack and events run
        inline, but a MOVE verdict (sending the copy waits for its confirmation)
        is handed, together with the original's ack, to ``adapter.defer``.
        Never raises: every failure ends in an event and a broker-side outcome,
        because an exception here would kill the receiver and strand the
        remaining messages.
        """
        with self._serial_lock(adapter, delivery.subscription_id):
            ctx = self.open_delivery(adapter, delivery, queue=queue, handler=handler)
            if ctx is None:
                return
            try:
                handler(delivery.message)
            except Exception as error:
                self.finish_delivery(adapter, delivery, ctx, error, handler=handler)
                return
            self.finish_delivery(adapter, delivery, ctx, None, handler=handler)

    def open_delivery(self, adapter: Adapter, delivery: Delivery, *, queue: str,
                      handler: Handler | None = None) -> HookContext | None:
        """First half of a delivery: the ``before_deliver`` decision.

        Returns the context to pass to :meth:`finish_delivery` once the message has
        been handled (the wrappers call the handler in between; the sidecar hands
        the frame to its client and waits for the client's ACK or NACK), or None
        when a verdict took the delivery (suppressed, expired, moved...): it is then
        settled and must not reach the application. Never raises: a failure inside
        mqguard leaves the delivery unacknowledged (the broker redelivers it) and
        returns None.
        """
        message = delivery.message
        try:
            ctx = self._delivery_context(adapter, delivery, queue)
            verdict = self._before_deliver.first(message, ctx)
            if verdict is not None and verdict.action is not Action.CONTINUE:
                self._apply_delivery_verdict(adapter, delivery, ctx, verdict, handler)
                return None
            # (delivery_count is among the message's own event fields)
            # Its time is kept for the ``acked`` that ends a successful handling
            # (``delivered_ts``): the audit pairs the two without sorting the log.
            ctx.delivered_ts = now_ms()
            self.events.emit(EventType.DELIVERED, message, queue=queue,
                             native_delivery_count=delivery.native_delivery_count,
                             ts=ctx.delivered_ts)
            return ctx
        except Exception:
            # A plugin or the broker failed: leave the message unacknowledged so
            # the broker redelivers it (at-least-once), and say so loudly.
            log.exception("delivery of %s on %s failed inside mqguard; left unacknowledged",
                          message.message_id, queue)
            return None

    def _delivery_context(self, adapter: Adapter, delivery: Delivery, queue: str
                          ) -> HookContext:
        """A delivery's hook context, with the message id and delivery count its hooks
        see filled in. Built directly (not through context()): once per delivery."""
        message = delivery.message
        if not message.message_id:
            message.message_id = self._fallback_message_id(delivery, adapter)
        if message.delivery_count == 0:
            # Best the broker can tell; the delivery-counting plugin makes it exact.
            native = delivery.native_delivery_count
            message.delivery_count = native if native else (2 if delivery.redelivered else 1)
        address = message.address
        return HookContext(self, address, self.settings.resolve(address), adapter.capabilities,
                           "consumer", queue, None, adapter.broker, delivery.raw_headers,
                           delivery.native_delivery_count, delivery.redelivered)

    def open_deliveries(self, adapter: Adapter, deliveries: Sequence[Delivery],
                        queues: Sequence[str]) -> list[HookContext | None]:
        """:meth:`open_delivery` for several deliveries at once (the sidecar: the MESSAGEs
        of one broker read); ``queues[i]`` is ``deliveries[i]``'s queue.

        Returns, per delivery, what :meth:`open_delivery` returns, with the same
        verdicts, events, store state and hook calls per message as calling it on each
        in order, at a lower cost per message: one ``before_deliver_batch`` call per
        plugin instead of a ``before_deliver`` call per message and plugin, and the
        ``delivered`` events in one append (one timestamp, ``ctx.delivered_ts``).

        Order: plugins are asked plugin by plugin over the batch, and the verdicts are
        applied in delivery order afterwards, whereas one by one each verdict is applied
        before the next message is decided. That gives the same outcome because a
        decision depends only on earlier deliveries of the same message (its id: the
        delivery count) or of the same send (its producer and sequence: the consumer
        audit), so a batch is cut before such a repeat: the earlier one's verdict is
        applied before the repeat is decided. Plugins that implement only
        ``before_deliver`` may rely on any order, so when one is registered every
        delivery takes :meth:`open_delivery`. Never raises; a failure inside mqguard
        (a plugin or the store raising) leaves every delivery of the failing call
        unacknowledged (None), where one by one only the message it failed on would be:
        the broker redelivers them, nothing is lost.
        """
        if len(deliveries) < 2 or not self._before_deliver_batch.covered():
            return [self.open_delivery(adapter, delivery, queue=queue)
                    for delivery, queue in zip(deliveries, queues, strict=True)]
        results: list[HookContext | None] = []
        chunk: list[tuple[Delivery, HookContext]] = []
        ids: set[str] = set()
        sends: set[tuple[str, int]] = set()
        for delivery, queue in zip(deliveries, queues, strict=True):
            message = delivery.message
            try:
                ctx = self._delivery_context(adapter, delivery, queue)
            except Exception:
                log.exception("delivery of %s on %s failed inside mqguard; left unacknowledged",
                              message.message_id, queue)
                if chunk:  # keep the results in delivery order
                    self._open_chunk(adapter, chunk, results)
                    chunk, ids, sends = [], set(), set()
                results.append(None)
                continue
            send = ((message.producer_id, message.sequence)
                    if message.producer_id is not None and message.sequence is not None
                    else None)
            if message.message_id in ids or (send is not None and send in sends):
                # A repeat: decided after the earlier delivery's verdict was applied.
                self._open_chunk(adapter, chunk, results)
                chunk, ids, sends = [], set(), set()
            chunk.append((delivery, ctx))
            ids.add(message.message_id)
            if send is not None:
                sends.add(send)
        if chunk:
            self._open_chunk(adapter, chunk, results)
        return results

    def _open_chunk(self, adapter: Adapter, chunk: list[tuple[Delivery, HookContext]],
                    results: list[HookContext | None]) -> None:
        """Decide ``chunk`` (distinct deliveries) in one batch call per plugin, apply the
        verdicts in order and write the ``delivered`` events; appends to ``results``."""
        messages = [delivery.message for delivery, _ in chunk]
        contexts = [ctx for _, ctx in chunk]
        try:
            verdicts = self._before_deliver_batch.decide(messages, contexts)
        except Exception:
            log.exception("deliveries of %d messages (%s...) on %s failed inside mqguard; "
                          "left unacknowledged", len(chunk), messages[0].message_id,
                          contexts[0].queue)
            results.extend([None] * len(chunk))
            return
        ts = now_ms()
        # The deliveries handed on since the last verdict: their events are written before
        # the next verdict's, so the log keeps delivery order.
        opened: list[tuple[int, Message, HookContext]] = []
        for index, (delivery, ctx) in enumerate(chunk):
            verdict = verdicts.get(index)
            if verdict is not None and verdict.action is not Action.CONTINUE:
                self._write_delivered(opened, ts, results)
                opened = []
                results.append(None)
                try:
                    self._apply_delivery_verdict(adapter, delivery, ctx, verdict, None)
                except Exception:
                    log.exception("delivery of %s on %s failed inside mqguard; left "
                                  "unacknowledged", delivery.message.message_id, ctx.queue)
                continue
            ctx.delivered_ts = ts
            opened.append((len(results), delivery.message, ctx))
            results.append(ctx)
        self._write_delivered(opened, ts, results)

    def _write_delivered(self, opened: list[tuple[int, Message, HookContext]], ts: int,
                         results: list[HookContext | None]) -> None:
        """The ``delivered`` events of ``opened`` (position in ``results``, message,
        context) in one append; if that fails they are left unacknowledged (None), as
        one by one."""
        if not opened:
            return
        try:
            self.events.emit_many(
                EventType.DELIVERED, [message for _, message, _ in opened], ts=ts,
                names=("queue", "native_delivery_count"),
                values=[(ctx.queue, ctx.native_delivery_count) for _, _, ctx in opened])
        except Exception:
            log.exception("delivery of %d messages failed inside mqguard; left unacknowledged",
                          len(opened))
            for position, _, _ in opened:
                results[position] = None

    def finish_deliveries(self, adapter: Adapter,
                          items: Sequence[tuple[Delivery, HookContext, BaseException | None]]
                          ) -> None:
        """:meth:`finish_delivery` for several deliveries (the sidecar: the ACKs and NACKs
        of one client read), in order, with the same hook calls, acknowledgements, events
        and store state per message as calling it on each.

        Consecutive successes (``error`` None) are finished together: ``after_deliver``
        and ``message_acknowledged`` once per plugin that has the batch twin (per message
        for the others, plugin by plugin: they are observers, and none of them decides
        anything in between), the acknowledgements in order, the ``acked`` events in one
        append. A failure is finished on its own, in its place. Never raises.
        """
        run: list[tuple[Delivery, HookContext]] = []
        for delivery, ctx, error in items:
            if error is None:
                run.append((delivery, ctx))
                continue
            if run:
                self._finish_handled(adapter, run)
                run = []
            self.finish_delivery(adapter, delivery, ctx, error)
        if run:
            self._finish_handled(adapter, run)

    def _finish_handled(self, adapter: Adapter, run: list[tuple[Delivery, HookContext]]
                        ) -> None:
        if len(run) == 1:
            self.finish_delivery(adapter, run[0][0], run[0][1], None)
            return
        try:
            self._after_deliver_batch.each([delivery.message for delivery, _ in run],
                                           [ctx for _, ctx in run], (), (None,))
            acked: list[tuple[Delivery, HookContext]] = []
            for delivery, ctx in run:
                try:
                    adapter.ack(delivery)
                except Exception:
                    log.exception("delivery of %s on %s failed inside mqguard; left "
                                  "unacknowledged", delivery.message.message_id, ctx.queue)
                    continue
                acked.append((delivery, ctx))
            if not acked:
                return
            messages = [delivery.message for delivery, _ in acked]
            contexts = [ctx for _, ctx in acked]
            normal = str(AckReason.NORMAL)
            self.events.emit_many(
                EventType.ACKED, messages,
                names=("queue", "ack_reason", "handled", "delivered_ts"),
                values=[(ctx.queue, normal, True, ctx.delivered_ts) for ctx in contexts])
            self._acknowledged_batch.each(messages, contexts, (AckReason.NORMAL,),
                                          (AckReason.NORMAL,))
        except Exception:
            log.exception("deliveries of %d messages (%s...) on %s failed inside mqguard",
                          len(run), run[0][0].message.message_id, run[0][1].queue)

    def finish_delivery(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                        error: BaseException | None, *, handler: Handler | None = None,
                        settled: bool = False) -> None:
        """Second half of a delivery: after the handler succeeded (``error`` None) or failed.

        Success runs ``after_deliver`` and acknowledges (unless ``settled``: the
        acknowledgement already went to the broker, e.g. inside a client's
        transaction); failure goes to ``on_handler_failure`` (redelivery, dead
        letter). ``handler`` is needed only for in-process redelivery (``hold-local``).
        Never raises.
        """
        message = delivery.message
        try:
            if error is not None:
                self._handler_failed(adapter, delivery, ctx, error, handler)
                return
            self._after_deliver.each(message, ctx, None)
            if settled:
                self._acknowledged_elsewhere(delivery, ctx, AckReason.NORMAL, handled=True)
            else:
                self._ack(adapter, delivery, ctx, AckReason.NORMAL, handled=True)
        except Exception:
            log.exception("delivery of %s on %s failed inside mqguard; left unacknowledged",
                          message.message_id, ctx.queue)

    def _serial_lock(self, adapter: Adapter, subscription_id: str) -> threading.Lock:
        key = (id(adapter), subscription_id)
        lock = self._serial.get(key)
        if lock is None:
            with self._serial_guard:
                lock = self._serial.setdefault(key, threading.Lock())
        return lock

    def _fallback_message_id(self, delivery: Delivery, adapter: Adapter) -> str:
        # A message not sent through a guard has no mqguard id. Where the broker's
        # id is stable it is the best stand-in; elsewhere the id is per delivery.
        broker_id = delivery.message.broker_message_id
        if broker_id and adapter.capabilities.stable_message_id:
            return f"broker:{broker_id}"
        return f"unguarded:{per_process_unique_id()}"

    def _handler_failed(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                        error: BaseException, handler: Handler | None) -> None:
        message = delivery.message
        self.events.emit(EventType.HANDLER_FAILED, message, queue=ctx.queue,
                         reason=f"{type(error).__name__}: {error}"[:500])
        observe(self.hook.after_deliver, message=message, ctx=ctx, error=error)
        verdict = self.hook.on_handler_failure(message=message, ctx=ctx, error=error)
        if verdict is None:
            # No plugin took charge. Only a broker whose NACK requeues gets one: an
            # ActiveMQ 5 NACK is a poison ack (straight to ActiveMQ.DLQ) and MQTT has
            # none, so there the delivery stays unacknowledged and the broker
            # redelivers it when the consumer reconnects. Nothing is lost either way.
            if adapter.capabilities.nack_requeue:
                self._nack(adapter, delivery, ctx)
            else:
                self.events.emit(EventType.NACKED, message, queue=ctx.queue, requeue=False)
                observe(self.hook.message_nacked, message=message, ctx=ctx, requeue=False)
        elif verdict.action is Action.CONTINUE:
            if verdict.event:
                self._record_verdict(message, verdict, ctx)
            self._ack(adapter, delivery, ctx, verdict.ack_reason)
        else:
            self._apply_delivery_verdict(adapter, delivery, ctx, verdict, handler)

    def _apply_delivery_verdict(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                                verdict: Verdict, handler: Handler | None) -> None:
        if verdict.action is Action.REDELIVER:
            self._redeliver(adapter, delivery, ctx, verdict, handler)
            return
        if verdict.action is Action.MOVE and verdict.address:
            # The copy's send waits for a confirmation that only the delivery thread
            # reads: move and ack on the adapter's dispatcher thread instead (always,
            # not only on the delivery thread: a held redelivery runs under the
            # subscription's lock, which the delivery thread may be waiting for).
            # Later deliveries go on meanwhile; the original stays unacknowledged
            # until the copy is confirmed.
            adapter.defer(lambda: self._deferred_delivery_verdict(adapter, delivery, ctx,
                                                                  verdict))
            return
        self._settle_delivery_verdict(adapter, delivery, ctx, verdict)

    # -- redelivery --------------------------------------------------------------------

    def _redeliver(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                   verdict: Verdict, handler: Handler | None) -> None:
        """Give the delivery back for another attempt after ``verdict.delay_ms``.

        The mechanism depends on the broker (:mod:`mqguard.redelivery`); in every
        case the broker keeps the message until its next delivery is arranged, so
        a crash at any point loses nothing.
        """
        message = delivery.message
        delay = verdict.delay_ms
        mechanism = choose_mechanism(adapter.capabilities, delay)
        self.events.emit(EventType.REDELIVERY_SCHEDULED, message, queue=ctx.queue,
                         delay_ms=delay, mechanism=mechanism.value,
                         delivery_count=message.delivery_count, reason=verdict.reason or None)
        if mechanism is Mechanism.NACK:
            self._nack(adapter, delivery, ctx)
        elif mechanism is Mechanism.BROKER_DELAY:
            adapter.defer(lambda: self._resend_delayed(adapter, delivery, ctx, delay))
        elif mechanism is Mechanism.HOLD_NACK:
            self.redelivery_timer.call_later(delay, lambda: self._release_held(
                adapter, delivery, ctx, handler, requeue=True))
        else:
            self.redelivery_timer.call_later(delay, lambda: self._release_held(
                adapter, delivery, ctx, handler, requeue=False))

    def _nack(self, adapter: Adapter, delivery: Delivery, ctx: HookContext) -> None:
        adapter.nack(delivery, requeue=True)
        self.events.emit(EventType.NACKED, delivery.message, queue=ctx.queue, requeue=True)
        observe(self.hook.message_nacked, message=delivery.message, ctx=ctx, requeue=True)

    def _resend_delayed(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                        delay_ms: int) -> None:
        """``broker-delay``: the same message again, held back by the broker; then the ack.

        Copy first, then the ack, never in one broker transaction: ActiveMQ schedules a
        delayed message sent in a transaction only *after* the commit (``SchedulerBroker``,
        ``afterCommit``), so a broker crash between the commit and the scheduling kept the
        ack and lost the copy (measured: one poison message lost in a 100,000-message fault
        run). Sent on its own, the copy is in the scheduler's store before its receipt. A
        crash between the two yields two deliveries of one message id (the copy and the
        original, redelivered), never none; delivery counting counts both, and the consumer
        audit suppresses the second once the first was handled.
        """
        message = delivery.message
        headers = dict(message.headers)
        headers[PRIOR_DELIVERIES_HEADER] = str(message.delivery_count)
        again = Message(address=message.address, body=message.body,
                        headers=headers, message_id=message.message_id,
                        duplicate_id=message.duplicate_id, expiration=message.expiration,
                        producer_id=message.producer_id, sequence=message.sequence,
                        scheduled_delivery=now_ms() + delay_ms if delay_ms > 0 else 0)
        try:
            adapter.send(again)
        except Exception as exc:
            if not adapter.can_settle(delivery):
                # Its connection ended first (the broker went away, or a sidecar session
                # ended without a DISCONNECT): an outcome of the network, not a fault here.
                log.warning("redelivery of %s on %s through the broker's scheduler not "
                            "arranged: the connection ended first (%s); the broker "
                            "redelivers it without the delay", message.message_id,
                            ctx.queue, exc)
            else:
                log.exception("redelivery of %s on %s through the broker's scheduler failed; "
                              "left unacknowledged, the broker redelivers it",
                              message.message_id, ctx.queue)
            return
        try:
            adapter.ack(delivery)
        except Exception:
            log.exception("redelivery of %s on %s is scheduled, but the original could not be "
                          "acknowledged: the broker redelivers it too (one more delivery of "
                          "it, counted)", message.message_id, ctx.queue)

    def _release_held(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                      handler: Handler | None, *, requeue: bool) -> None:
        """A held delivery is due: NACK it back to the broker, or deliver it here again."""
        if not adapter.can_settle(delivery):
            # Its connection was lost meanwhile: the broker redelivers it by itself.
            log.debug("held redelivery of %s on %s skipped: its connection has ended",
                      delivery.message.message_id, ctx.queue)
            return
        if requeue:
            with self._serial_lock(adapter, delivery.subscription_id):
                self._nack(adapter, delivery, ctx)
            return
        if handler is None:
            # Opened without a handler (the sidecar, whose STOMP brokers never pick
            # hold-local): nothing here can run it again; the broker redelivers it.
            log.warning("held redelivery of %s on %s has no handler to run; left "
                        "unacknowledged for the broker", delivery.message.message_id, ctx.queue)
            return
        delivery.message.delivery_count += 1
        delivery.redelivered = True
        self.deliver(adapter, delivery, handler, queue=ctx.queue or delivery.message.address)

    def _deferred_delivery_verdict(self, adapter: Adapter, delivery: Delivery,
                                   ctx: HookContext, verdict: Verdict) -> None:
        try:
            self._settle_delivery_verdict(adapter, delivery, ctx, verdict)
        except Exception:
            # As in deliver(): the broker redelivers what was not acknowledged.
            log.exception("delivery of %s on %s failed inside mqguard; left unacknowledged",
                          delivery.message.message_id, ctx.queue)

    def _settle_delivery_verdict(self, adapter: Adapter, delivery: Delivery,
                                 ctx: HookContext, verdict: Verdict) -> None:
        message = delivery.message
        if verdict.action is Action.MOVE and verdict.address:
            self.move(adapter, message, verdict.address, ctx, verdict.reason,
                      expiry=verdict.expiry)
            if verdict.event:
                self.events.emit(verdict.event, message, queue=ctx.queue,
                                 reason=verdict.reason or None, target=verdict.address)
        else:
            event = verdict.event or EventType.DELIVERY_DROPPED
            self.events.emit(event, message, queue=ctx.queue, reason=verdict.reason or None)
        self._ack(adapter, delivery, ctx, verdict.ack_reason)
        if verdict.expiry:
            observe(self.hook.message_expired, message=message, ctx=ctx, moved_to=verdict.address)

    def _ack(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
             reason: AckReason, *, handled: bool = False) -> None:
        adapter.ack(delivery)
        self._acknowledged_elsewhere(delivery, ctx, reason, handled=handled)

    def _acknowledged_elsewhere(self, delivery: Delivery, ctx: HookContext,
                                reason: AckReason, *, handled: bool = False) -> None:
        """The ``acked`` event (and hook). ``handled``: it ends a successful handling --
        the handler returned for the delivery opened at ``ctx.delivered_ts`` -- which the
        event says (``handled``, ``delivered_ts``) so the audit needs no writing order."""
        message = delivery.message
        self.events.emit(EventType.ACKED, message, queue=ctx.queue, ack_reason=str(reason),
                         handled=handled,
                         delivered_ts=ctx.delivered_ts if handled else None)
        self._acknowledged.each(message, ctx, reason)

    def move(self, adapter: Adapter, message: Message, address: str, ctx: HookContext,
             reason: str, *, expiry: bool = False, transaction: str | None = None) -> Message:
        """Send a copy of ``message`` to ``address`` with Artemis's ``_AMQ_ORIG_*`` headers.

        The copy is confirmed by the broker before the caller acknowledges the
        original, so a crash in between yields a duplicate copy, never a loss.
        No copy keeps the original's expiration (a dead letter would otherwise expire
        out of its dead-letter address); an ``expiry`` copy also carries
        ``_AMQ_ACTUAL_EXPIRY``, the time it was expired. Inside a ``transaction`` the
        copy is sent at COMMIT and the caller writes the events after it (the
        ``moved`` event and hook are then left to the caller too).
        """
        copy = message.copy_for(address, delivery_count=0)
        # Artemis QueueImpl.makeCopy sets the copy's expiration to 0 for every move, dead
        # letters included: the TTL was about delivering the original.
        copy.expiration = 0
        if expiry:
            copy.headers[ACTUAL_EXPIRY_HEADER] = str(now_ms())
        copy.headers[ORIG_ADDRESS_HEADER] = message.address
        copy.headers[ORIG_QUEUE_HEADER] = ctx.queue or message.address
        copy.headers[ORIG_MESSAGE_ID_HEADER] = message.message_id
        copy.headers[MOVE_REASON_HEADER] = reason[:500]
        copy.headers.pop(PRIOR_DELIVERIES_HEADER, None)
        adapter.send(copy, transaction=transaction)
        if transaction is None:
            self.moved(message, copy, ctx, reason)
        return copy

    def moved(self, message: Message, copy: Message, ctx: HookContext, reason: str) -> None:
        """Record a confirmed move: the ``moved`` event and the ``message_moved`` hook."""
        self.events.emit(EventType.MOVED, message, queue=ctx.queue, target=copy.address,
                         new_message_id=copy.message_id, reason=reason or None)
        observe(self.hook.message_moved, original=message, copy=copy, ctx=ctx, reason=reason)
