"""Robustness of ``mqguard sidecar`` (issue 6) with raw sockets, against REAL brokers.

Bad clients speak raw STOMP bytes to a running sidecar: malformed, oversized and
truncated frames, protocol violations, a stream of random and mutated frames. Each
bad connection must get what the STOMP spec asks for -- an ERROR frame naming the
problem, then the sidecar closes it -- while a healthy stomp.py client keeps sending
and receiving on the same sidecar throughout, and loses nothing. The upstream broker
going away (a cut through a :class:`FaultProxy`, and a real ActiveMQ restart) ends
every session on it with an ERROR; persistent messages confirmed before survive.

The fuzz seed is printed (``-s`` shows it, and every failure message names it);
``MQGUARD_FUZZ_SEED=<n>`` replays a run, ``MQGUARD_FUZZ_SEED=random`` explores new
seeds; the default is a fixed seed, so CI stays reproducible.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mqguard_tests.stomp_clients import (
    HealthyClient,
    RawClient,
    connect_frame,
    decode_server_bytes,
    healthy_round_trip,
)

from mqguard.config import MqguardConfig, parse_config
from mqguard.demo.faultproxy import FaultProxy
from mqguard.servers import ServerHandle, ServerUnavailable, start
from mqguard.sidecar.frames import FrameError
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]

#: Small limits, so the over-limit cases cost little to send.
MAX_FRAME = 64 * 1024
MAX_HEADERS = 16
MAX_LINE = 1024

#: The fuzz seed CI uses (see the module docstring).
DEFAULT_FUZZ_SEED = 20261121


def sidecar_config(tmp_path: Path) -> MqguardConfig:
    return parse_config({
        "mqguard": {
            "node-id": "robustness-test",
            "message-expiry-scan-period": -1,
            "event-log": {"directory": str(tmp_path / "events")},
            "sidecar": {"max-frame-bytes": MAX_FRAME, "max-header-count": MAX_HEADERS,
                        "max-header-line-bytes": MAX_LINE, "connect-timeout-ms": 3000,
                        "drain-timeout-ms": 1000},
        },
    })


EVENT_LOOP_OF = {"activemq": "asyncio", "rabbitmq": "uvloop"}


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> tuple[str, ServerHandle]:
    kind = request.param
    return kind, request.getfixturevalue(f"mqguard_{kind}_server")


@pytest.fixture
def sidecar_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Captures the sidecar's log, for :func:`assert_no_sidecar_failure`."""
    caplog.set_level(logging.INFO, logger="mqguard.sidecar")
    return caplog


def assert_no_sidecar_failure(caplog: pytest.LogCaptureFixture, seed: int | None = None, *,
                              broker_may_misframe: bool = False) -> None:
    """No error or traceback logged by the sidecar; unless ``broker_may_misframe``, no
    malformed frame from the broker either (it would point at what the sidecar sent it)."""
    bad = [record for record in caplog.records
           if record.name.startswith("mqguard.sidecar")
           and (record.levelno >= logging.ERROR or record.exc_info
                or "failed inside the sidecar" in record.getMessage()
                or (not broker_may_misframe
                    and "malformed frame from the broker" in record.getMessage()))]
    assert not bad, (f"seed {seed}: " if seed is not None else "") + "sidecar log: " + "\n".join(
        f"{r.levelname} {r.getMessage()}\n{r.exc_text or ''}" for r in bad)


@pytest.fixture
def proxy(broker: tuple[str, ServerHandle], tmp_path: Path,
          sidecar_log: pytest.LogCaptureFixture) -> Iterator[SidecarThread]:
    sidecar = Sidecar(sidecar_config(tmp_path), parse_upstream(broker[1].urls["stomp"]),
                      admin=("127.0.0.1", 0))
    # Both event loops the sidecar runs on (mqguard.sidecar.eventloop) meet every case here,
    # one broker each: `mqguard sidecar` picks uvloop when installed (the test extra has it).
    with SidecarThread(sidecar, event_loop=EVENT_LOOP_OF[broker[0]]) as running:
        yield running


