"""Run a scenario through the wrappers: ``GuardedProducer`` sends, ``GuardedConsumer``
consumes with a handler that returns (ack) or raises :class:`~mqguard.errors.Nack` (fail)."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mqguard.adapter import SubscribeOptions
from mqguard.config import parse_config
from mqguard.conformance.model import (
    LONG_TTL_MS,
    SHORT_TTL_MS,
    Batch,
    Observation,
    Scenario,
    SendSpec,
)
from mqguard.conformance.stomp_client import StompSession
from mqguard.conformance.stomp_runner import (
    DEFAULT_TIMING,
    StompPlan,
    Timing,
    collect_moved,
    collect_wait,
    key_of,
    wait_out_short_ttls,
)
from mqguard.consumer import GuardedConsumer
from mqguard.errors import MqguardError, Nack
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.reaper import ExpiryReaper
from mqguard.registry import open_adapter

__all__ = ["run_wrapper_scenario"]


class _Abort(Exception):
    """Raised inside a transaction block to abort it."""


def _send_one(producer: GuardedProducer, address: str, spec: SendSpec,
              transaction: Any = None) -> None:
    headers = {"_AMQ_BRIDGE_DUP": spec.bridge_id} if spec.bridge_id else None
    ttl = None if spec.ttl == "none" else SHORT_TTL_MS if spec.ttl == "short" else LONG_TTL_MS
    producer.send(address, spec.body, headers=headers, duplicate_id=spec.duplicate_id,
                  ttl_ms=ttl, transaction=transaction)


def _send_batch(producer: GuardedProducer, address: str, batch: Batch) -> str:
    try:
        if batch.transaction == "none":
            for spec in batch.sends:
                _send_one(producer, address, spec)
            return "ok"
        try:
            with producer.transaction() as tx:
                for spec in batch.sends:
                    _send_one(producer, address, spec, tx)
                if batch.transaction == "abort":
                    raise _Abort
        except _Abort:
            pass
        return "ok"
    except MqguardError:
        return "error"


def run_wrapper_scenario(url: str, plan: StompPlan, address: str, scenario: Scenario,
                         workdir: Path, timing: Timing = DEFAULT_TIMING) -> Observation:
    """``plan`` gives the collector endpoint and targets; its client and fail mode are not
    used (the wrappers fail a delivery by raising Nack)."""
    obs = Observation()
    config = parse_config({
        "mqguard": {"node-id": "wrapper", "store": "memory",
                    "event-log": {"directory": str(workdir / "events"),
                                  "flush-interval-ms": 50}},
        "address-settings": scenario.settings.address_settings(address)})
    into = {"dla": obs.dead_letters, "exp": obs.expired}
    collector = StompSession(plan.collector)
    with Guard(config) as guard:
        try:
            for target in plan.targets:
                if target.early:
                    collector.subscribe(target.destination, target.sub_id, prefetch_1=False)
            with GuardedProducer(open_adapter(url), guard) as producer:
                for batch in scenario.batches:
                    obs.batches.append(_send_batch(producer, address, batch))
            wait_out_short_ttls(scenario, time.time() * 1000)
            _consume(url, address, scenario, guard, timing, obs)
            _reap_once(url, address, guard)
            for target in plan.targets:
                if not target.early:
                    collector.subscribe(target.destination, target.sub_id, prefetch_1=False)
            collect_moved(collector, {t.sub_id: into[t.sub_id] for t in plan.targets},
                          collect_wait(timing, scenario, plan.rabbitmq), obs.strays)
        finally:
            collector.close()
    return obs


def _reap_once(url: str, address: str, guard: Guard) -> None:
    # What `mqguard reap` does: messages that expired at rest (RabbitMQ expires them
    # itself, into a holding queue) are moved to the expiry target.
    adapter = open_adapter(url)
    adapter.connect()
    try:
        ExpiryReaper(guard, adapter, [address]).scan()
    finally:
        adapter.close()


def _consume(url: str, address: str, scenario: Scenario, guard: Guard, timing: Timing,
             obs: Observation) -> None:
    idle = timing.idle_s + 2 * scenario.settings.redelivery_delay / 1000
    attempts: Counter[int] = Counter()
    seen: queue.Queue[int] = queue.Queue()
    lock = threading.Lock()

    def handle(message: Message) -> None:
        body = message.body.decode() if isinstance(message.body, bytes) else str(message.body)
        key = key_of(body)
        if key is None:
            obs.strays.append(f"main: {body[:40]!r}")
            return
        with lock:
            attempts[key] += 1
            attempt = attempts[key]
            obs.deliveries.append((key, attempt))
        seen.put(key)
        if scenario.action(key, attempt) != "ack":
            raise Nack("conformance scenario: fail")

    with GuardedConsumer(open_adapter(url), address, handle, guard,
                         options=SubscribeOptions(prefetch=1)):
        while len(obs.deliveries) < timing.max_deliveries:
            try:
                seen.get(timeout=idle)
            except queue.Empty:
                break
