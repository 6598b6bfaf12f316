"""Redistribution across two real ActiveMQ nodes (Artemis BindingsImpl.redistribute).

A backlog stranded on node A (no consumer there) moves to node B, where a consumer
announced itself through the store, once ``redistribution-delay`` has passed and not
before; selectors are honoured; a copy confirmed by an earlier attempt is not sent
twice. The SIGKILL test with the Spark audit is tests/audit/test_redistribution_crash.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.load_balancing import Received, drain

from mqguard.adapter import SubscribeOptions
from mqguard.balancing import GroupConsumer, GroupProducer, node_name
from mqguard.config import MqguardConfig, parse_config
from mqguard.digest import id_digest
from mqguard.events import read_events
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.redistributor import (
    HOPS_HEADER,
    REDISTRIBUTED_EVENT,
    Redistributor,
    bridge_cache,
)
from mqguard.registry import open_adapter

pytestmark = pytest.mark.activemq
pytest_plugins = ["mqguard.testing.cluster"]


def make_config(url_a: str, url_b: str, queue: str, tmp_path: Path, *, delay: int,
                mode: str = "OFF_WITH_REDISTRIBUTION") -> MqguardConfig:
    return parse_config({
        "mqguard": {"node-id": "redistribution-test",
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20},
                    "groups": {"g": {"nodes": [url_a, url_b], "message-load-balancing": mode,
                                     "queues": [queue]}}},
        "address-settings": {queue: {"redistribution-delay": delay}},
    })


def urls(pair: tuple[Any, Any]) -> tuple[str, str]:
    return pair[0].urls["stomp"], pair[1].urls["stomp"]


def send_backlog(guard: Guard, queue: str, count: int, **headers: str) -> list[Message]:
    with GroupProducer("g", guard=guard, producer_id=f"p-{headers}") as producer:
        return [producer.send(queue, f"{headers}-{i}", headers=headers).message
                for i in range(count)]


class Timed(Received):
    def __init__(self) -> None:
        super().__init__()
        self.first_at: float | None = None

    def __call__(self, message: Message) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        super().__call__(message)


def test_stranded_backlog_moves_after_the_delay_and_not_before(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = urls(mqguard_activemq_pair)
    delay_ms = 2000
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=delay_ms)
    received = Timed()
    stop = threading.Event()
    with Guard(config) as guard:
        sent = send_backlog(guard, mqguard_unique_name, 30)
        redistributor = Redistributor(guard, "g", batch_size=7)
        started = time.monotonic()
        runner = threading.Thread(target=redistributor.run, args=(stop, 100), daemon=True)
        runner.start()
        try:
            with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
                time.sleep(delay_ms / 1000 * 0.6)
                assert received.messages == [], "moved before redistribution-delay"
                assert received.wait(30, timeout=30) == 30
        finally:
            stop.set()
            runner.join(10)
            redistributor.close()
    assert received.first_at is not None
    assert received.first_at - started >= delay_ms / 1000 - 0.05
    # Everything moved once, with its identity, a bridge duplicate id and its hop count.
    assert sorted(m.message_id for m in received.messages) == sorted(m.message_id for m in sent)
    assert {m.headers[HOPS_HEADER] for m in received.messages} == {"1"}
    assert {m.headers[BRIDGE_DUPLICATE_ID_HEADER] for m in received.messages} == {
        f"{m.message_id}:0" for m in sent}
    assert drain(url_a, mqguard_unique_name, first_s=0.5) == []
    moves = [e for e in read_events(tmp_path / "events") if e["type"] == REDISTRIBUTED_EVENT]
    assert len(moves) == 30
    assert {(e["source_node"], e["target_node"]) for e in moves} == {
        (node_name(url_a), node_name(url_b))}


def test_nothing_moves_when_delay_is_minus_one_or_mode_forbids_it(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = urls(mqguard_activemq_pair)
    received = Received()
    cases = [("OFF_WITH_REDISTRIBUTION", -1, "never"), ("STRICT", 0, "off"), ("OFF", 0, "off")]
    for mode, delay, state in cases:
        config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=delay, mode=mode)
        with Guard(config) as guard:
            if mode == "OFF_WITH_REDISTRIBUTION":
                send_backlog(guard, mqguard_unique_name, 5)
            with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
                redistributor = Redistributor(guard, "g")
                try:
                    results = redistributor.scan()
                finally:
                    redistributor.close()
                assert {r.state for r in results} == {state}
                time.sleep(0.3)
    assert received.messages == []
    assert len(drain(url_a, mqguard_unique_name)) == 5


def test_consumer_filters_are_honoured_and_nothing_goes_back(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = urls(mqguard_activemq_pair)
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=0)
    red_on_b = Received()
    with Guard(config) as guard:
        send_backlog(guard, mqguard_unique_name, 10, color="red")
        send_backlog(guard, mqguard_unique_name, 10, color="blue")
        red = SubscribeOptions(selector="color = 'red'")
        with GroupConsumer("g", url_b, mqguard_unique_name, red_on_b, guard, options=red):
            redistributor = Redistributor(guard, "g")
            try:
                results = {r.node: r for r in redistributor.scan()}
                # B has a consumer: nothing is taken from it (the originating queue is
                # never a target, and a queue with consumers is never a source).
                assert results[node_name(url_b)].state == "has-consumers"
                assert results[node_name(url_a)].moved == 10
                assert red_on_b.wait(10) == 10
                assert redistributor.scan()[0].moved == 0
            finally:
                redistributor.close()
    assert {m.headers["color"] for m in red_on_b.messages} == {"red"}
    left = drain(url_a, mqguard_unique_name)
    assert sorted(m.body for m in left) == sorted(f"{{'color': 'blue'}}-{i}".encode()
                                                  for i in range(10))


def test_a_copy_confirmed_earlier_is_not_sent_again(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    """The state a crash between recording a copy and acknowledging its original leaves:
    the next attempt only acknowledges the original. A re-send of a copy through a guard
    is refused by duplicate_detection against the same BRIDGE cache."""
    url_a, url_b = urls(mqguard_activemq_pair)
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=0)
    received = Received()
    with Guard(config) as guard:
        sent = send_backlog(guard, mqguard_unique_name, 6)
        capacity = guard.settings.resolve(mqguard_unique_name).id_cache_size
        guard.store.ring_check_and_add(bridge_cache(mqguard_unique_name),
                                       [id_digest(f"{sent[0].message_id}:0")], capacity)
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            moved = scan_once(guard)
            assert moved == 5
            assert received.wait(5) == 5
            time.sleep(0.5)
        assert sent[0].message_id not in {m.message_id for m in received.messages}
        assert drain(url_a, mqguard_unique_name) == []
        copy = received.messages[0]
        with GuardedProducer(open_adapter(url_b), guard) as producer:
            again = producer.send_message(copy)
        assert not again.sent
    assert drain(url_b, mqguard_unique_name, first_s=0.5) == []


def test_sidecar_hosts_the_redistributor_with_metrics(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    import urllib.request

    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    url_a, url_b = urls(mqguard_activemq_pair)
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=0)
    received = Received()
    with Guard(config) as guard:
        send_backlog(guard, mqguard_unique_name, 12)
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            sidecar = Sidecar(config, parse_upstream(url_a), admin=("127.0.0.1", 0),
                              guard=guard, redistribute=["g"])
            with SidecarThread(sidecar) as running:
                assert received.wait(12) == 12
                url = f"http://127.0.0.1:{running.admin_port}/metrics"
                metrics = urllib.request.urlopen(url, timeout=5).read().decode()
    line = (f'mqguard_redistributed_total{{group="g",source="{node_name(url_a)}",'
            f'target="{node_name(url_b)}"}} 12.0')
    assert line in metrics
    assert drain(url_a, mqguard_unique_name, first_s=0.5) == []


def test_copies_committed_but_not_recorded_are_found_by_their_marker(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    """The state a crash between the target's COMMIT and recording the bridge ids leaves:
    the ids pending, the copies and their batch's marker on B. The next attempt finds the
    marker, records the ids and acknowledges the originals; it sends no second copy."""
    from mqguard.redistributor import _marker, marker_queue, pending_cache_name

    url_a, url_b = urls(mqguard_activemq_pair)
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=0)
    received = Received()
    with Guard(config) as guard:
        sent = send_backlog(guard, mqguard_unique_name, 6)
        capacity = guard.settings.resolve(mqguard_unique_name).id_cache_size
        bridge_ids = [f"{m.message_id}:0" for m in sent[:2]]
        guard.store.ring_check_and_add(pending_cache_name(mqguard_unique_name),
                                       [id_digest(b) for b in bridge_ids], capacity)
        node_b = open_adapter(url_b)
        node_b.connect()
        try:
            for message, bridge_id in zip(sent[:2], bridge_ids, strict=True):
                node_b.send(Redistributor._copy(message, mqguard_unique_name, node_name(url_a),
                                                bridge_id))
            node_b.send(_marker(mqguard_unique_name, bridge_ids))
        finally:
            node_b.close()
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            moved = scan_once(guard)
            assert received.wait(6) == 6
            time.sleep(0.5)
        assert moved == 4
        assert sorted(m.message_id for m in received.messages) == sorted(
            m.message_id for m in sent)
        assert guard.store.ring_contains(bridge_cache(mqguard_unique_name),
                                         [id_digest(b) for b in bridge_ids]) == [True, True]
    assert drain(url_a, mqguard_unique_name) == []
    # Every marker was consumed once all its copies were recorded.
    assert drain(url_b, marker_queue(mqguard_unique_name), first_s=0.5) == []
    reasons = {e["message_id"]: e["reason"] for e in read_events(tmp_path / "events")
               if e["type"] == REDISTRIBUTED_EVENT}
    assert {reasons[m.message_id] for m in sent[:2]} == {
        "copy committed by an earlier attempt (found by its marker)"}


def scan_once(guard: Guard) -> int:
    """One pass of a fresh redistributor of group "g": how many messages it moved."""
    redistributor = Redistributor(guard, "g")
    try:
        return sum(r.moved for r in redistributor.scan())
    finally:
        redistributor.close()


@pytest.mark.rabbitmq
def test_one_activemq_and_one_rabbitmq_node(mqguard_activemq_server: Any,
                                            mqguard_rabbitmq_server: Any,
                                            tmp_path: Path, mqguard_unique_name: str) -> None:
    """A mixed group: STRICT spreads over both brokers; redistribution works both ways
    (to ActiveMQ with markers, to RabbitMQ -- no browse, no selectors -- without)."""
    from mqguard.balancing import GroupProducer as Producer

    amq, rabbit = mqguard_activemq_server.urls["stomp"], mqguard_rabbitmq_server.urls["stomp"]
    strict = make_config(amq, rabbit, mqguard_unique_name, tmp_path, delay=0, mode="STRICT")
    with Producer("g", strict, producer_id="mixed") as producer:
        for i in range(10):
            producer.send(mqguard_unique_name, f"s{i}")
    assert (len(drain(amq, mqguard_unique_name)), len(drain(rabbit, mqguard_unique_name))) == (5, 5)

    for source, target in ((rabbit, amq), (amq, rabbit)):
        config = make_config(amq, rabbit, mqguard_unique_name, tmp_path, delay=0)
        group = config.core.groups["g"].model_copy(update={"local": source})
        config = config.model_copy(update={"core": config.core.model_copy(
            update={"groups": {"g": group}})})
        received = Received()
        with Guard(config) as guard:
            sent = send_backlog(guard, mqguard_unique_name, 8)
            with GroupConsumer("g", target, mqguard_unique_name, received, guard):
                moved = scan_once(guard)
                assert received.wait(8) == 8
                time.sleep(0.5)
        assert moved == 8
        assert sorted(m.message_id for m in received.messages) == sorted(
            m.message_id for m in sent)
        assert drain(source, mqguard_unique_name, first_s=0.5) == []
        assert drain(target, mqguard_unique_name, first_s=0.5) == []


@pytest.mark.redis
def test_redistribute_command_one_pass(mqguard_activemq_pair: tuple[Any, Any],
                                       mqguard_redis_url: str,
                                       tmp_path: Path, mqguard_unique_name: str) -> None:
    import json

    from click.testing import CliRunner

    from mqguard.cli import main

    url_a, url_b = urls(mqguard_activemq_pair)
    toml = tmp_path / "mqguard.toml"
    toml.write_text(
        f'[mqguard]\nstore = "{mqguard_redis_url}"\n'
        f'[mqguard.event-log]\ndirectory = "{tmp_path / "events"}"\n'
        f'[mqguard.groups.g]\nnodes = ["{url_a}", "{url_b}"]\n'
        'message-load-balancing = "ON_DEMAND"\n'
        f'[address-settings."{mqguard_unique_name}"]\nredistribution-delay = 0\n')
    runner = CliRunner()
    no_queues = runner.invoke(main, ["redistribute", "-g", "g", "-c", str(toml)])
    assert no_queues.exit_code == 2 and "no queues" in no_queues.output
    unknown = runner.invoke(main, ["redistribute", "-g", "nope", "-c", str(toml)])
    assert unknown.exit_code == 1 and "no [mqguard.groups.nope]" in unknown.output
    config = parse_config({"mqguard": {"store": mqguard_redis_url, "event-log": {"enabled": False},
                                       "groups": {"g": {"nodes": [url_a, url_b]}}}})
    received = Received()
    with Guard(config) as guard:
        with GroupProducer("g", guard=guard) as producer:  # ON_DEMAND, no consumer: local A
            for i in range(5):
                producer.send(mqguard_unique_name, f"m{i}")
        with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
            result = runner.invoke(main, ["redistribute", "-g", "g", "-q", mqguard_unique_name,
                                          "-c", str(toml), "--json"])
            assert result.exit_code == 0, result.output
            assert received.wait(5) == 5
    rows = {row["node"]: row for row in map(json.loads, result.output.splitlines())}
    assert rows[node_name(url_a)]["state"] == "moved" and rows[node_name(url_a)]["moved"] == 5
    assert rows[node_name(url_a)]["targets"] == {node_name(url_b): 5}
    assert rows[node_name(url_b)]["state"] == "has-consumers"


def test_redistribution_stops_when_the_source_gets_a_consumer_again(
        mqguard_activemq_pair: tuple[Any, Any], tmp_path: Path, mqguard_unique_name: str) -> None:
    url_a, url_b = urls(mqguard_activemq_pair)
    config = make_config(url_a, url_b, mqguard_unique_name, tmp_path, delay=0)
    on_a, on_b = Received(), Received()
    results: list[Any] = []
    with Guard(config) as guard:
        sent = send_backlog(guard, mqguard_unique_name, 40)
        with GroupConsumer("g", url_b, mqguard_unique_name, on_b, guard):
            redistributor = Redistributor(guard, "g", batch_size=2, pause_ms=150)
            scan = threading.Thread(target=lambda: results.extend(redistributor.scan()))
            scan.start()
            try:
                assert on_b.wait(2) >= 2
                with GroupConsumer("g", url_a, mqguard_unique_name, on_a, guard):
                    scan.join(30)
                    assert on_a.wait(40 - len(on_b.messages)) + len(on_b.messages) == 40
            finally:
                scan.join(30)
                redistributor.close()
    from_a = next(r for r in results if r.node == node_name(url_a))
    assert from_a.note == "stopped: the queue has a consumer again"
    assert 2 <= from_a.moved < 40 and len(on_b.messages) == from_a.moved
    assert sorted(m.message_id for m in on_a.messages + on_b.messages) == sorted(
        m.message_id for m in sent)
