"""The handshake budget of a client connection, and the descriptor budget, in isolation.

Over real loopback sockets, on both event loops: before the relay starts, the peer's
first frame may take ``handshake_bytes`` octets at most (counted while it arrives, and
checked again once it is decoded); once it is complete the connection reads nothing
more until the relay starts, then hands over what was pipelined behind it.
:func:`descriptor_budget` raises the soft limit on open files and counts the sessions
it leaves room for.
"""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import Awaitable, Callable

import pytest

from mqguard.sidecar.connection import FrameConnection, Items
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.fdlimit import FDS_PER_SESSION, RESERVED_FDS, descriptor_budget
from mqguard.sidecar.frames import CLIENT_COMMANDS, Frame, FrameDecoder, FrameError
from mqguard.sidecar.metrics import Count

LIMIT = 2048

Test = Callable[[FrameConnection, socket.socket, list[str]], Awaitable[None]]


async def _accepted(test: Test) -> None:
    loop = asyncio.get_running_loop()
    made: asyncio.Future[FrameConnection] = loop.create_future()
    events: list[str] = []

    def factory() -> FrameConnection:
        decoder = FrameDecoder(commands=CLIENT_COMMANDS)  # max-frame-bytes: 16 MiB
        connection = FrameConnection(decoder, Count(), on_made=made.set_result,
                                     handshake_bytes=LIMIT)
        connection.on_first_frame = lambda: events.append("first frame")
        return connection

    server = await loop.create_server(factory, "127.0.0.1", 0)
    client = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
    client.setblocking(False)
    try:
        await test(await asyncio.wait_for(made, 5), client, events)
    finally:
        client.close()
        server.close()
        await server.wait_closed()


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Test], None]:
    factory = loop_factory(request.param)

    def run(test: Test) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_accepted(test))

    return run


async def _send(client: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(client, data)


def test_an_unfinished_first_frame_is_cut_at_the_budget(run: Callable[[Test], None]) -> None:
    async def test(connection: FrameConnection, client: socket.socket,
                   events: list[str]) -> None:
        await _send(client, b"CONNECT\ncontent-length:100000\n\n")
        for _ in range(10):
            await _send(client, b"x" * 500)
            await asyncio.sleep(0.01)
        with pytest.raises(FrameError, match="frame too large") as raised:
            await asyncio.wait_for(connection.next(), 5)
        assert "max-handshake-frame-bytes" in raised.value.detail
        assert connection.decoder.buffered <= LIMIT + 1000
        assert events == []

    run(test)


def test_a_first_frame_over_the_budget_in_one_read_is_refused(
        run: Callable[[Test], None]) -> None:
    async def test(connection: FrameConnection, client: socket.socket,
                   events: list[str]) -> None:
        await _send(client, b"CONNECT\nx-pad:" + b"p" * 3000 + b"\n\n\0")
        with pytest.raises(FrameError, match="frame too large"):
            await asyncio.wait_for(connection.next(), 5)
        assert events == []

    run(test)


def test_reading_waits_after_the_first_frame_until_the_relay(
        run: Callable[[Test], None]) -> None:
    async def test(connection: FrameConnection, client: socket.socket,
                   events: list[str]) -> None:
        await _send(client, b"\nCONNECT\naccept-version:1.2\n\n\0")
        first = None
        while not isinstance(first, Frame):
            first = await asyncio.wait_for(connection.next(), 5)
        assert first.command == "CONNECT" and events == ["first frame"]
        # Pipelined behind it, bigger than the handshake budget: not read yet.
        await _send(client, b"SEND\ndestination:/queue/a\n\n" + b"b" * (4 * LIMIT) + b"\0")
        await asyncio.sleep(0.2)
        assert connection.decoder.buffered == 0
        got: Items = []
        connection.relay(got.extend, lambda kind, exc: None)
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.02)
        sends = [item for item in got if isinstance(item, Frame)]
        assert [f.command for f in sends] == ["SEND"] and len(sends[0].body) == 4 * LIMIT
        assert events == ["first frame"]

    run(test)


def test_release_drops_what_was_read(run: Callable[[Test], None]) -> None:
    async def test(connection: FrameConnection, client: socket.socket,
                   events: list[str]) -> None:
        await _send(client, b"CONNECT\n\n\0")
        await asyncio.wait_for(connection.next(), 5)
        connection.relay(lambda items: None, lambda kind, exc: None)
        await _send(client, b"SEND\ndestination:/queue/a\n\n" + b"c" * 10_000)
        await asyncio.sleep(0.2)
        assert connection.decoder.buffered > 10_000
        connection.stop_reading()
        connection.release()
        assert connection.decoder.buffered == 0
        assert connection._on_items is None and connection.on_first_frame is None

    run(test)


def test_descriptor_budget_raises_the_soft_limit_and_counts_sessions() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    if hard != resource.RLIM_INFINITY:
        assert hard > low, "this test needs a hard limit above 256"
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        budget = descriptor_budget(100_000)
        assert budget.raised_from == low
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == budget.soft > low
        assert budget.soft is not None
        room = (budget.soft - budget.in_use - RESERVED_FDS) // FDS_PER_SESSION
        assert budget.max_sessions == min(100_000, room)
        assert budget.shortfall(100_000) == (room < 100_000)
        assert descriptor_budget(10).max_sessions == 10
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
