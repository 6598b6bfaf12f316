"""``mqguard bench peer``: one workload on Artemis and on ActiveMQ / RabbitMQ with mqguard.

The comparison a user asks for before choosing between migrating to Apache ActiveMQ Artemis
and keeping their broker with mqguard in front of it. Every path runs the same workload in
the same run:

Send
    ``n`` persistent messages of ``size`` bytes, each SEND with a receipt and an
    ``_AMQ_DUPL_ID``; one message in ``duplicate_every`` (10% by default) repeats the
    duplicate id of a message sent one batch earlier, so it must be dropped. Pipelined
    ``batch`` at a time: every receipt of a batch is awaited before the next batch.
    ``send_per_s`` = ``n`` / seconds from the first SEND to the last receipt (duplicates
    count: the sender sent them and was told they were accepted, as Artemis does).

Consume
    The queue the send phase filled is drained: ``client-individual`` subscription,
    ``prefetch`` unacked in flight (Artemis, which counts in bytes, gets a
    ``consumer-window-size`` of ``prefetch * (size + WINDOW_OVERHEAD)``), one ACK per
    message, timed from SUBSCRIBE until the ``unique``-th message arrived (on a ``direct``
    path, which drops nothing, the ``n``-th); ``consume_per_s`` = those messages / seconds.
    Then, untimed, the consumer listens ``grace`` seconds more: anything arriving is a
    duplicate that got through (``duplicates_delivered``, 0 on every path that keeps its
    promise).

Latency
    One connection subscribes to a fresh queue and sends one persistent message at a time
    (unique duplicate id), waiting for it to arrive; a sample is the time from the send call
    to the arrival. Samples of all rounds are pooled per path for ``p50_ms`` / ``p99_ms``.

The paths: ``artemis`` (stomp.py straight to Artemis, whose own duplicate detection
works: its default ``id-cache-size`` of 20000 per address, persisted in its journal);
``<broker>+sidecar`` (the same stomp.py client connected to an ``mqguard sidecar`` process
in front of the broker); ``<broker>+wrappers`` (``GuardedProducer`` / ``GuardedConsumer``
in the application). The sidecar and the wrappers run the default plugins, the event log
in a temporary directory and the store given (``redis`` makes the duplicate-ID cache
survive a restart and be shared, as Artemis's journal-backed one survives; ``memory`` is
per process). ``direct`` paths (``<broker>+direct``, stomp.py straight to ActiveMQ or
RabbitMQ, no duplicate detection: duplicates are delivered) are measured on request, to show
what the broker does alone.

Rounds: ``rounds`` times, every path once per round, the order rotated by one each round so
that no path is always first; rates are the median of the rounds. Before the first round,
``warmup`` messages go through every path untimed (a JVM broker just started is several times
slower until its JIT has compiled the hot paths).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import stomp

from mqguard.adapter import SubscribeOptions
from mqguard.bench.client import bench_guard
from mqguard.bench.proxy import percentile, running_sidecar, stomp_latency
from mqguard.bench.stats import median
from mqguard.consumer import GuardedConsumer
from mqguard.message import Message, new_message_id
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter

__all__ = ["PATH_KINDS", "PeerPath", "Workload", "path_names", "run"]

#: How a path reaches its broker.
PATH_KINDS: tuple[str, ...] = ("sidecar", "wrappers", "direct")


@dataclass(frozen=True)
class Workload:
    messages: int = 5000
    size: int = 200
    batch: int = 100
    prefetch: int = 100
    duplicate_every: int = 10
    rounds: int = 5
    latency_samples: int = 1000
    warmup: int = 2000
    grace: float = 0.3

    def duplicate_ids(self, address: str) -> list[str]:
        """The ``_AMQ_DUPL_ID`` of every message: position ``k`` with
        ``k % duplicate_every == duplicate_every - 1`` and ``k >= batch`` repeats the id
        of position ``k - batch`` (already confirmed: one batch earlier)."""
        ids: list[str] = []
        for k in range(self.messages):
            repeat = (self.duplicate_every > 0 and k >= self.batch
                      and k % self.duplicate_every == self.duplicate_every - 1)
            ids.append(ids[k - self.batch] if repeat else f"{address}-{k}")
        return ids


@dataclass
class PeerPath:
    path: str
    broker: str
    via: str
    sent: int = 0
    unique: int = 0
    delivered: int = 0
    duplicates_delivered: int = 0
    send_per_s: float = 0.0
    consume_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    runs: dict[str, list[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def path_names(brokers: Sequence[str], vias: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(name, broker, via)`` of every path: Artemis first, then each broker per via."""
    paths = [("artemis", "artemis", "native")]
    paths += [(f"{broker}+{via}", broker, via) for broker in brokers for via in vias]
    return paths


