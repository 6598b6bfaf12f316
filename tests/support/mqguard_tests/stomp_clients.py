"""STOMP clients for sidecar tests: a healthy stomp.py client and a raw-socket one."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import stomp  # type: ignore[import-untyped]

from mqguard.sidecar.frames import SERVER_COMMANDS, Frame, FrameDecoder
from mqguard.testing.waiting import wait_for


class HealthyClient(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py 1.2 client that keeps sending to its own queue (each SEND with a receipt)
    and consuming it, until :meth:`finish` checks that nothing it was promised got lost."""

    def __init__(self, port: int, queue: str, interval: float = 0.01) -> None:
        self.queue = queue
        self.interval = interval
        self.lock = threading.Lock()
        self.sent: list[str] = []
        self.receipts: list[str] = []
        self.received: list[str] = []
        self.errors: list[Any] = []
        self.disconnected = False
        self._stop = threading.Event()
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/",
                                       heartbeats=(0, 0))
        self.conn.set_listener("healthy", self)
        self.conn.connect("guest", "guest", wait=True)
        self.conn.subscribe(queue, id="healthy", ack="auto")
        self._thread = threading.Thread(target=self._send_loop, name="healthy-client",
                                        daemon=True)
        self._thread.start()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.received.append(frame.body)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.append(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_disconnected(self) -> None:
        self.disconnected = True

    def _send_loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            body = f"m-{n}"
            with self.lock:
                self.sent.append(body)
            self.conn.send(self.queue, body, receipt=f"r-{n}")
            n += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def finish(self, timeout: float = 15.0) -> None:
        """Stop sending; every receipted message must arrive, at least once and in order."""
        self.stop()
        assert not self.errors, f"the healthy client got ERROR frames: {self.errors}"
        assert not self.disconnected, "the healthy client was disconnected"
        with self.lock:
            sent = list(self.sent)
        assert len(sent) > 20, f"the healthy client sent only {len(sent)} messages"
        wait_for(lambda: len(self.receipts) == len(sent), timeout, "the healthy receipts")
        assert self.receipts == [f"r-{i}" for i in range(len(sent))], "receipts out of order"
        wait_for(lambda: set(sent) <= set(self.received), timeout,
                 "every receipted message at the healthy consumer")
        with self.lock:
            firsts = list(dict.fromkeys(self.received))
        assert firsts == sent, "the healthy consumer got its messages out of order"
        assert not self.errors, f"the healthy client got ERROR frames: {self.errors}"
        self.conn.disconnect()


class RecordingClient(stomp.ConnectionListener):  # type: ignore[misc]
    """A stock stomp.py 1.2 client that records what it gets: messages, receipt ids,
    ERROR frames. ``disconnect_receipt``: the receipt its DISCONNECT asks for (None: none)."""

    def __init__(self, port: int, *, disconnect_receipt: str | None = None) -> None:
        self.lock = threading.Lock()
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.disconnect_receipt = disconnect_receipt
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.messages.append(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.append(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def bodies(self) -> list[str]:
        with self.lock:
            return [frame.body for frame in self.messages]

    def close(self) -> None:
        if self.conn.is_connected():
            if self.disconnect_receipt is None:
                self.conn.disconnect()
            else:
                self.conn.disconnect(receipt=self.disconnect_receipt)


def healthy_round_trip(port: int, queue: str) -> None:
    """A fresh connection: SEND with a receipt, get it back, DISCONNECT with a receipt."""
    raw = RawClient(port)
    try:
        raw.connect()
        raw.send(f"SUBSCRIBE\nid:rt\ndestination:{queue}\nack:auto\n\n\0".encode())
        raw.send(f"SEND\ndestination:{queue}\nreceipt:rt-1\n\nround trip\0".encode())
        frames = raw.read_frames(lambda got: any(f.command == "MESSAGE" for f in got)
                                 and any(f.get("receipt-id") == "rt-1" for f in got))
        assert [f.body for f in frames if f.command == "MESSAGE"] == [b"round trip"]
        raw.send(b"DISCONNECT\nreceipt:bye\n\n\0")
        frames = raw.read_frames(lambda got: any(f.get("receipt-id") == "bye" for f in got))
        assert [f.command for f in frames] == ["RECEIPT"], frames
    finally:
        raw.close()


def connect_frame(version: str | None = "1.2") -> bytes:
    accept = f"accept-version:{version}\n" if version else ""
    return f"CONNECT\n{accept}host:/\nlogin:guest\npasscode:guest\n\n\0".encode()


def decode_server_bytes(data: bytes) -> tuple[list[Frame], int]:
    """The frames the sidecar wrote, each decoded for the version CONNECTED negotiated, and
    the octets of a frame left incomplete at the end. FrameError if anything is malformed."""
    decoder = FrameDecoder(commands=SERVER_COMMANDS, version="1.0")
    frames = [item for item in decoder.feed(data) if isinstance(item, Frame)]
    if frames and frames[0].command == "CONNECTED":
        version = frames[0].get("version") or "1.0"
        decoder = FrameDecoder(commands=SERVER_COMMANDS, version=version)
        rest = data[data.index(b"\0") + 1:]
        frames = [frames[0]] + [item for item in decoder.feed(rest) if isinstance(item, Frame)]
    return frames, decoder.buffered


class RawClient:
    """A STOMP client made of a bare socket."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.data = b""
        self.closed = False
        self.reset = False

    def send(self, data: bytes) -> bool:
        """False if the sidecar had closed the connection already."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def connect(self, version: str | None = "1.2") -> Frame:
        self.send(connect_frame(version))
        frames = self.read_frames(lambda got: bool(got))
        assert frames and frames[0].command == "CONNECTED", frames
        return frames[0]

    def read(self, until: Callable[[], bool], timeout: float) -> None:
        """Read until ``until()``, the sidecar closes the connection, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.closed and not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(min(left, 0.2))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                self.closed = self.reset = True
                return
            if not chunk:
                self.closed = True
                return
            self.data += chunk

    def frames(self) -> list[Frame]:
        return decode_server_bytes(self.data)[0]

    def read_frames(self, until: Callable[[list[Frame]], bool],
                    timeout: float = 10.0) -> list[Frame]:
        """Frames read since the last call, once ``until(frames)`` holds."""
        start = len(self.frames())
        self.read(lambda: until(self.frames()[start:]), timeout)
        got = self.frames()[start:]
        assert until(got), f"timed out; got {got}, closed={self.closed}"
        return got

    def read_to_close(self, timeout: float = 5.0) -> None:
        self.read(lambda: False, timeout)

    def close(self, *, reset: bool = False) -> None:
        if reset:  # an RST, not a FIN: the client vanishes
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     b"\x01\x00\x00\x00\x00\x00\x00\x00")
        with contextlib.suppress(OSError):
            self.sock.close()
