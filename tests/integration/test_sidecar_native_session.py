"""The sidecar's sessions in the native runtime (docs/sidecar.md, "Data plane"), the
guard called once per read batch. Real ActiveMQ and RabbitMQ, stock stomp.py clients:
receipts in order, a repeated ``_AMQ_DUPL_ID`` rejected, delivery
counting to a dead letter, the DISCONNECT held until earlier receipts are in, a malformed
frame answered with an ERROR with nothing lost, a transaction with a duplicate refused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.stomp_clients import RecordingClient

from mqguard.config import parse_config
from mqguard.events import read_events
from mqguard.servers.handle import ServerHandle
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [pytest.param("activemq", marks=pytest.mark.activemq),
           pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> ServerHandle:
    server: ServerHandle = request.getfixturevalue(f"mqguard_{request.param}_server")
    return server


@pytest.fixture
def proxy(broker: ServerHandle, tmp_path: Path) -> Iterator[SidecarThread]:
    config = parse_config({
        "mqguard": {"node-id": "native-session-test", "message-expiry-scan-period": -1,
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20}},
        "address-settings": {"#": {"auto-create-dead-letter-resources": True,
                                   "max-delivery-attempts": 3}},
    })
    sidecar = Sidecar(config, parse_upstream(broker.urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        assert running.sidecar.native_sessions is not None
        yield running


@pytest.fixture
def clients(proxy: SidecarThread) -> Iterator[list[RecordingClient]]:
    made: list[RecordingClient] = []
    yield made
    for client in made:
        client.close()


def connect(proxy: SidecarThread, clients: list[RecordingClient]) -> RecordingClient:
    client = RecordingClient(proxy.port)
    clients.append(client)
    return client


def events(tmp_path: Path, proxy: SidecarThread) -> list[dict[str, Any]]:
    proxy.sidecar.guard.events.flush()
    return list(read_events(tmp_path / "events"))


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_receipts_in_order_and_a_repeated_duplicate_id_rejected(
        proxy: SidecarThread, clients: list[RecordingClient], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy, clients)
    for i in range(100):
        producer.conn.send(queue, f"m{i}", headers={"_AMQ_DUPL_ID": f"d{i}"},
                           receipt=f"r{i}")
    producer.conn.send(queue, "again", headers={"_AMQ_DUPL_ID": "d7"}, receipt="dup")
    producer.conn.send(queue, "last", receipt="last")
    wait_for(lambda: len(producer.receipts) == 102, 20, "a receipt per SEND")
    # The duplicate's receipt is the sidecar's own, yet it comes in its place.
    assert producer.receipts == [*(f"r{i}" for i in range(100)), "dup", "last"]
    consumer = connect(proxy, clients)
    consumer.conn.subscribe(queue, id="s", ack="client")
    wait_for(lambda: len(consumer.messages) == 101, 20, "every message but the duplicate")
    assert consumer.bodies() == [*(f"m{i}" for i in range(100)), "last"]
    # One cumulative ACK (client mode) settles all of them.
    consumer.conn.ack(consumer.messages[-1].headers["ack"], receipt="acked")
    wait_for(lambda: consumer.receipts == ["acked"], 10, "the ACK's receipt")
    wait_for(lambda: sum(e["type"] == "acked" for e in events(tmp_path, proxy)) == 101, 10,
             "an acked event per delivery")
    totals: dict[str, int] = {}
    for event in events(tmp_path, proxy):
        totals[event["type"]] = totals.get(event["type"], 0) + 1
    assert totals["duplicate_rejected"] == 1, totals
    assert totals["sent"] == 101 and totals["acked"] == 101, totals
    consumer.close()
    again = connect(proxy, clients)
    again.conn.subscribe(queue, id="s2", ack="auto")
    time.sleep(1.0)
    assert again.messages == []  # all acknowledged: nothing comes back


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_nacked_message_is_counted_to_the_dead_letter_address(
        proxy: SidecarThread, clients: list[RecordingClient], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    client = connect(proxy, clients)
    queue = f"/queue/{mqguard_unique_name}"
    client.conn.send(queue, "poison", receipt="p")
    client.conn.send(queue, "healthy", receipt="h")
    client.conn.subscribe(queue, id="s", ack="client-individual")
    handled: list[str] = []
    deadline = time.monotonic() + 30
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
    assert [frame.body for frame in dlq.messages] == ["poison"]
    dead = [e for e in events(tmp_path, proxy) if e["type"] == "dead_lettered"]
    assert len(dead) == 1


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_disconnect_waits_for_the_receipts_before_it(
        proxy: SidecarThread, clients: list[RecordingClient], tmp_path: Path,
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    client = connect(proxy, clients)
    for i in range(300):
        client.conn.send(queue, f"m{i}", receipt=f"r{i}")
    client.conn.disconnect(receipt="bye")  # right behind the SENDs, no wait in between
    assert client.receipts[-1] == "bye"
    assert client.receipts == [*(f"r{i}" for i in range(300)), "bye"]
    # The "sent" bookkeeping follows the receipts (it is off the client's path).
    wait_for(lambda: sum(e["type"] == "sent" for e in events(tmp_path, proxy)) == 300, 10,
             "a sent event per SEND")
    assert not [e for e in events(tmp_path, proxy) if e["type"] == "send_failed"]
    consumer = connect(proxy, clients)
    consumer.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: len(consumer.messages) == 300, 20, "all 300 messages")


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_malformed_frame_gets_an_error_and_nothing_is_lost(
        proxy: SidecarThread, clients: list[RecordingClient], mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw:
        raw.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        got = b""
        while b"CONNECTED" not in got or b"\0" not in got:
            got += raw.recv(65536)
        frames = b"".join(b"SEND\ndestination:%s\nreceipt:r%d\n\nbody-%d\0"
                          % (queue.encode(), i, i) for i in range(5))
        raw.sendall(frames + b"SEND\ndestination:x\nbad header line\n\n\0")
        answer = b""
        raw.settimeout(10)
        while True:
            chunk = raw.recv(65536)
            if not chunk:
                break
            answer += chunk
    text = answer.decode(errors="replace")
    receipts = [line.split(":", 1)[1] for line in text.split("\n")
                if line.startswith("receipt-id:")]
    assert receipts == [f"r{i}" for i in range(5)], text
    assert text.rstrip("\0\n").split("\0")[-1].lstrip("\n").startswith("ERROR\n"), text
    consumer = connect(proxy, clients)
    consumer.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: len(consumer.messages) == 5, 15, "the five messages before the bad frame")
    assert consumer.bodies() == [f"body-{i}" for i in range(5)]


@pytest.mark.parametrize("broker", BROKERS[:1], indirect=True)
def test_transaction_with_a_duplicate_is_refused_at_commit(
        proxy: SidecarThread, clients: list[RecordingClient], mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    client = connect(proxy, clients)
    client.conn.send(queue, "seed", headers={"_AMQ_DUPL_ID": "seen"}, receipt="seed")
    tx = client.conn.begin()
    client.conn.send(queue, "in-tx", headers={"_AMQ_DUPL_ID": "new"}, transaction=tx)
    client.conn.send(queue, "dup", headers={"_AMQ_DUPL_ID": "seen"}, transaction=tx)
    client.conn.commit(tx, receipt="commit")
    wait_for(lambda: client.errors, 10, "the ERROR answering COMMIT")
    assert client.errors[0].headers.get("receipt-id") == "commit"
    consumer = connect(proxy, clients)
    consumer.conn.subscribe(queue, id="s", ack="auto")
    wait_for(lambda: consumer.messages, 10, "the seed")
    time.sleep(0.5)
    assert consumer.bodies() == ["seed"]  # nothing of the transaction was sent

