"""One TCP (or TLS) connection of a proxy session, as an asyncio protocol.

Each leg of a session (client <-> sidecar, sidecar <-> broker) is a
:class:`FrameConnection`: it decodes what arrives into frames and, once the
session relays, hands the frames of each read to the session *inside the read
callback*. Streams (``StreamReader``) put a future, a task switch and a loop turn
between a read and its handling, and the writes of that handling one more turn
later (measured on ``bench proxy``'s one-at-a-time exchange: 4 loop turns and
~200 us of the sidecar's CPU per exchange on a 2-core machine; a stream relay
added 65 us of latency where a protocol relay added 26 us). Here a read is
handled and its writes leave before the loop polls again.

Before the relay starts (CONNECT / CONNECTED), the session pulls frames one by
one with :meth:`FrameConnection.next`; what was decoded and not taken yet stays
queued and is handed to the relay first, so a client may pipeline frames right
behind its CONNECT.

The client leg of a session is not yet authenticated then, so it is held to a
handshake budget (``handshake_bytes``): its first frame (the CONNECT) may take that
many octets at most, not ``max-frame-bytes``, and once that frame is complete the
connection reads no more until the relay starts. What the sidecar holds for a
connection that never finishes its handshake is thus bounded by the budget plus one
read, whatever the client sends (a CONNECT growing to 16 MiB used to be buffered).

Flow control: a connection whose peer stops reading pauses reading on the other
leg (:meth:`FrameConnection.couple`), so a slow consumer or broker holds the
other side back instead of filling the sidecar's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from mqguard.sidecar.frames import HEARTBEAT, Frame, FrameDecoder, FrameError

if TYPE_CHECKING:
    from mqguard.sidecar.metrics import Count

#: Frames decoded ahead and not taken yet (before the relay starts) above which reading
#: pauses: a client flooding behind its CONNECT while the broker connects is held back.
MAX_QUEUED: Final = 1024
#: Bytes in a transport's write buffer above which it asks to pause its peer's reading.
WRITE_HIGH_WATER: Final = 1 << 20

Items = list[Frame | object]
#: Called with the frames (and HEARTBEATs) of one read, in order.
OnItems = Callable[[Items], None]
#: Called once when the connection ends: "eof", "lost" (a reset or another OSError,
#: given) or "malformed" (the FrameError, after the valid frames before it).
OnEnd = Callable[[str, BaseException | None], None]


class FrameConnection(asyncio.Protocol):
    """Decoded frames in, bytes out, for one connection of a session."""

    def __init__(self, decoder: FrameDecoder, counter: Count, *,
                 on_made: Callable[[FrameConnection], None] | None = None,
                 handshake_bytes: int | None = None) -> None:
        """``handshake_bytes``: the most octets the peer may send up to the end of its
        first frame (see the module docstring); None: no such bound (the broker leg)."""
        self.decoder = decoder
        self._counter = counter
        self._on_made = on_made
        self.transport: asyncio.Transport | None = None
        #: Called after each read, before its frames are handled (TCP quick-ack).
        self.after_read: Callable[[], None] | None = None
        #: Called once the first frame is complete, with a handshake budget only: the
        #: connection is no longer a pending handshake (see Sidecar._accept).
        self.on_first_frame: Callable[[], None] | None = None
        self._ready: deque[Frame | object] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Why the connection ended (see OnEnd), once it has.
        self._end: tuple[str, BaseException | None] | None = None
        self._on_items: OnItems | None = None
        self._on_end: OnEnd | None = None
        self._reading = True  # False once stopped for good
        self._paused_for_queue = False
        #: Octets the first frame may still take; None once it is complete (or unbounded).
        self._handshake_left = handshake_bytes
        self._handshake_bytes = handshake_bytes
        #: Reading stopped after the first frame until the relay starts (see the module
        #: docstring); nothing else resumes it.
        self._held = False
        #: The other leg, whose reading pauses while this one's writes back up.
        self._peer: FrameConnection | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        with contextlib.suppress(Exception):
            self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        if self._end is not None or not self._reading:
            return  # after an error or a stop: nothing more is read from this peer
        if self.after_read is not None:
            self.after_read()
        error: FrameError | None = None
        try:
            items = self.decoder.feed(data)
        except FrameError as exc:
            items = exc.frames
            error = exc
        self.items_received(items, error, len(data))

    def items_received(self, items: Items, error: FrameError | None, size: int) -> None:
        """The items decoded from one read of ``size`` octets, then the error that ended
        decoding, if any: from :meth:`data_received`, or from a data plane that decodes
        elsewhere (:mod:`mqguard.sidecar.native_connection`)."""
        if self._end is not None or not self._reading:
            return
        self._counter.value += size
        items = without_padding(items)
        on_items = self._on_items
        if on_items is None:
            if self._handshake_left is not None and error is None:
                error = self._check_handshake(size, items)
                if error is not None:
                    items = [item for item in items if item is HEARTBEAT]
            self._ready.extend(items)
            if error is not None:
                self._finish("malformed", error)
            elif len(self._ready) >= MAX_QUEUED and self.transport is not None:
                self._paused_for_queue = True
                self.transport.pause_reading()
            self._wake()
            return
        if items:
            on_items(items)
        if error is not None:
            self._finish("malformed", error)

    def _check_handshake(self, size: int, items: Items) -> FrameError | None:
        """Bound the unauthenticated peer's first frame; hold reading once it is complete.

        The first frame's own size is checked once it is decoded (a read may complete
        it and exceed the budget at once); until then, every octet received counts.
        """
        limit = self._handshake_bytes
        assert limit is not None and self._handshake_left is not None
        first = next((item for item in items if isinstance(item, Frame)), None)
        if first is None:
            self._handshake_left -= size
            if self._handshake_left >= 0:
                return None
            return FrameError("frame too large",
                              detail=f"more than {limit} bytes before CONNECTED "
                                     "(max-handshake-frame-bytes)")
        if _frame_size(first) > limit:
            return FrameError("frame too large",
                              detail=f"CONNECT over {limit} bytes (max-handshake-frame-bytes)")
        self._handshake_left = None
        # Nothing more is read (buffered) until the broker accepted the client: what it
        # pipelines behind its CONNECT waits in the kernel's socket buffer meanwhile.
        self._held = True
        if self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.pause_reading()
        on_first_frame, self.on_first_frame = self.on_first_frame, None
        if on_first_frame is not None:
            on_first_frame()
        return None

    def eof_received(self) -> bool:
        self._finish("eof", None)
        # True: keep the transport open for writing. A client that half-closes after its
        # last SEND still gets its RECEIPTs (and the ERROR of a truncated frame). TLS
        # cannot half-close (asyncio warns when asked to).
        return self.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish("lost" if exc is not None else "eof", exc)
        if not self._closed.done():
            self._closed.set_result(None)
        if self._peer is not None:
            self._peer.resume_reading()  # nothing it writes here waits any longer

    def pause_writing(self) -> None:
        if self._peer is not None and self._peer.transport is not None:
            with contextlib.suppress(Exception):
                self._peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self._peer is not None:
            self._peer.resume_reading()

    # -- before the relay ----------------------------------------------------------------

    async def next(self) -> Frame | object | None:
        """The next frame or HEARTBEAT; None at end of stream; FrameError when malformed,
        after the valid frames before it; an OSError when the connection was reset."""
        while not self._ready:
            if self._end is not None:
                exc = self._end[1]
                if exc is not None:
                    raise exc
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._ready.popleft()
        if self._paused_for_queue and not self._ready:
            self.resume_reading()
        return item

    # -- relaying ------------------------------------------------------------------------

    def relay(self, on_items: OnItems, on_end: OnEnd) -> None:
        """From now on, hand every read's frames to ``on_items`` within the read callback,
        and the end of the connection to ``on_end`` (once). Frames queued before are
        handed over first, now; so is an end that already happened."""
        self._on_items = on_items
        self._on_end = on_end
        self._handshake_left = None
        held, self._held = self._held, False
        if self._ready:
            items = list(self._ready)
            self._ready.clear()
            on_items(items)
        if self._paused_for_queue or held:
            self.resume_reading()
        if self._end is not None:
            # Ended before the relay started (or while handing the queued frames over).
            ended, self._on_end, self._on_items = self._on_end, None, None
            if ended is not None:
                ended(*self._end)

    def couple(self, peer: FrameConnection) -> None:
        """Pause ``peer``'s reading while writes to this connection back up."""
        self._peer = peer

    def stop_reading(self) -> None:
        """Read nothing more from this peer; its frames and its end are no longer handed on."""
        self._reading = False
        self._on_items = None
        self._on_end = None
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(Exception):
                self.transport.pause_reading()

    def resume_reading(self) -> None:
        self._paused_for_queue = False
        transport = self.transport
        if self._reading and not self._held and self._end is None and transport is not None \
                and not transport.is_closing():
            with contextlib.suppress(Exception):
                transport.resume_reading()

    def abandon(self) -> None:
        """End now, as if the peer had closed: :meth:`next` returns None (an evicted
        handshake, see :meth:`~mqguard.sidecar.server.Sidecar.client_connection`)."""
        self.stop_reading()
        self._finish("eof", None)

    # -- writing and closing -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def get_extra_info(self, name: str) -> object:
        return self.transport.get_extra_info(name) if self.transport is not None else None

    async def close(self, timeout: float) -> None:
        """Close after what is buffered was written; reset if that takes over ``timeout``."""
        if self.transport is None:
            return
        self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)
        except TimeoutError:
            self.reset()

    def reset(self) -> None:
        """Drop a connection whose peer stopped reading, with an RST.

        ``close()`` waits for the write buffer to flush, forever if the peer never reads:
        the socket and megabytes of frames for it outlived the session, uncounted by
        max-connections. A plain ``abort()`` still leaves an orphaned kernel socket in
        FIN-WAIT-1 holding the unsent data for as long as the peer keeps its window shut;
        with SO_LINGER 0 the kernel discards it and resets the connection at once.
        """
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def release(self) -> None:
        """Drop every reference to the session and to what was read, once it has ended.

        A session and its connections refer to one another (callbacks, the peer leg), and
        the sidecar raises the collector's young-generation threshold (gctune): left to
        the cyclic collector, an ended session's buffers (up to ``max-frame-bytes`` per
        leg) stayed resident for minutes. Freed here by reference counting instead.
        """
        self._on_items = None
        self._on_end = None
        self._on_made = None
        self.after_read = None
        self.on_first_frame = None
        self._peer = None
        self._ready.clear()
        self._waiter = None
        if self._end is not None:
            # The exception's traceback holds the frames (and their objects) it went through.
            self._end = (self._end[0], None)
        self.decoder = FrameDecoder(limits=self.decoder.limits)

    # -- internals -----------------------------------------------------------------------

    def _finish(self, kind: str, exc: BaseException | None) -> None:
        if self._end is not None:
            return
        self._end = (kind, exc)
        self._wake()
        on_end, self._on_end, self._on_items = self._on_end, None, None
        if on_end is not None:
            on_end(kind, exc)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class QuickAck:
    """Re-arms TCP_QUICKACK on the broker connection, for after each read (Linux only).

    The sidecar asks for a RECEIPT on every SEND. A broker writing with Nagle on
    (ActiveMQ's default transport) then sends the RECEIPT and the MESSAGE behind it
    as two small segments, and the MESSAGE waits for the TCP ack of the RECEIPT,
    which Linux delays by 40 ms: +44 ms on every one-at-a-time exchange
    (``bench proxy``). The kernel leaves quick-ack mode by itself, hence once per
    read. The option is set through one duplicate of the connection's socket made
    here: uvloop's socket stand-in builds a socket object per call (a ``getsockname``
    and a ``setsockopt`` system call, and Python objects, per read). :meth:`close`
    closes that duplicate, before the connection itself is closed.

    Not on the client leg: tried (after reads holding SENDs, so that a Nagle client's
    next SENDs come without waiting for the first RECEIPT), it measured no gain in
    ``bench proxy``, and it changes when a pipelined duplicate arrives relative to the
    confirmation of its original (``tests/integration/test_sidecar.py``).
    """

    __slots__ = ("_option", "_sock")

    def __init__(self, sock: socket.socket, option: int) -> None:
        self._sock = sock
        self._option = option

    @classmethod
    def of(cls, connection: FrameConnection) -> QuickAck | None:
        """For ``connection``; None where the option does not apply."""
        option = getattr(socket, "TCP_QUICKACK", None)
        sock: socket.socket | None = connection.get_extra_info("socket")  # type: ignore[assignment]
        if option is None or sock is None or sock.family not in (socket.AF_INET,
                                                                 socket.AF_INET6):
            return None
        try:
            own = sock.dup()
        except OSError:
            return None
        return cls(own, option)

    def __call__(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_TCP, self._option, 1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _frame_size(frame: Frame) -> int:
    """About the octets of ``frame`` on the wire (characters of its headers, escapes left
    out): enough to bound a handshake frame."""
    return (len(frame.command) + sum(len(name) + len(value) + 2 for name, value in frame.headers)
            + len(frame.body) + 3)


def without_padding(items: Items) -> Items:
    """Drop the EOLs that follow a frame in the same read: padding, not heart-beats.

    Brokers end every frame with ``NUL EOL``; the frame itself is the sign of life a
    heart-beat would be. Relayed as heart-beats, those EOLs put ``"\\n\\n"`` on the wire
    whenever the frame between them was the sidecar's own (a RECEIPT it answers itself),
    and stomp.py 9 silently drops the frame that arrives behind a ``"\\n\\n"`` read (its
    end-of-headers search matches the leading blank line). EOLs at the start of a read,
    an idle peer's heart-beats, are kept.
    """
    out: Items = []
    after_frame = False
    for item in items:
        if item is not HEARTBEAT:
            after_frame = True
        elif after_frame:
            continue
        out.append(item)
    return out
