"""The native data plane without the guard where it has nothing to do (docs/sidecar.md,
"Data plane"): with no event log and no plugin, a session forwards
SENDs, delivers MESSAGEs and settles ACKs and NACKs itself. Real ActiveMQ and RabbitMQ,
stock stomp.py clients: what reaches the broker is what the guard would have sent
(``mqguard-id`` included), every ack mode settles what it should, a NACK gives the message
back, ACKs inside an aborted transaction are void, an expiring SEND still goes the guard's
way, and the flags follow the plugins and the event log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.stomp_clients import RecordingClient

from mqguard.config import parse_config
from mqguard.message import now_ms, split_derived_id
from mqguard.pipeline import Guard
from mqguard.registry import BUILTIN_PLUGINS
from mqguard.servers.handle import ServerHandle
from mqguard.sidecar.native_bridge import BYPASS_DELIVERIES, BYPASS_SENDS, bypass_flags
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [pytest.param("activemq", marks=pytest.mark.activemq),
           pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


def bare_config(tmp_path: Path, **core: Any) -> dict[str, Any]:
    return {"mqguard": {"node-id": "bypass-test", "message-expiry-scan-period": -1,
                        "disabled-plugins": sorted(BUILTIN_PLUGINS),
                        "event-log": {"directory": str(tmp_path / "events"),
                                      "enabled": False}, **core}}


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> ServerHandle:
    server: ServerHandle = request.getfixturevalue(f"mqguard_{request.param}_server")
    return server


@pytest.fixture
def proxy(broker: ServerHandle, tmp_path: Path) -> Iterator[SidecarThread]:
    sidecar = Sidecar(parse_config(bare_config(tmp_path)),
                      parse_upstream(broker.urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        sessions = running.sidecar.native_sessions
        assert sessions is not None and sessions.bypass == BYPASS_SENDS | BYPASS_DELIVERIES
        yield running


@pytest.fixture
def clients() -> Iterator[list[RecordingClient]]:
    made: list[RecordingClient] = []
    yield made
    for client in made:
        client.close()


def connect(port: int, clients: list[RecordingClient]) -> RecordingClient:
    client = RecordingClient(port, disconnect_receipt="bye")
    clients.append(client)
    return client


def broker_port(broker: ServerHandle) -> int:
    return int(broker.urls["stomp"].rsplit(":", 1)[1].split("/")[0])


def left_in(queue: str, port: int, clients: list[RecordingClient]) -> list[str]:
    """The bodies still in ``queue``, read straight from the broker (``port``): what is
    there, then a marker sent behind it (a queue keeps its order)."""
    reader = connect(port, clients)
    reader.conn.subscribe(queue, id="left", ack="client-individual")
    reader.conn.send(queue, "marker", receipt="marked")
    wait_for(lambda: "marker" in reader.bodies(), 20, "the marker behind what is left")
    bodies = reader.bodies()
    for frame in reader.messages:
        reader.conn.ack(frame.headers["ack"])
    reader.close()
    clients.remove(reader)
    return bodies[:-1]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_sends_reach_the_broker_stamped_and_in_order(
        proxy: SidecarThread, broker: ServerHandle, clients: list[RecordingClient],
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy.port, clients)
    for i in range(50):
        producer.conn.send(queue, f"m{i}", headers={"app": f"a{i}", "_AMQ_DUPL_ID": f"d{i}"},
                           receipt=f"r{i}")
    wait_for(lambda: len(producer.receipts) == 50, 20, "a receipt per SEND")
    assert producer.receipts == [f"r{i}" for i in range(50)]
    direct = connect(broker_port(broker), clients)
    direct.conn.subscribe(queue, id="d", ack="auto")
    wait_for(lambda: len(direct.messages) == 50, 20, "every message, straight from the broker")
    assert direct.bodies() == [f"m{i}" for i in range(50)]
    producers = set()
    for i, frame in enumerate(direct.messages):
        assert frame.headers["app"] == f"a{i}"
        assert frame.headers["_AMQ_DUPL_ID"] == f"d{i}"
        derived = split_derived_id(frame.headers["mqguard-id"])
        assert derived is not None, frame.headers
        producers.add(derived[0])
        assert derived[1] == i + 1
    assert len(producers) == 1
    sessions = proxy.sidecar.native_sessions
    assert sessions is not None
    sessions.refresh_metrics()
    assert proxy.sidecar.metrics.messages.labels("send", "continue").value == 50


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_an_expiring_send_still_gets_the_guards_expiry(
        proxy: SidecarThread, broker: ServerHandle, clients: list[RecordingClient],
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy.port, clients)
    producer.conn.send(queue, "plain", receipt="r0")
    expires = str(now_ms() + 3_600_000)
    producer.conn.send(queue, "expiring", headers={"expires": expires}, receipt="r1")
    wait_for(lambda: producer.receipts == ["r0", "r1"], 20, "both receipts")
    direct = connect(broker_port(broker), clients)
    direct.conn.subscribe(queue, id="d", ack="auto")
    wait_for(lambda: len(direct.messages) == 2, 20, "both messages")
    plain, expiring = direct.messages
    assert "mqguard-expires" not in plain.headers
    assert expiring.headers["mqguard-expires"] == expires
    # Stamped by the guard's side: a producer of its own, never the same id.
    assert split_derived_id(plain.headers["mqguard-id"]) is not None
    assert expiring.headers["mqguard-id"] != plain.headers["mqguard-id"]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
@pytest.mark.parametrize("mode", ["auto", "client", "client-individual"])
def test_each_ack_mode_settles_what_it_covers(
        proxy: SidecarThread, broker: ServerHandle, clients: list[RecordingClient],
        mqguard_unique_name: str, mode: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy.port, clients)
    for i in range(6):
        producer.conn.send(queue, f"m{i}", receipt=f"r{i}")
    wait_for(lambda: len(producer.receipts) == 6, 20, "a receipt per SEND")
    consumer = connect(proxy.port, clients)
    consumer.conn.subscribe(queue, id="s", ack=mode)
    wait_for(lambda: len(consumer.messages) == 6, 20, "every message through the sidecar")
    assert consumer.bodies() == [f"m{i}" for i in range(6)]
    if mode != "auto":
        # m1 (client: m0 and m1; client-individual: m1 alone), then m3 (client: m2 and
        # m3).
        consumer.conn.ack(consumer.messages[1].headers["ack"], receipt="a1")
        consumer.conn.ack(consumer.messages[3].headers["ack"], receipt="a3")
        wait_for(lambda: consumer.receipts == ["a1", "a3"], 20, "the ACKs' receipts")
    consumer.close()
    clients.remove(consumer)
    expected = {"auto": [], "client": ["m4", "m5"],
                "client-individual": ["m0", "m2", "m4", "m5"]}[mode]
    assert sorted(left_in(queue, broker_port(broker), clients)) == expected
    sessions = proxy.sidecar.native_sessions
    assert sessions is not None
    sessions.refresh_metrics()
    assert proxy.sidecar.metrics.messages.labels("deliver", "continue").value == 6


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_nacked_message_goes_back_to_the_broker(
        proxy: SidecarThread, broker: ServerHandle, clients: list[RecordingClient],
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy.port, clients)
    producer.conn.send(queue, "kept", receipt="r0")
    producer.conn.send(queue, "nacked", receipt="r1")
    wait_for(lambda: len(producer.receipts) == 2, 20, "both receipts")
    consumer = connect(proxy.port, clients)
    consumer.conn.subscribe(queue, id="s", ack="client-individual")
    wait_for(lambda: len(consumer.messages) >= 2, 20, "both messages")
    kept, nacked = consumer.messages[:2]
    consumer.conn.ack(kept.headers["ack"])
    consumer.conn.nack(nacked.headers["ack"], receipt="n")
    wait_for(lambda: "n" in consumer.receipts, 20, "the NACK's receipt")
    consumer.close()
    clients.remove(consumer)
    # RabbitMQ requeues it at once; ActiveMQ once the connection that had it is gone.
    assert left_in(queue, broker_port(broker), clients) == ["nacked"]


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_acks_in_an_aborted_transaction_are_void(
        proxy: SidecarThread, broker: ServerHandle, clients: list[RecordingClient],
        mqguard_unique_name: str) -> None:
    queue = f"/queue/{mqguard_unique_name}"
    producer = connect(proxy.port, clients)
    for i in range(3):
        producer.conn.send(queue, f"m{i}", receipt=f"r{i}")
    wait_for(lambda: len(producer.receipts) == 3, 20, "a receipt per SEND")
    consumer = connect(proxy.port, clients)
    consumer.conn.subscribe(queue, id="s", ack="client-individual")
    wait_for(lambda: len(consumer.messages) == 3, 20, "every message")
    first, second, third = (frame.headers["ack"] for frame in consumer.messages)
    consumer.conn.begin("t1")
    consumer.conn.ack(first, transaction="t1")
    consumer.conn.ack(second, transaction="t1")
    consumer.conn.abort("t1", receipt="aborted")
    wait_for(lambda: "aborted" in consumer.receipts, 20, "the ABORT's receipt")
    # Void: the client settles them again, the first in a committed transaction.
    consumer.conn.begin("t2")
    consumer.conn.ack(first, transaction="t2")
    consumer.conn.commit("t2", receipt="committed")
    consumer.conn.ack(third, receipt="acked")
    wait_for(lambda: "acked" in consumer.receipts, 20, "the last ACK's receipt")
    assert consumer.errors == []
    consumer.close()
    clients.remove(consumer)
    assert left_in(queue, broker_port(broker), clients) == ["m1"]


def test_the_flags_follow_the_plugins_and_the_event_log(tmp_path: Path) -> None:
    def flags(settings: dict[str, Any]) -> int:
        with Guard(parse_config(settings), role="sidecar") as guard:
            return bypass_flags(guard)

    assert flags(bare_config(tmp_path)) == BYPASS_SENDS | BYPASS_DELIVERIES
    logged = bare_config(tmp_path)
    logged["mqguard"]["event-log"]["enabled"] = True
    assert flags(logged) == 0
    everything = bare_config(tmp_path, **{"disabled-plugins": []})
    assert flags(everything) == 0
    # Delivery counting alone looks at deliveries, never at a SEND.
    counting = bare_config(tmp_path, **{"disabled-plugins": sorted(
        set(BUILTIN_PLUGINS) - {"delivery_counting"})})
    assert flags(counting) == BYPASS_SENDS
