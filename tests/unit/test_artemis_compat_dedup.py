"""Duplicate detection against the Artemis sources: bridge ids in transactions, the
``BRIDGE.<address>`` cache's own settings, and the deliberate deviations listed in
docs/artemis-compat.md (MemoryStore + loopback broker; the same on real servers is in
tests/integration/test_bridge_transactions.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.digest import id_digest
from mqguard.errors import AdapterError, TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER
from mqguard.pipeline import Guard
from mqguard.plugins.duplicate_detection import DuplicateDetectionPlugin
from mqguard.producer import GuardedProducer
from mqguard.stores.base import RingOutcome
from mqguard.testing.loopback import LoopbackAdapter

BRIDGE = BRIDGE_DUPLICATE_ID_HEADER


def make_guard(tmp_path: Path, pending_ms: int = 10_000, **settings: Any) -> Guard:
    return Guard(parse_config({
        "mqguard": {"event-log": {"directory": str(tmp_path / "ev")}},
        "plugins": {"duplicate_detection": {"pending-timeout-ms": pending_ms}},
        "address-settings": settings}))


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Guard, LoopbackAdapter, GuardedProducer]]:
    guard = make_guard(tmp_path, pending_ms=300)
    adapter = LoopbackAdapter()
    yield guard, adapter, GuardedProducer(adapter, guard)
    guard.close()


def bridge(bridge_id: str) -> dict[str, str]:
    return {BRIDGE: bridge_id}


def lookup(guard: Guard, cache: str, duplicate_id: str) -> RingOutcome:
    return guard.store.ring_lookup(cache, [id_digest(duplicate_id)], 60_000)[0]


def plugin_of(guard: Guard) -> DuplicateDetectionPlugin:
    plugin = guard.plugins.get_plugin("duplicate_detection")
    assert isinstance(plugin, DuplicateDetectionPlugin)
    return plugin


# -- defect 1: a committed bridge id is confirmed at COMMIT --------------------------------


def test_committed_bridge_id_is_a_duplicate_not_in_flight(setup) -> None:
    guard, adapter, producer = setup
    with producer.transaction() as tx:
        producer.send("q", b"copy", headers=bridge("b1"), transaction=tx)
    # Artemis: the later send of a committed bridge id is dropped and still succeeds.
    assert not producer.send("q", b"again", headers=bridge("b1")).sent
    guard.close()  # flushes what is owed
    assert lookup(guard, "BRIDGE.q", "b1") is RingOutcome.DUPLICATE
    assert [m.body for m in adapter.loop.drain("q")] == [b"copy"]


def test_committed_bridge_id_is_never_taken_over(setup) -> None:
    guard, adapter, producer = setup
    with producer.transaction() as tx:
        producer.send("q", b"copy", headers=bridge("b1"), transaction=tx)
    time.sleep(0.45)  # past pending-timeout-ms: a mere reservation would be taken over
    assert not producer.send("q", b"again", headers=bridge("b1")).sent
    # In a transaction a bridge duplicate rolls it back (Artemis: checkBridgeDuplicateID).
    with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
        with producer.transaction() as tx:
            producer.send("q", b"in-tx", headers=bridge("b1"), transaction=tx)
    assert [m.body for m in adapter.loop.drain("q")] == [b"copy"]


def test_committed_bridge_id_leaves_no_staged_state(setup) -> None:
    guard, _, producer = setup
    with producer.transaction() as tx:
        producer.send("q", b"copy", headers=bridge("b1"), transaction=tx)
    with pytest.raises(ValueError), producer.transaction() as tx:
        producer.send("q", b"copy", headers=bridge("b2"), transaction=tx)
        raise ValueError("abort")
    plugin = plugin_of(guard)
    assert plugin._staged == {}
    assert plugin._held == {}


# -- defect 2: a rolled-back transaction releases every id it staged ------------------------


def test_aborted_transaction_releases_its_bridge_ids(setup) -> None:
    guard, adapter, producer = setup
    with pytest.raises(ValueError), producer.transaction() as tx:
        producer.send("q", b"first", headers=bridge("b1"), transaction=tx)
        producer.send("q", b"first", duplicate_id="D1", transaction=tx)
        raise ValueError("the block raised: ABORT")
    assert guard.store.ring_ids("BRIDGE.q") == []  # Artemis: beforeRollback -> deleteFromCache
    with producer.transaction() as tx:  # the bridge's retry
        producer.send("q", b"retry", headers=bridge("b1"), transaction=tx)
        producer.send("q", b"retry-d", duplicate_id="D1", transaction=tx)
    assert [m.body for m in adapter.loop.drain("q")] == [b"retry", b"retry-d"]


def test_transaction_rolled_back_for_a_duplicate_releases_its_bridge_ids(setup) -> None:
    guard, adapter, producer = setup
    assert producer.send("q", b"seed", duplicate_id="seen").sent
    with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
        with producer.transaction() as tx:
            producer.send("q", b"copy", headers=bridge("b1"), transaction=tx)
            producer.send("q", b"dup", duplicate_id="seen", transaction=tx)
    assert guard.store.ring_ids("BRIDGE.q") == []
    assert producer.send("q", b"retry", headers=bridge("b1")).sent
    assert [m.body for m in adapter.loop.drain("q")] == [b"seed", b"retry"]


def test_failed_commit_releases_its_bridge_ids(setup) -> None:
    guard, adapter, producer = setup

    def broken_commit(transaction: str) -> None:
        raise AdapterError("loopback: connection lost at COMMIT")

    real_commit, adapter.commit = adapter.commit, broken_commit  # type: ignore[method-assign]
    with pytest.raises(AdapterError), producer.transaction() as tx:
        producer.send("q", b"copy", headers=bridge("b1"), transaction=tx)
    assert guard.store.ring_ids("BRIDGE.q") == []
    adapter.commit = real_commit  # type: ignore[method-assign]
    assert producer.send("q", b"retry", headers=bridge("b1")).sent


def test_bridge_id_twice_in_one_transaction_rolls_it_back(setup) -> None:
    # Artemis agrees here: atomicVerify finds the first (added at once) and rolls back.
    guard, adapter, producer = setup
    with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
        with producer.transaction() as tx:
            producer.send("q", b"1", headers=bridge("b1"), transaction=tx)
            producer.send("q", b"2", headers=bridge("b1"), transaction=tx)
    assert adapter.loop.depth("q") == 0
    assert guard.store.ring_ids("BRIDGE.q") == []
    assert producer.send("q", b"retry", headers=bridge("b1")).sent


def test_bridge_id_committed_by_another_sender_meanwhile_rolls_back(tmp_path: Path) -> None:
    # The reservation of an open transaction goes stale after pending-timeout-ms; a sender
    # that took it over and got its send confirmed wins, and the COMMIT re-check sees it.
    guard = make_guard(tmp_path, pending_ms=200)
    adapter = LoopbackAdapter()
    producer, other = GuardedProducer(adapter, guard), GuardedProducer(adapter, guard)
    try:
        with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
            with producer.transaction() as tx:
                producer.send("q", b"mine", headers=bridge("b1"), transaction=tx)
                time.sleep(0.3)
                assert other.send("q", b"theirs", headers=bridge("b1")).sent
        assert [m.body for m in adapter.loop.drain("q")] == [b"theirs"]
    finally:
        guard.close()


# -- defect 3: BRIDGE.<address> is a cache of its own ---------------------------------------


def test_bridge_ids_checked_when_the_address_has_id_cache_size_zero(tmp_path: Path) -> None:
    with make_guard(tmp_path, **{"q": {"id-cache-size": 0}}) as guard:
        adapter = LoopbackAdapter()
        producer = GuardedProducer(adapter, guard)
        assert producer.send("q", b"1", headers=bridge("b1")).sent
        assert not producer.send("q", b"2", headers=bridge("b1")).sent
        with producer.transaction() as tx:
            producer.send("q", b"3", headers=bridge("b2"), transaction=tx)
        assert not producer.send("q", b"4", headers=bridge("b2")).sent
        # _AMQ_DUPL_ID stays off for the address itself.
        assert producer.send("q", b"5", duplicate_id="D").sent
        assert producer.send("q", b"6", duplicate_id="D").sent
        assert [m.body for m in adapter.loop.drain("q")] == [b"1", b"3", b"5", b"6"]
        stats = guard.store.ring_stats("BRIDGE.q")
        assert stats is not None and stats.capacity == 20000
        assert guard.store.ring_stats("q") is None


def test_bridge_cache_sized_by_the_settings_matching_its_own_name(tmp_path: Path) -> None:
    settings = {"q": {"id-cache-size": 3}, "BRIDGE.#": {"id-cache-size": 2}}
    with make_guard(tmp_path, **settings) as guard:
        producer = GuardedProducer(LoopbackAdapter(), guard)
        for bridge_id in ("b1", "b2", "b3"):  # capacity 2: b3 overwrites b1
            assert producer.send("q", b"", headers=bridge(bridge_id)).sent
        assert producer.send("q", b"", headers=bridge("b1")).sent  # left the ring
        stats = guard.store.ring_stats("BRIDGE.q")
        assert stats is not None and stats.capacity == 2


def test_bridge_cache_takes_the_global_default_not_the_address_size(tmp_path: Path) -> None:
    with make_guard(tmp_path, **{"q": {"id-cache-size": 3}}) as guard:
        producer = GuardedProducer(LoopbackAdapter(), guard)
        for bridge_id in ("b1", "b2", "b3", "b4"):
            assert producer.send("q", b"", headers=bridge(bridge_id)).sent
        assert not producer.send("q", b"", headers=bridge("b1")).sent  # 20000, not 3
        stats = guard.store.ring_stats("BRIDGE.q")
        assert stats is not None and stats.capacity == 20000


def test_bridge_cache_size_zero_turns_bridge_detection_off(tmp_path: Path) -> None:
    with make_guard(tmp_path, **{"BRIDGE.#": {"id-cache-size": 0}}) as guard:
        adapter = LoopbackAdapter()
        producer = GuardedProducer(adapter, guard)
        # Artemis: a NoOp cache for BRIDGE.q; _AMQ_DUPL_ID is still ignored when the bridge
        # header is present.
        assert producer.send("q", b"1", headers=bridge("b1"), duplicate_id="D").sent
        assert producer.send("q", b"2", headers=bridge("b1"), duplicate_id="D").sent
        assert guard.store.ring_stats("BRIDGE.q") is None
        assert guard.store.ring_stats("q") is None
        assert adapter.loop.depth("q") == 2


def test_batch_of_bridge_messages_confirmed_in_the_bridge_cache(tmp_path: Path) -> None:
    with make_guard(tmp_path, pending_ms=200, **{"q": {"id-cache-size": 0}}) as guard:
        adapter = LoopbackAdapter()
        producer = GuardedProducer(adapter, guard)
        results = producer.send_batch([producer.message("q", b"", headers=bridge(b))
                                       for b in ("b1", "b2")])
        assert [r.sent for r in results] == [True, True]
        time.sleep(0.3)  # unconfirmed reservations would now be taken over
        again = producer.send_batch([producer.message("q", b"", headers=bridge(b))
                                     for b in ("b1", "b2")])
        assert [r.sent for r in again] == [False, False]


# -- deliberate deviations (docs/artemis-compat.md) -----------------------------------------


def test_deviation_commit_rechecks_ids_committed_meanwhile(setup) -> None:
    """Artemis commits both (no re-check at COMMIT); mqguard rolls the second back."""
    guard, adapter, producer = setup
    other = GuardedProducer(adapter, guard)
    with pytest.raises(TransactionRolledBack, match="committed to q by another producer"):
        with producer.transaction() as tx:
            producer.send("q", b"mine", duplicate_id="R", transaction=tx)
            with other.transaction() as tx2:
                other.send("q", b"theirs", duplicate_id="R", transaction=tx2)
    assert [m.body for m in adapter.loop.drain("q")] == [b"theirs"]
    guard.events.flush()
    rejected = [e for e in read_events(guard.events.directory)
                if e["type"] == "duplicate_rejected"]
    assert [e["duplicate_id"] for e in rejected] == ["R"]


def test_deviation_same_duplicate_id_twice_in_one_transaction(setup) -> None:
    """Artemis routes both (the id enters the cache only after COMMIT); mqguard rolls back."""
    guard, adapter, producer = setup
    with pytest.raises(TransactionRolledBack, match="already in this transaction"):
        with producer.transaction() as tx:
            producer.send("q", b"1", duplicate_id="X", transaction=tx)
            producer.send("q", b"2", duplicate_id="X", transaction=tx)
    assert adapter.loop.depth("q") == 0
    assert producer.send("q", b"retry", duplicate_id="X").sent  # nothing was cached


def test_deviation_unconfirmed_id_refused_as_in_flight(setup) -> None:
    """Artemis has no in-flight state: its cache and message share one storage transaction."""
    guard, adapter, producer = setup
    guard.store.ring_reserve("q", [id_digest("A")], 20000, 60_000)  # another sender's
    from mqguard.errors import MessageRejected

    with pytest.raises(MessageRejected, match="DUPLICATE_ID_IN_FLIGHT"):
        producer.send("q", b"1", duplicate_id="A")
    assert adapter.loop.depth("q") == 0


def test_send_overtaking_a_flush_sees_the_committed_id_as_a_duplicate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flusher takes the owed confirmations, then sends them: a reservation of the same
    cache in between must still carry them, or a committed id reads as "in flight"."""
    import threading

    with make_guard(tmp_path) as guard:
        producer = GuardedProducer(LoopbackAdapter(), guard)
        store = guard.store
        real_confirm = store.ring_confirm
        in_flush, go_on = threading.Event(), threading.Event()

        def slow_confirm(name: str, ids: Any) -> None:
            if threading.current_thread().name == "mqguard-dedup-confirm":
                in_flush.set()
                go_on.wait(5)
            real_confirm(name, ids)

        monkeypatch.setattr(store, "ring_confirm", slow_confirm)
        with producer.transaction() as tx:
            producer.send("q", b"copy", duplicate_id="D", transaction=tx)
        assert in_flush.wait(5), "the flusher did not start"
        try:
            assert not producer.send("q", b"again", duplicate_id="D").sent
        finally:
            go_on.set()


