"""The broker leg of ``mqguard sidecar`` admits what the client leg admitted (issue 21, 6).

A SEND the sidecar accepted comes back from the broker with the broker's own headers
added (message-id, subscription, ack, timestamp...) and its header values escaped
(a raw ``:`` the client sent comes back as ``\\c``). Each case here is a message just
inside the client-side limits: it must be delivered to a consumer that keeps its
session and goes on receiving later messages, and it must not come back (it was
acknowledged, not redelivered forever). A SEND the broker itself would refuse (over
ActiveMQ's 10 KiB header line) gets a clear ERROR from the sidecar at SEND time, and
the send is recorded as failed, never as sent. Real ActiveMQ and RabbitMQ.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqguard.config import MqguardConfig, parse_config
from mqguard.events import read_events
from mqguard.servers import ServerHandle
from mqguard.sidecar.frames import SERVER_COMMANDS, Frame, FrameDecoder, FrameLimits
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]

#: The client-side limits under test: the defaults for headers, a small frame so the
#: "just under max-frame-bytes" case stays light.
MAX_FRAME = 64 * 1024
MAX_HEADERS = 128
MAX_LINE = 8192

#: mqguard's dead-letter address for the queues under "dla.".
DLA = "undeliverable.DLA"

#: Reads what the sidecar writes without limits of its own getting in the way.
_READ_LIMITS = FrameLimits(max_frame_bytes=64 * 1024 * 1024, max_header_count=100_000,
                           max_header_line_bytes=16 * 1024 * 1024)


def sidecar_config(tmp_path: Path, max_headers: int = MAX_HEADERS) -> MqguardConfig:
    return parse_config({
        "mqguard": {
            "node-id": "broker-limits-test",
            "message-expiry-scan-period": -1,
            "event-log": {"directory": str(tmp_path / "events"), "sync": True},
            "sidecar": {"max-frame-bytes": MAX_FRAME, "max-header-count": max_headers,
                        "max-header-line-bytes": MAX_LINE, "connect-timeout-ms": 5000,
                        "drain-timeout-ms": 1000},
        },
        # Queues under "dla." have a dead-letter address; the others none (Artemis's default).
        "address-settings": {"dla.#": {"dead-letter-address": DLA}},
    })


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> tuple[str, ServerHandle]:
    kind = request.param
    return kind, request.getfixturevalue(f"mqguard_{kind}_server")


@pytest.fixture
def proxy(broker: tuple[str, ServerHandle], tmp_path: Path,
          caplog: pytest.LogCaptureFixture) -> Iterator[SidecarThread]:
    caplog.set_level(logging.INFO, logger="mqguard.sidecar")
    sidecar = Sidecar(sidecar_config(tmp_path), parse_upstream(broker[1].urls["stomp"]))
    with SidecarThread(sidecar) as running:
        yield running


class Client:
    """A STOMP 1.2 client made of a bare socket, reading with generous limits."""

    def __init__(self, port: int, *, version: str = "1.2") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        self.decoder = FrameDecoder(commands=SERVER_COMMANDS, limits=_READ_LIMITS,
                                    version="1.2")
        self.frames: list[Frame] = []
        self.closed = False
        self.send(f"CONNECT\naccept-version:{version}\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
                  .encode())
        got = self.wait(lambda frames: bool(frames))
        assert got[0].command == "CONNECTED", got

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def wait(self, until: Callable[[list[Frame]], bool], timeout: float = 15.0) -> list[Frame]:
        """Every frame read so far, once ``until`` holds of them (AssertionError otherwise)."""
        deadline = time.monotonic() + timeout
        while not until(self.frames) and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(min(left, 0.2))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.frames += [item for item in self.decoder.feed(chunk)
                            if isinstance(item, Frame)]
        assert until(self.frames), (f"timed out; closed={self.closed}, frames: "
                                    f"{[(f.command, f.get('message')) for f in self.frames]}")
        return self.frames

    def read_for(self, seconds: float) -> list[Frame]:
        """Every frame read so far, after reading for ``seconds`` (or until closed)."""
        deadline = time.monotonic() + seconds
        while not self.closed and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(min(left, 0.2))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.frames += [item for item in self.decoder.feed(chunk)
                            if isinstance(item, Frame)]
        return self.frames

    def messages(self) -> list[Frame]:
        return [f for f in self.frames if f.command == "MESSAGE"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(b"DISCONNECT\n\n\0")
        with contextlib.suppress(OSError):
            self.sock.close()


def send_frame(queue: str, receipt: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A SEND as a client writes it: ``headers`` as given (raw colons stay raw)."""
    lines = ["SEND", f"destination:/queue/{queue}", f"receipt:{receipt}",
             *(f"{name}:{value}" for name, value in headers)]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


