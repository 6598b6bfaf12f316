"""STOMP 1.0 / 1.1 / 1.2 frames for the sidecar proxy: the codec and the limits around it.

The codec itself is native (``mqguard_native``, Rust): :class:`Frame`, :class:`FrameDecoder`,
:class:`Oversized`, :func:`encode`, :func:`wire_of`, :func:`encode_bodiless`,
:func:`encode_one_header` and :func:`with_plain_header` are its classes and functions,
re-exported here with :class:`FrameError` (raised by them), :data:`HEARTBEAT` and
:class:`FrameLimits`, which it is given at import. :func:`encode_send` and
:func:`parse_received` are the same codec's SEND encoder and stomp.py-compatible reader
of received frames for the STOMP adapter (``mqguard.adapters.stomp``). This module adds the
policy around it: the broker leg's limits and what a broker refuses in a SEND.

Wire format (all three versions)::

    COMMAND EOL
    *( name ":" value EOL )
    EOL
    *OCTET NUL
    *( EOL )            <- heart-beats / padding between frames

``EOL`` is ``"\\n"`` or ``"\\r\\n"``.  CRLF is a STOMP 1.2 feature, but 1.0 and 1.1 peers send it
too, so it is accepted in every version: exactly one ``"\\r"`` before a ``"\\n"`` belongs to the
EOL.  Any other ``"\\r"`` in a header line is kept verbatim.

Headers
    UTF-8.  A line splits at its *first* ``":"`` (a value may contain more colons; strict 1.2
    wants them escaped, real peers send them raw).  Nothing is trimmed in any version: the 1.1
    and 1.2 specs forbid it, and for 1.0 a proxy must not rewrite what it forwards (a padded
    ``"name: value"`` keeps its space).  Repeated names are kept in order; per spec the first
    occurrence wins (:meth:`Frame.get`).  In 1.1 and 1.2 names and values are escaped
    (``\\n`` ``\\c`` ``\\\\``, plus ``\\r`` in 1.2); an undefined escape is fatal.  1.0 has no
    escaping, and CONNECT, STOMP and CONNECTED frames are never escaped in any version.  A NUL
    octet inside the header block is an error (it would end the frame for most peers).

Body
    With a ``content-length`` header (its first occurrence) exactly that many octets, which must
    be followed by NUL; without one, everything up to the first NUL.

Every malformed or over-limit input raises :class:`FrameError`, and limits are enforced while the
data arrives (a peer that streams an endless header line or a body without NUL is stopped as soon
as the frame can no longer fit in :class:`FrameLimits`).  Decoded frames up to
:data:`MAX_WIRE_KEPT` keep their received octets (:attr:`Frame.wire`), so an unchanged frame is
relayed as received.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import mqguard_native
from mqguard_native import (
    MAX_WIRE_KEPT,
    Frame,
    FrameDecoder,
    Oversized,
    encode,
    encode_bodiless,
    encode_one_header,
    encode_send,
    parse_received,
    wire_of,
    with_plain_header,
)

from mqguard.errors import MqguardError

__all__ = [
    "BROKER_ADDED_BYTES",
    "BROKER_ADDED_HEADERS",
    "BROKER_LINE_BYTES",
    "BROKER_STOMP_LIMITS",
    "CLIENT_COMMANDS",
    "COPY_ADDED_HEADERS",
    "ESCAPE_GROWTH",
    "HEARTBEAT",
    "MAX_WIRE_KEPT",
    "MQGUARD_ADDED_BYTES",
    "MQGUARD_ADDED_HEADERS",
    "SERVER_COMMANDS",
    "STOMP_VERSIONS",
    "BrokerStompLimits",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameLimits",
    "Oversized",
    "broker_leg_limits",
    "encode",
    "encode_bodiless",
    "encode_heartbeat",
    "encode_one_header",
    "encode_send",
    "limits_tuple",
    "parse_received",
    "send_refusal",
    "wire_of",
    "with_plain_header",
]

STOMP_VERSIONS: Final = ("1.0", "1.1", "1.2")
CLIENT_COMMANDS: Final[frozenset[str]] = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT",
     "ABORT", "DISCONNECT"}
)
SERVER_COMMANDS: Final[frozenset[str]] = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})

# Frames whose headers are never escaped (backward compatibility with 1.0, all specs).
_UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "STOMP", "CONNECTED"})


class _Heartbeat(enum.Enum):
    HEARTBEAT = "HEARTBEAT"

    def __repr__(self) -> str:
        return "HEARTBEAT"


HEARTBEAT: Final = _Heartbeat.HEARTBEAT
"""Returned by :meth:`FrameDecoder.feed` for each EOL (``\\n`` or ``\\r\\n``) between frames."""


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Per-connection bounds on what a peer may send (all in octets of the encoded frame)."""

    max_frame_bytes: int = 16 * 1024 * 1024  # whole frame, command line to NUL inclusive
    max_header_count: int = 128
    max_header_line_bytes: int = 8192  # one "name:value" line, encoded, without its EOL
    max_command_bytes: int = 32  # the command line, without its EOL

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_header_count", "max_header_line_bytes",
                     "max_command_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"FrameLimits.{name} must be a positive int, got {value!r}")

    @property
    def max_head_bytes(self) -> int:
        """Largest possible command line + header lines + blank line, EOLs as CRLF."""
        lines = self.max_header_count * (self.max_header_line_bytes + 2)
        head = self.max_command_bytes + 2 + lines + 2
        return min(head, self.max_frame_bytes)



