"""The MQTT codec against real traffic: paho-mqtt and mosquitto_pub / mosquitto_sub talk to
a real Mosquitto through a loopback recorder; every packet of both directions decodes, and
re-encodes to exactly the octets that were sent, for MQTT 3.1.1 and 5."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.mqtt_codec import MqttDecoder, MqttPacket

DEADLINE_S = 20.0


@dataclass
class Leg:
    """The octets of one client connection, per direction."""

    to_broker: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    done: threading.Event = field(default_factory=threading.Event)


class Recorder:
    """A TCP relay on 127.0.0.1 that keeps what each connection sent either way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.legs: list[Leg] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            broker = socket.create_connection(self.upstream)
            leg = Leg()
            with self.lock:
                self.legs.append(leg)
            pumps = [
                threading.Thread(
                    target=self._pump, args=(client, broker, leg.to_broker), daemon=True
                ),
                threading.Thread(
                    target=self._pump, args=(broker, client, leg.to_client), daemon=True
                ),
            ]
            for pump in pumps:
                pump.start()
            threading.Thread(
                target=self._close, args=(pumps, client, broker, leg), daemon=True
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bytearray) -> None:
        try:
            while data := source.recv(65536):
                with self.lock:
                    record.extend(data)
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _close(
        pumps: list[threading.Thread], client: socket.socket, broker: socket.socket, leg: Leg
    ) -> None:
        for pump in pumps:
            pump.join()
        client.close()
        broker.close()
        leg.done.set()

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def recorder(mqguard_mosquitto_server: Any) -> Iterator[Recorder]:
    url = urlsplit(mqguard_mosquitto_server.urls["mqtt"])
    assert url.hostname and url.port
    rec = Recorder((url.hostname, url.port))
    yield rec
    rec.close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def decode_leg(leg: Leg) -> tuple[list[MqttPacket], list[MqttPacket]]:
    """Both directions of a finished leg, each checked to re-encode byte-exact."""
    assert leg.done.wait(DEADLINE_S), "the connection did not close"
    upward = MqttDecoder()
    sent = upward.feed(bytes(leg.to_broker))
    assert sent and sent[0].type == "CONNECT"
    downward = MqttDecoder(sent[0].version)
    received = downward.feed(bytes(leg.to_client))
    assert upward.buffered == 0 and downward.buffered == 0
    assert b"".join(p.encode() for p in sent) == bytes(leg.to_broker)
    assert b"".join(p.encode() for p in received) == bytes(leg.to_client)
    return sent, received


def types(packets: list[MqttPacket]) -> set[str]:
    return {p.type for p in packets}


ALL_FLOWS = {
    "CONNECT",
    "SUBSCRIBE",
    "PUBLISH",
    "PUBACK",
    "PUBREC",
    "PUBREL",
    "PUBCOMP",
    "UNSUBSCRIBE",
    "DISCONNECT",
}


@pytest.mark.parametrize("version", ["3.1.1", "5"])
def test_paho_traffic_decodes_and_reencodes_byte_exact(recorder: Recorder, version: str) -> None:
    v5 = version == "5"
    protocol = MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311
    topic = f"cap/paho{version.replace('.', '')}/{os.getpid()}"
    if v5:
        client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"cap-{version}", protocol=protocol
        )
    else:
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"cap-{version}",
            protocol=protocol,
            clean_session=True,
        )
    client.username_pw_set("device", "pw-not-logged")
    client.will_set(f"{topic}/will", b"gone", qos=1)
    got: list[paho.MQTTMessage] = []
    subscribed = threading.Event()
    client.on_message = lambda _c, _u, msg: got.append(msg)
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect("127.0.0.1", recorder.port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(f"{topic}/#", qos=2)
        assert subscribed.wait(DEADLINE_S)
        props = None
        if v5:
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("_AMQ_DUPL_ID", "id-1"), ("k", "v1"), ("k", "v2")]
            props.MessageExpiryInterval = 60
        for qos in (0, 1, 2):
            client.publish(
                f"{topic}/q{qos}", f"m{qos}".encode(), qos=qos, properties=props
            ).wait_for_publish(DEADLINE_S)
        wait_for(lambda: len(got) == 3, "three messages back")
        client.unsubscribe(f"{topic}/#")
        time.sleep(0.2)
    finally:
        client.disconnect()
        client.loop_stop()
    [leg] = recorder.legs
    sent, received = decode_leg(leg)
    assert types(sent) | types(received) >= ALL_FLOWS
    assert {"CONNACK", "SUBACK", "UNSUBACK"} <= types(received)
    connect = sent[0]
    assert (connect.version, connect.client_id, connect.username) == (
        version,
        f"cap-{version}",
        "device",
    )
    assert connect.password == b"pw-not-logged" and "pw-not-logged" not in repr(connect)
    assert (connect.will_topic, connect.will_payload, connect.will_qos) == (
        f"{topic}/will",
        b"gone",
        1,
    )
    published = [p for p in sent if p.type == "PUBLISH"]
    assert [(p.qos, p.payload) for p in published] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    if v5:
        assert all(
            p.user_properties == [("_AMQ_DUPL_ID", "id-1"), ("k", "v1"), ("k", "v2")]
            for p in published
        )
        assert all(p.message_expiry_interval == 60 for p in published)
        delivered = [p for p in received if p.type == "PUBLISH"]
        assert all(
            p.user_properties == [("_AMQ_DUPL_ID", "id-1"), ("k", "v1"), ("k", "v2")]
            for p in delivered
        )


def mosquitto_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                f"{name} missing (Debian mosquitto-clients; deploy/local/install.sh installs it)"
            )
        pytest.skip(f"{name} missing (apt-get install mosquitto-clients)")
    return path


@pytest.mark.parametrize("version", ["311", "5"])
def test_mosquitto_clients_traffic_decodes_and_reencodes_byte_exact(
    recorder: Recorder, version: str
) -> None:
    sub_tool, pub_tool = mosquitto_tool("mosquitto_sub"), mosquitto_tool("mosquitto_pub")
    topic = f"cap/mosq{version}/{os.getpid()}"
    common = [
        "-h",
        "127.0.0.1",
        "-p",
        str(recorder.port),
        "-V",
        f"mqttv{version}",
        "-u",
        "device",
        "-P",
        "pw-x",
    ]
    extra = ["-D", "publish", "user-property", "origin", "mosquitto_pub"] if version == "5" else []
    sub = subprocess.Popen(
        [sub_tool, *common, "-q", "2", "-t", topic, "-C", "2", "-W", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: len(recorder.legs) == 1 and b"\x90" in bytes(recorder.legs[0].to_client),
            "SUBACK",
        )
        for qos in ("1", "2"):
            subprocess.run(
                [pub_tool, *common, "-q", qos, "-t", topic, "-m", f"hello {qos}", *extra],
                check=True,
                timeout=DEADLINE_S,
                capture_output=True,
            )
        out, _ = sub.communicate(timeout=DEADLINE_S)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert out.decode().split("\n")[:2] == ["hello 1", "hello 2"]
    flows: set[str] = set()
    for leg in recorder.legs:
        sent, received = decode_leg(leg)
        assert sent[0].version == ("3.1.1" if version == "311" else "5")
        assert sent[0].password == b"pw-x"
        flows |= types(sent) | types(received)
        if version == "5":
            for packet in sent + received:
                if packet.type == "PUBLISH":
                    assert packet.user_properties == [("origin", "mosquitto_pub")]
    assert (ALL_FLOWS - {"UNSUBSCRIBE"}) | {"CONNACK", "SUBACK"} <= flows
    assert len(recorder.legs) == 3
