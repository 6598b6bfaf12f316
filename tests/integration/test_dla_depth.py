"""``mqguard_dla_depth`` / ``mqguard_dla_moved_total``: what the sidecar moved, plus the
broker's count when it is taken, on real brokers."""

from __future__ import annotations

from pathlib import Path

import pytest
from mqguard_tests.dlq import Scenario, broker_url
from prometheus_client import CollectorRegistry, generate_latest

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.dlq import PurgeOptions, open_dlq_adapter, purge
from mqguard.errors import Nack
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
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
