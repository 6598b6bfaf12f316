"""The sidecar's admin port: bounded HTTP request reading and the broker health probe.

The admin port is unauthenticated and answers two paths (``/metrics``, ``/health``), so
what it reads is bounded like any input from the network: a request line of at most
:data:`MAX_REQUEST_LINE_BYTES` (else ``414 URI Too Long``), at most
:data:`MAX_HEADER_COUNT` header lines of at most :data:`MAX_HEADER_LINE_BYTES` each and
:data:`MAX_HEAD_BYTES` in all (else ``431 Request Header Fields Too Large``). The
answer is written, the connection closed; nothing is logged above DEBUG (a flood must not
flood the log too).

``/health`` is only worth its name if it fails when clients fail: a broker that accepts
TCP connections but does not answer (frozen, overloaded, its STOMP acceptor stuck)
makes every client's CONNECT time out. :class:`UpstreamProbe` therefore performs a
STOMP handshake (CONNECT, then DISCONNECT) with the sidecar's own credentials (those
of ``--upstream``, if any) and a short timeout. Any STOMP answer counts as alive: an
``ERROR`` for the probe's credentials still shows a broker that answers (clients bring
their own). The result is cached for :attr:`UpstreamProbe.ttl` seconds and concurrent
requests share one probe, so ``/health`` cannot be used to flood the broker with
connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from mqguard.sidecar.frames import SERVER_COMMANDS, Frame, FrameDecoder, FrameError, encode

if TYPE_CHECKING:
    from mqguard.sidecar.server import Upstream

__all__ = ["MAX_HEADER_COUNT", "MAX_HEADER_LINE_BYTES", "MAX_HEAD_BYTES",
           "MAX_REQUEST_LINE_BYTES", "ProbeResult", "RequestTooLarge", "UpstreamProbe",
           "linger_and_close", "read_request_line"]

#: Longest request line read (``GET /health HTTP/1.1`` is 24 bytes).
MAX_REQUEST_LINE_BYTES = 8192
#: Most header lines read (none is needed; clients send a few).
MAX_HEADER_COUNT = 64
#: Longest header line read.
MAX_HEADER_LINE_BYTES = 8192
#: Most bytes of request line and headers together.
MAX_HEAD_BYTES = 32 * 1024
#: How long an answered request's connection is drained before it is closed (so the
#: client reads the answer instead of a reset when it sent more than was read).
_LINGER_S = 0.5


class RequestTooLarge(Exception):
    """A request over the admin port's bounds; ``status`` is the HTTP answer to give."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


async def read_request_line(reader: asyncio.StreamReader) -> str:
    """The request line of an HTTP request, its headers read and discarded, within bounds.

    Raises :class:`RequestTooLarge` (414 for the request line, 431 for the headers) as
    soon as what was read exceeds a bound, without waiting for the line's end. A client
    that leaves early gets its request line served as it is (or "" without one).
    """
    buffer = b""
    while True:
        request, blank = _check_head(buffer)
        if blank:
            return request.decode("latin-1")
        chunk = await reader.read(4096)
        if not chunk:
            return request.decode("latin-1")
        buffer += chunk


