"""The Store contract (see mqguard/stores/base.py), run against every implementation.

MemoryStore is the reference; RedisStore must behave identically on a standalone Redis and on
a 3-master Redis Cluster (fixtures ``mqguard_redis_url`` / ``mqguard_redis_cluster_url`` from the
mqguard pytest plugin, flushed before each test).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqguard.digest import id_digest
from mqguard.stores.base import RingOutcome, RingStats, ScheduledItem, Store
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

        fixture = "mqguard_redis_url" if request.param == "redis" else "mqguard_redis_cluster_url"
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


def race_four_threads(store: Store, accepts: Callable[[list[bytes]], list[bool]]) -> None:
    """Four threads offer the same 200 ids in different orders, 7 per call; ``accepts`` says
    which of a call's ids it took. Each id must be taken exactly once."""
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
            taken = accepts(batch)
            with lock:
                accepted.extend(item for item, ok in zip(batch, taken, strict=True) if ok)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(accepted) == sorted(ids)


def test_threads_racing_accept_each_id_once(store: Store) -> None:
    race_four_threads(store, lambda batch: [not dup for dup in
                                            store.ring_check_and_add("race", batch, 1000)])


# -- reservations (two-phase duplicate detection) -------------------------------------------------

NEW, DUP, FLIGHT = RingOutcome.NEW, RingOutcome.DUPLICATE, RingOutcome.IN_FLIGHT
#: Long enough that no reservation in these tests goes stale by accident.
LONG_MS = 60_000


def test_reserve_then_confirm(store: Store) -> None:
    a, b, c = d("a", "b", "c")
    assert store.ring_reserve("r", [a, b, a], 10, LONG_MS) == [NEW, NEW, DUP]
    assert store.ring_ids("r") == [a, b]
    assert store.ring_contains("r", [a, b, c]) == [True, True, False]
    # Unconfirmed: another sender of the same id can be neither accepted nor dropped.
    assert store.ring_reserve("r", [a, c], 10, LONG_MS) == [FLIGHT, NEW]
    assert store.ring_lookup("r", [a, b, c], LONG_MS) == [FLIGHT, FLIGHT, FLIGHT]
    store.ring_confirm("r", [a, b])
    assert store.ring_reserve("r", [a, b], 10, LONG_MS) == [DUP, DUP]
    assert store.ring_lookup("r", [a, c, d("x")[0]], LONG_MS) == [DUP, FLIGHT, NEW]
    # Plain check-and-add takes a reservation for a duplicate, as ring_contains does.
    assert store.ring_check_and_add("r", [c], 10) == [True]
    assert store.ring_stats("r") == RingStats("r", 10, 3)


def test_confirm_piggybacks_on_the_next_reserve(store: Store) -> None:
    a, b = d("a", "b")
    assert store.ring_reserve("r", [a], 10, LONG_MS) == [NEW]
    # The confirmation runs first, so the same call already sees a confirmed duplicate.
    assert store.ring_reserve("r", [b, a], 10, LONG_MS, confirm=[a]) == [NEW, DUP]


def test_release_frees_the_id_and_its_slot(store: Store) -> None:
    a, b, c, e = d("a", "b", "c", "e")
    assert store.ring_reserve("r", [a, b], 3, LONG_MS) == [NEW, NEW]
    store.ring_confirm("r", [a])
    assert store.ring_release("r", [a, b, c]) == 1  # a is confirmed, c unknown: kept / ignored
    assert store.ring_release("r", [b]) == 0  # idempotent
    assert store.ring_ids("r") == [a]
    assert store.ring_contains("r", [a, b]) == [True, False]
    # A retry of the failed send is new again; the freed slot means nothing is evicted yet.
    assert store.ring_reserve("r", [b, c], 3, LONG_MS) == [NEW, NEW]
    assert store.ring_ids("r") == [a, b, c]
    assert store.ring_reserve("r", [e], 3, LONG_MS) == [NEW]
    assert store.ring_ids("r") == [b, c, e]
    assert store.ring_release("missing", [a]) == 0
    store.ring_confirm("missing", [a])  # no ring: nothing to do, no error
    assert store.ring_stats("missing") is None


