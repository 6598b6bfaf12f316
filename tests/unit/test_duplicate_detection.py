"""Duplicate detection semantics (pure logic, MemoryStore + loopback broker).

The same semantics against real Redis and real brokers are in
tests/integration/test_duplicate_detection.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from mqguard.config import parse_config
from mqguard.digest import id_digest
from mqguard.errors import AdapterError, ConfigError, MessageRejected, TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER
from mqguard.pipeline import Guard
from mqguard.plugins.duplicate_detection import IN_FLIGHT_CODE
from mqguard.producer import GuardedProducer
from mqguard.stores.base import RingOutcome, Store
from mqguard.testing.loopback import LoopbackAdapter


def make_guard(tmp_path: Path, **extra: object) -> Guard:
    data: dict = {"mqguard": {"event-log": {"directory": str(tmp_path / "ev")}},
                  "address-settings": {"small": {"id-cache-size": 3},
                                       "off.#": {"id-cache-size": 0}}}
    data.update(extra)
    return Guard(parse_config(data))


@pytest.fixture
def setup(tmp_path: Path):
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    yield guard, adapter, GuardedProducer(adapter, guard)
    guard.close()


def kinds(guard: Guard) -> list[str]:
    guard.events.flush()
    return [e["type"] for e in read_events(guard.events.directory)]


def test_duplicate_is_not_routed_but_send_succeeds(setup, caplog) -> None:
    guard, adapter, producer = setup
    caplog.set_level(logging.WARNING)
    assert producer.send("q", b"1", duplicate_id="A").sent
    result = producer.send("q", b"2", duplicate_id="A")  # no exception: Artemis behaviour
    assert not result.sent
    assert [m.body for m in adapter.loop.drain("q")] == [b"1"]
    assert kinds(guard) == ["sent", "duplicate_rejected"]
    event = list(read_events(guard.events.directory))[-1]
    assert (event["address"], event["duplicate_id"]) == ("q", "A")
    assert "Duplicate message detected" in caplog.text


def test_caches_are_per_address(setup) -> None:
    _, adapter, producer = setup
    assert producer.send("q1", b"", duplicate_id="A").sent
    assert producer.send("q2", b"", duplicate_id="A").sent


def test_ring_overwrites_oldest_at_id_cache_size(setup) -> None:
    _, _, producer = setup
    for dup in "abcd":  # capacity 3: 'd' overwrites 'a'
        assert producer.send("small", b"", duplicate_id=dup).sent
    assert producer.send("small", b"", duplicate_id="a").sent  # left the ring
    assert not producer.send("small", b"", duplicate_id="d").sent


def test_id_cache_size_zero_disables(setup) -> None:
    guard, _, producer = setup
    assert producer.send("off.x", b"", duplicate_id="A").sent
    assert producer.send("off.x", b"", duplicate_id="A").sent
    assert guard.store.ring_stats("off.x") is None


def test_acknowledging_does_not_remove_the_id(setup) -> None:
    guard, adapter, producer = setup
    producer.send("q", b"", duplicate_id="A")
    from mqguard.consumer import GuardedConsumer

    with GuardedConsumer(adapter, "q", lambda m: None, guard):
        assert adapter.pump() == 1
    assert not producer.send("q", b"", duplicate_id="A").sent


def test_transaction_ids_visible_only_at_commit(setup) -> None:
    guard, adapter, producer = setup
    with producer.transaction() as tx:
        producer.send("q", b"t", duplicate_id="T", transaction=tx)
        assert guard.store.ring_contains("q", [id_digest("T")]) == [False]
    assert guard.store.ring_contains("q", [id_digest("T")]) == [True]
    assert not producer.send("q", b"again", duplicate_id="T").sent


def test_duplicate_inside_transaction_rolls_back_everything(setup) -> None:
    guard, adapter, producer = setup
    producer.send("q", b"first", duplicate_id="A")
    adapter.loop.drain("q")
    with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
        with producer.transaction() as tx:
            producer.send("q", b"new", duplicate_id="B", transaction=tx)
            producer.send("q", b"dup", duplicate_id="A", transaction=tx)
    assert adapter.loop.depth("q") == 0
    assert guard.store.ring_contains("q", [id_digest("B")]) == [False]  # nothing added


def test_same_id_twice_in_one_transaction(setup) -> None:
    _, adapter, producer = setup
    with pytest.raises(TransactionRolledBack), producer.transaction() as tx:
        producer.send("q", b"1", duplicate_id="X", transaction=tx)
        producer.send("q", b"2", duplicate_id="X", transaction=tx)
    assert adapter.loop.depth("q") == 0


def test_abort_adds_nothing(setup) -> None:
    guard, adapter, producer = setup
    with pytest.raises(ValueError), producer.transaction() as tx:
        producer.send("q", b"1", duplicate_id="Z", transaction=tx)
        raise ValueError("abort")
    assert guard.store.ring_stats("q") is None or guard.store.ring_ids("q") == []
    assert producer.send("q", b"", duplicate_id="Z").sent


def test_concurrent_commit_of_same_id_fails_the_second(setup) -> None:
    guard, adapter, producer = setup
    other = GuardedProducer(adapter, guard)
    with pytest.raises(TransactionRolledBack, match="another producer"):
        with producer.transaction() as tx:
            producer.send("q", b"mine", duplicate_id="R", transaction=tx)
            assert other.send("q", b"theirs", duplicate_id="R").sent  # not yet visible
    assert [m.body for m in adapter.loop.drain("q")] == [b"theirs"]


def test_bridge_duplicate_checked_first_in_its_own_cache(setup) -> None:
    guard, adapter, producer = setup
    bridge = {BRIDGE_DUPLICATE_ID_HEADER: "b1"}
    assert producer.send("q", b"1", headers=bridge, duplicate_id="A").sent
    # Same bridge id: duplicate, whatever _AMQ_DUPL_ID says.
    assert not producer.send("q", b"2", headers=bridge, duplicate_id="other").sent
    # _AMQ_DUPL_ID was not checked (nor cached) while the bridge header was present.
    assert guard.store.ring_stats("q") is None
    assert guard.store.ring_ids("BRIDGE.q") == [id_digest("b1")]
    assert producer.send("q", b"3", duplicate_id="A").sent


def test_extra_header_names(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, plugins={"duplicate_detection": {"headers": ["x-dedup"]}})
    producer = GuardedProducer(LoopbackAdapter(), guard)
    assert producer.send("q", b"", headers={"x-dedup": "1"}).sent
    assert not producer.send("q", b"", headers={"x-dedup": "1"}).sent
    guard.close()


def test_bad_plugin_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"plugins\.duplicate_detection\.headers"):
        make_guard(tmp_path, plugins={"duplicate_detection": {"headers": "x"}})
    with pytest.raises(ConfigError, match="unknown key"):
        make_guard(tmp_path, plugins={"duplicate_detection": {"header": ["x"]}})


def test_overlong_duplicate_id_is_rejected(setup) -> None:
    from mqguard.errors import MessageRejected

    _, _, producer = setup
    with pytest.raises(MessageRejected, match="limit"):
        producer.send("q", b"", duplicate_id="x" * 5000)


def test_shrinking_id_cache_size_keeps_newest(tmp_path: Path) -> None:
    adapter = LoopbackAdapter()
    big = make_guard(tmp_path, **{"address-settings": {"r": {"id-cache-size": 5}}})
    producer = GuardedProducer(adapter, big)
    for dup in "abcde":
        producer.send("r", b"", duplicate_id=dup)
    store = big.store
    wait_confirmed(store, "r", "e")
    small_cfg = parse_config({"mqguard": {"event-log": {"enabled": False}},
                              "address-settings": {"r": {"id-cache-size": 2}}})
    small = Guard(small_cfg, store=store)
    small_producer = GuardedProducer(adapter, small)
    assert not small_producer.send("r", b"", duplicate_id="e").sent  # newest kept
    assert store.ring_ids("r") == [id_digest("d"), id_digest("e")]
    assert small_producer.send("r", b"", duplicate_id="a").sent  # oldest dropped
    big.close()
    small.close()


def wait_confirmed(store: Store, cache: str, duplicate_id: str) -> None:
    """Until the background flush confirmed the id (within confirm-flush-ms, 20 ms)."""
    deadline = time.monotonic() + 5
    while store.ring_lookup(cache, [id_digest(duplicate_id)], 60_000) != [
            RingOutcome.DUPLICATE]:
        assert time.monotonic() < deadline, "never confirmed"
        time.sleep(0.005)


def test_batch_checks_every_id_in_one_call(setup) -> None:
    guard, adapter, producer = setup
    calls: list[int] = []
    check = guard.store.ring_reserve

    def counting(name, ids, capacity, pending_ms, **kwargs):
        calls.append(len(ids))
        return check(name, ids, capacity, pending_ms, **kwargs)

    guard.store.ring_reserve = counting  # type: ignore[method-assign]
    producer.send("q", b"old", duplicate_id="old")
    batch = [producer.message("q", f"{dup}-{n}".encode(), duplicate_id=dup)
             for n, dup in enumerate(["a", "b", "a", "old", "c"])]
    batch.append(producer.message("q", b"no-id"))
    results = producer.send_batch(batch)
    assert [r.sent for r in results] == [True, True, False, False, True, True]
    assert calls == [1, 5]  # the single send, then the whole batch at once
    assert [m.body for m in adapter.loop.drain("q")] == [
        b"old", b"a-0", b"b-1", b"c-4", b"no-id"]
    assert kinds(guard).count("duplicate_rejected") == 2


def test_batch_message_rejected_by_another_plugin_takes_no_slot(setup) -> None:
    from mqguard import hookimpl
    from mqguard.errors import MessageRejected
    from mqguard.verdict import Verdict

    guard, adapter, producer = setup

    class RefuseBad:
        @hookimpl
        def before_send(self, message):
            return Verdict.reject("bad") if message.body == b"bad" else None

    guard.plugins.register(RefuseBad())
    batch = [producer.message("q", b"ok", duplicate_id="x"),
             producer.message("q", b"bad", duplicate_id="y")]
    with pytest.raises(MessageRejected):
        producer.send_batch(batch)
    # The accepted message before the rejection was sent and cached; the rejected one not.
    assert guard.store.ring_contains("q", [id_digest("x"), id_digest("y")]) == [True, False]
    assert [m.body for m in adapter.loop.drain("q")] == [b"ok"]


# -- two-phase ids: reserved at send, confirmed by the broker's confirmation, released on failure


def outcome(guard: Guard, cache: str, duplicate_id: str, pending_ms: int = 60_000):
    return guard.store.ring_lookup(cache, [id_digest(duplicate_id)], pending_ms)[0]


def test_failed_send_releases_its_id_so_the_retry_is_not_lost(setup) -> None:
    guard, adapter, producer = setup
    adapter.fail_sends = True
    with pytest.raises(AdapterError):
        producer.send("q", b"1", duplicate_id="A")
    with pytest.raises(AdapterError):
        producer.send_batch([producer.message("q", b"2", duplicate_id=x) for x in "BC"])
    assert guard.store.ring_ids("q") == []
    adapter.fail_sends = False
    assert producer.send("q", b"1", duplicate_id="A").sent  # the retry: not a duplicate
    assert [r.sent for r in producer.send_batch(
        [producer.message("q", b"2", duplicate_id=x) for x in "BC"])] == [True, True]
    assert [m.body for m in adapter.loop.drain("q")] == [b"1", b"2", b"2"]


def test_confirmed_after_the_broker_confirmed(setup) -> None:
    guard, _, producer = setup
    assert producer.send("q", b"", duplicate_id="A").sent
    # Confirmed by the background flush, or at the latest when the guard stops.
    guard.close()
    assert outcome(guard, "q", "A") is RingOutcome.DUPLICATE


def test_next_send_carries_the_confirmation(setup) -> None:
    guard, _, producer = setup
    assert producer.send("q", b"", duplicate_id="A").sent
    # Reserved, not yet confirmed (the flush waits confirm-flush-ms) -- unless the next
    # reservation of the same cache carried it, which it does:
    assert not producer.send("q", b"", duplicate_id="A").sent


def test_unconfirmed_id_is_refused_as_in_flight_then_taken_over(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, plugins={"duplicate_detection": {"pending-timeout-ms": 300}})
    adapter = LoopbackAdapter()
    try:
        # Another sender reserved "A" and has not confirmed it (still sending, or killed).
        guard.store.ring_reserve("q", [id_digest("A")], 20000, 300)
        producer = GuardedProducer(adapter, guard)
        with pytest.raises(MessageRejected, match=IN_FLIGHT_CODE):
            producer.send("q", b"1", duplicate_id="A")
        assert "duplicate_in_flight" in kinds(guard)
        assert adapter.loop.depth("q") == 0
        time.sleep(0.4)  # the other sender is presumed dead: its reservation is taken over
        assert producer.send("q", b"1", duplicate_id="A").sent
        assert adapter.loop.depth("q") == 1
    finally:
        guard.close()


def test_transaction_ids_released_when_commit_fails_confirmed_when_it_succeeds(setup) -> None:
    guard, adapter, producer = setup

    def broken_commit(transaction: str) -> None:
        raise AdapterError("loopback: connection lost at COMMIT")

    real_commit, adapter.commit = adapter.commit, broken_commit  # type: ignore[method-assign]
    with pytest.raises(AdapterError), producer.transaction() as tx:
        producer.send("q", b"1", duplicate_id="T", transaction=tx)
    assert guard.store.ring_ids("q") == []  # released: the retry must not be refused
    adapter.commit = real_commit  # type: ignore[method-assign]
    with producer.transaction() as tx:
        producer.send("q", b"1", duplicate_id="T", transaction=tx)
    guard.close()
    assert outcome(guard, "q", "T") is RingOutcome.DUPLICATE


def test_pending_timeout_option_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pending-timeout-ms"):
        make_guard(tmp_path, plugins={"duplicate_detection": {"pending-timeout-ms": 5}})


def test_batch_confirms_the_digests_it_reserved(setup) -> None:
    guard, _, producer = setup
    plugin = guard.plugins.get_plugin("duplicate_detection")
    assert producer.send("q", b"", duplicate_id="dup").sent
    results = producer.send_batch([producer.message("q", b"", duplicate_id=dup)
                                   for dup in ("x", "y", "dup", "z")])
    assert [r.sent for r in results] == [True, True, False, True]
    # Settled sends took their digests from the batch's memo; the duplicate left none.
    assert plugin._reserved_digests == {}
    guard.close()
    for dup in ("x", "y", "z", "dup"):
        assert outcome(guard, "q", dup) is RingOutcome.DUPLICATE


def test_batch_to_several_addresses_confirms_each_in_its_own_cache(setup) -> None:
    guard, _, producer = setup
    results = producer.send_batch([producer.message(address, b"", duplicate_id=dup)
                                   for address, dup in (("q", "a"), ("r", "b"), ("q", "c"))])
    assert all(result.sent for result in results)
    guard.close()  # flushes the confirmations owed by after_send_batch
    assert [outcome(guard, address, dup) for address, dup in
            (("q", "a"), ("r", "b"), ("q", "c"))] == [RingOutcome.DUPLICATE] * 3
    assert outcome(guard, "r", "a") is RingOutcome.NEW  # confirmed per address


def test_confirmations_wake_the_flusher_once_and_again_after_a_flush() -> None:
    from mqguard.plugins.duplicate_detection import _Confirmations

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, list[bytes]]] = []

        def ring_confirm(self, name: str, ids: list[bytes]) -> None:
            self.calls.append((name, list(ids)))

    store = Recorder()
    confirmations = _Confirmations(flush_ms=30)
    wakes = 0
    set_wake = confirmations._wake.set

    def counting_set() -> None:
        nonlocal wakes
        wakes += 1
        set_wake()

    confirmations._wake.set = counting_set  # type: ignore[method-assign]
    try:
        digests = [bytes([i]) * 8 for i in range(50)]
        for digest in digests:
            confirmations.owe(store, "q", digest)  # type: ignore[arg-type]
        assert wakes == 1
        deadline = time.monotonic() + 5
        while not store.calls and time.monotonic() < deadline:
            time.sleep(0.005)
        assert store.calls == [("q", digests)]
        # Owed after that flush: the flusher is woken again, nothing is left behind.
        confirmations.owe(store, "r", b"\x07" * 8)  # type: ignore[arg-type]
        while len(store.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert store.calls[1:] == [("r", [b"\x07" * 8])] and wakes == 2
    finally:
        confirmations.stop()
    assert len(store.calls) == 2


@pytest.mark.parametrize(("second_sender", "expected"), [
    ("connection-1", "duplicate"),   # same ordered stream: follows the original's fate
    ("connection-2", "in flight"),   # another sender: refused, it retries later
])
def test_batch_path_applies_the_same_sender_rule(tmp_path: Path, second_sender: str,
                                                 expected: str) -> None:
    # A sidecar connection decides the SENDs of each read as one batch; a pipelined repeat
    # of an id its earlier batch reserved (not yet confirmed) must count as a duplicate
    # of that stream, exactly as on the one-message path.
    from mqguard.message import Message

    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    try:
        def decide(sender: str, body: bytes) -> list:
            message = Message("q", body, duplicate_id="A", message_id=body.decode())
            decision = guard.decide_sends([message], adapter.capabilities,
                                          broker=adapter.broker, sender=sender)
            return [list(decision.outgoing), decision.rejected]

        kept, rejected = decide("connection-1", b"first")
        assert len(kept) == 1 and rejected is None  # reserved, confirmation outstanding
        kept, rejected = decide(second_sender, b"second")
        assert kept == []
        if expected == "duplicate":
            assert rejected is None and "duplicate_rejected" in kinds(guard)
        else:
            assert rejected is not None and IN_FLIGHT_CODE in rejected.reason
    finally:
        guard.close()
