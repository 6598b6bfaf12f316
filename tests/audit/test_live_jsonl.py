"""Live JSONL files converted to Parquet by pyarrow read exactly as Spark reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mqguard.audit.events import AUDIT_FIELDS, CORRUPT_COLUMN, convert_jsonl, load_events

pytestmark = pytest.mark.spark


def _event(n: int, **extra: Any) -> dict[str, Any]:
    return {"v": 1, "ts": 1_700_000_000_000 + n, "type": "sent", "node": "p",
            "address": "orders", "message_id": f"m-{n}", "reason": "x" * (n % 7),
            "unknown_field": {"nested": n}, **extra}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_only_files_pyarrow_reads_exactly_are_converted(tmp_path: Path) -> None:
    clean = _write(tmp_path / "events-a.jsonl",
                   [json.dumps(_event(n, handled=n % 2 == 0)) for n in range(50)])
    wrong_type = _write(tmp_path / "events-b.jsonl",
                        [json.dumps(_event(1)), json.dumps(_event(2, ts="soon"))])
    not_json = _write(tmp_path / "events-c.jsonl", [json.dumps(_event(1)), "not json"])
    blank = _write(tmp_path / "events-d.jsonl", [json.dumps(_event(1)), "", json.dumps(_event(2))])
    two_objects = _write(tmp_path / "events-e.jsonl",
                         [json.dumps(_event(1)) + json.dumps(_event(2))])
    half = tmp_path / "events-f.jsonl"
    half.write_text(json.dumps(_event(1)) + "\n" + '{"v": 1, "ts": 17')
    big = _write(tmp_path / "events-g.jsonl", [json.dumps(_event(n)) for n in range(200)])
    segment = tmp_path / "events-a.000001.jsonl.gz"
    segment.write_bytes(b"")
    files = [str(p) for p in (clean, wrong_type, not_json, blank, two_objects, half, big,
                              segment)]

    converted = convert_jsonl(files, str(tmp_path / "out"), max_bytes=big.stat().st_size - 1)

    assert list(converted) == [str(clean)]
    table = pq.read_table(converted[str(clean)])
    assert table.column_names == list(AUDIT_FIELDS)
    assert table.column("message_id").to_pylist() == [f"m-{n}" for n in range(50)]
    assert table.column("handled").to_pylist() == [n % 2 == 0 for n in range(50)]


def test_converted_and_spark_read_events_are_the_same(spark: Any, tmp_path: Path) -> None:
    lines = [json.dumps(_event(n, queue="q", delivery_count=n, expiration=0, delay_ms=None,
                               ack_reason="normal" if n % 3 else None,
                               target="DLA" if n % 5 == 0 else None))
             for n in range(120)]
    live = _write(tmp_path / "events-c.jsonl", lines)
    broken = _write(tmp_path / "events-d.jsonl", [*lines[:3], '{"v": 1, "ts": "x"}'])
    files = [str(live), str(broken)]

    def read(convert_dir: str | None) -> list[tuple[Any, ...]]:
        frame = load_events(spark, files, convert_dir=convert_dir)
        columns = [*AUDIT_FIELDS, CORRUPT_COLUMN, "file", "file_rank"]
        # In writing order: (file_rank, row).
        return [tuple(r) for r in frame.orderBy("file_rank", "row").select(*columns).collect()]

    by_spark = read(None)
    out = tmp_path / "converted"
    by_arrow = read(str(out))
    assert [p.name for p in out.iterdir()] == ["000000.parquet"]  # the broken file is Spark's
    assert by_arrow == by_spark
    assert len(by_spark) == 124
    assert sum(1 for r in by_spark if r[len(AUDIT_FIELDS)] is not None) == 1
    # A converted file keeps its source's name and rank.
    assert [(r[-2], r[-1]) for r in by_arrow[:120]] == [(str(live), 0)] * 120