def test_stale_reservation_is_taken_over(store: Store) -> None:
    a, b = d("a", "b")
    assert store.ring_reserve("r", [a, b], 10, LONG_MS) == [NEW, NEW]
    time.sleep(0.25)
    # b's sender is presumed dead after 200 ms: a new sender takes it over (same slot).
    assert store.ring_lookup("r", [b], 200) == [NEW]
    assert store.ring_reserve("r", [b], 10, 200) == [NEW]
    assert store.ring_ids("r") == [a, b]
    # The takeover restarted b's clock; a's reservation is still the old one.
    assert store.ring_reserve("r", [a, b], 10, 200) == [NEW, FLIGHT]
    store.ring_confirm("r", [b])
    time.sleep(0.25)
    assert store.ring_reserve("r", [b], 10, 200) == [DUP]  # confirmed ids never go stale


def test_reserve_all_or_none(store: Store) -> None:
    a, b, c = d("a", "b", "c")
    assert store.ring_reserve("r", [a], 10, LONG_MS) == [NEW]
    assert store.ring_reserve("r", [b, a, c], 10, LONG_MS, all_or_none=True) == [NEW, FLIGHT, NEW]
    assert store.ring_ids("r") == [a]
    assert store.ring_reserve("r", [b, c, b], 10, LONG_MS, all_or_none=True) == [NEW, NEW, DUP]
    assert store.ring_ids("r") == [a]
    assert store.ring_reserve("r", [b, c], 10, LONG_MS, all_or_none=True) == [NEW, NEW]
    assert store.ring_ids("r") == [a, b, c]
    store.ring_confirm("r", [a])
    assert store.ring_reserve("r", [a], 10, LONG_MS, all_or_none=True) == [DUP]


def test_reservations_evict_like_adds(store: Store) -> None:
    ids = d(*range(5))
    assert store.ring_reserve("r", ids, 3, LONG_MS) == [NEW] * 5
    assert store.ring_ids("r") == ids[2:]
    assert store.ring_lookup("r", ids, LONG_MS) == [NEW, NEW, FLIGHT, FLIGHT, FLIGHT]
    # An evicted reservation is gone: confirming or releasing it changes nothing.
    store.ring_confirm("r", ids[:1])
    assert store.ring_release("r", ids[:2]) == 0
    assert store.ring_ids("r") == ids[2:]
    # Resizing keeps the newest reservations, still unconfirmed.
    assert store.ring_resize("r", 2) == 1
    assert store.ring_lookup("r", ids[3:], LONG_MS) == [FLIGHT, FLIGHT]
    assert store.ring_release("r", ids[3:]) == 2
    assert store.ring_ids("r") == []


@pytest.mark.parametrize("pending_ms", [0, -1])
def test_pending_ms_below_one_is_rejected(store: Store, pending_ms: int) -> None:
    with pytest.raises(ValueError, match="pending_ms"):
        store.ring_reserve("r", d("a"), 10, pending_ms)
    with pytest.raises(ValueError, match="pending_ms"):
        store.ring_lookup("r", d("a"), pending_ms)
    assert store.ring_stats("r") is None


def test_threads_racing_reserve_each_id_once(store: Store) -> None:
    race_four_threads(store, lambda batch: [found is NEW for found in
                                            store.ring_reserve("race", batch, 1000, LONG_MS)])


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


def test_settled_count_outlives_its_message_for_the_grace(store: Store) -> None:
    for _ in range(3):
        store.delivery_count_incr("q", "m1")
    store.delivery_count_incr("q", "m2")
    store.delivery_count_settle("q", ["m1", "never-counted"], 60_000)
    assert store.delivery_count_get("q", "m1") == 3  # kept: its ack may still be lost
    assert store.delivery_count_get("q", "never-counted") == 0
    # The ack was lost: the broker redelivers, and counting goes on from the settled count.
    assert store.delivery_count_incr("q", "m1") == 4
    store.delivery_count_settle("q", ["m1"], 0)
    assert store.delivery_count_get("q", "m1") == 0  # no grace: forgotten at once
    assert store.delivery_count_get("q", "m2") == 1  # never settled: untouched
    store.delivery_count_settle("q", [], 0)