def sessions(proxy: SidecarThread) -> int:
    return len(proxy.sidecar.sessions)


# -- the healthy client ------------------------------------------------------------------------


@pytest.fixture
def healthy(proxy: SidecarThread, mqguard_unique_name: str) -> Iterator[HealthyClient]:
    client = HealthyClient(proxy.port, f"/queue/{mqguard_unique_name}-healthy")
    yield client
    client.stop()
    if client.conn.is_connected():
        client.conn.disconnect()


# -- raw STOMP ---------------------------------------------------------------------------------


# -- 1. malformed frames -----------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    payload: bytes
    #: Expected in the ERROR frame's ``message`` header (case-insensitive; ``|`` separates
    #: alternatives).
    message: str
    connect: bool = True
    #: Half-close after the payload (a client that has sent all it will send).
    half_close: bool = False


def malformed_cases(bad_queue: str) -> list[Case]:
    send = f"SEND\ndestination:{bad_queue}\n".encode()
    return [
        Case("binary garbage before CONNECT", b"\x00\x01\xfe\xff\r\n\r\n", "UTF-8|bad command",
             connect=False),
        Case("an HTTP request instead of CONNECT", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
             "bad command", connect=False),
        Case("lower-case garbage line before CONNECT", b"hello there\n\n\0", "bad command",
             connect=False),
        Case("a frame before CONNECT", send + b"\nfirst\0", "expected CONNECT", connect=False),
        Case("no NUL past max-frame-bytes", send + b"\n" + b"x" * (MAX_FRAME + 4096),
             "frame too large"),
        Case("content-length past max-frame-bytes",
             send + f"content-length:{MAX_FRAME * 4}\n\n".encode() + b"x" * 100,
             "frame too large"),
        Case("huge content-length", send + b"content-length:99999999999999999999999\n\nx\0",
             "content-length"),
        Case("too many headers",
             send + b"".join(b"h%d:v\n" % i for i in range(MAX_HEADERS + 5)) + b"\nbody\0",
             "too many headers"),
        Case("over-long header line", send + b"big:" + b"v" * (MAX_LINE + 10) + b"\n\nbody\0",
             "header line too long"),
        Case("endless header line", send + b"big:" + b"v" * (MAX_FRAME + 10),
             "header line too long"),
        Case("bad escape \\t in a SEND header", send + b"app:tab\\there\n\nbody\0",
             "bad header escape"),
        Case("invalid UTF-8 in a header", send + b"app:\xff\xfe\xc3\x28\n\nbody\0", "UTF-8"),
        Case("header line without a colon", send + b"no colon here\n\nbody\0", "without ':'"),
        Case("NUL in the headers", send + b"app:a\0b\n\nbody\0", "NUL in headers"),
        Case("unknown command", b"FROBNICATE\ndestination:/queue/x\n\n\0", "unknown command"),
        Case("a server command from the client", b"MESSAGE\ndestination:/queue/x\n\n\0",
             "unknown command"),
        Case("content-length larger than the data, then close",
             send + b"content-length:1000\n\nonly this", "incomplete frame", half_close=True),
        Case("no NUL after a content-length body", send + b"content-length:3\n\nabcdef\0",
             "missing NUL"),
        Case("negative content-length", send + b"content-length:-5\n\nbody\0",
             "invalid content-length"),
        Case("non-numeric content-length", send + b"content-length:12abc\n\nbody\0",
             "invalid content-length"),
        Case("SEND without destination", b"SEND\nreceipt:r\n\nbody\0", "destination"),
        Case("CONNECT sent twice", connect_frame(), "already connected"),
        Case("STOMP after CONNECT", connect_frame().replace(b"CONNECT", b"STOMP", 1),
             "already connected"),
        Case("COMMIT of a transaction never begun", b"COMMIT\ntransaction:nope\n\n\0",
             "unknown transaction"),
        Case("SUBSCRIBE with an unknown ack mode",
             f"SUBSCRIBE\nid:1\ndestination:{bad_queue}\nack:sometimes\n\n\0".encode(),
             "ack mode"),
    ]


