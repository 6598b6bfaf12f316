"""``mqguard bench reap``: the expiry reaper against each broker's own expiry, same run.

Per broker, a fresh uniquely named queue is filled with ``messages`` persistent
messages at rest, ``expired_fraction`` of them already expired and spread
evenly among the others (with the default 0.5: every other one, the first one
expired). Then:

ActiveMQ (reaper strategy ``selector``)
    *Reaper*: the expiring half carries only ``MQGUARD_EXPIRES`` (the adapter's
    default), in the past. Reaper scans run until every expired message was
    moved to the expiry address, or until :data:`STALL_SCANS` scans in a row
    moved nothing, or the timeout. ActiveMQ pages at most ``maxPageSize``
    (default 200) messages of a queue into memory for dispatch, and messages
    that match no consumer's selector stay in that page: on a queue where
    expired messages sit behind more unexpired ones than that, the selector
    subscription stops receiving. The bench reports what was moved
    (``reaper_complete`` false) instead of waiting forever.

    *Native*: a second queue, filled the same way with the native ``expires``
    header (``StompAdapter(native_expiry=True)``). ActiveMQ expires a message
    that is already expired when it arrives at once, at the send, so here the
    expiring half gets an expiration just after the (estimated) end of the
    fill: it is at rest when it expires. The broker is then left alone for
    ``native_wait`` seconds (its expiry task runs every ``expireMessagesPeriod``,
    default 30 s, and pages through a bounded number of messages per run) while
    a selector subscription on ``ActiveMQ.DLQ`` counts what it expired; if
    anything is left, a consumer walks the queue, which makes ActiveMQ expire
    the rest at dispatch, and that walk is timed.

RabbitMQ (``dead-letter``)
    The queue is declared with ``x-dead-letter-exchange`` /
    ``x-dead-letter-routing-key`` arguments (the same routing as the policy in
    docs/expiry.md; arguments rather than a policy because ``rabbitmqctl`` is
    only at hand for a local node) to a holding queue of this run. RabbitMQ
    expires messages itself, but only at the head of a queue: after
    ``native_wait`` seconds at rest the reaper moves what was dead-lettered
    (``reaper_at_rest_moved``); then a consumer walks the queue (the
    unexpired messages are delivered, RabbitMQ dead-letters each expired one as
    it reaches the head: ``native_s``) and the reaper moves the rest.

Mosquitto (``native-drop``)
    A persistent MQTT 5 session is filled while offline; the expiring half
    has the minimum Message Expiry Interval (1 s: "already expired" cannot be
    said in MQTT). After they are due, the session is resumed and what arrives
    is counted and timed: Mosquitto drops the expired ones itself and reports
    nothing, so the reaper has nothing to do (``reaper: not applicable``; its
    scan's note is quoted).

Every figure comes from this run. ``*_per_s`` = messages expired by that
mechanism / its seconds. The unexpired messages are checked to be all there,
in order, with their body and id; the moved copies to be exactly the expired
ones. The reaper gets ``reaper_timeout`` seconds per queue: a scan still
running then is cut off and the figures say how far it got
(``reaper_complete`` false). Every other wait is bounded by ``timeout``
(BenchError when exceeded).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit

from paho.mqtt import client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard import hookimpl
from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.config import parse_config
from mqguard.context import HookContext
from mqguard.message import ORIG_ADDRESS_HEADER, Message, new_message_id, now_ms
from mqguard.pipeline import Guard
from mqguard.reaper import DEFAULT_HOLDING_QUEUE, ExpiryReaper
from mqguard.registry import open_adapter

#: Sends pipelined per round trip while filling (the ``bench client`` default).
FILL_BATCH = 100
#: Reaper scans in a row that moved nothing before the bench calls the reaper stuck.
STALL_SCANS = 3
#: Application header naming the run, so the ActiveMQ.DLQ watcher selects only ours.
RUN_HEADER = "MQGUARD_BENCH"
#: Digits of the message index at the start of every body.
INDEX_DIGITS = 8
#: Quiet time after a drain reached its expected count, to catch anything extra.
SETTLE_S = 0.5
#: Name the bench's ExpiredCounter plugin is registered under.
COUNTER_PLUGIN = "bench-expired-counter"
#: Where ActiveMQ Classic puts what it expires (the default shared dead-letter strategy).
ACTIVEMQ_DLQ = "ActiveMQ.DLQ"

log = logging.getLogger("mqguard.bench.reap")


class BenchError(RuntimeError):
    """A wait timed out, or the brokers did something the figures cannot be built on."""


@dataclass
class ReapCase:
    """One broker's figures (``None`` where a figure does not apply to that broker)."""

    broker: str
    messages: int
    expired: int
    #: Unexpired messages found afterwards, untouched and in order.
    remaining: int
    fill_s: float
    reaper_strategy: str
    reaper_moved: int | None = None
    reaper_at_rest_moved: int | None = None
    reaper_scans: int | None = None
    reaper_s: float | None = None
    reaper_per_s: float | None = None
    reaper_complete: bool | None = None
    native_mechanism: str = ""
    native_fill_s: float | None = None
    native_expired_at_send: int | None = None
    native_at_rest_wait_s: float | None = None
    native_at_rest_expired: int | None = None
    native_expired: int | None = None
    native_s: float | None = None
    native_per_s: float | None = None
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        return {key: round(value, 3) if isinstance(value, float) else value
                for key, value in asdict(self).items()}