def test_settling_forgets_counts_whose_grace_passed(store: Store) -> None:
    # Counts settled by a process that died are forgotten by the next settle on the queue.
    for message_id in ("a", "b", "c"):
        store.delivery_count_incr("q", message_id)
    store.delivery_count_settle("q", ["a"], 1)
    store.delivery_count_settle("q", ["b"], 60_000)
    time.sleep(0.05)
    store.delivery_count_settle("q", ["c"], 60_000)
    assert store.delivery_count_get("q", "a") == 0
    assert store.delivery_count_get("q", "b") == 1
    assert store.delivery_count_get("q", "c") == 1
    # A redelivery takes a count out of its grace: a later purge leaves it alone.
    store.delivery_count_settle("q", ["b"], 1)
    assert store.delivery_count_incr("q", "b") == 2
    time.sleep(0.05)
    store.delivery_count_settle("q", ["c"], 60_000)
    assert store.delivery_count_get("q", "b") == 2
    store.delivery_count_clear("q", "c")
    assert store.delivery_count_get("q", "c") == 0
    assert store.delivery_count_incr("q", "c") == 1


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


# -- consumer audit windows -------------------------------------------------------------------

TTL = 60_000  # ms: long enough that no window expires during a test unless it means to


def test_audit_mark_then_seen(store: Store) -> None:
    assert store.audit_seen("q", "p", [0, 1, 2]) == [False] * 3  # no window yet
    store.audit_mark("q", "p", [1, 2, 3], 2048, TTL)
    assert store.audit_seen("q", "p", [0, 1, 2, 3, 4]) == [False, True, True, True, False]
    store.audit_mark("q", "p", [3, 2, 3], 2048, TTL)  # marking again changes nothing
    assert store.audit_seen("q", "p", [3, 2, 1, 0]) == [True, True, True, False]
    assert store.audit_seen("q", "p", []) == []
    store.audit_mark("q", "p", [], 2048, TTL)
    store.audit_forget("q", "p", [])
    assert store.audit_seen("q", "p", [1, 4]) == [True, False]


def test_audit_unmarked_sequences_are_not_seen(store: Store) -> None:
    store.audit_mark("q", "p", [10, 12], 64, TTL)
    assert store.audit_seen("q", "p", [9, 10, 11, 12, 13, 10**6]) == [
        False, True, False, True, False, False]


def test_audit_window_slides_and_forgets_old_marks(store: Store) -> None:
    store.audit_mark("q", "p", list(range(8)), 8, TTL)
    assert store.audit_seen("q", "p", list(range(8))) == [True] * 8
    store.audit_mark("q", "p", [10], 8, TTL)  # the window is now 3..10
    assert store.audit_seen("q", "p", list(range(12))) == (
        [False] * 3 + [True] * 5 + [False, False, True, False])
    # Sliding by less than a window in one step, wrapping around the bitmap: 8, 9 and 11..20
    # must not inherit the slots' old marks.
    store.audit_mark("q", "p", [21], 13, TTL)  # another size: starts afresh
    store.audit_mark("q", "p", list(range(9, 22)), 13, TTL)
    store.audit_mark("q", "p", [32], 13, TTL)
    assert store.audit_seen("q", "p", list(range(19, 34))) == (
        [False] + [True] * 2 + [False] * 10 + [True, False])


@pytest.mark.parametrize("size", [13, 64, 100])
def test_audit_slide_clears_exactly_the_slots_passed_over(store: Store, size: int) -> None:
    # Each round fills the whole window, then slides it by a gap: the slots passed over (at
    # varying bitmap offsets, with and without wrap-around, partial and whole bytes) must read
    # unmarked, everything else in the window marked.
    gaps = [g for g in (2, 3, 7, 8, 9, 15, 16, 17, 23, size - 1) if g < size]
    high = size - 1
    for step in range(40):
        store.audit_mark("q", "p", list(range(high - size + 1, high + 1)), size, TTL)
        new = high + gaps[step % len(gaps)]
        store.audit_mark("q", "p", [new], size, TTL)
        probe = list(range(high - size + 1, new + 2))
        want = [new - size < s <= high or s == new for s in probe]
        assert store.audit_seen("q", "p", probe) == want, (step, high, new)
        high = new


