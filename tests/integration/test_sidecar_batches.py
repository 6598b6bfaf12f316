"""SENDs pipelined in one read are decided as one batch by the sidecar, against REAL brokers.

The sidecar decides consecutive SENDs (outside transactions) of one read together: one
``before_send_batch``, i.e. one duplicate-ID reservation per address. These tests write
whole batches in one ``sendall`` from a bare socket, so they arrive in one read, and check
that the batch behaves exactly like SENDs decided one by one: duplicates inside the batch
and against the cache are dropped with their receipts still given in order; a rejected
SEND ends the session with nothing after it forwarded, and the ids the batch reserved for
the SENDs after it are released again (a later send of them is accepted).
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.digest import id_digest
from mqguard.events import read_events
from mqguard.sidecar.frames import SERVER_COMMANDS, Frame, FrameDecoder
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.stores.base import RingOutcome

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]



def session_ended_at_r2(port: int, data: bytes) -> list[Any]:
    """Send ``data`` on a new connection: the first SEND is receipted (r1), the second
    (r2) is answered by an ERROR and the sidecar closes the connection. Returns the frames."""
    wire = Wire(port)
    wire.sock.sendall(data)
    got = wire.until(lambda got: any(f.command == "ERROR" for f in got))
    wire.until(lambda got: False, timeout=2)
    assert wire.closed
    commands = [(f.command, f.get("receipt-id")) for f in wire.frames]
    assert commands[1:] == [("RECEIPT", "r1"), ("ERROR", "r2")], commands
    return got

@pytest.fixture
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SidecarThread]:
    handle = request.getfixturevalue(f"mqguard_{request.param}_server")
    config = parse_config({"mqguard": {
        "node-id": "batch-test",
        "event-log": {"directory": str(tmp_path / "events"), "flush-interval-ms": 20}}})
    with SidecarThread(Sidecar(config, parse_upstream(handle.urls["stomp"]))) as running:
        yield running


class Wire:
    """A STOMP 1.2 client made of a bare socket: whole batches go out in one sendall."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder(commands=SERVER_COMMANDS, version="1.2")
        self.frames: list[Frame] = []
        self.closed = False
        self.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\n"
                          b"passcode:guest\n\n\0")
        connected = self.until(lambda got: bool(got))
        assert connected[0].command == "CONNECTED", connected

    def until(self, done: Any, timeout: float = 10.0) -> list[Frame]:
        """Read until ``done(frames so far)`` or the connection closes; the frames."""
        deadline = time.monotonic() + timeout
        while not done(self.frames) and not self.closed and time.monotonic() < deadline:
            # A read waits no longer than what is left of ``timeout``.
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                self.closed = True
                break
            self.frames.extend(f for f in self.decoder.feed(chunk) if isinstance(f, Frame))
        return self.frames

    def close(self) -> None:
        self.sock.close()


def send(queue: str, body: str, dup: str, receipt: str) -> bytes:
    return (f"SEND\ndestination:/queue/{queue}\n_AMQ_DUPL_ID:{dup}\npersistent:true\n"
            f"receipt:{receipt}\n\n{body}\0").encode()


def drain(port: int, queue: str, expect: int, settle: float = 0.5) -> list[str]:
    """Bodies on ``queue`` (auto-acked through the sidecar), once ``expect`` arrived."""
    wire = Wire(port)
    wire.sock.sendall(f"SUBSCRIBE\nid:d\ndestination:/queue/{queue}\nack:auto\n\n\0".encode())
    wire.until(lambda got: sum(f.command == "MESSAGE" for f in got) >= expect)
    time.sleep(settle)  # anything beyond ``expect`` would show up now
    wire.until(lambda got: False, timeout=0.3)
    wire.close()
    return [f.body.decode() for f in wire.frames if f.command == "MESSAGE"]


