"""``mqguard dlq retry``: dead letters back to where they came from (Artemis
``QueueControl.retryMessages``).

Artemis (``QueueImpl.retryMessages`` -> ``move`` -> ``makeCopy``) routes a copy of each
message that has ``_AMQ_ORIG_ADDRESS`` back to that address (to its original queue only),
with a new message id, expiration 0, ``_AMQ_ORIG_*`` now naming the dead-letter address
and the dead letter, no duplicate rejection, a fresh reference (delivery count 0), and
acknowledges the dead letter in the same transaction. mqguard does the same through the
adapters:

* the copy goes to ``--to`` or ``_AMQ_ORIG_ADDRESS``; dead letters without one are left
  where they are (``no_origin``);
* it keeps the body, the application's headers, the producer id and sequence and
  ``_AMQ_DUPL_ID`` (not checked: Artemis's ``rejectDuplicate`` is false) and the
  original's send time (``mqguard-sent-at``: Artemis's copy keeps its timestamp), drops
  the move's own headers (reason, move times, counts), and has **no expiration**: the
  original's TTL was spent on its first life and the copy is an operator's deliberate
  resend (Artemis clears it too; re-deriving one from ``expiry-delay`` would let a
  retried message expire again before the fixed consumer reached it);
* its id is the dead letter's id plus ``~r`` (one retry of one dead letter always has the
  same id, so a repeated attempt resends the same message, and the audit sees one second
  life); the delivery count starts over with it;
* it carries ``_AMQ_BRIDGE_DUP = dlq:<dead letter id>``, recorded in the target's
  ``BRIDGE.<address>`` duplicate-ID cache once the broker confirmed the copy.

Crash safety (a SIGKILL anywhere): where the broker has transactions (ActiveMQ, and
RabbitMQ, whose STOMP plugin performs a transaction's frames at COMMIT) each batch of
copies and the acknowledgements of their dead letters commit together, so a kill leaves
either both or neither. Elsewhere (MQTT) each batch is (1) looked up in the
bridge cache: a confirmed id means an earlier attempt's copy reached the broker, and the
dead letter is only acknowledged; (2) the copies are sent and confirmed; (3) their bridge
ids are recorded, confirmed; (4) the dead letters are acknowledged. A kill before (2)
completes leaves the dead letters to the next attempt (nothing lost); after (3) the next
attempt finds the ids (nothing sent twice). Between (2) and (3), one store round trip, the
next attempt sends the copy again: the same message id, producer and sequence, which the
consumer audit keeps from the handler. The ``dlq_retried`` events are written (flushed)
before the copies go out, so no copy ever reaches a consumer unannounced.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mqguard.adapter import Adapter
from mqguard.digest import id_digest
from mqguard.dlq.model import MOVE_HEADERS, DeadLetter
from mqguard.dlq.reader import DEFAULT_IDLE_MS, DEFAULT_WINDOW, FIRST_WAIT_FACTOR, consuming
from mqguard.dlq.selection import Selection
from mqguard.events import EventType
from mqguard.message import (
    BRIDGE_DUPLICATE_ID_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    PRIOR_DELIVERIES_HEADER,
    Message,
    new_message_id,
    now_ms,
)
from mqguard.pipeline import Guard
from mqguard.redistributor import bridge_cache, bridge_cache_size
from mqguard.stores.base import RingOutcome
from mqguard.verdict import AckReason

__all__ = ["BRIDGE_PREFIX", "DEFAULT_BATCH", "RETRY_SUFFIX", "RetryOptions", "RetryResult",
           "bridge_id_of", "retry", "retry_copy"]

log = logging.getLogger("mqguard.dlq")

#: Suffix of a retried copy's message id.
RETRY_SUFFIX: Final = "~r"
#: Prefix of a retried copy's bridge duplicate id.
BRIDGE_PREFIX: Final = "dlq:"
#: Dead letters per batch (one STOMP transaction, one store call on MQTT).
DEFAULT_BATCH: Final = 100
#: ``pending_ms`` of the bridge lookups: only a *confirmed* id proves a copy (see the
#: redistributor, which reads the same caches the same way).
_LOOKUP_PENDING_MS: Final = 1

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class RetryOptions:
    to: str | None = None
    selection: Selection = field(default_factory=Selection)
    limit: int | None = None
    dry_run: bool = False
    batch: int = DEFAULT_BATCH
    #: At most this many dead letters a second (None: as fast as the broker confirms).
    rate: float | None = None
    idle_ms: int = DEFAULT_IDLE_MS
    #: None: FIRST_WAIT_FACTOR x idle_ms.
    first_wait_ms: int | None = None
    window: int = DEFAULT_WINDOW


@dataclass(slots=True)
class RetryResult:
    address: str
    #: Copies sent (or, with ``dry_run``, that would be).
    retried: int = 0
    #: Dead letters whose copy an earlier, interrupted attempt had already confirmed.
    completed: int = 0
    #: Left in place: no ``_AMQ_ORIG_ADDRESS`` and no ``--to``.
    no_origin: int = 0
    #: Left in place: not selected (``--id``, ``--original``).
    skipped: int = 0
    by_target: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0
    ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "retried": self.retried, "completed": self.completed,
                "no_origin": self.no_origin, "skipped": self.skipped,
                "by_target": self.by_target, "dry_run": self.dry_run,
                "seconds": round(self.seconds, 3)}


def bridge_id_of(letter: DeadLetter, *, stable_broker_ids: bool = False) -> str | None:
    """``dlq:<dead letter id>``: its mqguard id, else the broker's where that is stable
    (ActiveMQ); None for a message that never went through a guard on a broker whose
    message ids change with each delivery (RabbitMQ, MQTT)."""
    stable = letter.message.message_id or (
        letter.message.broker_message_id if stable_broker_ids else None)
    return f"{BRIDGE_PREFIX}{stable}" if stable else None


def retry_copy(letter: DeadLetter, target: str, bridge_id: str | None) -> Message:
    """The copy of ``letter`` that goes back to ``target`` (see the module doc)."""
    message = letter.message
    headers = {k: v for k, v in message.headers.items()
               if k not in MOVE_HEADERS and k != PRIOR_DELIVERIES_HEADER}
    headers[ORIG_ADDRESS_HEADER] = letter.address
    headers[ORIG_QUEUE_HEADER] = letter.address
    headers[ORIG_MESSAGE_ID_HEADER] = letter.message_id
    if bridge_id is not None:
        headers[BRIDGE_DUPLICATE_ID_HEADER] = bridge_id
    copy_id = (message.message_id + RETRY_SUFFIX) if message.message_id else new_message_id()
    return Message(address=target, body=message.body, headers=headers, message_id=copy_id,
                   duplicate_id=message.duplicate_id, expiration=0,
                   producer_id=message.producer_id, sequence=message.sequence,
                   sent_at=letter.sent_at or 0)


@dataclass(slots=True)
class _Planned:
    letter: DeadLetter
    copy: Message
    bridge_id: str | None


class _Pacer:
    """Keeps a run at ``rate`` dead letters a second."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.started = time.monotonic()

    def wait(self, done: int) -> None:
        if self.rate:
            due = self.started + done / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def retry(guard: Guard, adapter: Adapter, address: str, options: RetryOptions | None = None,
          *, progress: Progress | None = None) -> RetryResult:
    """Retry the dead letters of ``address`` on the connected ``adapter``."""
    options = options or RetryOptions()
    result = RetryResult(address, dry_run=options.dry_run)
    started = time.perf_counter()
    pacer = _Pacer(options.rate)
    batch_size = max(1, min(options.batch, int(options.rate) if options.rate and
                            options.rate >= 1 else options.batch))
    transactional = adapter.capabilities.transactions and not options.dry_run
    stable = adapter.capabilities.stable_message_id
    if not options.dry_run:
        # The bridge ids go to the store once a batch is sent: an unreachable store must
        # stop the run before it takes anything, not after a first batch went out.
        guard.store.ping()
    with consuming(adapter, address, window=options.window) as queue:
        first_s = (FIRST_WAIT_FACTOR * options.idle_ms if options.first_wait_ms is None
                   else options.first_wait_ms) / 1000.0
        while options.limit is None or result.retried + result.completed < options.limit:
            deliveries = queue.take(batch_size, options.idle_ms / 1000.0, first_s)
            first_s = 0.0
            if not deliveries:
                break
            now = now_ms()
            planned: list[_Planned] = []
            for delivery in deliveries:
                letter = DeadLetter.from_delivery(delivery, address)
                room = None if options.limit is None else (
                    options.limit - result.retried - result.completed - len(planned))
                if (room is not None and room <= 0) or not options.selection.accepts(letter, now):
                    result.skipped += 1
                    continue
                target = options.to or letter.original_address
                if not target:
                    result.no_origin += 1
                    continue
                bridge_id = bridge_id_of(letter, stable_broker_ids=stable)
                planned.append(_Planned(letter, retry_copy(letter, target, bridge_id), bridge_id))
            if not planned:
                continue
            if options.dry_run:
                for item in planned:
                    _count(result, item, fresh=True)
            elif transactional:
                _retry_in_transaction(guard, adapter, address, planned, result)
            else:
                _retry_confirmed(guard, adapter, address, planned, result)
            if progress is not None:
                progress(len(planned))
            pacer.wait(result.retried + result.completed)
    result.seconds = time.perf_counter() - started
    return result