def check_bad_connection(port: int, case: Case) -> str | None:
    """Run one case; a description of what went wrong, or None."""
    raw = RawClient(port)
    try:
        if case.connect:
            raw.connect()
        start = len(raw.frames())
        raw.send(case.payload)
        if case.half_close:
            with contextlib.suppress(OSError):
                raw.sock.shutdown(socket.SHUT_WR)
        raw.read_to_close(timeout=5.0)
        try:
            frames = raw.frames()[start:]
        except FrameError as exc:
            return f"unparseable answer {raw.data[-300:]!r}: {exc}"
        if not raw.closed:
            return f"not closed by the sidecar within 5 s; frames {frames}"
        if [f.command for f in frames] != ["ERROR"]:
            return f"expected one ERROR frame, got {frames} (reset={raw.reset})"
        message = frames[0].get("message") or ""
        if not any(part.lower() in message.lower() for part in case.message.split("|")):
            return f"ERROR message {message!r} does not name {case.message!r}"
        return None
    finally:
        raw.close()


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_malformed_frames_get_an_error_and_a_close_the_others_are_served(
        proxy: SidecarThread, healthy: HealthyClient, sidecar_log: pytest.LogCaptureFixture,
        mqguard_unique_name: str) -> None:
    bad_queue = f"/queue/{mqguard_unique_name}-bad"
    # Meanwhile two clients that never complete a CONNECT (connect-timeout-ms is 3 s).
    silent, stalled = RawClient(proxy.port), RawClient(proxy.port)
    stalled.send(b"CONNECT\naccept-version:1.2\nlog")
    problems: list[str] = []
    for case in malformed_cases(bad_queue):
        problem = check_bad_connection(proxy.port, case)
        if problem:
            problems.append(f"{case.name}: {problem}")
        # The bad session is gone; the healthy and the two waiting ones are all that is left.
        wait_for(lambda: sessions(proxy) == 3, 5, f"the session of {case.name!r} to end")
    for raw, what in [(silent, "silent client"), (stalled, "half a CONNECT")]:
        raw.read_to_close(timeout=5)
        frames = raw.frames()
        if not (raw.closed and [f.command for f in frames] == ["ERROR"]
                and "no CONNECT frame within" in (frames[0].get("message") or "")):
            problems.append(f"{what}: {frames}, closed={raw.closed}")
        raw.close()
    wait_for(lambda: sessions(proxy) == 1, 5, "the waiting sessions to end")
    assert not problems, "\n".join(problems)
    counted = proxy.sidecar.metrics.registry.get_sample_value(
        "mqguard_sidecar_protocol_errors_total", {"side": "client"})
    assert counted is not None and counted >= 15, counted
    healthy.finish()
    # Nothing of any bad frame reached the broker.
    assert_queue_empty(proxy.port, bad_queue)
    assert_no_sidecar_failure(sidecar_log)


def assert_queue_empty(port: int, queue: str, wait: float = 0.5) -> None:
    raw = RawClient(port)
    try:
        raw.connect()
        raw.send(f"SUBSCRIBE\nid:check\ndestination:{queue}\nack:auto\nreceipt:sub\n\n\0"
                 .encode())
        raw.read_frames(lambda got: any(f.get("receipt-id") == "sub" for f in got))
        raw.read(lambda: False, wait)
        messages = [f for f in raw.frames() if f.command == "MESSAGE"]
        assert not messages, f"{queue} holds {[m.body for m in messages]}"
    finally:
        raw.close()


# -- 2. a client that vanishes mid-frame -------------------------------------------------------