def body_just_under_max_frame(queue: str, receipt: str, headers: list[tuple[str, str]],
                              under: int = 8) -> bytes:
    head = len(send_frame(queue, receipt, headers, b""))
    return b"x" * (MAX_FRAME - under - head)


def assert_delivered_and_healthy(proxy: SidecarThread, queue: str,
                                 bad: Callable[[str], bytes],
                                 check: Callable[[Frame], None]) -> None:
    """The message ``bad(receipt)`` writes is confirmed, delivered (``check``), acked; the
    consumer keeps its session and gets a later message; nothing comes back afterwards."""
    consumer = Client(proxy.port)
    producer = Client(proxy.port)
    try:
        consumer.send(f"SUBSCRIBE\nid:s1\ndestination:/queue/{queue}\nack:client-individual\n"
                      f"receipt:sub\n\n\0".encode())
        consumer.wait(lambda fs: any(f.get("receipt-id") == "sub" for f in fs))
        producer.send(bad("bad"))
        producer.wait(lambda fs: any(f.get("receipt-id") == "bad" or f.command == "ERROR"
                                     for f in fs))
        assert [f.command for f in producer.frames[1:]] == ["RECEIPT"], producer.frames
        got = consumer.wait(lambda fs: any(f.command == "MESSAGE" for f in fs)
                            or any(f.command == "ERROR" for f in fs))
        assert not [f for f in got if f.command == "ERROR"], [
            (f.get("message"), f.body[:300]) for f in got if f.command == "ERROR"]
        first = consumer.messages()[0]
        check(first)
        consumer.send(f"ACK\nid:{first.get('ack')}\nreceipt:ack1\n\n\0".encode())
        consumer.wait(lambda fs: any(f.get("receipt-id") == "ack1" for f in fs))
        # The consumer's session goes on: a later message reaches it.
        producer.send(send_frame(queue, "after", [], b"after"))
        got = consumer.wait(lambda fs: any(f.command == "MESSAGE" and f.body == b"after"
                                           for f in fs) or any(f.command == "ERROR" for f in fs))
        assert not consumer.closed
        assert [f.command for f in got if f.command == "ERROR"] == []
        after = consumer.messages()[-1]
        consumer.send(f"ACK\nid:{after.get('ack')}\nreceipt:ack2\n\n\0".encode())
        consumer.wait(lambda fs: any(f.get("receipt-id") == "ack2" for f in fs))
    finally:
        consumer.close()
        producer.close()
    # Accounted for: acknowledged once, never redelivered to a later consumer.
    later = Client(proxy.port)
    try:
        later.send(f"SUBSCRIBE\nid:s2\ndestination:/queue/{queue}\nack:client-individual\n"
                   f"\n\0".encode())
        later.read_for(2.0)
        assert later.messages() == [], [f.headers[:5] for f in later.messages()]
        assert not later.closed
    finally:
        later.close()


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_124_custom_headers_are_delivered(proxy: SidecarThread, broker: tuple[str, ServerHandle]
                                          ) -> None:
    queue = f"limits-count-{uuid.uuid4().hex[:8]}"
    custom = [(f"x-h{i}", f"v{i}") for i in range(124)]
    assert len(custom) + 2 <= MAX_HEADERS  # destination and receipt: within the client's limit

    def check(message: Frame) -> None:
        assert message.body == b"many headers"
        assert [message.get(f"x-h{i}") for i in range(124)] == [f"v{i}" for i in range(124)]

    assert_delivered_and_healthy(
        proxy, queue, lambda receipt: send_frame(queue, receipt, custom, b"many headers"), check)


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_value_of_5000_colons_is_delivered(proxy: SidecarThread,
                                           broker: tuple[str, ServerHandle]) -> None:
    queue = f"limits-colons-{uuid.uuid4().hex[:8]}"
    colons = ":" * 5000  # 5,008 octets raw; 10,008 once escaped as \c on the way back

    def check(message: Frame) -> None:
        assert message.get("x-colons") == colons
        assert message.body == b"colons"

    assert_delivered_and_healthy(
        proxy, queue,
        lambda receipt: send_frame(queue, receipt, [("x-colons", colons)], b"colons"), check)


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_send_just_under_max_frame_bytes_is_delivered(proxy: SidecarThread,
                                                      broker: tuple[str, ServerHandle]) -> None:
    queue = f"limits-frame-{uuid.uuid4().hex[:8]}"
    body = body_just_under_max_frame(queue, "bad", [])
    assert len(send_frame(queue, "bad", [], body)) == MAX_FRAME - 8

    def check(message: Frame) -> None:
        assert message.body == body

    assert_delivered_and_healthy(proxy, queue,
                                 lambda receipt: send_frame(queue, receipt, [], body), check)


