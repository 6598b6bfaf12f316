"""An explicit ``max-redelivery-delay = 0`` redelivers at once, on real brokers.

Artemis caps every computed delay with ``max-redelivery-delay``
(``QueueImpl.calculateRedeliveryDelay``); only an unset value defaults to
``10 x redelivery-delay``. With ``redelivery-delay`` 3 s and an explicit cap of 0 the
redelivery comes without the 3 s, through the wrapper and through the sidecar.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]
STORES = [pytest.param("memory", id="memory"),
          pytest.param("redis", marks=pytest.mark.redis, id="redis")]

#: Far above what an immediate redelivery takes, even on ActiveMQ (whose scheduler ticks
#: in whole seconds, so a delayed copy could never arrive inside GAP_BOUND_S).
POLICY_DELAY_MS = 3000
GAP_BOUND_S = 1.5


def settings(address: str) -> dict[str, Any]:
    return {address: {"max-delivery-attempts": 3, "redelivery-delay": POLICY_DELAY_MS,
                      "max-redelivery-delay": 0, "dead-letter-address": f"{address}.DLA"}}


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", BROKERS)
def test_wrapper_redelivers_at_once_with_an_explicit_zero_cap(
        kind: str, store: str, request: pytest.FixtureRequest, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    url = request.getfixturevalue(f"mqguard_{kind}_server").urls["stomp"]
    core: dict[str, Any] = {"node-id": "zero-cap", "store": store,
                            "event-log": {"directory": str(tmp_path / "events"),
                                          "flush-interval-ms": 20}}
    if store == "redis":
        core["store"] = request.getfixturevalue("mqguard_redis_url")
    guard = Guard(parse_config({"mqguard": core,
                                "address-settings": settings(mqguard_unique_name)})).start()
    calls: list[tuple[float, int]] = []

    def handler(message: Message) -> None:
        calls.append((time.monotonic(), message.delivery_count))
        if len(calls) == 1:
            raise Nack("first attempt fails")

    try:
        with GuardedConsumer(open_adapter(url), mqguard_unique_name, handler, guard), \
                GuardedProducer(open_adapter(url), guard) as producer:
            producer.send(mqguard_unique_name, b"retry me")
            wait_for(lambda: len(calls) >= 2, POLICY_DELAY_MS / 1000 + 10, "the redelivery")
        gap = calls[1][0] - calls[0][0]
        assert [count for _, count in calls] == [1, 2]
        assert gap < GAP_BOUND_S, f"redelivered after {gap:.2f} s; the cap of 0 was ignored"
        guard.events.flush()
        scheduled = [e for e in read_events(tmp_path / "events")
                     if e["type"] == "redelivery_scheduled"]
        assert [e["delay_ms"] for e in scheduled] == [0]
    finally:
        guard.close()


@pytest.fixture
def proxy(request: pytest.FixtureRequest, tmp_path: Path, mqguard_unique_name: str
          ) -> Iterator[SidecarThread]:
    kind = request.param
    config = parse_config({
        "mqguard": {"node-id": "zero-cap-sidecar",
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20}},
        "address-settings": settings(mqguard_unique_name)})
    server = request.getfixturevalue(f"mqguard_{kind}_server")
    sidecar = Sidecar(config, parse_upstream(server.urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        yield running


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.frames: list[tuple[float, Any]] = []

    def on_message(self, frame: Any) -> None:
        self.frames.append((time.monotonic(), frame))


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_sidecar_redelivers_at_once_with_an_explicit_zero_cap(
        proxy: SidecarThread, mqguard_unique_name: str) -> None:
    recorder = Recorder()
    conn = stomp.Connection12([("127.0.0.1", proxy.port)], vhost="/")
    conn.set_listener("r", recorder)
    conn.connect("guest", "guest", wait=True)
    try:
        queue = f"/queue/{mqguard_unique_name}"
        conn.send(queue, "retry me", receipt="sent")
        conn.subscribe(queue, id="s", ack="client-individual")
        wait_for(lambda: recorder.frames, 10, "the first delivery")
        conn.nack(recorder.frames[0][1].headers["ack"])
        wait_for(lambda: len(recorder.frames) >= 2, POLICY_DELAY_MS / 1000 + 10,
                 "the redelivery")
        conn.ack(recorder.frames[1][1].headers["ack"])
        gap = recorder.frames[1][0] - recorder.frames[0][0]
        assert recorder.frames[1][1].body == "retry me"
        assert gap < GAP_BOUND_S, f"redelivered after {gap:.2f} s; the cap of 0 was ignored"
    finally:
        conn.disconnect()