@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_client_disconnecting_mid_frame_sends_nothing(
        proxy: SidecarThread, healthy: HealthyClient, sidecar_log: pytest.LogCaptureFixture,
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}-half"
    send = f"SEND\ndestination:{queue}\nreceipt:r\n".encode()
    halves = [
        b"SEN",  # inside the command
        send[:-6],  # inside the headers
        send + b"content-length:100\n\n" + b"x" * 50,  # inside a counted body
        send + b"\n" + b"x" * 5000,  # inside a NUL-terminated body
    ]
    for i, half in enumerate(halves):
        for reset in (False, True):
            raw = RawClient(proxy.port)
            raw.connect()
            # A complete frame first (after its receipt came), then the half one.
            raw.send(f"SEND\ndestination:{queue}-whole\nreceipt:w\n\nwhole-{i}\0".encode())
            raw.read_frames(lambda got: any(f.get("receipt-id") == "w" for f in got))
            raw.send(half)
            time.sleep(0.05)
            raw.close(reset=reset)
            wait_for(lambda: sessions(proxy) == 1, 5,
                     f"the session count back to the healthy client's (half {i}, reset={reset})")
    healthy.finish()
    assert_queue_empty(proxy.port, queue)
    assert_no_sidecar_failure(sidecar_log)


@pytest.mark.parametrize("broker", BROKERS[:1], indirect=True)
def test_client_that_stops_reading_is_reset_not_kept(
        proxy: SidecarThread, healthy: HealthyClient, sidecar_log: pytest.LogCaptureFixture,
        mqguard_unique_name: str) -> None:
    """A consumer that stops reading with megabytes on their way to it, then breaks the
    protocol: its session ends, and its connection is reset instead of being kept open
    forever for a flush that cannot happen (the sidecar used to keep the socket and its
    buffers until the client went away)."""
    queue = f"/queue/{mqguard_unique_name}-big"
    producer = RawClient(proxy.port)
    producer.connect()
    body = b"x" * 60_000
    for _ in range(100):
        producer.send(f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode()
                      + body + b"\0")
    producer.send(f"SEND\ndestination:{queue}\nreceipt:all\n\nlast\0".encode())
    producer.read_frames(lambda got: any(f.get("receipt-id") == "all" for f in got), 30)
    producer.close()
    stuck = RawClient(proxy.port)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect()
    stuck.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:client\n\n\0".encode())
    time.sleep(1.0)  # the sidecar's buffers for it fill up; it reads nothing
    stuck.send(b"BOGUS\n\n\0")
    # Drain timeout (1 s) for the broker leg, then 2 s for the client's buffer to flush;
    # the session is gone once its connections are closed (reset or not).
    wait_for(lambda: sessions(proxy) == 1, 10, "the stuck session to end")
    stuck.read_to_close(timeout=10)
    assert stuck.closed and stuck.reset, "the stuck client's connection was not reset"
    healthy.finish()
    assert_no_sidecar_failure(sidecar_log)
    stuck.close()


# -- 3. the upstream broker goes away ----------------------------------------------------------

@dataclass
class Upstream:
    """A sidecar whose upstream runs through a FaultProxy (the 'broker' to cut)."""

    proxy: SidecarThread
    fault: FaultProxy
    log: pytest.LogCaptureFixture
    raws: list[RawClient] = field(default_factory=list)

    def client(self) -> RawClient:
        raw = RawClient(self.proxy.port)
        self.raws.append(raw)
        raw.connect()
        return raw


@contextlib.contextmanager
def sidecar_through_fault_proxy(host: str, port: int, tmp_path: Path,
                                log: pytest.LogCaptureFixture) -> Iterator[Upstream]:
    with FaultProxy(host, port) as fault:
        sidecar = Sidecar(sidecar_config(tmp_path), parse_upstream(fault.url_for("stomp")))
        with SidecarThread(sidecar) as running:
            upstream = Upstream(running, fault, log)
            try:
                yield upstream
            finally:
                for raw in upstream.raws:
                    raw.close()


def send_persistent(raw: RawClient, queue: str, bodies: list[str]) -> None:
    for i, body in enumerate(bodies):
        raw.send(f"SEND\ndestination:{queue}\npersistent:true\nreceipt:p{i}\n\n{body}\0"
                 .encode())
    raw.read_frames(lambda got: [f.get("receipt-id") for f in got]
                    == [f"p{i}" for i in range(len(bodies))])


