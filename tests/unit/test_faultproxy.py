"""FaultProxy against a tiny in-process echo server: no broker needed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress

import pytest

from mqguard.demo.faultproxy import FaultProxy

TIMEOUT = 2.0


class EchoServer:
    """Echoes every byte back; counts what it received and its live connections."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        # Polling accept is fine for a test helper: it only bounds stop() latency.
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.received = bytearray()
        self.lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def live(self) -> int:
        with self.lock:
            return len(self.conns)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            with self.lock:
                self.conns.add(conn)
                self.threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                with self.lock:
                    self.received += data
                conn.sendall(data)
        except OSError:
            pass
        finally:
            with self.lock:
                self.conns.discard(conn)
            conn.close()

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            for conn in self.conns:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            threads = list(self.threads)
        for thread in threads:
            thread.join(TIMEOUT)
        self.listener.close()


def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def assert_closed(sock: socket.socket) -> None:
    """The peer closed ``sock``: EOF or a reset, not a timeout."""
    with suppress(ConnectionResetError):
        assert sock.recv(1024) == b""


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    before = {t for t in threading.enumerate() if t.name.startswith("faultproxy")}
    with FaultProxy("127.0.0.1", echo.port) as p:
        yield p
    leaked = {t for t in threading.enumerate() if t.name.startswith("faultproxy")} - before
    assert not leaked, f"threads left running: {leaked}"


@pytest.fixture
def connect(proxy: FaultProxy) -> Iterator[Callable[[], socket.socket]]:
    opened: list[socket.socket] = []

    def _connect() -> socket.socket:
        sock = socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
        opened.append(sock)
        return sock

    yield _connect
    for sock in opened:
        sock.close()


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return recv_exact(sock, len(payload))


def test_bytes_round_trip(proxy, connect, echo):
    client = connect()
    assert proxy.wait_for_connections(1, TIMEOUT)
    assert roundtrip(client, b"hello") == b"hello"
    big = bytes(range(256)) * 1024  # 256 KiB: several 64 KiB reads each way
    assert roundtrip(client, big) == big
    assert proxy.connections == 1
    assert proxy.accepted == 1
    assert proxy.url_for("stomp") == f"stomp://127.0.0.1:{proxy.port}"
    assert proxy.host == "127.0.0.1"


def test_client_close_closes_upstream(proxy, connect, echo):
    client = connect()
    assert roundtrip(client, b"x") == b"x"
    client.close()
    assert wait_until(lambda: proxy.connections == 0 and echo.live == 0)


def test_cut_resets_both_sides_and_allows_reconnect(proxy, connect, echo):
    first, second = connect(), connect()
    assert proxy.wait_for_connections(2, TIMEOUT)
    assert roundtrip(first, b"a") == b"a"
    assert proxy.cut() == 2
    assert_closed(first)
    assert_closed(second)
    assert wait_until(lambda: proxy.connections == 0 and echo.live == 0)
    assert proxy.cut() == 0
    again = connect()
    assert proxy.wait_for_connections(1, TIMEOUT)
    assert roundtrip(again, b"after cut") == b"after cut"
    assert proxy.accepted == 3


def test_blackhole_upstream_swallows_client_bytes(proxy, connect, echo):
    client = connect()
    assert roundtrip(client, b"ping") == b"ping"
    proxy.blackhole("upstream")
    client.sendall(b"ACK-frame")
    assert wait_until(lambda: proxy.discarded_upstream == len(b"ACK-frame"))
    client.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.recv(1024)
    assert bytes(echo.received) == b"ping"
    assert proxy.connections == 1  # the connection itself stays up

    proxy.restore()
    client.settimeout(TIMEOUT)
    assert roundtrip(client, b"back") == b"back"
    assert bytes(echo.received) == b"pingback"
    assert proxy.discarded_downstream == 0


def test_blackhole_downstream_swallows_broker_bytes(proxy, connect, echo):
    client = connect()
    proxy.wait_for_connections(1, TIMEOUT)
    proxy.blackhole("downstream")
    client.sendall(b"lost echo")
    assert wait_until(lambda: proxy.discarded_downstream == len(b"lost echo"))
    assert bytes(echo.received) == b"lost echo"
    client.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.recv(1024)

    proxy.restore()
    client.settimeout(TIMEOUT)
    assert roundtrip(client, b"seen") == b"seen"
    assert proxy.discarded_upstream == 0


def test_blackhole_both_and_bad_direction(proxy, connect, echo):
    client = connect()
    proxy.blackhole("both")
    client.sendall(b"nothing")
    assert wait_until(lambda: proxy.discarded_upstream == 7)
    assert proxy.discarded_downstream == 0
    assert bytes(echo.received) == b""
    with pytest.raises(ValueError):
        proxy.blackhole("sideways")  # type: ignore[arg-type]
    proxy.restore()
    assert roundtrip(client, b"ok") == b"ok"


def test_refuse_closes_new_connections_only(proxy, connect, echo):
    existing = connect()
    assert proxy.wait_for_connections(1, TIMEOUT)
    proxy.refuse(True)
    # The reset can beat connect()'s own completion check on loopback.
    with suppress(ConnectionResetError):
        assert_closed(connect())
    assert wait_until(lambda: proxy.refused == 1)
    assert roundtrip(existing, b"still here") == b"still here"
    assert proxy.connections == 1
    assert echo.live == 1  # a refused client never reaches the server

    proxy.refuse(False)
    fresh = connect()
    assert proxy.wait_for_connections(2, TIMEOUT)
    assert roundtrip(fresh, b"welcome back") == b"welcome back"
    assert proxy.accepted == 3


def test_stop_is_fast_with_live_connections(echo):
    proxy = FaultProxy("127.0.0.1", echo.port).start()
    clients = [
        socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT) for _ in range(3)
    ]
    try:
        assert proxy.wait_for_connections(3, TIMEOUT)
        proxy.blackhole("upstream")
        clients[0].sendall(b"in flight")
        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < 3.0
        for client in clients:
            assert_closed(client)
        assert proxy.connections == 0
        assert not [t for t in threading.enumerate() if t.name.startswith("faultproxy")]
        proxy.stop()  # idempotent
        with pytest.raises(OSError):
            socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT)
    finally:
        for client in clients:
            client.close()


def test_wait_for_connections(proxy, connect):
    assert proxy.wait_for_connections(0, 0.0)
    started = time.monotonic()
    assert not proxy.wait_for_connections(1, 0.2)
    assert time.monotonic() - started < 1.0

    # A client connecting while we wait wakes the waiter.
    timer = threading.Timer(0.1, connect)
    timer.start()
    assert proxy.wait_for_connections(1, TIMEOUT)
    timer.join()


def test_upstream_down_closes_client():
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with FaultProxy("127.0.0.1", dead_port) as proxy:
        with socket.create_connection((proxy.host, proxy.port), timeout=TIMEOUT) as client:
            assert_closed(client)
        assert proxy.accepted == 1
        assert proxy.connections == 0


def test_not_started():
    proxy = FaultProxy("127.0.0.1", 1)
    with pytest.raises(RuntimeError):
        _ = proxy.port
    proxy.stop()  # harmless
