"""SequenceWindow, ProducerAudit and ConsumerAudit (ActiveMQ message audit semantics)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.sequence_window import ConsumerAudit, ProducerAudit, SequenceWindow

# -- SequenceWindow ---------------------------------------------------------------------------


def test_empty_window() -> None:
    window = SequenceWindow()
    assert window.size == 2048
    assert (window.low, window.high) == (0, -1)
    assert not window.seen(0)
    assert not window.seen(10**12)


def test_in_order_marking_and_duplicates() -> None:
    window = SequenceWindow(16)
    for seq in range(10):
        assert window.check_and_mark(seq) is False
    assert all(window.seen(seq) for seq in range(10))
    assert not window.seen(10)
    assert (window.low, window.high) == (0, 9)
    # Every redelivery of a handled sequence is a duplicate, again and again.
    for seq in range(10):
        assert window.check_and_mark(seq) is True
        assert window.check_and_mark(seq) is True


def test_out_of_order_within_window() -> None:
    window = SequenceWindow(8)
    window.mark(5)
    assert [window.seen(s) for s in range(8)] == [False] * 5 + [True, False, False]
    window.mark(2)
    window.mark(4)
    assert [window.seen(s) for s in range(8)] == [False, False, True, False, True, True,
                                                  False, False]
    assert window.high == 5


def test_sliding_forgets_old_marks() -> None:
    window = SequenceWindow(4)
    for seq in range(4):
        window.mark(seq)
    assert (window.low, window.high) == (0, 3)
    window.mark(5)  # the window is now 2..5; 0 and 1 fell out, 4 was never marked
    assert (window.low, window.high) == (2, 5)
    assert [window.seen(s) for s in range(7)] == [False, False, True, True, False, True, False]


def test_older_than_window_is_not_seen_and_not_marked() -> None:
    window = SequenceWindow(4)
    window.mark(100)
    assert not window.seen(96)  # just below the window: reported not seen (BitArrayBin)
    window.mark(96)  # ignored: it could never be reported as seen
    assert not window.seen(96)
    assert window.check_and_mark(96) is False
    window.mark(97)  # the oldest slot of the window
    assert window.seen(97)
    assert window.high == 100


def test_slide_clears_slots_reused_by_the_new_lap() -> None:
    window = SequenceWindow(8)
    for seq in range(8):
        window.mark(seq)
    window.mark(13)  # slots of 8..12 must not inherit the marks of 0..4
    assert [window.seen(s) for s in range(8, 14)] == [False] * 5 + [True]
    assert [window.seen(s) for s in range(6, 8)] == [True, True]
    window.mark(17)  # wraps: clears the slots of 14, 15, 16
    assert [window.seen(s) for s in range(10, 18)] == [False] * 3 + [True] + [False] * 3 + [True]


def test_huge_jumps() -> None:
    window = SequenceWindow()
    for seq in range(100):
        window.mark(seq)
    window.mark(2**62)
    assert window.seen(2**62)
    assert not window.seen(99)
    assert not window.seen(2**62 - 1)
    assert (window.low, window.high) == (2**62 - 2047, 2**62)
    window.mark(2**62 - 2047)
    assert window.seen(2**62 - 2047)
    window.mark(2**100)
    assert window.seen(2**100)
    assert not window.seen(2**62)


def test_size_one() -> None:
    window = SequenceWindow(1)
    assert window.check_and_mark(3) is False
    assert window.check_and_mark(3) is True
    assert window.check_and_mark(2) is False  # below the window
    assert not window.seen(2)
    assert window.check_and_mark(4) is False
    assert not window.seen(3)
    assert (window.low, window.high) == (4, 4)


def test_forget() -> None:
    window = SequenceWindow(8)
    for seq in range(5):
        window.mark(seq)
    window.forget(2)
    assert [window.seen(s) for s in range(5)] == [True, True, False, True, True]
    window.forget(4)  # forgetting the highest keeps the window where it is
    assert window.high == 4
    window.forget(50)  # above the window: nothing to forget
    window.forget(0)
    assert [window.seen(s) for s in range(5)] == [False, True, False, True, False]
    window.mark(2)
    assert window.seen(2)


@pytest.mark.parametrize("size", [0, -1])
def test_size_below_one_is_rejected(size: int) -> None:
    with pytest.raises(ValueError, match="size"):
        SequenceWindow(size)


def test_negative_sequence_is_rejected() -> None:
    window = SequenceWindow()
    for method in (window.seen, window.mark, window.check_and_mark, window.forget):
        with pytest.raises(ValueError, match=">= 0"):
            method(-1)


class WindowModel:
    """The window semantics stated plainly: marked seqs plus the highest ever marked."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.marked: set[int] = set()
        self.high = -1

    def seen(self, seq: int) -> bool:
        return seq in self.marked and seq > self.high - self.size

    def mark(self, seq: int) -> None:
        self.marked.add(seq)
        self.high = max(self.high, seq)

    def forget(self, seq: int) -> None:
        self.marked.discard(seq)


# Sequences mostly relative to the highest marked one (steps of less than a window, in both
# directions, wrapping around the ring), sometimes absolute (jumps of any size).
_STEPS = st.one_of(st.tuples(st.just("rel"), st.integers(-25, 25)),
                   st.tuples(st.just("abs"), st.one_of(st.integers(0, 10**6), st.just(2**64))))
_WINDOW_OPS = st.lists(st.tuples(st.sampled_from(["mark", "seen", "check", "forget"]), _STEPS),
                       max_size=60)


