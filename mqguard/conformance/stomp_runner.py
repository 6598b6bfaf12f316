"""Run a scenario as a plain STOMP application: against Artemis itself, or against the
mqguard sidecar in front of ActiveMQ or RabbitMQ (the client code is the same; only where a
failed delivery and the dead-letter / expiry queues are differ, see :class:`StompPlan`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from mqguard.conformance.model import (
    LONG_TTL_MS,
    SHORT_TTL_MS,
    Batch,
    Moved,
    Observation,
    Scenario,
    SendSpec,
)
from mqguard.conformance.stomp_client import Frame, StompEndpoint, StompSession

__all__ = [
    "DEFAULT_TIMING",
    "StompPlan",
    "Target",
    "Timing",
    "collect_moved",
    "collect_wait",
    "key_of",
    "moved_from",
    "run_stomp_scenario",
    "wait_out_short_ttls",
    "wire_headers",
]

FailAs = Literal["nack", "disconnect"]


@dataclass(frozen=True)
class Timing:
    """The waits of a run. A consumer is done when no message came for ``idle_s`` (plus
    twice the redelivery delay); a dead-letter or expiry queue when none came for
    ``collect_idle_s`` (see :func:`collect_wait`). ``max_deliveries`` bounds a consumer
    that never settles."""

    idle_s: float = 1.0
    #: Pause between dropping a connection and reconnecting: Artemis hands the message back
    #: asynchronously after the DISCONNECT, and a consumer back sooner may get the next one
    #: first (seen here: the redelivery position then depends on timing).
    reconnect_pause_s: float = 0.3
    collect_idle_s: float = 0.8
    #: The same for the expiry queue on RabbitMQ, when messages are expected to expire:
    #: RabbitMQ expires a message itself (at the queue head, when it gets to it) into the
    #: holding queue, and the reaper moves it from there on its next scan.
    rabbitmq_expiry_idle_s: float = 3.0
    max_deliveries: int = 60


@dataclass(frozen=True)
class Target:
    """A queue messages are moved to. ``early``: subscribed before the scenario runs, for a
    plain address that must have a queue when the move happens (Artemis drops a dead letter
    whose address has no binding); an auto-created queue is read afterwards."""

    sub_id: str
    destination: str
    early: bool


@dataclass(frozen=True)
class StompPlan:
    """How one path speaks: where the client connects, how it fails a delivery, and where
    the dead letters and expired messages of the scenario's address can be read."""

    client: StompEndpoint
    #: Where the dead-letter and expiry queues are read (the broker itself).
    collector: StompEndpoint
    fail_as: FailAs
    #: Where moved messages are read: dead letters ("dla") and expired messages ("exp").
    targets: tuple[Target, ...]
    #: The broker behind is RabbitMQ (expired messages take longer to move).
    rabbitmq: bool = False


def collect_wait(timing: Timing, scenario: Scenario, rabbitmq: bool) -> float:
    """How long a dead-letter / expiry queue must be idle before it is taken as read."""
    s = scenario.settings
    expiring = s.expiry != "none" and (s.expiry_delay >= 0 or any(
        x.ttl == "short" for b in scenario.batches for x in b.sends))
    if rabbitmq and expiring:
        return max(timing.collect_idle_s, timing.rabbitmq_expiry_idle_s)
    return timing.collect_idle_s


#: The waits used unless a caller gives others.
DEFAULT_TIMING = Timing()


def wait_out_short_ttls(scenario: Scenario, sent_ms: float) -> None:
    """Sleep until every "short" TTL (or ``expiry-delay``) of messages sent by ``sent_ms`` is
    over, with a margin, so that they are expired when the consumer starts."""
    if not any(s.ttl == "short" for b in scenario.batches for s in b.sends) \
            and scenario.settings.expiry_delay < 0:
        return
    longest = max(SHORT_TTL_MS, scenario.settings.expiry_delay)
    left = sent_ms / 1000 + (longest + 300) / 1000 - time.time()
    if left > 0:
        time.sleep(left)


def key_of(body: str) -> int | None:
    if body.startswith("m") and body[1:].isdigit():
        return int(body[1:])
    return None


