"""RedisStore specifics beyond the shared contract: Cluster slots, memory layout, restarts,
cross-process atomicity, retries and error messages."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from mqguard_tests.store_race import race_worker
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from mqguard.digest import id_digest
from mqguard.errors import StoreError
from mqguard.servers import ServerHandle, free_port, restart_redis, start_redis
from mqguard.stores import open_store
from mqguard.stores.base import RingStats, ScheduledItem
from mqguard.stores.redis import RedisStore, _retryable, key_tag, mask_url

pytestmark = pytest.mark.redis

SECRET = "Sup3r-Secret_pw"
AWKWARD_NAMES = ["{}", "a{b}c", "}{", "with space", "ünïcödé ✓", "#", "%", "", "*?[]"]


def digests(*values: object) -> list[bytes]:
    return [id_digest(str(v)) for v in values]


@pytest.fixture
def standalone(mqguard_redis_url: str) -> Iterator[RedisStore]:
    store = RedisStore.from_url(mqguard_redis_url)
    yield store
    store.close()


@pytest.fixture
def cluster(mqguard_redis_cluster_url: str) -> Iterator[RedisStore]:
    store = RedisStore.from_url(mqguard_redis_cluster_url)
    yield store
    store.close()


@pytest.fixture(params=["redis", "redis-cluster"])
def any_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("mqguard_redis_url" if request.param == "redis" else
                                   "mqguard_redis_cluster_url")


def _tag_of(key: bytes) -> str:
    text = key.decode()
    return text[text.index("{") + 1:text.index("}")]


# -- Cluster slots -------------------------------------------------------------------------------


def test_keys_of_one_name_share_one_cluster_slot(cluster: RedisStore,
                                                 mqguard_redis_cluster_url: str) -> None:
    for name in AWKWARD_NAMES:
        # 1000 ids: a ring with 16 membership shards, i.e. many keys of one name.
        cluster.ring_check_and_add(name, digests(*range(1000)), 1000)
        cluster.delivery_count_incr(name, "m")
        cluster.schedule_add(name, "item", b"p", 1)
    client = redis.RedisCluster.from_url(mqguard_redis_cluster_url.replace("redis+cluster",
                                                                           "redis", 1))
    try:
        slots: dict[str, set[int]] = {}
        for node in client.get_primaries():
            node_client = client.get_redis_connection(node)
            for key in node_client.scan_iter(match="mqg:*", count=1000):
                slot = int(node_client.execute_command("CLUSTER KEYSLOT", key))
                slots.setdefault(_tag_of(key), set()).add(slot)
    finally:
        client.close()
    assert set(slots) == {key_tag(name) for name in AWKWARD_NAMES}
    assert all(len(found) == 1 for found in slots.values()), slots
    # The tags really spread names over the cluster rather than hashing to one constant slot.
    assert len({slot for found in slots.values() for slot in found}) > 1
    assert cluster.ring_names() == sorted(AWKWARD_NAMES)


def test_key_tags_are_well_formed_and_distinct() -> None:
    names = [*AWKWARD_NAMES, "%25", "%7B", "a}b", "{a}", "a\nb", "\ud800"]
    tags = [key_tag(name) for name in names]
    assert len(set(tags)) == len(names)
    for tag in tags:
        assert tag and "{" not in tag and "}" not in tag and " " not in tag
    assert key_tag("orders.eu") == "orders.eu"


# -- memory layout ---------------------------------------------------------------------------------


def test_ring_shards_stay_listpack_and_small(standalone: RedisStore,
                                             mqguard_redis_url: str) -> None:
    ids = [id_digest(f"message-{i}") for i in range(20_000)]
    before = standalone.memory_usage_bytes()
    for i in range(0, len(ids), 500):
        standalone.ring_check_and_add("big", ids[i:i + 500], 20_000)
    used = standalone.memory_usage_bytes() - before
    assert standalone.ring_stats("big") == RingStats("big", 20_000, 20_000)
    client = redis.Redis.from_url(mqguard_redis_url)
    try:
        shards = list(client.scan_iter(match="mqg:{big}:ring:m:*", count=1000))
        assert len(shards) == 512  # smallest power of two with <= 64 ids per shard
        encodings = {client.object("encoding", key) for key in shards}
    finally:
        client.close()
    assert encodings == {b"listpack"}
    assert used / len(ids) < 64, f"{used / len(ids):.1f} bytes per id"


def test_memory_usage_and_flush_namespace(any_url: str) -> None:
    store = RedisStore.from_url(any_url)
    other = RedisStore.from_url(any_url, namespace="other")
    try:
        assert store.memory_usage_bytes() > 0
        store.ring_check_and_add("r", digests(*range(200)), 300)
        store.delivery_count_incr("q", "m")
        store.schedule_add("q", "i", b"", 1)
        other.ring_check_and_add("r", digests(1), 3)
        assert store.flush_namespace() > 5
        assert store.ring_names() == []
        assert store.delivery_count_get("q", "m") == 0
        assert store.schedule_count("q") == 0
        # Another namespace on the same server is a separate store, untouched by the flush.
        assert other.ring_names() == ["r"]
        assert other.ring_ids("r") == digests(1)
        assert store.flush_namespace() == 0
    finally:
        store.close()
        other.close()


def test_open_store_and_from_url_options(mqguard_redis_url: str,
                                         mqguard_redis_cluster_url: str) -> None:
    for url in (mqguard_redis_url, mqguard_redis_cluster_url):
        store = open_store(url)
        try:
            assert isinstance(store, RedisStore)
            store.ping()
        finally:
            store.close()
    # Several seeds, one of them unreachable: the others suffice.
    seeds = f"{mqguard_redis_cluster_url},127.0.0.1:{free_port()}"
    store = RedisStore.from_url(seeds)
    try:
        assert store.ring_check_and_add("r", digests(1), 3) == [False]
    finally:
        store.close()
    # A store over a client built elsewhere names it (credential-free) in its errors.
    client = redis.Redis.from_url(mqguard_redis_url)
    store = RedisStore(client)
    try:
        assert store.ring_check_and_add("r", digests(1), 3) == [False]
        assert mqguard_redis_url in repr(store)
    finally:
        store.close()
    with pytest.raises(StoreError, match="unsupported store URL"):
        RedisStore.from_url("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="namespace"):
        RedisStore.from_url(mqguard_redis_url, namespace="a{b}")


# -- persistence and outages ----------------------------------------------------------------------


def test_survives_restart_with_appendonly(mqguard_fresh_redis_server: ServerHandle) -> None:
    store = RedisStore.from_url(mqguard_fresh_redis_server.urls["redis"])
    try:
        ids = digests(*range(100))
        store.ring_check_and_add("orders", ids, 50)
        assert store.delivery_count_incr("orders", "m1") == 1
        store.schedule_add("orders", "redeliver-1", b"payload", 1234)
        restarted = restart_redis(mqguard_fresh_redis_server)
        assert restarted.urls["redis"] == mqguard_fresh_redis_server.urls["redis"]
        # Same store object: its pooled connections died with the server and are replaced.
        assert store.ring_ids("orders") == ids[50:]
        assert store.ring_stats("orders") == RingStats("orders", 50, 50)
        assert store.ring_check_and_add("orders", [ids[49], ids[99]], 50) == [False, True]
        assert store.delivery_count_incr("orders", "m1") == 2
        assert store.schedule_claim_due("orders", 2000, 10, 100) == [
            ScheduledItem("redeliver-1", b"payload", 1234)]
        assert store.ring_names() == ["orders"]
    finally:
        store.close()


def test_short_outage_delays_calls_instead_of_failing(
        mqguard_fresh_redis_server: ServerHandle) -> None:
    store = RedisStore.from_url(mqguard_fresh_redis_server.urls["redis"], retry_timeout=10.0)
    restarted: list[ServerHandle] = []
    try:
        store.ring_check_and_add("r", digests(1), 10)
        mqguard_fresh_redis_server.stop()

        def bring_back() -> None:
            restarted.append(start_redis(appendonly=True,
                                         state_dir=mqguard_fresh_redis_server.state_dir,
                                         port=mqguard_fresh_redis_server.port("redis")))

        timer = threading.Timer(1.0, bring_back)
        timer.start()
        started = time.monotonic()
        assert store.ring_check_and_add("r", digests(1, 2), 10) == [True, False]
        assert time.monotonic() - started >= 0.9
        timer.join()
        assert store.ring_ids("r") == digests(1, 2)
    finally:
        store.close()
        for handle in restarted:
            handle.stop()


def test_store_error_when_redis_is_down() -> None:
    port = free_port()  # nothing listens there
    store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0", retry_timeout=0.3)
    calls: list[Any] = [
        lambda: store.ring_check_and_add("r", digests(1), 3),
        lambda: store.ring_add_all_or_none("r", digests(1), 3),
        lambda: store.ring_contains("r", digests(1)),
        lambda: store.ring_ids("r"),
        lambda: store.ring_stats("r"),
        store.ring_names,
        lambda: store.ring_resize("r", 3),
        lambda: store.ring_clear("r"),
        lambda: store.delivery_count_incr("q", "m"),
        lambda: store.delivery_count_get("q", "m"),
        lambda: store.delivery_count_clear("q", "m"),
        lambda: store.schedule_add("q", "i", b"", 1),
        lambda: store.schedule_claim_due("q", 1, 1, 1),
        lambda: store.schedule_remove("q", "i"),
        lambda: store.schedule_count("q"),
        store.ping,
        store.memory_usage_bytes,
        store.flush_namespace,
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}.*reachable") as info:
            call()
        assert time.monotonic() - started < 3.0
        assert info.value.__cause__ is None
    store.close()
    with pytest.raises(StoreError, match="cannot open Redis store"):
        RedisStore.from_url(f"redis+cluster://127.0.0.1:{port}", retry_timeout=0.3)


def _assert_masked(url: str, *, opens: bool) -> None:
    with pytest.raises(StoreError) as info:
        store = RedisStore.from_url(url, retry_timeout=0.2)
        assert opens, f"{mask_url(url)} opened"
        try:
            assert SECRET not in repr(store)
            store.ring_check_and_add("r", digests(1), 3)
        finally:
            store.close()
    message = str(info.value)
    assert SECRET not in message and "Sup3r" not in message, message
    assert "***" in message, message
    # The redis-py exception is not chained: its text is not scrubbed.
    assert info.value.__cause__ is None


def test_error_messages_mask_passwords_when_unreachable() -> None:
    closed = free_port()
    _assert_masked(f"redis://user:{SECRET}@127.0.0.1:{closed}/0", opens=True)
    _assert_masked(f"redis://127.0.0.1:{closed}/0?password={SECRET}", opens=True)
    _assert_masked(f"redis://:{SECRET.replace('_', '%5F')}@127.0.0.1:{closed}/0", opens=True)
    # RedisCluster connects at construction, so the failure comes from from_url.
    _assert_masked(f"redis+cluster://:{SECRET}@127.0.0.1:{closed}", opens=False)


def test_error_messages_mask_passwords_when_refused(
        mqguard_fresh_redis_server: ServerHandle) -> None:
    url = mqguard_fresh_redis_server.urls["redis"]
    admin = redis.Redis.from_url(url)
    try:
        admin.config_set("requirepass", "the-right-one")
    finally:
        admin.close()
    host_port = url.split("://", 1)[1]
    # Wrong password: the server answers WRONGPASS.
    _assert_masked(f"redis://:{SECRET}@{host_port}", opens=True)
    _assert_masked(f"redis://default:{SECRET}@{host_port}", opens=True)
    # No password at all: NOAUTH on the first command.
    with pytest.raises(StoreError, match=r"(?i)auth"):
        RedisStore.from_url(url, retry_timeout=0.2).ping()
    good = RedisStore.from_url(f"redis://:the-right-one@{host_port}")
    try:
        good.ping()
        assert "the-right-one" not in repr(good)
    finally:
        good.close()


def test_mask_url() -> None:
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert mask_url(f"redis://alice:{SECRET}@h:1/0") == "redis://alice:***@h:1/0"
    assert mask_url(f"rediss://:{SECRET}@h:1") == "rediss://:***@h:1"
    assert mask_url(f"redis://{SECRET}@h:1") == "redis://:***@h:1"
    assert mask_url(f"unix:///run/redis.sock?db=1&password={SECRET}") == \
        "unix:///run/redis.sock?db=1&password=***"
    assert mask_url(f"redis+cluster://u:{SECRET}@a:1,b:2") == "redis+cluster://u:***@a:1,b:2"


def test_timeouts_are_retried_only_by_idempotent_operations() -> None:
    assert _retryable(ConnectionError("reset"), idempotent=False)
    assert _retryable(TimeoutError("slow"), idempotent=True)
    assert not _retryable(TimeoutError("slow"), idempotent=False)
    assert _retryable(ResponseError("BUSY Redis is busy running a script."), idempotent=False)
    assert not _retryable(ResponseError("WRONGTYPE Operation"), idempotent=True)


# -- atomicity across processes ------------------------------------------------------------------


def test_processes_racing_accept_each_id_exactly_once(any_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    ids = digests(*range(200))
    start = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [ctx.Process(target=race_worker, args=(any_url, ids, seed, start, results))
             for seed in range(4)]
    for proc in procs:
        proc.start()
    try:
        accepted = [item for _ in procs for item in results.get(timeout=120)]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs)
    assert sorted(accepted) == sorted(ids)
    store = RedisStore.from_url(any_url)
    try:
        assert store.ring_stats("race") == RingStats("race", 1000, 200)
    finally:
        store.close()