@settings(max_examples=300, deadline=None)
@given(size=st.one_of(st.integers(1, 20), st.sampled_from([64, 65, 2048])), ops=_WINDOW_OPS)
def test_window_matches_model(size: int, ops: list[tuple[str, tuple[str, int]]]) -> None:
    window, model = SequenceWindow(size), WindowModel(size)
    for kind, (base, value) in ops:
        seq = max(0, model.high + value) if base == "rel" else value
        if kind == "mark":
            window.mark(seq)
            model.mark(seq)
        elif kind == "check":
            assert window.check_and_mark(seq) == model.seen(seq), (kind, seq)
            model.mark(seq)
        elif kind == "forget":
            window.forget(seq)
            model.forget(seq)
        else:
            assert window.seen(seq) == model.seen(seq), (kind, seq)
        assert window.high == model.high
        assert window.low == max(0, model.high - size + 1)
        # Every slot of the window, and one past each end: a slot left over from an earlier
        # lap shows up here even when no operation asks about it.
        probes = range(max(0, model.high - min(size, 70)), model.high + 2)
        assert [window.seen(s) for s in probes] == [model.seen(s) for s in probes], (kind, seq)


# -- ProducerAudit ----------------------------------------------------------------------------


def test_producers_are_independent() -> None:
    audit = ProducerAudit()
    audit.mark("p1", 7)
    assert audit.seen("p1", 7)
    assert not audit.seen("p2", 7)
    audit.forget("p1", 7)
    assert not audit.seen("p1", 7)
    audit.forget("unknown", 1)
    assert len(audit) == 1  # looking up unknown producers tracks nothing


def test_producer_lru_eviction() -> None:
    audit = ProducerAudit(max_producers=2, window=8)
    audit.mark("a", 1)
    audit.mark("b", 1)
    assert audit.seen("a", 1)  # a is now the most recently used
    audit.mark("c", 1)  # evicts b
    assert len(audit) == 2
    assert audit.seen("a", 1)
    assert audit.seen("c", 1)
    assert not audit.seen("b", 1)  # its window is forgotten: a duplicate from b would pass
    audit.mark("b", 2)  # b comes back with a fresh window, evicting a
    assert not audit.seen("a", 1)
    assert audit.seen("b", 2)


def test_producer_audit_window_size() -> None:
    audit = ProducerAudit(window=4)
    audit.mark("p", 0)
    audit.mark("p", 4)
    assert not audit.seen("p", 0)
    with pytest.raises(ValueError, match="max_producers"):
        ProducerAudit(max_producers=0)
    with pytest.raises(ValueError, match="size"):
        ProducerAudit(window=0)
    with pytest.raises(ValueError, match=">= 0"):
        audit.seen("unknown", -1)


# -- ConsumerAudit ----------------------------------------------------------------------------


def test_consumer_audit_scopes() -> None:
    audit = ConsumerAudit()
    audit.mark("orders", "p1", 1)
    assert audit.seen("orders", "p1", 1)
    assert not audit.seen("orders", "p2", 1)
    assert not audit.seen("invoices", "p1", 1)
    assert not audit.seen("orders", "p1", 2)


def test_consumer_audit_forget() -> None:
    audit = ConsumerAudit()
    audit.mark("q", "p", 1)
    audit.mark("q", "p", 2)
    audit.forget("q", "p", 1)
    assert not audit.seen("q", "p", 1)
    assert audit.seen("q", "p", 2)
    audit.forget("other", "p", 2)  # unknown destination: nothing to do
    audit.forget("q", "other", 2)
    assert audit.seen("q", "p", 2)


def test_destination_lru_eviction() -> None:
    audit = ConsumerAudit(max_destinations=2, max_producers=1, window=16)
    audit.mark("d1", "p", 1)
    audit.mark("d2", "p", 1)
    assert audit.seen("d1", "p", 1)  # d1 is now the most recently used
    audit.mark("d3", "p", 1)  # evicts d2
    assert audit.seen("d1", "p", 1)
    assert audit.seen("d3", "p", 1)
    assert not audit.seen("d2", "p", 1)
    # max_producers and window reach each destination's ProducerAudit.
    audit.mark("d1", "q", 1)  # evicts producer p of d1
    assert not audit.seen("d1", "p", 1)
    audit.mark("d1", "q", 17)
    assert not audit.seen("d1", "q", 1)


def test_default_limits_match_activemq() -> None:
    audit = ConsumerAudit()
    for i in range(1001):
        audit.mark(f"d{i}", "p", 0)
    assert not audit.seen("d0", "p", 0)
    assert audit.seen("d1", "p", 0)
    for i in range(64):
        audit.mark("d1", f"p{i}", 0)
    assert not audit.seen("d1", "p", 0)  # the 65th producer evicted p, the least recently used
    assert audit.seen("d1", "p0", 0)
    audit.mark("d1", "p0", 1)
    audit.mark("d1", "p0", 2048)  # a window of 2048: 1..2048
    assert audit.seen("d1", "p0", 1)
    assert not audit.seen("d1", "p0", 0)


def test_consumer_audit_rejects_bad_arguments() -> None:
    for kwargs in ({"max_destinations": 0}, {"max_producers": 0}, {"window": 0}):
        with pytest.raises(ValueError, match=">= 1"):
            ConsumerAudit(**kwargs)
    audit = ConsumerAudit()
    for method in (audit.seen, audit.mark, audit.forget):
        with pytest.raises(ValueError, match=">= 0"):
            method("d", "p", -5)


def test_consumer_audit_threads() -> None:
    audit = ConsumerAudit(max_destinations=4, max_producers=4, window=4096)
    start = threading.Barrier(4)

    def worker(n: int) -> None:
        start.wait()
        for seq in range(2000):
            audit.mark(f"d{seq % 3}", f"p{n}", seq)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for n in range(4):
        for seq in range(2000):
            assert audit.seen(f"d{seq % 3}", f"p{n}", seq)
