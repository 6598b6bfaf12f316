"""The message model shared by adapters, the guard pipeline and plugins.

A :class:`Message` is broker-neutral. Adapters translate it to and from wire
frames; the guard only ever sees this model. The fields mirror what ActiveMQ
Artemis keeps on a message that matter for delivery guarantees.
"""

from __future__ import annotations

import base64
import itertools
import os
import time
from collections.abc import Collection, Mapping
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
#: When the message was first sent through a guard (epoch ms), stamped once and kept by
#: every copy (as Artemis's copies keep the original's timestamp): a dead letter's
#: "original send" time (``mqguard dlq show``). Only where a move can happen: see
#: :attr:`mqguard.settings.AddressSettings.has_move_target`.
SENT_AT_HEADER: Final = "mqguard-sent-at"

#: Headers the guard owns; adapters never pass them to applications as user headers.
GUARD_HEADERS: Final = frozenset(
    {MESSAGE_ID_HEADER, PRODUCER_ID_HEADER, SEQUENCE_HEADER, EXPIRATION_HEADER,
     SENT_AT_HEADER}
)

# Artemis headers put on copies moved to a dead-letter or expiry address.
ORIG_ADDRESS_HEADER: Final = "_AMQ_ORIG_ADDRESS"
ORIG_QUEUE_HEADER: Final = "_AMQ_ORIG_QUEUE"
ORIG_MESSAGE_ID_HEADER: Final = "_AMQ_ORIG_MESSAGE_ID"
ACTUAL_EXPIRY_HEADER: Final = "_AMQ_ACTUAL_EXPIRY"
MOVE_REASON_HEADER: Final = "mqguard-move-reason"
#: When the copy was made (epoch ms), and the original's delivery count then: what an
#: operator inspecting a dead-letter address asks first (``mqguard dlq show``).
MOVED_AT_HEADER: Final = "mqguard-moved-at"
ORIG_DELIVERY_COUNT_HEADER: Final = "mqguard-orig-delivery-count"
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


#: Random bits in an mqguard id. 120 bits encode to exactly 20 base64 characters, so the
#: ids of a batch come from one encoding of one random pool; the collision odds stay
#: negligible (about 4e-13 after 10**12 ids, birthday bound).
ID_BYTES: Final = 15
ID_LENGTH: Final = 20


def encode_ids(random_bytes: bytes) -> list[str]:
    """Split ``random_bytes`` (a multiple of :data:`ID_BYTES`) into mqguard ids.

    URL-safe base64 (RFC 4648 section 5: letters, digits, ``-`` and ``_``) rather than
    hex: every guarded message carries its id and its producer's id as headers, and
    the broker stores and copies them with the message. On RabbitMQ the 24 characters
    saved per pair of ids took a tenth off the broker's CPU per persistent send (3
    headers of 32-hex ids against the same with base64 ids, alternating runs).
    """
    text = base64.urlsafe_b64encode(random_bytes).decode("ascii")
    return [text[start:start + ID_LENGTH] for start in range(0, len(text), ID_LENGTH)]


def new_message_id() -> str:
    """Return a fresh 120-bit random id as 20 URL-safe base64 characters.

    ``os.urandom`` is used rather than ``uuid4()`` because it is about twice as
    fast and the send path runs it once per message.
    """
    return base64.urlsafe_b64encode(os.urandom(ID_BYTES)).decode("ascii")


# An id per process and a counter: :func:`per_process_unique_id`. A forked child draws
# its own, or parent and child would hand out the same ids.
_process_id = new_message_id()
_process_counter = itertools.count(1)


def _redraw_process_id() -> None:
    global _process_id, _process_counter
    _process_id = new_message_id()
    _process_counter = itertools.count(1)


os.register_at_fork(after_in_child=_redraw_process_id)


def per_process_unique_id() -> str:
    """A unique id, cheaply: this process's random 120-bit id, ``.``, a counter.

    For ids nothing is derived from, drawn once per message on a hot path (the
    stand-in id of a delivery that carries no mqguard id): about a fifth of
    :func:`new_message_id`'s cost (no system call, no encoding). Thread-safe
    (``next`` on a counter is atomic under the GIL).
    """
    return f"{_process_id}.{next(_process_counter)}"


