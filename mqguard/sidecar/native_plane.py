"""The native data plane's Python side: the runtime, its events, and the sidecar's hooks.

:class:`NativePlane` starts the extension's tokio runtime (``mqguard_native.Plane``,
its own worker threads), which owns the listening sockets and both legs of every
session. The asyncio loop stays the only thread that runs the sidecar's Python: the
runtime queues what happens on its sockets and makes one descriptor readable; the loop
then takes the whole queue in one call (:meth:`NativePlane.dispatch`, the GIL taken
once for a burst of reads on any number of connections) and hands each event to its
leg's protocol as asyncio would (see :mod:`mqguard.sidecar.native_connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from mqguard.sidecar.connection import FrameConnection, Items
from mqguard.sidecar.frames import FrameError, FrameLimits
from mqguard.sidecar.native_connection import NativeTransport, limits_tuple

if TYPE_CHECKING:
    from mqguard_native import Plane

__all__ = ["DATA_PLANES", "NativePlane", "native_available"]

#: The values of ``[mqguard.sidecar] data-plane`` / ``--data-plane``; ``native-session``
#: (experimental) runs whole sessions in the runtime (see native_bridge).
DATA_PLANES: Final = ("python", "native", "native-session")

log = logging.getLogger("mqguard.sidecar")

# Event kinds of Plane.drain() (native/src/transport/plane.rs).
_ITEMS, _EOF, _CLOSED, _ACCEPTED, _CONNECTED, _CONNECT_FAILED, _REFUSED, _MALFORMED = range(8)


def native_available() -> bool:
    """Whether the mqguard_native extension (with its transport) is installed."""
    try:
        from mqguard_native import Plane  # noqa: F401
    except ImportError:
        return False
    return True


class NativePlane:
    """One sidecar's tokio runtime and the legs it serves."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from mqguard_native import Plane

        self._loop = loop
        self.plane: Plane = Plane()
        self._transports: dict[int, NativeTransport] = {}
        self._connecting: dict[int, asyncio.Future[None]] = {}
        #: Called with a new client connection's transport (the sidecar's accept).
        self.on_accept: Callable[[NativeTransport], None] | None = None
        #: Called with why the runtime refused a client itself ("fd", "tls").
        self.on_refused: Callable[[str], None] | None = None
        self._fd = self.plane.wake_fd()
        loop.add_reader(self._fd, self.dispatch)

    def listen(self, hosts: list[str], port: int, *, refusal: bytes, limits: FrameLimits,
               tls_files: tuple[str, str] | None, max_tls_handshakes: int,
               handshake_timeout: float) -> int:
        """Listen on every host (IP addresses) and accept from now on; returns the port.
        Client frames are decoded within ``limits``."""
        cert, key = tls_files if tls_files is not None else (None, None)
        return self.plane.listen(hosts, port, refusal, limits_tuple(limits), cert, key,
                                 max_tls_handshakes, int(handshake_timeout * 1000))

    def close_listeners(self) -> None:
        self.plane.close_listeners()

    def upstream_tls(self, cafile: str | None, insecure: bool) -> None:
        if cafile is None and not insecure:
            paths = ssl.get_default_verify_paths()
            cafile = paths.cafile or paths.openssl_cafile
        self.plane.upstream_tls(cafile, insecure)

    async def connect(self, connection: FrameConnection, host: str, port: int, *,
                      tls: bool) -> None:
        """Open ``connection``'s leg to the broker; OSError (or ssl.SSLError) if it fails."""
        leg = self.plane.connect(host, port, limits_tuple(connection.decoder.limits), tls, True)
        done = self._loop.create_future()
        self._connecting[leg] = done
        try:
            await done
        except BaseException:
            self._connecting.pop(leg, None)
            self.plane.abort(leg, False)  # a timeout or cancellation: drop what got made
            raise
        transport = NativeTransport(self.plane, leg, peername=(host, port))
        transport.set_protocol(connection)
        self._transports[leg] = transport
        connection.connection_made(transport)

    def dispatch(self) -> None:
        """Hand every pending event of the runtime to its leg (the loop's reader callback).

        An exception while handling one (a bug) ends that leg, as asyncio ends a transport
        whose protocol raised, and the other events are still handed on.
        """
        for kind, leg, a, b in self.plane.drain():
            try:
                self._dispatch_one(kind, leg, a, b)
            except Exception:
                log.exception("native data plane: handling an event of connection %d "
                              "failed; closing it", leg)
                transport = self._transports.get(leg)
                if transport is not None:
                    transport.abort()

    def _dispatch_one(self, kind: int, leg: int, a: object, b: object) -> None:
        transports = self._transports
        if kind == _ITEMS:
            transport = transports.get(leg)
            if transport is not None:
                transport.feed(cast(Items, a), None, cast(int, b))
        elif kind == _MALFORMED:
            transport = transports.get(leg)
            if transport is not None:
                size, reason, detail = cast(tuple[int, str, str], b)
                transport.feed(cast(Items, a), FrameError(reason, detail=detail), size)
        elif kind == _EOF:
            transport = transports.get(leg)
            if transport is not None:
                transport.feed_eof()
        elif kind == _CLOSED:
            transport = transports.pop(leg, None)
            if transport is not None:
                transport.lost(None if a is None else _os_error(cast(int, a), str(b)))
        elif kind == _ACCEPTED:
            transport = NativeTransport(self.plane, leg,
                                        peername=(str(a), cast(int, b)))
            transports[leg] = transport
            # The next client once the loop has turned (see Plane.accept_more), whatever
            # becomes of this one.
            self._loop.call_soon(self.plane.accept_more)
            if self.on_accept is not None:
                self.on_accept(transport)
            else:
                transport.abort()
        elif kind == _CONNECTED:
            future = self._connecting.pop(leg, None)
            if future is not None and not future.done():
                future.set_result(None)
        elif kind == _CONNECT_FAILED:
            future = self._connecting.pop(leg, None)
            if future is not None and not future.done():
                number, tls_error = cast(tuple[int, bool], a)
                future.set_exception(ssl.SSLError(b) if tls_error
                                     else _os_error(number, str(b)))
        elif kind == _REFUSED and self.on_refused is not None:
            self.on_refused(str(a))

    def client_transport(self, transport: NativeTransport, protocol: FrameConnection,
                         sslcontext: ssl.SSLContext | None) -> None:
        """Make ``protocol`` the accepted ``transport``'s protocol."""
        if sslcontext is not None:
            transport.set_extra("sslcontext", sslcontext)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the runtime (legs still open are dropped) and stop watching it."""
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        self.plane.shutdown(int(timeout * 1000))
        for transport in list(self._transports.values()):
            transport.lost(None)
        self._transports.clear()


def _os_error(number: int, text: str) -> OSError:
    if number == errno.ECONNRESET:
        return ConnectionResetError(number, text)
    if number == errno.ECONNREFUSED:
        return ConnectionRefusedError(number, text)
    if number == errno.EPIPE:
        return BrokenPipeError(number, text)
    return OSError(number or None, text)
