"""The MQTT sidecar in front of REAL Mosquitto: pass-through for stock clients (paho 3.1.1
and 5, raw packets), duplicate detection, delivery counting with dead letters."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import mqtt_sidecar_config, running_mqtt_sidecar, sidecar_events
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.events import read_events
from mqguard.mqtt_codec import MqttDecoder, mqtt_ack
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread
from mqguard.servers import ServerHandle

pytestmark = pytest.mark.mosquitto


@pytest.fixture
def proxy(mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
          request: pytest.FixtureRequest) -> Iterator[MqttSidecarThread]:
    config = mqtt_sidecar_config(tmp_path, "mqtt-sidecar-test",
                                 address=getattr(request, "param", {}))
    with running_mqtt_sidecar(config, mqguard_mosquitto_server, admin=("127.0.0.1", 0),
                              broker="mosquitto") as running:
        yield running


def events(tmp_path: Path, proxy: MqttSidecarThread) -> list[dict[str, Any]]:
    return sidecar_events(tmp_path, proxy)


class Paho:
    """A stock paho client through the sidecar, collecting what it receives."""

    def __init__(self, port: int, client_id: str, *, v5: bool = True) -> None:
        self.v5 = v5
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=MQTTProtocolVersion.MQTTv5 if v5
                                  else MQTTProtocolVersion.MQTTv311)
        self.got: list[paho.MQTTMessage] = []
        self.arrived = threading.Condition()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, client: paho.Client, userdata: object,
                    message: paho.MQTTMessage) -> None:
        with self.arrived:
            self.got.append(message)
            self.arrived.notify_all()

    def subscribe(self, topic: str, qos: int = 1) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *args: done.set()
        self.client.subscribe(topic, qos)
        assert done.wait(10), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                user: list[tuple[str, str]] | None = None) -> paho.MQTTMessageInfo:
        properties = None
        if user and self.v5:
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = user
        info = self.client.publish(topic, payload, qos=qos, retain=retain,
                                   properties=properties)
        if qos:
            info.wait_for_publish(10)
        return info

    def wait(self, count: int, timeout: float = 10.0) -> list[paho.MQTTMessage]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.got) < count and (left := deadline - time.monotonic()) > 0:
                self.arrived.wait(left)
        return list(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_paho_round_trip_every_qos_and_retained(proxy: MqttSidecarThread, v5: bool,
                                                mqguard_unique_name: str) -> None:
    topic = f"t/{mqguard_unique_name}"
    sub = Paho(proxy.port, f"{mqguard_unique_name}-s", v5=v5)
    pub = Paho(proxy.port, f"{mqguard_unique_name}-p", v5=v5)
    try:
        sub.subscribe(f"{topic}/#", qos=2)
        for qos in (0, 1, 2):
            for i in range(5):
                info = pub.publish(f"{topic}/q{qos}", f"{qos}-{i}".encode(), qos=qos,
                                   user=[("app", f"v{i}")])
                assert info.rc == 0
        got = sub.wait(15)
        assert sorted(m.payload.decode() for m in got) == sorted(
            f"{q}-{i}" for q in (0, 1, 2) for i in range(5))
        # Per QoS in order.
        for qos in (0, 1, 2):
            assert [m.payload for m in got if m.topic == f"{topic}/q{qos}"] == [
                f"{qos}-{i}".encode() for i in range(5)]
        if v5:
            first = next(m for m in got if m.topic == f"{topic}/q1")
            props = dict(first.properties.UserProperty)
            assert props["app"] == "v0"
            assert props["mqguard-id"], "the guard's id travels as a user property"
        pub.publish(f"{topic}/retained", b"kept", qos=1, retain=True)
        late = Paho(proxy.port, f"{mqguard_unique_name}-late", v5=v5)
        try:
            late.subscribe(f"{topic}/retained", qos=1)
            [retained] = late.wait(1)
            assert retained.payload == b"kept" and retained.retain
        finally:
            late.publish(f"{topic}/retained", b"", qos=1, retain=True)
            late.close()
    finally:
        sub.close()
        pub.close()


def test_publish_acknowledged_only_after_the_broker(mqguard_unique_name: str,
                                                    tmp_path: Path) -> None:
    """A scripted broker holds its PUBACK back: the client gets none until the broker
    answered, and then under its own packet id."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()
    seen: list[int] = []

    def broker() -> None:
        conn, _ = listener.accept()
        decoder = MqttDecoder("5")
        packets: list[Any] = []
        while not packets:
            packets += decoder.feed(conn.recv(65536))
        assert packets.pop(0).type == "CONNECT"
        conn.sendall(bytes([0x20, 3, 0, 0, 0]))
        while not packets:
            packets += decoder.feed(conn.recv(65536))
        publish = packets.pop(0)
        seen.append(publish.packet_id)
        release.wait(10)
        conn.sendall(mqtt_ack("PUBACK", publish.packet_id).encode())
        time.sleep(1)
        conn.close()

    thread = threading.Thread(target=broker, daemon=True)
    thread.start()
    sidecar = MqttSidecar(mqtt_sidecar_config(tmp_path, "mqtt-sidecar-test"),
                          listener.getsockname()[:2])
    with MqttSidecarThread(sidecar) as running:
        client = RawMqtt(running.port, mqguard_unique_name)
        client.publish("a/b", b"held", packet_id=4242)
        assert client.collect("PUBACK", 1.0) == [], "acknowledged before the broker did"
        release.set()
        assert client.expect("PUBACK").packet_id == 4242
        assert seen == [4242]
        client.drop()
    thread.join(5)
    listener.close()
    sent = [e for e in read_events(tmp_path / "events") if e["type"] == "sent"]
    assert [e["address"] for e in sent] == ["a.b"]


