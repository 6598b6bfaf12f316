"""The sidecar's native data plane (docs/sidecar.md, "Data plane"), against a real
ActiveMQ: stock stomp.py relaying with receipts and a guarantee, heart-beats, TLS on both
legs (rustls), a malformed frame, back-pressure from a consumer that stops reading, the
connection limit, and the data-plane setting.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
import stomp.exception  # type: ignore[import-untyped]
from mqguard_tests.stomp_clients import RawClient, connect_frame, decode_server_bytes

from mqguard.config import parse_config
from mqguard.errors import ConfigError
from mqguard.servers.handle import ServerHandle
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for


def config(tmp_path: Path, **sidecar: Any) -> Any:
    return parse_config({"mqguard": {"node-id": "native-plane-test",
                                     "message-expiry-scan-period": -1,
                                     "event-log": {"directory": str(tmp_path / "events")},
                                     "sidecar": sidecar}})


@pytest.fixture
def proxy(mqguard_activemq_server: ServerHandle, tmp_path: Path) -> Iterator[SidecarThread]:
    sidecar = Sidecar(config(tmp_path), parse_upstream(mqguard_activemq_server.urls["stomp"]))
    with SidecarThread(sidecar) as running:
        assert running.sidecar.native_sessions is not None
        yield running


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[str] = []
        self.receipts: list[str] = []
        self.errors: list[str] = []
        self.disconnects = 0

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.bodies.append(frame.body)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.append(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", ""))

    def on_disconnected(self) -> None:
        self.disconnects += 1


def stomp_client(port: int, *, heartbeats: tuple[int, int] = (0, 0),
                 ca: Path | None = None) -> tuple[Any, Listener]:
    conn = stomp.Connection12([("127.0.0.1", port)], vhost="/", heartbeats=heartbeats)
    if ca is not None:
        conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(ca))
    listener = Listener()
    conn.set_listener("l", listener)
    conn.connect("guest", "guest", wait=True)
    return conn, listener


@pytest.mark.activemq
def test_stock_client_round_trip_receipts_and_a_rejected_duplicate(
        proxy: SidecarThread, mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    conn, got = stomp_client(proxy.port)
    try:
        conn.subscribe(queue, id="s", ack="auto")
        for i in range(200):
            conn.send(queue, f"m{i}", headers={"_AMQ_DUPL_ID": f"d{i}"}, receipt=f"r{i}")
        conn.send(queue, "again", headers={"_AMQ_DUPL_ID": "d7"}, receipt="dup")
        wait_for(lambda: len(got.receipts) == 201, 20, "a receipt per SEND")
        wait_for(lambda: len(got.bodies) >= 200, 20, "the 200 messages")
        time.sleep(0.3)
        assert got.bodies == [f"m{i}" for i in range(200)]  # in order, the duplicate not routed
        assert got.receipts == [*(f"r{i}" for i in range(200)), "dup"]
    finally:
        conn.disconnect()
    wait_for(lambda: not proxy.sidecar.sessions, 10, "the session to end")
    native = proxy.sidecar.native_sessions
    assert native is not None
    wait_for(lambda: native.plane.leg_count() == 0, 10, "both legs closed")


@pytest.mark.activemq
def test_heart_beats_keep_an_idle_client_connected(proxy: SidecarThread,
                                                   mqguard_unique_name: str) -> None:
    conn, got = stomp_client(proxy.port, heartbeats=(500, 500))
    try:
        time.sleep(3.0)  # six intervals without a frame either way
        assert got.disconnects == 0 and conn.is_connected()
        conn.send(f"/queue/{mqguard_unique_name}", "after idle", receipt="r")
        wait_for(lambda: got.receipts == ["r"], 10, "a receipt after the idle time")
    finally:
        conn.disconnect()


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.activemq
def test_tls_on_both_legs(mqguard_activemq_server: ServerHandle, tmp_path: Path,
                          mqguard_unique_name: str) -> None:
    """client --TLS--> native sidecar A --> broker, and client --> native sidecar B --TLS-->
    A, the CA verified; B with a CA that does not hold A's certificate refuses the leg."""
    cert, key = make_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(cert), str(key))
    queue = f"/queue/{mqguard_unique_name}"
    front = Sidecar(config(tmp_path), parse_upstream(mqguard_activemq_server.urls["stomp"]),
                    tls=server_tls, tls_files=(str(cert), str(key)))
    with SidecarThread(front) as tls_proxy:
        conn, got = stomp_client(tls_proxy.port, ca=cert)
        conn.subscribe(queue, id="s", ack="auto")
        chained = Sidecar(config(tmp_path), parse_upstream(
            f"stomp+ssl://127.0.0.1:{tls_proxy.port}", cafile=str(cert)))
        with SidecarThread(chained) as plain_proxy:
            sender, sent = stomp_client(plain_proxy.port)
            sender.send(queue, "over TLS", receipt="t")
            wait_for(lambda: sent.receipts == ["t"], 10, "the receipt through both sidecars")
            wait_for(lambda: got.bodies == ["over TLS"], 10, "the message over TLS")
            sender.disconnect()
        conn.disconnect()
        (tmp_path / "other").mkdir()
        other, _ = make_certificate(tmp_path / "other")
        untrusted = Sidecar(config(tmp_path), parse_upstream(
            f"stomp+ssl://127.0.0.1:{tls_proxy.port}", cafile=str(other)))
        with SidecarThread(untrusted) as bad_proxy:
            raw = RawClient(bad_proxy.port)
            raw.send(connect_frame())
            raw.read_to_close(timeout=10)
            frames = raw.frames()
            raw.close()
    assert [f.command for f in frames] == ["ERROR"], frames
    assert frames[0].get("message") == "broker unreachable"