# -- stomp.py, as an application would use it -------------------------------------------------

class _StompClient(stomp.ConnectionListener):  # type: ignore[misc]
    """One stomp.py 1.2 connection: receipts awaited per batch, messages acked one by one."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = stomp.Connection12([(parts.hostname or "127.0.0.1", parts.port or 61613)],
                                       vhost=parse_qs(parts.query).get("vhost", ["/"])[0],
                                       heartbeats=(0, 0))
        self.cond = threading.Condition()
        self.pending: set[str] = set()
        self.arrived = 0
        self.errors: list[str] = []
        self.conn.set_listener("peer", self)
        self.conn.connect(parts.username or "guest", parts.password or "guest", wait=True)

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.pending.discard(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        self.conn.ack(frame.headers["ack"])
        with self.cond:
            self.arrived += 1
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame.headers.get("message", "") or str(frame.body)[:200])
            self.cond.notify_all()

    def send(self, destination: str, bodies: Sequence[bytes], ids: Sequence[str],
             batch: int, timeout: float = 60.0) -> None:
        for start in range(0, len(bodies), batch):
            with self.cond:
                for k in range(start, min(start + batch, len(bodies))):
                    self.pending.add(f"r{k}")
            for k in range(start, min(start + batch, len(bodies))):
                self.conn.send(destination, bodies[k], headers={
                    "persistent": "true", "receipt": f"r{k}", "_AMQ_DUPL_ID": ids[k]})
            self._wait(lambda: not self.pending, timeout, "receipts")

    def consume(self, destination: str, count: int, prefetch: int, grace: float,
                window: int | None = None, timeout: float = 120.0) -> tuple[float, int]:
        """Seconds until ``count`` messages arrived, and how many arrived in all.

        ``prefetch`` is in messages (ActiveMQ, RabbitMQ); ``window``, when given, is
        Artemis's ``consumer-window-size`` in bytes.
        """
        headers = {"activemq.prefetchSize": str(prefetch), "prefetch-count": str(prefetch)}
        if window is not None:
            headers["consumer-window-size"] = str(window)
        started = time.perf_counter()
        self.conn.subscribe(destination, id="peer", ack="client-individual", headers=headers)
        self._wait(lambda: self.arrived >= count, timeout, f"{count} messages")
        seconds = time.perf_counter() - started
        time.sleep(grace)
        return seconds, self.arrived

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not done():
                if self.errors:
                    raise RuntimeError(f"broker ERROR while waiting for {what}: "
                                       f"{self.errors[0]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {what} within {timeout:g} s")
                self.cond.wait(left)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.disconnect()


def _stomp_send(url: str, address: str, bodies: Sequence[bytes], ids: Sequence[str],
                batch: int) -> float:
    client = _StompClient(url)
    try:
        started = time.perf_counter()
        client.send(f"/queue/{address}", bodies, ids, batch)
        return time.perf_counter() - started
    finally:
        client.close()


def _stomp_consume(url: str, address: str, count: int, prefetch: int, grace: float,
                   window: int | None) -> tuple[float, int]:
    client = _StompClient(url)
    try:
        return client.consume(f"/queue/{address}", count, prefetch, grace, window)
    finally:
        client.close()


# -- the wrappers ---------------------------------------------------------------------------

def _guarded_send(url: str, guard: Guard, address: str, bodies: Sequence[bytes],
                  ids: Sequence[str], batch: int) -> float:
    with GuardedProducer(open_adapter(url), guard) as producer:
        started = time.perf_counter()
        for start in range(0, len(bodies), batch):
            producer.send_batch([producer.message(address, bodies[k], duplicate_id=ids[k])
                                 for k in range(start, min(start + batch, len(bodies)))])
        return time.perf_counter() - started


def _guarded_consume(url: str, guard: Guard, address: str, count: int, prefetch: int,
                     grace: float, timeout: float = 120.0) -> tuple[float, int]:
    cond = threading.Condition()
    arrived = 0

    def handler(message: Message) -> None:
        nonlocal arrived
        with cond:
            arrived += 1
            cond.notify_all()

    consumer = GuardedConsumer(open_adapter(url), address, handler, guard,
                               options=SubscribeOptions(prefetch=prefetch))
    consumer.adapter.connect()  # as the stomp.py client: connected before the clock starts
    try:
        started = time.perf_counter()
        consumer.start()
        with cond:
            if not cond.wait_for(lambda: arrived >= count, timeout):
                raise TimeoutError(f"guarded consumer got {arrived} of {count}")
        seconds = time.perf_counter() - started
        time.sleep(grace)
        with cond:
            return seconds, arrived
    finally:
        consumer.stop()


def _guarded_latency(url: str, guard: Guard, address: str, samples: int, size: int,
                     warmup: int, timeout: float = 10.0) -> list[float]:
    arrivals: queue.SimpleQueue[float] = queue.SimpleQueue()
    consumer = GuardedConsumer(open_adapter(url), address,
                               lambda message: arrivals.put(time.perf_counter()), guard,
                               options=SubscribeOptions(prefetch=1))
    body = b"x" * size
    out: list[float] = []
    with consumer, GuardedProducer(open_adapter(url), guard) as producer:
        for i in range(warmup + samples):
            started = time.perf_counter()
            producer.send(address, body, duplicate_id=f"{address}-{i}")
            try:
                arrived = arrivals.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"message {i} did not arrive within {timeout:g} s") from None
            if i >= warmup:
                out.append(arrived - started)
    return out


# -- one run ----------------------------------------------------------------------------------

def _bodies(count: int, size: int) -> list[bytes]:
    return [(b"%08d" % i).ljust(size, b"x") for i in range(count)]


def _address(phase: str) -> str:
    return f"mqguard.bench.peer.{phase}.{new_message_id()[:12]}"


@dataclass
class _Route:
    """How one path sends, consumes and measures latency."""

    send: Callable[[str, Sequence[bytes], Sequence[str]], float]
    consume: Callable[[str, int], tuple[float, int]]
    latency: Callable[[str, int, int], list[float]]


#: Bytes a message of the workload takes in Artemis's consumer window besides its body
#: (headers and properties, as Artemis encodes them): ``prefetch`` messages make
#: ``prefetch * (size + this)`` bytes.
WINDOW_OVERHEAD = 512


def _stomp_route(url: str, work: Workload, *, artemis: bool = False) -> _Route:
    # Artemis counts its STOMP prefetch in bytes (``consumer-window-size``, 10 KiB by
    # default: ~20 of these messages); it gets as many messages in flight as the others.
    window = work.prefetch * (work.size + WINDOW_OVERHEAD) if artemis else None
    return _Route(
        send=lambda address, bodies, ids: _stomp_send(url, address, bodies, ids, work.batch),
        consume=lambda address, count: _stomp_consume(url, address, count, work.prefetch,
                                                      work.grace, window),
        latency=lambda address, samples, warm: stomp_latency(url, address, samples,
                                                             work.size, warmup=warm))


def _guarded_route(url: str, guard: Guard, work: Workload) -> _Route:
    return _Route(
        send=lambda address, bodies, ids: _guarded_send(url, guard, address, bodies, ids,
                                                        work.batch),
        consume=lambda address, count: _guarded_consume(url, guard, address, count,
                                                        work.prefetch, work.grace),
        latency=lambda address, samples, warm: _guarded_latency(url, guard, address, samples,
                                                                work.size, warm))


@contextlib.contextmanager
def _routes(paths: Sequence[tuple[str, str, str]], urls: dict[str, str], store_url: str,
            work: Workload) -> Iterator[dict[str, _Route]]:
    with contextlib.ExitStack() as stack:
        routes: dict[str, _Route] = {}
        guard: Guard | None = None
        for name, broker, via in paths:
            if via in ("native", "direct"):
                routes[name] = _stomp_route(urls[broker], work, artemis=broker == "artemis")
            elif via == "sidecar":
                sidecar = stack.enter_context(running_sidecar(urls[broker], store_url,
                                                              "process"))
                routes[name] = _stomp_route(sidecar.url, work)
            else:
                if guard is None:
                    guard = stack.enter_context(bench_guard(store_url))
                routes[name] = _guarded_route(urls[broker], guard, work)
        yield routes


#: The logger of the duplicate-detection plugin, which warns once per duplicate dropped.
DUPLICATE_LOGGER = "mqguard.plugins.duplicate_detection"


@contextlib.contextmanager
def _duplicate_warnings_to_a_file() -> Iterator[None]:
    """Write the wrappers' per-duplicate warnings to a file, not the terminal, for the run:
    Artemis and the sidecar process write theirs to their log files, and a terminal is far
    slower than a file."""
    logger = logging.getLogger(DUPLICATE_LOGGER)
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-peer-log-") as tmp:
        handler = logging.FileHandler(f"{tmp}/duplicates.log")
        propagate = logger.propagate
        logger.addHandler(handler)
        logger.propagate = False
        try:
            yield
        finally:
            logger.propagate = propagate
            logger.removeHandler(handler)
            handler.close()


def run(urls: dict[str, str], brokers: Sequence[str], vias: Sequence[str], store_url: str,
        work: Workload, progress: Callable[[str], None] | None = None) -> list[PeerPath]:
    """Measure every path of :func:`path_names` (``urls``: ``artemis`` and each broker's
    STOMP URL); returns one :class:`PeerPath` per path, in that order."""
    say = progress or (lambda text: None)
    paths = path_names(brokers, vias)
    results = {name: PeerPath(name, broker, via) for name, broker, via in paths}
    bodies = _bodies(work.messages, work.size)
    runs: dict[str, dict[str, list[float]]] = {
        name: {"send_per_s": [], "consume_per_s": [], "p99_ms": []} for name, _, _ in paths}
    latencies: dict[str, list[float]] = {name: [] for name, _, _ in paths}
    with _duplicate_warnings_to_a_file(), _routes(paths, urls, store_url, work) as routes:
        if work.warmup:
            warm = _bodies(work.warmup, work.size)
            for name, _, _ in paths:
                address = _address("warmup")
                ids = [f"{address}-{k}" for k in range(len(warm))]
                routes[name].send(address, warm, ids)
                routes[name].consume(address, len(warm))
                routes[name].latency(_address("latency-warmup"),
                                     min(work.latency_samples, 500), 0)
            say(f"warmed up: {work.warmup} messages and "
                f"{min(work.latency_samples, 500)} exchanges per path")
        for round_number in range(work.rounds):
            shift = round_number % len(paths)
            for name, _, via in paths[shift:] + paths[:shift]:
                route, result = routes[name], results[name]
                address = _address("workload")
                ids = work.duplicate_ids(address)
                unique = len(set(ids))
                # A direct path detects no duplicates: all of them are there to consume.
                expected = work.messages if via == "direct" else unique
                send_s = route.send(address, bodies, ids)
                consume_s, delivered = route.consume(address, expected)
                found = route.latency(_address("latency"), work.latency_samples,
                                      min(100, work.latency_samples))
                latencies[name].extend(found)
                result.sent += work.messages
                result.unique += unique
                result.delivered += delivered
                result.duplicates_delivered += max(0, delivered - unique)
                runs[name]["send_per_s"].append(work.messages / send_s)
                runs[name]["consume_per_s"].append(expected / consume_s)
                runs[name]["p99_ms"].append(percentile(found, 99) * 1000)
                say(f"round {round_number + 1}/{work.rounds} {name}: send "
                    f"{work.messages / send_s:,.0f}/s, consume {expected / consume_s:,.0f}/s, "
                    f"p99 {percentile(found, 99) * 1000:.2f} ms"
                    + (f", {delivered - unique} duplicates delivered"
                       if delivered != unique else ""))
    for name, result in results.items():
        result.runs = runs[name]
        result.send_per_s = median(runs[name]["send_per_s"])
        result.consume_per_s = median(runs[name]["consume_per_s"])
        result.p50_ms = percentile(latencies[name], 50) * 1000
        result.p99_ms = percentile(latencies[name], 99) * 1000
    return list(results.values())