def test_duplicate_id_user_property_mqtt5(proxy: MqttSidecarThread, mqguard_unique_name: str,
                                          tmp_path: Path) -> None:
    topic = f"d/{mqguard_unique_name}"
    sub = Paho(proxy.port, f"{mqguard_unique_name}-s")
    pub = Paho(proxy.port, f"{mqguard_unique_name}-p")
    try:
        sub.subscribe(topic)
        for body in (b"one", b"again", b"two"):
            dup = "id-2" if body == b"two" else "id-1"
            assert pub.publish(topic, body, user=[("_AMQ_DUPL_ID", dup)]).rc == 0
        sub.wait(2)
        time.sleep(0.5)  # room for a duplicate that got through
        assert [m.payload for m in sub.got] == [b"one", b"two"]
    finally:
        sub.close()
        pub.close()
    rejected = [e for e in events(tmp_path, proxy) if e["type"] == "duplicate_rejected"]
    assert [e["duplicate_id"] for e in rejected] == ["id-1"]


@pytest.mark.parametrize("proxy", [{"duplicate-id-from": "content"}], indirect=True)
def test_content_duplicate_detection_for_mqtt311(proxy: MqttSidecarThread,
                                                 mqguard_unique_name: str,
                                                 tmp_path: Path) -> None:
    """A 3.1.1 device cannot set a header: the payload is its duplicate id."""
    topic = f"c/{mqguard_unique_name}"
    sub = Paho(proxy.port, f"{mqguard_unique_name}-s", v5=False)
    device = RawMqtt(proxy.port, f"{mqguard_unique_name}-dev", version="3.1.1")
    try:
        sub.subscribe(topic)
        for packet_id, body in enumerate((b"reading-1", b"reading-1", b"reading-2"), 1):
            device.publish(topic, body, packet_id=packet_id)
            assert device.expect("PUBACK").packet_id == packet_id  # a duplicate is acked too
        sub.wait(2)
        time.sleep(0.5)  # room for a duplicate that got through
        assert [m.payload for m in sub.got] == [b"reading-1", b"reading-2"]
    finally:
        sub.close()
        device.disconnect()
    recorded = events(tmp_path, proxy)
    rejected = [e for e in recorded if e["type"] == "duplicate_rejected"]
    assert len(rejected) == 1 and rejected[0]["duplicate_id"].startswith("content:")
    # Sent and delivered under one id, so the audit follows each message end to end.
    sent = {e["message_id"] for e in recorded if e["type"] == "sent"}
    delivered = {e["message_id"] for e in recorded if e["type"] == "delivered"}
    assert len(sent) == 2 and sent == delivered


@pytest.mark.parametrize("proxy", [{"max-delivery-attempts": 2,
                                    "dead-letter-address": "DLQ.mqtt"}], indirect=True)
