"""FrameConnection: one leg of a proxy session, over real loopback sockets.

Queued frames before the relay, frames handled inside the read callback after it,
the end of a connection (EOF, reset, malformed frame) reported once and after the
valid frames, half-close, and flow control between the two legs.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mqguard.sidecar.connection import MAX_QUEUED, FrameConnection, without_padding
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
)
from mqguard.sidecar.metrics import Count

Test = Callable[[FrameConnection, socket.socket], Awaitable[None]]
Runs = Callable[[Test], None]


def _connection() -> FrameConnection:
    decoder = FrameDecoder(limits=FrameLimits(max_frame_bytes=4096), commands=CLIENT_COMMANDS)
    return FrameConnection(decoder, Count())


async def _accepted(test: Test) -> None:
    """Run ``test`` with the sidecar's side of a connection and a blocking client socket."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[FrameConnection] = loop.create_future()

    def factory() -> FrameConnection:
        connection = _connection()
        connection._on_made = made.set_result  # the server hands it over once made
        return connection

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(False)
    try:
        connection = await asyncio.wait_for(made, 5)
        await test(connection, client)
    finally:
        client.close()
        server.close()
        await server.wait_closed()


@pytest.fixture(params=["asyncio", "uvloop"])
def on_loop(request: pytest.FixtureRequest) -> Callable[[Awaitable[None]], None]:
    """Runs a coroutine on each event loop the sidecar runs on (the same code on both)."""
    factory = loop_factory(request.param)

    def run(coroutine: Awaitable[None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(coroutine)  # type: ignore[arg-type]

    return run


@pytest.fixture
def run(on_loop: Callable[[Awaitable[None]], None]) -> Runs:
    return lambda test: on_loop(_accepted(test))


async def _until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Recorder:
    def __init__(self) -> None:
        self.reads: list[list[Any]] = []
        self.ends: list[tuple[str, BaseException | None]] = []

    def on_items(self, items: list[Any]) -> None:
        self.reads.append(items)

    def on_end(self, kind: str, exc: BaseException | None) -> None:
        self.ends.append((kind, exc))

    def commands(self) -> list[str]:
        return [item.command if isinstance(item, Frame) else "HB"
                for read in self.reads for item in read]


def test_frames_pipelined_before_the_relay_are_handed_over_first_in_order(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        client.send(b"CONNECT\naccept-version:1.2\n\n\0SEND\ndestination:/q/a\n\none\0"
                    b"SEND\ndestination:/q/a\n\ntwo\0")
        first = await asyncio.wait_for(connection.next(), 5)
        assert isinstance(first, Frame) and first.command == "CONNECT"
        recorder = Recorder()
        connection.relay(recorder.on_items, recorder.on_end)
        assert [f.body for f in recorder.reads[0]] == [b"one", b"two"]
        client.send(b"SEND\ndestination:/q/a\n\nthree\0")
        await _until(lambda: len(recorder.reads) == 2, "the next read")
        assert recorder.reads[1][0].body == b"three"
        assert recorder.ends == []
        assert connection._counter.value > 0

    run(test)


def test_valid_frames_before_a_malformed_one_come_first_then_one_end(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        recorder = Recorder()
        connection.relay(recorder.on_items, recorder.on_end)
        client.send(b"SEND\ndestination:/q/a\n\nok\0BOGUS\n\n\0SEND\ndestination:/q/a\n\nx\0")
        await _until(lambda: bool(recorder.ends), "the end")
        assert recorder.commands() == ["SEND"]
        ((kind, exc),) = recorder.ends
        assert kind == "malformed" and isinstance(exc, FrameError)
        client.send(b"SEND\ndestination:/q/a\n\nlater\0")
        await asyncio.sleep(0.05)
        assert recorder.commands() == ["SEND"] and len(recorder.ends) == 1

    run(test)


def test_a_malformed_frame_before_the_relay_is_raised_after_the_valid_ones(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        client.send(b"CONNECT\n\n\0\x01\x02garbage\n\n\0")
        first = await asyncio.wait_for(connection.next(), 5)
        assert isinstance(first, Frame) and first.command == "CONNECT"
        with pytest.raises(FrameError):
            await asyncio.wait_for(connection.next(), 5)

    run(test)


def test_end_of_stream_after_a_half_close_leaves_the_connection_writable(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        recorder = Recorder()
        connection.relay(recorder.on_items, recorder.on_end)
        client.send(b"SEND\ndestination:/q/a\nreceipt:r1\n\nlast\0")
        client.shutdown(socket.SHUT_WR)
        await _until(lambda: bool(recorder.ends), "the end of stream")
        assert recorder.commands() == ["SEND"] and recorder.ends == [("eof", None)]
        # The client still reads what the sidecar answers after its half-close.
        connection.write(b"RECEIPT\nreceipt-id:r1\n\n\0")
        loop = asyncio.get_running_loop()
        answer = await asyncio.wait_for(loop.sock_recv(client, 100), 5)
        assert answer == b"RECEIPT\nreceipt-id:r1\n\n\0"

    run(test)


def test_an_end_before_the_relay_is_reported_after_the_queued_frames(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        client.send(b"CONNECT\n\n\0DISCONNECT\n\n\0")
        client.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(connection.next(), 5)
        await asyncio.sleep(0.05)  # the end of stream arrives while nobody relays
        recorder = Recorder()
        connection.relay(recorder.on_items, recorder.on_end)
        assert recorder.commands() == ["DISCONNECT"] and recorder.ends == [("eof", None)]
        assert await connection.next() is None

    run(test)


def test_stop_reading_hands_on_nothing_more(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        recorder = Recorder()
        connection.relay(recorder.on_items, recorder.on_end)
        connection.stop_reading()
        client.send(b"SEND\ndestination:/q/a\n\nignored\0")
        client.close()
        await asyncio.sleep(0.1)
        assert recorder.reads == [] and recorder.ends == []

    run(test)


def test_a_flood_before_the_relay_pauses_reading_until_taken(run: Runs) -> None:
    async def test(connection: FrameConnection, client: socket.socket) -> None:
        frames = b"SEND\ndestination:/q/a\n\nx\0" * (MAX_QUEUED + 200)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, frames)
        await _until(lambda: len(connection._ready) >= MAX_QUEUED, "the queue to fill")
        assert connection.transport is not None
        assert not connection.transport.is_reading()
        taken = 0
        while taken < MAX_QUEUED + 200:
            await asyncio.wait_for(connection.next(), 5)
            taken += 1
        assert connection.transport.is_reading()

    run(test)


def test_a_peer_that_stops_reading_pauses_the_other_leg(
        on_loop: Callable[[Awaitable[None]], None]) -> None:
    async def both() -> None:
        loop = asyncio.get_running_loop()
        made: asyncio.Queue[FrameConnection] = asyncio.Queue()

        def factory() -> FrameConnection:
            connection = _connection()
            connection._on_made = made.put_nowait
            return connection

        server = await loop.create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        slow = socket.create_connection(("127.0.0.1", port))
        other = socket.create_connection(("127.0.0.1", port))
        try:
            first = await asyncio.wait_for(made.get(), 5)
            second = await asyncio.wait_for(made.get(), 5)
            peer = first.get_extra_info("peername")
            assert isinstance(peer, tuple)
            # The sidecar's side of the slow client's connection, and of the other one.
            writes_to, reads_from = ((first, second) if peer[1] == slow.getsockname()[1]
                                     else (second, first))
            writes_to.couple(reads_from)
            assert reads_from.transport is not None
            chunk = b"x" * 65536
            while writes_to.write_buffer_size() <= 1 << 20:
                writes_to.write(chunk)
                await asyncio.sleep(0)
            await _until(lambda: not reads_from.transport.is_reading(),  # type: ignore[union-attr]
                         "the other leg to pause")
            slow.setblocking(False)
            drained = 0

            def drain() -> bool:
                nonlocal drained
                try:
                    while True:
                        got = slow.recv(1 << 20)
                        if not got:
                            return True
                        drained += len(got)
                except BlockingIOError:
                    pass
                return writes_to.write_buffer_size() == 0

            await _until(drain, "the slow peer to read everything", timeout=20)
            assert drained > 1 << 20
            await _until(lambda: reads_from.transport.is_reading(),  # type: ignore[union-attr]
                         "the other leg to resume")
        finally:
            slow.close()
            other.close()
            server.close()
            await server.wait_closed()

    on_loop(both())


def test_without_padding_keeps_leading_heartbeats_only() -> None:
    frame = Frame("MESSAGE", [("destination", "/q/a")], b"")
    assert without_padding([HEARTBEAT, HEARTBEAT, frame, HEARTBEAT, frame, HEARTBEAT]) == [
        HEARTBEAT, HEARTBEAT, frame, frame]
    assert without_padding([HEARTBEAT]) == [HEARTBEAT]
    assert without_padding([]) == []
