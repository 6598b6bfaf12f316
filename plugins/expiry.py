"""``expiry``: Artemis message expiry at send and at delivery.

At send (``PostOfficeImpl.applyExpiryDelay``) the address settings adjust the
message's expiration (absolute epoch ms, 0 = never; from STOMP ``expires``, the
MQTT 5 Message Expiry Interval or the guarded producer's ``ttl_ms``):

1. ``no-expiry = true``: the expiration is removed.
2. ``expiry-delay >= 0``: a message *without* an expiration gets ``now + expiry-delay``;
   one with an expiration keeps it (min/max are then not applied, as in Artemis).
3. Otherwise ``max-expiry-delay`` / ``min-expiry-delay`` (-1 = unset): a message without
   expiration, or expiring later than ``now + max``, gets ``now + max`` (``max = 0``
   expires it at once); else one expiring sooner than ``now + min`` gets ``now + min``
   (so a message without expiration gets ``min`` when ``max`` is unset).

At delivery an expired message (``expiration != 0 and now >= expiration``) never
reaches the handler: a copy goes to the expiry target
(:meth:`~mqguard.settings.AddressSettings.expiry_target`) with ``_AMQ_ORIG_ADDRESS``,
``_AMQ_ORIG_QUEUE``, ``_AMQ_ORIG_MESSAGE_ID``, ``_AMQ_ACTUAL_EXPIRY`` and no
expiration, and the original is acknowledged with reason EXPIRED; with no target
it is dropped with a WARN. Either way an ``expired`` event is written and
``message_expired`` is called. The reaper (:mod:`mqguard.reaper`) does the same
for messages that expire at rest.
"""

from __future__ import annotations

import logging

from mqguard import hookimpl
from mqguard.context import HookContext
from mqguard.message import Message, now_ms
from mqguard.settings import AddressSettings
from mqguard.verdict import Verdict

log = logging.getLogger("mqguard.plugins.expiry")

NAME = "expiry"


def apply_expiry_settings(expiration: int, settings: AddressSettings, now: int) -> int:
    """The expiration Artemis gives a message of ``expiration`` sent at ``now``."""
    if settings.no_expiry:
        return 0
    if settings.expiry_delay >= 0:
        return now + settings.expiry_delay if expiration == 0 else expiration
    longest, shortest = settings.max_expiry_delay, settings.min_expiry_delay
    if longest >= 0 and (expiration == 0 or expiration > now + longest):
        return now + longest
    if shortest >= 0 and expiration < now + shortest:
        return now + shortest
    return expiration


def expiry_verdict(message: Message, settings: AddressSettings, queue: str) -> Verdict:
    """What happens to an expired ``message``: a move to the expiry target, or a drop."""
    reason = f"expired at {message.expiration} (now {now_ms()})"
    target = settings.expiry_target(message.address)
    if target is None:
        log.warning("expired message %s on %s dropped: no expiry-address is configured for "
                    "it", message.message_id, queue)
        return Verdict.expire(None, f"{reason}; no expiry-address")
    return Verdict.expire(target, reason)


class ExpiryPlugin:
    """Stateless; one instance per guard like the other built-ins."""

    @hookimpl
    def before_send(self, message: Message, ctx: HookContext) -> Verdict | None:
        message.expiration = apply_expiry_settings(message.expiration, ctx.settings, now_ms())
        return None

    @hookimpl(tryfirst=True)
    def before_deliver(self, message: Message, ctx: HookContext) -> Verdict | None:
        if message.expiration and message.is_expired():
            return expiry_verdict(message, ctx.settings, ctx.queue or message.address)
        return None

    @hookimpl(tryfirst=True)
    def before_deliver_batch(self, messages: list[Message], contexts: list[HookContext]
                             ) -> dict[int, Verdict] | None:
        verdicts = {index: expiry_verdict(message, ctx.settings, ctx.queue or message.address)
                    for index, (message, ctx) in enumerate(zip(messages, contexts, strict=True))
                    if message.expiration and message.is_expired()}
        return verdicts or None