@pytest.mark.activemq
def test_malformed_frame_gets_an_error_and_the_session_ends(proxy: SidecarThread) -> None:
    raw = RawClient(proxy.port)
    try:
        raw.connect()
        raw.send(b"SEND\ndestination:/queue/x\ncontent-length:abc\n\nbody\0")
        raw.read_to_close(timeout=10)
        frames = raw.frames()
        assert raw.closed
    finally:
        raw.close()
    assert [f.command for f in frames] == ["CONNECTED", "ERROR"], frames
    assert frames[1].get("message") == "invalid content-length"
    wait_for(lambda: not proxy.sidecar.sessions, 10, "the session to end")


@pytest.mark.activemq
def test_a_consumer_that_stops_reading_holds_the_broker_back(
        proxy: SidecarThread, mqguard_unique_name: str) -> None:
    """6 MB for a consumer that reads nothing: the runtime stops reading the broker leg
    once the client leg's queue is over its high-water mark (1 MiB) instead of taking
    everything in; when the consumer breaks the protocol, its session ends and what was
    queued for it is dropped with the connection (reset), not kept."""
    native = proxy.sidecar.native_sessions
    assert native is not None
    queue = f"/queue/{mqguard_unique_name}"
    body = b"x" * 60_000
    producer = RawClient(proxy.port)
    producer.connect()
    for _ in range(100):
        producer.send(f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode()
                      + body + b"\0")
    producer.send(f"SEND\ndestination:{queue}\nreceipt:all\n\nlast\0".encode())
    producer.read_frames(lambda got: any(f.get("receipt-id") == "all" for f in got), 30)
    producer.close()
    stuck = RawClient(proxy.port)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        stuck.connect()
        stuck.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:client\n\n\0".encode())
        wait_for(lambda: native.plane.queued_total() > 512 * 1024, 20,
                 "messages queued for the stuck consumer")
        time.sleep(1.0)  # had the broker leg gone on reading, the queue would grow to ~6 MB
        held = native.plane.queued_total()
        assert held < 3 * 1024 * 1024, f"{held} bytes queued for a consumer that reads nothing"
        stuck.send(b"BOGUS\n\n\0")
        wait_for(lambda: not proxy.sidecar.sessions, 15, "the stuck session to end")
        wait_for(lambda: native.plane.leg_count() == 0, 10, "its legs closed")
        assert native.plane.queued_total() == 0
    finally:
        stuck.close()
    # Unacknowledged (ack:client), the messages went back to the broker: all there.
    reader = RawClient(proxy.port)
    try:
        reader.connect()
        reader.send(f"SUBSCRIBE\nid:2\ndestination:{queue}\nack:auto\n\n\0".encode())
        received = read_until_last(reader.sock, b"", 60)
    finally:
        reader.close()
    frames, _ = decode_server_bytes(received)
    assert sum(1 for f in frames if f.command == "MESSAGE") == 101


def read_until_last(sock: socket.socket, data: bytes, timeout: float) -> bytes:
    """What ``sock`` delivers until the frame whose body is ``last``, in ``timeout``."""
    got = bytearray(data)
    deadline = time.monotonic() + timeout
    while b"\n\nlast\0" not in got[-64:] and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


@pytest.mark.activemq
def test_over_max_connections_a_client_gets_an_error(
        mqguard_activemq_server: ServerHandle, tmp_path: Path) -> None:
    sidecar = Sidecar(config(tmp_path, **{"max-connections": 1}),
                      parse_upstream(mqguard_activemq_server.urls["stomp"]))
    with SidecarThread(sidecar) as proxy:
        first = RawClient(proxy.port)
        first.connect()
        second = RawClient(proxy.port)
        second.send(connect_frame())
        second.read_to_close(timeout=10)
        first.close()
        second.close()
    frames = second.frames()
    assert [f.command for f in frames] == ["ERROR"], frames
    assert "max-connections = 1" in (frames[0].get("message") or "")


def test_data_plane_setting_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data-plane"):
        config(tmp_path, **{"data-plane": "rust"})
    # The removed python plane is named, with what to do instead.
    with pytest.raises(ConfigError, match=r"python data plane was removed.*set it to"):
        config(tmp_path, **{"data-plane": "python"})
    for name in ("native", "native-session"):
        assert config(tmp_path, **{"data-plane": name}).core.sidecar.data_plane == name
    upstream = parse_upstream("stomp://127.0.0.1:61613")
    # rustls serves TLS from files, not from an ssl.SSLContext.
    with pytest.raises(ConfigError, match="--tls-cert"):
        Sidecar(config(tmp_path), upstream,
                tls=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
