"""``delivery_counting``: exact delivery counts, redelivery policy, dead-letter routing.

Artemis semantics (``QueueImpl.checkRedelivery``, ``sendToDeadLetterAddress``),
on brokers that have no delivery count of their own:

* Every delivery to a guarded consumer counts, in the store, keyed by queue and
  mqguard message id, so the count survives consumer restarts (with a shared
  store) and broker redeliveries. Where the broker counts too (RabbitMQ quorum
  queues, ``x-delivery-count``) the two agree; the larger one wins if they ever
  differ (a flushed store).
* A handler failure with ``count < max-delivery-attempts`` is redelivered after
  ``redelivery-delay * multiplier^(count-1)``, varied by
  ``redelivery-collision-avoidance-factor``, capped at ``max-redelivery-delay``
  (how: :mod:`mqguard.redelivery`). ``max-delivery-attempts`` of -1 (or 0, as in
  Artemis's code) means unlimited.
* At ``count >= max`` it moves to the dead-letter target
  (:meth:`~mqguard.settings.AddressSettings.dead_letter_target`): a copy with
  ``_AMQ_ORIG_ADDRESS``, ``_AMQ_ORIG_QUEUE``, ``_AMQ_ORIG_MESSAGE_ID``, the
  failure reason and a new message id; the original is acknowledged KILLED. With
  no target it is dropped with a WARN and a ``delivery_dropped`` event.
* A delivery that arrives with ``count > max`` (the consumer died while
  handling the max-th delivery, e.g. a message that crashes the process) is
  dead-lettered without calling the handler.

* A count outlives its message's settlement by ``settled-count-grace-ms`` (default
  1 h): acks are not confirmed, and when one is lost (the guard or the broker died
  before the broker had it) the broker redelivers a message the guard had already
  dead-lettered or acked; a delayed-redelivery copy whose original's ack was lost
  arrives after the queue's backlog, however long that is. That delivery counts on
  from the settled count, so it goes to the dead-letter path again (a second copy
  there: a duplicate, never a loss) instead of reaching the handler once more. The
  broker must keep its ``redelivered`` flag across its own restarts (ActiveMQ Classic:
  ``persistJMSRedelivered``).

Cost: a first delivery (the broker says it is not a redelivery) is counted as 1
without a store round trip; the store is written only when a delivery fails or
is a redelivery, so a healthy stream pays nothing. That is exact because a
first delivery that crashes unrecorded can only be followed by a broker
redelivery, which is then counted as at least the second.
"""

from __future__ import annotations

import logging
import math
import random

from pydantic import Field

from mqguard import hookimpl
from mqguard.config import MqguardConfig, PluginOptions, parse_plugin_options
from mqguard.context import HookContext
from mqguard.events import EventType
from mqguard.message import PRIOR_DELIVERIES_HEADER, Message, parse_wire_int
from mqguard.settings import AddressSettings
from mqguard.verdict import AckReason, Verdict

log = logging.getLogger("mqguard.plugins.delivery_counting")

NAME = "delivery_counting"


class DeliveryCountingOptions(PluginOptions):
    """``[plugins.delivery_counting]``."""

    #: Longest failure reason copied into the dead letter's header (characters).
    max_reason_length: int = Field(500, ge=16, le=8192)
    #: How long the store keeps a count after its message was settled (ms). Acks are not
    #: confirmed by the broker: when one is lost (this process or the broker dies first),
    #: the redelivery must count on from there, or a dead-lettered message would reach its
    #: handler again. The same holds for a delayed-redelivery copy whose original's ack was
    #: lost: the copy waits its turn behind the queue's backlog. Cover the longest time a
    #: message can wait in your queues.
    settled_count_grace_ms: int = Field(3_600_000, ge=0, le=7 * 24 * 3600 * 1000)


def redelivery_delay(settings: AddressSettings, delivery_count: int,
                     rng: random.Random | None = None) -> int:
    """Artemis ``QueueImpl.calculateRedeliveryDelay``, in ms, with Java's arithmetic.

    ``redelivery-delay * multiplier^(count-1)``, truncated to whole ms; with a
    collision-avoidance factor f the delay is moved by up to ±f of itself at random and
    truncated again; then capped at ``max-redelivery-delay`` (0 included).
    """
    base = settings.redelivery_delay
    if base <= 0:
        return 0
    exponent = max(0, delivery_count - 1)
    try:
        growth = settings.redelivery_delay_multiplier ** exponent
    except OverflowError:
        # Java's Math.pow gives Infinity; with unlimited attempts the count grows forever.
        growth = math.inf
    delay = _java_long(base * growth)
    factor = settings.redelivery_collision_avoidance_factor
    if factor > 0:
        draw = rng or random
        variance = (factor if draw.random() < 0.5 else -factor) * draw.random()
        delay = _java_long(delay + delay * variance)
    # Unconditional, as in Artemis: an explicit cap of 0 means "redeliver at once"; an
    # unset cap was resolved to 10 x redelivery-delay with the settings.
    return min(delay, settings.max_redelivery_delay)


_LONG_MAX = 2**63 - 1


def _java_long(value: float) -> int:
    """Java's ``(long)`` cast of a non-negative double: truncated, saturating at
    ``Long.MAX_VALUE`` (so an overflowing delay is simply capped, never an error)."""
    if value != value:  # NaN: Java gives 0
        return 0
    return _LONG_MAX if value >= _LONG_MAX else int(value)


def unlimited(settings: AddressSettings) -> bool:
    return settings.max_delivery_attempts <= 0


