"""The message model shared by adapters, the guard pipeline and plugins.

A :class:`Message` is broker-neutral. Adapters translate it to and from wire
frames; the guard only ever sees this model. The fields mirror what ActiveMQ
Artemis keeps on a message that matter for delivery guarantees.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

#: Header carrying the stable mqguard message id. Brokers disagree on
#: ``message-id`` (RabbitMQ issues a new one per delivery), so mqguard stamps
#: its own once, at the first guarded send, and keeps it across redeliveries.
MESSAGE_ID_HEADER: Final = "mqguard-id"
#: Artemis's duplicate-detection header (``Message.HDR_DUPLICATE_DETECTION_ID``).
DUPLICATE_ID_HEADER: Final = "_AMQ_DUPL_ID"
#: Artemis's bridge duplicate-detection header (``Message.HDR_BRIDGE_DUPLICATE_ID``).
BRIDGE_DUPLICATE_ID_HEADER: Final = "_AMQ_BRIDGE_DUP"
#: Producer identity and per-producer sequence, read by the consumer audit.
PRODUCER_ID_HEADER: Final = "mqguard-producer"
SEQUENCE_HEADER: Final = "mqguard-seq"
#: Absolute expiration, epoch milliseconds; 0 means never (STOMP ``expires``).
EXPIRATION_HEADER: Final = "mqguard-expires"

#: Headers the guard owns; adapters never pass them to applications as user headers.
GUARD_HEADERS: Final = frozenset(
    {MESSAGE_ID_HEADER, PRODUCER_ID_HEADER, SEQUENCE_HEADER, EXPIRATION_HEADER}
)

# Artemis headers put on copies moved to a dead-letter or expiry address.
ORIG_ADDRESS_HEADER: Final = "_AMQ_ORIG_ADDRESS"
ORIG_QUEUE_HEADER: Final = "_AMQ_ORIG_QUEUE"
ORIG_MESSAGE_ID_HEADER: Final = "_AMQ_ORIG_MESSAGE_ID"
ACTUAL_EXPIRY_HEADER: Final = "_AMQ_ACTUAL_EXPIRY"
MOVE_REASON_HEADER: Final = "mqguard-move-reason"
#: Deliveries before this one, on a copy the guard re-sent for a delayed redelivery
#: (the broker sees a new message, so its own redelivered flag is false).
PRIOR_DELIVERIES_HEADER: Final = "mqguard-prior-deliveries"


#: Largest sequence / expiration accepted from the wire: integers stay exact in every
#: store (Redis scores and Lua numbers are doubles) and in JSON consumers.
MAX_WIRE_INTEGER: Final = 2**53 - 1


def parse_wire_int(value: str) -> int | None:
    """A non-negative decimal integer from a header, or None when it is not one.

    Strict: ASCII digits only (``str.isdigit`` also accepts "²", which ``int``
    refuses), at most 16 of them, and no larger than :data:`MAX_WIRE_INTEGER`.
    Headers come from the network; a bad one must never raise.
    """
    if not value or len(value) > 16 or not value.isascii() or not value.isdigit():
        return None
    number = int(value)
    return number if number <= MAX_WIRE_INTEGER else None


def new_message_id() -> str:
    """Return a fresh 128-bit random id as 32 hex characters.

    ``os.urandom`` is used rather than ``uuid4()`` because it is about twice as
    fast and the send path runs it once per message.
    """
    return os.urandom(16).hex()


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the unit of every expiration)."""
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Message:
    """A message as the guard sees it.

    ``headers`` holds the application's own headers only; the guard's fields
    live in attributes and are encoded by :meth:`wire_headers`.
    """

    address: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    #: Stable mqguard id; empty until the guard stamps it at the first send.
    message_id: str = ""
    #: ``_AMQ_DUPL_ID`` value, or None when the message asks for no duplicate check.
    duplicate_id: str | None = None
    #: Absolute expiration in epoch ms; 0 means the message never expires.
    expiration: int = 0
    #: How many times the message has been handed to a consumer, this one included.
    delivery_count: int = 0
    producer_id: str | None = None
    sequence: int | None = None
    #: The broker's own id for this delivery (unstable on RabbitMQ; informative only).
    broker_message_id: str | None = None
    #: Deliver no earlier than this epoch ms (Artemis ``_AMQ_SCHED_DELIVERY``); 0 = at once.
    #: Only adapters whose broker has ``delayed_delivery`` accept it; the others refuse
    #: the send rather than deliver early. Not carried to the consumer.
    scheduled_delivery: int = 0

    def is_expired(self, at_ms: int | None = None) -> bool:
        """Artemis rule: expired when expiration != 0 and now >= expiration."""
        return self.expiration != 0 and (now_ms() if at_ms is None else at_ms) >= self.expiration

    def wire_headers(self) -> dict[str, str]:
        """Headers to put on the wire: the application's plus the guard's own."""
        out = dict(self.headers)
        if self.message_id:
            out[MESSAGE_ID_HEADER] = self.message_id
        if self.duplicate_id is not None:
            out[DUPLICATE_ID_HEADER] = self.duplicate_id
        if self.producer_id is not None:
            out[PRODUCER_ID_HEADER] = self.producer_id
        if self.sequence is not None:
            out[SEQUENCE_HEADER] = str(self.sequence)
        if self.expiration:
            out[EXPIRATION_HEADER] = str(self.expiration)
        return out

    @classmethod
    def from_wire(
        cls,
        address: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        broker_message_id: str | None = None,
    ) -> Message:
        """Rebuild a message from wire headers, splitting off the guard's fields.

        Malformed guard headers (a non-numeric sequence, say) are kept as plain
        application headers rather than raising: a message is never lost because
        some other client wrote a header we also use.
        """
        app: dict[str, str] = {}
        message_id = ""
        duplicate_id: str | None = None
        producer_id: str | None = None
        sequence: int | None = None
        expiration = 0
        for key, value in headers.items():
            if key == MESSAGE_ID_HEADER:
                message_id = value
            elif key == DUPLICATE_ID_HEADER:
                duplicate_id = value
            elif key == PRODUCER_ID_HEADER:
                producer_id = value
            elif key == SEQUENCE_HEADER and (number := parse_wire_int(value)) is not None:
                sequence = number
            elif key == EXPIRATION_HEADER and (number := parse_wire_int(value)) is not None:
                expiration = number
            else:
                app[key] = value
        return cls(
            address=address,
            body=body,
            headers=app,
            message_id=message_id,
            duplicate_id=duplicate_id,
            expiration=expiration,
            producer_id=producer_id,
            sequence=sequence,
            broker_message_id=broker_message_id,
        )

    def copy_for(self, address: str, **changes: object) -> Message:
        """A copy bound for ``address`` with a new message id (Artemis ``copy()``)."""
        return replace(self, address=address, headers=dict(self.headers),
                       message_id=new_message_id(), scheduled_delivery=0,
                       **changes)  # type: ignore[arg-type]