def test_audit_older_than_window_is_not_seen(store: Store) -> None:
    store.audit_mark("q", "p", [100], 4, TTL)
    assert store.audit_seen("q", "p", [96, 97, 100]) == [False, False, True]
    store.audit_mark("q", "p", [96, 97], 4, TTL)  # 96 is below the window 97..100: ignored
    assert store.audit_seen("q", "p", [95, 96, 97, 98, 100]) == [False, False, True, False, True]
    # A jump of a window or more forgets everything.
    store.audit_mark("q", "p", [104], 4, TTL)
    assert store.audit_seen("q", "p", [97, 100, 104]) == [False, False, True]


def test_audit_batch_order_does_not_matter(store: Store) -> None:
    batch = [5000, 1, 4999, 2953, 2952, 7000, 4953]
    store.audit_mark("q", "a", batch, 2048, TTL)
    store.audit_mark("q", "b", sorted(batch), 2048, TTL)
    store.audit_mark("q", "c", sorted(batch, reverse=True), 2048, TTL)
    probe = [*batch, 4952, 5001]
    want = [seq > 7000 - 2048 and seq in batch for seq in probe]
    for producer in "abc":
        assert store.audit_seen("q", producer, probe) == want, producer


def test_audit_window_size_one(store: Store) -> None:
    store.audit_mark("q", "p", [3], 1, TTL)
    assert store.audit_seen("q", "p", [2, 3, 4]) == [False, True, False]
    store.audit_mark("q", "p", [2, 4], 1, TTL)
    assert store.audit_seen("q", "p", [2, 3, 4]) == [False, False, True]


def test_audit_other_window_size_starts_afresh(store: Store) -> None:
    store.audit_mark("q", "p", [1, 2], 8, TTL)
    store.audit_mark("q", "p", [3], 16, TTL)
    assert store.audit_seen("q", "p", [1, 2, 3]) == [False, False, True]
    store.audit_mark("q", "p", [4], 16, TTL)
    assert store.audit_seen("q", "p", [3, 4]) == [True, True]


def test_audit_scopes_and_producers_are_independent(store: Store) -> None:
    store.audit_mark("q1", "p1", [1], 2048, TTL)
    store.audit_mark("q1", "p2", [2], 2048, TTL)
    store.audit_mark("q2", "p1", [3], 2048, TTL)
    assert store.audit_seen("q1", "p1", [1, 2, 3]) == [True, False, False]
    assert store.audit_seen("q1", "p2", [1, 2, 3]) == [False, True, False]
    assert store.audit_seen("q2", "p1", [1, 2, 3]) == [False, False, True]
    assert store.audit_seen("q2", "p2", [1, 2, 3]) == [False] * 3
    # Sliding one producer's window leaves the others alone.
    store.audit_mark("q1", "p1", [10**6], 2048, TTL)
    assert store.audit_seen("q1", "p2", [2]) == [True]
    assert store.audit_seen("q2", "p1", [3]) == [True]


def test_audit_forget(store: Store) -> None:
    store.audit_mark("q", "p", [1, 2, 3, 4, 5], 8, TTL)
    store.audit_forget("q", "p", [2, 4, 99, 0])
    assert store.audit_seen("q", "p", [1, 2, 3, 4, 5]) == [True, False, True, False, True]
    store.audit_forget("q", "p", [2, 5])  # again, and the highest: the window stays put
    assert store.audit_seen("q", "p", [1, 2, 3, 4, 5]) == [True, False, True, False, False]
    store.audit_mark("q", "p", [2], 8, TTL)
    assert store.audit_seen("q", "p", [2]) == [True]
    store.audit_forget("missing", "p", [1])  # an unknown window: nothing to do, nothing made
    store.audit_forget("q", "missing", [1])
    assert store.audit_seen("missing", "p", [1]) == [False]
    assert store.audit_seen("q", "p", [1, 3]) == [True, True]