def _count(result: RetryResult, item: _Planned, *, fresh: bool) -> None:
    if fresh:
        result.retried += 1
    else:
        result.completed += 1
    target = item.copy.address
    result.by_target[target] = result.by_target.get(target, 0) + 1
    result.ids.append(item.copy.message_id)


def _announce(guard: Guard, address: str, planned: Sequence[_Planned], reason: str) -> None:
    """The ``dlq_retried`` events, on disk before any copy can reach a consumer."""
    for item in planned:
        guard.events.emit(EventType.DLQ_RETRIED, item.letter.message, queue=address,
                          target=item.copy.address, new_message_id=item.copy.message_id,
                          original_message_id=item.letter.original_message_id,
                          bridge_id=item.bridge_id, reason=reason)
    guard.events.flush()


def _acked(guard: Guard, address: str, planned: Sequence[_Planned]) -> None:
    """The dead letters' ``acked`` events, on disk before the acknowledgements: a kill in
    between leaves them in place with the events written, and the next attempt writes them
    again (written after, a kill would leave acknowledged dead letters with no trace)."""
    for item in planned:
        guard.events.emit(EventType.ACKED, item.letter.message, queue=address,
                          ack_reason=AckReason.NORMAL.value, handled=False)
    guard.events.flush()


def _record(guard: Guard, planned: Sequence[_Planned]) -> None:
    """Bridge ids into each target's ``BRIDGE.<address>`` cache, confirmed."""
    store = guard.store
    by_target: dict[str, list[bytes]] = {}
    for item in planned:
        if item.bridge_id is not None:
            by_target.setdefault(item.copy.address, []).append(id_digest(item.bridge_id))
    for target, digests in by_target.items():
        cache = bridge_cache(target)
        store.ring_check_and_add(cache, digests, bridge_cache_size(guard, target))
        store.ring_confirm(cache, digests)


