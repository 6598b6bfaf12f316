"""STOMP 1.0 / 1.1 / 1.2 frame codec for the sidecar proxy.

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
as the frame can no longer fit in :class:`FrameLimits`).  The decoder works on whole buffers with
``bytes.find`` / one compiled search per frame and keeps an incomplete frame in a bytearray with
a resume point, so a large frame arriving in many small reads costs linear time.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final

from mqguard.errors import MqguardError

__all__ = [
    "CLIENT_COMMANDS",
    "HEARTBEAT",
    "SERVER_COMMANDS",
    "STOMP_VERSIONS",
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
_ALL_COMMANDS: Final = CLIENT_COMMANDS | SERVER_COMMANDS

# Frames whose headers are never escaped (backward compatibility with 1.0, all specs).
_UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "STOMP", "CONNECTED"})

_UNESCAPE_11: Final = {"n": "\n", "c": ":", "\\": "\\"}
# What an escape stands for, in any version (NUL: never allowed in a header).
_ESCAPED_CHARS: Final = "\n:\\\r\0"
_UNESCAPE_12: Final = {**_UNESCAPE_11, "r": "\r"}

# End of the header block: the first blank line (LF or CRLF). A regex finds the earliest of
# both forms in one pass, whatever EOL style the peer uses (two finds could scan far ahead).
_HEAD_END: Final = re.compile(rb"\n\r?\n")

#: The commonest frames per message, one header and no body: a RECEIPT per sent message
#: and a STOMP 1.2 ACK (or NACK) per consumed one. Keyed by their first octet; the decoder
#: takes ``prefix VALUE LF LF NUL`` (VALUE without CR or NUL, and without backslashes but
#: those of escaped colons, STOMP 1.1+: ActiveMQ's ack ids) in one search and gives exactly
#: what the general parse gives (a property test checks it).
_SHORTCUTS: Final[dict[int, tuple[bytes, str, str]]] = {
    ord("R"): (b"RECEIPT\nreceipt-id:", "RECEIPT", "receipt-id"),
    ord("A"): (b"ACK\nid:", "ACK", "id"),
    ord("N"): (b"NACK\nid:", "NACK", "id"),
}

# Decoder states for an incomplete frame held in the buffer.
_HEAD: Final = 0  # the blank line after the headers has not arrived yet
_BODY_LEN: Final = 1  # content-length known; waiting for ``_need`` bytes in total
_BODY_NUL: Final = 2  # no content-length; waiting for the NUL (searched up to ``_scan``)


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


_DEFAULT_LIMITS: Final = FrameLimits()

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
#: ``_AMQ_ORIG_QUEUE``, ``_AMQ_ORIG_MESSAGE_ID``, the reason, ``_AMQ_ACTUAL_EXPIRY``), with
#: room to spare: a SEND is refused unless its copies will fit the broker's header count too.
COPY_ADDED_HEADERS: Final = 8
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


def with_plain_header(data: bytes, name: str, value: str) -> bytes:
    """The encoded frame ``data`` with ``name:value`` as its first header.

    For a header that needs no escaping in any version (plain ASCII, no ``:`` ``\\`` CR
    LF): the sidecar's own receipt ids, added after :func:`send_refusal` passed the frame.
    """
    command_end = data.index(b"\n") + 1
    return b"".join((data[:command_end], f"{name}:{value}\n".encode("ascii"),
                     data[command_end:]))


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


@dataclass(slots=True)
class Oversized:
    """A frame over the limits, from a decoder made with ``oversized=True``.

    Such a decoder does not fail on a frame whose header block it could read: it hands
    the frame on as this instead, and goes on with the frames after it. ``frame`` has
    its command and headers; its body too when ``body_kept`` (too many headers or a
    header line too long: the whole frame was within ``max_frame_bytes``), else the
    body was skipped as it arrived and ``frame.body`` is empty. ``reason`` is a
    constant text, ``detail`` says more.
    """

    frame: Frame
    reason: str
    detail: str
    body_kept: bool


#: Decoded frames up to this size keep their received octets (:attr:`Frame.wire`), so a proxy
#: relays them unchanged without encoding them again; bigger ones would double the memory a
#: frame in flight holds, for a saving that the copy of their body dwarfs anyway.
MAX_WIRE_KEPT: Final = 64 * 1024


@dataclass(slots=True)
class Frame:
    """One STOMP frame. ``headers`` keeps wire order; a name may repeat (first one wins).

    ``wire``: the octets the frame was decoded from (command to NUL), kept by
    :class:`FrameDecoder` for frames up to :data:`MAX_WIRE_KEPT`, or None. :meth:`set` and
    :meth:`remove` drop it, so :func:`wire_of` never returns stale octets as long as the
    headers of a decoded frame are changed through them (code that edits ``headers`` or
    ``body`` directly must set ``wire`` to None itself). Not part of equality.
    """

    command: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    wire: bytes | None = field(default=None, compare=False, repr=False)

    def get(self, name: str, default: str | None = None) -> str | None:
        """Value of the first header called ``name`` (the spec's rule for repeats)."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def set(self, name: str, value: str) -> None:
        """Replace the first ``name`` in place and drop its repeats; append if absent."""
        kept: list[tuple[str, str]] = []
        found = False
        for item in self.headers:
            if item[0] != name:
                kept.append(item)
            elif not found:
                kept.append((name, value))
                found = True
        if not found:
            kept.append((name, value))
        self.headers[:] = kept
        self.wire = None

    def remove(self, name: str) -> None:
        """Remove every header called ``name`` (from ``wire`` too, when that is simple)."""
        kept = [item for item in self.headers if item[0] != name]
        removed = len(self.headers) - len(kept)
        if not removed:
            return
        wire = self.wire
        if wire is not None:
            # With a single such header its value gives the exact line to cut (one find).
            value = self.get(name) if removed == 1 else None
            wire = _without_header_line(wire, name, value, len(self.body))
        self.headers[:] = kept
        self.wire = wire

    def header_dict(self) -> dict[str, str]:
        """Headers as a dict, first occurrence of each name winning, wire order kept."""
        headers = self.headers
        # dict() builds it in C but keeps the *last* occurrence: right whenever no name
        # repeats (every frame the brokers and common clients send), checked by its size.
        result = dict(headers)
        if len(result) != len(headers):
            result = {}
            for key, value in headers:
                if key not in result:
                    result[key] = value
        return result


def _without_header_line(wire: bytes, name: str, value: str | None = None,
                         body_len: int = 0) -> bytes | None:
    """``wire`` with the one header line called ``name`` cut out; None when not that simple.

    Simple: ``name`` is plain ASCII that no STOMP version escapes (and not
    ``content-length``), and exactly one line of
    the header block starts with it (decoded headers come from these very lines, so the
    line cut is the header removed). The cut runs from the LF before the line to the LF
    after it, so the line's own EOL (LF or CRLF) goes with it.

    ``value``: the header's decoded value when the frame has exactly one header called
    ``name`` (``body_len``: the length of its body). Its line is then found with one
    search of the header block for ``LF name ":" value LF``: a line that reads so is
    that header (the name is never escaped). Otherwise (an escaped value, CRLF) the
    general way below.
    """
    needle = _LINE_STARTS.get(name)
    if needle is None:
        if name in _LINE_STARTS:
            return None  # a name that is not that simple (cached None)
        needle = _line_start(name)
    if needle is None:
        return None
    if value is not None:
        try:
            line = needle + value.encode("utf-8") + b"\n"
        except UnicodeEncodeError:
            line = b""
        if line:
            # The header block and its blank line end where the body starts.
            at = wire.find(line, 0, len(wire) - body_len - 1)
            if at >= 0:
                return wire[:at] + wire[at + len(line) - 1:]
    head_end = _HEAD_END.search(wire)
    if head_end is None:
        return None
    stop = head_end.start()
    at = wire.find(needle, 0, stop)
    if at < 0 or wire.find(needle, at + 1, stop) >= 0:
        return None
    end = wire.find(b"\n", at + 1)
    return wire[:at] + wire[end:]


#: Header name -> the octets that start its line (LF, name, colon), or None for a name
#: whose line cannot simply be cut; filled by _line_start, bounded.
_LINE_STARTS: dict[str, bytes | None] = {}


def _line_start(name: str) -> bytes | None:
    if (not name.isascii() or any(c in name for c in _ESCAPED_CHARS)
            or name == "content-length"):  # it frames the body: encode() decides that one
        needle = None
    else:
        needle = b"\n" + name.encode() + b":"
    if len(_LINE_STARTS) < 256:  # names come from code here, but stay bounded anyway
        _LINE_STARTS[name] = needle
    return needle


def _check_version(version: str) -> None:
    if version not in STOMP_VERSIONS:
        raise ValueError(f"unknown STOMP version {version!r}; expected one of {STOMP_VERSIONS}")


def _is_command_name(command: str) -> bool:
    return command.isascii() and command.isalpha() and command.isupper()


def _short(data: str | bytes, limit: int = 40) -> str:
    return repr(data[:limit]) + ("..." if len(data) > limit else "")


def _unescape(text: str, version: str) -> str:
    """Undo STOMP 1.1 / 1.2 header escaping; an undefined escape is a FrameError."""
    slashes = text.count("\\")
    if not slashes:
        return text
    if text.count("\\c") == slashes:
        # Only escaped colons (ActiveMQ's message and ack ids): every backslash starts a
        # "\c" (occurrences of it cannot overlap), so one replace is exact.
        return text.replace("\\c", ":")
    if "\\\\" not in text:
        # No escaped backslash, so every backslash starts its own two-character escape and the
        # escapes cannot overlap: counting and replacing them in C is exact.
        found = text.count("\\n") + text.count("\\c")
        if version == "1.2":
            found += text.count("\\r")
        if found == slashes:
            text = text.replace("\\n", "\n").replace("\\c", ":")
            return text.replace("\\r", "\r") if version == "1.2" else text
    table = _UNESCAPE_12 if version == "1.2" else _UNESCAPE_11
    parts: list[str] = []
    start = 0
    while True:
        slash = text.find("\\", start)
        if slash < 0:
            parts.append(text[start:])
            return "".join(parts)
        parts.append(text[start:slash])
        replacement = table.get(text[slash + 1:slash + 2])
        if replacement is None:
            raise FrameError("bad header escape", detail=_short(text[slash:slash + 2]))
        parts.append(replacement)
        start = slash + 2


def _escape(text: str, version: str) -> str:
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    if version == "1.2" and "\r" in text:
        text = text.replace("\r", "\\r")
    return text


def _nul_in_headers() -> FrameError:
    return FrameError("NUL in headers", detail="the frame ended before the blank line")


def _parse_content_length(value: str) -> int:
    if len(value) < 10 and value.isdigit() and value.isascii():
        return int(value)
    if not (value.isascii() and value.isdigit()):
        raise FrameError("invalid content-length", detail=_short(value))
    if len(value.lstrip("0")) > 18:  # beyond any limit; also keeps int() far from its digit cap
        raise FrameError("content-length too large", detail=_short(value))
    return int(value)


class FrameDecoder:
    """Incremental decoder for one direction of one connection.

    :meth:`feed` returns the frames (and :data:`HEARTBEAT` sentinels) completed by the data, in
    order, and buffers the rest.  ``version`` governs header unescaping and may be changed at
    any time (the proxy sets it once CONNECTED has negotiated); it applies to frames completed
    by later :meth:`feed` calls.  After a :class:`FrameError` the decoder is poisoned: every
    further :meth:`feed` raises :class:`FrameError` with the same ``reason``.  With
    ``keep_wire=False`` decoded frames carry no received octets (``Frame.wire`` is None).
    With ``oversized=True`` a frame over the limits whose header block fits ``max_head_bytes``
    is handed on as :class:`Oversized` (its body skipped when over ``max_frame_bytes``), and
    decoding goes on after it; other errors still fail.
    """

    __slots__ = ("_accepted", "_buf", "_commands", "_error", "_keep_wire", "_limits", "_max_head",
                 "_need", "_nl", "_oversized", "_scan", "_shortcuts", "_skip_left", "_skip_nul",
                 "_state", "_version", "_violation")

    def __init__(
        self,
        *,
        limits: FrameLimits = _DEFAULT_LIMITS,
        commands: frozenset[str] = _ALL_COMMANDS,
        version: str = "1.2",
        keep_wire: bool = True,
        oversized: bool = False,
    ) -> None:
        bad = sorted(c for c in commands if not (isinstance(c, str) and _is_command_name(c)))
        if bad:
            raise ValueError(f"commands must be ASCII uppercase words, got {bad!r}")
        self._limits = limits
        #: Whether decoded frames keep their received octets (Frame.wire): a proxy's
        #: client leg re-encodes every frame anyway, so copying them there is waste.
        self._keep_wire = keep_wire
        #: First octet -> a shortcut for the plain form of a one-header frame (_SHORTCUTS).
        self._shortcuts = _SHORTCUTS
        self._max_head = limits.max_head_bytes
        self._commands = frozenset(commands)
        self._accepted = frozenset(c for c in commands if len(c) <= limits.max_command_bytes)
        self._version = "1.2"
        self.version = version
        self._buf = bytearray()  # incomplete frame (from its first command octet), if any
        self._state = _HEAD
        self._scan = 0  # _HEAD: terminator searched up to here; _BODY_NUL: NUL searched up to here
        self._nl = 0  # _HEAD: LFs seen in _buf[:_scan]
        self._need = 0  # _BODY_LEN: total bytes of the frame
        self._error: FrameError | None = None
        #: Hand frames over the limits on as Oversized instead of failing (see Oversized):
        #: for a trusted peer, whose one odd frame must not end the connection.
        self._oversized = oversized
        self._skip_left = 0  # octets of a skipped body still to discard, its NUL included
        self._skip_nul = False  # discarding a skipped body up to its NUL
        self._violation: tuple[str, str] | None = None  # a head limit the frame broke

    @property
    def version(self) -> str:
        return self._version

    @version.setter
    def version(self, version: str) -> None:
        _check_version(version)
        self._version = version

    @property
    def limits(self) -> FrameLimits:
        return self._limits

    @property
    def oversized(self) -> bool:
        """Whether frames over the limits are handed on as :class:`Oversized`."""
        return self._oversized

    @oversized.setter
    def oversized(self, value: bool) -> None:
        self._oversized = value

    @property
    def buffered(self) -> int:
        """Octets held of an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame | object]:
        """Frames and HEARTBEATs completed by ``data``, in order; the rest stays buffered."""
        if self._error is not None:
            raise FrameError(self._error.reason,
                             detail="the decoder failed earlier; close the connection")
        out: list[Frame | object] = []
        try:
            self._feed(data if type(data) is bytes else bytes(data), out)
        except FrameError as exc:
            self._error = exc
            self._buf = bytearray()
            exc.frames = out
            raise
        return out

    # -- internals ---------------------------------------------------------------------------

    def _feed(self, data: bytes, out: list[Frame | object]) -> None:
        if self._skip_left or self._skip_nul:
            data = self._skip(data)
            if not data:
                return
        buf = self._buf
        if buf:
            buf += data
            if not self._may_complete():
                return
            data = bytes(buf)
            self._buf = bytearray()
        elif not data:
            return
        self._parse(data, out)

    def _skip(self, data: bytes) -> bytes:
        """Discard the rest of an oversized frame's body; what follows it in ``data``."""
        if self._skip_nul:
            nul = data.find(b"\0")
            if nul < 0:
                return b""
            self._skip_nul = False
            return data[nul + 1:]
        left = self._skip_left
        if len(data) < left:
            self._skip_left = left - len(data)
            return b""
        self._skip_left = 0
        if data[left - 1] != 0:
            raise FrameError("missing NUL after body", detail="after an oversized frame")
        return data[left:]

    def _may_complete(self) -> bool:
        """False if the buffered incomplete frame certainly is still incomplete (limits checked)."""
        buf = self._buf
        n = len(buf)
        if self._state == _BODY_LEN:
            return n >= self._need
        if self._state == _BODY_NUL:
            stop = self._limits.max_frame_bytes  # the NUL must be at an index below this
            if buf.find(b"\0", self._scan, stop) >= 0:
                return True
            if n >= stop:
                if self._oversized:
                    return True  # _parse hands it on as Oversized
                raise FrameError("frame too large", detail="no NUL within max_frame_bytes")
            self._scan = n
            return False
        first = buf[0]
        if first == 10 or (first == 13 and (n == 1 or buf[1] == 10)):
            return True  # a heart-beat (or half of one) leads: let the parser take it
        if _HEAD_END.search(buf, max(0, self._scan - 2), min(n, self._max_head)) is not None:
            return True
        self._check_partial_head(buf, 0, self._scan, n)
        self._scan = n
        return False

    def _check_partial_head(self, buf: bytes | bytearray, start: int, scan: int, n: int) -> None:
        """Limits on a frame whose header block is unterminated in ``buf[start:n]``.

        ``buf[start:scan]`` was checked before (``self._nl`` counts its LFs), so a head that
        trickles in is checked in linear time.  The same checks run whether the head came in one
        piece or many, so the outcome does not depend on how the input was split.
        """
        limits = self._limits
        seen = self._nl
        self._nl = seen + buf.count(b"\n", scan, n)
        if self._nl == 0:  # still on the command line
            line = buf[start:n]
            if b"\0" in line:  # the frame ended on its command line
                error = self._command_error(line.decode("latin-1"))
                raise error or _nul_in_headers()
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > limits.max_command_bytes:
                raise FrameError("command too long", detail=_short(bytes(line)))
            if not (line.isalpha() and line.isupper()):
                raise FrameError("bad command", detail=_short(bytes(line)))
        else:
            if seen == 0:
                first = buf.find(b"\n", start, n)
                self._check_command_line(bytes(buf[start:first]))
                lines_from = first + 1
            else:  # from the start of the line that was incomplete at ``scan``
                lines_from = buf.rfind(b"\n", start, scan) + 1
            if self._nl - 1 > limits.max_header_count and not self._oversized:
                raise FrameError("too many headers", detail=f"more than {limits.max_header_count}")
            max_line = limits.max_header_line_bytes
            lines = buf[lines_from:n].split(b"\n")  # the last one is incomplete
            if not self._oversized and max(map(len, lines)) > max_line and (
                len(lines[-1]) > max_line + 1  # + 1: it may end with the CR of a CRLF
                or any(len(line) - line.endswith(b"\r") > max_line for line in lines[:-1])
            ):
                raise FrameError("header line too long", detail=f"more than {max_line} bytes")
        if buf.find(b"\0", scan, n) >= 0:
            raise _nul_in_headers()
        if n - start >= self._max_head:
            raise FrameError("headers too large",
                             detail=f"no blank line within {self._max_head} bytes")

    def _check_command_line(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        error = self._command_error(line.decode("latin-1"))
        if error is not None:
            raise error

    def _command_error(self, command: str) -> FrameError | None:
        """The FrameError that ``command`` deserves, or None if it is acceptable."""
        nul = command.find("\0")
        if nul >= 0:
            if command[:nul] in self._accepted:
                return _nul_in_headers()
            command = command[:nul]
        if len(command.encode("utf-8", "surrogatepass")) > self._limits.max_command_bytes:
            return FrameError("command too long", detail=_short(command))
        if not _is_command_name(command):
            return FrameError("bad command", detail=_short(command))
        if command not in self._commands:
            return FrameError("unknown command", detail=command)
        return None

    def _stash(self, buf: bytes, start: int, state: int) -> None:
        self._buf = bytearray(memoryview(buf)[start:])
        self._state = state

    def _parse(self, buf: bytes, out: list[Frame | object]) -> None:
        limits = self._limits
        max_frame = limits.max_frame_bytes
        max_head = self._max_head
        search = _HEAD_END.search
        keep_wire = self._keep_wire
        shortcuts = self._shortcuts
        append = out.append
        n = len(buf)
        pos = 0
        while pos < n:
            octet = buf[pos]
            if octet == 10:
                append(HEARTBEAT)
                pos += 1
                continue
            if octet == 13:
                if pos + 1 == n:
                    break  # maybe the first half of a CRLF heart-beat
                if buf[pos + 1] == 10:
                    append(HEARTBEAT)
                    pos += 2
                    continue
            start = pos
            shortcut = shortcuts.get(octet)
            if shortcut is not None and buf.startswith(shortcut[0], start):
                # One of the commonest frames per message (see _SHORTCUTS): when it is
                # the plain kind, complete here, taken in one search; anything else
                # (escapes, CR, over a limit, incomplete...) goes the general way below.
                prefix, command, name = shortcut
                value_at = start + len(prefix)
                end = buf.find(b"\n", value_at,
                               value_at + limits.max_header_line_bytes - len(name))
                if (end >= 0 and end + 2 < n and buf[end + 1] == 10 and buf[end + 2] == 0
                        and end + 3 - start <= max_frame and command in self._accepted):
                    raw = buf[value_at:end]
                    slashes = raw.count(b"\\")
                    # Escaped colons only (ActiveMQ's ack ids: ID\c...), STOMP 1.1+: every
                    # backslash starts a \c, so one replace is the unescape.
                    if (b"\r" not in raw and b"\0" not in raw
                            and (not slashes or (self._version != "1.0"
                                                 and raw.count(b"\\c") == slashes))):
                        try:
                            value = raw.decode("utf-8")
                        except UnicodeDecodeError:
                            pass
                        else:
                            if slashes:
                                value = value.replace("\\c", ":")
                            pos = end + 3
                            append(Frame(command, [(name, value)], b"",
                                         buf[start:pos] if keep_wire else None))
                            continue
            match = search(buf, start, min(n, start + max_head))
            if match is None:
                self._nl = 0
                self._check_partial_head(buf, start, start, n)
                self._stash(buf, start, _HEAD)
                self._scan = n - start
                return
            head_end = match.start()  # > start: buf[start] is no LF
            body_start = match.end()
            if buf[head_end - 1] == 13:
                head_end -= 1
            command, headers, length = self._parse_head(buf[start:head_end])
            if length is None:
                stop = start + max_frame
                nul = buf.find(b"\0", start, stop)  # from start: also catches a NUL in the head
                if nul < body_start:
                    if nul >= 0:
                        raise _nul_in_headers()
                    if n >= stop:
                        detail = "no NUL within max_frame_bytes"
                        if not self._oversized:
                            raise FrameError("frame too large", detail=detail)
                        append(self._skipped(command, headers, detail))
                        nul = buf.find(b"\0", stop)
                        if nul < 0:
                            self._skip_nul = True
                            return
                        pos = nul + 1
                        continue
                    self._stash(buf, start, _BODY_NUL)
                    self._scan = n - start
                    return
                body = buf[body_start:nul]
                pos = nul + 1
            else:
                if buf.find(b"\0", start, head_end) >= 0:
                    raise _nul_in_headers()
                end = body_start + length
                if end + 1 - start > max_frame:
                    detail = f"content-length {length}"
                    if not self._oversized:
                        raise FrameError("frame too large", detail=detail)
                    append(self._skipped(command, headers, detail))
                    if end >= n:
                        self._skip_left = end + 1 - n
                        return
                    if buf[end] != 0:
                        raise FrameError("missing NUL after body", detail=detail)
                    pos = end + 1
                    continue
                if end >= n:
                    self._stash(buf, start, _BODY_LEN)
                    self._need = end + 1 - start
                    return
                if buf[end] != 0:
                    raise FrameError("missing NUL after body", detail=f"content-length {length}")
                body = buf[body_start:end]
                pos = end + 1
            # Octets kept for relaying unchanged, unless a repeated content-length makes the
            # frame ambiguous (encode() keeps only the first one: a peer reading the last
            # one would see other frame boundaries than the proxy did).
            keep = keep_wire and pos - start <= MAX_WIRE_KEPT and (
                length is None or buf.count(b"\ncontent-length:", start, head_end) == 1)
            if self._violation is None:
                append(Frame(command, headers, body, buf[start:pos] if keep else None))
            else:
                (reason, detail), self._violation = self._violation, None
                append(Oversized(Frame(command, headers, body), reason, detail, True))
        if pos < n:
            self._stash(buf, pos, _HEAD)
            self._scan = 0
            self._nl = 0

    def _skipped(self, command: str, headers: list[tuple[str, str]], detail: str) -> Oversized:
        """The Oversized item of a frame whose body is skipped (over max_frame_bytes)."""
        self._violation = None  # the size is what it is handed on for
        return Oversized(Frame(command, headers), "frame too large", detail, False)

    def _parse_head(self, raw: bytes) -> tuple[str, list[tuple[str, str]], int | None]:
        """Command and headers from the header block (without its final EOL).

        With ``oversized``, too many headers or a header line too long are recorded in
        ``_violation`` (the frame is then handed on as Oversized) instead of raised.
        """
        limits = self._limits
        self._violation = None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameError("invalid UTF-8 in headers", detail=str(exc)) from None
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        command, _, rest = text.partition("\n")
        if command not in self._accepted:
            raise self._command_error(command) or FrameError("bad command")
        if not rest:
            return command, [], None
        lines = rest.split("\n")
        if len(lines) > limits.max_header_count:
            error = FrameError("too many headers", detail=f"more than {limits.max_header_count}")
            if not self._oversized:
                raise error
            self._violation = (error.reason, error.detail)
        max_line = limits.max_header_line_bytes
        if len(raw) > max_line:  # only then can a single line be too long
            for raw_line in raw.split(b"\n")[1:]:
                if len(raw_line) - raw_line.endswith(b"\r") > max_line:
                    error = FrameError("header line too long",
                                       detail=f"more than {max_line} bytes")
                    if not self._oversized:
                        raise error
                    self._violation = self._violation or (error.reason, error.detail)
                    break
        # Split every line at its first colon in C; drop (and then report) lines without a colon
        # or with an empty name.
        headers = [(name, value)
                   for name, colon, value in map(str.partition, lines, repeat(":"))
                   if colon and name]
        if len(headers) != len(lines):
            for line in lines:
                if ":" not in line:
                    raise FrameError("header line without ':'", detail=_short(line))
                if line.startswith(":"):
                    raise FrameError("empty header name", detail=_short(line))
        version = self._version
        if "\\" in rest and version != "1.0" and command not in _UNESCAPED_COMMANDS:
            headers = [(_unescape(name, version) if "\\" in name else name,
                        _unescape(value, version) if "\\" in value else value)
                       for name, value in headers]
        length = None
        at = text.find("\ncontent-length:")  # names hold no raw LF: this is the first one
        if at >= 0:
            at += 16
            end = text.find("\n", at)
            # An escape in the value cannot make (or unmake) a string of digits, so the raw
            # value decides; its escapes were validated above.
            length = _parse_content_length(text[at:end] if end >= 0 else text[at:])
        return command, headers, length


def encode_heartbeat() -> bytes:
    """One heart-beat: a bare EOL."""
    return b"\n"


def wire_of(frame: Frame, version: str) -> bytes:
    """The octets to relay ``frame`` with: as received when unchanged, else :func:`encode`.

    Only for a frame decoded on a connection speaking ``version`` too (a proxy's two legs
    negotiate the same version): received octets were valid there, so they are as good as
    an encoding of their own, and skipping the encoding is most of a relay's work.
    """
    wire = frame.wire
    return wire if wire is not None else encode(frame, version)


def encode(frame: Frame, version: str = "1.2") -> bytes:
    """The wire form of ``frame`` for a connection speaking STOMP ``version``.

    Headers are escaped as ``version`` requires (never for CONNECT, STOMP, CONNECTED).  The first
    ``content-length`` header is set to the body's true length and any repeat of it is dropped
    (two disagreeing lengths are a request-smuggling hazard); one is added when the body holds a
    NUL and none was given.  A header that this version cannot carry (for example a newline in a
    1.0 value, a colon in an unescaped name, a NUL anywhere, a value ending in CR where CR is not
    escaped) raises :class:`FrameError` instead of producing a corrupt frame.  EOL is ``"\\n"``.
    """
    _check_version(version)
    command = frame.command
    if command not in _ALL_COMMANDS and not _is_command_name(command):
        raise FrameError("bad command", detail=_short(command))
    body = frame.body if type(frame.body) is bytes else bytes(frame.body)
    escaped = version != "1.0" and command not in _UNESCAPED_COMMANDS
    headers = frame.headers
    if escaped and headers:
        # Fast path, most frames: no octet that needs an escape or a check. Joined, the
        # lines then hold one ":" and one LF per header (the separators) and no "\\",
        # CR or NUL; an empty name shows as "\n:", a content-length as its line start.
        head = f"{command}\n" + "\n".join([f"{name}:{value}" for name, value in headers])
        if (head.count(":") == len(headers) and head.count("\n") == len(headers)
                and "\\" not in head and "\r" not in head and "\0" not in head
                and "\n:" not in head and "\ncontent-length:" not in head):
            if b"\0" in body:
                head += f"\ncontent-length:{len(body)}"
            try:
                return b"".join((head.encode("utf-8"), b"\n\n", body, b"\0"))
            except UnicodeEncodeError:
                pass  # a lone surrogate: the full path below says so
    return _encode_checked(command, headers, body, version, escaped)


def encode_bodiless(command: str, headers: list[tuple[str, str]], version: str) -> bytes:
    """``encode(Frame(command, headers), version)`` for a frame without a body, cheaper.

    The same octets (or the same FrameError), for the small frames the sidecar writes per
    message (ACK, RECEIPT): values that only need escaping (an ActiveMQ ack id holds
    ``:``) are escaped here instead of taking :func:`encode`'s checked path; anything
    unusual (STOMP 1.0, an unescaped command, CR, NUL, an empty name, content-length, a
    lone surrogate) is left to :func:`encode`.
    """
    if version == "1.0" or command in _UNESCAPED_COMMANDS or command not in _ALL_COMMANDS:
        return encode(Frame(command, list(headers)), version)
    lines = [command]
    for name, value in headers:
        if (not name or name == "content-length" or "\r" in name or "\r" in value
                or "\0" in name or "\0" in value):
            return encode(Frame(command, list(headers)), version)
        if "\\" in name or "\n" in name or ":" in name:
            name = _escape(name, version)
        if "\\" in value or "\n" in value or ":" in value:
            value = _escape(value, version)
        lines.append(f"{name}:{value}")
    lines.append("\n")
    try:
        return "\n".join(lines).encode("utf-8") + b"\0"
    except UnicodeEncodeError:
        return encode(Frame(command, list(headers)), version)


def encode_one_header(command: str, name: str, value: str, version: str) -> bytes:
    """``encode_bodiless(command, [(name, value)], version)`` in one step for the usual case.

    For the frames the sidecar writes once per message (an ACK, a RECEIPT): ``name`` a
    plain header name (lowercase ASCII letters and ``-``), ``value`` ASCII without
    backslash, CR or NUL needs at most its colons and LFs escaped; anything else, and
    STOMP 1.0 or an unescaped command, takes :func:`encode_bodiless`.
    """
    if (version == "1.0" or command in _UNESCAPED_COMMANDS or command not in _ALL_COMMANDS
            or name not in _PLAIN_NAMES or "\\" in value or "\r" in value or "\0" in value
            or not value.isascii()):
        return encode_bodiless(command, [(name, value)], version)
    if ":" in value:
        value = value.replace(":", "\\c")
    if "\n" in value:
        value = value.replace("\n", "\\n")
    return f"{command}\n{name}:{value}\n\n\0".encode("ascii")


#: Header names :func:`encode_one_header` writes as they are.
_PLAIN_NAMES: Final = frozenset({"id", "receipt-id", "message-id", "subscription"})


def _encode_checked(command: str, headers: list[tuple[str, str]], body: bytes, version: str,
                    escaped: bool) -> bytes:
    """:func:`encode` header by header: escapes, checks, content-length normalised."""
    lines = [command]
    has_length = False
    for name, value in headers:
        if name == "content-length":
            if has_length:
                continue
            has_length = True
            value = str(len(body))
        if not name:
            raise FrameError("empty header name")
        if "\0" in name or "\0" in value:
            raise FrameError("NUL in header", detail=_short(name))
        if escaped:
            name = _escape(name, version)
            value = _escape(value, version)
        elif ":" in name or "\n" in name or "\n" in value:
            raise FrameError("header not representable",
                             detail=f"{_short(name)}: ':' or LF needs STOMP 1.1+ escaping")
        if value.endswith("\r"):  # only reachable where CR is not escaped
            raise FrameError("header not representable",
                             detail=f"{_short(name)}: a trailing CR would be read as EOL")
        lines.append(f"{name}:{value}")
    if not has_length and b"\0" in body:
        lines.append(f"content-length:{len(body)}")
    lines.append("\n")
    try:
        head = "\n".join(lines).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FrameError("header not representable", detail=str(exc)) from None
    return b"".join((head, body, b"\0"))