def test_audit_ttl_expiry(store: Store) -> None:
    store.audit_mark("q", "gone", [1, 2], 2048, 200)
    store.audit_mark("q", "stays", [1], 2048, TTL)
    assert store.audit_seen("q", "gone", [1, 2]) == [True, True]
    time.sleep(0.4)
    assert store.audit_seen("q", "gone", [1, 2]) == [False, False]
    assert store.audit_seen("q", "stays", [1]) == [True]
    # The expired window is gone whole: marking starts afresh (its old high does not linger).
    store.audit_mark("q", "gone", [0], 2048, TTL)
    assert store.audit_seen("q", "gone", [0, 1, 2]) == [True, False, False]


def test_audit_mark_extends_ttl_and_forget_does_not(store: Store) -> None:
    store.audit_mark("q", "marked", [1], 2048, 500)
    store.audit_mark("q", "forgotten", [1, 2], 2048, 500)
    time.sleep(0.3)
    store.audit_mark("q", "marked", [2], 2048, 500)
    store.audit_forget("q", "forgotten", [1])
    time.sleep(0.35)  # 0.65 s after the first marks, 0.35 s after the second
    assert store.audit_seen("q", "marked", [1, 2]) == [True, True]
    assert store.audit_seen("q", "forgotten", [1, 2]) == [False, False]


def test_audit_awkward_names(store: Store) -> None:
    # Includes ids that could pose as another key's suffix if escaped carelessly.
    producers = [*AWKWARD_NAMES, "x}:ring", "meta:x", "bits:x"]
    pairs = [(scope, producer) for scope in AWKWARD_NAMES for producer in producers]
    for i, (scope, producer) in enumerate(pairs):
        store.audit_mark(scope, producer, [i], len(pairs), TTL)
    for i, (scope, producer) in enumerate(pairs):
        flags = store.audit_seen(scope, producer, list(range(len(pairs))))
        assert flags == [j == i for j in range(len(pairs))], (scope, producer)
    assert store.ring_names() == []  # audit keys never pass for rings


def test_audit_large_sequences(store: Store) -> None:
    big = 2**40
    store.audit_mark("q", "p", [big, big + 1, big + 2047], 2048, TTL)
    assert store.audit_seen("q", "p", [big - 1, big, big + 1, big + 2, big + 2047]) == [
        False, True, True, False, True]
    store.audit_mark("q", "p", [big + 2048], 2048, TTL)  # slides by one: big falls out
    assert store.audit_seen("q", "p", [big, big + 1, big + 2048]) == [False, True, True]
    top = 2**53 - 1  # the largest allowed, exact in Lua doubles
    store.audit_mark("q", "top", [top - 1, top - 3000, top], 2048, TTL)
    assert store.audit_seen("q", "top", [top - 3000, top - 2, top - 1, top]) == [
        False, False, True, True]
    store.audit_forget("q", "top", [top])
    assert store.audit_seen("q", "top", [top - 1, top]) == [True, False]


@pytest.mark.parametrize("seq", [-1, 2**53])
def test_audit_sequence_out_of_range_is_rejected(store: Store, seq: int) -> None:
    for call in (lambda: store.audit_mark("q", "p", [1, seq], 8, TTL),
                 lambda: store.audit_seen("q", "p", [seq]),
                 lambda: store.audit_forget("q", "p", [seq])):
        with pytest.raises(ValueError, match="sequence"):
            call()
    assert store.audit_seen("q", "p", [1]) == [False]  # nothing of the batch was applied


def test_audit_bad_window_or_ttl_is_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="window"):
        store.audit_mark("q", "p", [1], 0, TTL)
    with pytest.raises(ValueError, match="ttl"):
        store.audit_mark("q", "p", [1], 8, 0)
    assert store.audit_seen("q", "p", [1]) == [False]


class AuditModel:
    """The audit window semantics of base.py as plainly as possible (no expiry)."""

    def __init__(self) -> None:
        # (scope, producer) -> (window size, marked sequences, highest marked)
        self.windows: dict[tuple[str, str], tuple[int, set[int], int]] = {}

    def seen(self, key: tuple[str, str], seq: int) -> bool:
        size, marked, high = self.windows.get(key, (1, set(), -1))
        return seq in marked and seq > high - size

    def mark(self, key: tuple[str, str], seqs: list[int], size: int) -> None:
        old = self.windows.get(key)
        _, marked, high = old if old and old[0] == size else (size, set(), -1)
        self.windows[key] = (size, marked | set(seqs), max([high, *seqs]))

    def forget(self, key: tuple[str, str], seqs: list[int]) -> None:
        if key in self.windows:
            self.windows[key][1].difference_update(seqs)