def assert_broker_lost(raw: RawClient, what: str) -> None:
    raw.read_to_close(timeout=10)
    assert raw.closed, f"{what}: not closed after the broker went away"
    errors = [f for f in raw.frames() if f.command == "ERROR"]
    assert len(errors) == 1 and raw.frames()[-1].command == "ERROR", (what, raw.frames())
    assert "broker" in (errors[0].get("message") or ""), errors[0]


def drain_queue(up: Upstream, queue: str, count: int) -> list[bytes]:
    raw = up.client()
    raw.send(f"SUBSCRIBE\nid:d\ndestination:{queue}\nack:client-individual\n\n\0".encode())
    frames = raw.read_frames(
        lambda got: sum(f.command == "MESSAGE" for f in got) >= count)
    messages = [f for f in frames if f.command == "MESSAGE"]
    for message in messages:
        raw.send(f"ACK\nid:{message.get('ack')}\n\n\0".encode())
    raw.send(b"DISCONNECT\nreceipt:bye\n\n\0")
    raw.read_frames(lambda got: any(f.get("receipt-id") == "bye" for f in got))
    return [m.body for m in messages]


def lose_and_recover(up: Upstream, queue: str, break_upstream: Callable[[], None],
                     restore_upstream: Callable[[], None]) -> None:
    """Shared by the cut and the restart: what the clients see, and that nothing is lost."""
    bodies = [f"kept-{i}" for i in range(20)]
    producer = up.client()
    send_persistent(producer, queue, bodies)
    # A consumer holding unacknowledged deliveries when the broker goes.
    holder = up.client()
    holder.send(f"SUBSCRIBE\nid:h\ndestination:{queue}-held\nack:client-individual\n\n\0"
                .encode())
    feeder = up.client()
    send_persistent(feeder, f"{queue}-held", ["held-0", "held-1", "held-2"])
    holder.read_frames(lambda got: sum(f.command == "MESSAGE" for f in got) == 3)
    idle = up.client()
    assert sessions(up.proxy) == 4
    break_upstream()
    for raw, what in [(producer, "producer"), (holder, "consumer"), (feeder, "feeder"),
                      (idle, "idle client")]:
        assert_broker_lost(raw, what)
    wait_for(lambda: sessions(up.proxy) == 0, 10, "every session on the lost broker to end")
    # While the broker is away a new client is told so, and closed.
    raw = RawClient(up.proxy.port)
    up.raws.append(raw)
    raw.send(connect_frame())
    raw.read_to_close(timeout=10)
    assert raw.closed and [f.command for f in raw.frames()] == ["ERROR"], raw.frames()
    assert "broker" in (raw.frames()[0].get("message") or "")
    restore_upstream()
    # Back: new connections work and every message confirmed before is still there.
    assert drain_queue(up, queue, len(bodies)) == [b.encode() for b in bodies]
    assert drain_queue(up, f"{queue}-held", 3) == [b"held-0", b"held-1", b"held-2"]
    wait_for(lambda: sessions(up.proxy) == 0, 10, "the sessions to end")
    assert_no_sidecar_failure(up.log)


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_upstream_connection_cut(broker: tuple[str, ServerHandle], tmp_path: Path,
                                 sidecar_log: pytest.LogCaptureFixture,
                                 mqguard_unique_name: str) -> None:
    handle = broker[1]
    upstream = parse_upstream(handle.urls["stomp"])
    with sidecar_through_fault_proxy(upstream.host, upstream.port, tmp_path,
                                     sidecar_log) as up:
        def cut() -> None:
            up.fault.refuse(True)
            assert up.fault.cut() == 4

        lose_and_recover(up, f"/queue/{mqguard_unique_name}", cut, lambda: up.fault.refuse(False))


