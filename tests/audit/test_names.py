"""The names pass without Spark: pyarrow's answer equals Spark's over the same events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqguard.audit import lean
from mqguard.audit.events import AuditInputError, load_event_inputs
from mqguard.audit.footers import parquet_names
from mqguard.events import _to_parquet

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def _event(n: int, **extra: Any) -> dict[str, Any]:
    return {"v": 1, "ts": T0 + n, "type": "sent", "node": "p", "address": f"a{n % 3}",
            "message_id": f"m-{n}", **extra}


def _jsonl(path: Path, events: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + tail)
    return path


def _segment(tmp_path: Path, name: str, events: list[dict[str, Any]]) -> Path:
    source = _jsonl(tmp_path / f"{name}.src", events)
    target = tmp_path / f"{name}.parquet"
    assert _to_parquet(source, target)
    source.unlink()
    return target


def test_spark_xxhash64_is_computed_on_the_driver(spark: Any) -> None:
    from pyspark.sql import functions as F

    values = ["", "a", "orders", "/topic/prices.eu", "DLA.orders", "ü-日本-✓", "x" * 31,
              "y" * 32, "z" * 33, "w" * 200]
    frame = spark.createDataFrame([(v,) for v in values], "s string")
    by_spark = {r["s"]: r["h"] for r in frame.select("s", F.xxhash64("s").alias("h")).collect()}
    assert lean.xxhash64_strings(values) == [by_spark[v] for v in values]


def test_names_and_range_equal_sparks_over_mixed_inputs(spark: Any, tmp_path: Path) -> None:
    segment = _segment(tmp_path, "events-p.000001", [
        _event(n, target="DLA.a" if n == 4 else None) for n in range(10)])
    # Rows the audit does not count as readable must not widen the time range: their
    # file's statistics prove nothing, so its columns are read.
    invalid = _segment(tmp_path, "events-q.000001", [
        _event(20), {**_event(1, address="only-in-bad-row"), "v": 2, "ts": T0 - 500},
        {**_event(2), "type": None, "ts": T0 + 900}])
    # A Parquet file without a target column (a narrower writer): all null there.
    narrow = tmp_path / "events-r.000001.parquet"
    pq.write_table(pa.table({"v": [1], "ts": [T0 + 30], "type": ["sent"],
                             "address": ["narrow"], "message_id": ["m-r"]}), narrow)
    live = _jsonl(tmp_path / "events-p.jsonl", [_event(40, address="live")])
    # Only Spark reads this one (a value of another type): its names come from Spark.
    broken = _jsonl(tmp_path / "events-s.jsonl", [
        _event(50, address="spark-only", target="EXP.x"),
        {**_event(51), "ts": "not a number"}])
    files = [str(p) for p in (segment, invalid, narrow, live, broken)]

    inputs = load_event_inputs(spark, files, convert_dir=str(tmp_path / "converted"))

    assert set(inputs.local_parquet) >= {str(segment), str(invalid), str(narrow)}
    assert len(inputs.local_parquet) == 4  # the live file's converted copy too
    assert inputs.others is not None
    names = lean.address_names(inputs)
    truth = lean._spark_names(inputs.frame)
    assert {name for _, name in names.addresses} == truth.names
    assert (names.first_ts, names.last_ts) == (truth.first_ts, truth.last_ts)
    assert truth.names >= {"DLA.a", "only-in-bad-row", "narrow", "live", "spark-only", "EXP.x"}
    assert (truth.first_ts, truth.last_ts) == (T0, T0 + 50)
    assert dict(names.addresses) == dict(zip(lean.xxhash64_strings(sorted(truth.names)),
                                             sorted(truth.names), strict=True))


def test_parquet_names_of_statistics_and_columns_agree(tmp_path: Path) -> None:
    events = [_event(n) for n in range(100)]
    with_stats = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(events), with_stats)
    without_stats = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist(events), without_stats, write_statistics=False)
    empty = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(events).slice(0, 0), empty)

    for path in (with_stats, without_stats):
        found = parquet_names([str(path), str(empty)])
        assert found.names == {"a0", "a1", "a2"}
        assert (found.first_ts, found.last_ts) == (T0, T0 + 99)
    assert parquet_names([str(empty)]).first_ts is None
    assert parquet_names([str(tmp_path / "gone.parquet")]).names == set()


def test_an_unreadable_parquet_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "events-x.000001.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(AuditInputError, match=r"events-x\.000001\.parquet: not a readable"):
        parquet_names([str(bad)])