def _check_head(buffer: bytes) -> tuple[bytes, bool]:
    """``(request line, whether the blank line ending the head was read)`` of ``buffer``;
    :class:`RequestTooLarge` when it exceeds a bound already."""
    request, newline, rest = buffer.partition(b"\n")
    if len(request) > MAX_REQUEST_LINE_BYTES:
        raise RequestTooLarge("414 URI Too Long",
                              f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
    if not newline:
        return b"", False
    lines = rest.split(b"\n")
    complete, partial = lines[:-1], lines[-1]
    size = len(request) + 1
    for count, line in enumerate(complete):
        if line in (b"", b"\r"):
            return request, True  # what follows (a body) is never read
        size += len(line) + 1
        if count >= MAX_HEADER_COUNT or len(line) > MAX_HEADER_LINE_BYTES \
                or size > MAX_HEAD_BYTES:
            raise _headers_too_large()
    if len(partial) > MAX_HEADER_LINE_BYTES or size + len(partial) > MAX_HEAD_BYTES:
        raise _headers_too_large()
    return request, False


def _headers_too_large() -> RequestTooLarge:
    return RequestTooLarge("431 Request Header Fields Too Large",
                           f"request head over {MAX_HEADER_COUNT} header lines, "
                           f"{MAX_HEADER_LINE_BYTES} bytes per line or {MAX_HEAD_BYTES} in all")


async def linger_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close after an answer: half-close, then discard what the client still sends for a
    moment (bounded), so that closing with unread input does not reset the connection
    before the client has read the answer."""
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(_LINGER_S):
            discarded = 0
            while discarded < MAX_HEAD_BYTES * 32:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                discarded += len(chunk)
    with contextlib.suppress(Exception):
        writer.close()


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One STOMP handshake with the broker."""

    #: The broker answered CONNECT (CONNECTED, or ERROR for the probe's credentials).
    ok: bool
    #: What happened, for people: "CONNECTED", "ERROR: ...", or why it failed.
    detail: str
    #: time.monotonic() of the probe.
    at: float


class UpstreamProbe:
    """Checks the broker at STOMP level; results cached for ``ttl`` seconds."""

    def __init__(self, upstream: Upstream, *, timeout: float = 2.0, ttl: float = 1.0) -> None:
        self.upstream = upstream
        self.timeout = timeout
        self.ttl = ttl
        self._last: ProbeResult | None = None
        self._lock: asyncio.Lock | None = None
        parts = urlsplit(upstream.url)
        self._login = unquote(parts.username) if parts.username else None
        self._passcode = unquote(parts.password) if parts.password is not None else None
        self._vhost = parse_qs(parts.query).get("vhost", ["/"])[0]

    async def check(self) -> ProbeResult:
        """The cached result if fresh, else a new handshake (one at a time)."""
        last = self._last
        if last is not None and time.monotonic() - last.at < self.ttl:
            return last
        if self._lock is None:
            self._lock = asyncio.Lock()  # made on the loop that uses it
        async with self._lock:
            last = self._last
            if last is not None and time.monotonic() - last.at < self.ttl:
                return last  # another request probed meanwhile
            self._last = await self._probe()
            return self._last

    def _connect_frame(self) -> bytes:
        headers = [("accept-version", "1.0,1.1,1.2"), ("host", self._vhost),
                   ("heart-beat", "0,0")]
        if self._login is not None:
            headers.append(("login", self._login))
        if self._passcode is not None:
            headers.append(("passcode", self._passcode))
        # CONNECT headers are not escaped (STOMP 1.2); a line break in a credential would
        # split the frame: the probe then goes without it.
        headers = [(name, value) for name, value in headers
                   if "\n" not in value and "\r" not in value]
        return encode(Frame("CONNECT", headers), "1.0")

    async def _probe(self) -> ProbeResult:
        upstream = self.upstream
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    upstream.host, upstream.port, ssl=upstream.ssl_context,
                    server_hostname=upstream.host if upstream.ssl_context else None)
                writer.write(self._connect_frame())
                await writer.drain()
                data = await reader.readuntil(b"\x00")
            answer = _first_frame(data)
            if answer is None:
                return ProbeResult(False, "broker answered CONNECT with a malformed frame",
                                   time.monotonic())
            if answer.command == "CONNECTED":
                writer.write(encode(Frame("DISCONNECT"), "1.0"))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.drain(), 0.5)
                return ProbeResult(True, "CONNECTED", time.monotonic())
            # An ERROR: the broker answers, it refused the probe's login.
            message = answer.get("message") or ""
            return ProbeResult(True, "ERROR: " + message[:200], time.monotonic())
        except TimeoutError:
            return ProbeResult(False, f"broker did not answer CONNECT within "
                                      f"{self.timeout:g} s", time.monotonic())
        except asyncio.IncompleteReadError:
            return ProbeResult(False, "broker closed the connection without answering "
                                      "CONNECT", time.monotonic())
        except asyncio.LimitOverrunError:
            return ProbeResult(False, "broker answered CONNECT with an oversized frame",
                               time.monotonic())
        except OSError as exc:
            # The error's name and number only: its text may quote the address.
            name = type(exc).__name__ + (f" [errno {exc.errno}]" if exc.errno else "")
            return ProbeResult(False, f"broker unreachable: {name}", time.monotonic())
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 0.5)


def _first_frame(data: bytes) -> Frame | None:
    """The broker's answer to CONNECT (CONNECTED or ERROR), decoded by the project's
    codec; None when it is anything else or malformed."""
    decoder = FrameDecoder(commands=SERVER_COMMANDS - {"MESSAGE", "RECEIPT"}, version="1.0",
                           keep_wire=False)
    try:
        items = decoder.feed(data)
    except FrameError:
        return None
    return next((item for item in items if isinstance(item, Frame)), None)