@pytest.fixture
def own_activemq() -> Iterator[list[ServerHandle]]:
    """A private ActiveMQ this test may restart; the list holds the newest handle."""
    try:
        handles = [start("activemq")]
    except ServerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"required server unavailable in CI: {exc}", pytrace=False)
        pytest.skip(f"activemq server unavailable: {exc}")
    yield handles
    for handle in handles:
        with contextlib.suppress(Exception):
            handle.stop()
    shutil.rmtree(handles[0].state_dir, ignore_errors=True)


@pytest.mark.activemq
def test_upstream_broker_restart_activemq(own_activemq: list[ServerHandle], tmp_path: Path,
                                          sidecar_log: pytest.LogCaptureFixture,
                                          mqguard_unique_name: str) -> None:
    """A real restart (KahaDB kept). The broker comes back on a new port; the fault proxy,
    the sidecar's fixed upstream address, is pointed at it."""
    first = parse_upstream(own_activemq[0].urls["stomp"])
    with sidecar_through_fault_proxy(first.host, first.port, tmp_path, sidecar_log) as up:
        def stop() -> None:
            own_activemq[0].stop()

        def restart() -> None:
            handle = start("activemq", state_dir=own_activemq[0].state_dir)
            own_activemq.append(handle)
            up.fault.upstream_port = parse_upstream(handle.urls["stomp"]).port

        lose_and_recover(up, f"/queue/{mqguard_unique_name}", stop, restart)


# -- 4. fuzz -----------------------------------------------------------------------------------

FUZZ_RANDOM = 300
FUZZ_MUTATED = 300
FUZZ_WORKERS = 16

_COMMANDS = [b"SEND", b"SUBSCRIBE", b"UNSUBSCRIBE", b"ACK", b"NACK", b"BEGIN", b"COMMIT",
             b"ABORT", b"DISCONNECT", b"CONNECT", b"STOMP", b"MESSAGE", b"ERROR", b"RECEIPT",
             b"CONNECTED", b"send", b"FOO", b"", b"S", b"SEND ", b" SEND", b"SEND\r",
             b"X" * 40, "SÉND".encode()]


def base_frames(rng: random.Random, queue: str) -> list[bytes]:
    dest = f"destination:{queue}-{rng.randrange(3)}\n".encode()
    tx = f"transaction:t{rng.randrange(3)}\n".encode()
    body = rng.choice([b"", b"hello", b"with\0nul", bytes(rng.randrange(256) for _ in range(40))])
    return [
        b"SEND\n" + dest + b"receipt:r1\n\nhello\0",
        b"SEND\n" + dest + f"content-length:{len(body)}\n".encode() + b"\n" + body + b"\0",
        b"SEND\n" + dest + tx + b"_AMQ_DUPL_ID:d1\nexpires:1\n\nx\0",
        b"SEND\n" + dest + b"mqguard-producer:p\nmqguard-seq:7\npersistent:true\n\nx\0",
        b"SUBSCRIBE\nid:s1\n" + dest + b"ack:" + rng.choice([b"auto", b"client",
                                                            b"client-individual"]) + b"\n\n\0",
        b"SUBSCRIBE\nid:s2\n" + dest + b"browser:true\n\n\0",
        b"UNSUBSCRIBE\nid:s1\n\n\0",
        b"ACK\nid:" + rng.choice([b"1", b"ID:x", b""]) + b"\n" + tx + b"\n\0",
        b"NACK\nid:2\nmessage-id:3\nsubscription:s1\n\n\0",
        b"BEGIN\n" + tx + b"\n\0",
        b"COMMIT\n" + tx + b"receipt:c\n\n\0",
        b"ABORT\n" + tx + b"\n\0",
        b"DISCONNECT\nreceipt:bye\n\n\0",
        b"\n", b"\r\n",
        connect_frame(),
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(14)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:  # flip bytes
            for _ in range(rng.randrange(1, 6)):
                out[rng.randrange(len(out))] = rng.randrange(256)
        elif kind == 1:  # truncate
            del out[at:]
        elif kind == 2:  # duplicate a header line
            lines = bytes(out).split(b"\n")
            if len(lines) > 2:
                i = rng.randrange(1, len(lines))
                lines.insert(i, lines[i])
            out = bytearray(b"\n".join(lines))
        elif kind == 3:  # a content-length, often a wrong one
            value = rng.choice([b"0", b"1", b"5", b"99999999", b"-1", b"abc", b"1e3",
                                b"18446744073709551616", b" 3", str(MAX_FRAME).encode()])
            out[at:at] = b"content-length:" + value + b"\n"
        elif kind == 4:  # another command
            end = out.find(b"\n")
            out[:max(end, 0)] = rng.choice(_COMMANDS)
        elif kind == 5:  # embedded NULs
            out[at:at] = b"\0" * rng.randrange(1, 3)
        elif kind == 6:  # random bytes
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 20)))
        elif kind == 7:  # delete a slice
            del out[at:at + rng.randrange(1, 10)]
        elif kind == 8:  # line ends
            out = bytearray(bytes(out).replace(b"\n", rng.choice([b"\r\n", b"\r", b"\n\n"])))
        elif kind == 9:  # the frame again, or two glued
            out = out + out
        elif kind == 10:  # many headers
            out[at:at] = b"".join(b"h%d:v\n" % i for i in range(rng.randrange(5, 40)))
        elif kind == 11:  # a long header line
            out[at:at] = b"long:" + b"v" * rng.choice([MAX_LINE - 10, MAX_LINE + 5, 5000]) + b"\n"
        elif kind == 12:  # escapes, good and bad
            out[at:at] = rng.choice([b"\\n", b"\\c", b"\\\\", b"\\r", b"\\t", b"\\", b"\\x"])
        else:  # invalid UTF-8 / colons / spaces
            out[at:at] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b":", b" : ", b"\t"])
    return bytes(out)