# Sequences relative to the producer's highest mark (slides of less than a window, both ways,
# wrapping around the bitmap at sizes that are and are not multiples of 8), or absolute jumps.
_AUDIT_SEQS = st.lists(st.one_of(st.tuples(st.just("rel"), st.integers(-20, 20)),
                                 st.tuples(st.just("abs"), st.integers(0, 10**6))),
                       min_size=1, max_size=6)
_AUDIT_KEYS = st.tuples(st.sampled_from(["a", "{b}"]), st.sampled_from(["p", ""]))
_AUDIT_OPS = st.lists(st.tuples(st.sampled_from(["mark", "seen", "forget"]), _AUDIT_KEYS,
                                _AUDIT_SEQS),
                      max_size=15)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from([1, 3, 8, 13, 17, 100]), ops=_AUDIT_OPS)
def test_random_audit_operations_match_model(store: Store, size: int, ops: list[tuple]) -> None:
    prefix = f"prop-{uuid.uuid4().hex[:8]}-"
    model = AuditModel()
    for kind, (scope, producer), steps in ops:
        key = (prefix + scope, producer)
        high = model.windows.get(key, (size, set(), -1))[2]
        seqs = [max(0, high + v) if base == "rel" else v for base, v in steps]
        if kind == "mark":
            store.audit_mark(*key, seqs, size, TTL)
            model.mark(key, seqs, size)
        elif kind == "forget":
            store.audit_forget(*key, seqs)
            model.forget(key, seqs)
        else:
            assert store.audit_seen(*key, seqs) == [model.seen(key, s) for s in seqs], seqs
        # Every slot of the window, and one past each end.
        high = model.windows.get(key, (size, set(), -1))[2]
        probe = list(range(max(0, high - size), high + 2))
        assert store.audit_seen(*key, probe) == [model.seen(key, s) for s in probe], (kind, seqs)


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


# -- consumer presence -------------------------------------------------------------------------


def test_presence_beat_live_and_leave(store: Store) -> None:
    assert store.presence_live("q") == {}
    store.presence_beat("q", "c1", b'{"node":"a"}', 10_000)
    store.presence_beat("q", "c2", b"", 10_000)
    assert store.presence_live("q") == {"c1": b'{"node":"a"}', "c2": b""}
    # A beat replaces the info.
    store.presence_beat("q", "c1", b"new", 10_000)
    assert store.presence_live("q")["c1"] == b"new"
    assert store.presence_leave("q", "c1") is True
    assert store.presence_leave("q", "c1") is False
    assert store.presence_live("q") == {"c2": b""}
    assert store.presence_live("other") == {}


def test_presence_expires_unless_refreshed(store: Store) -> None:
    store.presence_beat("q", "short", b"s", 300)
    store.presence_beat("q", "kept", b"k", 300)
    time.sleep(0.15)
    store.presence_beat("q", "kept", b"k", 300)
    time.sleep(0.25)
    assert store.presence_live("q") == {"kept": b"k"}
    assert store.presence_leave("q", "short") is False
    time.sleep(0.2)
    assert store.presence_live("q") == {}


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_presence_awkward_names(store: Store, name: str) -> None:
    store.presence_beat(name, name, name.encode("utf-8", "surrogatepass"), 10_000)
    store.presence_beat(name + "x", "other", b"o", 10_000)
    assert store.presence_live(name) == {name: name.encode("utf-8", "surrogatepass")}
    assert store.presence_live(name + "x") == {"other": b"o"}


@pytest.mark.parametrize("ttl", [0, -5])
def test_presence_bad_ttl_is_rejected(store: Store, ttl: int) -> None:
    with pytest.raises(ValueError):
        store.presence_beat("q", "c", b"", ttl)
    assert store.presence_live("q") == {}
