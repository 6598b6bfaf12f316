"""The fault-injection suite (issue 9): a planned mix of messages through the sidecar and the
wrappers while producers, consumers, the sidecar, ActiveMQ and Redis (AOF, appendfsync always)
are SIGKILLed and restarted at seeded random points; then the Spark audit and the clients' own
records must agree that nothing was lost, nothing was handled twice, every poison message is in
the dead-letter address and every expired one in the expiry address. docs/faults.md has the
figures and the full-size command.

``MQGUARD_FAULTS_MESSAGES`` (default 3,000, what fits CI; issue 9's full run is 100,000),
``MQGUARD_FAULTS_SEED``, ``MQGUARD_FAULTS_CHAOS_SECONDS`` (default 40) and
``MQGUARD_FAULTS_REPORT`` (a path: the figures are written there as JSON) tune it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqguard.audit.checks import ANOMALIES
from mqguard.audit.cross_checks import CROSS_CLASSES, CrossInputs
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.config import parse_config
from mqguard.demo.plan import Kind
from mqguard.message import now_ms
from mqguard.testing.chaos import COMPONENTS, LEGS, ChaosRun, ChaosSettings
from mqguard.testing.fault_workers import WINDOW, guard_config

pytestmark = [pytest.mark.faults, pytest.mark.activemq, pytest.mark.redis, pytest.mark.spark]

MESSAGES = int(os.environ.get("MQGUARD_FAULTS_MESSAGES", "3000"))
SEED = int(os.environ.get("MQGUARD_FAULTS_SEED", "20261121"))
CHAOS_SECONDS = float(os.environ.get("MQGUARD_FAULTS_CHAOS_SECONDS", "40"))
CROSS_ANOMALIES = frozenset(c.name for c in CROSS_CLASSES if c.anomaly)
#: Audit classes a kill with sends in flight causes (see the test's comment).
IN_FLIGHT_CLASSES = frozenset({"unexpected", "ring_mismatch", "rejected_without_twin"})
#: The processes between a leg's broker queue and its handler (where a delivery is settled).
CONSUMER_PATH = {"wrapped": ("consumer-wrapped",), "sidecar": ("consumer-sidecar", "sidecar")}


def test_nothing_lost_or_handled_twice_under_sigkills(spark: Any, tmp_path: Path) -> None:
    settings = ChaosSettings(messages=MESSAGES, seed=SEED, chaos_seconds=CHAOS_SECONDS,
                             deadline_seconds=max(300.0, MESSAGES / 20))
    work = tmp_path / "chaos"
    with ChaosRun(settings, work, report=print) as chaos:
        result = chaos.run()
        # Redis still runs: the audit checks its state (delivery counts, audit marks)
        # against the event log too.
        audit = run_audit(spark, AuditOptions(
            [str(work / "events")], out=str(tmp_path / "audit"),
            config=parse_config(guard_config(result.spec, "audit")), watermark=now_ms(),
            html=False, cross=CrossInputs(redis_url=chaos.redis_url)))
    summary = audit.summary
    classes = {name: entry["count"] for name, entry in summary["classes"].items()
               if entry["count"]}
    figures = result.figures()
    figures["audit"] = {"classes": classes, "anomalies": summary["anomalies"],
                        "seconds": round(summary["seconds"]["audit"], 1)}
    print(json.dumps(figures, indent=1))
    if report := os.environ.get("MQGUARD_FAULTS_REPORT"):
        Path(report).write_text(json.dumps(figures, indent=1) + "\n")

    # Every component was killed at least once (the schedule's first round covers them all).
    assert set(result.kills) == set(COMPONENTS), result.kill_log
    # The audit: nothing lost, nothing handed to a handler again after a settled handling.
    assert classes.get("lost", 0) == 0, classes
    assert classes.get("duplicated", 0) == 0, classes
    # Expected, bounded: a process killed after it put duplicate ids into the Redis ring
    # (and sent the frames) but before it wrote their outcome leaves no event of them. Their
    # deliveries are "unexpected", the ring holds ids the log never accepted
    # ("ring_mismatch"), the producer's retries are rejected without a logged twin
    # ("rejected_without_twin") -- docs/faults.md. Each is at most a window of sends per
    # kill of a process that sends to the broker, or of Redis (an id written to the AOF
    # whose reply never came back: the sender fails before it sends or writes anything).
    in_flight = WINDOW * (result.kills["producer-wrapped"] + result.kills["sidecar"]
                          + result.kills["redis"])
    for name in IN_FLIGHT_CLASSES:
        assert classes.get(name, 0) <= in_flight, (name, classes, in_flight)
    others = (ANOMALIES | CROSS_ANOMALIES) - IN_FLIGHT_CLASSES
    assert {name: n for name, n in classes.items() if name in others} == {}, classes

    for leg in LEGS:
        handled: Counter[int] = result.handled[leg]
        normal = result.planned(leg, Kind.NORMAL)
        poison = result.planned(leg, Kind.POISON)
        short = result.planned(leg, Kind.SHORT_LIVED)
        # Measured by the handlers themselves (one write per invocation). A kill between
        # the handler and the settlement (consumer-audit mark, ack) of its delivery makes
        # the broker redeliver a message that was handled: the window every at-least-once
        # consumer has (docs/consumer-audit.md). It holds at most one message per kill of
        # a process in the consumer's path, and the audit (above) saw no handling that had
        # been settled handed out again.
        twice = {i for i in normal if handled[i] > 1}
        path_kills = sum(result.kills[c] for c in CONSUMER_PATH[leg])
        assert len(twice) <= path_kills, (leg, len(twice), path_kills, sorted(twice)[:20])
        assert all(handled[i] == 2 for i in twice), leg
        assert not [i for i in short if handled[i]], (leg, "expired messages were handled")
        # Every poison message in the dead-letter address, every expired one in the
        # expiry address (read back from the broker after the run), nothing else there.
        assert set(result.dead_letters[leg]) <= poison, leg
        assert set(result.expired[leg]) <= short, leg
        missing = ({i for i in normal if not handled[i]}
                   | (poison - set(result.dead_letters[leg]))
                   | (short - set(result.expired[leg])))
        # Nothing missing: a send that failed released its duplicate id, so its retry went
        # out (docs/duplicate-detection.md, "Two-phase ids").
        assert missing == set(), (leg, sorted(missing)[:20])