def event_types(proxy: SidecarThread, tmp_path: Path) -> Counter[str]:
    proxy.sidecar.guard.events.flush()
    return Counter(e["type"] for e in read_events(tmp_path / "events"))


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_duplicates_inside_one_batch_are_dropped_and_receipted_in_order(
        proxy: SidecarThread, tmp_path: Path, mqguard_unique_name: str) -> None:
    wire = Wire(proxy.port)
    wire.sock.sendall(send(mqguard_unique_name, "seed", "seen", "r-seed"))
    wire.until(lambda got: any(f.get("receipt-id") == "r-seed" for f in got))
    dups = ["a", "b", "a", "seen", "c", "b", "d"]
    wire.sock.sendall(b"".join(send(mqguard_unique_name, f"{dup}-{i}", dup, f"r{i}")
                               for i, dup in enumerate(dups)))
    got = wire.until(lambda got: sum(f.command == "RECEIPT" for f in got) == len(dups) + 1)
    wire.close()
    assert [f.get("receipt-id") for f in got if f.command == "RECEIPT"] == (
        ["r-seed"] + [f"r{i}" for i in range(len(dups))])
    assert not [f for f in got if f.command == "ERROR"]
    assert drain(proxy.port, mqguard_unique_name, 5) == ["seed", "a-0", "b-1", "c-4", "d-6"]
    totals = event_types(proxy, tmp_path)
    assert totals["duplicate_rejected"] == 3
    assert totals["sent"] == 5 and totals["delivered"] == 5


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_a_send_rejected_by_before_send_ends_the_batch_and_the_session(
        proxy: SidecarThread, tmp_path: Path, mqguard_unique_name: str) -> None:
    """An over-long duplicate id is refused by before_send itself: nothing after it is
    decided, so the id of the SEND behind it was never reserved."""
    wire = Wire(proxy.port)
    too_long = "x" * 5000  # over the plugin's 4096, under the header-line limit
    wire.sock.sendall(send(mqguard_unique_name, "one", "id-1", "r1")
                      + send(mqguard_unique_name, "two", "id-2", "r2")
                      + send(mqguard_unique_name, "bad", too_long, "r3")
                      + send(mqguard_unique_name, "after", "id-4", "r4"))
    got = wire.until(lambda got: any(f.command == "ERROR" for f in got))
    wire.until(lambda got: False, timeout=2)  # then the sidecar closes the connection
    assert wire.closed
    commands = [(f.command, f.get("receipt-id")) for f in wire.frames]
    assert commands[1:] == [("RECEIPT", "r1"), ("RECEIPT", "r2"), ("ERROR", "r3")], commands
    assert "message rejected" in (got[-1].get("message") or "")
    # The SEND after the rejected one may go again (its id is free) and is routed.
    again = Wire(proxy.port)
    again.sock.sendall(send(mqguard_unique_name, "after-again", "id-4", "r5"))
    again.until(lambda got: any(f.get("receipt-id") == "r5" for f in got))
    again.close()
    assert drain(proxy.port, mqguard_unique_name, 3) == ["one", "two", "after-again"]


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_a_send_rejected_by_the_batch_check_releases_the_ids_after_it(
        proxy: SidecarThread, tmp_path: Path, mqguard_unique_name: str) -> None:
    """An id reserved by another (unconfirmed) sender is refused by before_send_batch,
    after the ids of the whole batch were reserved: those of the SENDs after the refused
    one are released (they were never forwarded), so a retry of them is accepted."""
    guard = proxy.sidecar.guard
    capacity = guard.settings.resolve(mqguard_unique_name).id_cache_size
    pending_ms = 60_000
    assert guard.store.ring_reserve(mqguard_unique_name, [id_digest("held")], capacity,
                                    pending_ms) == [RingOutcome.NEW]
    got = session_ended_at_r2(proxy.port, send(mqguard_unique_name, "one", "id-1", "r1")
                      + send(mqguard_unique_name, "held", "held", "r2")
                      + send(mqguard_unique_name, "after", "id-3", "r3"))
    assert "DUPLICATE_ID_IN_FLIGHT" in (got[-1].get("message") or "")
    again = Wire(proxy.port)
    again.sock.sendall(send(mqguard_unique_name, "after-again", "id-3", "r4"))
    got = again.until(lambda got: any(f.get("receipt-id") == "r4" for f in got))
    again.close()
    assert not [f for f in got if f.command == "ERROR"]
    assert drain(proxy.port, mqguard_unique_name, 2) == ["one", "after-again"]
    totals = event_types(proxy, tmp_path)
    assert totals["send_failed"] == 1  # "after": decided, reserved, never forwarded
    assert totals["sent"] == 2


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_a_send_that_cannot_be_forwarded_releases_its_id_and_those_after_it(
        proxy: SidecarThread, tmp_path: Path, mqguard_unique_name: str) -> None:
    """A SEND whose header STOMP reserves (``message-id``) passes the guard, is reserved
    with the batch, and fails when it is encoded for the broker: the session ends there,
    and its id and the ids behind it are free again."""
    bad = (f"SEND\ndestination:/queue/{mqguard_unique_name}\n_AMQ_DUPL_ID:id-2\nmessage-id:x\n"
           f"receipt:r2\n\nbad\0").encode()
    got = session_ended_at_r2(proxy.port, send(mqguard_unique_name, "one", "id-1", "r1") + bad
                      + send(mqguard_unique_name, "after", "id-3", "r3"))
    assert "reserved" in (got[-1].get("message") or "")
    again = Wire(proxy.port)
    again.sock.sendall(send(mqguard_unique_name, "two-again", "id-2", "r4")
                       + send(mqguard_unique_name, "after-again", "id-3", "r5"))
    got = again.until(lambda got: sum(f.command == "RECEIPT" for f in got) == 2)
    again.close()
    assert not [f for f in got if f.command == "ERROR"]
    assert drain(proxy.port, mqguard_unique_name, 3) == ["one", "two-again", "after-again"]
    assert event_types(proxy, tmp_path)["send_failed"] == 2


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_messages_and_acks_of_one_read_are_guarded_as_a_batch(
        proxy: SidecarThread, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Many MESSAGEs per broker read and all their ACKs in one client read: each delivery
    is handed on, acknowledged and recorded exactly once; a second copy of one send (same
    producer and sequence, another id) is suppressed while the first is unacknowledged."""
    count = 40
    frames = [
        (f"SEND\ndestination:/queue/{mqguard_unique_name}\nmqguard-id:m{i}\nmqguard-producer:P\n"
         f"mqguard-seq:{i}\nreceipt:s{i}\n\nbody-{i}\0").encode() for i in range(count)]
    frames.append((f"SEND\ndestination:/queue/{mqguard_unique_name}\nmqguard-id:copy-of-m3\n"
                   f"mqguard-producer:P\nmqguard-seq:3\nreceipt:s-copy\n\ncopy\0").encode())
    sender = Wire(proxy.port)
    sender.sock.sendall(b"".join(frames))
    sender.until(lambda got: sum(f.command == "RECEIPT" for f in got) == count + 1)
    sender.close()
    consumer = Wire(proxy.port)
    consumer.sock.sendall(
        f"SUBSCRIBE\nid:c\ndestination:/queue/{mqguard_unique_name}\nack:client-individual\n"
        "activemq.prefetchSize:100\nprefetch-count:100\n\n\0".encode())
    consumer.until(lambda got: sum(f.command == "MESSAGE" for f in got) >= count)
    consumer.until(lambda got: False, timeout=0.5)  # the copy must not come
    messages = [f for f in consumer.frames if f.command == "MESSAGE"]
    assert [m.body.decode() for m in messages] == [f"body-{i}" for i in range(count)]
    acks = [str(m.get("ack")).replace(":", "\\c") for m in messages]  # STOMP 1.2 escape
    consumer.sock.sendall(b"".join(f"ACK\nid:{ack}\n\n\0".encode() for ack in acks))
    consumer.sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
    consumer.until(lambda got: any(f.get("receipt-id") == "bye" for f in got))
    consumer.close()
    assert drain(proxy.port, mqguard_unique_name, 0) == []  # every ACK reached the broker
    proxy.sidecar.guard.events.flush()
    events = list(read_events(tmp_path / "events"))
    per_type = Counter(e["type"] for e in events)
    assert per_type["delivered"] == count
    assert per_type["duplicate_delivery_suppressed"] == 1
    handled = Counter(e["message_id"] for e in events if e["type"] == "acked" and e["handled"])
    assert handled == Counter(f"m{i}" for i in range(count))
