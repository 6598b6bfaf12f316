"""Connections that never finish their CONNECT cannot starve or exhaust the sidecar
(issue 21, defect 9), against REAL brokers, over loopback.

- A sustained flood of connections that send nothing holds at most
  ``max-pending-handshakes`` of the sidecar's ``max-connections``: a healthy client
  keeps doing round trips on fresh connections, and one connected before the flood
  keeps sending and receiving, throughout.
- An unfinished CONNECT is cut at ``max-handshake-frame-bytes`` (not at the 16 MiB
  ``max-frame-bytes``): 20 clients each sending 12 MiB of one CONNECT's body leave the
  sidecar process's resident memory where it was.
- A session's memory comes back as soon as it ends, without waiting for the cyclic
  garbage collector (whose young-generation threshold the sidecar raises, see
  mqguard/sidecar/gctune.py): no reference cycle keeps a session, its connections or
  their buffers alive.
"""

from __future__ import annotations

import contextlib
import gc
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqguard_tests.sidecar_process import SidecarProcess
from mqguard_tests.stomp_clients import HealthyClient, RawClient, healthy_round_trip

from mqguard.config import parse_config
from mqguard.servers import ServerHandle
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS_AND_LOOPS = [
    pytest.param("activemq", "asyncio", marks=pytest.mark.activemq, id="activemq-asyncio"),
    pytest.param("rabbitmq", "uvloop", marks=pytest.mark.rabbitmq, id="rabbitmq-uvloop"),
]


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    server: ServerHandle = request.getfixturevalue(f"mqguard_{request.param}_server")
    return server.urls["stomp"]


# -- (a) a flood of connections that never send CONNECT ------------------------------------

#: Idle connections the flood keeps open at once: more than max-connections.
FLOOD_OPEN = 160
#: How long the healthy clients do round trips during the flood.
FLOOD_SECONDS = 5.0
#: The flood stops by itself after this long, or this many connections, at the latest.
FLOOD_MAX_SECONDS = 30.0
FLOOD_TOTAL = 200_000


