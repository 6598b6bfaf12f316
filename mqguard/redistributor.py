"""Message redistribution across a broker group (Artemis ``BindingsImpl.redistribute``).

Artemis moves the messages of a queue that has lost its last consumer to the
same-named queues of other cluster nodes that have consumers, once
``redistribution-delay`` (an address setting, default -1: never; 0: at once) has
passed. The :class:`Redistributor` does the same for a group of independent
brokers (``[mqguard.groups.<name>]``, docs/load-balancing.md):

* only under ``ON_DEMAND`` and ``OFF_WITH_REDISTRIBUTION`` (Artemis refuses to
  redistribute under ``OFF`` and ``STRICT``);
* a node's queue qualifies once it has had no live consumer (store presence, see
  :mod:`mqguard.balancing`) for ``redistribution-delay`` ms, counted from when this
  redistributor first saw it without one;
* each message goes round robin to a node with a live consumer whose selector
  accepts it, never back to its own queue; where the broker has selectors, the
  source subscription carries the targets' selectors ORed, so messages no target
  accepts are not even taken;
* each copy keeps the message's mqguard id, producer and sequence (it is the same
  message, as the audit sees it), and carries a bridge duplicate id
  ``_AMQ_BRIDGE_DUP = <message id>:<hop>``, recorded in the ``BRIDGE.<queue>``
  duplicate-ID cache that ``plugins/duplicate_detection.py`` checks, sized by the
  address settings matching ``BRIDGE.<queue>`` (:func:`bridge_cache_size`).

Crash safety, per batch: (1) the bridge ids already confirmed in the cache are
copies confirmed by an earlier attempt: their originals are only acknowledged (a
mere reservation, which a guard in front of the target may hold, proves nothing);
(2) the other copies are sent and confirmed by the target broker; (3) their bridge
ids are added to the cache, confirmed; (4) the originals are acknowledged. A crash before (2)
completes leaves the originals unacknowledged (the source broker redelivers
them: nothing lost); after (3), step (1) of the next attempt finds the ids.

A crash between the target's confirmation and (3) is closed with markers where
every other node has transactions and browse (ActiveMQ): the bridge ids are
first added to a ``BRIDGE-PENDING.<queue>`` ring, and each target gets its
copies *and* one marker (a message on ``mqguard.bridge.<queue>`` whose body lists
the copies' bridge ids) in one broker transaction. The next attempt browses the
markers of the pending ids it meets: a marker proves the copy committed (then
only (3) and (4) remain), no marker proves it did not (the copy is sent again).
Markers are consumed once all their ids are in the cache. A browse sees as many
markers as the broker's browse page allows (ActiveMQ ``maxBrowsePageSize``, 400
by default): beyond it a copy would be sent again, never lost. On other brokers
(RabbitMQ: no browse) that one store round trip remains a window for a second
copy at rest, which the shared consumer audit (same producer and sequence) keeps
from a handler.

The copies do not go through the guard's ``before_send``: its check-and-add
records an id *before* the broker confirms, which would turn a crash in between
into a loss on the next attempt. A copy re-sent through a guard later is refused
by ``duplicate_detection`` against the same ``BRIDGE.<queue>`` cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.balancing import (
    REDISTRIBUTING_MODES,
    Presence,
    group_config,
    live_consumers,
    node_name,
)
from mqguard.balancing_selector import SelectorError, compile_selector
from mqguard.digest import id_digest
from mqguard.errors import AdapterError
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER, Message, parse_wire_int
from mqguard.pipeline import Guard
from mqguard.reaper import _Collector
from mqguard.registry import open_adapter
from mqguard.stores.base import RingOutcome

log = logging.getLogger("mqguard.redistributor")

#: Event type of one message moved to another node (schema v1 addition, docs/events.md).
REDISTRIBUTED_EVENT = "redistributed"
#: How many times a message was redistributed (part of its bridge duplicate id).
HOPS_HEADER = "mqguard-hops"
#: The node a redistributed copy came from.
FROM_NODE_HEADER = "mqguard-redistributed-from"
#: Most messages moved per batch (one pipelined send per target, one store call).
MAX_BATCH = 1000
#: Ring capacity of ``BRIDGE.<queue>`` when the settings matching ``BRIDGE.<queue>`` give it
#: id-cache-size 0 (bridge duplicate detection off): redistribution relies on the cache for
#: crash safety, so it keeps one, of Artemis's default size (DEFAULT_ID_CACHE_SIZE). With 0
#: ``duplicate_detection`` never touches that ring, so the two never resize it both ways.
FALLBACK_CACHE_SIZE = 20000
#: ``pending_ms`` of the redistributor's lookups: any value does, it only tells a fresh
#: reservation (IN_FLIGHT) from a stale one (NEW), and both mean "not known to be done".
_LOOKUP_PENDING_MS = 1


#: Header of a marker message: how many bridge ids its body lists (one per line).
MARKER_HEADER = "mqguard_bridge_ids"
#: Most markers read in one browse of a marker queue (they are consumed after each move,
#: so only those of interrupted moves stay); more makes the browse fail rather than guess.
MAX_MARKERS = 100_000


def marker_queue(queue: str) -> str:
    """Where markers of copies moved to ``queue`` live on the target node."""
    return f"mqguard.bridge.{queue}"


def pending_cache_name(queue: str) -> str:
    """Ring of bridge ids whose copies may have been committed but not yet recorded."""
    return f"BRIDGE-PENDING.{queue}"


def _marker(queue: str, bridge_ids: Sequence[str]) -> Message:
    """One marker for the copies of one batch to one node: their bridge ids, one a line."""
    return Message(address=marker_queue(queue), body="\n".join(bridge_ids).encode(),
                   headers={MARKER_HEADER: str(len(bridge_ids))})


def _marker_ids(message: Message) -> list[str]:
    try:
        return [line for line in message.body.decode().split("\n") if line]
    except UnicodeDecodeError:
        return []


def bridge_cache(queue: str) -> str:
    """The duplicate-ID cache of bridged copies: ``plugins/duplicate_detection``'s name."""
    return f"BRIDGE.{queue}"


