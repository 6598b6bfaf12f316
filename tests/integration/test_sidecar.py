"""Unmodified stomp.py clients through the sidecar, against REAL ActiveMQ and RabbitMQ.

Each guarantee of issue 6 is shown end to end: duplicate rejected, a transaction
with a duplicate fails, a poison message reaches the dead-letter address, an
expired message reaches the expiry address, a duplicate delivery is suppressed.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
import stomp.exception  # type: ignore[import-untyped]

from mqguard.config import parse_config
from mqguard.events import read_events
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    now_ms,
)
from mqguard.reaper import DEFAULT_HOLDING_QUEUE
from mqguard.servers.rabbitmq import rabbitmqctl
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]


class Client(stomp.ConnectionListener):  # type: ignore[misc]
    """A plain stomp.py 1.2 client that records what it receives."""

    def __init__(self, port: int) -> None:
        self.messages: list[Any] = []
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.lock = threading.Lock()
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/",
                                       heartbeats=(1000, 1000))
        self.conn.set_listener("client", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.messages.append(frame)

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def bodies(self) -> list[str]:
        with self.lock:
            return [frame.body for frame in self.messages]

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> tuple[str, Any]:
    kind = request.param
    return kind, request.getfixturevalue(f"mqguard_{kind}_server")


def sidecar_config(tmp_path: Path, **address: Any) -> Any:
    return parse_config({
        "mqguard": {"node-id": "sidecar-test", "message-expiry-scan-period": 300,
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20}},
        "address-settings": {"#": {"auto-create-dead-letter-resources": True,
                                   "auto-create-expiry-resources": True, **address}},
    })


@pytest.fixture
def proxy(broker: tuple[str, Any], tmp_path: Path, request: pytest.FixtureRequest
          ) -> Iterator[SidecarThread]:
    settings = getattr(request, "param", {})
    config = sidecar_config(tmp_path, **settings)
    sidecar = Sidecar(config, parse_upstream(broker[1].urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        yield running


@pytest.fixture
def clients(proxy: SidecarThread) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


def connect(proxy: SidecarThread, clients: list[Client]) -> Client:
    client = Client(proxy.port)
    clients.append(client)
    return client


def events(tmp_path: Path, proxy: SidecarThread) -> list[dict[str, Any]]:
    proxy.sidecar.guard.events.flush()
    return list(read_events(tmp_path / "events"))


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_round_trip_keeps_headers_bodies_and_order(proxy: SidecarThread,
                                                   clients: list[Client], tmp_path: Path,
                                                   mqguard_unique_name: str) -> None:
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    for i in range(30):
        client.conn.send(queue, f"body-{i}", headers={"app": f"v{i}"}, receipt=f"r{i}")
    wait_for(lambda: len(client.receipts) == 30, 10, "30 receipts")
    assert client.receipts == [f"r{i}" for i in range(30)], "receipts out of order"
    client.conn.subscribe(queue, id="s", ack="client-individual")
    wait_for(lambda: len(client.messages) == 30, 15, "30 messages")
    assert client.bodies() == [f"body-{i}" for i in range(30)]
    assert [f.headers["app"] for f in client.messages] == [f"v{i}" for i in range(30)]
    # RabbitMQ echoes a SEND's receipt header: the sidecar's own ids never show.
    assert not [f for f in client.messages
                if f.headers.get("receipt", "").startswith("mqguard-")]
    for frame in client.messages:
        client.conn.ack(frame.headers["ack"], receipt=None)
    client.conn.disconnect(receipt="bye")
    totals = Counter(e["type"] for e in events(tmp_path, proxy))
    assert (totals["sent"], totals["delivered"], totals["acked"]) == (30, 30, 30)


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_duplicate_send_is_not_routed_but_receipted(proxy: SidecarThread,
                                                    clients: list[Client], tmp_path: Path,
                                                    mqguard_unique_name: str) -> None:
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    for i, dup in enumerate(["a", "b", "a", "a", "c"]):
        client.conn.send(queue, f"{dup}-{i}", headers={"_AMQ_DUPL_ID": dup}, receipt=f"r{i}")
    wait_for(lambda: len(client.receipts) == 5, 10, "every receipt, duplicates' too")
    assert client.receipts == [f"r{i}" for i in range(5)]
    client.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: len(client.messages) == 3, 10, "the three originals")
    time.sleep(0.5)
    assert client.bodies() == ["a-0", "b-1", "c-4"]
    rejected = [e for e in events(tmp_path, proxy) if e["type"] == "duplicate_rejected"]
    assert len(rejected) == 2 and {e.get("duplicate_id") for e in rejected} == {"a"}


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_transaction_with_a_duplicate_fails_and_sends_nothing(
        proxy: SidecarThread, clients: list[Client], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    first = connect(proxy, clients)
    first.conn.send(queue, "seed", headers={"_AMQ_DUPL_ID": "seen"}, receipt="seed")
    tx = first.conn.begin()
    first.conn.send(queue, "in-tx-new", headers={"_AMQ_DUPL_ID": "fresh"}, transaction=tx)
    first.conn.send(queue, "in-tx-dup", headers={"_AMQ_DUPL_ID": "seen"}, transaction=tx)
    first.conn.commit(tx, receipt="commit")
    wait_for(lambda: first.errors, 10, "the ERROR answering COMMIT")
    error = first.errors[0]
    assert error.headers.get("receipt-id") == "commit"
    assert "DUPLICATE_ID_REJECTED" in error.headers["message"]
    assert "commit" not in first.receipts
    # A clean transaction and an aborted one on a new connection.
    second = connect(proxy, clients)
    tx = second.conn.begin()
    second.conn.send(queue, "committed", headers={"_AMQ_DUPL_ID": "ok"}, transaction=tx)
    second.conn.commit(tx, receipt="c2")
    tx = second.conn.begin()
    second.conn.send(queue, "aborted", headers={"_AMQ_DUPL_ID": "gone"}, transaction=tx)
    second.conn.abort(tx, receipt="a2")
    wait_for(lambda: {"c2", "a2"} <= set(second.receipts), 10, "commit and abort receipts")
    second.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: len(second.messages) == 2, 10, "seed and committed")
    time.sleep(0.5)
    assert second.bodies() == ["seed", "committed"]
    # The ids of the failed and the aborted transactions were never added.
    second.conn.send(queue, "fresh-again", headers={"_AMQ_DUPL_ID": "fresh"}, receipt="f")
    second.conn.send(queue, "gone-again", headers={"_AMQ_DUPL_ID": "gone"}, receipt="g")
    wait_for(lambda: len(second.messages) == 4, 10, "ids of rolled back transactions usable")
    totals = Counter(e["type"] for e in events(tmp_path, proxy))
    assert totals["tx_rolled_back"] == 2 and totals["tx_committed"] == 1


@pytest.mark.parametrize("proxy", [{"max-delivery-attempts": 3}], indirect=True)
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_poison_message_goes_to_the_dead_letter_address(
        proxy: SidecarThread, clients: list[Client], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    client.conn.send(queue, "poison", receipt="p")
    client.conn.send(queue, "healthy", receipt="h")
    client.conn.subscribe(queue, id="s", ack="client-individual")
    handled: list[str] = []
    deadline = time.monotonic() + 20
    seen = 0
    while handled.count("poison") < 3 or "healthy" not in handled:
        assert time.monotonic() < deadline, f"deliveries so far: {handled}"
        with client.lock:
            fresh = client.messages[seen:]
        for frame in fresh:
            seen += 1
            handled.append(frame.body)
            if frame.body == "poison":
                client.conn.nack(frame.headers["ack"])
            else:
                client.conn.ack(frame.headers["ack"])
        time.sleep(0.02)
    dlq = connect(proxy, clients)
    dlq.conn.subscribe(f"/queue/DLQ.{mqguard_unique_name}", id="d", ack="client-individual")
    wait_for(lambda: dlq.messages, 15, "the dead letter")
    time.sleep(0.5)
    assert handled.count("poison") == 3, handled  # max-delivery-attempts, then no more
    (dead,) = dlq.messages
    assert dead.body == "poison"
    assert dead.headers[ORIG_ADDRESS_HEADER] == mqguard_unique_name
    dead_lettered = [e for e in events(tmp_path, proxy) if e["type"] == "dead_lettered"]
    assert len(dead_lettered) == 1
    assert dead.headers[ORIG_MESSAGE_ID_HEADER] == dead_lettered[0]["message_id"]


@pytest.mark.parametrize("broker", BROKERS[:1], indirect=True)
def test_expired_message_goes_to_the_expiry_address_activemq(
        proxy: SidecarThread, clients: list[Client], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """At delivery: it expired while waiting in the queue; the client never sees it."""
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    client.conn.send(queue, "short", headers={"expires": str(now_ms() + 200)}, receipt="s")
    client.conn.send(queue, "long", headers={"expires": str(now_ms() + 60_000)}, receipt="l")
    client.conn.send(queue, "none", receipt="n")
    wait_for(lambda: len(client.receipts) == 3, 10, "receipts")
    time.sleep(0.5)
    client.conn.subscribe(queue, id="s", ack="client-individual")
    wait_for(lambda: len(client.messages) == 2, 10, "the unexpired")
    assert client.bodies() == ["long", "none"]
    check_expiry_copy(proxy, clients, mqguard_unique_name)


@pytest.mark.parametrize("broker", BROKERS[1:], indirect=True)
def test_expired_message_goes_to_the_expiry_address_rabbitmq(
        proxy: SidecarThread, clients: list[Client], broker: tuple[str, Any],
        mqguard_unique_name: str) -> None:
    """At rest: RabbitMQ expires it (native TTL, dead-lettered by a policy); the sidecar's
    reaper routes it on to the expiry address."""
    client = connect(proxy, clients)
    # The holding queue must exist before RabbitMQ dead-letters into it.
    client.conn.subscribe(f"/queue/{DEFAULT_HOLDING_QUEUE}", id="h", ack="client-individual")
    client.conn.unsubscribe("h")
    rabbitmqctl(broker[1], "set_policy", "--apply-to", "queues", f"exp-{mqguard_unique_name}",
                f"^{mqguard_unique_name}$", json.dumps({"dead-letter-exchange": "",
                                                "dead-letter-routing-key":
                                                    DEFAULT_HOLDING_QUEUE}))
    queue = f"/queue/{mqguard_unique_name}"
    client.conn.send(queue, "short", headers={"expires": str(now_ms() + 200)}, receipt="s")
    client.conn.send(queue, "none", receipt="n")
    wait_for(lambda: len(client.receipts) == 2, 10, "receipts")
    check_expiry_copy(proxy, clients, mqguard_unique_name)
    client.conn.subscribe(queue, id="s", ack="client-individual")
    wait_for(lambda: client.messages, 10, "the unexpired one")
    time.sleep(0.3)
    assert client.bodies() == ["none"]


def check_expiry_copy(proxy: SidecarThread, clients: list[Client], queue: str) -> None:
    inbox = connect(proxy, clients)
    inbox.conn.subscribe(f"/queue/EXP.{queue}", id="e", ack="client-individual")
    wait_for(lambda: inbox.messages, 15, "the expiry copy")
    time.sleep(0.3)
    (copy,) = inbox.messages
    assert copy.body == "short"
    assert copy.headers[ORIG_ADDRESS_HEADER] == queue
    assert int(copy.headers[ACTUAL_EXPIRY_HEADER]) > 0


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_duplicate_delivery_is_suppressed(proxy: SidecarThread, clients: list[Client],
                                          tmp_path: Path, mqguard_unique_name: str) -> None:
    """The same producer sequence twice (a producer's resend after a failover, say):
    the consumer audit hands it to the client once and acknowledges the copy."""
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    stamp = {"mqguard-producer": "failover-producer"}
    for seq, body in [(1, "one"), (2, "two"), (2, "two-again"), (3, "three")]:
        client.conn.send(queue, body, headers={**stamp, "mqguard-seq": str(seq)},
                         receipt=body)
    wait_for(lambda: len(client.receipts) == 4, 10, "receipts")
    # One at a time, each acked as it is handled: the audit marks a sequence as handled
    # at the client's ACK, so a copy arriving before that ACK would still be delivered.
    client.on_message = lambda frame: (client.messages.append(frame),  # type: ignore[method-assign]
                                       client.conn.ack(frame.headers["ack"]))
    client.conn.subscribe(queue, id="s", ack="client-individual",
                          headers={"activemq.prefetchSize": "1", "prefetch-count": "1"})
    wait_for(lambda: len(client.messages) == 3, 10, "three deliveries")
    time.sleep(0.5)
    assert client.bodies() == ["one", "two", "three"]
    suppressed = [e for e in events(tmp_path, proxy)
                  if e["type"] == "duplicate_delivery_suppressed"]
    assert len(suppressed) == 1


@pytest.mark.parametrize("broker", BROKERS[:1], indirect=True)
def test_admin_port_serves_health_and_metrics(proxy: SidecarThread,
                                              clients: list[Client],
                                              mqguard_unique_name: str) -> None:
    client = connect(proxy, clients)
    client.conn.send(f"/queue/{mqguard_unique_name}", "x", receipt="x")
    wait_for(lambda: client.receipts, 10, "receipt")
    base = f"http://127.0.0.1:{proxy.admin_port}"
    health = json.loads(urllib.request.urlopen(f"{base}/health", timeout=5).read())
    assert health["status"] == "ok" and health["connections"] == 1
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    assert 'mqguard_sidecar_frames_total{command="SEND",direction="client"} 1.0' in metrics
    assert 'mqguard_sidecar_messages_total{path="send",verdict="continue"} 1.0' in metrics
    assert "mqguard_sidecar_guard_seconds_bucket" in metrics


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_heart_beats_flow_through_both_legs(proxy: SidecarThread, clients: list[Client],
                                            mqguard_unique_name: str) -> None:
    """Negotiated end to end (the CONNECT's heart-beat header passes through): an idle
    client stays connected for many intervals because beats flow both ways."""
    client = connect(proxy, clients)
    disconnects: list[str] = []
    client.on_disconnected = lambda: disconnects.append("lost")  # type: ignore[method-assign]
    client.on_heartbeat_timeout = lambda: disconnects.append("timeout")  # type: ignore[method-assign]
    time.sleep(4.0)  # four 1 s intervals without a frame
    assert disconnects == [] and client.conn.is_connected()
    client.conn.send(f"/queue/{mqguard_unique_name}", "after-idle", receipt="r")
    wait_for(lambda: client.receipts == ["r"], 10, "receipt after the idle time")


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.parametrize("broker", BROKERS[:1], indirect=True)
def test_tls_on_both_legs(broker: tuple[str, Any], tmp_path: Path,
                          mqguard_unique_name: str) -> None:
    """Client --TLS--> sidecar A --> broker, and client --> sidecar B --TLS--> sidecar A:
    the client leg and the upstream leg over TLS, certificates verified."""
    cert, key = make_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(cert), str(key))
    config = parse_config({"mqguard": {"message-expiry-scan-period": -1,
                                       "event-log": {"enabled": False}}})
    front = Sidecar(config, parse_upstream(broker[1].urls["stomp"]), tls=server_tls,
                    tls_files=(str(cert), str(key)))
    with SidecarThread(front) as tls_proxy:
        conn = stomp.Connection12([("127.0.0.1", tls_proxy.port)], vhost="/")
        conn.set_ssl(for_hosts=[("127.0.0.1", tls_proxy.port)], ca_certs=str(cert))
        got: list[str] = []
        listener = stomp.ConnectionListener()
        listener.on_message = lambda frame: got.append(frame.body)  # type: ignore[method-assign]
        conn.set_listener("l", listener)
        conn.connect("guest", "guest", wait=True)
        conn.subscribe(f"/queue/{mqguard_unique_name}", id="s", ack="auto")
        chained = Sidecar(config, parse_upstream(f"stomp+ssl://127.0.0.1:{tls_proxy.port}",
                                                 cafile=str(cert)))
        with SidecarThread(chained) as plain_proxy:
            sender = Client(plain_proxy.port)
            sender.conn.send(f"/queue/{mqguard_unique_name}", "over TLS", receipt="t")
            wait_for(lambda: sender.receipts == ["t"], 10, "receipt through both sidecars")
            wait_for(lambda: got == ["over TLS"], 10, "the message over TLS")
            sender.close()
        conn.disconnect()
        untrusted = Sidecar(config, parse_upstream(f"stomp+ssl://127.0.0.1:{tls_proxy.port}"))
        with SidecarThread(untrusted) as bad_proxy:
            with pytest.raises(stomp.exception.ConnectFailedException):
                Client(bad_proxy.port)  # the CA is not trusted: the upstream leg refuses


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_disconnect_right_after_sends_loses_no_confirmation(
        proxy: SidecarThread, clients: list[Client], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """DISCONNECT straight after 50 unconfirmed SENDs: the sidecar holds it until the broker
    confirmed them (RabbitMQ may answer a DISCONNECT first), so every send is recorded as
    sent, none as an unknown outcome."""
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    for i in range(50):
        client.conn.send(queue, f"m{i}")
    client.conn.disconnect(receipt="bye")
    reader = connect(proxy, clients)
    reader.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: len(reader.messages) == 50, 15, "all 50")
    kinds = Counter(e["type"] for e in events(tmp_path, proxy))
    assert (kinds["sent"], kinds["send_failed"]) == (50, 0)


def _open_sockets() -> int:
    """Sockets open in this process (the in-process sidecar's included)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
    return count


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_confirmed_sends_recorded_and_session_end_closes_everything(
        proxy: SidecarThread, clients: list[Client], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """The "sent" bookkeeping runs after the client's RECEIPTs are written (one batch per
    broker read): every confirmed SEND still gets its event. And a session leaves no
    socket behind: both of its legs are closed when it ends."""
    before = _open_sockets()
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    for i in range(40):
        client.conn.send(queue, f"m-{i}", receipt=f"r{i}")
    wait_for(lambda: len(client.receipts) == 40, 10, "40 receipts")
    assert client.receipts == [f"r{i}" for i in range(40)]
    wait_for(lambda: len([e for e in events(tmp_path, proxy) if e["type"] == "sent"]) == 40,
             5, "a sent event per confirmed SEND")
    sent = [e for e in events(tmp_path, proxy) if e["type"] == "sent"]
    assert len({e["message_id"] for e in sent}) == 40
    assert _open_sockets() >= before + 3  # the client's, and the session's two legs
    client.conn.disconnect(receipt="bye")
    wait_for(lambda: not proxy.sidecar.sessions, 10, "the session to end")
    wait_for(lambda: _open_sockets() <= before, 10, "the session's sockets to close")
