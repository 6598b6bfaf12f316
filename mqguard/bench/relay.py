"""A do-nothing TCP relay: what one more hop costs, without any of the sidecar's work.

``mqguard bench proxy --baselines`` runs it as a process of its own, in the same rounds
as the direct path and the sidecar, so that the sidecar's overhead splits into the hop
itself (this relay: the octets copied between two sockets by the event loop, nothing
decoded) and the sidecar's own processing. It is a measuring instrument, not a
product: no TLS, no limits beyond back-pressure, no logging.

Run: ``python -m mqguard.bench.relay --upstream HOST:PORT [--listen HOST:PORT]
[--event-loop auto|uvloop|asyncio]``; it prints ``relay listening on HOST:PORT`` once it
accepts connections and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from typing import cast

from mqguard.errors import MqguardError
from mqguard.sidecar.eventloop import LOOP_KINDS, loop_factory
from mqguard.sidecar.server import parse_hostport

#: What the relay prints once it listens (``mqguard bench proxy`` waits for this line).
READY_MARKER = "relay listening on "


class _Leg(asyncio.Protocol):
    """One side of a relayed connection; what it reads goes to its peer, as it is."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Leg | None = None
        #: Read before the peer was connected (the client's CONNECT, usually).
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: cast, no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                # Relayed frames leave at once, as the sidecar's do.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
            if self.transport is not None:
                self.transport.pause_reading()  # no more until the peer is there
            return
        peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self.peer.transport.write_eof()
        return True  # keep writing what the peer still sends

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # A peer that does not read holds this side back (a bounded write buffer).
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def flush_early(self) -> None:
        """The peer is connected: hand it what was read before, and read on."""
        assert self.peer is not None and self.peer.transport is not None
        for data in self.early:
            self.peer.transport.write(data)
        self.early.clear()
        if self.transport is not None:
            self.transport.resume_reading()


class _ClientLeg(_Leg):
    """An accepted connection: connects its upstream leg once it is made."""

    def __init__(self, upstream: tuple[str, int], tasks: set[asyncio.Task[None]]) -> None:
        super().__init__()
        self._upstream = upstream
        self._tasks = tasks  # strong references: a pending task must not be collected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        task = asyncio.get_running_loop().create_task(self._connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        upstream = _Leg()
        try:
            await asyncio.get_running_loop().create_connection(lambda: upstream,
                                                               *self._upstream)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is None or self.transport.is_closing():
            # The client left while this connected: nobody to relay for.
            if upstream.transport is not None:
                upstream.transport.close()
            return
        upstream.peer, self.peer = self, upstream
        self.flush_early()
        upstream.flush_early()


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    """Relay every connection to ``listen`` to ``upstream`` until SIGTERM / SIGINT."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    server = await loop.create_server(lambda: _ClientLeg(upstream, tasks), *listen)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"{READY_MARKER}{host}:{port}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqguard.bench.relay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT to relay to")
    parser.add_argument("--listen", default="127.0.0.1:0",
                        help="HOST:PORT to accept on (port 0: any free port)")
    parser.add_argument("--event-loop", choices=LOOP_KINDS, default="auto")
    args = parser.parse_args(argv)
    try:
        listen = parse_hostport(args.listen, "--listen")
        upstream = parse_hostport(args.upstream, "--upstream")
        factory = loop_factory(args.event_loop)
    except MqguardError as exc:
        parser.error(str(exc))
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(listen, upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