def derived_message_id(producer_id: str, sequence: int) -> str:
    """The mqguard id of a producer's ``sequence``-th message when its id is the guard's.

    A producer whose id the guard drew at random (:func:`new_message_id`, unique to that
    producer instance) numbers its messages itself, so ``<producer id>.<sequence>`` is
    unique without drawing more random bits, and one header carries all three fields:
    every guarded message pays for its identity in broker CPU (RabbitMQ converts and
    stores each header with a persistent message), and three headers cost it a tenth of
    its CPU per send. A producer id chosen by the application may repeat across restarts
    with the sequence starting over, so such producers keep random ids and send
    ``mqguard-producer`` / ``mqguard-seq`` separately.
    """
    return f"{producer_id}.{sequence}"


def split_derived_id(message_id: str) -> tuple[str, int] | None:
    """(producer id, sequence) of an id of :func:`derived_message_id`'s form, else None."""
    if len(message_id) > ID_LENGTH + 1 and message_id[ID_LENGTH] == ".":
        sequence = parse_wire_int(message_id[ID_LENGTH + 1:])
        if sequence is not None:
            return message_id[:ID_LENGTH], sequence
    return None


def _pop_wire_int(headers: dict[str, str], name: str) -> int | None:
    """Take ``name`` out of ``headers`` as a number; a malformed value stays a header."""
    raw = headers.pop(name, None)
    if raw is None:
        return None
    number = parse_wire_int(raw)
    if number is None:
        headers[name] = raw
    return number


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
    #: When it was first sent through a guard (epoch ms, ``mqguard-sent-at``); 0 = not
    #: stamped. Never overwritten; copies (moves, redeliveries, dlq retries) keep it.
    sent_at: int = 0

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
        if self.producer_id is not None or self.sequence is not None:
            sequence = self.sequence
            if (self.producer_id is None or sequence is None
                    or self.message_id != f"{self.producer_id}.{sequence}"):
                # Not folded into the id (see derived_message_id): on their own.
                if self.producer_id is not None:
                    out[PRODUCER_ID_HEADER] = self.producer_id
                if sequence is not None:
                    out[SEQUENCE_HEADER] = str(sequence)
        if self.expiration:
            out[EXPIRATION_HEADER] = str(self.expiration)
        if self.sent_at:
            out[SENT_AT_HEADER] = str(self.sent_at)
        return out

    @classmethod
    def from_wire(
        cls,
        address: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        broker_message_id: str | None = None,
        exclude: Collection[str] = (),
    ) -> Message:
        """Rebuild a message from wire headers, splitting off the guard's fields.

        Headers named in ``exclude`` (the broker's own, say) are left out of
        :attr:`headers`. A message without ``mqguard-producer`` and ``mqguard-seq``
        whose id has the form of :func:`derived_message_id` gets its producer and
        sequence from the id. Malformed guard headers (a non-numeric sequence, say)
        are kept as plain application headers rather than raising: a message is never
        lost because some other client wrote a header we also use.
        """
        # A copy without the excluded names, then a pop per guard header: once per
        # delivery, cheaper than comparing every header with each guard name in Python.
        app = ({key: value for key, value in headers.items() if key not in exclude}
               if exclude else dict(headers))
        message_id = app.pop(MESSAGE_ID_HEADER, "")
        duplicate_id = app.pop(DUPLICATE_ID_HEADER, None)
        producer_id = app.pop(PRODUCER_ID_HEADER, None)
        sequence = _pop_wire_int(app, SEQUENCE_HEADER)
        expiration = _pop_wire_int(app, EXPIRATION_HEADER) or 0
        sent_at = _pop_wire_int(app, SENT_AT_HEADER) or 0
        if producer_id is None and sequence is None and message_id:
            derived = split_derived_id(message_id)
            if derived is not None:
                producer_id, sequence = derived
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
            sent_at=sent_at,
        )

    def copy_for(self, address: str, **changes: object) -> Message:
        """A copy bound for ``address`` with a new message id (Artemis ``copy()``)."""
        return replace(self, address=address, headers=dict(self.headers),
                       message_id=new_message_id(), scheduled_delivery=0,
                       **changes)  # type: ignore[arg-type]