def random_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(3)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000)))
    if kind == 1:  # printable noise with STOMP punctuation
        alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef:\\\n\r\0 -/0123456789"
        return bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 2000)))
    # A frame of random shape.
    command = rng.choice(_COMMANDS)
    headers = b"".join(
        bytes(rng.randrange(33, 127) for _ in range(rng.randrange(0, 12))) + b":"
        + bytes(rng.randrange(32, 256) for _ in range(rng.randrange(0, 30))) + b"\n"
        for _ in range(rng.randrange(0, 25)))
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 500)))
    return command + b"\n" + headers + b"\n" + body + rng.choice([b"\0", b"", b"\0\n"])


@dataclass(frozen=True)
class FuzzCase:
    index: int
    payload: bytes
    connect: str | None  # the accept-version of the CONNECT sent first; "" for none
    wait_connected: bool
    half_close: bool
    chunked: bool


def fuzz_cases(rng: random.Random, queue: str) -> list[FuzzCase]:
    cases: list[FuzzCase] = []
    for i in range(FUZZ_RANDOM + FUZZ_MUTATED):
        if i < FUZZ_RANDOM:
            payload = random_payload(rng)
        else:
            frames = base_frames(rng, queue)
            chosen = [rng.choice(frames) for _ in range(rng.randrange(1, 4))]
            victim = rng.randrange(len(chosen))
            chosen[victim] = mutate(rng, chosen[victim])
            payload = b"".join(chosen)
        connect = rng.choice(["1.2", "1.2", "1.1", "1.0,1.1,1.2", None, ""])
        cases.append(FuzzCase(i, payload, connect, rng.random() < 0.5, rng.random() < 0.7,
                              rng.random() < 0.2))
    return cases


def run_fuzz_case(port: int, case: FuzzCase) -> tuple[str | None, str]:
    """(what went wrong or None, how the connection ended: for the summary)."""
    raw = RawClient(port)
    try:
        try:
            problem = fuzz_connection(raw, case)
            commands = [f.command for f in decode_server_bytes(raw.data)[0]]
        except FrameError as exc:
            return f"unparseable answer {raw.data[-300:]!r}: {exc}", "unparseable"
        ending = ("ERROR" if "ERROR" in commands else "closed" if raw.closed
                  else "left open")
        return problem, f"{ending} ({'CONNECTED' if 'CONNECTED' in commands else 'no CONNECTED'})"
    finally:
        raw.close(reset=not case.half_close and case.index % 2 == 0)


