"""The MQTT sidecar in front of the MQTT listeners of REAL RabbitMQ 3.10 and ActiveMQ Classic
5.17 (both MQTT 3.1.1 only): pass-through, content-based duplicate detection, and dead
letters for a message its subscriber never acknowledges."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import mqtt_sidecar_config, running_mqtt_sidecar

from mqguard.events import read_events
from mqguard.mqtt_sidecar.thread import MqttSidecarThread

BROKERS = [
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
]


@pytest.fixture
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttSidecarThread]:
    kind = request.param
    server = request.getfixturevalue(f"mqguard_{kind}_server")
    config = mqtt_sidecar_config(tmp_path, "mqtt-brokers", address={
        "duplicate-id-from": "content", "max-delivery-attempts": 2,
        "dead-letter-address": "DLQ.mqtt"})
    with running_mqtt_sidecar(config, server, broker=kind) as running:
        yield running


def connect(proxy: MqttSidecarThread, client_id: str, **kw: Any) -> RawMqtt:
    # RabbitMQ's MQTT plugin takes guest/guest from its defaults; both accept anonymous.
    return RawMqtt(proxy.port, client_id, version="3.1.1", **kw)


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_round_trip_and_content_duplicates(proxy: MqttSidecarThread, mqguard_unique_name: str,
                                           tmp_path: Path) -> None:
    topic = f"b/{mqguard_unique_name}"
    sub = connect(proxy, f"{mqguard_unique_name}-s")
    sub.subscribe(topic)
    pub = connect(proxy, f"{mqguard_unique_name}-p")
    for packet_id, body in enumerate((b"r1", b"r1", b"r2", b"r3"), 1):
        pub.publish(topic, body, packet_id=packet_id)
        assert pub.expect("PUBACK").packet_id == packet_id
    pub.publish(topic, b"q0", qos=0)
    got = sub.collect("PUBLISH", 2.0)
    assert [p.payload for p in got] == [b"r1", b"r2", b"r3", b"q0"]
    for packet in got:
        if packet.qos:
            sub.ack(packet.packet_id or 0)
    sub.disconnect()
    pub.disconnect()
    proxy.sidecar.guard.events.flush()
    rejected = [e for e in read_events(tmp_path / "events") if e["type"] == "duplicate_rejected"]
    assert len(rejected) == 1


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_dead_letter_after_max_delivery_attempts(proxy: MqttSidecarThread,
                                                 mqguard_unique_name: str) -> None:
    topic = f"p/{mqguard_unique_name}"
    dlq = connect(proxy, f"{mqguard_unique_name}-dlq")
    dlq.subscribe("DLQ/#")
    device = f"{mqguard_unique_name}-device"
    sub = connect(proxy, device, clean=False)
    sub.subscribe(topic)
    pub = connect(proxy, f"{mqguard_unique_name}-p")
    pub.publish(topic, b"poison", packet_id=1)
    pub.expect("PUBACK")
    assert sub.expect("PUBLISH").payload == b"poison"
    sub.drop()
    sub = connect(proxy, device, clean=False)
    assert sub.expect("PUBLISH").payload == b"poison"
    sub.drop()
    dead = dlq.expect("PUBLISH")
    assert (dead.topic, dead.payload) == (f"DLQ/mqtt/2/{topic}", b"poison")
    assert dlq.collect("PUBLISH", 0.3) == []
    sub = connect(proxy, device, clean=False)
    assert sub.collect("PUBLISH", 1.0) == []
    sub.disconnect()
    dlq.disconnect()
    pub.disconnect()
