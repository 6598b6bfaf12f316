"""Every anomaly class planted in synthetic logs is found, and nothing else is."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from mqguard.audit import lean
from mqguard.audit.checks import ANOMALIES, CLASSES, CheckOptions
from mqguard.audit.runner import AuditOptions, AuditResult, run_audit
from mqguard.audit.summary import read_findings
from mqguard.config import parse_config
from mqguard.events import read_events
from tests.audit.synthetic import T0, Cluster

pytestmark = pytest.mark.spark

CONFIG = parse_config({"address-settings": {
    "orders": {"max-delivery-attempts": 3, "dead-letter-address": "DLA",
               "expiry-address": "EXP"},
}})


def plant(cluster: Cluster) -> tuple[int, dict[str, set[str]]]:
    """Write a run with every class planted; returns (watermark, expected ids per class)."""
    c = cluster
    expected: dict[str, set[str]] = defaultdict(set)

    # -- lost: accepted, never terminal, while later messages on "orders" were handled.
    c.send("lost-never-delivered")
    crashed = c.send("lost-delivered-then-nothing")
    c.delivered(crashed)  # the consumer died; the broker never redelivered it
    expected["lost"] |= {"lost-never-delivered", "lost-delivered-then-nothing"}

    # -- fine: the ordinary paths.
    for n in range(5):
        c.handled(c.send(f"ok-{n}"))
    retried = c.send("ok-retried")
    c.failed(retried, count=1)
    c.failed(retried, count=2)
    c.handled(retried, count=3)
    crash = c.send("ok-crash-redelivered")
    c.delivered(crash, count=1)  # crash: no outcome, redelivered elsewhere
    c.handled(crash, node="consumer-2", count=2)
    dup = c.send("ok-duplicate-suppressed")
    c.handled(dup)
    c.suppressed(dup)
    fanout = c.send("ok-two-subscriptions", "prices")
    c.handled(fanout, queue="prices.sub-a")
    c.handled(fanout, node="consumer-2", queue="prices.sub-b")
    poison = c.send("ok-poison")
    c.failed(poison, count=1)
    c.failed(poison, count=2)
    copy = c.dead_lettered(poison, count=3)
    c.handled(copy, node="dla-consumer")  # the DLA copy consumed: not "unexpected"
    tx = [c.message("ok-tx-1"), c.message("ok-tx-2")]
    c.commit("tx-1", tx)
    for message in tx:
        c.handled(message)
    c.roll_back("tx-2", 2)  # its messages were never sent: no events, nothing to judge
    c.duplicate_rejected("ok-duplicate-rejected")  # never sent, never delivered
    c.expired(c.send("ok-expired-moved", expiration=T0 + 50))
    c.expired(c.send("ok-expired-dropped", "prices", expiration=T0 + 50), target=None)
    on_time = c.send("ok-expiring-on-time", expiration=c.clock.now_ms + 10_000)
    c.handled(on_time)

    # -- informational classes.
    recovered = c.send_failed("recovered-1")
    c.handled(recovered)
    expected["recovered"].add("recovered-1")
    c.send_failed("indeterminate-1")
    expected["indeterminate"].add("indeterminate-1")
    stranger = c.message("unguarded:0f0f")
    c.handled(stranger)
    expected["unguarded"].add("unguarded:0f0f")

    # -- anomalies.
    c.handled(c.message("unexpected-never-sent"))
    c.handled(c.duplicate_rejected("unexpected-rejected-but-delivered"))
    expected["unexpected"] |= {"unexpected-never-sent", "unexpected-rejected-but-delivered"}

    twice = c.send("duplicated-twice-handled")
    c.handled(twice)
    c.handled(twice, node="consumer-2")
    again = c.send("duplicated-delivered-after-success")
    c.handled(again)
    c.failed(again, count=2)
    logged = c.send("duplicated-audit-logged")
    c.handled(logged)
    c.logged_duplicate(logged)
    expected["duplicated"] |= {"duplicated-twice-handled", "duplicated-delivered-after-success",
                               "duplicated-audit-logged"}

    over = c.send("over-delivered")
    for count in (1, 2, 3):
        c.failed(over, count=count)
    c.handled(over, count=4)  # max-delivery-attempts of "orders" is 3
    expected["over_delivered"].add("over-delivered")

    early = c.send("early-dead-letter")
    c.dead_lettered(early, count=1)
    expected["early_dead_letter"].add("early-dead-letter")

    c.dead_lettered(c.send("dead-letter-not-moved"), moved=False)
    expected["dead_letter_not_moved"].add("dead-letter-not-moved")

    c.expired(c.send("expiry-not-moved", expiration=T0 + 50), moved=False)
    expected["expiry_not_moved"].add("expiry-not-moved")

    late = c.send("late-delivery", expiration=c.clock.now_ms + 10)
    c.clock.advance(5_000)
    c.handled(late)
    expected["late_delivery"].add("late-delivery")

    # -- unseen: in flight at the watermark.
    pending = c.send("unseen-redelivery-pending")
    c.failed(pending, delay_ms=3_600_000)
    c.send("unseen-last-on-its-address", "audit.tail")
    expected["unseen"] |= {"unseen-redelivery-pending", "unseen-last-on-its-address"}
    c.handled(c.send("ok-last"))  # the consumers got past everything above

    busy = c.send("unseen-handled-after-watermark")
    watermark = c.clock.advance(1_000)
    c.clock.advance(1_000)
    c.delivered(busy)
    expected["unseen"].add("unseen-handled-after-watermark")
    c.send("after-watermark-not-judged")  # no fate, but sent after the watermark
    c.close()
    return watermark, expected


def found_ids(spark: Any, result: AuditResult) -> dict[str, set[str]]:
    rows = read_findings(spark, str(Path(result.summary["out"]) / "findings")).collect()
    found: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        found[row["class"]].add(row["message_id"])
    return found


def test_every_planted_class_is_found_and_nothing_else(spark: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(tmp_path / "events", monkeypatch)
    watermark, expected = plant(cluster)
    out = tmp_path / "out"
    result = run_audit(spark, AuditOptions([str(tmp_path / "events")], out=str(out),
                                           config=CONFIG, watermark=watermark))

    assert found_ids(spark, result) == expected
    summary = json.loads((out / "summary.json").read_text())
    assert summary == result.summary
    assert summary["anomalies"] == sum(len(expected[name]) for name in ANOMALIES)
    assert result.exit_code == 1 and not summary["ok"]
    assert set(summary["classes"]) == {c.name for c in CLASSES}
    for name, ids in expected.items():
        entry = summary["classes"][name]
        assert entry["count"] == len(ids), name
        examples = {e for by in entry["by_address"].values() for e in by["examples"]}
        assert examples == ids, name
    assert summary["classes"]["lost"]["by_address"] == {
        "orders": {"count": 2, "examples": ["lost-never-delivered",
                                            "lost-delivered-then-nothing"]}}
    assert summary["bad_lines"] == 0 and summary["watermark"] == watermark
    assert summary["plan"] == "lean"  # the acked events say which end a handling
    assert summary["events"] == sum(1 for f in (tmp_path / "events").iterdir()
                                    for line in f.read_text().splitlines() if line)
    # One directory per class that has findings, readable on its own.
    directories = {p.name for p in (out / "findings").iterdir() if p.is_dir()}
    assert directories == {f"class={name}" for name in expected}
    lost = spark.read.parquet(str(out / "findings" / "class=lost"))
    assert {r["message_id"] for r in lost.collect()} == expected["lost"]
    over = next(r for r in lost.sparkSession.read.parquet(
        str(out / "findings" / "class=over_delivered")).collect())
    assert (over["deliveries"], over["limit"], over["queue"]) == (4, 3, "orders")


def test_rotated_parquet_segments_and_live_jsonl_give_the_same_findings(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same planted run written as the writer rotates it (Parquet segments of a few
    KiB, the rest live JSONL): every class found, nothing else, every event read once."""
    events = tmp_path / "events"
    watermark, expected = plant(Cluster(events, monkeypatch, max_bytes=4096, flush_each=True))
    assert len(list(events.glob("*.parquet"))) >= 4 and list(events.glob("*.jsonl"))
    result = run_audit(spark, AuditOptions([str(events)], out=str(tmp_path / "out"),
                                           config=CONFIG, watermark=watermark))
    assert found_ids(spark, result) == expected
    assert result.summary["plan"] == "lean"
    assert result.summary["events"] == sum(1 for _ in read_events(events))


