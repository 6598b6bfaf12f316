"""The client's keep-alive is enforced by the broker as well as by the MQTT sidecar (both
at 1.5 x, the broker from the last packet the sidecar forwarded), so the broker may close
first. Against a scripted broker that does exactly that: an MQTT 5 client silent for its
keep-alive is told DISCONNECT 0x8D (keep-alive timeout) all the same, as when the
sidecar's own timer fires; a broker that closes sooner gets no such DISCONNECT said for it.
(A real broker cannot be made to win that race on purpose.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import mqtt_sidecar_config
from mqguard_tests.scripted_broker import LoopbackServer

from mqguard.mqtt_codec import MqttDecoder, mqtt_simple
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread

#: CONNACK, MQTT 5: no session present, success, no properties.
CONNACK_V5 = bytes([0x20, 0x03, 0x00, 0x00, 0x00])
PINGRESP = bytes([0xD0, 0x00])


class ClosingBroker(LoopbackServer):
    """Answers CONNECT and PINGREQ, then closes each connection ``close_after`` seconds
    after the last PINGREQ."""

    def __init__(self, close_after: float) -> None:
        self.close_after = close_after
        super().__init__()

    def serve(self, sock: socket.socket) -> None:
        decoder = MqttDecoder()
        with sock:
            while True:
                sock.settimeout(None if decoder.version is None else self.close_after)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    return  # silent for close_after since the last packet: close
                if not data:
                    return
                for packet in decoder.feed(data):
                    if packet.type == "CONNECT":
                        sock.sendall(CONNACK_V5)
                    elif packet.type == "PINGREQ":
                        sock.sendall(PINGRESP)


@pytest.fixture
def broker_closing_at(request: pytest.FixtureRequest, tmp_path: Path
                      ) -> Iterator[MqttSidecarThread]:
    broker = ClosingBroker(request.param)
    sidecar = MqttSidecar(mqtt_sidecar_config(tmp_path, "mqtt-keepalive"),
                          ("127.0.0.1", broker.port))
    try:
        with MqttSidecarThread(sidecar) as running:
            yield running
    finally:
        broker.close()


@pytest.mark.parametrize("broker_closing_at", [1.2], indirect=True)
def test_a_broker_closing_for_the_keep_alive_is_reported_as_its_timeout(
        broker_closing_at: MqttSidecarThread) -> None:
    # keep-alive 1 s: the broker closes 1.2 s after the PINGREQ, before the sidecar's own
    # timer (1.5 s) fires.
    client = RawMqtt(broker_closing_at.port, "silent", keep_alive=1)
    client.send(mqtt_simple("PINGREQ"))
    client.expect("PINGRESP")
    assert client.expect("DISCONNECT", timeout=5).reason_code == 0x8D
    assert client.wait_closed()


@pytest.mark.parametrize("broker_closing_at", [0.3], indirect=True)
def test_a_broker_closing_sooner_is_not_said_to_be_a_keep_alive_timeout(
        broker_closing_at: MqttSidecarThread) -> None:
    client = RawMqtt(broker_closing_at.port, "early", keep_alive=5)
    client.send(mqtt_simple("PINGREQ"))
    client.expect("PINGRESP")
    assert client.wait_closed()
    assert client.collect("DISCONNECT", 0.5) == []
