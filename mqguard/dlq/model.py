"""A dead letter as an operator sees it: where it came from, why, when, what it holds."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from mqguard.adapter import Delivery
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    BRIDGE_DUPLICATE_ID_HEADER,
    MOVE_REASON_HEADER,
    MOVED_AT_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    Message,
    parse_wire_int,
)

__all__ = ["DEFAULT_PREVIEW_BYTES", "MOVE_HEADERS", "DeadLetter", "body_preview"]

#: Bytes of a body shown by default (``--preview-bytes``): enough to recognise a payload,
#: bounded so that a listing of large messages stays readable.
DEFAULT_PREVIEW_BYTES: Final = 256
#: Headers that describe a move rather than the message (dropped from a retried copy).
MOVE_HEADERS: Final = frozenset({MOVE_REASON_HEADER, ACTUAL_EXPIRY_HEADER, MOVED_AT_HEADER,
                                 ORIG_DELIVERY_COUNT_HEADER, BRIDGE_DUPLICATE_ID_HEADER})
#: ActiveMQ's own reason on the messages it dead-letters itself (``ActiveMQ.DLQ``), where
#: its protocol passes it on, and where it came from (STOMP: ``/queue/<name>``).
_BROKER_REASON: Final = "dlqDeliveryFailureCause"
_BROKER_ORIGIN: Final = "original-destination"
_DESTINATION_PREFIXES: Final = ("/queue/", "/topic/", "/amq/queue/")


def _broker_origin(raw: Mapping[str, str]) -> str | None:
    """The queue ActiveMQ dead-lettered a message from itself (a NACK, its own expiry)."""
    destination = raw.get(_BROKER_ORIGIN)
    if not destination:
        return None
    for prefix in _DESTINATION_PREFIXES:
        if destination.startswith(prefix):
            return destination[len(prefix):]
    return destination


def body_preview(body: bytes, limit: int) -> dict[str, Any]:
    """At most ``limit`` bytes of ``body``: as text when they are UTF-8 without control
    characters (newlines and tabs aside), else base64, so that binary payloads survive
    JSON and terminals."""
    head = body[:max(0, limit)]
    out: dict[str, Any] = {"size": len(body), "truncated": len(body) > len(head)}
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the limit is still text.
        if exc.start >= len(head) - 3 and len(body) > len(head):
            text = head[:exc.start].decode("utf-8")
        else:
            text = None
    if text is not None and all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        out["text"] = text
    else:
        out["base64"] = base64.b64encode(head).decode("ascii")
    return out


def _int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    return None if raw is None else parse_wire_int(raw)


@dataclass(slots=True)
class DeadLetter:
    """One message found in a dead-letter or expiry address, with its delivery."""

    delivery: Delivery
    #: The dead-letter (or expiry) address it was read from.
    address: str
    original_address: str | None = None
    original_queue: str | None = None
    original_message_id: str | None = None
    reason: str | None = None
    #: ``expired`` (an expiry copy: ``_AMQ_ACTUAL_EXPIRY``) or ``dead-letter``.
    kind: str = "dead-letter"
    #: Deliveries of the original before it was moved (``mqguard-orig-delivery-count``).
    delivery_count: int | None = None
    #: When it was moved here (epoch ms): the move time, the expiry time, or the broker's
    #: timestamp of the copy (ActiveMQ), whichever the message carries; None for the dead
    #: letters ActiveMQ makes itself, which keep the original's timestamp instead.
    moved_at: int | None = None
    #: When the original was sent (epoch ms), where the dead letter tells: mqguard's
    #: copies carry it as ``mqguard-sent-at`` (stamped at the original's first guarded
    #: send to an address with a dead-letter or expiry target, kept by the copy), and
    #: ActiveMQ's own dead letters keep the original's timestamp.
    sent_at: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def message(self) -> Message:
        return self.delivery.message

    @property
    def message_id(self) -> str:
        """The dead letter's own id (the copy's), else the broker's (ActiveMQ: stable)."""
        return self.message.message_id or self.message.broker_message_id or ""

    @classmethod
    def from_delivery(cls, delivery: Delivery, address: str) -> DeadLetter:
        message, raw = delivery.message, delivery.raw_headers
        headers = message.headers
        expiry = _int(headers, ACTUAL_EXPIRY_HEADER)
        moved_at = _int(headers, MOVED_AT_HEADER) or expiry
        broker_origin = _broker_origin(raw)
        # The guard's stamp of the original's send, which its copies keep.
        sent_at = message.sent_at or None
        if moved_at is None and broker_origin is not None:
            # ActiveMQ moved it itself and kept the original's JMSTimestamp: a send time.
            sent_at = sent_at or _int(raw, "timestamp")
        elif moved_at is None:
            moved_at = _int(raw, "timestamp")
        reason = headers.get(MOVE_REASON_HEADER) or raw.get(_BROKER_REASON)
        if reason is None and raw.get("x-first-death-reason"):
            reason = f"dead-lettered by RabbitMQ ({raw['x-first-death-reason']})"
        if reason is None and broker_origin is not None:
            reason = "dead-lettered by ActiveMQ"
        return cls(
            delivery=delivery, address=address,
            original_address=headers.get(ORIG_ADDRESS_HEADER) or broker_origin,
            original_queue=headers.get(ORIG_QUEUE_HEADER) or raw.get("x-first-death-queue"),
            original_message_id=headers.get(ORIG_MESSAGE_ID_HEADER),
            reason=reason, kind="expired" if expiry is not None else "dead-letter",
            delivery_count=_int(headers, ORIG_DELIVERY_COUNT_HEADER), moved_at=moved_at,
            sent_at=sent_at, headers=dict(headers))

    @property
    def aged_from(self) -> int | None:
        """The time its age counts from: the move, else (ActiveMQ's own dead letters) the
        original's send, which came before the move."""
        return self.moved_at if self.moved_at is not None else self.sent_at

    def age_ms(self, now: int) -> int | None:
        since = self.aged_from
        return None if since is None else max(0, now - since)

    def to_json(self, preview_bytes: int = DEFAULT_PREVIEW_BYTES) -> dict[str, Any]:
        message = self.message
        return {
            "message_id": self.message_id, "address": self.address, "kind": self.kind,
            "original_address": self.original_address, "original_queue": self.original_queue,
            "original_message_id": self.original_message_id, "reason": self.reason,
            "delivery_count": self.delivery_count, "moved_at": self.moved_at,
            "sent_at": self.sent_at,
            "producer_id": message.producer_id, "seq": message.sequence,
            "duplicate_id": message.duplicate_id,
            "broker_message_id": message.broker_message_id,
            "redelivered": self.delivery.redelivered,
            "headers": dict(sorted(self.headers.items())),
            "body": body_preview(message.body, preview_bytes),
        }
