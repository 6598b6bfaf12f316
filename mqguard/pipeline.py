"""The guard pipeline: the send path and the deliver/ack path.

:class:`Guard` owns the configuration, the store, the event log and the plugin
manager, and turns hook verdicts into broker actions through an adapter. The
producer and consumer wrappers, and the sidecar, are thin shells around it: they
drive it through two pairs of calls, :meth:`Guard.decide_sends` /
:meth:`Guard.settle_sends` for sends and :meth:`Guard.open_deliveries` /
:meth:`Guard.finish_deliveries` for deliveries, plus the transaction calls
(docs/embedding.md). Every outcome writes exactly one terminal event per message
and path, which is what makes the event log auditable.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
    MOVED_AT_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    PRIOR_DELIVERIES_HEADER,
    Message,
    encode_ids,
    now_ms,
    per_process_unique_id,
)
from mqguard.plugin_manager import check_plugins, make_plugin_manager
from mqguard.redelivery import Mechanism, RedeliveryTimer, choose_mechanism
from mqguard.stores import Store, open_store
from mqguard.verdict import AckReason, Action, Verdict

if TYPE_CHECKING:
    import pluggy

__all__ = ["Guard", "Handler", "SendDecision", "SendResult", "TransactionState",
           "make_event_log"]

log = logging.getLogger("mqguard.pipeline")

Handler = Callable[[Message], object]

_DEFAULT_EVENT = {
    Action.REJECT: EventType.REJECTED,
    Action.DROP: EventType.DROPPED,
    Action.MOVE: EventType.MOVED,
}


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
    header), and ``os.urandom`` releases the GIL, which on a busy machine lets another
    thread in and stalls the send path for up to milliseconds.
    """
    missing = [message for message in messages if not message.message_id]
    if missing:
        count = len(missing)
        pool = _ID_BITS.getrandbits(8 * ID_BYTES * count).to_bytes(ID_BYTES * count, "big")
        for message, message_id in zip(missing, encode_ids(pool), strict=True):
            message.message_id = message_id


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the guard decided for one message of a send, and what the sender is told.

    One per decided message of a :class:`SendDecision`, in the order given. The
    message goes to the broker when :attr:`forward` is set: the message itself
    (``verdict`` CONTINUE) or its moved copy (``verdict`` MOVE). Otherwise a verdict
    took it: DROP (the send still succeeds for the sender, as Artemis treats a
    duplicate) or REJECT (the send fails with ``verdict.reason``).
    """

    #: The sender's message, stamped with its mqguard id.
    message: Message
    #: The deciding verdict: ``before_send``'s, or ``before_send_batch``'s when that
    #: refused what ``before_send`` accepted; CONTINUE when no hook objected.
    verdict: Verdict
    #: What goes to the broker for it: ``message``, its moved copy (same mqguard id), or
    #: None (dropped, rejected).
    forward: Message | None
    #: The hook context it was decided with, passed on to ``after_send`` and
    #: ``on_send_exception`` when it is settled.
    ctx: HookContext
    #: The transaction it was sent in, if any.
    transaction: TransactionState | None = None

    @property
    def sent(self) -> bool:
        """True when the message or its copy goes to the broker (in a transaction: at
        COMMIT); outside :meth:`Guard.send_batch`, once the front end wrote it."""
        return self.forward is not None

    @property
    def moved(self) -> bool:
        """True when :attr:`forward` is a copy for another address (a MOVE verdict)."""
        return self.forward is not None and self.forward is not self.message

    @property
    def dropped(self) -> bool:
        """True when a verdict swallowed it: the send succeeds for the sender all the same."""
        return self.forward is None and self.verdict.action is not Action.REJECT

    @property
    def rejected(self) -> bool:
        """True when a verdict refused it: the send fails for the sender."""
        return self.verdict.action is Action.REJECT

    @property
    def reason(self) -> str:
        """Why a verdict dropped, rejected or moved it ("" when forwarded unchanged)."""
        return self.verdict.reason


@dataclass(frozen=True, slots=True)
class SendDecision:
    """What :meth:`Guard.decide_sends` decided for a batch of messages: plain data.

    The front end writes :attr:`outgoing` to the broker in order (each result's
    ``forward``, to ``forward.address``), answers each sender as :attr:`results` says,
    and reports what the broker confirmed or refused to :meth:`Guard.settle_sends`.
    """

    #: One per decided message, in the order given. Outside a transaction deciding stops
    #: at the first message ``before_send`` rejects: it is the last one here.
    results: tuple[SendResult, ...]
    #: The results whose ``forward`` goes to the broker, in order.
    outgoing: tuple[SendResult, ...]
    #: The first rejected result in order, if any.
    rejected: SendResult | None
    #: How many messages after a REJECT were not decided (outside a transaction): they
    #: have no duplicate id reserved and no event, and must not be sent.
    undecided: int
    #: The transaction the messages were decided in, if any.
    transaction: TransactionState | None = None


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

    def decide_sends(self, messages: Sequence[Message], capabilities: Capabilities, *,
                     broker: str = "unknown", role: str = "producer",
                     sender: str | None = None, transaction: TransactionState | None = None,
                     batch: bool = True) -> SendDecision:
        """First half of a send: decide ``messages`` (to go to a broker of ``broker``'s
        kind, with ``capabilities``), in order; nothing is written to a broker here.

        Each message without one gets its mqguard id, and, where the address has a
        dead-letter or expiry target, its send time (``sent_at``, kept when it has one).
        Then ``before_send`` decides each message, up to the first REJECT outside a
        transaction (nothing after it is decided: :attr:`SendDecision.undecided`);
        inside ``transaction`` a REJECT makes the transaction rollback-only (Artemis: its
        COMMIT fails) and deciding goes on.
        With ``batch`` (only outside a transaction) the messages share one context per
        address with ``ctx.batch`` True, and ``before_send_batch`` is then called once
        over everything ``before_send`` accepted (the duplicate-ID reservation of the
        whole batch: one store round trip per address); what it refuses is not sent.
        Without ``batch`` each message has a context of its own and no batch hook runs
        (the one-message path, and every send in a transaction). Every verdict other than
        CONTINUE is recorded as its event here.

        ``sender`` names one ordered stream of sends whose confirmations come back in
        order (a sidecar client connection; ``ctx.sender``). ``role`` is the hook
        contexts' role. Raises what a plugin raises; then nothing was decided.

        Every forwarded result must be settled once with :meth:`settle_sends`: the
        duplicate detection holds the ids it reserved until then.
        """
        _stamp_ids(messages)
        if transaction is not None:
            batch = False
        tx_id = transaction.transaction_id if transaction is not None else None
        first = self._before_send.first
        record = self._record_verdict
        results: list[SendResult] = []
        append = results.append
        contexts: dict[str, HookContext] = {}
        # Per address of the batch: whether its messages get their send time stamped.
        stamped: dict[str, bool] = {}
        sent_at = 0
        # Positions (in results) of the messages forwarded, for before_send_batch.
        forwarded: list[int] = []
        # Whether some result forwards nothing, and whether one is a REJECT.
        held = refused = False
        for message in messages:
            if batch:
                # One context per address and batch: the messages of a batch to one
                # address share everything a context holds (settings, capabilities,
                # role), and building one per message cost ~2 us each on the send path.
                ctx = contexts.get(message.address)
                if ctx is None:
                    ctx = contexts[message.address] = self._send_context(
                        message.address, capabilities, role, None, broker, sender, True)
                    stamped[message.address] = ctx.settings.has_move_target
                stamp = stamped[message.address]
            else:
                ctx = self._send_context(message.address, capabilities, role, tx_id, broker,
                                         sender, False)
                stamp = ctx.settings.has_move_target
            if stamp and not message.sent_at:
                # The send time, once (a message sent again keeps its first), before the
                # hooks: a copy they move it to keeps it too. One clock read per batch.
                message.sent_at = sent_at = sent_at or now_ms()
            verdict = first(message, ctx)
            if verdict is None or verdict.action is Action.CONTINUE:
                if batch:
                    forwarded.append(len(results))
                append(SendResult(message, verdict or _CONTINUE, message, ctx, transaction))
                continue
            record(message, verdict, ctx)
            action = verdict.action
            if action is Action.MOVE and verdict.address:
                moved = message.copy_for(verdict.address)
                moved.message_id = message.message_id
                if batch:
                    forwarded.append(len(results))
                append(SendResult(message, verdict, moved, ctx, transaction))
                continue
            append(SendResult(message, verdict, None, ctx, transaction))
            held = True
            if action is Action.REJECT:
                refused = True
                if transaction is None:
                    break
                transaction.rollback_reason = transaction.rollback_reason or verdict.reason
        if forwarded:
            batch_held, batch_refused = self._decide_batch(results, forwarded, capabilities,
                                                           role, broker, sender)
            held, refused = held or batch_held, refused or batch_refused
        decided = tuple(results)
        if not held:  # the common case: everything goes to the broker
            return SendDecision(decided, decided, None, len(messages) - len(decided),
                                transaction)
        rejected = None
        if refused:
            rejected = next(result for result in decided
                            if result.verdict.action is Action.REJECT)
        return SendDecision(decided, tuple([result for result in decided
                                                   if result.forward is not None]),
                            rejected, len(messages) - len(decided), transaction)

    def _send_context(self, address: str, capabilities: Capabilities, role: str,
                      transaction: str | None, broker: str, sender: str | None,
                      batch: bool) -> HookContext:
        ctx = HookContext(self, address, self.settings.resolve(address), capabilities, role,
                          None, transaction, broker)
        ctx.sender = sender
        ctx.batch = batch
        return ctx

    def _decide_batch(self, results: list[SendResult], forwarded: list[int],
                      capabilities: Capabilities, role: str, broker: str,
                      sender: str | None) -> tuple[bool, bool]:
        """Run ``before_send_batch`` over the forwarded messages (``results[i]`` for ``i``
        in ``forwarded``); a result it refuses is replaced by one without ``forward``
        carrying its verdict. Returns whether it refused any, and whether a REJECT."""
        outgoing = [forward for position in forwarded
                    if (forward := results[position].forward) is not None]
        ctx = self._send_context(outgoing[0].address, capabilities, role, None, broker, sender,
                                 True)
        verdicts: dict[int, Verdict] = {}
        for answer in self.hook.before_send_batch(messages=outgoing, ctx=ctx):
            for index, verdict in (answer or {}).items():
                verdicts.setdefault(index, verdict)
        if not verdicts:
            return False, False
        held = rejected = False
        for index, verdict in sorted(verdicts.items()):
            if verdict.action is Action.CONTINUE or not 0 <= index < len(forwarded):
                continue
            position = forwarded[index]
            result = results[position]
            refused = outgoing[index]
            # Recorded for what it refused: the message, or its moved copy.
            self._record_verdict(refused, verdict, result.ctx)
            results[position] = SendResult(result.message, verdict, None, result.ctx,
                                           result.transaction)
            held = True
            rejected = rejected or verdict.action is Action.REJECT
        return held, rejected

    def settle_sends(self, confirmed: Iterable[SendResult] = (),
                     failed: Iterable[SendResult] = (), *,
                     error: BaseException | None = None) -> None:
        """Second half of a send: what the broker did with forwarded results of
        :meth:`decide_sends` (any decisions' results, each settled once).

        ``confirmed``: the broker has them. Outside a transaction they are sent: their
        ``sent`` events in one append (one timestamp), ``after_send`` per message, then
        ``after_send_batch`` once for those decided as a batch; inside one they are
        recorded in the transaction, whose COMMIT (:meth:`committed`) sends them.
        ``failed``: the broker did not confirm them (``error`` says why, and is
        required with them): the broker may or may not have them, so each gets a
        ``send_failed`` event (the audit classifies it as an unknown outcome and
        reconciles it with deliveries later) and ``on_send_exception``; a duplicate id
        reserved for it is released. Results without ``forward`` are ignored.
        """
        if error is None:
            failed = [result for result in failed if result.forward is not None]
            if failed:
                raise ValueError("settle_sends: failed sends need the error that failed them")
        sent: list[tuple[Message, HookContext]] = []
        for result in confirmed:
            forward = result.forward
            if forward is None:
                continue
            if result.transaction is None:
                sent.append((forward, result.ctx))
            else:
                result.transaction.messages.append(forward)
        if sent:
            self._sent(sent)
        for result in failed:
            forward = result.forward
            if forward is None:
                continue
            ctx = result.ctx
            self.events.emit(EventType.SEND_FAILED, forward, reason=repr(error),
                             transaction=ctx.transaction)
            observe(self.hook.on_send_exception, message=forward, ctx=ctx, exception=error)

    def _sent(self, sent: list[tuple[Message, HookContext]]) -> None:
        """Confirmed sends outside transactions. This runs after the last receipt, with
        nothing else for the broker to do, so its cost is the batch's latency."""
        self.events.emit_many(EventType.SENT, [message for message, _ in sent])
        after_send = self._after_send
        if after_send:
            for message, ctx in sent:
                after_send.each(message, ctx)
        if self._after_send_batch:
            batched = [(message, ctx) for message, ctx in sent if ctx.batch]
            if batched:
                self._after_send_batch.each([message for message, _ in batched], batched[0][1])

    def send(self, adapter: Adapter, message: Message, *,
             transaction: TransactionState | None = None) -> SendResult:
        """Guard and send one message. Raises MessageRejected on a REJECT verdict."""
        return self.send_batch(adapter, [message], transaction=transaction)[0]

    def send_batch(self, adapter: Adapter, messages: Sequence[Message], *,
                   transaction: TransactionState | None = None) -> list[SendResult]:
        """Guard several messages and send the accepted ones pipelined; return once the
        broker confirmed them (or, in a transaction, once they are written).

        :meth:`decide_sends` (as one batch when there are several messages outside a
        transaction), the forwarded messages to the adapter in one ``send_many``, then
        :meth:`settle_sends`. Outside a transaction a REJECT raises
        :class:`MessageRejected` after the accepted messages were sent; nothing after a
        message ``before_send`` rejects is decided or sent. Inside a transaction a REJECT
        marks the transaction rollback-only (Artemis semantics): COMMIT will fail. Outside
        a transaction every message that reached the adapter gets exactly one ``sent`` or
        ``send_failed`` event before this returns or raises.
        """
        decision = self.decide_sends(messages, adapter.capabilities, broker=adapter.broker,
                                     transaction=transaction, batch=len(messages) > 1)
        outgoing = decision.outgoing
        if outgoing:
            tx_id = transaction.transaction_id if transaction is not None else None
            try:
                batch = [result.forward for result in outgoing if result.forward is not None]
                if len(batch) > 1:
                    adapter.send_many(batch, transaction=tx_id)
                else:
                    adapter.send(batch[0], transaction=tx_id)
            except Exception as exc:
                self.settle_sends(failed=outgoing, error=exc)
                raise
            self.settle_sends(outgoing)
        rejected = decision.rejected
        if rejected is not None and transaction is None:
            raise MessageRejected(rejected.message.address, rejected.verdict.reason)
        return list(decision.results)

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
                self.apply_delivery_verdict(adapter, delivery, ctx, verdict, handler)
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
                    self.apply_delivery_verdict(adapter, delivery, ctx, verdict)
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
            self.apply_delivery_verdict(adapter, delivery, ctx, verdict, handler)

    def apply_delivery_verdict(self, adapter: Adapter, delivery: Delivery, ctx: HookContext,
                               verdict: Verdict, handler: Handler | None = None) -> None:
        """Settle an opened delivery with ``verdict`` instead of handing it on (or after
        its handler failed): REDELIVER, MOVE (a copy to ``verdict.address``, then the
        original's ack), DROP (the ack), each with its events and hooks.

        ``ctx`` is what :meth:`open_delivery` returned for it. A front end uses this for
        a delivery it cannot hand to its application, e.g. the sidecar for a MESSAGE its
        client could not read (``Verdict.move(dead_letter_address, why)``). ``handler``
        is needed only for in-process redelivery (``hold-local``). A MOVE's copy and ack
        run on the adapter's dispatcher thread (``adapter.defer``).
        """
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
                        scheduled_delivery=now_ms() + delay_ms if delay_ms > 0 else 0,
                        sent_at=message.sent_at)
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
        ``_AMQ_ACTUAL_EXPIRY``, the time it was expired. The copy keeps the original's
        send time (``mqguard-sent-at``), as Artemis's copy keeps the original's timestamp
        (there is no ``_AMQ_ORIG_TIMESTAMP``). Inside a ``transaction`` the
        copy is sent at COMMIT and the caller writes the events after it (the
        ``moved`` event and hook are then left to the caller too).
        """
        copy = message.copy_for(address, delivery_count=0)
        # Artemis QueueImpl.makeCopy sets the copy's expiration to 0 for every move, dead
        # letters included: the TTL was about delivering the original.
        copy.expiration = 0
        # And keeps its timestamp (CoreMessage's copy): the original's send time travels
        # as the copy's mqguard-sent-at, the "original send" of ``mqguard dlq show``.
        copy.sent_at = message.sent_at
        if expiry:
            copy.headers[ACTUAL_EXPIRY_HEADER] = str(now_ms())
        copy.headers[ORIG_ADDRESS_HEADER] = message.address
        copy.headers[ORIG_QUEUE_HEADER] = ctx.queue or message.address
        copy.headers[ORIG_MESSAGE_ID_HEADER] = message.message_id
        copy.headers[MOVE_REASON_HEADER] = reason[:500]
        copy.headers[MOVED_AT_HEADER] = str(now_ms())
        if message.delivery_count:
            copy.headers[ORIG_DELIVERY_COUNT_HEADER] = str(message.delivery_count)
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
