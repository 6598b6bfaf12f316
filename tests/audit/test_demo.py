"""``mqguard demo`` end to end: real ActiveMQ (or RabbitMQ), Mosquitto and Redis, the sidecar,
the MQTT sidecar, the failover, the audit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqguard.cli import main
from mqguard.cli.demo import BROKERS, MAX_DELIVERY_ATTEMPTS, demo
from mqguard.demo.mqtt_leg import sent_by_device
from mqguard.demo.plan import DemoPlan, Kind, expected_fates
from mqguard.events import read_events

pytestmark = [pytest.mark.redis, pytest.mark.spark, pytest.mark.mosquitto]


def test_the_brokers_tested_are_those_the_demo_offers() -> None:
    # BROKERS below parametrises the end-to-end test: it must be what --broker accepts.
    (option,) = [p for p in demo.params if p.name == "broker"]
    assert tuple(option.type.choices) == BROKERS == ("activemq", "rabbitmq")  # type: ignore[attr-defined]


@pytest.mark.parametrize("broker", [pytest.param(b, marks=getattr(pytest.mark, b))
                                    for b in BROKERS])
def test_demo_meets_every_planned_fate_and_audits_clean(
        broker: str, spark: Any, mqguard_redis_server: Any, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    # ActiveMQ: the shared test brokers, given with --url and --mqtt. RabbitMQ: as a new
    # user runs it, without URLs, so the demo starts its own broker and Mosquitto and sets
    # the expiry policy that RabbitMQ needs (a --url broker is told how to set it: see the
    # next test).
    url = (["--url", request.getfixturevalue("mqguard_activemq_server").urls["stomp"],
            "--mqtt", request.getfixturevalue("mqguard_mosquitto_server").urls["mqtt"]]
           if broker == "activemq" else [])
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, [
        "demo", "--broker", broker, *url,
        "--redis", mqguard_redis_server.urls["redis"], "-n", "60", "--out", str(out),
        "--timeout", "120"])
    assert result.exit_code == 0, (result.output, _log_tail(out))
    assert "every message met its planned fate" in result.output
    summary = json.loads((out / "audit" / "summary.json").read_text())
    assert summary["anomalies"] == 0, summary
    assert (out / "audit" / "report.html").stat().st_size > 1000
    # The event log agrees with the plan, per address (sidecars and wrappers alike).
    plan = DemoPlan(60)
    events = list(read_events(out / "events"))
    for leg in ("orders", "payments", "devices"):
        want = expected_fates(plan.messages_for(leg))
        # Distinct messages: a move whose ack was lost in the failover is made again on
        # redelivery (at least once), so events may repeat for one message.
        mine = Counter(kind for kind, _ in {
            (e["type"], e.get("message_id")) for e in events
            if str(e.get("address", "")).endswith(f".{leg}")})
        assert mine["duplicate_rejected"] == want["duplicate_rejected"], (leg, mine)
        assert mine["dead_lettered"] == want["dead_lettered"], (leg, mine)
        assert mine["expired"] == want["expired"], (leg, mine)
    # The injected failover happened and the consumer audit absorbed its redeliveries.
    suppressed = [e for e in events if e["type"] == "duplicate_delivery_suppressed"]
    assert len(suppressed) >= 10
    _assert_mqtt_leg(plan, events, summary, result.output, own_mosquitto=not url)


def _assert_mqtt_leg(plan: DemoPlan, events: list[dict[str, Any]], summary: dict[str, Any],
                     output: str, *, own_mosquitto: bool) -> None:
    """The MQTT leg: the device's copies rejected by content, the poison messages failed
    by dropped sessions up to the limit, and the audit's own line for the address."""
    planned = plan.messages_for("devices")
    devices = [e for e in events if str(e.get("address", "")).endswith(".devices")]
    rejected = {e["duplicate_id"] for e in devices if e["type"] == "duplicate_rejected"}
    by_device = sum(1 for p in planned if p.resent and sent_by_device(p))
    assert by_device and sum(1 for r in rejected if r.startswith("content:")) == by_device
    assert len(rejected) == expected_fates(planned)["duplicate_rejected"]
    # Each poison message: its deliveries failed by the dropped sessions, dead-lettered at
    # the limit. (A message the broker pushed to a connection whose subscriber was gone is
    # withheld, and its redelivery counts as a second delivery: a poison message right
    # behind another may need one failure less.)
    poison = sum(1 for p in planned if p.kind is Kind.POISON)
    gone = [e for e in devices if e["type"] == "handler_failed"]
    assert poison * (MAX_DELIVERY_ATTEMPTS - 1) <= len(gone) <= poison * MAX_DELIVERY_ATTEMPTS
    assert all(e["reason"].startswith("SubscriberGone") for e in gone), gone[0]
    dead = [e for e in devices if e["type"] == "dead_lettered"]
    assert len({e["message_id"] for e in dead}) == poison
    assert all(e["delivery_count"] == MAX_DELIVERY_ATTEMPTS for e in dead), dead
    # The audit read the MQTT traffic: sends and deliveries paired (a 3.1.1 device's
    # under their content ids), every message with a fate, and the log of a Mosquitto the
    # demo started judged.
    (address,) = [a for a in summary["addresses"] if a.startswith("demo.")
                  and a.endswith(".devices")]
    figures = summary["addresses"][address]
    assert figures["sent"] == figures["with_fate"] == len(planned), figures
    assert not any(entry["by_address"].get(address) for entry in summary["classes"].values()
                   if entry["anomaly"])
    if own_mosquitto:
        assert any("mosquitto" in path for path in summary["broker_logs"]["judged_by"])
    assert "what the audit saw" in output and "│ devices " in output


