"""``mqguard bench audit`` at a small N: every planted finding found, nothing else.

The timing goals are the bench's (at 10 million events); this checks that the
command runs, that the generated logs carry every class, and that the Spark
audit and the DuckDB mirror agree with what was planted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqguard.audit.checks import CLASSES
from mqguard.bench.audit_data import PLANTED, count_lines, generate, plan
from mqguard.cli.bench import bench

pytestmark = pytest.mark.spark
if not os.environ.get("CI"):  # in CI the test extra brings duckdb: missing is a failure
    pytest.importorskip("duckdb")

FIELDS = ("events", "spark_s", "spark_start_s", "duckdb_s", "ratio", "planted", "found",
          "false_positives")


def test_generator_writes_exactly_n_events_with_every_class(tmp_path: Path) -> None:
    for events in (1000, 20_003):
        messages, padding = plan(events)
        data = generate(str(tmp_path / str(events)), events)
        assert count_lines(data.files) == events
        assert data.messages == messages and padding >= 0
    assert set(PLANTED) == {c.name for c in CLASSES}
    assert all(count >= 5 for count in data.planted.values()), data.planted
    lines = [json.loads(line) for f in data.files for line in Path(f).read_text().splitlines()]
    assert {e["v"] for e in lines} == {1}
    assert all(e["ts"] > 0 and e["type"] and e["node"] for e in lines)
    # Absent fields are left out, as the event log writer leaves them out.
    assert not any(value is None for e in lines for value in e.values())


def test_bench_audit_finds_every_planted_finding(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    # Segments of 256 KiB: rotated Parquet segments and live JSONL files, as the writer
    # leaves them (at 20,000 events the default 64 MiB would leave everything live).
    result = CliRunner().invoke(bench, ["audit", "--events", "20000", "--dir", str(tmp_path),
                                        "--no-html", "--segment-bytes", "262144",
                                        "--json", str(path)])
    assert result.exit_code == 0, result.output
    figures = json.loads(path.read_text())
    for field in FIELDS:
        assert field in figures, field
    assert figures["events"] == 20000
    assert figures["parquet_files"] >= 4 and figures["jsonl_bytes"] > 0
    assert figures["plan"] == "lean"
    assert figures["planted"] == sum(figures["planted_by_class"].values()) > 0
    assert set(figures["planted_by_class"]) == {c.name for c in CLASSES}
    assert figures["found"] == figures["planted"], figures["found_by_class"]
    assert figures["false_positives"] == 0
    assert figures["duckdb_found"] == figures["planted"]
    assert figures["duckdb_false_positives"] == 0
    assert figures["spark_s"] >= figures["spark_start_s"] >= 0 and figures["duckdb_s"] > 0
    assert figures["ratio"] == pytest.approx(
        (figures["spark_s"] - figures["spark_start_s"]) / figures["duckdb_s"], rel=0.01)
    # The generated logs are removed unless --keep.
    assert not list(tmp_path.glob("mqguard-bench-audit-*"))


def test_duckdb_mirror_pairs_by_fields_and_by_writing_order_alike(tmp_path: Path) -> None:
    """The DuckDB mirror's hash plan (``handled`` acks) and its writing-order plan (for
    logs without the fields) find exactly the planted findings on the same run."""
    import duckdb

    from mqguard.bench.audit import GRACE_MS, TOLERANCE_MS
    from mqguard.bench.audit_data import MAX_DELIVERY_ATTEMPTS
    from mqguard.bench.audit_duckdb import run_checks

    found = {}
    for legacy in (False, True):
        con = duckdb.connect()
        data = generate(str(tmp_path / str(legacy)), 20_000, con, legacy=legacy)
        lines = [json.loads(line) for f in data.files for line in Path(f).read_text().splitlines()]
        acked = [e for e in lines if e["type"] == "acked"]
        assert all(("handled" in e) != legacy for e in acked)
        assert legacy or all(("delivered_ts" in e) == e["handled"] for e in acked)
        run_checks(con, data.files, grace_ms=GRACE_MS, limit=MAX_DELIVERY_ATTEMPTS,
                   tolerance_ms=TOLERANCE_MS, ordered=legacy)
        planted = set(con.execute("SELECT class, message_id FROM planted").fetchall())
        found[legacy] = set(con.execute("SELECT class, message_id FROM findings").fetchall())
        assert found[legacy] == planted
        con.close()
    assert found[False] == found[True]


def test_bench_audit_incremental_finds_every_planted_finding(spark: Any, tmp_path: Path) -> None:
    """``--incremental M``: the history audited with a state, then the new segments; the
    incremental findings are the planted ones, and both timings are reported."""
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench, ["audit", "--events", "20000", "--incremental", "10000",
                                        "--segment-bytes", "262144", "--dir", str(tmp_path),
                                        "--json", str(path)])
    assert result.exit_code == 0, result.output
    figures = json.loads(path.read_text())
    assert figures["benchmark"] == "audit-incremental"
    assert figures["segments_before"] > 0 and figures["segments_new"] > 0
    assert figures["events_before"] + figures["events_new"] == 30000
    assert figures["found"] == figures["planted"] > 0 and figures["false_positives"] == 0
    assert figures["incremental_s"] > 0 and figures["fresh_s"] > 0
    assert figures["incremental_ratio"] == pytest.approx(
        figures["incremental_s"] / figures["fresh_s"], rel=0.01)
    assert not list(tmp_path.glob("mqguard-bench-incremental-*"))