class IdleFlood:
    """Keeps ``FLOOD_OPEN`` connections open that never send a byte, replacing every one
    the sidecar closes, until stopped (or ``FLOOD_MAX_SECONDS``, ``FLOOD_TOTAL``)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened = 0
        self.closed_by_sidecar = 0
        self.errors_seen = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-flood", daemon=True)

    def __enter__(self) -> IdleFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        open_: list[socket.socket] = []
        deadline = time.monotonic() + FLOOD_MAX_SECONDS
        try:
            while (not self._stop.is_set() and time.monotonic() < deadline
                   and self.opened < FLOOD_TOTAL):
                while len(open_) < FLOOD_OPEN and self.opened < FLOOD_TOTAL:
                    try:
                        open_.append(socket.create_connection(("127.0.0.1", self.port), 2))
                    except OSError:
                        self.refused += 1
                        break
                    self.opened += 1
                readable, _, _ = select.select(open_, [], [], 0.01)
                for sock in readable:
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if b"ERROR" in data:
                        self.errors_seen += 1
                    if not data or b"ERROR" in data:
                        self.closed_by_sidecar += 1
                        open_.remove(sock)
                        sock.close()
        finally:
            for sock in open_:
                sock.close()


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS,
                         indirect=["broker_url"])
def test_idle_connection_flood_does_not_starve_clients(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    settings: dict[str, object] = {
        "max-connections": 96, "max-pending-handshakes": 32,
        # Far longer than the flood: only the handshake budget can make room.
        "connect-timeout-ms": 60_000, "drain-timeout-ms": 1000}
    with SidecarProcess(broker_url, tmp_path, event_loop=event_loop,
                        sidecar=settings) as sidecar:
        steady = HealthyClient(sidecar.port, f"/queue/{mqguard_unique_name}-steady", interval=0.02)
        failures: list[str] = []
        round_trips = 0
        try:
            with IdleFlood(sidecar.port) as flood:
                # Let the flood fill every slot it can before the first round trip.
                wait_for(lambda: flood.opened >= FLOOD_OPEN, 10, "the flood to open")
                time.sleep(0.5)
                deadline = time.monotonic() + FLOOD_SECONDS
                while time.monotonic() < deadline:
                    try:
                        healthy_round_trip(sidecar.port, f"/queue/{mqguard_unique_name}-rt")
                        round_trips += 1
                    except (AssertionError, OSError) as exc:
                        failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                    time.sleep(0.05)
                still_flooding = flood.running()
            steady.finish()
        finally:
            steady.stop()
        log = sidecar.log()
    print(f"flood: {flood.opened} connections opened, {flood.errors_seen} closed with an "
          f"ERROR; {round_trips} round trips, {len(failures)} failed")
    assert not failures, (f"{len(failures)} of {len(failures) + round_trips} round trips "
                          f"failed during the flood, e.g. {failures[:3]}")
    assert round_trips >= 10, round_trips
    # The flood did press: it had more connections open than max-connections, and the
    # sidecar made room by closing the oldest pending handshakes with an ERROR frame.
    assert still_flooding and flood.opened >= FLOOD_OPEN and flood.errors_seen > 0, vars(flood)
    assert "Traceback" not in log, log[-3000:]


# -- (b) unfinished CONNECTs that grow --------------------------------------------------------

BIG_CONNECTS = 20
BIG_CONNECT_BYTES = 12 * 1024 * 1024
CHUNK = 256 * 1024


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS,
                         indirect=["broker_url"])
def test_unfinished_connects_are_cut_at_the_handshake_limit(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    # Default limits (max-frame-bytes 16 MiB); a connect timeout longer than the test.
    with SidecarProcess(broker_url, tmp_path, event_loop=event_loop,
                        sidecar={"connect-timeout-ms": 60_000}) as sidecar:
        queue = f"/queue/{mqguard_unique_name}"
        healthy_round_trip(sidecar.port, queue)
        baseline = sidecar.rss_mib()
        # One CONNECT a little over the limit, then the client waits: it gets an ERROR.
        probe = RawClient(sidecar.port)
        probe.send(b"CONNECT\naccept-version:1.2\nhost:/\ncontent-length:90000\n\n"
                   + b"p" * (80 * 1024))
        probe.read_to_close(timeout=5)
        probe_frames = probe.frames()
        probe.close()
        # Twenty that keep growing, all at once.
        socks = [socket.create_connection(("127.0.0.1", sidecar.port), 5)
                 for _ in range(BIG_CONNECTS)]
        sent = [0] * BIG_CONNECTS
        cut = [False] * BIG_CONNECTS
        peak = baseline
        try:
            for sock in socks:
                sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\n"
                             b"content-length:%d\n\n" % (BIG_CONNECT_BYTES + 1))
            while not all(cut) and min(sent) < BIG_CONNECT_BYTES:
                for i, sock in enumerate(socks):
                    if cut[i] or sent[i] >= BIG_CONNECT_BYTES:
                        continue
                    try:
                        sock.sendall(b"a" * CHUNK)
                        sent[i] += CHUNK
                    except OSError:  # reset or timed out: the sidecar no longer reads it
                        cut[i] = True
                peak = max(peak, sidecar.rss_mib())
                # A healthy client is served throughout.
                healthy_round_trip(sidecar.port, queue)
            peak = max(peak, sidecar.rss_mib())
        finally:
            for sock in socks:
                sock.close()
        healthy_round_trip(sidecar.port, queue)
    print(f"sidecar RSS: {baseline:.0f} MiB before, peak {peak:.0f} MiB")
    assert [f.command for f in probe_frames] == ["ERROR"], probe_frames
    assert "too large" in (probe_frames[0].get("message") or ""), probe_frames
    assert all(cut), f"sent per connection: {sent}"
    assert max(sent) <= 4 * 1024 * 1024, f"sent per connection before the cut: {sent}"
    assert peak - baseline < 48, f"RSS {baseline:.0f} MiB -> peak {peak:.0f} MiB"


# -- memory comes back when sessions end ---------------------------------------------------

BIG_SENDS = 20
BIG_SEND_BYTES = 12 * 1024 * 1024


def unfinished_sends(port: int, queue: str) -> None:
    """``BIG_SENDS`` connected clients each send 12 MiB of a SEND and vanish before its end."""
    clients = [RawClient(port) for _ in range(BIG_SENDS)]
    try:
        for raw in clients:
            raw.connect()
            raw.send(f"SEND\ndestination:{queue}\ncontent-length:{BIG_SEND_BYTES + 1}\n\n"
                     .encode())
        for _ in range(BIG_SEND_BYTES // CHUNK):
            for raw in clients:
                assert raw.send(b"s" * CHUNK), "the sidecar closed a connection mid-SEND"
    finally:
        for raw in clients:
            raw.close(reset=True)


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS,
                         indirect=["broker_url"])
def test_resident_memory_comes_back_when_sessions_end(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """The sidecar as ``mqguard sidecar`` runs it (raised collector threshold): twice 20
    sessions end in the middle of a 12 MiB SEND; what they held is returned at once."""
    queue = f"/queue/{mqguard_unique_name}"
    with SidecarProcess(broker_url, tmp_path, event_loop=event_loop,
                        sidecar={"drain-timeout-ms": 500}) as sidecar:
        for _ in range(5):
            healthy_round_trip(sidecar.port, queue)
        baseline_fds = sidecar.open_fds()
        baseline = sidecar.rss_mib()
        after: list[float] = []
        for _ in range(2):
            unfinished_sends(sidecar.port, queue)
            # Ended: their descriptors are closed.
            wait_for(lambda: sidecar.open_fds() <= baseline_fds, 15, "the sessions to end")
            time.sleep(0.5)
            after.append(sidecar.rss_mib())
        healthy_round_trip(sidecar.port, queue)
    print(f"sidecar RSS: {baseline:.0f} MiB before, {[round(r) for r in after]} MiB after "
          "each burst")
    assert all(rss - baseline < 64 for rss in after), (
        f"RSS {baseline:.0f} MiB before, {[round(r) for r in after]} MiB after each burst")

@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Only reference counting frees memory meanwhile (as under the sidecar's raised
    young-generation threshold, for a while)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS,
                         indirect=["broker_url"])
def test_ended_sessions_are_freed_without_the_cyclic_collector(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    config = parse_config({"mqguard": {
        "node-id": "handshake-flood-test", "message-expiry-scan-period": -1,
        "event-log": {"directory": str(tmp_path / "events")},
        "sidecar": {"connect-timeout-ms": 500, "drain-timeout-ms": 500}}})
    queue = f"/queue/{mqguard_unique_name}"
    with SidecarThread(Sidecar(config, parse_upstream(broker_url)),
                       event_loop=event_loop) as proxy:
        sidecar = proxy.sidecar
        healthy_round_trip(proxy.port, queue)  # warm: imports, caches
        wait_for(lambda: not sidecar.sessions, 5, "the warm-up session to end")

        def session_refs(raw: RawClient) -> list[weakref.ref[object]]:
            wait_for(lambda: len(sidecar.sessions) == 1, 5, "the session to start")
            session = next(iter(sidecar.sessions))
            refs: list[weakref.ref[object]] = [weakref.ref(session),
                                               weakref.ref(session._client)]
            del session
            return refs

        cases: dict[str, list[weakref.ref[object]]] = {}
        with collector_off():
            # 1. A whole session: CONNECT, SUBSCRIBE, SEND, MESSAGE, DISCONNECT.
            raw = RawClient(proxy.port)
            raw.connect()
            cases["round trip"] = session_refs(raw)
            raw.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:client-individual\n\n\0"
                     .encode())
            raw.send(f"SEND\ndestination:{queue}\nreceipt:r1\n\nkept\0".encode())
            raw.read_frames(lambda got: any(f.command == "MESSAGE" for f in got))
            raw.send(b"DISCONNECT\nreceipt:bye\n\n\0")
            raw.read_to_close()
            raw.close()
            # 2. Connected, then 3 MiB of an unfinished SEND, then the client vanishes.
            raw = RawClient(proxy.port)
            raw.connect()
            cases["unfinished SEND"] = session_refs(raw)
            raw.send(f"SEND\ndestination:{queue}\n\n".encode() + b"b" * (3 << 20))
            time.sleep(0.3)
            raw.close(reset=True)
            # 3. No CONNECT at all: ended by the connect timeout.
            raw = RawClient(proxy.port)
            raw.send(b"CONNECT\naccept-version:1.2\nx-pad:" + b"c" * 4000)
            cases["connect timeout"] = session_refs(raw)
            raw.read_to_close(timeout=5)
            raw.close()
            wait_for(lambda: not sidecar.sessions and not sidecar._tasks, 10,
                     "every session to end")
            time.sleep(0.3)  # the transports' connection_lost callbacks
            alive = {name: [ref() is not None for ref in refs]
                     for name, refs in cases.items()}
        # Drain what the unacknowledged message left behind.
        raw = RawClient(proxy.port)
        raw.connect()
        raw.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nack:auto\n\n\0".encode())
        raw.read_frames(lambda got: any(f.command == "MESSAGE" for f in got))
        raw.close()
    assert not any(any(flags) for flags in alive.values()), (
        f"still alive after the session ended, [session, client connection]: {alive}")