def bridge_cache_size(guard: Guard, queue: str) -> int:
    """Capacity of ``BRIDGE.<queue>``: the id-cache-size of the address settings matching
    ``BRIDGE.<queue>`` (Artemis sizes that cache as an address of its own, as
    ``duplicate_detection`` does), else :data:`FALLBACK_CACHE_SIZE` when that is 0. Every
    writer of the ring must use the same capacity: another one resizes it."""
    return guard.settings.resolve(bridge_cache(queue)).id_cache_size or FALLBACK_CACHE_SIZE


@dataclass(slots=True)
class QueueResult:
    """What one scan did for one queue on one node."""

    queue: str
    node: str
    #: ``moved``, ``has-consumers``, ``waiting`` (delay not over), ``no-targets``, ``never``
    #: (redistribution-delay -1), ``off`` (mode does not redistribute).
    state: str
    moved: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"queue": self.queue, "node": self.node, "state": self.state,
                "moved": self.moved, "targets": dict(self.targets), "note": self.note}


class Redistributor:
    """Redistributes the queues of one group; see the module documentation."""

    def __init__(self, guard: Guard, group: str, *, queues: Sequence[str] = (),
                 batch_size: int = 100, idle_ms: int = 300, pause_ms: int = 0,
                 first_wait_ms: int = 1000,
                 adapters: Mapping[str, Adapter] | None = None,
                 on_move: Callable[[str, str, str, str, int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}, got {batch_size}")
        if idle_ms < 1 or pause_ms < 0:
            raise ValueError("idle_ms must be >= 1 and pause_ms >= 0")
        self.guard = guard
        self.group_name = group
        self.group = group_config(guard.config, group)
        self.mode = self.group.message_load_balancing
        self.queues = list(dict.fromkeys([*self.group.queues, *queues]))
        self.batch_size = batch_size
        self.idle_s = idle_ms / 1000
        self.pause_s = pause_ms / 1000
        #: How long a move waits for its first message (a deep queue takes the broker time).
        self.first_wait_s = max(0, first_wait_ms) / 1000
        self.urls = {node_name(url): url for url in self.group.nodes}
        self._adapters: dict[str, Adapter] = dict(adapters or {})
        self._owned: set[str] = set()
        self._on_move = on_move
        self._clock = clock
        #: (queue, node) -> when this redistributor first saw that queue without consumers.
        self._idle_since: dict[tuple[str, str], float] = {}
        #: Round-robin position per queue over the node list (Artemis's binding index).
        self._position: dict[str, int] = {}
        self._scan_lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------------------

    def adapter(self, node: str) -> Adapter:
        adapter = self._adapters.get(node)
        if adapter is None:
            adapter = self._adapters[node] = open_adapter(self.urls[node])
            self._owned.add(node)
        adapter.connect()
        return adapter

    def close(self) -> None:
        """Close the connections this redistributor opened."""
        for node in list(self._owned):
            adapter = self._adapters.pop(node)
            try:
                adapter.close()
            except Exception as exc:
                log.warning("closing the connection to %s failed: %s", node, exc)
        self._owned.clear()

    def watch(self, queue: str) -> None:
        """Redistribute ``queue`` too from the next scan on."""
        if queue not in self.queues:
            self.queues.append(queue)

    # -- scanning -----------------------------------------------------------------------

    def scan(self) -> list[QueueResult]:
        """One pass over every queue and node."""
        if not self._scan_lock.acquire(blocking=False):
            log.info("redistribution scan still running: this tick is skipped")
            return []
        try:
            results: list[QueueResult] = []
            for queue in list(self.queues):
                results.extend(self._scan_queue(queue))
            return results
        finally:
            self._scan_lock.release()

    def _scan_queue(self, queue: str) -> list[QueueResult]:
        nodes = list(self.urls)
        if self.mode not in REDISTRIBUTING_MODES:
            note = f"message-load-balancing {self.mode} does not redistribute (Artemis)"
            return [QueueResult(queue, node, "off", note=note) for node in nodes]
        delay = self.guard.settings.resolve(queue).redistribution_delay
        if delay < 0:
            return [QueueResult(queue, node, "never", note="redistribution-delay is -1")
                    for node in nodes]
        consumers = live_consumers(self.guard.store, self.group_name, queue)
        with_consumers = {p.node for p in consumers}
        results: list[QueueResult] = []
        now = self._clock()
        for node in nodes:
            key = (queue, node)
            if node in with_consumers:
                self._idle_since.pop(key, None)
                results.append(QueueResult(queue, node, "has-consumers"))
                continue
            since = self._idle_since.setdefault(key, now)
            if (now - since) * 1000 < delay:
                results.append(QueueResult(queue, node, "waiting"))
                continue
            targets = [p for p in consumers if p.node != node and p.node in self.urls]
            if not targets:
                results.append(QueueResult(queue, node, "no-targets"))
                continue
            results.append(self._move_queue(queue, node, targets))
        return results

    def run(self, stop: threading.Event, period_ms: int | None = None) -> None:
        """Scan every ``period_ms`` (default: the group's redistribution-scan-period-ms)."""
        period = (self.group.redistribution_scan_period_ms if period_ms is None
                  else period_ms) / 1000
        while not stop.is_set():
            try:
                self.scan()
            except Exception:
                log.exception("redistribution scan failed; retrying at the next tick")
            stop.wait(period)

    # -- moving -------------------------------------------------------------------------

    def _source_selector(self, adapter: Adapter, targets: list[Presence]) -> str | None:
        """The targets' selectors ORed (None when one takes everything or the broker has
        no selectors), so the source broker hands over only what some target accepts."""
        if not adapter.capabilities.selectors:
            return None
        selectors: list[str] = []
        for presence in targets:
            if not presence.selector:
                return None
            try:
                compile_selector(presence.selector)
            except SelectorError:
                return None
            selectors.append(presence.selector)
        unique = list(dict.fromkeys(selectors))
        return unique[0] if len(unique) == 1 else " OR ".join(f"({s})" for s in unique)

    def _move_queue(self, queue: str, source: str, targets: list[Presence]) -> QueueResult:
        adapter = self.adapter(source)
        result = QueueResult(queue, source, "moved")
        collector = _Collector()
        options = SubscribeOptions(prefetch=self.batch_size,
                                   selector=self._source_selector(adapter, targets))
        subscription = adapter.subscribe(queue, collector, options)
        used: set[str] = set()
        try:
            first_s = self.first_wait_s
            while batch := collector.take(self.batch_size, self.idle_s, first_s):
                first_s = 0.0
                used |= self._move_batch(queue, source, targets, batch, adapter, result)
                if self.pause_s:
                    time.sleep(self.pause_s)
                # Consumers come and go meanwhile: Artemis stops redistributing when the
                # queue gets a consumer again, and only targets nodes that still have one.
                consumers = live_consumers(self.guard.store, self.group_name, queue)
                targets = [p for p in consumers if p.node != source and p.node in self.urls]
                if not targets or any(p.node == source for p in consumers):
                    result.note = ("stopped: the queue has a consumer again" if targets
                                   else "stopped: no node with a consumer is left")
                    break
        finally:
            # Deliveries not acknowledged (no target accepted them, or a send failed) go
            # back to the source queue when the subscription ends.
            adapter.unsubscribe(subscription)
        for node in sorted(used):
            self._clean_markers(queue, node)
        if result.moved:
            log.info("redistributed %d message(s) of %s from %s: %s", result.moved, queue,
                     source, result.targets)
        return result

    def _pick(self, queue: str, headers: Mapping[str, str], targets: list[Presence]
              ) -> str | None:
        accepting = {p.node for p in targets if p.accepts(headers)}
        nodes = list(self.urls)
        position = self._position.get(queue, 0) % len(nodes)
        for _ in range(len(nodes)):
            node = nodes[position]
            position = (position + 1) % len(nodes)
            if node in accepting:
                self._position[queue] = position
                return node
        return None

    def _transactional(self, nodes: Sequence[str]) -> bool:
        """Can every node hold markers: transactions and browse (ActiveMQ)?"""
        for node in nodes:
            caps = self.adapter(node).capabilities
            if not (caps.transactions and caps.browse
                    and hasattr(self.adapter(node), "wait_browse_end")):
                return False
        return True

    def _move_batch(self, queue: str, source: str, targets: list[Presence],
                    batch: list[Delivery], adapter: Adapter, result: QueueResult) -> set[str]:
        """Move one batch; returns the target nodes that got copies (and markers)."""
        store = self.guard.store
        capacity = bridge_cache_size(self.guard, queue)
        cache, pending_cache = bridge_cache(queue), pending_cache_name(queue)
        bridge_ids = [self._bridge_id(source, delivery.message) for delivery in batch]
        others = [node for node in self.urls if node != source]
        markers = self._transactional(others)
        # (1) Copies an earlier attempt got confirmed: only the ack is missing. Digests, as
        # duplicate_detection keeps them, so both read the same cache. Only a *confirmed* id
        # proves a copy: a mere reservation (a guard's, e.g. a sidecar in front of the target
        # that reserved the id of a copy whose transaction then rolled back) proves nothing,
        # and acknowledging the original on its strength would lose the message.
        outcomes = store.ring_lookup(cache, [id_digest(b) for b in bridge_ids],
                                     _LOOKUP_PENDING_MS)
        done = [outcome is RingOutcome.DUPLICATE for outcome in outcomes]
        finished: list[tuple[Delivery, str, str | None]] = []
        rest: list[tuple[Delivery, str]] = []
        for delivery, bridge_id, already in zip(batch, bridge_ids, done, strict=True):
            if already:
                finished.append((delivery, bridge_id, None))
            else:
                rest.append((delivery, bridge_id))
        if markers and rest:
            # An attempt that died between its COMMIT and (3) left markers: those copies
            # are at their target, so only (3) and (4) remain for them.
            pending = store.ring_contains(pending_cache, [id_digest(b) for _, b in rest])
            uncertain = [b for (_, b), flag in zip(rest, pending, strict=True) if flag]
            found = self._find_markers(queue, others, uncertain) if uncertain else {}
            if found:
                digests = [id_digest(b) for b in found]
                store.ring_check_and_add(cache, digests, capacity)
                store.ring_confirm(cache, digests)
                finished += [(d, b, found[b]) for d, b in rest if b in found]
                rest = [(d, b) for d, b in rest if b not in found]
        planned: dict[str, list[tuple[Delivery, Message, str]]] = {}
        for delivery, bridge_id in rest:
            message = delivery.message
            target = self._pick(queue, message.wire_headers(), targets)
            if target is None:
                continue  # no consumer takes it: it stays on the source
            planned.setdefault(target, []).append(
                (delivery, self._copy(message, queue, source, bridge_id), bridge_id))
        # (2) Copies sent and confirmed, per target node.
        sent: list[tuple[Delivery, str, str | None]] = []
        if markers and planned:
            store.ring_check_and_add(
                pending_cache, [id_digest(b) for items in planned.values() for _, _, b in items],
                capacity)
        for target, items in planned.items():
            target_adapter = self.adapter(target)
            copies = [copy for _, copy, _ in items]
            if markers:
                # Copies and markers commit together: after a crash, a marker proves its
                # copy is at the target, and no marker proves it is not.
                tx = target_adapter.begin()
                try:
                    target_adapter.send_many(copies, transaction=tx)
                    target_adapter.send(_marker(queue, [b for _, _, b in items]),
                                        transaction=tx)
                except BaseException:
                    with contextlib.suppress(Exception):
                        target_adapter.abort(tx)
                    raise
                target_adapter.commit(tx)
            else:
                target_adapter.send_many(copies)
            sent.extend((delivery, bridge_id, target) for delivery, _, bridge_id in items)
        # (3) Recorded as done, (4) originals acknowledged. The target confirmed the copies:
        # a reservation of their ids (a guard in front of the target) is confirmed too.
        if sent:
            digests = [id_digest(b) for _, b, _ in sent]
            store.ring_check_and_add(cache, digests, capacity)
            store.ring_confirm(cache, digests)
        events = self.guard.events
        fresh_ids = {id(d) for d, _, _ in sent}
        for delivery, bridge_id, target in [*finished, *sent]:
            adapter.ack(delivery)
            fresh = id(delivery) in fresh_ids
            if fresh:
                reason = "no consumer on the source queue for redistribution-delay"
            elif target is None:
                reason = "copy confirmed by an earlier attempt"
            else:
                reason = "copy committed by an earlier attempt (found by its marker)"
            events.emit(REDISTRIBUTED_EVENT, delivery.message, queue=queue,
                        group=self.group_name, source_node=source, target_node=target,
                        bridge_id=bridge_id, reason=reason)
            if fresh and target is not None:
                result.moved += 1
                result.targets[target] = result.targets.get(target, 0) + 1
                if self._on_move is not None:
                    self._on_move(self.group_name, queue, source, target, 1)
        return set(planned) if markers else set()

    def _find_markers(self, queue: str, nodes: Sequence[str], bridge_ids: list[str]
                      ) -> dict[str, str]:
        """Which of ``bridge_ids`` a marker lists, and on which node (browsed, so nothing
        is consumed). Raises when a browse does not finish: the batch is then retried later
        rather than guessed."""
        wanted = set(bridge_ids)
        found: dict[str, str] = {}
        for node in nodes:
            adapter = self.adapter(node)
            collector = _Collector()
            subscription = adapter.subscribe(marker_queue(queue), collector,
                                             SubscribeOptions(browse=True, prefetch=MAX_BATCH))
            try:
                if not adapter.wait_browse_end(subscription, 30):  # type: ignore[attr-defined]
                    raise AdapterError(f"browsing the markers of {queue} on {node} did not "
                                       "finish in 30 s")
                markers = collector.take(MAX_MARKERS + 1, 0.001)
                if len(markers) > MAX_MARKERS:
                    raise AdapterError(f"more than {MAX_MARKERS} markers of {queue} on {node}")
                for delivery in markers:
                    for bridge_id in _marker_ids(delivery.message):
                        if bridge_id in wanted:
                            found[bridge_id] = node
            finally:
                adapter.unsubscribe(subscription)
        return found

    def _clean_markers(self, queue: str, node: str) -> None:
        """Consume the markers on ``node`` whose copies are all recorded as done (best
        effort: one left behind is consumed by a later pass)."""
        cache = bridge_cache(queue)
        try:
            adapter = self.adapter(node)
            collector = _Collector()
            subscription = adapter.subscribe(marker_queue(queue), collector,
                                             SubscribeOptions(prefetch=MAX_BATCH))
            try:
                while batch := collector.take(MAX_BATCH, self.idle_s / 3):
                    for delivery in batch:
                        ids = _marker_ids(delivery.message)
                        done = self.guard.store.ring_contains(
                            cache, [id_digest(b) for b in ids])
                        if all(done):
                            adapter.ack(delivery)
            finally:
                adapter.unsubscribe(subscription)
        except Exception as exc:
            log.warning("markers of %s on %s not cleaned up (next pass retries): %s", queue,
                        node, exc)

    @staticmethod
    def _bridge_id(source: str, message: Message) -> str:
        hops = parse_wire_int(message.headers.get(HOPS_HEADER, "0")) or 0
        # Same message, same hop: same id on every attempt. A message moved back and
        # forth gets a new id per hop, so a later legitimate move is never refused.
        identity = message.message_id or f"broker:{source}:{message.broker_message_id}"
        return f"{identity}:{hops}"

    @staticmethod
    def _copy(message: Message, queue: str, source: str, bridge_id: str) -> Message:
        headers = dict(message.headers)
        hops = parse_wire_int(headers.get(HOPS_HEADER, "0")) or 0
        headers[HOPS_HEADER] = str(hops + 1)
        headers[BRIDGE_DUPLICATE_ID_HEADER] = bridge_id
        headers[FROM_NODE_HEADER] = source
        return dataclasses.replace(message, address=queue, headers=headers,
                                   broker_message_id=None, delivery_count=0,
                                   scheduled_delivery=0)