def _retry_in_transaction(guard: Guard, adapter: Adapter, address: str,
                          planned: list[_Planned], result: RetryResult) -> None:
    _announce(guard, address, planned, "retried from the dead-letter address")
    _acked(guard, address, planned)
    tx = adapter.begin()
    try:
        adapter.send_many([item.copy for item in planned], transaction=tx)
        for item in planned:
            adapter.ack(item.letter.delivery, transaction=tx)
    except BaseException:
        with contextlib.suppress(Exception):
            adapter.abort(tx)
        raise
    adapter.commit(tx)
    _record(guard, planned)
    for item in planned:
        _count(result, item, fresh=True)


def _retry_confirmed(guard: Guard, adapter: Adapter, address: str,
                     planned: list[_Planned], result: RetryResult) -> None:
    store = guard.store
    done: set[int] = set()
    by_target: dict[str, list[int]] = {}
    for index, item in enumerate(planned):
        if item.bridge_id is not None:
            by_target.setdefault(item.copy.address, []).append(index)
    # (1) Copies an earlier attempt got confirmed: only the acknowledgement is missing.
    for target, indexes in by_target.items():
        outcomes = store.ring_lookup(bridge_cache(target),
                                     [id_digest(planned[i].bridge_id or "") for i in indexes],
                                     _LOOKUP_PENDING_MS)
        done.update(i for i, outcome in zip(indexes, outcomes, strict=True)
                    if outcome is RingOutcome.DUPLICATE)
    finished = [item for i, item in enumerate(planned) if i in done]
    fresh = [item for i, item in enumerate(planned) if i not in done]
    if finished:
        _announce(guard, address, finished, "copy confirmed by an earlier attempt")
    if fresh:
        _announce(guard, address, fresh, "retried from the dead-letter address")
        # (2) Sent and confirmed by the broker, (3) recorded.
        adapter.send_many([item.copy for item in fresh])
        _record(guard, fresh)
    # (4) The dead letters go.
    _acked(guard, address, [*finished, *fresh])
    for item in [*finished, *fresh]:
        adapter.ack(item.letter.delivery)
    for item in finished:
        _count(result, item, fresh=False)
    for item in fresh:
        _count(result, item, fresh=True)