def wire_headers(spec: SendSpec, now_ms: int) -> dict[str, str]:
    headers = {"persistent": "true"}
    if spec.duplicate_id:
        headers["_AMQ_DUPL_ID"] = spec.duplicate_id
    if spec.bridge_id:
        headers["_AMQ_BRIDGE_DUP"] = spec.bridge_id
    if spec.ttl != "none":
        ttl = SHORT_TTL_MS if spec.ttl == "short" else LONG_TTL_MS
        headers["expires"] = str(now_ms + ttl)
    return headers


def _send_batch(endpoint: StompEndpoint, destination: str, batch: Batch, index: int) -> str:
    session = StompSession(endpoint)
    try:
        tx = f"tx{index}" if batch.transaction != "none" else None
        if tx:
            session.begin(tx)
        ok = True
        for spec in batch.sends:
            ok = session.send(destination, spec.body, wire_headers(spec, int(time.time() * 1000)),
                              transaction=tx) and ok
            if not ok:
                break
        if tx and ok:
            ok = session.commit(tx) if batch.transaction == "commit" else session.abort(tx)
        return "ok" if ok else "error"
    finally:
        session.close()


def moved_from(frame: Frame) -> Moved | None:
    key = key_of(frame.body)
    if key is None:
        return None
    h = frame.headers
    return Moved(key, h.get("_AMQ_ORIG_ADDRESS"), h.get("_AMQ_ORIG_QUEUE"),
                 "_AMQ_ORIG_MESSAGE_ID" in h, "_AMQ_ACTUAL_EXPIRY" in h)


def collect_moved(session: StompSession, targets: dict[str, list[Moved]], idle_s: float,
                  strays: list[str]) -> None:
    """Read (and acknowledge) what the subscriptions in ``targets`` (id -> list) hold until
    none has had a message for ``idle_s``."""
    while (frame := session.next_message(idle_s)) is not None:
        sub_id = frame.headers.get("subscription", "")
        session.ack(frame)
        moved = moved_from(frame)
        if sub_id not in targets or moved is None:
            strays.append(f"{sub_id}: {frame.body[:40]!r}")
        else:
            targets[sub_id].append(moved)


def _consume(plan: StompPlan, destination: str, scenario: Scenario, timing: Timing,
             obs: Observation) -> None:
    idle = timing.idle_s + 2 * scenario.settings.redelivery_delay / 1000
    attempts: Counter[int] = Counter()
    session = StompSession(plan.client)
    session.subscribe(destination, "main")
    try:
        while len(obs.deliveries) < timing.max_deliveries:
            frame = session.next_message(idle)
            if frame is None:
                break
            key = key_of(frame.body)
            if key is None:
                obs.strays.append(f"main: {frame.body[:40]!r}")
                session.ack(frame)
                continue
            attempts[key] += 1
            obs.deliveries.append((key, attempts[key]))
            action = scenario.action(key, attempts[key])
            if action == "ack":
                session.ack(frame)
            elif action == "fail" and plan.fail_as == "nack":
                session.nack(frame)
            else:
                session.close()
                time.sleep(timing.reconnect_pause_s)
                session = StompSession(plan.client)
                session.subscribe(destination, "main")
    finally:
        session.close()


def run_stomp_scenario(plan: StompPlan, address: str, scenario: Scenario,
                       timing: Timing = DEFAULT_TIMING) -> Observation:
    """Send the scenario's batches, consume its address, then read where messages moved."""
    obs = Observation()
    destination = f"/queue/{address}"
    into = {"dla": obs.dead_letters, "exp": obs.expired}
    collector = StompSession(plan.collector)
    try:
        for target in plan.targets:
            if target.early:
                collector.subscribe(target.destination, target.sub_id, prefetch_1=False)
        for index, batch in enumerate(scenario.batches):
            obs.batches.append(_send_batch(plan.client, destination, batch, index))
        wait_out_short_ttls(scenario, time.time() * 1000)
        _consume(plan, destination, scenario, timing, obs)
        for target in plan.targets:
            if not target.early:
                collector.subscribe(target.destination, target.sub_id, prefetch_1=False)
        collect_moved(collector, {t.sub_id: into[t.sub_id] for t in plan.targets},
                      collect_wait(timing, scenario, plan.rabbitmq), obs.strays)
    finally:
        collector.close()
    return obs
