"""Graceful drain of ``mqguard sidecar`` on SIGTERM, against REAL brokers.

Each connected client is told with an ERROR ("the sidecar is shutting down; reconnect")
after the receipts owed to it, and its connection is closed; what the sidecar already
took from it is settled with the broker before the broker connection goes: an ACK sent
before the signal is the broker's (the message does not come back), a delivery not
acknowledged goes back to the queue (it comes back, not lost), a confirmed SEND is
recorded as sent. The process exits 0 within the drain timeout and a few seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mqguard_tests.sidecar_process import SidecarProcess
from mqguard_tests.stomp_clients import RawClient

from mqguard.events import read_events
from mqguard.servers import ServerHandle

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]

DRAIN_MS = 2000


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> ServerHandle:
    server: ServerHandle = request.getfixturevalue(f"mqguard_{request.param}_server")
    return server


def broker_port(server: ServerHandle) -> int:
    return int(server.urls["stomp"].rsplit(":", 1)[1].strip("/"))


def bodies_left(server: ServerHandle, queue: str, wait: float = 2.0) -> list[bytes]:
    """Every message still on ``queue``, consumed straight from the broker."""
    raw = RawClient(broker_port(server))
    try:
        raw.connect()
        raw.send(f"SUBSCRIBE\nid:d\ndestination:{queue}\nack:auto\n\n\0".encode())
        raw.read(lambda: False, wait)
        return [f.body for f in raw.frames() if f.command == "MESSAGE"]
    finally:
        raw.close()


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_sigterm_tells_each_client_and_settles_what_it_took(
        broker: ServerHandle, tmp_path: Path, mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    with SidecarProcess(broker.urls["stomp"], tmp_path,
                        sidecar={"drain-timeout-ms": DRAIN_MS}) as sidecar:
        consumer = RawClient(sidecar.port)
        consumer.connect()
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:{queue}\nack:client-individual\n"
                      f"receipt:sub\n\n\0".encode())
        consumer.read_frames(lambda got: any(f.get("receipt-id") == "sub" for f in got))
        producer = RawClient(sidecar.port)
        producer.connect()
        for body in ("acked", "unacked"):
            producer.send(f"SEND\ndestination:{queue}\nreceipt:{body}\n\n{body}\0".encode())
        producer.read_frames(lambda got: [f.get("receipt-id") for f in got]
                             == ["acked", "unacked"])
        got = consumer.read_frames(
            lambda got: len([f for f in got if f.command == "MESSAGE"]) == 2)
        acked = next(f for f in got if f.body == b"acked")
        # No receipt asked: the sidecar owes the client nothing for it, yet the broker
        # must have it before the connection goes.
        consumer.send(f"ACK\nid:{acked.get('ack')}\n\n\0".encode())
        time.sleep(0.5)
        started = time.monotonic()
        assert sidecar.stop() == 0
        took = time.monotonic() - started
        log = sidecar.log()
        for client in (consumer, producer):
            client.read_to_close(timeout=5)
            assert client.closed, "the sidecar kept a client's connection open"
            frames = client.frames()
            errors = [f for f in frames if f.command == "ERROR"]
            assert [f.get("message") for f in errors] == [
                "the sidecar is shutting down; reconnect"], frames
            assert frames[-1].command == "ERROR", "nothing may follow the ERROR"
            client.close()
    assert took < DRAIN_MS / 1000 + 5, f"stopping took {took:.1f} s"
    assert "Traceback" not in log, log[-4000:]
    # The ACK reached the broker; the delivery the client never settled went back.
    assert bodies_left(broker, queue) == [b"unacked"]
    events = list(read_events(tmp_path / "events"))
    sent = [e for e in events if e["type"] == "sent"]
    assert len(sent) == 2, [e["type"] for e in events]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_sigterm_with_a_receipt_owed_sends_it_before_the_error(
        broker: ServerHandle, tmp_path: Path, mqguard_unique_name: str) -> None:
    """A SEND (with a receipt) and DISCONNECT-less SIGTERM right behind it: whether the
    sidecar read the SEND before the signal or not, the client never gets the ERROR before
    a receipt it is owed, and a receipted message is on the queue."""
    queue = f"/queue/{mqguard_unique_name}"
    with SidecarProcess(broker.urls["stomp"], tmp_path,
                        sidecar={"drain-timeout-ms": DRAIN_MS}) as sidecar:
        producer = RawClient(sidecar.port)
        producer.connect()
        producer.send(f"SEND\ndestination:{queue}\nreceipt:first\n\nfirst\0".encode())
        producer.read_frames(lambda got: any(f.get("receipt-id") == "first" for f in got))
        producer.send(f"SEND\ndestination:{queue}\nreceipt:last\n\nlast\0".encode())
        assert sidecar.stop() == 0
        producer.read_to_close(timeout=5)
        producer.close()
    frames = producer.frames()[1:]
    commands = [(f.command, f.get("receipt-id") or f.get("message")) for f in frames]
    assert commands[0] == ("RECEIPT", "first")
    assert commands[-1] == ("ERROR", "the sidecar is shutting down; reconnect"), commands
    assert commands[1:-1] in ([], [("RECEIPT", "last")]), commands
    left = bodies_left(broker, queue)
    assert left[0] == b"first"
    if ("RECEIPT", "last") in commands:
        assert left == [b"first", b"last"]
