"""The MQTT sidecar against bad input and bad peers, in front of REAL Mosquitto: malformed
and over-limit packets get the right answer and never take the sidecar down; a client
that stops reading holds up only itself; a broker restart."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import mqtt_sidecar_config, running_mqtt_sidecar

from mqguard.events import read_events
from mqguard.mqtt_codec import mqtt_connect, mqtt_publish, mqtt_simple, mqtt_subscribe
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread
from mqguard.servers import ServerHandle, start_mosquitto

pytestmark = pytest.mark.mosquitto


def upstream_of(server: ServerHandle) -> tuple[str, int]:
    return "127.0.0.1", server.port("mqtt")


def config(tmp_path: Path, **sidecar: Any) -> Any:
    return mqtt_sidecar_config(tmp_path, "mqtt-robustness", sidecar=sidecar)


@pytest.fixture
def proxy(mqguard_mosquitto_server: ServerHandle, tmp_path: Path) -> Iterator[MqttSidecarThread]:
    with running_mqtt_sidecar(config(tmp_path, **{"max-frame-bytes": 4096}),
                              mqguard_mosquitto_server, admin=("127.0.0.1", 0)) as running:
        yield running


def still_serves(proxy: MqttSidecarThread, name: str) -> None:
    """A fresh client's round trip through the sidecar works."""
    client = RawMqtt(proxy.port, f"{name}-check")
    client.subscribe(f"alive/{name}")
    client.publish(f"alive/{name}", b"ping", packet_id=1)
    client.expect("PUBACK")
    assert client.expect("PUBLISH").payload == b"ping"
    client.disconnect()


def metrics(proxy: MqttSidecarThread) -> str:
    url = f"http://127.0.0.1:{proxy.sidecar.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def test_malformed_packet_mqtt5_gets_disconnect_0x81(proxy: MqttSidecarThread,
                                                     mqguard_unique_name: str) -> None:
    client = RawMqtt(proxy.port, mqguard_unique_name)
    client.send_raw(bytes([0x36, 0x00]))  # PUBLISH with QoS 3
    disconnect = client.expect("DISCONNECT")
    assert disconnect.reason_code == 0x81
    assert client.wait_closed()
    still_serves(proxy, mqguard_unique_name)
    assert 'mqguard_mqtt_sidecar_protocol_errors_total{kind="malformed",side="client"} 1.0' \
        in metrics(proxy)


def test_over_limit_packet_gets_disconnect_0x95(proxy: MqttSidecarThread,
                                                mqguard_unique_name: str) -> None:
    client = RawMqtt(proxy.port, mqguard_unique_name)
    client.publish("big/one", b"x" * 8192, packet_id=1)
    assert client.expect("DISCONNECT").reason_code == 0x95
    assert client.wait_closed()
    assert client.collect("PUBACK", 0.2) == []
    still_serves(proxy, mqguard_unique_name)


def test_malformed_mqtt311_is_closed(proxy: MqttSidecarThread, mqguard_unique_name: str) -> None:
    client = RawMqtt(proxy.port, mqguard_unique_name, version="3.1.1")
    # A PUBLISH whose topic is U+0000, in two reads.
    client.send_raw(bytes([0x30, 0x05, 0x00]))
    client.send_raw(bytes([0x01, 0x00, 0x00, 0x00]))
    assert client.wait_closed()
    still_serves(proxy, mqguard_unique_name)


@pytest.mark.parametrize(("data", "answer"), [
    # CONNECT of protocol level 6: the 3.1.1 refusal "unacceptable protocol version".
    (bytes([0x10, 0x0D, 0x00, 0x04]) + b"MQTT" + bytes([6, 2, 0, 60, 0, 1]) + b"c",
     bytes([0x20, 2, 0, 1])),
    # Not a CONNECT first.
    (bytes([0xC0, 0x00]), b""),
    # Garbage.
    (b"GET / HTTP/1.1\r\n\r\n", b""),
    # A CONNECT announcing 1 MiB: over the handshake limit, closed before its body.
    (bytes([0x10, 0x80, 0x80, 0x40]) + b"\x00" * 1000, b""),
], ids=["level-6", "pingreq-first", "http", "huge-connect"])
def test_bad_handshakes_are_refused(proxy: MqttSidecarThread, mqguard_unique_name: str,
                                    data: bytes, answer: bytes) -> None:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(data)
    got = b""
    while chunk := sock.recv(1024):
        got += chunk
    sock.close()
    assert got == answer
    still_serves(proxy, mqguard_unique_name)


def test_client_that_stops_reading_holds_up_only_itself(proxy: MqttSidecarThread,
                                                        mqguard_unique_name: str) -> None:
    topic = f"flood/{mqguard_unique_name}"
    stuck = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # The stuck subscriber: CONNECT and SUBSCRIBE, then it never reads again.
    stuck.sendall(mqtt_connect(f"{mqguard_unique_name}-stuck").encode()
                  + mqtt_subscribe(1, [(topic, 0)]).encode())
    time.sleep(0.3)
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p")
    payload = b"y" * 2000
    for _ in range(1500):  # ~3 MB toward a reader that takes nothing
        pub.send(mqtt_publish(topic, payload, qos=0))
    pub.publish(topic, b"last", packet_id=9)
    pub.expect("PUBACK", timeout=20)
    still_serves(proxy, mqguard_unique_name)
    stuck.close()
    pub.disconnect()
    still_serves(proxy, f"{mqguard_unique_name}-after")


