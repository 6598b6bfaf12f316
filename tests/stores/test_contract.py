"""The Store contract (see mqguard/stores/base.py), run against every implementation.

MemoryStore is the reference; RedisStore must behave identically on a standalone Redis and on
a 3-master Redis Cluster (fixtures ``redis_url`` / ``redis_cluster_url`` from the mqguard pytest
plugin, flushed before each test).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqguard.digest import id_digest
from mqguard.stores.base import RingStats, ScheduledItem, Store
from mqguard.stores.memory import MemoryStore

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
]

AWKWARD_NAMES = [
    "{}",
    "a{b}c",
    "}{",
    "{",
    "with space",
    "ünïcödé ✓ 名前",
    "#",
    "orders.eu/#/+",
    "a:b:ring",
    "%",
    "%25",
    "",
    "*?[]\\",
    "line\nbreak",
]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        instance: Store = MemoryStore()
    else:
        from mqguard.stores.redis import RedisStore

        fixture = "redis_url" if request.param == "redis" else "redis_cluster_url"
        instance = RedisStore.from_url(request.getfixturevalue(fixture))
    yield instance
    instance.close()


def d(*values: object) -> list[bytes]:
    """Digests of ``values``: the ids rings hold in practice."""
    return [id_digest(str(v)) for v in values]


# -- rings -------------------------------------------------------------------------------------


def test_implements_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_ring_keeps_order_and_overwrites_oldest(store: Store) -> None:
    ids = d(1, 2, 3, 4, 5)
    for item in ids:
        assert store.ring_check_and_add("r", [item], 3) == [False]
    assert store.ring_ids("r") == ids[2:]
    assert store.ring_contains("r", ids) == [False, False, True, True, True]
    assert store.ring_stats("r") == RingStats("r", 3, 3)
    # An overwritten id is no longer a duplicate: it comes back as the newest.
    assert store.ring_check_and_add("r", [ids[0]], 3) == [False]
    assert store.ring_ids("r") == [ids[3], ids[4], ids[0]]


def test_check_and_add_flags_duplicates_in_ring_and_in_batch(store: Store) -> None:
    a, b, c, e = d("a", "b", "c", "e")
    assert store.ring_check_and_add("r", [a, b, a, c, b], 10) == [False, False, True, False, True]
    assert store.ring_ids("r") == [a, b, c]
    assert store.ring_check_and_add("r", [c, e, e], 10) == [True, False, True]
    assert store.ring_ids("r") == [a, b, c, e]


def test_batch_larger_than_capacity_evicts_in_order(store: Store) -> None:
    a, b, c = d("a", "b", "c")
    # a, b fill the ring; c evicts a; a is then new again and evicts b.
    assert store.ring_check_and_add("r", [a, b, c, a], 2) == [False] * 4
    assert store.ring_ids("r") == [c, a]
    assert store.ring_check_and_add("one", [a, b, a, a], 1) == [False, False, False, True]
    assert store.ring_ids("one") == [a]
    big = d(*range(50))
    assert store.ring_check_and_add("r", big, 2) == [False] * 50
    assert store.ring_ids("r") == big[-2:]
    assert store.ring_contains("r", [a, c]) == [False, False]


def test_ids_of_any_length(store: Store) -> None:
    ids = [b"", b"x", b"12345678", b"\x00" * 8, b"long-" * 30, bytes(range(256))]
    assert store.ring_check_and_add("r", ids, 10) == [False] * len(ids)
    assert store.ring_check_and_add("r", ids, 10) == [True] * len(ids)
    assert store.ring_ids("r") == ids
    assert store.ring_contains("r", [b"y", b"x"]) == [False, True]


def test_add_all_or_none_adds_nothing_when_any_is_duplicate(store: Store) -> None:
    a, b, c, e = d("a", "b", "c", "e")
    assert store.ring_check_and_add("r", [a], 10) == [False]
    assert store.ring_add_all_or_none("r", [b, a, c], 10) == [False, True, False]
    assert store.ring_ids("r") == [a]
    # A duplicate within the batch also blocks the whole batch.
    assert store.ring_add_all_or_none("r", [b, e, b], 10) == [False, False, True]
    assert store.ring_ids("r") == [a]
    assert store.ring_add_all_or_none("r", [b, e], 10) == [False, False]
    assert store.ring_ids("r") == [a, b, e]
    assert store.ring_add_all_or_none("r", [], 10) == []


def test_add_all_or_none_overwrites_oldest_at_capacity(store: Store) -> None:
    ids = d(*range(6))
    assert store.ring_add_all_or_none("r", ids[:3], 3) == [False] * 3
    assert store.ring_add_all_or_none("r", ids[3:5], 3) == [False] * 2
    assert store.ring_ids("r") == [ids[2], ids[3], ids[4]]
    assert store.ring_add_all_or_none("r", ids, 3) == [False, False, True, True, True, False]
    assert store.ring_ids("r") == [ids[2], ids[3], ids[4]]


def test_resize_keeps_newest_and_reports_deleted(store: Store) -> None:
    ids = d(*range(10))
    store.ring_check_and_add("r", ids, 10)
    assert store.ring_resize("r", 4) == 6
    assert store.ring_ids("r") == ids[6:]
    assert store.ring_contains("r", ids) == [False] * 6 + [True] * 4
    assert store.ring_stats("r") == RingStats("r", 4, 4)
    assert store.ring_resize("r", 4) == 0
    assert store.ring_resize("r", 20) == 0
    assert store.ring_stats("r") == RingStats("r", 20, 4)
    assert store.ring_check_and_add("r", ids, 20) == [False] * 6 + [True] * 4
    assert store.ring_ids("r") == ids[6:] + ids[:6]


def test_resize_across_many_sizes(store: Store) -> None:
    # Large enough for RedisStore to change its number of membership shards both ways.
    ids = d(*range(1000))
    assert store.ring_check_and_add("r", ids, 1000) == [False] * 1000
    assert store.ring_resize("r", 50) == 950
    assert store.ring_ids("r") == ids[-50:]
    assert store.ring_contains("r", ids) == [False] * 950 + [True] * 50
    assert store.ring_resize("r", 5000) == 0
    assert store.ring_contains("r", ids) == [False] * 950 + [True] * 50
    assert store.ring_check_and_add("r", ids, 5000) == [False] * 950 + [True] * 50
    assert store.ring_stats("r") == RingStats("r", 5000, 1000)


def test_resize_missing_ring_creates_it(store: Store) -> None:
    assert store.ring_resize("r", 7) == 0
    assert store.ring_stats("r") == RingStats("r", 7, 0)
    assert store.ring_names() == ["r"]


def test_different_capacity_resizes_first(store: Store) -> None:
    ids = d(*range(5))
    store.ring_check_and_add("r", ids, 5)
    new = d("new")
    assert store.ring_check_and_add("r", new, 3) == [False]
    assert store.ring_ids("r") == ids[3:] + new
    assert store.ring_stats("r") == RingStats("r", 3, 3)
    # The resize happens even when add_all_or_none then adds nothing.
    assert store.ring_add_all_or_none("r", [ids[4], *d("x")], 2) == [True, False]
    assert store.ring_ids("r") == [ids[4], new[0]]
    assert store.ring_stats("r") == RingStats("r", 2, 2)
    # An empty batch creates the ring, or resizes it.
    assert store.ring_check_and_add("r", [], 1) == []
    assert store.ring_ids("r") == new
    assert store.ring_check_and_add("empty", [], 4) == []
    assert store.ring_stats("empty") == RingStats("empty", 4, 0)


def test_clear(store: Store) -> None:
    ids = d(*range(300))
    store.ring_check_and_add("r", ids, 500)
    store.ring_check_and_add("other", ids[:1], 5)
    assert store.ring_clear("r") is True
    assert store.ring_clear("r") is False
    assert store.ring_stats("r") is None
    assert store.ring_ids("r") == []
    assert store.ring_contains("r", ids[:3]) == [False] * 3
    assert store.ring_names() == ["other"]
    assert store.ring_check_and_add("r", ids[:2], 2) == [False, False]
    assert store.ring_stats("r") == RingStats("r", 2, 2)
    assert store.ring_contains("other", ids[:1]) == [True]


def test_missing_ring(store: Store) -> None:
    assert store.ring_stats("nope") is None
    assert store.ring_ids("nope") == []
    assert store.ring_contains("nope", d(1, 2)) == [False, False]
    assert store.ring_contains("nope", []) == []
    assert store.ring_names() == []
    assert store.ring_stats("nope") is None  # reading did not create it


def test_ring_names_sorted(store: Store) -> None:
    for name in ["b", "a", "c d", "a.b"]:
        store.ring_check_and_add(name, d(name), 3)
    store.delivery_count_incr("queue-only", "m")  # not a ring
    assert store.ring_names() == ["a", "a.b", "b", "c d"]


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_below_one_is_rejected(store: Store, capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        store.ring_check_and_add("r", d(1), capacity)
    with pytest.raises(ValueError, match="capacity"):
        store.ring_add_all_or_none("r", d(1), capacity)
    with pytest.raises(ValueError, match="capacity"):
        store.ring_resize("r", capacity)
    assert store.ring_stats("r") is None


def test_threads_racing_accept_each_id_once(store: Store) -> None:
    ids = d(*range(200))
    accepted: list[bytes] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = ids[:]
        rng.shuffle(mine)
        start.wait()
        for i in range(0, len(mine), 7):
            batch = mine[i:i + 7]
            flags = store.ring_check_and_add("race", batch, 1000)
            with lock:
                accepted.extend(item for item, dup in zip(batch, flags, strict=True) if not dup)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(accepted) == sorted(ids)


# -- awkward names ------------------------------------------------------------------------------


def test_awkward_names_are_independent(store: Store) -> None:
    for i, name in enumerate(AWKWARD_NAMES):
        assert store.ring_check_and_add(name, d(name, i), 100) == [False, False]
        assert store.delivery_count_incr(name, name) == 1
        store.schedule_add(name, name, name.encode(), i)
    assert store.ring_names() == sorted(AWKWARD_NAMES)
    for i, name in enumerate(AWKWARD_NAMES):
        assert store.ring_ids(name) == d(name, i)
        assert store.ring_stats(name) == RingStats(name, 100, 2)
        assert store.delivery_count_get(name, name) == 1
        assert store.schedule_count(name) == 1
        assert store.schedule_claim_due(name, 1000, 10, 5) == [
            ScheduledItem(name, name.encode(), i)]
    for name in AWKWARD_NAMES:
        assert store.ring_clear(name) is True
    assert store.ring_names() == []


# -- delivery counts --------------------------------------------------------------------------


def test_delivery_counts(store: Store) -> None:
    assert store.delivery_count_get("q", "m1") == 0
    assert [store.delivery_count_incr("q", "m1") for _ in range(3)] == [1, 2, 3]
    assert store.delivery_count_get("q", "m1") == 3
    assert store.delivery_count_incr("q", "m2") == 1
    assert store.delivery_count_incr("other", "m1") == 1
    store.delivery_count_clear("q", "m1")
    assert store.delivery_count_get("q", "m1") == 0
    assert store.delivery_count_get("q", "m2") == 1
    assert store.delivery_count_get("other", "m1") == 1
    store.delivery_count_clear("q", "never-seen")
    assert store.delivery_count_incr("q", "m1") == 1


@pytest.mark.parametrize("message_id", ["", "ID:host-1:2:3", "{x}", "ünï ✓", "a\x00b"])
def test_delivery_counts_awkward_message_ids(store: Store, message_id: str) -> None:
    assert store.delivery_count_incr("q", message_id) == 1
    assert store.delivery_count_incr("q", message_id) == 2
    assert store.delivery_count_get("q", message_id) == 2
    store.delivery_count_clear("q", message_id)
    assert store.delivery_count_get("q", message_id) == 0


# -- scheduled items ------------------------------------------------------------------------------


def test_schedule_claim_order_limit_and_lease(store: Store) -> None:
    store.schedule_add("q", "z", b"pz", 30)
    store.schedule_add("q", "y", b"py", 20)
    store.schedule_add("q", "x", b"px", 10)
    store.schedule_add("q", "w", b"\x00\xffbinary", 10)
    assert store.schedule_count("q") == 4
    assert store.schedule_claim_due("q", 25, 2, 100) == [
        ScheduledItem("w", b"\x00\xffbinary", 10), ScheduledItem("x", b"px", 10)]
    assert store.schedule_claim_due("q", 25, 10, 100) == [ScheduledItem("y", b"py", 20)]
    # Claimed items are leased (due again at 125 and 125); z is not due before 30.
    assert store.schedule_claim_due("q", 29, 10, 100) == []
    assert store.schedule_count("q") == 4
    assert store.schedule_claim_due("q", 124, 10, 1) == [ScheduledItem("z", b"pz", 30)]
    # At 125 the first three leases have run out: (due, id) order again.
    assert store.schedule_claim_due("q", 125, 10, 50) == [
        ScheduledItem("w", b"\x00\xffbinary", 125), ScheduledItem("x", b"px", 125),
        ScheduledItem("y", b"py", 125), ScheduledItem("z", b"pz", 125)]
    assert store.schedule_claim_due("q", 174, 0, 50) == []


def test_schedule_remove_and_reschedule(store: Store) -> None:
    store.schedule_add("q", "a", b"1", 100)
    store.schedule_add("q", "b", b"2", 100)
    assert store.schedule_remove("q", "a") is True
    assert store.schedule_remove("q", "a") is False
    assert store.schedule_remove("missing", "a") is False
    assert store.schedule_count("q") == 1
    assert store.schedule_count("missing") == 0
    # Re-scheduling replaces due time and payload.
    store.schedule_add("q", "b", b"new", 5)
    assert store.schedule_count("q") == 1
    assert store.schedule_claim_due("q", 5, 10, 10) == [ScheduledItem("b", b"new", 5)]
    assert store.schedule_remove("q", "b") is True
    assert store.schedule_claim_due("q", 10_000, 10, 10) == []
    assert store.schedule_count("q") == 0


def test_schedule_epoch_millis_and_empty_payload(store: Store) -> None:
    now = 1_763_737_553_236
    store.schedule_add("q", "late", b"", now + 1)
    store.schedule_add("q", "early", b"", now - 60_000)
    assert store.schedule_claim_due("q", now, 5, 30_000) == [
        ScheduledItem("early", b"", now - 60_000)]
    assert store.schedule_claim_due("q", now + 30_000, 5, 30_000) == [
        ScheduledItem("late", b"", now + 1), ScheduledItem("early", b"", now + 30_000)]


def test_lifecycle(store: Store) -> None:
    store.ping()
    store.close()
    store.close()


# -- property: random ring operations match a simple model ---------------------------------------


class RingModel:
    """The ring semantics of base.py, written as plainly as possible."""

    def __init__(self) -> None:
        self.rings: dict[str, tuple[int, list[bytes]]] = {}

    def _ring(self, name: str, capacity: int) -> list[bytes]:
        _, items = self.rings.get(name, (capacity, []))
        items = items[-capacity:]
        self.rings[name] = (capacity, items)
        return items

    def _add(self, items: list[bytes], capacity: int, item: bytes) -> None:
        items.append(item)
        if len(items) > capacity:
            items.pop(0)

    def check_and_add(self, name: str, ids: list[bytes], capacity: int) -> list[bool]:
        items = self._ring(name, capacity)
        flags = []
        for item in ids:
            flags.append(item in items)
            if not flags[-1]:
                self._add(items, capacity, item)
        return flags

    def add_all_or_none(self, name: str, ids: list[bytes], capacity: int) -> list[bool]:
        items = self._ring(name, capacity)
        flags = [item in items or item in ids[:i] for i, item in enumerate(ids)]
        if not any(flags):
            for item in ids:
                self._add(items, capacity, item)
        return flags

    def resize(self, name: str, capacity: int) -> int:
        before = len(self.rings.get(name, (0, []))[1])
        return before - len(self._ring(name, capacity))

    def clear(self, name: str) -> bool:
        return self.rings.pop(name, None) is not None

    def contains(self, name: str, ids: list[bytes]) -> list[bool]:
        items = self.rings.get(name, (0, []))[1]
        return [item in items for item in ids]


# 8-byte digests plus ids of other lengths (which RedisStore shards differently).
_IDS = st.sampled_from([*d(*range(10)), b"", b"x", b"a-much-longer-identifier"])
_NAMES = st.sampled_from(["a", "{b}", ""])
# Mostly tiny capacities (overwrites), sometimes big ones (RedisStore shard-count changes).
_CAPS = st.one_of(st.integers(1, 6), st.sampled_from([100, 1000]))
_OPS = st.one_of(
    st.tuples(st.just("check"), _NAMES, st.lists(_IDS, max_size=8), _CAPS),
    st.tuples(st.just("all"), _NAMES, st.lists(_IDS, max_size=5), _CAPS),
    st.tuples(st.just("resize"), _NAMES, _CAPS),
    st.tuples(st.just("clear"), _NAMES),
    st.tuples(st.just("contains"), _NAMES, st.lists(_IDS, max_size=5)),
)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_OPS, max_size=12))
def test_random_ring_operations_match_model(store: Store, ops: list[tuple]) -> None:
    # The store fixture lives across examples: a fresh prefix isolates each example.
    prefix = f"prop-{uuid.uuid4().hex[:8]}-"
    model = RingModel()
    for op in ops:
        kind, name = op[0], prefix + op[1]
        if kind == "check":
            got, want = (store.ring_check_and_add(name, op[2], op[3]),
                         model.check_and_add(name, op[2], op[3]))
        elif kind == "all":
            got, want = (store.ring_add_all_or_none(name, op[2], op[3]),
                         model.add_all_or_none(name, op[2], op[3]))
        elif kind == "resize":
            got, want = store.ring_resize(name, op[2]), model.resize(name, op[2])
        elif kind == "clear":
            got, want = store.ring_clear(name), model.clear(name)
        else:
            got, want = store.ring_contains(name, op[2]), model.contains(name, op[2])
        assert got == want, op
        assert store.ring_ids(name) == model.rings.get(name, (0, []))[1], op
        stats = store.ring_stats(name)
        if name in model.rings:
            capacity, items = model.rings[name]
            assert stats == RingStats(name, capacity, len(items)), op
        else:
            assert stats is None, op
    assert [n for n in store.ring_names() if n.startswith(prefix)] == sorted(model.rings)