def test_deviation_addresses_reserved_one_after_the_other(setup) -> None:
    """Artemis adds all of a transaction's ids in one step; mqguard reserves address after
    address, and releases the earlier ones when a later one is refused."""
    guard, adapter, producer = setup
    other = GuardedProducer(adapter, guard)
    with pytest.raises(TransactionRolledBack, match="committed to q2 by another producer"):
        with producer.transaction() as tx:
            producer.send("q1", b"x", duplicate_id="X", transaction=tx)
            producer.send("q2", b"y", duplicate_id="Y", transaction=tx)
            assert other.send("q2", b"theirs", duplicate_id="Y").sent
    assert guard.store.ring_ids("q1") == []  # reserved at COMMIT, released by the rollback
    assert producer.send("q1", b"x-retry", duplicate_id="X").sent
    assert [m.body for m in adapter.loop.drain("q1")] == [b"x-retry"]


def test_every_test_docs_artemis_compat_cites_exists() -> None:
    """docs/artemis-compat.md pins each difference with ``file::test``: each must exist, and
    every difference (a ``###`` section) must cite at least one."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "artemis-compat.md").read_text()
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert cited
    missing = [f"{path}::{name}" for path, name in cited
               if not (root / path).is_file()
               or f"def {name}(" not in (root / path).read_text()]
    assert missing == []
    sections = re.split(r"^### ", text, flags=re.MULTILINE)[1:]
    unpinned = [section.splitlines()[0] for section in sections
                if not re.search(r"`tests/[\w/]+\.py::\w+`", section)]
    assert unpinned == []