def test_broker_restart(tmp_path: Path, mqguard_unique_name: str) -> None:
    broker = start_mosquitto()
    port = broker.port("mqtt")
    state = broker.state_dir
    sidecar = MqttSidecar(config(tmp_path), ("127.0.0.1", port))
    try:
        with MqttSidecarThread(sidecar) as running:
            session = [("session_expiry_interval", 600)]
            sub = RawMqtt(running.port, f"{mqguard_unique_name}-s", clean=False,
                          properties=session)
            sub.subscribe("restart/t")
            broker.stop()
            assert sub.wait_closed(), "the client's connection ends with the broker's"
            down = RawMqtt(running.port, f"{mqguard_unique_name}-down")
            assert down.connack is not None and down.connack.reason_code == 0x88
            assert down.wait_closed()
            broker = start_mosquitto(state_dir=state, port=port)
            pub = RawMqtt(running.port, f"{mqguard_unique_name}-p")
            sub = RawMqtt(running.port, f"{mqguard_unique_name}-s", clean=False,
                          properties=session)
            assert sub.connack is not None and sub.connack.session_present
            pub.publish("restart/t", b"after", packet_id=3)
            pub.expect("PUBACK")
            assert sub.expect("PUBLISH").payload == b"after"
            sub.disconnect()
            pub.disconnect()
    finally:
        broker.stop()


def test_keep_alive_timeout_publishes_the_will(proxy: MqttSidecarThread,
                                               mqguard_unique_name: str) -> None:
    """PINGREQ passes through; a client silent for 1.5 x its keep-alive is disconnected
    (MQTT 5: reason 0x8D) and, having sent no DISCONNECT, its will is published."""
    watcher = RawMqtt(proxy.port, f"{mqguard_unique_name}-w")
    watcher.subscribe(f"will/{mqguard_unique_name}")
    client = RawMqtt(proxy.port, f"{mqguard_unique_name}-c", keep_alive=1,
                     will={"topic": f"will/{mqguard_unique_name}", "payload": b"gone",
                           "qos": 1})
    client.send(mqtt_simple("PINGREQ"))
    client.expect("PINGRESP")
    assert client.expect("DISCONNECT", timeout=5).reason_code == 0x8D
    assert client.wait_closed()
    will = watcher.expect("PUBLISH", timeout=10)
    assert will.payload == b"gone"
    watcher.disconnect()


