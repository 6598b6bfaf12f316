"""Differential conformance on real servers: generated scenarios run on Apache ActiveMQ
Artemis 2.40 (over STOMP, its own duplicate detection and address settings) and through
mqguard in front of ActiveMQ and RabbitMQ (sidecar and wrappers); what an application
observes must agree, or differ only as docs/artemis-compat.md says.

Tolerances (also in :mod:`mqguard.conformance.compare`): timestamps, message ids and the
values of ``_AMQ_ORIG_MESSAGE_ID`` / ``_AMQ_ACTUAL_EXPIRY`` are not compared (only that they
are there); the order inside a dead-letter or expiry queue is not compared; a delayed
redelivery must come, not at a given time; a consumer is done after 1 s (plus twice the
redelivery delay) without a message; a "short" TTL (300 ms) is waited out plus 300 ms before
consuming; an expiry queue on RabbitMQ is read until idle for 3 s when messages expire.
``mqguard conformance --examples N`` runs more.

The deviation tests pin each documented difference on Artemis and on mqguard side by side.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqguard.config import parse_config
from mqguard.conformance.generator import generate
from mqguard.conformance.model import Batch, Scenario, SendSpec, Settings
from mqguard.conformance.paths import (
    ADDRESS_PREFIX,
    ConformancePath,
    artemis_path,
    prepare_rabbitmq,
    sidecar_path,
    wrapper_path,
)
from mqguard.conformance.runner import run_scenarios
from mqguard.conformance.stomp_client import StompEndpoint, StompSession
from mqguard.servers import ServerHandle, rabbitmqctl, reload_artemis_config
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

pytestmark = [pytest.mark.artemis, pytest.mark.activemq, pytest.mark.rabbitmq]

#: The bounded CI subset: this many scenarios from this seed (the seed's scenarios cover
#: failures, disconnects, both transaction outcomes, duplicate ids, TTLs, dead-letter and
#: expiry targets; the test checks that they do).
CI_EXAMPLES = 5
CI_SEED = 0


@pytest.fixture
def artemis(mqguard_artemis_server: ServerHandle) -> Iterator[ServerHandle]:
    yield mqguard_artemis_server
    reload_artemis_config(mqguard_artemis_server, None)  # the session broker's defaults


@pytest.fixture
def rabbitmq(mqguard_rabbitmq_server: ServerHandle) -> Iterator[ServerHandle]:
    prepare_rabbitmq(mqguard_rabbitmq_server, mqguard_rabbitmq_server.urls["stomp"])
    yield mqguard_rabbitmq_server
    rabbitmqctl(mqguard_rabbitmq_server, "clear_policy", "mqguard-conformance-expiry")


@pytest.fixture
def paths(artemis: ServerHandle, mqguard_activemq_server: ServerHandle,
          rabbitmq: ServerHandle, tmp_path: Path) -> list[ConformancePath]:
    amq, rmq = mqguard_activemq_server.urls["stomp"], rabbitmq.urls["stomp"]
    return [artemis_path(artemis),
            sidecar_path("activemq", amq, workdir=tmp_path),
            sidecar_path("rabbitmq", rmq, workdir=tmp_path),
            wrapper_path("activemq", amq, workdir=tmp_path),
            wrapper_path("rabbitmq", rmq, workdir=tmp_path)]


def _by_name(paths: list[ConformancePath], *names: str) -> list[ConformancePath]:
    return [p for p in paths if p.name in names]


def test_generated_scenarios_agree_with_artemis_or_a_documented_deviation(
        paths: list[ConformancePath]) -> None:
    scenarios = generate(CI_EXAMPLES, CI_SEED)
    used = set().union(*(s.uses for s in scenarios))
    assert {"fail", "disconnect", "tx-commit", "tx-abort", "duplicate-id", "ttl-short"} <= used
    results = run_scenarios(scenarios, paths)
    undocumented = [(r.index, d) for r in results for d in r.undocumented]
    assert not undocumented, "\n".join(f"scenario {i}: {d.kind} on {d.path}: {d.detail}"
                                       for i, d in undocumented)
    assert sum(r.reference == "artemis" for r in results) >= CI_EXAMPLES - 2
    # Something was observed: the comparison is not between empty runs.
    assert any(obs.dead_letters for r in results for obs in r.observations.values())
    assert any(obs.expired for r in results for obs in r.observations.values())
    assert all(len(obs.deliveries) > 0 for r in results for obs in r.observations.values()
               if any(b == "ok" for b in obs.batches))


def _name(tag: str) -> str:
    return f"{ADDRESS_PREFIX}{tag}.{time.time_ns() % 10**12}"


def test_deviation_a_stomp_nack_is_a_failed_delivery(
        artemis: ServerHandle, paths: list[ConformancePath]) -> None:
    """Artemis 2.40 takes a STOMP NACK for an ACK: the message is gone, neither redelivered
    nor dead-lettered. mqguard counts it as a failed delivery (what Artemis does for a
    cancelled delivery): redelivered, then dead-lettered at max-delivery-attempts."""
    address = _name("nack")
    reload_artemis_config(artemis, parse_config({"address-settings": {address: {
        "max-delivery-attempts": 2, "dead-letter-address": f"{address}.DLA"}}}))
    endpoint = StompEndpoint("127.0.0.1", artemis.port("stomp"))
    dla = StompSession(endpoint)
    dla.subscribe(f"/queue/{address}.DLA", "dla")
    session = StompSession(endpoint)
    try:
        assert session.send(f"/queue/{address}", "m1", {"persistent": "true"})
        session.subscribe(f"/queue/{address}", "main")
        frame = session.next_message(5.0)
        assert frame is not None and frame.body == "m1"
        session.nack(frame)
        assert session.next_message(1.5) is None  # not redelivered ...
        assert dla.next_message(0.5) is None      # ... nor dead-lettered
    finally:
        session.close()
        dla.close()

    # The same as a scenario whose consumer NACKs every delivery, through the sidecar.
    nacking = Scenario(Settings(max_delivery_attempts=2, dead_letter="address"),
                       (Batch((SendSpec(1),)),), ((1, ("fail", "fail")),))
    for path in _by_name(paths, "sidecar-activemq", "sidecar-rabbitmq"):
        obs = path.run(nacking, _name(path.name.replace("-", "")))
        assert obs.deliveries == [(1, 1), (1, 2)], path.name
        assert [m.key for m in obs.dead_letters] == [1], path.name


def test_deviation_a_text_bridge_id_over_stomp(
        artemis: ServerHandle, paths: list[ConformancePath]) -> None:
    """Artemis reads ``_AMQ_BRIDGE_DUP`` as bytes; a STOMP header is text, so the SEND is
    refused (ERROR AMQ339011). mqguard takes the text id and checks it."""
    session = StompSession(StompEndpoint("127.0.0.1", artemis.port("stomp")), timeout=5.0)
    try:
        assert not session.send(f"/queue/{_name('bridge')}", "m1", {"_AMQ_BRIDGE_DUP": "x"})
        assert session.failed
    finally:
        session.close()
    twice = Scenario(Settings(), (Batch((SendSpec(1, bridge_id="x"),
                                         SendSpec(2, bridge_id="x"))),))
    for path in _by_name(paths, "sidecar-activemq", "sidecar-rabbitmq", "wrapper-activemq"):
        obs = path.run(twice, _name(path.name.replace("-", "")))
        assert obs.batches == ["ok"] and obs.deliveries == [(1, 1)], path.name


def test_deviation_activemq_redelivers_at_the_back(paths: list[ConformancePath]) -> None:
    """Artemis gives a failed message back at the head of the queue; mqguard on ActiveMQ
    redelivers through a copy, which joins the back. RabbitMQ keeps the head position."""
    scenario = Scenario(Settings(max_delivery_attempts=3),
                        (Batch((SendSpec(1), SendSpec(2), SendSpec(3))),),
                        ((1, ("fail", "ack")),))
    seen = {p.name: p.run(scenario, _name(p.name.replace("-", ""))).deliveries
            for p in _by_name(paths, "artemis", "sidecar-activemq", "wrapper-activemq",
                              "sidecar-rabbitmq", "wrapper-rabbitmq")}
    head = [(1, 1), (1, 2), (2, 1), (3, 1)]
    back = [(1, 1), (2, 1), (3, 1), (1, 2)]
    assert seen == {"artemis": head, "sidecar-activemq": back, "wrapper-activemq": back,
                    "sidecar-rabbitmq": head, "wrapper-rabbitmq": head}


def test_deviation_rabbitmq_receipt_of_a_transactional_send_comes_at_commit(
        rabbitmq: ServerHandle, artemis: ServerHandle, tmp_path: Path) -> None:
    """RabbitMQ answers the RECEIPT of a SEND inside a transaction only at COMMIT; Artemis
    (and ActiveMQ) at once. The sidecar passes RabbitMQ's behaviour through."""
    config = parse_config({"mqguard": {"store": "memory",
                                       "event-log": {"directory": str(tmp_path)}}})
    sidecar = Sidecar(config, parse_upstream(rabbitmq.urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        for endpoint, at_once in (
                (StompEndpoint("127.0.0.1", artemis.port("stomp")), True),
                (StompEndpoint("127.0.0.1", running.port, "guest", "guest"), False)):
            session = StompSession(endpoint, timeout=1.0)
            try:
                session.begin("t")
                receipt = "in-tx"
                session.send_frame(f"/queue/{_name('txr')}", "m1",
                                   {"transaction": "t", "receipt": receipt})
                assert session.wait_receipt(receipt) is at_once
                assert session.commit("t")
                assert session.wait_receipt(receipt)
            finally:
                session.close()
