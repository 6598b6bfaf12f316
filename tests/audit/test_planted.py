"""Every anomaly class planted in synthetic logs is found, and nothing else is."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.planted import CONFIG, plant
from mqguard_tests.synthetic import Cluster

from mqguard.audit import lean
from mqguard.audit.checks import ANOMALIES, CLASSES, CheckOptions
from mqguard.audit.runner import AuditOptions, AuditResult, run_audit
from mqguard.audit.summary import read_findings
from mqguard.events import read_events

pytestmark = pytest.mark.spark


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
