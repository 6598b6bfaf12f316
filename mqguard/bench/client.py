"""``mqguard bench client``: raw client vs guarded producer/consumer, same run.

For each broker and store, and each direction, the raw client (stomp.py or
paho-mqtt) and the guarded path do the same work — confirmed sends in
pipelined batches, individually acknowledged receives. Guarded sends carry a
unique ``_AMQ_DUPL_ID`` (raw sends carry the same: a STOMP header, an MQTT 5 user
property) so duplicate detection runs at full cost. Every built-in plugin that is enabled by default
runs on the guarded side, and the event log writes to a temporary directory,
because that is what users pay for.

Produce interleaves the two sides batch by batch within each round (raw batch,
guarded batch, guarded, raw, ... each side's time is the sum of its batches), so
both see the same machine and broker state to within a batch: on a shared,
loaded machine whole-run alternation let load swings of a few seconds decide
the ratio. Consume alternates the sides drain by drain: each side drains a
freshly preloaded queue of :data:`CONSUME_CHUNK` messages, then the other, until
every message was consumed once per side; each side's time is the sum of its
drains (subscribing included, connecting not, for both: MQTT sessions deliver on
connect, so there both sides time the connection).
The median of each side's rounds gives ``ratio = guarded_per_s / raw_per_s``.

Before the first round, ``warmup`` messages go both ways through both sides, untimed:
a broker just started (the bench starts its own) runs its first few thousand messages
several times slower while its JIT compiles (ActiveMQ's raw consume: 3.7k, 6.6k, then
~11k messages/s in three rounds), and a round inside that ramp measures the ramp.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from mqguard.adapter import SubscribeOptions
from mqguard.bench import raw
from mqguard.bench.stats import median
from mqguard.config import MqguardConfig
from mqguard.consumer import GuardedConsumer
from mqguard.message import Message, new_message_id
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter

PROTOCOL = {"activemq": "stomp", "rabbitmq": "stomp", "mosquitto": "mqtt"}
#: Consume runs alternate raw and guarded in drains of this many messages (each from a
#: freshly preloaded queue), so that both sides see the same load to within a second.
CONSUME_CHUNK = 1000


@dataclass
class ClientCase:
    broker: str
    store: str
    direction: str
    messages: int
    raw_per_s: float
    guarded_per_s: float
    ratio: float
    raw_runs: list[float]
    guarded_runs: list[float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def bench_guard(store_url: str) -> Iterator[Guard]:
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-events-") as events_dir:
        config = MqguardConfig().with_overrides(store=store_url)
        config = config.with_overrides(
            event_log=config.core.event_log.model_copy(update={"directory": events_dir}))
        with Guard(config, role="app") as guard:
            yield guard


def _bodies(count: int, size: int) -> list[bytes]:
    return [(b"%08d" % i).ljust(size, b"x") for i in range(count)]


def _produce_interleaved(protocol: str, url: str, guard: Guard, bodies: list[bytes],
                         batch: int) -> tuple[float, float]:
    """Send ``bodies`` once raw and once guarded, alternating batch by batch (and which
    side goes first); returns the seconds each side spent in its batches."""
    raw_address = f"mqguard.bench.produce.{new_message_id()[:10]}"
    address = f"mqguard.bench.produce.{new_message_id()[:10]}"
    raw_producer: raw.StompProducer | raw.MqttProducer = (
        raw.StompProducer(url, raw_address) if protocol == "stomp"
        else raw.MqttProducer(url, raw_address))
    spent = {"raw": 0.0, "guarded": 0.0}
    try:
        with GuardedProducer(open_adapter(url), guard) as producer:
            for number, start in enumerate(range(0, len(bodies), batch)):
                part = bodies[start:start + batch]
                for side in ("raw", "guarded") if number % 2 == 0 else ("guarded", "raw"):
                    started = time.perf_counter()
                    if side == "raw":
                        raw_producer.send_batch(part)
                    else:
                        # Unique duplicate ids: the duplicate_detection plugin does its full
                        # work (one check-and-add per address and part) and drops nothing.
                        producer.send_batch([
                            producer.message(address, body, duplicate_id=f"{address}-{i}")
                            for i, body in enumerate(part, start)])
                    spent[side] += time.perf_counter() - started
    finally:
        raw_producer.close()
    return spent["raw"], spent["guarded"]


def _guarded_consume(url: str, guard: Guard, address: str, count: int, prefetch: int,
                     adapter_options: dict[str, Any], *, connect_first: bool,
                     timeout: float = 120.0) -> float:
    done = threading.Event()
    seen = 0

    def handler(message: Message) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    consumer = GuardedConsumer(open_adapter(url, **adapter_options), address, handler, guard,
                               options=SubscribeOptions(prefetch=prefetch))
    if connect_first:
        # As the raw STOMP consumer: connected before the clock starts (an MQTT session
        # delivers on connect, so there both sides time the connection).
        consumer.adapter.connect()
    started = time.perf_counter()
    with consumer:
        if not done.wait(timeout):
            raise TimeoutError(f"guarded consumer got {seen} of {count}")
        return time.perf_counter() - started


def _preload(protocol: str, url: str, address: str, bodies: list[bytes], batch: int) -> None:
    if protocol == "stomp":
        raw.stomp_produce(url, address, bodies, batch)
    else:
        raw.mqtt_produce(url, address, bodies, batch)


def run_case(broker: str, url: str, store_name: str, store_url: str, direction: str,
             messages: int, size: int, batch: int, prefetch: int, rounds: int,
             warmup: int = 0) -> ClientCase:
    protocol = PROTOCOL[broker]
    bodies = _bodies(messages, size)
    raw_runs: list[float] = []
    guarded_runs: list[float] = []
    with bench_guard(store_url) as guard:
        if warmup:
            _warm_up(protocol, url, guard, direction, _bodies(warmup, size), batch, prefetch)
        for round_number in range(rounds):
            if direction == "produce":
                raw_seconds, guarded_seconds = _produce_interleaved(protocol, url, guard,
                                                                    bodies, batch)
                raw_runs.append(messages / raw_seconds)
                guarded_runs.append(messages / guarded_seconds)
                continue
            spent = {"raw": 0.0, "guarded": 0.0}
            for number, start in enumerate(range(0, messages, CONSUME_CHUNK)):
                # Alternate which side goes first so warm-up and drift favour neither.
                first_raw = (round_number + number) % 2 == 0
                for side in ("raw", "guarded") if first_raw else ("guarded", "raw"):
                    address = f"mqguard.bench.{direction}.{new_message_id()[:10]}"
                    spent[side] += _consume_side(protocol, side, url, guard, address,
                                                 bodies[start:start + CONSUME_CHUNK], batch,
                                                 prefetch)
            raw_runs.append(messages / spent["raw"])
            guarded_runs.append(messages / spent["guarded"])
    raw_rate, guarded_rate = median(raw_runs), median(guarded_runs)
    return ClientCase(broker, store_name, direction, messages, raw_rate, guarded_rate,
                      guarded_rate / raw_rate if raw_rate else 0.0, raw_runs, guarded_runs)


def _warm_up(protocol: str, url: str, guard: Guard, direction: str, bodies: list[bytes],
             batch: int, prefetch: int) -> None:
    """The case's work on ``bodies``, both sides, untimed (see the module docstring)."""
    if direction == "produce":
        _produce_interleaved(protocol, url, guard, bodies, batch)
        return
    for side in ("raw", "guarded"):
        for start in range(0, len(bodies), CONSUME_CHUNK):
            address = f"mqguard.bench.warmup.{new_message_id()[:10]}"
            _consume_side(protocol, side, url, guard, address,
                          bodies[start:start + CONSUME_CHUNK], batch, prefetch)


def _consume_side(protocol: str, side: str, url: str, guard: Guard, address: str,
                  bodies: list[bytes], batch: int, prefetch: int) -> float:
    # Queue the messages first (untimed), then time draining them.
    client_id = f"bench-{new_message_id()[:12]}"
    if protocol == "mqtt":
        # MQTT has no queues: a persistent session subscribed beforehand holds them.
        raw.mqtt_subscribe_session(url, address, client_id)
    _preload(protocol, url, address, bodies, batch)
    if side == "guarded":
        options: dict[str, Any] = {"client_id": client_id} if protocol == "mqtt" else {}
        return _guarded_consume(url, guard, address, len(bodies), prefetch, options,
                                connect_first=protocol == "stomp")
    if protocol == "stomp":
        return raw.stomp_consume(url, address, len(bodies), prefetch)
    return raw.mqtt_consume(url, address, len(bodies), client_id)
