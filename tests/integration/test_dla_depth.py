"""``mqguard_dla_depth`` / ``mqguard_dla_moved_total``: what the sidecar moved, plus the
broker's count when it is taken, on real brokers."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest
from mqguard_tests.dlq import Scenario, broker_url
from prometheus_client import CollectorRegistry, generate_latest

from mqguard.adapter import Adapter
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.dlq import PurgeOptions, attach, open_dlq_adapter, peek, purge
from mqguard.errors import Nack
from mqguard.message import Message, now_ms
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.servers import ServerHandle
from mqguard.sidecar.dla_depth import DeadLetterDepth
from mqguard.testing.waiting import wait_for


@pytest.mark.parametrize("kind", [pytest.param("activemq", marks=pytest.mark.activemq),
                                  pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_depth_follows_moves_and_the_broker_count(kind: str, request: pytest.FixtureRequest,
                                                  tmp_path: Path, mqguard_unique_name: str
                                                  ) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    registry = CollectorRegistry()

    def poison(message: Message) -> None:
        raise Nack("poison")

    with Guard(parse_config(scenario.config("sidecar"))) as guard:
        depth = DeadLetterDepth(guard, scenario.url)
        guard.plugins.register(depth)
        registry.register(depth)
        # Configured addresses are reported before anything moved.
        assert depth.depth(scenario.dla) == 0
        assert f'mqguard_dla_depth{{address="{scenario.dla}"}} 0.0' in \
            generate_latest(registry).decode()
        with GuardedConsumer(scenario.adapter("c"), scenario.name, poison, guard), \
                GuardedProducer(scenario.adapter("p"), guard) as producer:
            for i in range(3):
                producer.send(scenario.name, f"m-{i}".encode())
            wait_for(lambda: depth.depth(scenario.dla) == 3, 20, "three moves")
        depth.refresh()
        assert depth.depth(scenario.dla) == 3  # the broker agrees

        adapter = open_dlq_adapter(scenario.url, scenario.dla)
        adapter.connect()
        try:
            assert purge(guard, adapter, scenario.dla, PurgeOptions(limit=1)).purged == 1
        finally:
            adapter.close()
        assert depth.depth(scenario.dla) == 3  # not counted yet: what was moved
        depth.refresh()
        text = generate_latest(registry).decode()
    assert f'mqguard_dla_depth{{address="{scenario.dla}"}} 2.0' in text
    assert f'mqguard_dla_moved_total{{address="{scenario.dla}"}} 3.0' in text


@pytest.mark.activemq
def test_the_sidecar_admin_port_reports_it(mqguard_activemq_server: object, tmp_path: Path,
                                           mqguard_unique_name: str) -> None:
    import urllib.request

    import stomp  # type: ignore[import-untyped]

    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    url = mqguard_activemq_server.urls["stomp"]  # type: ignore[attr-defined]
    scenario = Scenario("activemq", url, mqguard_unique_name, tmp_path)
    sidecar = Sidecar(parse_config(scenario.config("sidecar")), parse_upstream(url),
                      admin=("127.0.0.1", 0))
    frames: list[object] = []
    with SidecarThread(sidecar) as running:
        conn = stomp.Connection12([("127.0.0.1", running.port)], vhost="/")
        conn.set_listener("c", type("L", (stomp.ConnectionListener,), {
            "on_message": lambda self, frame: frames.append(frame)})())
        conn.connect("guest", "guest", wait=True)
        try:
            conn.send(f"/queue/{scenario.name}", "poison", receipt="sent")
            conn.subscribe(f"/queue/{scenario.name}", id="s", ack="client-individual")
            wait_for(lambda: frames, 10, "the message")
            conn.nack(frames[0].headers["ack"])  # type: ignore[attr-defined]

            def metrics() -> str:
                admin = f"http://127.0.0.1:{running.sidecar.admin_port}/metrics"
                with urllib.request.urlopen(admin, timeout=5) as response:
                    return str(response.read().decode())

            line = f'mqguard_dla_depth{{address="{scenario.dla}"}} 1.0'
            wait_for(lambda: line in metrics(), 10, "the depth on /metrics")
            assert f'mqguard_dla_moved_total{{address="{scenario.dla}"}} 1.0' in metrics()
        finally:
            conn.disconnect()


@pytest.mark.mosquitto
def test_the_mqtt_sidecar_reports_its_moves_and_leaves_the_dead_letter_session_alone(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path, mqguard_unique_name: str
        ) -> None:
    """On Mosquitto only the ``mqguard-dlq.<address>`` session can read a dead-letter
    topic, and connecting as it would take it from an operator's ``mqguard dlq``: the MQTT
    sidecar's gauge is what it moved, never a count through that session."""
    from mqguard_tests.mqtt_raw import RawMqtt
    from mqguard_tests.mqtt_sidecar import running_mqtt_sidecar

    scenario = Scenario("mosquitto", mqguard_mosquitto_server.urls["mqtt"],
                        mqguard_unique_name, tmp_path)
    held = open_dlq_adapter(scenario.url, scenario.dla)
    held.connect()
    attach(held, scenario.dla)
    held.close()
    # A dead letter from before the sidecar: in the topic, not in the sidecar's gauge.
    earlier = scenario.adapter("earlier")
    earlier.connect()
    earlier.send(Message(address=scenario.dla, body=b"earlier"))
    earlier.close()
    config = parse_config(scenario.config("sidecar"))
    with running_mqtt_sidecar(config, mqguard_mosquitto_server, admin=("127.0.0.1", 0),
                              broker="mosquitto") as running:
        def metrics() -> str:
            admin = f"http://127.0.0.1:{running.sidecar.admin_port}/metrics"
            with urllib.request.urlopen(admin, timeout=5) as response:
                return str(response.read().decode())

        depth_line = f'mqguard_dla_depth{{address="{scenario.dla}"}}'
        moved_line = f'mqguard_dla_moved_total{{address="{scenario.dla}"}}'
        assert f"{depth_line} 0.0" in metrics()  # configured: reported before any move
        persistent = [("session_expiry_interval", 600)]
        device = f"{scenario.name}-device"
        sub = RawMqtt(running.port, device, clean=False, properties=persistent)
        sub.subscribe(scenario.name)
        pub = RawMqtt(running.port, f"{scenario.name}-p")
        before = now_ms()
        for i in range(3):
            pub.publish(scenario.name, f"m-{i}".encode(), packet_id=i + 1)
            pub.expect("PUBACK")
        pub.disconnect()
        assert len([sub.expect("PUBLISH") for _ in range(3)]) == 3
        # Crashed while handling them: at max-delivery-attempts 1 each is moved at once
        # (over the dropped client's broker leg, which the sidecar keeps to settle it:
        # the device stays away meanwhile, or its return would take that session over).
        sub.drop()
        wait_for(lambda: f"{moved_line} 3.0" in metrics(), 20, "three moves on /metrics")
        assert f"{depth_line} 3.0" in metrics()

        # An operator's `mqguard dlq` holds the session while the sidecar refreshes.
        operator = open_dlq_adapter(scenario.url, scenario.dla)
        operator.connect()
        try:
            running.sidecar.dla_depth.refresh()
            letters = peek(operator, scenario.dla, idle_ms=300, first_wait_ms=2000)
        finally:
            operator.close()
        assert sorted(letter.message.body for letter in letters) == [
            b"earlier", b"m-0", b"m-1", b"m-2"]
        assert running.sidecar.dla_depth.depth(scenario.dla) == 3
        # And `mqguard dlq show` still sees every one while the sidecar runs, with the
        # send time the sidecar stamped on the client's PUBLISH.
        rows = json.loads(scenario.run("show", scenario.dla, "--json"))["messages"]
        moved = [row for row in rows if row["original_address"] == scenario.name]
        assert len(rows) == 4 and len(moved) == 3
        for row in moved:
            assert before <= row["sent_at"] <= row["moved_at"] <= now_ms()
        assert f"{depth_line} 3.0" in metrics()


def test_no_broker_count_of_an_mqtt_dead_letter_topic(tmp_path: Path) -> None:
    with Guard(parse_config({"mqguard": {"event-log": {
            "directory": str(tmp_path / "events")}}})) as guard:
        opened: list[str] = []

        def never(url: str, address: str) -> Adapter:
            opened.append(address)
            raise AssertionError("connected")

        depth = DeadLetterDepth(guard, "mqtt://127.0.0.1:1", open_adapter=never)
        assert not depth.broker_counts
        depth._moved["x.DLA"] = 2
        depth.refresh()
        stop = threading.Event()
        depth.run(stop)  # returns at once: no thread needed
        assert opened == [] and depth.depth("x.DLA") == 2
        with pytest.raises(ValueError, match="mqguard-dlq session"):
            DeadLetterDepth(guard, "mqtts://127.0.0.1:1", broker_counts=True)
        assert DeadLetterDepth(guard, "stomp://127.0.0.1:1").broker_counts