@pytest.mark.parametrize("version", ["5", "3.1.1"])
def test_unacknowledged_delivery_counts_and_goes_to_the_dead_letter_address(
        proxy: MqttSidecarThread, mqguard_unique_name: str, tmp_path: Path,
        version: str) -> None:
    """A message that "crashes" its subscriber (never acknowledged, session dropped) comes
    back once, then goes to the dead-letter topic with its original topic and count, and is
    acknowledged upstream: it does not come back a third time."""
    topic = f"p/{mqguard_unique_name}"
    v5 = version == "5"
    persistent = [("session_expiry_interval", 600)] if v5 else None
    dlq = RawMqtt(proxy.port, f"{mqguard_unique_name}-dlq", version=version)
    dlq.subscribe("DLQ/#")
    device = f"{mqguard_unique_name}-device"
    sub = RawMqtt(proxy.port, device, version=version, clean=False, properties=persistent)
    sub.subscribe(topic)
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p", version=version)
    pub.publish(topic, b"poison", packet_id=7)
    pub.expect("PUBACK")
    first = sub.expect("PUBLISH")
    assert first.payload == b"poison" and not first.dup
    sub.drop()  # crashed while handling it
    for attempt in (2,):
        sub = RawMqtt(proxy.port, device, version=version, clean=False, properties=persistent)
        again = sub.expect("PUBLISH")
        assert again.payload == b"poison" and again.dup, f"attempt {attempt}"
        sub.drop()
    dead = dlq.expect("PUBLISH")
    assert dlq.collect("PUBLISH", 0.3) == []
    assert dead.payload == b"poison"
    if v5:
        props = dict(dead.user_properties)
        assert dead.topic == "DLQ/mqtt"
        assert props["_AMQ_ORIG_ADDRESS"] == f"p.{mqguard_unique_name}"
        assert props["mqguard-orig-delivery-count"] == "2"
    else:
        assert dead.topic == f"DLQ/mqtt/2/{topic}"
    # Acknowledged upstream: the broker has nothing left for the device.
    sub = RawMqtt(proxy.port, device, version=version, clean=False, properties=persistent)
    assert sub.collect("PUBLISH", 1.0) == []
    sub.disconnect()
    pub.disconnect()
    dlq.disconnect()
    kinds = [e["type"] for e in events(tmp_path, proxy)
             if e.get("address") == f"p.{mqguard_unique_name}"]
    assert kinds.count("handler_failed") == 2
    assert "dead_lettered" in kinds


def test_qos2_duplicate_is_completed_by_the_sidecar_and_a_refusal_has_its_reason(
        proxy: MqttSidecarThread, mqguard_unique_name: str) -> None:
    topic = f"q2/{mqguard_unique_name}"
    sub = RawMqtt(proxy.port, f"{mqguard_unique_name}-s")
    sub.subscribe(topic, qos=2)
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p")
    dup = [("user_property", ("_AMQ_DUPL_ID", f"{mqguard_unique_name}-once"))]
    for packet_id in (10, 11):  # the second is a duplicate: the sidecar answers it itself
        pub.publish(topic, b"exactly-once", qos=2, packet_id=packet_id, properties=dup)
        assert pub.expect("PUBREC").packet_id == packet_id
        pub.send(mqtt_ack("PUBREL", packet_id))
        assert pub.expect("PUBCOMP").packet_id == packet_id
    pub.publish(topic, b"refused", qos=1, packet_id=12,
                properties=[("user_property", ("_AMQ_DUPL_ID", "x" * 5000))])
    refusal = pub.expect("PUBACK")
    assert refusal.packet_id == 12 and refusal.reason_code == 0x83
    assert any(name == "reason_string" and "duplicate id" in str(value)
               for name, value in refusal.properties or [])
    got = [sub.expect("PUBLISH"), *sub.collect("PUBLISH", 0.5)]
    assert [p.payload for p in got] == [b"exactly-once"]
    assert got[0].qos == 2
    sub.send(mqtt_ack("PUBREC", got[0].packet_id or 0))
    assert sub.expect("PUBREL").packet_id == got[0].packet_id
    sub.send(mqtt_ack("PUBCOMP", got[0].packet_id or 0))
    sub.disconnect()
    pub.disconnect()


def unsubscribe_v5(packet_id: int, topic: str) -> bytes:
    name = topic.encode()
    body = packet_id.to_bytes(2, "big") + b"\x00" + len(name).to_bytes(2, "big") + name
    assert len(body) < 128
    return bytes([0xA2, len(body)]) + body


def test_retained_message_comes_again_on_each_new_subscription(
        proxy: MqttSidecarThread, mqguard_unique_name: str) -> None:
    topic = f"r/{mqguard_unique_name}"
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p")
    pub.publish(topic, b"state", packet_id=1, retain=True)
    pub.expect("PUBACK")
    sub = RawMqtt(proxy.port, f"{mqguard_unique_name}-s")
    for packet_id in (1, 2):
        sub.subscribe(topic, packet_id=packet_id)
        got = sub.expect("PUBLISH")
        assert got.payload == b"state" and got.retain
        sub.ack(got.packet_id or 0)
        sub.send_raw(unsubscribe_v5(packet_id + 10, topic))
        sub.expect("UNSUBACK")
    pub.publish(topic, b"", packet_id=2, retain=True)
    pub.expect("PUBACK")
    sub.disconnect()
    pub.disconnect()