@pytest.mark.activemq
@pytest.mark.parametrize("broker", [BROKERS[0]], indirect=True)
def test_send_over_the_brokers_header_line_limit_is_refused_at_send(
        proxy: SidecarThread, broker: tuple[str, ServerHandle], tmp_path: Path) -> None:
    """6,000 raw colons fit the client leg (6,008 octets) but are 12,008 escaped: over
    ActiveMQ's 10,240-octet header line. The client gets the sidecar's ERROR naming the
    limit (not the broker's), the send is recorded as failed, and nothing is delivered."""
    queue = f"limits-refused-{uuid.uuid4().hex[:8]}"
    producer = Client(proxy.port)
    try:
        producer.send(send_frame(queue, "r1", [("x-colons", ":" * 6000)], b"too wide"))
        frames = producer.wait(lambda fs: any(f.command == "ERROR" for f in fs)
                               or any(f.get("receipt-id") == "r1" for f in fs))
        errors = [f for f in frames if f.command == "ERROR"]
        assert [f.command for f in frames[1:]] == ["ERROR"], frames
        assert "activemq" in (errors[0].get("message") or "").lower(), errors[0]
        assert "header line" in (errors[0].get("message") or ""), errors[0]
        assert errors[0].get("receipt-id") == "r1"
    finally:
        producer.close()
    consumer = Client(proxy.port)
    try:
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:auto\n\n\0".encode())
        consumer.read_for(1.5)
        assert consumer.messages() == []
    finally:
        consumer.close()
    proxy.sidecar.guard.events.flush()
    types = [e["type"] for e in read_events(tmp_path / "events")]
    assert "sent" not in types, types


# -- messages put on the queue behind the sidecar's back -------------------------------------
#
# The broker leg's limits admit whatever the client leg admits, so only a producer that
# bypasses the sidecar can put a MESSAGE over them on a queue. It must not end the session
# of the consumer it reaches (it would come back to every consumer, forever): it is
# dead-lettered, and the consumer goes on.

def broker_port(broker: tuple[str, ServerHandle]) -> int:
    return int(broker[1].urls["stomp"].rsplit(":", 1)[1].strip("/"))


def send_direct(broker: tuple[str, ServerHandle], queue: str, data: bytes) -> None:
    """``data`` (a SEND with receipt "direct") straight to the broker, confirmed."""
    direct = Client(broker_port(broker))
    try:
        direct.send(data)
        direct.wait(lambda fs: any(f.get("receipt-id") == "direct" or f.command == "ERROR"
                                   for f in fs))
        assert [f.command for f in direct.frames[1:]] == ["RECEIPT"], direct.frames[1:]
    finally:
        direct.close()


def drain_direct(broker: tuple[str, ServerHandle], queue: str, wait: float = 2.0
                 ) -> list[Frame]:
    """Every message on ``queue``, consumed straight from the broker (auto ack)."""
    direct = Client(broker_port(broker))
    try:
        direct.send(f"SUBSCRIBE\nid:d\ndestination:/queue/{queue}\nack:auto\n\n\0".encode())
        direct.read_for(wait)
        return direct.messages()
    finally:
        direct.close()


def ack_frame(message: Frame, receipt: str, version: str) -> bytes:
    if version == "1.2":
        return f"ACK\nid:{message.get('ack')}\nreceipt:{receipt}\n\n\0".encode()
    return (f"ACK\nmessage-id:{message.get('message-id')}\nsubscription:s1\n"
            f"receipt:{receipt}\n\n\0").encode()