# -- the message plan ------------------------------------------------------------------

def expiring_plan(count: int, fraction: float) -> list[bool]:
    """Which indexes expire: ``ceil(count * fraction)`` of them, evenly spread, index 0 first.

    Integer arithmetic on a fraction, so 0.5 gives exactly every other message whatever
    the count (floats would drift over 100,000 indexes).
    """
    ratio = Fraction(fraction).limit_denominator(1000)
    p, q = ratio.numerator, ratio.denominator
    return [-(-(i + 1) * p // q) > -(-i * p // q) for i in range(count)]


def _body(index: int, size: int) -> bytes:
    return (b"%0*d" % (INDEX_DIGITS, index)).ljust(size, b"x")


def _index(body: bytes) -> int:
    try:
        return int(body[:INDEX_DIGITS])
    except ValueError:
        raise BenchError(f"a message not written by this bench arrived: {body[:40]!r}") from None


@dataclass(frozen=True)
class Plan:
    """The messages of one queue: what was sent, so that what comes back can be checked."""

    address: str
    expiring: list[bool]
    size: int
    ids: list[str]

    @classmethod
    def make(cls, address: str, expiring: list[bool], size: int) -> Plan:
        return cls(address, expiring, size, [new_message_id() for _ in expiring])

    @property
    def expired(self) -> int:
        return sum(self.expiring)

    @property
    def live(self) -> int:
        return len(self.expiring) - self.expired

    def messages(self, expiration: int, headers: dict[str, str] | None = None) -> list[Message]:
        return [Message(self.address, _body(i, self.size), dict(headers or {}), message_id=mid,
                        expiration=expiration if self.expiring[i] else 0)
                for i, mid in enumerate(self.ids)]


def _fill(adapter: Adapter, messages: Sequence[Message]) -> float:
    """Send everything, ``FILL_BATCH`` confirmed sends per round trip; returns seconds."""
    started = time.perf_counter()
    for start in range(0, len(messages), FILL_BATCH):
        adapter.send_many(list(messages[start:start + FILL_BATCH]))
    return time.perf_counter() - started


# -- receiving -------------------------------------------------------------------------

class Inbox:
    """Delivery callback that keeps what arrived, with arrival times, for later checks."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.times: list[float] = []
        self._cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        self.add(delivery.message)

    def add(self, message: Message) -> None:
        with self._cond:
            self.messages.append(message)
            self.times.append(time.perf_counter())
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self.messages)

    def wait_for(self, count: int, timeout: float, what: str) -> None:
        """Block until ``count`` messages arrived; BenchError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{what}: {len(self.messages)} of {count} messages "
                                     f"arrived within {timeout:.0f} s")
                self._cond.wait(min(left, 1.0))


def _stomp(url: str, **options: Any) -> Adapter:
    # No heart-beats: the at-rest windows leave connections idle for a long time, and a
    # heart-beat hiccup would reconnect and re-subscribe mid-measurement.
    adapter = open_adapter(url, heartbeats=(0, 0), **options)
    adapter.connect()
    return adapter


def _drain(url: str, address: str, count: int, timeout: float, what: str,
           headers: dict[str, str] | None = None) -> list[Message]:
    """Consume ``address`` (auto ack: it also empties it) until ``count`` messages arrived,
    then a short quiet time to see that nothing more comes."""
    adapter = _stomp(url)
    inbox = Inbox()
    try:
        adapter.subscribe(address, inbox, SubscribeOptions(ack="auto", prefetch=1000,
                                                           headers=dict(headers or {})))
        inbox.wait_for(count, timeout, what)
        time.sleep(SETTLE_S)
        return list(inbox.messages)
    finally:
        adapter.close()


def check_untouched(plan: Plan, got: Sequence[Message], what: str,
                    allowed_expired: int = 0) -> tuple[int, int]:
    """Check what was left in a queue: every unexpired message, once, in order, with its
    body and id, plus at most ``allowed_expired`` expired ones the reaper did not move.
    Returns (unexpired, expired) counts."""
    indexes = [_index(m.body) for m in got]
    if indexes != sorted(set(indexes)):
        raise BenchError(f"{what}: messages duplicated or out of order")
    live = [i for i in indexes if not plan.expiring[i]]
    if len(live) != plan.live:
        raise BenchError(f"{what}: {len(live)} of {plan.live} unexpired messages found")
    left = len(indexes) - len(live)
    if left > allowed_expired:
        raise BenchError(f"{what}: {left} expired messages left, {allowed_expired} expected")
    for message, index in zip(got, indexes, strict=True):
        if (message.body != _body(index, plan.size) or message.message_id != plan.ids[index]
                or ORIG_ADDRESS_HEADER in message.headers):
            raise BenchError(f"{what}: message {index} was altered")
        if not plan.expiring[index] and message.expiration:
            raise BenchError(f"{what}: unexpired message {index} has gained an expiration")
    return len(live), left


def check_expired_set(plan: Plan, got: Sequence[Message], what: str,
                      copies: bool) -> int:
    """Check that ``got`` holds distinct expired messages of ``plan`` only (moved copies
    carry ``_AMQ_ORIG_ADDRESS`` = the queue); returns how many."""
    indexes = [_index(m.body) for m in got]
    if len(set(indexes)) != len(indexes):
        raise BenchError(f"{what}: a message arrived twice")
    for message, index in zip(got, indexes, strict=True):
        if not plan.expiring[index]:
            raise BenchError(f"{what}: unexpired message {index} was expired")
        if copies and message.headers.get(ORIG_ADDRESS_HEADER) != plan.address:
            raise BenchError(f"{what}: copy of {index} lacks {ORIG_ADDRESS_HEADER}")
    return len(indexes)


# -- the reaper ------------------------------------------------------------------------

@contextmanager
def reaper_guard(address: str) -> Iterator[Guard]:
    """A Guard with ``address``'s expiry address set, its event log in a temporary dir
    (writing the ``expired`` / ``moved`` / ``acked`` events is part of what users pay), and
    an :class:`ExpiredCounter` registered as ``guard.expired_counter``."""
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-reap-") as events_dir:
        config = parse_config({
            "mqguard": {"node-id": "bench-reap", "event-log": {"directory": events_dir}},
            "address-settings": {address: {"expiry-address": f"{address}.EXP"}},
        })
        # The logging plugin writes one WARNING per moved message: 50,000 lines to a
        # terminal would measure the terminal. The hook still runs.
        decisions = logging.getLogger("mqguard.decisions")
        level = decisions.level
        decisions.setLevel(logging.ERROR)
        try:
            with Guard(config, role="reaper") as guard:
                guard.plugins.register(ExpiredCounter(), name=COUNTER_PLUGIN)
                yield guard
        finally:
            decisions.setLevel(level)


class ExpiredCounter:
    """Plugin counting ``message_expired`` calls: the reaper's progress as it happens.

    The reaper calls the hook only once a move is final (after the batch's commit on
    ActiveMQ, after the ack on RabbitMQ), so the count is right even when a scan is cut
    off at the deadline and its own :class:`ScanResult` is lost.
    """

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    @hookimpl
    def message_expired(self, message: Message, ctx: HookContext,
                        moved_to: str | None) -> None:
        with self._lock:
            self.count += 1


@dataclass
class ReaperRun:
    """The reaper's work on one queue, over one or more :func:`reap_until` calls."""

    guard: Guard
    batch: int
    #: ExpiryReaper ``idle_ms``; None: the reaper's default.
    idle_ms: int | None = None
    scans: int = 0
    seconds: float = 0.0
    #: A scan was cut off at the deadline (its connection closed under it).
    cut_off: bool = False

    @property
    def moved(self) -> int:
        counter = self.guard.plugins.get_plugin(COUNTER_PLUGIN)
        assert isinstance(counter, ExpiredCounter)
        return counter.count

    def phase(self, url: str, address: str, target: int, timeout: float,
              holding_queue: str = DEFAULT_HOLDING_QUEUE) -> bool:
        """Scan with a reaper on a connection of its own (a cut-off closes it) until
        ``target`` moved; see :func:`reap_until`."""
        adapter = _stomp(url)
        try:
            idle = {} if self.idle_ms is None else {"idle_ms": self.idle_ms}
            reaper = ExpiryReaper(self.guard, adapter, [address], batch_size=self.batch,
                                  holding_queue=holding_queue, first_wait_ms=3000, **idle)
            return reap_until(reaper, target, timeout, self)
        finally:
            adapter.close()


def _scan_into(reaper: ExpiryReaper, failure: list[BaseException]) -> None:
    try:
        reaper.scan()
    except BaseException as exc:  # reported by reap_until, or expected after a cut-off
        failure.append(exc)


def reap_until(reaper: ExpiryReaper, target: int, timeout: float, run: ReaperRun) -> bool:
    """Scan until ``target`` messages were moved; False when :data:`STALL_SCANS` scans in a
    row moved nothing or ``timeout`` passed (a scan still running then is cut off by closing
    its connection: one scan drains until its queue is quiet, which can take very long).
    Each scan's wall time is added to ``run``."""
    deadline = time.monotonic() + timeout
    empty = 0
    while run.moved < target:
        if time.monotonic() >= deadline:
            return False
        before = run.moved
        failure: list[BaseException] = []
        started = time.perf_counter()
        worker = threading.Thread(target=_scan_into, args=(reaper, failure),
                                  name="mqguard-bench-reaper", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            run.cut_off = True
            reaper.adapter.close()  # fails its pending receipts: the scan ends
            worker.join(30)
            run.seconds += time.perf_counter() - started
            run.scans += 1
            return run.moved >= target
        run.seconds += time.perf_counter() - started
        run.scans += 1
        if failure:
            raise BenchError(f"reaper scan failed: {failure[0]}") from failure[0]
        empty = 0 if run.moved > before else empty + 1
        if empty >= STALL_SCANS:
            return False
    return True


def _rate(count: int | None, seconds: float | None) -> float | None:
    return count / seconds if count and seconds else None


# -- ActiveMQ --------------------------------------------------------------------------

def run_activemq(url: str, expiring: list[bool], size: int, batch: int, native_wait: float,
                 idle_ms: int | None, reaper_timeout: float, timeout: float) -> ReapCase:
    run_id = new_message_id()[:10]
    plan = Plan.make(f"mqguard.bench.reap.{run_id}", expiring, size)
    producer = _stomp(url)
    try:
        fill_s = _fill(producer, plan.messages(now_ms() - 60_000))
    finally:
        producer.close()
    with reaper_guard(plan.address) as guard:
        run = ReaperRun(guard, batch, idle_ms)
        complete = run.phase(url, plan.address, plan.expired, reaper_timeout)
        moved = run.moved
    # What the reaper left: every unexpired message, in order, and the expired ones it
    # did not move (a cut-off batch was rolled back with its connection).
    rest = _drain(url, plan.address, len(expiring) - moved, timeout,
                  "activemq: draining the queue")
    remaining, left = check_untouched(plan, rest, "activemq queue after the reaper",
                                      allowed_expired=plan.expired - moved)
    copies = _drain(url, f"{plan.address}.EXP", moved, timeout,
                    "activemq: draining the expiry address")
    if check_expired_set(plan, copies, "activemq expiry address", copies=True) != moved:
        raise BenchError("activemq: the expiry address does not hold what the reaper moved")
    case = ReapCase(
        broker="activemq", messages=len(expiring), expired=plan.expired, remaining=remaining,
        fill_s=fill_s, reaper_strategy="selector", reaper_moved=moved,
        reaper_at_rest_moved=moved, reaper_scans=run.scans, reaper_s=run.seconds,
        reaper_per_s=_rate(moved, run.seconds), reaper_complete=complete)
    notes = [f"reaper: {run.scans} scan(s) with selector MQGUARD_EXPIRES <= now, "
             f"batches of {batch} in one transaction each"]
    if run.cut_off:
        notes.append(f"REAPER INCOMPLETE: cut off at --reaper-timeout {reaper_timeout:.0f} s "
                     f"with {left} of {plan.expired} expired messages still in the queue")
    elif not complete:
        notes.append(
            f"REAPER INCOMPLETE: {left} of {plan.expired} expired messages were still in the "
            f"queue after {STALL_SCANS} scans in a row moved nothing. Two ActiveMQ causes "
            "were seen on deep interleaved queues: it pages at most maxPageSize (default 200) "
            "messages in for dispatch and a selector only sees those, so unexpired messages "
            "(matching no selector) fill the page; with maxPageSize raised, paging a deep "
            "queue in takes longer than the reaper's idle time (--idle-ms) before the first "
            "match arrives, and the scan ends empty")
    _activemq_native(url, Plan.make(f"{plan.address}.native", expiring, size), run_id,
                     fill_s, native_wait, timeout, case, notes)
    case.notes = "; ".join(notes)
    return case


def _activemq_native(url: str, plan: Plan, run_id: str, fill_estimate_s: float,
                     native_wait: float, timeout: float, case: ReapCase,
                     notes: list[str]) -> None:
    # Subscribed first: it counts what ActiveMQ expires, at the send included. The
    # selector keeps everyone else's dead letters where they are.
    watcher = _stomp(url)
    dead = Inbox()
    producer = _stomp(url, native_expiry=True)
    try:
        watcher.subscribe(ACTIVEMQ_DLQ, dead, SubscribeOptions(
            ack="auto", prefetch=1000, selector=f"{RUN_HEADER} = '{run_id}'"))
        # Due just after the fill is expected to end (estimated from the reaper queue's
        # fill in this run): an already expired message would be expired at the send.
        start_ms, fill_start = now_ms(), time.perf_counter()
        due_ms = start_ms + int((fill_estimate_s * 1.25 + 3.0) * 1000)
        due = fill_start + (due_ms - start_ms) / 1000  # the same instant, perf_counter clock
        case.native_fill_s = _fill(producer, plan.messages(due_ms, {RUN_HEADER: run_id}))
        case.native_expired_at_send = len(dead)
        time.sleep(max(0.0, due - time.perf_counter()) + 0.05)
        # At rest: nobody consumes the queue; only the broker's own expiry task acts.
        at_rest_end = time.perf_counter() + native_wait
        while len(dead) < plan.expired and time.perf_counter() < at_rest_end:
            time.sleep(0.1)
        case.native_at_rest_wait_s = time.perf_counter() - due
        at_rest = len(dead) - case.native_expired_at_send
        case.native_at_rest_expired = at_rest
        if len(dead) >= plan.expired:
            mechanism = "at rest: ActiveMQ's periodic expiry task (expireMessagesPeriod)"
            case.native_s = max(dead.times) - due
            walk_expired = at_rest
            rest: list[Message] = []
        else:
            # What the expiry task left: a consumer walking the queue makes ActiveMQ expire
            # each expired message as it pages it in for dispatch.
            before = len(dead)
            walker = _stomp(url)
            inbox = Inbox()
            started = time.perf_counter()
            try:
                walker.subscribe(plan.address, inbox, SubscribeOptions(ack="auto",
                                                                       prefetch=1000))
                inbox.wait_for(plan.live, timeout, "activemq native: walking the queue")
                dead.wait_for(plan.expired, timeout, "activemq native: ActiveMQ.DLQ")
                case.native_s = max(max(inbox.times), max(dead.times)) - started
                time.sleep(SETTLE_S)
            finally:
                walker.close()
            rest = inbox.messages
            walk_expired = len(dead) - before
            mechanism = ("at dispatch: the rest expired by ActiveMQ as a consumer walked the "
                         "queue (native_s = that walk, which also delivers the unexpired "
                         "messages)")
        time.sleep(SETTLE_S)
    finally:
        producer.close()
        watcher.close()
    case.native_mechanism = (
        f"native 'expires' -> ActiveMQ.DLQ; {at_rest} expired at rest in "
        f"{case.native_at_rest_wait_s:.0f} s; {mechanism}")
    case.native_expired = check_expired_set(plan, dead.messages, "activemq ActiveMQ.DLQ",
                                            copies=False)
    if case.native_expired != plan.expired:
        raise BenchError(f"activemq native: {case.native_expired} of {plan.expired} in the DLQ")
    if rest:
        check_untouched(plan, rest, "activemq native queue")
    case.native_per_s = _rate(walk_expired, case.native_s)
    if case.native_expired_at_send:
        notes.append(f"native: the fill outran its estimate and {case.native_expired_at_send} "
                     "messages were expired at the send, not at rest")


# -- RabbitMQ --------------------------------------------------------------------------

def run_rabbitmq(url: str, expiring: list[bool], size: int, batch: int, native_wait: float,
                 idle_ms: int | None, reaper_timeout: float, timeout: float) -> ReapCase:
    plan = Plan.make(f"mqguard.bench.reap.{new_message_id()[:10]}", expiring, size)
    holding = f"{plan.address}.held"
    # Queue arguments route dead letters like the documented policy does.
    dead_letter_args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": holding}
    with reaper_guard(plan.address) as guard:
        run = ReaperRun(guard, batch, idle_ms)
        # Declares the holding queue (nothing to move yet): RabbitMQ drops dead letters
        # it cannot route. Not counted as a scan of the bench.
        declarer = _stomp(url)
        try:
            ExpiryReaper(guard, declarer, [], holding_queue=holding).scan()
        finally:
            declarer.close()
        producer = _stomp(url)
        try:
            # Declared with the arguments before the first SEND would declare it bare.
            producer.unsubscribe(producer.subscribe(
                plan.address, lambda d: None, SubscribeOptions(headers=dead_letter_args)))
            fill_s = _fill(producer, plan.messages(now_ms() - 60_000))
        finally:
            producer.close()
        # At rest: RabbitMQ expires (dead-letters) only what reaches the queue head.
        time.sleep(native_wait)
        run.phase(url, plan.address, plan.expired, reaper_timeout, holding)
        at_rest, at_rest_s = run.moved, run.seconds
        # A consumer walks the queue: each expired message that reaches the head is
        # dead-lettered to the holding queue before the next unexpired one is delivered.
        walker = _stomp(url)
        inbox = Inbox()
        started = time.perf_counter()
        try:
            walker.subscribe(plan.address, inbox, SubscribeOptions(
                ack="auto", prefetch=1000, headers=dead_letter_args))
            inbox.wait_for(plan.live, timeout, "rabbitmq: walking the queue")
            native_s = max(inbox.times) - started
            time.sleep(SETTLE_S)
        finally:
            walker.close()
        complete = run.phase(url, plan.address, plan.expired, reaper_timeout, holding)
        moved = run.moved
    remaining, _ = check_untouched(plan, inbox.messages, "rabbitmq queue")
    # A cut-off can leave one copy confirmed whose original was not acked yet.
    copies = _drain(url, f"{plan.address}.EXP", moved, timeout,
                    "rabbitmq: draining the expiry address")
    found = check_expired_set(plan, copies, "rabbitmq expiry address", copies=True)
    if not moved <= found <= moved + run.cut_off:
        raise BenchError(f"rabbitmq: {found} copies in the expiry address, {moved} moved")
    notes = [f"reaper: {run.scans} scan(s) of the holding queue; at rest {at_rest} moved in "
             f"{at_rest_s:.2f} s, the rest after a consumer walked the queue"]
    if moved < plan.expired:
        # Clean-up (and a check): what the reaper did not get to is in the holding queue.
        held = _drain(url, holding, plan.expired - moved, timeout,
                      "rabbitmq: draining the holding queue")
        check_expired_set(plan, held, "rabbitmq holding queue", copies=False)
        why = (f"cut off at --reaper-timeout {reaper_timeout:.0f} s" if run.cut_off
               else f"{STALL_SCANS} scans in a row moved nothing")
        notes.append(f"REAPER INCOMPLETE: {moved} of {plan.expired} moved ({why})")
    notes.append("left behind, empty (RabbitMQ cannot delete a queue over STOMP): the queue "
                 "and its .EXP and .held queues")
    walked = plan.expired - at_rest
    return ReapCase(
        broker="rabbitmq", messages=len(expiring), expired=plan.expired, remaining=remaining,
        fill_s=fill_s, reaper_strategy="dead-letter", reaper_moved=moved,
        reaper_at_rest_moved=at_rest, reaper_scans=run.scans, reaper_s=run.seconds,
        reaper_per_s=_rate(moved, run.seconds), reaper_complete=complete,
        native_mechanism=(
            f"per-message TTL ('expiration'), dead-lettered by RabbitMQ at the queue head "
            f"only: {at_rest} expired at rest in {native_wait:.0f} s; the rest as a consumer "
            "walked the queue (native_s = that walk, which also delivers the unexpired "
            "messages)"),
        native_at_rest_wait_s=native_wait, native_at_rest_expired=at_rest,
        native_expired=plan.expired, native_s=native_s, native_per_s=_rate(walked, native_s),
        notes="; ".join(notes))


# -- Mosquitto -------------------------------------------------------------------------

def _mqtt_session(url: str, client_id: str, on_message: Callable[..., None] | None,
                  clean_start: bool, session_expiry: int) -> mqtt.Client:
    parts = urlsplit(url)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv5, manual_ack=True)
    if parts.username:
        client.username_pw_set(parts.username, parts.password)
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    if on_message is not None:
        client.on_message = on_message
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = session_expiry
    client.connect(parts.hostname or "127.0.0.1", parts.port or 1883, clean_start=clean_start,
                   properties=props)
    client.loop_start()
    if not connected.wait(10):
        client.loop_stop()
        raise BenchError(f"mosquitto: no CONNACK for {client_id} within 10 s")
    return client


def _mqtt_close(client: mqtt.Client, end_session: bool) -> None:
    props = None
    if end_session:
        # Session Expiry 0 on DISCONNECT: the broker forgets the session (clean-up).
        props = Properties(PacketTypes.DISCONNECT)
        props.SessionExpiryInterval = 0
    client.disconnect(properties=props)
    client.loop_stop()


def run_mosquitto(url: str, expiring: list[bool], size: int, timeout: float) -> ReapCase:
    plan = Plan.make(f"mqguard.bench.reap.{new_message_id()[:10]}", expiring, size)
    topic = plan.address.replace(".", "/")
    client_id = f"mqguard-bench-reap-{new_message_id()[:10]}"
    session_expiry = int(timeout) + 600
    # The persistent session that holds the messages while its client is away.
    subscribed = threading.Event()
    session = _mqtt_session(url, client_id, None, True, session_expiry)
    session.on_subscribe = lambda *args: subscribed.set()
    session.subscribe(topic, qos=1)
    if not subscribed.wait(10):
        raise BenchError("mosquitto: no SUBACK within 10 s")
    _mqtt_close(session, end_session=False)

    producer = open_adapter(url, broker="mosquitto")
    producer.connect()
    try:
        fill_s = _fill(producer, plan.messages(now_ms() - 60_000))
    finally:
        producer.close()
    filled = time.perf_counter()
    with reaper_guard(plan.address) as guard:
        adapter = open_adapter(url, broker="mosquitto")
        try:
            (scan,) = ExpiryReaper(guard, adapter, [plan.address]).scan()
        finally:
            adapter.close()
    # Mosquitto stores whole-second expiry times and expires a message once the second
    # after its expiry second has begun: an interval of 1 s is over 2 s after arrival.
    time.sleep(max(0.0, filled + 2.2 - time.perf_counter()))

    inbox = Inbox()

    def on_message(client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        inbox.add(Message(plan.address, bytes(msg.payload),
                          message_id=_user_property(msg, "mqguard-id")))
        client.ack(msg.mid, msg.qos)

    started = time.perf_counter()
    session = _mqtt_session(url, client_id, on_message, False, session_expiry)
    try:
        inbox.wait_for(plan.live, timeout, "mosquitto: resuming the session")
        native_s = max(inbox.times) - started
        time.sleep(SETTLE_S * 2)  # an expired message would come after the last live one
    finally:
        _mqtt_close(session, end_session=True)
    got = inbox.messages
    if any(plan.expiring[_index(m.body)] for m in got):
        raise BenchError("mosquitto delivered a message whose expiry interval had passed")
    remaining, _ = check_untouched(plan, got, "mosquitto session")
    return ReapCase(
        broker="mosquitto", messages=len(expiring), expired=plan.expired, remaining=remaining,
        fill_s=fill_s, reaper_strategy=scan.strategy,
        native_mechanism=("MQTT 5 Message Expiry Interval (1 s, the minimum): Mosquitto drops "
                          "expired messages itself, reporting nothing; native_s = resuming the "
                          "offline session until the unexpired messages arrived (the expired "
                          "ones were dropped meanwhile; at rest nothing is observable)"),
        native_expired=plan.expired, native_s=native_s,
        native_per_s=_rate(plan.expired, native_s),
        notes=f"reaper: not applicable ({scan.note})")


def _user_property(msg: mqtt.MQTTMessage, name: str) -> str:
    for key, value in getattr(msg.properties, "UserProperty", None) or ():
        if key == name:
            return str(value)
    return ""


def run_case(broker: str, url: str, *, messages: int, expired_fraction: float, size: int,
             batch: int, native_wait: float, idle_ms: int | None = None,
             reaper_timeout: float, timeout: float) -> ReapCase:
    """Fill, reap, compare with the broker's own expiry, verify: one broker's figures."""
    expiring = expiring_plan(messages, expired_fraction)
    if broker == "activemq":
        return run_activemq(url, expiring, size, batch, native_wait, idle_ms,
                            reaper_timeout, timeout)
    if broker == "rabbitmq":
        return run_rabbitmq(url, expiring, size, batch, native_wait, idle_ms,
                            reaper_timeout, timeout)
    if broker == "mosquitto":
        return run_mosquitto(url, expiring, size, timeout)
    raise ValueError(f"unknown broker {broker!r}")