def test_credentials_pass_through_and_never_reach_the_log(
        proxy: MqttSidecarThread, mqguard_unique_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    client = RawMqtt(proxy.port, mqguard_unique_name, connect=False)
    client.send(mqtt_connect(mqguard_unique_name, username="device-user",
                             password=b"s3cret-pass"))
    assert client.expect("CONNACK").reason_code == 0  # Mosquitto allows anonymous
    client.send_raw(bytes([0x36, 0x00]))  # malformed: logged with its detail
    client.expect("DISCONNECT")
    deadline = time.monotonic() + 10
    while "malformed" not in caplog.text:  # logged by the loop thread, a moment later
        assert time.monotonic() < deadline, "the refusal was not logged"
        time.sleep(0.02)
    assert "s3cret-pass" not in caplog.text and "device-user" not in caplog.text


def test_connections_over_max_connections_are_refused(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    sidecar = MqttSidecar(config(tmp_path, **{"max-connections": 2}),
                          upstream_of(mqguard_mosquitto_server))
    with MqttSidecarThread(sidecar) as running:
        first = RawMqtt(running.port, f"{mqguard_unique_name}-1")
        second = RawMqtt(running.port, f"{mqguard_unique_name}-2", version="3.1.1")
        third = RawMqtt(running.port, f"{mqguard_unique_name}-3")
        assert third.connack is not None and third.connack.reason_code == 0x97
        assert third.wait_closed()
        old = RawMqtt(running.port, f"{mqguard_unique_name}-4", version="3.1.1")
        assert old.connack is not None and old.connack.reason_code == 3
        first.disconnect()
        deadline = time.monotonic() + 10
        while running.sidecar.driver is not None \
                and running.sidecar.driver.plane.connection_count() > 1:
            assert time.monotonic() < deadline, "the first connection did not end"
            time.sleep(0.05)
        again = RawMqtt(running.port, f"{mqguard_unique_name}-5")
        assert again.connack is not None and again.connack.reason_code == 0
        again.disconnect()
        second.disconnect()


def test_tls_listener(mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
                      mqguard_unique_name: str) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    sidecar = MqttSidecar(config(tmp_path), upstream_of(mqguard_mosquitto_server),
                          tls_files=(str(cert), str(key)))
    with MqttSidecarThread(sidecar) as running:
        context = ssl.create_default_context(cafile=str(cert))
        client = RawMqtt(running.port, mqguard_unique_name, connect=False)
        client.sock = context.wrap_socket(client.sock, server_hostname="127.0.0.1")
        client.send(mqtt_connect(mqguard_unique_name))
        assert client.expect("CONNACK").reason_code == 0
        client.subscribe(f"tls/{mqguard_unique_name}")
        client.publish(f"tls/{mqguard_unique_name}", b"sealed", packet_id=1)
        client.expect("PUBACK")
        assert client.expect("PUBLISH").payload == b"sealed"
        client.disconnect()
        # A plaintext client gets no MQTT answer from a TLS listener.
        plain = socket.create_connection(("127.0.0.1", running.port), timeout=10)
        plain.sendall(mqtt_connect(f"{mqguard_unique_name}-plain").encode())
        answer = b""
        while chunk := plain.recv(1024):
            answer += chunk
        plain.close()
        assert not answer.startswith(b"\x20")
        # A second sidecar reaches the first over TLS (mqtts://): verified against the
        # certificate, then refused when it trusts another one.
        chained = MqttSidecar(config(tmp_path / "chained"), ("127.0.0.1", running.port),
                              upstream_tls=(str(cert), False))
        with MqttSidecarThread(chained) as outer:
            client = RawMqtt(outer.port, f"{mqguard_unique_name}-chained")
            client.subscribe(f"tls/{mqguard_unique_name}")
            client.publish(f"tls/{mqguard_unique_name}", b"twice sealed", packet_id=2)
            client.expect("PUBACK")
            assert client.expect("PUBLISH").payload == b"twice sealed"
            client.disconnect()
        other_cert, other_key = tmp_path / "other.pem", tmp_path / "other-key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(other_key), "-out", str(other_cert)], check=True,
                       capture_output=True)
        wrong = MqttSidecar(config(tmp_path / "wrong"), ("127.0.0.1", running.port),
                            upstream_tls=(str(other_cert), False))
        with MqttSidecarThread(wrong) as outer:
            refused = RawMqtt(outer.port, f"{mqguard_unique_name}-wrong")
            assert refused.connack is not None and refused.connack.reason_code == 0x88


def test_random_octets_after_connect_never_take_the_sidecar_down(
        proxy: MqttSidecarThread, mqguard_unique_name: str) -> None:
    rng = random.Random(25)
    for round_number in range(60):
        client = RawMqtt(proxy.port, f"{mqguard_unique_name}-{round_number}",
                         version=rng.choice(["3.1.1", "5"]))
        # A plausible first byte (any packet type and flags), then noise.
        noise = bytes([rng.randrange(256)]) + rng.randbytes(rng.randrange(1, 64))
        client.send_raw(noise)
        client.sock.settimeout(0.2)
        with contextlib.suppress(OSError):
            client.sock.recv(4096)
        client.sock.close()
    still_serves(proxy, mqguard_unique_name)
    assert proxy.sidecar.driver is not None
    deadline = time.monotonic() + 10
    while proxy.sidecar.driver.plane.connection_count() > 0:
        assert time.monotonic() < deadline, "connections left behind"
        time.sleep(0.05)


def test_stop_settles_what_was_in_flight(tmp_path: Path, mqguard_unique_name: str) -> None:
    """A send the broker never confirmed when the sidecar stops is recorded as failed (its
    outcome is unknown), not left open."""
    listener = socket.create_server(("127.0.0.1", 0))
    sidecar = MqttSidecar(config(tmp_path, **{"drain-timeout-ms": 300}),
                          listener.getsockname()[:2])
    running = MqttSidecarThread(sidecar).start()
    try:
        client = RawMqtt(running.port, mqguard_unique_name, connect=False)
        client.send(mqtt_connect(mqguard_unique_name))
        broker, _ = listener.accept()  # a broker that accepts and never answers
        broker.settimeout(5)
        broker.recv(4096)
        broker.sendall(bytes([0x20, 3, 0, 0, 0]))
        client.expect("CONNACK")
        client.publish("stop/t", b"unconfirmed", packet_id=1)
        assert broker.recv(4096)[0] >> 4 == 3  # the PUBLISH reached the broker
    finally:
        running.stop()
    failed = [e for e in read_events(tmp_path / "events") if e["type"] == "send_failed"]
    assert [e["address"] for e in failed] == ["stop.t"]
    broker.close()
    listener.close()


def test_stop_tells_mqtt5_clients_and_settles_their_sends(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    sidecar = MqttSidecar(config(tmp_path), upstream_of(mqguard_mosquitto_server))
    running = MqttSidecarThread(sidecar).start()
    try:
        client = RawMqtt(running.port, mqguard_unique_name)
        client.publish(f"stop/{mqguard_unique_name}", b"last", packet_id=1)
        client.expect("PUBACK")
    finally:
        running.stop()
    assert client.expect("DISCONNECT").reason_code == 0x8B
    assert client.wait_closed()
    kinds = [e["type"] for e in read_events(tmp_path / "events")]
    assert kinds.count("sent") == 1 and "send_failed" not in kinds
