"""Coalesced writes to one peer of a proxy session.

A read from one side often carries many frames (a pipelining producer, a broker
pushing a prefetch window), and each becomes a frame on the other side plus, for a
SEND, nothing back until the broker's RECEIPT. Written one by one, every frame is its
own ``send()`` system call and TCP segment: profiling ``bench proxy`` put a third to a
half of the sidecar's CPU in ``socket.send``. The outbox gathers what is written to a
peer and hands it to the transport once: the session holds both outboxes while it
handles the frames of one read and releases them at its end (:meth:`Outbox.hold`), so
the writes of a read leave before the loop polls again; a write outside such a read
(a timer, another connection's read) is handed over when the loop's turn ends
(``call_soon``). Either way the order of frames is kept.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Peer(Protocol):
    """Where an outbox writes: a :class:`~mqguard.sidecar.connection.FrameConnection`."""

    def write(self, data: bytes) -> None: ...


#: Pending bytes above which a writer flushes before the end of the turn (so that a
#: huge batch reaches the transport's own back-pressure instead of piling up here).
FLUSH_AT = 256 * 1024


class Outbox:
    """Buffers writes to one peer until the read being handled ends, or the loop's turn."""

    __slots__ = ("_chunks", "_held", "_loop", "_peer", "_pending", "_scheduled")

    def __init__(self, peer: Peer, loop: asyncio.AbstractEventLoop) -> None:
        self._peer = peer
        self._loop = loop
        self._chunks: list[bytes] = []
        self._pending = 0
        self._scheduled = False
        self._held = False

    def write(self, data: bytes) -> None:
        self._chunks.append(data)
        self._pending += len(data)
        if self._pending >= FLUSH_AT:
            self.flush()
        elif not self._held and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_scheduled)

    def hold(self) -> None:
        """Keep writes here until :meth:`release` (no end-of-turn callback per read)."""
        self._held = True

    def release(self) -> None:
        """Hand what was held to the transport now."""
        self._held = False
        self.flush()

    def _flush_scheduled(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand everything pending to the transport now, in order."""
        chunks = self._chunks
        if not chunks:
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._pending = 0
        self._peer.write(data)
