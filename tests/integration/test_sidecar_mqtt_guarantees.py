"""The MQTT sidecar's expiry and consumer audit, and stock command-line clients
(mosquitto_pub / mosquitto_sub), in front of REAL Mosquitto."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import mqtt_sidecar_config, running_mqtt_sidecar, sidecar_events

from mqguard.events import read_events
from mqguard.message import new_message_id
from mqguard.mqtt_codec import MqttDecoder, mqtt_publish
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread
from mqguard.servers import ServerHandle

pytestmark = pytest.mark.mosquitto


@pytest.fixture
def proxy(mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
          request: pytest.FixtureRequest) -> Iterator[MqttSidecarThread]:
    config = mqtt_sidecar_config(tmp_path, "mqtt-guarantees",
                                 address=getattr(request, "param", {}))
    with running_mqtt_sidecar(config, mqguard_mosquitto_server) as running:
        yield running


def events(tmp_path: Path, proxy: MqttSidecarThread) -> list[dict[str, Any]]:
    return sidecar_events(tmp_path, proxy)


@pytest.mark.parametrize("proxy", [{"expiry-delay": 60_000}], indirect=True)
def test_expiry_delay_stamps_the_message_expiry_interval(proxy: MqttSidecarThread,
                                                         mqguard_unique_name: str) -> None:
    topic = f"e/{mqguard_unique_name}"
    sub = RawMqtt(proxy.port, f"{mqguard_unique_name}-s")
    sub.subscribe(topic)
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p")
    pub.publish(topic, b"fresh", packet_id=1)
    pub.expect("PUBACK")
    got = sub.expect("PUBLISH")
    assert got.payload == b"fresh"
    assert got.message_expiry_interval is not None and 50 <= got.message_expiry_interval <= 60
    sub.disconnect()
    pub.disconnect()


@pytest.mark.parametrize("proxy", [{"expiry-address": "EXP.mqtt"}], indirect=True)
def test_expired_message_goes_to_the_expiry_address(proxy: MqttSidecarThread,
                                                    mqguard_unique_name: str,
                                                    tmp_path: Path) -> None:
    """A message that expires while its subscriber is away reaches the expiry topic
    instead of vanishing (Mosquitto alone drops it without a trace)."""
    topic = f"x/{mqguard_unique_name}"
    session = [("session_expiry_interval", 600)]
    watcher = RawMqtt(proxy.port, f"{mqguard_unique_name}-w")
    watcher.subscribe("EXP/#")
    device = f"{mqguard_unique_name}-device"
    sub = RawMqtt(proxy.port, device, clean=False, properties=session)
    sub.subscribe(topic)
    sub.disconnect()
    pub = RawMqtt(proxy.port, f"{mqguard_unique_name}-p")
    pub.publish(topic, b"short-lived", packet_id=1,
                properties=[("message_expiry_interval", 1)])
    pub.publish(topic, b"long-lived", packet_id=2,
                properties=[("message_expiry_interval", 600)])
    assert sorted(pub.expect("PUBACK").packet_id for _ in range(2)) == [1, 2]
    time.sleep(1.2)
    sub = RawMqtt(proxy.port, device, clean=False, properties=session)
    got = [sub.expect("PUBLISH"), *sub.collect("PUBLISH", 0.3)]
    assert [p.payload for p in got] == [b"long-lived"]
    assert got[0].message_expiry_interval is not None and got[0].message_expiry_interval > 500
    sub.ack(got[0].packet_id or 0)
    expired = watcher.expect("PUBLISH")
    assert expired.payload == b"short-lived" and expired.topic == "EXP/mqtt"
    assert dict(expired.user_properties)["_AMQ_ORIG_ADDRESS"] == f"x.{mqguard_unique_name}"
    for client in (sub, pub, watcher):
        client.disconnect()
    kinds = [e["type"] for e in events(tmp_path, proxy)]
    assert "expired" in kinds


class ScriptedBroker:
    """A broker that delivers one message, takes the subscriber's PUBACK, and "loses" it:
    it drops the connection and, on the next one, redelivers the message with DUP set (what
    a broker that crashed before persisting the acknowledgement does)."""

    def __init__(self, message_id: str) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.message_id = message_id
        self.acks: list[list[int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _session(self, conn: socket.socket, publishes: list[tuple[int, bytes, bool]]) -> None:
        decoder = MqttDecoder("5")
        packets: list[Any] = []
        while not packets:
            packets += decoder.feed(conn.recv(65536))
        assert packets.pop(0).type == "CONNECT"
        conn.sendall(bytes([0x20, 3, 1, 0, 0]))
        for packet_id, body, dup in publishes:
            conn.sendall(mqtt_publish("audit/t", body, qos=1, packet_id=packet_id, dup=dup,
                                      properties=[("user_property", (
                                          "mqguard-id", f"{self.message_id}.{packet_id}"))]
                                      ).encode())
        acks: list[int] = []
        deadline = time.monotonic() + 3
        conn.settimeout(0.2)
        while time.monotonic() < deadline and len(acks) < len(publishes):
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            acks += [p.packet_id for p in decoder.feed(data) if p.type == "PUBACK"]
        self.acks.append(acks)
        conn.close()

    def _run(self) -> None:
        first, _ = self.listener.accept()
        self._session(first, [(1, b"handled", False)])
        second, _ = self.listener.accept()
        self._session(second, [(1, b"handled", True), (2, b"new", False)])


def test_redelivery_of_an_acknowledged_message_is_not_handed_again(
        tmp_path: Path, mqguard_unique_name: str) -> None:
    broker = ScriptedBroker(new_message_id())
    sidecar = MqttSidecar(mqtt_sidecar_config(tmp_path, "mqtt-guarantees"),
                          ("127.0.0.1", broker.port))
    with MqttSidecarThread(sidecar) as running:
        sub = RawMqtt(running.port, mqguard_unique_name, clean=False)
        first = sub.expect("PUBLISH")
        assert first.payload == b"handled"
        sub.ack(first.packet_id or 0)
        assert sub.wait_closed(), "the scripted broker drops the connection"
        sub = RawMqtt(running.port, mqguard_unique_name, clean=False)
        got = [sub.expect("PUBLISH"), *sub.collect("PUBLISH", 0.3)]
        assert [p.payload for p in got] == [b"new"], "the DUP redelivery reached the client"
        sub.ack(got[0].packet_id or 0)
        broker.thread.join(5)
        # The suppressed redelivery was acknowledged upstream by the sidecar itself.
        assert broker.acks == [[1], [1, 2]]
        sub.drop()
        kinds = [e["type"] for e in events(tmp_path, running)]
    assert "duplicate_delivery_suppressed" in kinds


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_and_sub_through_the_sidecar(proxy: MqttSidecarThread, version: str,
                                                   mqguard_unique_name: str) -> None:
    topic = f"cli/{mqguard_unique_name}"
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(proxy.port),
                            "-V", version, "-q", "1", "-t", topic, "-C", "3", "-W", "20"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # subscribed (MQTT keeps nothing for a subscription not made yet)
        for i in range(3):
            subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(proxy.port),
                            "-V", version, "-q", str(i % 3), "-t", topic, "-m", f"m{i}"],
                           check=True, timeout=20)
        out, err = sub.communicate(timeout=25)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert out.split() == ["m0", "m1", "m2"]


NODE_CLIENT = Path(__file__).resolve().parents[1] / "support" / "mqtt-node"


@pytest.fixture(scope="session")
def npm_mqtt() -> Path:
    """The npm ``mqtt`` client (deploy/local/install.sh installs it from its lock file)."""
    script = NODE_CLIENT / "pubsub.js"
    if not (NODE_CLIENT / "node_modules" / "mqtt").is_dir():
        subprocess.run(["npm", "ci", "--prefix", str(NODE_CLIENT), "--no-audit", "--no-fund",
                        "--loglevel=error"], check=True, timeout=600)
    return script


@pytest.mark.parametrize("version", ["4", "5"])
def test_npm_mqtt_client_through_the_sidecar(proxy: MqttSidecarThread, npm_mqtt: Path,
                                             mqguard_unique_name: str, version: str) -> None:
    run = subprocess.run(["node", str(npm_mqtt), "--port", str(proxy.port), "--topic",
                          f"npm/{mqguard_unique_name}", "--count", "6", "--version", version,
                          "--dup-id-every", "2"],
                         capture_output=True, text=True, timeout=60, check=False)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and not result["errors"], (result, run.stderr)
    if version == "5":
        # Pairs share an _AMQ_DUPL_ID: the second of each pair is a duplicate.
        assert result["received"] == ["m0", "m2", "m4"]
        assert result["seq"] == ["0", "2", "4"]
    else:
        assert result["received"] == [f"m{i}" for i in range(6)]


def test_cli_process_serves_health_metrics_and_stops_on_sigterm(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    config = tmp_path / "mqguard.toml"
    config.write_text(f'[mqguard]\nnode-id = "mqtt-cli"\n\n[mqguard.event-log]\n'
                      f'directory = "{tmp_path / "events"}"\n')
    upstream = f"mqtt://127.0.0.1:{mqguard_mosquitto_server.port('mqtt')}?broker=mosquitto"
    log = tmp_path / "sidecar.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mqguard.cli", "sidecar", "--protocol",
                                 "mqtt", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                                 "--upstream", upstream, "-c", str(config)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        ready = "mqguard sidecar (mqtt) listening on "
        while ready not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        line = next(x for x in log.read_text().splitlines() if x.startswith(ready))
        port = int(line[len(ready):].split(",")[0].rpartition(":")[2])
        admin = int(line.rpartition("admin on port ")[2])
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/health", timeout=5) as answer:
            health = json.loads(answer.read())
        assert health["status"] == "ok" and health["upstream_reachable"]
        client = RawMqtt(port, mqguard_unique_name)
        client.subscribe(f"cli/{mqguard_unique_name}")
        client.publish(f"cli/{mqguard_unique_name}", b"via-cli", packet_id=1)
        client.expect("PUBACK")
        assert client.expect("PUBLISH").payload == b"via-cli"
        client.disconnect()
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert 'mqguard_mqtt_sidecar_messages_total{path="send",verdict="forwarded"} 1.0' \
            in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sent = [e for e in read_events(tmp_path / "events") if e["type"] == "sent"]
    assert [e["address"] for e in sent] == [f"cli.{mqguard_unique_name}"]
