"""A leg of the native data plane, seen as the asyncio transport a FrameConnection uses.

The native plane (:mod:`mqguard.sidecar.native_plane`) owns the sockets on its tokio
runtime; what a :class:`~mqguard.sidecar.connection.FrameConnection` asks of its
transport (write, pause or resume reading, close, abort) becomes a call into that
runtime that returns at once, and what happens on the socket comes back through the
plane's batched events as the usual protocol callbacks (``data_received``,
``eof_received``, ``connection_lost``). The session logic above is the same on both
data planes.

Back-pressure between the two legs of a session is the runtime's own: a leg whose
outgoing queue is over its high-water mark pauses the reading of the leg it is
coupled with (:meth:`NativeConnection.couple`), without a round trip through Python.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from mqguard.sidecar.connection import FrameConnection, Items, OnEnd, OnItems
from mqguard.sidecar.frames import FrameDecoder, FrameError

if TYPE_CHECKING:
    import ssl

    from mqguard_native import Plane

__all__ = ["Limits", "NativeConnection", "NativeDecoder", "NativeTransport", "limits_tuple"]


class Limits(Protocol):
    """What the runtime's decoders take of a :class:`FrameLimits`."""

    @property
    def max_frame_bytes(self) -> int: ...
    @property
    def max_header_count(self) -> int: ...
    @property
    def max_header_line_bytes(self) -> int: ...
    @property
    def max_command_bytes(self) -> int: ...


def limits_tuple(limits: Limits) -> tuple[int, int, int, int]:
    """``limits`` as the runtime takes them."""
    return (limits.max_frame_bytes, limits.max_header_count, limits.max_header_line_bytes,
            limits.max_command_bytes)


class NativeTransport(asyncio.Transport):
    """One leg of the native plane: writes queue in the runtime, never block."""

    def __init__(self, plane: Plane, leg: int, *, peername: tuple[str, int] | None = None,
                 sslcontext: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self._plane = plane
        self.plane = plane
        self.leg = leg
        self._extra: dict[str, Any] = {"peername": peername, "sslcontext": sslcontext,
                                       "socket": None}
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False
        #: The leg's socket is gone (its Closed event arrived).
        self.closed = False
        self._reading = True

    # -- asyncio.BaseTransport -----------------------------------------------------------

    def set_extra(self, name: str, value: Any) -> None:
        self._extra[name] = value

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        value = self._extra.get(name)
        return default if value is None else value

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Write what is queued, then close (``connection_lost`` follows)."""
        if self._closing:
            return
        self._closing = True
        self._plane.stop_reading(self.leg)
        self._plane.close(self.leg)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    # -- asyncio.ReadTransport -----------------------------------------------------------

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if self._reading and not self.closed:
            self._reading = False
            self._plane.pause(self.leg, True)

    def resume_reading(self) -> None:
        if not self._reading and not self.closed:
            self._reading = True
            self._plane.pause(self.leg, False)

    # -- asyncio.WriteTransport ----------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._plane.write(self.leg, bytes(data) if not isinstance(data, bytes) else data)

    def get_write_buffer_size(self) -> int:
        return 0 if self.closed else self._plane.queued(self.leg)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """The runtime's high-water mark is fixed (1 MiB, as the asyncio plane sets)."""

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (256 * 1024, 1024 * 1024)

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        """Close now, dropping what is queued."""
        self._closing = True
        self._plane.abort(self.leg, False)

    def couple_with(self, peer: NativeTransport) -> None:
        """Pause ``peer``'s reading while this leg's outgoing queue is over its mark."""
        if not self.closed:
            self._plane.couple(self.leg, peer.leg)

    def reset(self) -> None:
        """Close now with an RST (SO_LINGER 0): nothing stays behind for a peer that
        stopped reading."""
        self._closing = True
        self._plane.abort(self.leg, True)

    # -- events from the runtime (see NativePlane.dispatch) ------------------------------

    def feed(self, items: Items, error: FrameError | None, size: int) -> None:
        protocol = self._protocol
        if isinstance(protocol, FrameConnection) and not self._closing:
            protocol.items_received(items, error, size)

    def feed_eof(self) -> None:
        protocol = self._protocol
        if protocol is None or self._closing:
            return
        if not protocol.eof_received():  # type: ignore[attr-defined]
            self.close()

    def lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._closing = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.connection_lost(exc)  # type: ignore[arg-type]


class NativeDecoder:
    """What a session asks of its leg's decoder, which runs in the runtime.

    The session sets the STOMP version and the oversized mode after CONNECTED, and asks
    how much of a frame is buffered at the client's end; the settings are also kept in
    the decoder the connection was made with (``given``), so that the settings the
    session makes on that one (the broker leg's) reach the runtime too, when the relay
    starts (:meth:`NativeConnection.relay`).
    """

    __slots__ = ("_given", "_leg", "_plane")

    def __init__(self, plane: Plane, leg: int, given: FrameDecoder) -> None:
        self._plane = plane
        self._leg = leg
        self._given = given

    @property
    def limits(self) -> Limits:
        return self._given.limits

    @property
    def version(self) -> str:
        return self._given.version

    @version.setter
    def version(self, version: str) -> None:
        self._given.version = version
        self.push()

    @property
    def oversized(self) -> bool:
        return self._given.oversized

    @oversized.setter
    def oversized(self, on: bool) -> None:
        self._given.oversized = on
        self.push()

    @property
    def buffered(self) -> int:
        return self._plane.buffered(self._leg)

    def push(self) -> None:
        """Hand the settings of ``given`` to the runtime's decoder."""
        self._plane.set_decoding(self._leg, self._given.version, self._given.oversized)


class NativeConnection(FrameConnection):
    """A :class:`FrameConnection` over a :class:`NativeTransport`, decoding in the runtime."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, NativeTransport):
            given = self.decoder
            self.decoder = NativeDecoder(transport.plane, transport.leg,  # type: ignore[assignment]
                                         given)
        super().connection_made(transport)

    def relay(self, on_items: OnItems, on_end: OnEnd) -> None:
        if isinstance(self.decoder, NativeDecoder):
            self.decoder.push()
        super().relay(on_items, on_end)

    def couple(self, peer: FrameConnection) -> None:
        super().couple(peer)
        mine, theirs = self.transport, peer.transport
        if isinstance(mine, NativeTransport) and isinstance(theirs, NativeTransport):
            mine.couple_with(theirs)

    def reset(self) -> None:
        if isinstance(self.transport, NativeTransport):
            self.transport.reset()
        else:
            super().reset()
