"""Load balancing across a broker group (Artemis MessageLoadBalancingType), docs/load-balancing.md.

Pure routing logic runs against a MemoryStore; the message counts per mode run against two
real ActiveMQ nodes on loopback (``mqguard_activemq_pair``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.load_balancing import Received, drain

from mqguard.adapter import SubscribeOptions
from mqguard.balancing import (
    ROUTED_EVENT,
    GroupConsumer,
    GroupProducer,
    GroupRouter,
    PresenceBeacon,
    node_name,
)
from mqguard.balancing_selector import SelectorError, compile_selector
from mqguard.config import MqguardConfig, parse_config
from mqguard.errors import ConfigError
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.stores.memory import MemoryStore

pytest_plugins = ["mqguard.testing.cluster"]

A, B, C = "stomp://127.0.0.1:1", "stomp://127.0.0.1:2", "stomp://127.0.0.1:3"


def make_config(nodes: list[str], mode: str, tmp_path: Path | None = None,
                **group: Any) -> MqguardConfig:
    core: dict[str, Any] = {"node-id": "lb-test", "groups": {
        "g": {"nodes": nodes, "message-load-balancing": mode, **group}}}
    if tmp_path is not None:
        core["event-log"] = {"directory": str(tmp_path / "events"), "flush-interval-ms": 20}
    else:
        core["event-log"] = {"enabled": False}
    return parse_config({"mqguard": core})


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(("group", "expected"), [
    ({"nodes": []}, "nodes"),
    ({"nodes": [A, A]}, "listed twice"),
    ({"nodes": ["127.0.0.1:61613"]}, "must be a broker URL"),
    ({"nodes": [A], "message-load-balancing": "ROUND_ROBIN"}, "must be one of OFF, STRICT"),
    ({"nodes": [A], "local": B}, "is not one of the nodes"),
    ({"nodes": [A], "queues": ["orders.#"]}, "without wildcards"),
    ({"nodes": [A], "presence-ttl-ms": 10}, "presence-ttl-ms"),
    ({"nodes": [A], "bogus": 1}, "unknown key"),
])
def test_group_config_errors_name_the_key(group: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"mqguard": {"groups": {"orders": group}}}, "mqguard.toml")
    text = str(info.value)
    assert "mqguard.toml" in text and "mqguard.groups.orders" in text
    assert expected in text


def test_group_config_never_prints_a_password() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"mqguard": {"groups": {"g": {
            "nodes": ["stomp://admin:s3cret@127.0.0.1:1", "stomp://admin:s3cret@127.0.0.1:1"]}}}})
    assert "s3cret" not in str(info.value) and "listed twice" in str(info.value)


def test_group_defaults_follow_artemis() -> None:
    config = parse_config({"mqguard": {"groups": {"g": {"nodes": [A, B]}}}})
    group = config.core.groups["g"]
    # Artemis: cluster-connection message-load-balancing defaults to ON_DEMAND,
    # redistribution-delay (address setting) to -1 (never).
    assert group.message_load_balancing == "ON_DEMAND"
    assert group.local_node() == A
    assert config.address_settings_repository().resolve("orders").redistribution_delay == -1
    lower = parse_config({"mqguard": {"groups": {"g": {
        "nodes": [A], "message-load-balancing": "off-with-redistribution"}}}})
    assert lower.core.groups["g"].message_load_balancing == "OFF_WITH_REDISTRIBUTION"


# -- selectors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("selector", "expected"), [
    ("color = 'red'", True), ("color <> 'red'", False), ("n > 3", True),
    ("n > 3 AND color = 'blue'", False), ("missing = 'x' OR n = 5", True),
    ("missing = 'x'", False), ("NOT missing = 'x'", False), ("missing IS NULL", True),
    ("color IN ('blue', 'red')", True), ("color NOT IN ('blue', 'red')", False),
    ("name LIKE 'it''_'", True), ("color LIKE 'r%'", True), ("n BETWEEN 1 AND 5", True),
    ("n NOT BETWEEN 1 AND 4", True), ("(color = 'red') AND NOT (n < 2)", True),
])
def test_selector_evaluation(selector: str, expected: bool) -> None:
    headers = {"color": "red", "n": "5", "name": "it's"}
    assert compile_selector(selector).matches(headers) is expected


@pytest.mark.parametrize("selector", ["n + 1 > 2", "color =", "(a = 'b'", "a ~ 1"])
def test_unsupported_selectors_raise(selector: str) -> None:
    with pytest.raises(SelectorError):
        compile_selector(selector)


# -- routing logic --------------------------------------------------------------------------


def route_nodes(router: GroupRouter, count: int, **headers: str) -> list[str]:
    return [router.choose(Message("q", headers=dict(headers))).node for _ in range(count)]


def test_off_and_off_with_redistribution_stay_local() -> None:
    store = MemoryStore()
    PresenceBeacon(store, "g", node_name(B), "q").start()
    for mode in ("OFF", "OFF_WITH_REDISTRIBUTION"):
        router = GroupRouter("g", make_config([A, B], mode).core.groups["g"], store)
        assert route_nodes(router, 4) == [node_name(A)] * 4
    router = GroupRouter("g", make_config([A, B], "OFF", local=B).core.groups["g"], store)
    assert route_nodes(router, 2) == [node_name(B)] * 2


def test_strict_round_robin_ignores_consumers() -> None:
    store = MemoryStore()
    PresenceBeacon(store, "g", node_name(C), "q").start()
    router = GroupRouter("g", make_config([A, B, C], "STRICT").core.groups["g"], store)
    assert route_nodes(router, 6) == [node_name(n) for n in (A, B, C, A, B, C)]


def test_on_demand_follows_consumers_and_selectors() -> None:
    store = MemoryStore()
    router = GroupRouter("g", make_config([A, B, C], "ON_DEMAND").core.groups["g"], store)
    # Nobody consumes: the local node keeps everything.
    assert route_nodes(router, 3) == [node_name(A)] * 3
    on_b = PresenceBeacon(store, "g", node_name(B), "q").start()
    assert route_nodes(router, 3) == [node_name(B)] * 3
    # Another group's consumer and another queue's consumer do not count.
    PresenceBeacon(store, "other", node_name(C), "q").start()
    PresenceBeacon(store, "g", node_name(C), "other-queue").start()
    assert route_nodes(router, 2) == [node_name(B)] * 2
    on_c = PresenceBeacon(store, "g", node_name(C), "q", selector="color = 'red'").start()
    assert route_nodes(router, 4, color="red") == [node_name(n) for n in (C, B, C, B)]
    assert route_nodes(router, 3, color="blue") == [node_name(B)] * 3
    on_b.stop()
    assert route_nodes(router, 2, color="blue") == [node_name(A)] * 2
    assert route_nodes(router, 2, color="red") == [node_name(C)] * 2
    on_c.stop()
    assert route_nodes(router, 1, color="red") == [node_name(A)]


def test_on_demand_forgets_a_consumer_that_stops_beating() -> None:
    store = MemoryStore()
    router = GroupRouter("g", make_config([A, B], "ON_DEMAND").core.groups["g"], store)
    beacon = PresenceBeacon(store, "g", node_name(B), "q", ttl_ms=300)
    store.presence_beat("q", beacon.member, beacon.info, 300)  # one beat, then silence
    assert route_nodes(router, 1) == [node_name(B)]
    time.sleep(0.4)
    assert route_nodes(router, 1) == [node_name(A)]


# -- two real ActiveMQ nodes --------------------------------------------------------------------


def stomp_urls(pair: tuple[Any, Any]) -> tuple[str, str]:
    return pair[0].urls["stomp"], pair[1].urls["stomp"]


@pytest.mark.activemq
@pytest.mark.parametrize(("mode", "expected_a"), [
    ("OFF", 10), ("OFF_WITH_REDISTRIBUTION", 10), ("STRICT", 5), ("ON_DEMAND", 10)])
def test_counts_per_node_without_consumers(mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path,
                                           mqguard_unique_name: str, mode: str,
                                           expected_a: int) -> None:
    url_a, url_b = stomp_urls(mqguard_activemq_pair)
    config = make_config([url_a, url_b], mode, tmp_path)
    with GroupProducer("g", config, producer_id="p") as producer:
        for i in range(10):
            assert producer.send(mqguard_unique_name, f"m{i}").sent
    on_a, on_b = drain(url_a, mqguard_unique_name), drain(url_b, mqguard_unique_name)
    assert (len(on_a), len(on_b)) == (expected_a, 10 - expected_a)
    routed = [e for e in read_events(tmp_path / "events") if e["type"] == ROUTED_EVENT]
    assert len(routed) == 10 and {e["mode"] for e in routed} == {mode}
    assert sum(e["target_node"] == node_name(url_a) for e in routed) == expected_a
    # One sequence for the group, whatever node a message went to.
    assert sorted(m.sequence or 0 for m in on_a + on_b) == list(range(1, 11))


@pytest.mark.activemq
def test_on_demand_sends_nothing_to_a_node_without_consumers(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = stomp_urls(mqguard_activemq_pair)
    config = make_config([url_a, url_b], "ON_DEMAND", tmp_path)
    received = Received()
    with Guard(config) as guard, \
            GroupConsumer("g", url_b, mqguard_unique_name, received, guard), \
            GroupProducer("g", guard=guard, producer_id="p") as producer:
        for i in range(20):
            producer.send(mqguard_unique_name, f"m{i}")
        assert received.wait(20) == 20
    assert drain(url_a, mqguard_unique_name) == []
    assert drain(url_b, mqguard_unique_name, first_s=0.5) == []
    assert sorted(m.body for m in received.messages) == sorted(f"m{i}".encode()
                                                               for i in range(20))


@pytest.mark.activemq
def test_on_demand_round_robin_and_consumer_filters(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = stomp_urls(mqguard_activemq_pair)
    config = make_config([url_a, url_b], "ON_DEMAND", tmp_path)
    on_a, red_on_b = Received(), Received()
    red = SubscribeOptions(selector="color = 'red'")
    with Guard(config) as guard, \
            GroupConsumer("g", url_a, mqguard_unique_name, on_a, guard), \
            GroupConsumer("g", url_b, mqguard_unique_name, red_on_b, guard, options=red), \
            GroupProducer("g", guard=guard, producer_id="p") as producer:
        for i in range(10):
            producer.send(mqguard_unique_name, f"red{i}", headers={"color": "red"})
        for i in range(6):
            producer.send(mqguard_unique_name, f"blue{i}", headers={"color": "blue"})
        assert on_a.wait(11) == 11
        assert red_on_b.wait(5) == 5
        time.sleep(0.5)
    # Red alternates between the two nodes; blue only matches the consumer on A.
    assert sorted(m.body for m in red_on_b.messages) == sorted(
        f"red{i}".encode() for i in range(1, 10, 2))
    assert len(on_a.messages) == 11
    assert drain(url_a, mqguard_unique_name, first_s=0.5) == []
    assert drain(url_b, mqguard_unique_name, first_s=0.5) == []
