"""A MESSAGE over the broker leg's limits.

The broker leg's limits admit every MESSAGE of a SEND the client leg admitted
(:func:`~mqguard.sidecar.frames.broker_leg_limits`), so such a MESSAGE was put on the
queue some other way. The native session never gives it to the client, and it must not
end the session either: left unacknowledged it would come back to every consumer of the
queue. It hands it here as plain data (``native/src/session/run/oversized.rs``), and it
is settled here: with its body
at hand (too many headers, a header line too long) and a dead-letter target for the
queue, the guard opens it and moves it there. Otherwise (a body over ``max_frame_bytes``
is never kept, so no copy can be made; no target; a copy the broker would refuse) the
broker gets it back with a NACK that does not requeue it (ActiveMQ: its dead-letter
queue; RabbitMQ: the queue's dead-letter exchange, else it drops it), with a WARN and a
``dead_lettered`` event; on STOMP 1.0, which has no NACK, it is acknowledged (dropped)
with a ``delivery_dropped`` event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mqguard.adapter import Delivery
from mqguard.context import HookContext
from mqguard.events import EventType
from mqguard.hookcall import observe
from mqguard.message import Message
from mqguard.sidecar.frames import MQGUARD_ADDED_HEADERS, Frame, encode, send_refusal
from mqguard.stomp_brokers import BROKER_MESSAGE_HEADERS, address_of, native_delivery_count
from mqguard.verdict import Verdict

if TYPE_CHECKING:
    from mqguard.pipeline import Guard
    from mqguard.sidecar.upstream import UpstreamLeg

__all__ = ["OversizedItem", "settle_oversized"]

log = logging.getLogger("mqguard.sidecar")

#: subscription id, destination, quorum queue, ack mode, ack token (None: not a delivery
#: the guard can settle), headers (all, in order), body (empty when skipped), whether the
#: body was kept, reason, detail.
OversizedItem = tuple[str, str, bool, str, str | None, list[tuple[str, str]], bytes, bool,
                      str, str]


def settle_oversized(guard: Guard, leg: UpstreamLeg, *, label: str, version: str,
                     broker: str, item: OversizedItem) -> None:
    """Dead-letter the oversized MESSAGE ``item`` of session ``label``, or hand it back to
    the broker (see the module's text); it never reaches the client."""
    sub_id, destination, quorum, _, token, headers, body, body_kept, reason, detail = item
    why = f"undeliverable through the sidecar: {reason} ({detail})"
    if token is None:
        # Browsing, unsubscribed, or nothing to settle it with: it stays the broker's.
        log.warning("session %s: a MESSAGE on subscription %r is %s; not delivered, "
                    "left with the broker", label, sub_id, why)
        return
    raw: dict[str, str] = {}
    for name, value in headers:
        raw.setdefault(name, value)  # the first of a name wins (the spec's rule)
    queue = address_of(destination)
    message = Message.from_wire(queue, body, raw, broker_message_id=raw.get("message-id"),
                                exclude=BROKER_MESSAGE_HEADERS)
    delivery = Delivery(message, sub_id, token, redelivered=raw.get("redelivered") == "true",
                        native_delivery_count=native_delivery_count(broker, raw,
                                                                    quorum=quorum),
                        raw_headers=raw)
    leg.delivered(token)
    ctx: HookContext | None = None
    if body_kept:
        ctx = guard.open_delivery(leg, delivery, queue=queue)
        if ctx is None:
            return  # taken by the guard (a duplicate, expired...): settled there
        target = ctx.settings.dead_letter_target(message.address)
        if target is not None and target != queue:
            # The copy carries the same headers: only where the broker takes them.
            frame = Frame("MESSAGE", list(headers), body)
            refused = send_refusal(encode(frame, version),
                                   len(headers) + MQGUARD_ADDED_HEADERS, len(body), None,
                                   broker)
            if refused is None:
                log.warning("session %s: message %s on %s dead-lettered to %s: %s",
                            label, message.message_id, queue, target, why)
                guard.apply_delivery_verdict(
                    leg, delivery, ctx, Verdict.move(target, why, event=EventType.DEAD_LETTERED))
                return
            why = f"{why}; its dead-letter copy would be refused: {refused}"
        else:
            why = f"{why}; no dead-letter-address is configured for it"
    # No copy to make (its body was skipped, there is no dead-letter target, or the broker
    # would refuse the copy): the broker's own dead-letter handling takes it.
    if version == "1.0":
        # STOMP 1.0 has no NACK: left unacknowledged it would come back forever.
        log.warning("session %s: message %s on %s dropped: %s (STOMP 1.0 cannot hand it "
                    "back to the broker)", label, message.message_id, queue, why)
        dropped = f"{why}; acknowledged (STOMP 1.0 has no NACK)"[:500]
        if ctx is not None:  # opened by the guard: dropped its way (event, hooks)
            guard.apply_delivery_verdict(
                leg, delivery, ctx, Verdict.drop(dropped, event=EventType.DELIVERY_DROPPED))
            return
        leg.ack(delivery)
        guard.events.emit(EventType.DELIVERY_DROPPED, message, queue=queue, reason=dropped)
        return
    log.warning("session %s: message %s on %s is %s; rejected to the broker's own "
                "dead-letter handling", label, message.message_id, queue, why)
    leg.nack(delivery, requeue=False)
    guard.events.emit(EventType.DEAD_LETTERED, message, queue=queue,
                      reason=f"{why}; rejected to the broker (NACK)"[:500])
    if ctx is not None:  # opened by the guard: its observers learn how it ended
        observe(guard.hook.message_nacked, message=message, ctx=ctx, requeue=False)
