"""Consumer-side duplicate-delivery audit (ActiveMQ Classic's ActiveMQMessageAudit).

Guarded producers stamp every message with a producer id and a per-producer sequence number
that only grows. A consumer marks a sequence once its handler has succeeded and, before handing
over the next message, asks whether that sequence was marked already: if so the broker is
delivering it again (typically a redelivery after a failover), and the handler must not see it.

Only the newest ``size`` sequence numbers of each producer are remembered, as with ActiveMQ's
``BitArrayBin``: marking a sequence ahead of the window slides the window forward and forgets
what falls out of it, and a sequence older than the window reports *not seen* (``setBit``
returns false below the window). The trade-off is ActiveMQ's: memory stays bounded per producer,
and a duplicate arriving more than ``size`` sequences late passes.

:class:`SequenceWindow` is one producer's window, :class:`ProducerAudit` one destination's
producers and :class:`ConsumerAudit` a consumer's destinations. Both of the latter are LRUs
(ActiveMQ's ``LRUCache``): evicting an entry forgets its windows, so a duplicate from a producer
(or on a destination) idle long enough to be evicted passes too. The shared variant for
consumers taking over from one another lives in the store (``Store.audit_*``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = [
    "DEFAULT_MAX_DESTINATIONS",
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_WINDOW",
    "ConsumerAudit",
    "ProducerAudit",
    "SequenceWindow",
]

#: ActiveMQ's ``ActiveMQMessageAudit`` defaults: audit depth 2048, 64 producers per destination.
DEFAULT_WINDOW = 2048
DEFAULT_MAX_PRODUCERS = 64
#: ActiveMQ's ``ConnectionAudit`` destination LRU.
DEFAULT_MAX_DESTINATIONS = 1000


def _check_seq(seq: int) -> None:
    if seq < 0:
        raise ValueError(f"sequence numbers must be >= 0, got {seq}")


# The hot methods (seen and mark at each level, once or twice per delivery) test
# ``seq < 0`` and look their entries up inline: the helper calls cost more than the work.


class SequenceWindow:
    """The marked sequences among the newest ``size`` of one producer. Not thread-safe.

    The window is ``[low, high]``: ``high`` is the highest sequence ever marked (-1 before the
    first mark) and ``low`` the oldest still remembered. Marks live in an int used as a ring
    bitset, bit ``seq % size``: a slide clears only the slots it passes over, and a jump of
    ``size`` or more just drops the whole bitset, so no operation loops over a gap.
    """

    __slots__ = ("_bits", "_high", "_size")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self._size = size
        self._high = -1
        self._bits = 0

    @property
    def size(self) -> int:
        """How many sequence numbers the window spans."""
        return self._size

    @property
    def high(self) -> int:
        """The highest sequence marked so far, -1 when none was."""
        return self._high

    @property
    def low(self) -> int:
        """The oldest sequence still remembered (0 while the window has not filled)."""
        return max(0, self._high - self._size + 1)

    def _in_window(self, seq: int) -> bool:
        return self._high - self._size < seq <= self._high

    def seen(self, seq: int) -> bool:
        """Whether ``seq`` is marked; False above the window and below it (forgotten)."""
        if seq < 0:
            _check_seq(seq)
        high, size = self._high, self._size
        return high - size < seq <= high and bool(self._bits >> (seq % size) & 1)

    def mark(self, seq: int) -> None:
        """Mark ``seq``, sliding the window forward when it is above ``high``. A sequence
        below the window is ignored: it could not be reported as seen anyway."""
        if seq < 0:
            _check_seq(seq)
        size = self._size
        if seq > self._high:
            gap = seq - self._high
            if gap >= size:
                # Everything remembered falls out of the window.
                self._bits = 0
            elif gap > 1:
                # Free the slots of high+1 .. seq-1, which still hold marks from one lap ago.
                # seq's own slot is set below either way.
                self._bits &= ~_ring_mask((self._high + 1) % size, gap - 1, size)
            self._high = seq
        elif seq <= self._high - size:
            return
        self._bits |= 1 << (seq % size)

    def check_and_mark(self, seq: int) -> bool:
        """Mark ``seq``; returns whether it was marked before."""
        was = self.seen(seq)
        self.mark(seq)
        return was

    def forget(self, seq: int) -> None:
        """Un-mark ``seq`` (a rolled-back delivery); the window does not move."""
        _check_seq(seq)
        if self._in_window(seq):
            self._bits &= ~(1 << (seq % self._size))

    def __repr__(self) -> str:
        return f"SequenceWindow(size={self._size}, low={self.low}, high={self._high})"


def _ring_mask(start: int, count: int, size: int) -> int:
    """Bits ``start .. start+count-1`` of a ring of ``size`` bits, wrapping past the end."""
    end = start + count
    if end <= size:
        return ((1 << count) - 1) << start
    return ((1 << (size - start)) - 1) << start | ((1 << (end - size)) - 1)


class ProducerAudit:
    """One destination's producers: an LRU of ``max_producers`` windows. Not thread-safe.

    A producer is "used" when it is looked up (``seen``, ``mark``, ``forget``); marking a new
    producer beyond ``max_producers`` evicts the least recently used one and its window.
    """

    __slots__ = ("_max_producers", "_window", "_windows")

    def __init__(self, max_producers: int = DEFAULT_MAX_PRODUCERS,
                 window: int = DEFAULT_WINDOW) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be >= 1, got {max_producers}")
        if window < 1:
            raise ValueError(f"window size must be >= 1, got {window}")
        self._max_producers = max_producers
        self._window = window
        self._windows: OrderedDict[str, SequenceWindow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def _get(self, producer_id: str) -> SequenceWindow | None:
        window = self._windows.get(producer_id)
        if window is not None:
            self._windows.move_to_end(producer_id)
        return window

    def seen(self, producer_id: str, seq: int) -> bool:
        """Whether ``seq`` of ``producer_id`` is marked (False for an unknown producer)."""
        windows = self._windows
        window = windows.get(producer_id)
        if window is None:
            _check_seq(seq)
            return False
        windows.move_to_end(producer_id)
        return window.seen(seq)

    def mark(self, producer_id: str, seq: int) -> None:
        """Mark ``seq`` of ``producer_id``, tracking the producer if it is new."""
        if seq < 0:
            _check_seq(seq)
        windows = self._windows
        window = windows.get(producer_id)
        if window is None:
            window = windows[producer_id] = SequenceWindow(self._window)
            if len(windows) > self._max_producers:
                windows.popitem(last=False)
        else:
            windows.move_to_end(producer_id)
        window.mark(seq)

    def forget(self, producer_id: str, seq: int) -> None:
        """Un-mark ``seq`` of ``producer_id``; nothing happens for an unknown producer."""
        window = self._get(producer_id)
        if window is None:
            _check_seq(seq)
            return
        window.forget(seq)


class ConsumerAudit:
    """A consumer's audit: an LRU of ``max_destinations`` :class:`ProducerAudit`.

    Thread-safe behind one lock: every call is a few dict operations and int bit operations,
    far cheaper than the delivery it guards, so finer locking would buy nothing. A destination
    is "used" by any call on it; marking on a new destination beyond ``max_destinations``
    evicts the least recently used destination with all its producers' windows.
    """

    def __init__(self, max_destinations: int = DEFAULT_MAX_DESTINATIONS,
                 max_producers: int = DEFAULT_MAX_PRODUCERS,
                 window: int = DEFAULT_WINDOW) -> None:
        if max_destinations < 1:
            raise ValueError(f"max_destinations must be >= 1, got {max_destinations}")
        # Fail now rather than at the first mark.
        ProducerAudit(max_producers, window)
        self._max_destinations = max_destinations
        self._max_producers = max_producers
        self._window = window
        self._lock = threading.Lock()
        self._destinations: OrderedDict[str, ProducerAudit] = OrderedDict()

    def _get(self, destination: str) -> ProducerAudit | None:
        producers = self._destinations.get(destination)
        if producers is not None:
            self._destinations.move_to_end(destination)
        return producers

    def seen(self, destination: str, producer_id: str, seq: int) -> bool:
        """Whether ``seq`` of ``producer_id`` was marked on ``destination``: when True the
        delivery is a duplicate and must not reach the handler."""
        if seq < 0:
            _check_seq(seq)
        with self._lock:
            destinations = self._destinations
            producers = destinations.get(destination)
            if producers is None:
                return False
            destinations.move_to_end(destination)
            return producers.seen(producer_id, seq)

    def mark(self, destination: str, producer_id: str, seq: int) -> None:
        """Record that the handler succeeded for ``seq`` of ``producer_id`` on ``destination``."""
        if seq < 0:
            _check_seq(seq)
        with self._lock:
            destinations = self._destinations
            producers = destinations.get(destination)
            if producers is None:
                producers = ProducerAudit(self._max_producers, self._window)
                destinations[destination] = producers
                if len(destinations) > self._max_destinations:
                    destinations.popitem(last=False)
            else:
                destinations.move_to_end(destination)
            producers.mark(producer_id, seq)

    def forget(self, destination: str, producer_id: str, seq: int) -> None:
        """Un-mark one sequence (ActiveMQ's ``rollback``), so its redelivery is handled again."""
        _check_seq(seq)
        with self._lock:
            producers = self._get(destination)
            if producers is not None:
                producers.forget(producer_id, seq)