def consume_around(proxy: SidecarThread, broker: tuple[str, ServerHandle], queue: str,
                   bad: bytes, version: str = "1.2") -> None:
    """``bad`` is put on ``queue`` behind the sidecar's back, then a good message: a consumer
    through the sidecar gets the good one only, and keeps its session."""
    send_direct(broker, queue, bad)
    send_direct(broker, queue, send_frame(queue, "direct", [("persistent", "true")], b"good"))
    consumer = Client(proxy.port, version=version)
    try:
        consumer.send(f"SUBSCRIBE\nid:s1\ndestination:/queue/{queue}\nack:client-individual\n"
                      f"\n\0".encode())
        got = consumer.wait(lambda fs: any(f.command in ("MESSAGE", "ERROR") for f in fs))
        assert [(f.command, f.body) for f in got[1:]] == [("MESSAGE", b"good")], [
            (f.command, f.get("message"), f.body[:200]) for f in got[1:]]
        consumer.send(ack_frame(got[1], "a", version))
        consumer.wait(lambda fs: any(f.get("receipt-id") == "a" for f in fs))
        # Still the same session: a later message reaches it.
        consumer.send(send_frame(queue, "later", [], b"later"))
        consumer.wait(lambda fs: any(f.body == b"later" for f in fs))
        assert not consumer.closed
        later = consumer.messages()[-1]
        consumer.send(ack_frame(later, "b", version))
        consumer.wait(lambda fs: any(f.get("receipt-id") == "b" for f in fs))
    finally:
        consumer.close()
    # Not redelivered to anyone: the queue is empty.
    assert drain_direct(broker, queue) == []


