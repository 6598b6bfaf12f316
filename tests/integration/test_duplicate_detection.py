"""Duplicate detection against REAL brokers and REAL Redis (issue: Artemis duplicate-ID cache)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mqguard_tests.brokers import BROKERS, STOMP_BROKERS, broker_of
from mqguard_tests.dedup_race import race_worker

from mqguard.cli import main
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.digest import id_digest
from mqguard.errors import TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.servers import restart_redis
from mqguard.stores.redis import RedisStore


def guard_for(tmp_path: Path, store: str, node: str = "dedup", **settings: Any) -> Guard:
    return Guard(parse_config({
        "mqguard": {"store": store, "node-id": node,
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20}},
        "address-settings": settings}))


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    return broker_of(request)[1]


class Drain:
    """A guarded consumer collecting ``address``; subscribe before producing (MQTT has no
    queues: a message published before the subscription exists is gone)."""

    def __init__(self, url: str, address: str, guard: Guard) -> None:
        self.got: list[Message] = []
        self.arrived = threading.Event()
        self.consumer = GuardedConsumer(open_adapter(url), address, self._handle, guard)

    def _handle(self, message: Message) -> None:
        self.got.append(message)
        self.arrived.set()

    def __enter__(self) -> Drain:
        self.consumer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.stop()

    def wait(self, expected: int, settle: float = 1.0) -> list[Message]:
        """Until ``expected`` arrived and nothing more came for ``settle`` s."""
        deadline = time.monotonic() + 20
        while len(self.got) < expected and time.monotonic() < deadline:
            self.arrived.wait(0.2)
            self.arrived.clear()
        time.sleep(settle)  # a duplicate that slipped through would arrive meanwhile
        return self.got


def drain(url: str, address: str, guard: Guard, expected: int) -> list[Message]:
    with Drain(url, address, guard) as consumer:
        return consumer.wait(expected)


@pytest.mark.redis
@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)
def test_duplicate_not_delivered(broker_url: str, mqguard_redis_url: str, tmp_path: Path,
                                 mqguard_unique_name: str) -> None:
    with guard_for(tmp_path, mqguard_redis_url) as guard, Drain(broker_url, mqguard_unique_name,
                                                                guard) as sink:
        with GuardedProducer(open_adapter(broker_url), guard) as producer:
            results = [producer.send(mqguard_unique_name, body.encode(), duplicate_id=dup)
                       for body, dup in [("a", "A"), ("b", "B"), ("a2", "A"), ("c", "C"),
                                         ("b2", "B")]]
        assert [r.sent for r in results] == [True, True, False, True, False]
        got = sink.wait(3)
    assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
    rejected = [e for e in read_events(tmp_path / "events") if e["type"] == "duplicate_rejected"]
    assert sorted(e["duplicate_id"] for e in rejected) == ["A", "B"]
    assert all(e["address"] == mqguard_unique_name for e in rejected)


@pytest.mark.redis
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_transaction_with_duplicate_commits_nothing(broker_url: str, mqguard_redis_url: str,
                                                    tmp_path: Path,
                                                    mqguard_unique_name: str) -> None:
    with guard_for(tmp_path, mqguard_redis_url) as guard:
        with GuardedProducer(open_adapter(broker_url), guard) as producer:
            producer.send(mqguard_unique_name, b"first", duplicate_id="D1")
            with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
                with producer.transaction() as tx:
                    producer.send(mqguard_unique_name, b"new-in-tx", duplicate_id="D2",
                                  transaction=tx)
                    producer.send(mqguard_unique_name, b"dup-in-tx", duplicate_id="D1",
                                  transaction=tx)
            # D2 was never made visible: the failed transaction added nothing to the cache.
            assert producer.send(mqguard_unique_name, b"D2-later", duplicate_id="D2").sent
        got = drain(broker_url, mqguard_unique_name, guard, 2)
    assert sorted(m.body for m in got) == [b"D2-later", b"first"]


@pytest.mark.redis
@pytest.mark.activemq
def test_racing_producer_processes_accept_each_id_once(mqguard_activemq_server: Any,
                                                       mqguard_redis_url: str,
                                                       tmp_path: Path,
                                                       mqguard_unique_name: str) -> None:
    url = mqguard_activemq_server.urls["stomp"]
    ids = [f"race-{i}" for i in range(150)]
    ctx = multiprocessing.get_context("spawn")
    results, start = ctx.Queue(), ctx.Event()
    workers = [ctx.Process(target=race_worker,
                           args=(url, mqguard_redis_url, mqguard_unique_name,
                                 str(tmp_path / "events"),
                                 f"racer-{n}", ids[::-1] if n % 2 else ids, results, start))
               for n in range(4)]
    for worker in workers:
        worker.start()
    time.sleep(3)  # spawn + connect
    start.set()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    accepted = sum(results.get(timeout=5) for _ in workers)
    assert accepted == len(ids)
    with guard_for(tmp_path, mqguard_redis_url, node="drain") as guard:
        got = drain(url, mqguard_unique_name, guard, len(ids))
    assert Counter(m.body.decode() for m in got) == Counter(ids)


@pytest.mark.redis
@pytest.mark.activemq
def test_cache_survives_mqguard_and_redis_restarts(mqguard_activemq_server: Any,
                                                   mqguard_fresh_redis_server: Any, tmp_path: Path,
                                                   mqguard_unique_name: str) -> None:
    url = mqguard_activemq_server.urls["stomp"]
    redis_url = mqguard_fresh_redis_server.urls["redis"]
    with guard_for(tmp_path, redis_url, node="first") as guard, \
            GuardedProducer(open_adapter(url), guard) as producer:
        assert producer.send(mqguard_unique_name, b"x", duplicate_id="persist-me").sent
    # A new mqguard process (new guard, new store connection) sees the id...
    with guard_for(tmp_path, redis_url, node="second") as guard, \
            GuardedProducer(open_adapter(url), guard) as producer:
        assert not producer.send(mqguard_unique_name, b"x", duplicate_id="persist-me").sent
    # ...and so does one after Redis itself restarted (AOF).
    restarted = restart_redis(mqguard_fresh_redis_server)
    with guard_for(tmp_path, restarted.urls["redis"], node="third") as guard, \
            GuardedProducer(open_adapter(url), guard) as producer:
        assert not producer.send(mqguard_unique_name, b"x", duplicate_id="persist-me").sent


@pytest.mark.redis
def test_shrunk_id_cache_size_keeps_newest_in_redis(mqguard_redis_url: str, tmp_path: Path) -> None:
    from mqguard.testing.loopback import LoopbackAdapter

    adapter = LoopbackAdapter()
    with guard_for(tmp_path, mqguard_redis_url, **{"shrink": {"id-cache-size": 10}}) as guard:
        producer = GuardedProducer(adapter, guard)
        for i in range(10):
            producer.send("shrink", b"", duplicate_id=f"id-{i}")
    with guard_for(tmp_path, mqguard_redis_url, **{"shrink": {"id-cache-size": 4}}) as guard:
        producer = GuardedProducer(adapter, guard)
        assert not producer.send("shrink", b"", duplicate_id="id-9").sent
        assert guard.store.ring_ids("shrink") == [id_digest(f"id-{i}") for i in range(6, 10)]
        assert producer.send("shrink", b"", duplicate_id="id-0").sent


@pytest.mark.redis
@pytest.mark.activemq
def test_dedup_on_redis_cluster(mqguard_activemq_server: Any, mqguard_redis_cluster_url: str,
                                tmp_path: Path,
                                mqguard_unique_name: str) -> None:
    url = mqguard_activemq_server.urls["stomp"]
    with guard_for(tmp_path, mqguard_redis_cluster_url) as guard, \
            GuardedProducer(open_adapter(url), guard) as producer:
        assert producer.send(mqguard_unique_name, b"1", duplicate_id="C").sent
        assert not producer.send(mqguard_unique_name, b"2", duplicate_id="C").sent
        store = guard.store
        assert isinstance(store, RedisStore)
        assert store.ring_stats(mqguard_unique_name).count == 1


@pytest.mark.redis
def test_dedup_cli_stats_and_clear(mqguard_redis_url: str, tmp_path: Path) -> None:
    store = RedisStore.from_url(mqguard_redis_url)
    store.ring_check_and_add("orders", [id_digest("a"), id_digest("b")], 20000)
    store.close()
    runner = CliRunner()
    stats = runner.invoke(main, ["dedup", "stats", "orders", "--store", mqguard_redis_url,
                                 "--json"])
    assert stats.exit_code == 0, stats.output
    assert '"count": 2' in stats.output and '"capacity": 20000' in stats.output
    cleared = runner.invoke(main, ["dedup", "clear", "orders", "--store", mqguard_redis_url,
                                   "--yes"])
    assert cleared.exit_code == 0 and "cleared: orders" in cleared.output
    missing = runner.invoke(main, ["dedup", "stats", "orders", "--store", mqguard_redis_url])
    assert missing.exit_code != 0 and "no duplicate-ID cache" in missing.output