def test_a_64_bit_key_collision_falls_back_to_string_keys(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Message ids forced onto 7 key values (as if their 64-bit hashes collided): the
    check sees it and the audit runs on the message id strings, with the same findings."""
    events = tmp_path / "events"
    watermark, expected = plant(Cluster(events, monkeypatch))
    narrow = lean.narrow

    def colliding(*args: Any, **kwargs: Any) -> Any:
        from pyspark.sql import functions as F

        rows = narrow(*args, **kwargs)
        return rows.withColumn("key", F.when(F.col("m"), F.col("key") % 7)
                               .otherwise(F.col("key")))

    monkeypatch.setattr(lean, "narrow", colliding)
    result = run_audit(spark, AuditOptions([str(events)], out=str(tmp_path / "out"),
                                           config=CONFIG, watermark=watermark))
    assert result.summary["plan"].startswith("hash (string keys")
    assert found_ids(spark, result) == expected


def test_limit_override_and_assume_drained(spark: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(tmp_path / "events", monkeypatch)
    watermark, expected = plant(cluster)
    result = run_audit(spark, AuditOptions(
        [str(tmp_path / "events")], out=str(tmp_path / "out"), config=CONFIG,
        watermark=watermark, max_delivery_attempts=10,
        checks=CheckOptions(assume_drained=True)))
    found = found_ids(spark, result)
    # 4 deliveries are within 10; every dead letter (at 1 or 3) is now early.
    assert "over_delivered" not in found
    assert found["early_dead_letter"] == {"early-dead-letter", "ok-poison", "dead-letter-not-moved"}
    # Drained: the last message of an address with no later fate is lost, not unseen.
    assert "unseen-last-on-its-address" in found["lost"]
    assert found["unseen"] == {"unseen-redelivery-pending", "unseen-handled-after-watermark"}


def test_logs_without_handled_fields_are_paired_by_writing_order(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log written before ``acked`` carried ``handled`` / ``delivered_ts`` goes through the
    writing-order plan, and both plans report the very same findings, field by field."""
    rows = {}
    for legacy in (False, True):
        name = "legacy" if legacy else "current"
        cluster = Cluster(tmp_path / name, monkeypatch, legacy=legacy)
        watermark, expected = plant(cluster)
        result = run_audit(spark, AuditOptions([str(tmp_path / name)],
                                               out=str(tmp_path / f"out-{name}"),
                                               config=CONFIG, watermark=watermark, html=False))
        assert result.summary["plan"] == ("writing order" if legacy else "lean")
        assert found_ids(spark, result) == expected
        findings = read_findings(spark, str(tmp_path / f"out-{name}" / "findings")).collect()
        rows[name] = sorted(tuple(r) for r in findings)
    assert rows["current"] == rows["legacy"]
    assert len(rows["current"]) == sum(len(ids) for ids in expected.values())
