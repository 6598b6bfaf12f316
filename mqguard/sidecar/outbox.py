"""Coalesced writes to one peer of a proxy session.

A read from one side often carries many frames (a pipelining producer, a broker
pushing a prefetch window), and each becomes a frame on the other side plus, for a
SEND, nothing back until the broker's RECEIPT. Written one by one, every frame is its
own ``send()`` system call and TCP segment: profiling ``bench proxy`` put a third to a
half of the sidecar's CPU in ``socket.send``. The outbox gathers what one turn of the
event loop writes to a peer and hands it to the transport once, when the turn ends
(``call_soon`` runs after the frames of the current read are handled, because the
pump does not yield to the loop until it waits for the next read), so nothing waits
longer than that turn and the order of frames is kept.
"""

from __future__ import annotations

import asyncio

#: Pending bytes above which a writer flushes before the end of the turn (so that a
#: huge batch reaches the transport's own back-pressure instead of piling up here).
FLUSH_AT = 256 * 1024


class Outbox:
    """Buffers writes to one ``StreamWriter`` until the end of the loop's turn."""

    __slots__ = ("_chunks", "_loop", "_pending", "_scheduled", "_writer")

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self._writer = writer
        self._loop = loop
        self._chunks: list[bytes] = []
        self._pending = 0
        self._scheduled = False

    @property
    def writer(self) -> asyncio.StreamWriter:
        return self._writer

    @property
    def pending(self) -> int:
        """Bytes written here and not yet handed to the transport."""
        return self._pending

    def write(self, data: bytes) -> None:
        self._chunks.append(data)
        self._pending += len(data)
        if self._pending >= FLUSH_AT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_scheduled)

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
        self._writer.write(data)

    def buffered(self) -> int:
        """Bytes not yet on the wire: pending here plus the transport's buffer."""
        return self._pending + self._writer.transport.get_write_buffer_size()