def dead_letter_events(proxy: SidecarThread, tmp_path: Path) -> list[dict[str, object]]:
    proxy.sidecar.guard.events.flush()
    events = list(read_events(tmp_path / "events"))
    return [e for e in events if e["type"] in ("dead_lettered", "delivery_dropped")]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_body_over_the_broker_leg_is_rejected_to_the_brokers_dead_letter_handling(
        proxy: SidecarThread, broker: tuple[str, ServerHandle], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    queue = f"limits-huge-{uuid.uuid4().hex[:8]}"
    body = b"h" * (proxy.sidecar.broker_limits.max_frame_bytes + 1000)
    consume_around(proxy, broker, queue, send_frame(
        queue, "direct", [("persistent", "true"), ("x-kind", "huge")], body))
    [event] = dead_letter_events(proxy, tmp_path)
    assert event["type"] == "dead_lettered" and event["queue"] == queue
    assert "frame too large" in str(event["reason"]) and "NACK" in str(event["reason"])
    assert any("rejected to the broker's own dead-letter handling" in r.getMessage()
               and r.levelno == logging.WARNING for r in caplog.records)
    if broker[0] == "activemq":
        # ActiveMQ takes a NACK as a poison ack: its dead-letter queue has it, body and all.
        moved = [m for m in drain_direct(broker, "ActiveMQ.DLQ") if m.get("x-kind") == "huge"]
        assert [len(m.body) for m in moved] == [len(body)]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_too_many_headers_go_to_the_dead_letter_address(
        proxy: SidecarThread, broker: tuple[str, ServerHandle], tmp_path: Path) -> None:
    queue = f"dla.limits-heads-{uuid.uuid4().hex[:8]}"
    count = proxy.sidecar.broker_limits.max_header_count + 10
    headers = [("persistent", "true"), *((f"x-h{i}", f"v{i}") for i in range(count))]
    consume_around(proxy, broker, queue, send_frame(queue, "direct", headers, b"wide"))
    [event] = dead_letter_events(proxy, tmp_path)
    assert (event["type"], event["queue"], event["target"]) == ("dead_lettered", queue, DLA)
    assert "too many headers" in str(event["reason"])
    [copy] = drain_direct(broker, DLA)
    assert copy.body == b"wide"
    assert copy.get("x-h0") == "v0" and copy.get(f"x-h{count - 1}") == f"v{count - 1}"
    assert copy.get("_AMQ_ORIG_QUEUE") == queue


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_without_a_dead_letter_address_the_broker_takes_it_back_unrequeued(
        proxy: SidecarThread, broker: tuple[str, ServerHandle], tmp_path: Path) -> None:
    queue = f"limits-wide-{uuid.uuid4().hex[:8]}"
    line = proxy.sidecar.broker_limits.max_header_line_bytes + 100
    value = "w" * (line if broker[0] == "rabbitmq" else 10_000)
    if broker[0] == "activemq":
        # ActiveMQ refuses a STOMP header line over 10,240 octets: too many headers instead.
        headers = [("persistent", "true"), ("x-kind", queue),
                   *((f"x-h{i}", "v") for i in range(
                       proxy.sidecar.broker_limits.max_header_count + 10))]
    else:
        headers = [("persistent", "true"), ("x-wide", value)]
    consume_around(proxy, broker, queue, send_frame(queue, "direct", headers, b"no dla"))
    [event] = dead_letter_events(proxy, tmp_path)
    assert event["type"] == "dead_lettered" and event.get("target") is None
    assert "no dead-letter-address" in str(event["reason"])
    assert "NACK" in str(event["reason"])
    if broker[0] == "activemq":
        # Where Artemis would drop it, ActiveMQ keeps it in its own dead-letter queue.
        moved = [m for m in drain_direct(broker, "ActiveMQ.DLQ") if m.get("x-kind") == queue]
        assert [m.body for m in moved] == [b"no dla"]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
@pytest.mark.parametrize("over", ["body", "headers"])
def test_stomp_10_has_no_nack_so_the_message_is_dropped_with_an_event(
        proxy: SidecarThread, broker: tuple[str, ServerHandle], tmp_path: Path,
        caplog: pytest.LogCaptureFixture, over: str) -> None:
    queue = f"limits-10-{uuid.uuid4().hex[:8]}"
    limits = proxy.sidecar.broker_limits
    if over == "body":
        bad = send_frame(queue, "direct", [("persistent", "true")],
                         b"h" * (limits.max_frame_bytes + 1000))
    else:
        bad = send_frame(queue, "direct", [("persistent", "true"), *(
            (f"x-h{i}", "v") for i in range(limits.max_header_count + 10))], b"wide")
    consume_around(proxy, broker, queue, bad, version="1.0")
    [event] = dead_letter_events(proxy, tmp_path)
    assert (event["type"], event["queue"]) == ("delivery_dropped", queue)
    reason = str(event["reason"])
    assert "STOMP 1.0" in reason
    assert ("frame too large" if over == "body" else "too many headers") in reason
    assert any("dropped" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


@pytest.mark.activemq
@pytest.mark.parametrize("broker", [BROKERS[0]], indirect=True)
def test_more_headers_than_activemq_takes_are_refused_at_send(
        broker: tuple[str, ServerHandle], tmp_path: Path) -> None:
    """A client leg allowed 2,000 headers: 995 of them (with mqguard's, and room for a
    dead-letter copy's) are over ActiveMQ's 1,000; the sidecar says so at SEND, while 900
    go through and are delivered."""
    sidecar = Sidecar(sidecar_config(tmp_path, max_headers=2000),
                      parse_upstream(broker[1].urls["stomp"]))
    queue = f"limits-count-amq-{uuid.uuid4().hex[:8]}"
    with SidecarThread(sidecar) as proxy:
        producer = Client(proxy.port)
        try:
            producer.send(send_frame(queue, "ok", [(f"h{i}", "v") for i in range(900)], b"ok"))
            producer.wait(lambda fs: any(f.get("receipt-id") == "ok" for f in fs))
            producer.send(send_frame(queue, "r1", [(f"h{i}", "v") for i in range(995)], b"no"))
            frames = producer.wait(lambda fs: any(f.command == "ERROR" for f in fs))
            [error] = [f for f in frames if f.command == "ERROR"]
            assert "too many headers for ActiveMQ" in (error.get("message") or ""), error
            assert error.get("receipt-id") == "r1"
        finally:
            producer.close()
        consumer = Client(proxy.port)
        try:
            consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:auto\n\n\0".encode())
            consumer.read_for(1.5)
            assert [m.body for m in consumer.messages()] == [b"ok"]
            assert consumer.messages()[0].get("h899") == "v"
        finally:
            consumer.close()