@pytest.mark.rabbitmq
def test_demo_on_a_given_rabbitmq_names_the_policy_it_needs(
        mqguard_rabbitmq_server: Any, mqguard_redis_server: Any, tmp_path: Path) -> None:
    """With --url the demo cannot set the expiry policy: it says which one, and with it set
    (as the note says), the run meets every fate."""
    from mqguard.cli.demo import RABBITMQ_POLICY
    from mqguard.servers.rabbitmq import rabbitmqctl

    out = tmp_path / "demo"
    rabbitmqctl(mqguard_rabbitmq_server, "set_policy", "--apply-to", "queues", *RABBITMQ_POLICY)
    try:
        result = CliRunner().invoke(main, [
            "demo", "--broker", "rabbitmq", "--url", mqguard_rabbitmq_server.urls["stomp"],
            "--redis", mqguard_redis_server.urls["redis"], "-n", "20", "--out", str(out),
            "--timeout", "60", "--no-audit"])  # the smallest run --help allows
    finally:
        rabbitmqctl(mqguard_rabbitmq_server, "clear_policy", RABBITMQ_POLICY[0])
    assert result.exit_code == 0, (result.output, _log_tail(out))
    text = " ".join(result.output.split())
    assert "rabbitmqctl set_policy --apply-to queues 'mqguard-demo-expiry'" in text
    assert "every message met its planned fate" in text


def test_demo_refuses_an_output_directory_with_old_events(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "old.jsonl").write_text("{}\n")
    result = CliRunner().invoke(main, ["demo", "--out", str(tmp_path), "--no-audit"])
    assert result.exit_code == 2
    assert "earlier run's events" in result.output


def test_demo_refuses_an_mqtt_url_of_another_scheme(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--mqtt", "stomp://127.0.0.1:1", "--out",
                                       str(tmp_path), "--no-audit"])
    assert result.exit_code == 2
    assert "--mqtt" in result.output and "mqtt://HOST:PORT" in result.output


def _log_tail(out: Path) -> str:
    log = out / "demo.log"
    return log.read_text()[-3000:] if log.exists() else "(no demo.log)"