def fuzz_connection(raw: RawClient, case: FuzzCase) -> str | None:
    if case.connect != "":
        raw.send(connect_frame(case.connect))
        if case.wait_connected:
            raw.read(lambda: b"\0" in raw.data, 5)
    if case.chunked:  # the same bytes in small reads
        for at in range(0, len(case.payload), 7):
            if not raw.send(case.payload[at:at + 7]):
                break
    else:
        raw.send(case.payload)
    if case.half_close:
        with contextlib.suppress(OSError):
            raw.sock.shutdown(socket.SHUT_WR)
        raw.read_to_close(timeout=8)
        if not raw.closed:
            return "not closed within 8 s after the client's half-close"
    else:
        raw.read(lambda: b"ERROR" in raw.data, 0.3)
    frames, partial = decode_server_bytes(raw.data)
    errors = [i for i, f in enumerate(frames) if f.command == "ERROR"]
    if errors:
        if errors[0] != len(frames) - 1:
            return f"frames after the ERROR: {frames[errors[0]:]}"
        raw.read_to_close(timeout=8)
        if not raw.closed:
            return "not closed within 8 s after an ERROR"
        frames, partial = decode_server_bytes(raw.data)
        if frames[-1].command != "ERROR":
            return f"frames after the ERROR: {frames[errors[0]:]}"
    if raw.closed and not raw.reset and partial:
        return f"closed in the middle of a frame: {raw.data[-200:]!r}"
    return None


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_fuzz_random_and_mutated_frames(proxy: SidecarThread, healthy: HealthyClient,
                                        sidecar_log: pytest.LogCaptureFixture,
                                        mqguard_unique_name: str) -> None:
    # A fixed seed by default, so CI is reproducible and a red run means this change;
    # MQGUARD_FUZZ_SEED=random explores (the seed is printed), =<n> replays.
    chosen = os.environ.get("MQGUARD_FUZZ_SEED") or str(DEFAULT_FUZZ_SEED)
    seed = random.SystemRandom().randrange(2**32) if chosen == "random" else int(chosen)
    print(f"fuzz seed {seed} (replay: MQGUARD_FUZZ_SEED={seed})")
    cases = fuzz_cases(random.Random(seed), f"/queue/{mqguard_unique_name}-fuzz")
    with ThreadPoolExecutor(FUZZ_WORKERS) as pool:
        results = list(pool.map(lambda case: (case, *run_fuzz_case(proxy.port, case)), cases))
    print("fuzz connections by ending:", Counter(ending for _, _, ending in results))
    problems = [f"case {case.index} (connect={case.connect!r}, half_close={case.half_close}, "
                f"chunked={case.chunked}) payload {case.payload[:300]!r}: {problem}"
                for case, problem, _ in results if problem]
    assert not problems, f"seed {seed}: {len(problems)} problem(s):\n" + "\n".join(problems[:20])
    wait_for(lambda: sessions(proxy) == 1, 15, f"seed {seed}: the fuzz sessions to end")
    assert proxy._thread.is_alive(), f"seed {seed}: the sidecar's loop thread died"
    healthy.finish()
    healthy_round_trip(proxy.port, f"/queue/{mqguard_unique_name}-after")
    # ActiveMQ writes header values raw on STOMP 1.0 connections (1.0 has no escaping): a
    # fuzz SEND with an escaped LF in a header, delivered to a fuzz 1.0 session, reaches the
    # sidecar as a truly malformed frame. The sidecar ends that session with an ERROR
    # (checked per connection above); here only failures of the sidecar itself count.
    assert_no_sidecar_failure(sidecar_log, seed, broker_may_misframe=True)
