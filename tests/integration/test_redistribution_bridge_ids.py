"""The redistributor's bridge ids against two real ActiveMQ nodes (issue 21, defects 1-3).

* ``BRIDGE.<queue>`` takes its capacity from the settings matching ``BRIDGE.<queue>``, the
  same as ``duplicate_detection``, so the two never resize the ring each other's way.
* A reservation of a copy's bridge id (what a guard in front of the target holds while the
  copy's transaction is open, and what a rolled-back one left behind before the fix) is
  not taken for a copy at the target: the original is copied, not just acknowledged.
* Through a sidecar in front of the target, the copies' transactions leave their bridge
  ids confirmed: a later re-send of a copy is dropped, never "in flight", never delivered.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.load_balancing import Received, drain

from mqguard.balancing import GroupConsumer, GroupProducer
from mqguard.config import MqguardConfig, parse_config
from mqguard.digest import id_digest
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.redistributor import FALLBACK_CACHE_SIZE, Redistributor, bridge_cache
from mqguard.registry import open_adapter
from mqguard.stores.base import RingOutcome

pytestmark = pytest.mark.activemq
pytest_plugins = ["mqguard.testing.cluster"]


def make_config(nodes: list[str], queue: str, tmp_path: Path,
                queue_settings: dict[str, Any] | None = None, **settings: Any
                ) -> MqguardConfig:
    return parse_config({
        "mqguard": {"node-id": "redistribution-bridge-ids",
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20},
                    "groups": {"g": {"nodes": nodes,
                                     "message-load-balancing": "OFF_WITH_REDISTRIBUTION",
                                     "queues": [queue]}}},
        "plugins": {"duplicate_detection": {"pending-timeout-ms": 500}},
        "address-settings": {queue: {"redistribution-delay": 0, **(queue_settings or {})},
                             **settings},
    })


def send_backlog(guard: Guard, queue: str, count: int) -> list[Message]:
    with GroupProducer("g", guard=guard, producer_id="backlog") as producer:
        return [producer.send(queue, f"m-{i}").message for i in range(count)]


def scan_once(guard: Guard) -> int:
    redistributor = Redistributor(guard, "g")
    try:
        return sum(r.moved for r in redistributor.scan())
    finally:
        redistributor.close()


@pytest.mark.parametrize(("settings", "capacity"), [
    pytest.param({"size": 5}, 20000, id="queue-size-not-used"),
    pytest.param({"size": 5, "BRIDGE.#": 7}, 7, id="bridge-settings"),
    pytest.param({"size": 0, "BRIDGE.#": 0}, FALLBACK_CACHE_SIZE, id="bridge-off-fallback"),
])
def test_bridge_cache_capacity_comes_from_its_own_settings(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str,
        settings: dict[str, int], capacity: int) -> None:
    url_a, url_b = (server.urls["stomp"] for server in mqguard_activemq_pair)
    extra: dict[str, Any] = {}
    if "BRIDGE.#" in settings:
        extra["BRIDGE.#"] = {"id-cache-size": settings["BRIDGE.#"]}
    config = make_config([url_a, url_b], mqguard_unique_name, tmp_path,
                         {"id-cache-size": settings["size"]}, **extra)
    received = Received()
    with Guard(config) as guard:
        assert guard.settings.resolve(mqguard_unique_name).id_cache_size == settings["size"]
        send_backlog(guard, mqguard_unique_name, 4)
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            assert scan_once(guard) == 4
            assert received.wait(4) == 4
        stats = guard.store.ring_stats(bridge_cache(mqguard_unique_name))
    assert stats is not None and stats.capacity == capacity


def test_a_reserved_bridge_id_is_not_taken_for_a_copy_at_the_target(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    """A reservation proves nothing (its copy's transaction may have rolled back): only a
    confirmed bridge id lets the original be acknowledged without a copy."""
    url_a, url_b = (server.urls["stomp"] for server in mqguard_activemq_pair)
    config = make_config([url_a, url_b], mqguard_unique_name, tmp_path)
    received = Received()
    with Guard(config) as guard:
        sent = send_backlog(guard, mqguard_unique_name, 5)
        reserved = id_digest(f"{sent[0].message_id}:0")
        guard.store.ring_reserve(bridge_cache(mqguard_unique_name), [reserved], 20000, 60_000)
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            moved = scan_once(guard)
            assert received.wait(5) == 5
            time.sleep(0.5)
        assert moved == 5
        assert sorted(m.message_id for m in received.messages) == sorted(
            m.message_id for m in sent)
        # The copy reached the target: its id is confirmed now, not left reserved.
        assert guard.store.ring_lookup(bridge_cache(mqguard_unique_name), [reserved],
                                       60_000) == [RingOutcome.DUPLICATE]
    assert drain(url_a, mqguard_unique_name) == []


def test_copies_through_a_sidecar_leave_their_bridge_ids_confirmed(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    """The target node is a sidecar in front of B: the copies and their marker commit in
    one transaction through it. Afterwards every bridge id is confirmed, and a copy sent
    again (a bridge's replay) is dropped even after pending-timeout-ms."""
    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    url_a, url_b = (server.urls["stomp"] for server in mqguard_activemq_pair)
    sidecar_config = make_config([url_b], mqguard_unique_name, tmp_path / "sidecar")
    received = Received()
    with SidecarThread(Sidecar(sidecar_config, parse_upstream(url_b),
                               admin=("127.0.0.1", 0))) as running:
        via_sidecar = f"stomp://127.0.0.1:{running.port}"
        config = make_config([url_a, via_sidecar], mqguard_unique_name, tmp_path)
        with Guard(config, store=running.sidecar.guard.store) as guard:
            sent = send_backlog(guard, mqguard_unique_name, 6)
            with GroupConsumer("g", via_sidecar, mqguard_unique_name, received, guard):
                moved = scan_once(guard)
                assert received.wait(6) == 6
            assert moved >= 1
            cache = bridge_cache(mqguard_unique_name)
            copied = [m for m in sent if m.message_id in
                      {c.message_id for c in received.messages}]
            digests = [id_digest(f"{m.message_id}:0") for m in copied]
            time.sleep(0.7)  # past pending-timeout-ms: a reservation would be taken over
            assert guard.store.ring_lookup(cache, digests, 500) == (
                [RingOutcome.DUPLICATE] * len(digests))
            # A replay of a copy by a plain client: the sidecar's guard decides.
            replay = open_adapter(via_sidecar)
            replay.connect()
            try:
                replay.send(received.messages[0])
            finally:
                replay.close()
    assert drain(url_b, mqguard_unique_name, first_s=0.5) == []