class DeliveryCountingPlugin:
    """One instance per guard; stateless apart from its options."""

    def __init__(self) -> None:
        self.options = DeliveryCountingOptions()
        self._rng = random.Random()

    @hookimpl
    def configure(self, config: MqguardConfig) -> None:
        self.options = parse_plugin_options(config, NAME, DeliveryCountingOptions)

    # -- counting -------------------------------------------------------------------------

    @hookimpl
    def before_deliver(self, message: Message, ctx: HookContext) -> Verdict | None:
        prior = _prior_deliveries(message)
        if not ctx.redelivered and prior is None and not (ctx.native_delivery_count or 0) > 1:
            message.delivery_count = 1  # first delivery: nothing to record yet
            return None
        queue = ctx.queue or message.address
        count = ctx.store.delivery_count_incr(queue, message.message_id)
        if count == 1:
            # The first delivery went unrecorded (it did not fail: the consumer
            # died or lost its connection while handling it), so this is at least
            # the second one.
            count = ctx.store.delivery_count_incr(queue, message.message_id)
        # A copy made for a delayed redelivery carries the deliveries before it (``prior``);
        # redelivered by the broker, the copy itself was delivered before too.
        floor = (prior or 0) + (2 if ctx.redelivered and prior is not None else 1)
        count = max(count, floor, ctx.native_delivery_count or 0)
        message.delivery_count = count
        settings = ctx.settings
        if not unlimited(settings) and count > settings.max_delivery_attempts:
            return self._dead_letter(
                message, ctx, f"delivery {count} exceeds max-delivery-attempts "
                f"({settings.max_delivery_attempts}): an earlier delivery ended without an "
                "outcome (consumer died or disconnected)")
        return None

    @hookimpl
    def before_deliver_batch(self, messages: list[Message], contexts: list[HookContext]
                             ) -> dict[int, Verdict] | None:
        """:meth:`before_deliver` on each message in order (first deliveries inline)."""
        verdicts: dict[int, Verdict] = {}
        headers_key = PRIOR_DELIVERIES_HEADER
        for index, (message, ctx) in enumerate(zip(messages, contexts, strict=True)):
            if (not ctx.redelivered and headers_key not in message.headers
                    and not (ctx.native_delivery_count or 0) > 1):
                message.delivery_count = 1  # first delivery: nothing to record yet
                continue
            verdict = self.before_deliver(message, ctx)
            if verdict is not None:
                verdicts[index] = verdict
        return verdicts or None

    @hookimpl
    def on_handler_failure(self, message: Message, ctx: HookContext,
                           error: BaseException) -> Verdict | None:
        queue = ctx.queue or message.address
        if message.delivery_count <= 1:
            # The first delivery was not recorded (see before_deliver): record it now.
            ctx.store.delivery_count_incr(queue, message.message_id)
        settings = ctx.settings
        count = message.delivery_count
        failure = f"{type(error).__name__}: {error}"
        if not unlimited(settings) and count >= settings.max_delivery_attempts:
            return self._dead_letter(
                message, ctx, f"max-delivery-attempts ({settings.max_delivery_attempts}) "
                f"reached; last failure: {failure}")
        delay = redelivery_delay(settings, count, self._rng)
        return Verdict.redeliver(delay, f"delivery {count} failed: {failure}"[:500])

    @hookimpl
    def message_acknowledged(self, message: Message, ctx: HookContext,
                             reason: AckReason) -> None:
        # A count exists only for deliveries that failed or were redeliveries (a redelivery
        # another plugin settled before this one counted it, e.g. a suppressed duplicate,
        # may have one from earlier deliveries too).
        if (message.delivery_count > 1 or reason is not AckReason.NORMAL or ctx.redelivered
                or PRIOR_DELIVERIES_HEADER in message.headers):
            # Settled, not cleared: see ``settled_count_grace_ms``.
            ctx.store.delivery_count_settle(ctx.queue or message.address, [message.message_id],
                                            self.options.settled_count_grace_ms)

    @hookimpl
    def message_acknowledged_batch(self, messages: list[Message], contexts: list[HookContext],
                                   reason: AckReason) -> None:
        """:meth:`message_acknowledged` for each, one store call per queue."""
        settle: dict[str, list[str]] = {}
        for message, ctx in zip(messages, contexts, strict=True):
            if (message.delivery_count > 1 or reason is not AckReason.NORMAL or ctx.redelivered
                    or PRIOR_DELIVERIES_HEADER in message.headers):
                settle.setdefault(ctx.queue or message.address, []).append(message.message_id)
        if settle:
            store = contexts[0].store
            for queue, message_ids in settle.items():
                store.delivery_count_settle(queue, message_ids,
                                            self.options.settled_count_grace_ms)

    # -- dead letters --------------------------------------------------------------------

    def _dead_letter(self, message: Message, ctx: HookContext, reason: str) -> Verdict:
        reason = reason[: self.options.max_reason_length]
        target = ctx.settings.dead_letter_target(message.address)
        if target is None:
            log.warning("message %s on %s dropped after %d deliveries: no dead-letter-address "
                        "is configured for it (%s)", message.message_id,
                        ctx.queue or message.address, message.delivery_count, reason)
            return Verdict.drop(f"no dead-letter-address: {reason}",
                                event=EventType.DELIVERY_DROPPED)
        return Verdict.move(target, reason, event=EventType.DEAD_LETTERED)


def _prior_deliveries(message: Message) -> int | None:
    raw = message.headers.get(PRIOR_DELIVERIES_HEADER)
    number = parse_wire_int(raw) if raw is not None else None
    return number if number is not None and number < 1_000_000_000 else None
