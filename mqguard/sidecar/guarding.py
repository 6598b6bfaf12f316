"""What both sidecar sessions (the Python one and the native one's bridge) build for the
guard from a client's SEND: the :class:`~mqguard.message.Message` it carries."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from mqguard.message import Message, derived_message_id, now_ms, parse_wire_int
from mqguard.stomp_brokers import address_of

__all__ = ["FRAMING_SEND_HEADERS", "message_of_send"]

#: SEND headers that frame the message rather than belong to it.
FRAMING_SEND_HEADERS: Final = frozenset({"destination", "receipt", "transaction",
                                         "content-length"})


def message_of_send(body: bytes, destination: str, headers: Mapping[str, str], *,
                    producer_id: str, sequence: Iterator[int], broker: str) -> Message:
    """The message of a SEND to ``destination`` with the message's own ``headers`` (first
    occurrence of each name, framing headers left out), sent on a connection whose
    producer id is ``producer_id`` (``sequence`` numbers its messages) to a broker of
    ``broker``'s kind.

    A client that stamps its own producer id and sequence keeps them. The client's own
    expiration, STOMP/ActiveMQ ``expires`` (absolute epoch ms) or RabbitMQ's
    ``expiration`` (relative ms), becomes the message's expiration; it is re-encoded for
    the broker.
    """
    message = Message.from_wire(address_of(destination), body, headers)
    if message.producer_id is None:
        message.producer_id = producer_id
        message.sequence = next(sequence)
        if not message.message_id:  # the session's producer id is its own: derive
            message.message_id = derived_message_id(producer_id, message.sequence)
    expires = headers.get("expires")
    if expires is not None and (absolute := parse_wire_int(expires)) is not None:
        message.headers.pop("expires", None)
        if absolute > 0 and not message.expiration:
            message.expiration = absolute
    expiration = headers.get("expiration")
    if (broker == "rabbitmq" and expiration is not None
            and (relative := parse_wire_int(expiration)) is not None):
        message.headers.pop("expiration", None)
        if not message.expiration:
            message.expiration = now_ms() + relative
    return message