def limits_tuple(limits: FrameLimits) -> tuple[int, int, int, int]:
    """``limits`` as the native runtime's decoders take them."""
    return (limits.max_frame_bytes, limits.max_header_count, limits.max_header_line_bytes,
            limits.max_command_bytes)


class FrameError(MqguardError):
    """Malformed or over-limit input.

    ``reason`` is a short constant text, safe for an ERROR frame's ``message`` header (it never
    contains peer data); ``detail`` says more (it may quote the offending input, shortened).
    When raised by :meth:`FrameDecoder.feed`, ``frames`` holds what that call had completed
    before the error (frames and HEARTBEATs), so a proxy may still forward them.
    """

    def __init__(self, reason: str, *, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.frames: list[Frame | object] = []


# -- the broker leg ------------------------------------------------------------------------
#
# The broker leg is trusted, and a message comes back from it bigger than it went in: the
# sidecar stamps its SEND (a receipt of its own, the mqguard message id, producer id and
# sequence, expiry headers...), the broker adds its own headers to the MESSAGE (message-id,
# subscription, ack, destination, timestamp, priority, content-length, dead-letter causes),
# and STOMP 1.1+ escaping writes up to two octets for each octet a client sent raw (a raw
# ``:`` in a value comes back as ``\c``). Its limits are derived from the client leg's with
# room for all of that, so every MESSAGE whose SEND the client leg admitted is admitted on
# the way back; they still bound what a broker connection may make the sidecar buffer.

#: Headers mqguard adds to a client's SEND, at most (receipt and stamps), and their octets.
MQGUARD_ADDED_HEADERS: Final = 16
MQGUARD_ADDED_BYTES: Final = 4096
#: Headers a broker adds to a MESSAGE, at most, and their octets (ActiveMQ and RabbitMQ add
#: 6 to 12 short ones; dead-letter and expiry copies carry a few more).
BROKER_ADDED_HEADERS: Final = 64
BROKER_ADDED_BYTES: Final = 64 * 1024
#: Longest header line of a broker's own (ActiveMQ's ``dlqDeliveryFailureCause`` holds a
#: redelivery policy's text: a few hundred octets).
BROKER_LINE_BYTES: Final = 8192
#: Headers a dead-letter or expiry copy adds to a message (``_AMQ_ORIG_ADDRESS``,
#: ``_AMQ_ORIG_QUEUE``, ``_AMQ_ORIG_MESSAGE_ID``, the reason, ``_AMQ_ACTUAL_EXPIRY``,
#: ``mqguard-moved-at``, ``mqguard-orig-delivery-count``), with room to spare: a SEND is
#: refused unless its copies will fit the broker's header count too.
COPY_ADDED_HEADERS: Final = 10
#: The sidecar's receipt header on a SEND (``receipt:mqguard-r-<n>`` and its EOL), at most.
_RECEIPT_LINE_BYTES: Final = 64
#: STOMP escaping turns one octet (``\\`` LF ``:`` CR) into two, never more.
ESCAPE_GROWTH: Final = 2


def broker_leg_limits(client: FrameLimits) -> FrameLimits:
    """Limits for the broker leg that admit every MESSAGE of a SEND ``client`` admitted.

    - headers: the client's, plus what mqguard and the broker add;
    - a header line: a client's line escaped (at most twice its octets), or a broker's own;
    - a frame: the client's frame, plus its header block once more (escaping at most doubles
      it), plus what mqguard and the broker add.
    """
    return FrameLimits(
        max_frame_bytes=(client.max_frame_bytes + client.max_head_bytes
                         + MQGUARD_ADDED_BYTES + BROKER_ADDED_BYTES),
        max_header_count=client.max_header_count + MQGUARD_ADDED_HEADERS + BROKER_ADDED_HEADERS,
        max_header_line_bytes=max(ESCAPE_GROWTH * client.max_header_line_bytes,
                                  BROKER_LINE_BYTES),
        max_command_bytes=client.max_command_bytes,
    )


@dataclass(frozen=True, slots=True)
class BrokerStompLimits:
    """What a broker's STOMP listener refuses in a SEND (None: no such limit)."""

    name: str
    #: One ``name:value`` line as written (escaped), without its EOL.
    max_header_line_bytes: int | None = None
    max_header_count: int | None = None
    max_body_bytes: int | None = None


#: The brokers' defaults. ActiveMQ 5.x ``StompWireFormat``: MAX_HEADER_LENGTH 10240 (a line),
#: MAX_HEADERS 1000, MAX_DATA_LENGTH 100 MiB (``wireFormat.maxDataLength``); over any of them
#: it answers ERROR and closes the connection (5.17 measured: 1,001 headers and a 10,241-octet
#: line still pass; the values here keep one under). RabbitMQ 3.x's STOMP plugin has no
#: header limits (3.10 measured: 5,000 headers and a 200,000-octet line pass); a body over
#: ``max_message_size`` (128 MiB) is refused.
BROKER_STOMP_LIMITS: Final[dict[str, BrokerStompLimits]] = {
    "activemq": BrokerStompLimits("ActiveMQ", max_header_line_bytes=10240,
                                  max_header_count=1000, max_body_bytes=100 * 1024 * 1024),
    "rabbitmq": BrokerStompLimits("RabbitMQ", max_body_bytes=128 * 1024 * 1024),
}


def send_refusal(data: bytes, header_count: int, body_len: int, leg: FrameLimits | None,
                 broker: str) -> str | None:
    """Why the encoded SEND ``data`` (``header_count`` headers, a body of ``body_len``
    octets; mqguard's receipt still to come) must not go to ``broker``, or None.

    Refused: what the broker's STOMP listener refuses (:data:`BROKER_STOMP_LIMITS`), and
    what would come back over the broker leg's limits ``leg`` once the broker added its
    headers (a message nobody could ever be given; not checked when ``leg`` is None).
    Cheap for the usual SEND: the header lines are measured only when the header block is
    longer than a line may be.
    """
    count = header_count + 1  # + mqguard's receipt
    size = len(data) + _RECEIPT_LINE_BYTES
    known = BROKER_STOMP_LIMITS.get(broker)
    if known is not None:
        if known.max_body_bytes is not None and body_len > known.max_body_bytes:
            return (f"message too large for {known.name}: a body of {body_len} bytes, "
                    f"over its limit of {known.max_body_bytes}")
        if (known.max_header_count is not None
                and count + COPY_ADDED_HEADERS > known.max_header_count):
            return (f"too many headers for {known.name}: {count} with mqguard's, and "
                    f"{COPY_ADDED_HEADERS} more in a dead-letter copy, over its limit of "
                    f"{known.max_header_count}")
    max_line: int | None = None
    if leg is not None:
        if size + BROKER_ADDED_BYTES > leg.max_frame_bytes:
            return (f"message too large: {size} bytes with mqguard's headers, over what the "
                    f"sidecar reads back from the broker "
                    f"({leg.max_frame_bytes - BROKER_ADDED_BYTES})")
        if count + BROKER_ADDED_HEADERS > leg.max_header_count:
            return (f"too many headers: {count} with mqguard's, over what the sidecar reads "
                    f"back from the broker ({leg.max_header_count - BROKER_ADDED_HEADERS})")
        max_line = leg.max_header_line_bytes
    if known is not None and known.max_header_line_bytes is not None:
        max_line = min(max_line or known.max_header_line_bytes, known.max_header_line_bytes)
    if max_line is None:
        return None
    head = len(data) - body_len - 1
    if head > max_line:  # only then can one line be longer
        longest = max(map(len, data[:head].split(b"\n")[1:]))
        if longest > max_line:
            where = (known.name if known is not None and max_line
                     == known.max_header_line_bytes else "the sidecar's broker leg")
            return (f"header line too long for {where}: {longest} bytes as sent (escaped), "
                    f"over its limit of {max_line}")
    return None


_DEFAULT_LIMITS: Final = FrameLimits()

mqguard_native.init_codec(FrameError, HEARTBEAT, _DEFAULT_LIMITS)


def encode_heartbeat() -> bytes:
    """One heart-beat: a bare EOL."""
    return b"\n"


def _encode_checked(command: str, headers: list[tuple[str, str]], body: bytes, version: str,
                    escaped: bool) -> bytes:
    """:func:`encode` header by header with the escaping given (its reference path)."""
    return mqguard_native.encode_checked(command, headers, body, version, escaped)
