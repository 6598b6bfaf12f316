"""``mqguard bench audit --incremental M``: an incremental audit against a fresh one.

Method, in one run and one Spark session (started untimed):

1. :mod:`mqguard.bench.audit_data` writes N + M events as the event log writes them
   (segments of ``segment_bytes`` rotated to Parquet); the live JSONL tails are
   rotated too (gzipped, as ``.jsonl.gz`` segments), as the incremental audit
   consumes rotated segments only. The segments, in the order they were written
   (by first event), are split where the first N events end: the history, then
   the new segments (about M events; every message whose events straddle the split
   stays open across it).
2. ``mqguard audit --state`` over the history (untimed), then, the new segments
   added, again: ``incremental_s``. Its findings are scored against every planted
   finding (``found``, ``false_positives``), as a full audit's would be.
3. ``fresh_s``: a fresh audit (no state) of the new segments alone.

``incremental_ratio`` = incremental_s / fresh_s (goal: at most 1.3).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from mqguard.bench.audit_data import MAX_DELIVERY_ATTEMPTS, SEGMENT_BYTES, generate

__all__ = ["GOAL", "run_incremental_bench"]

GOAL = 1.3
GRACE_MS = 5000


def _rows_and_first(path: str) -> tuple[int, int]:
    """(events, first event time) of a segment."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["ts"])
        return table.num_rows, int(table.column("ts")[0].as_py())
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        first = json.loads(handle.readline())["ts"]
        return 1 + sum(1 for _ in handle), int(first)


def _rotate_live(files: list[str]) -> list[str]:
    """The live ``.jsonl`` files gzipped as each node's last segment."""
    out = []
    for path in files:
        if path.endswith(".jsonl"):
            target = path[: -len(".jsonl")] + ".999999.jsonl.gz"
            with open(path, "rb") as source, gzip.open(target, "wb", compresslevel=1) as sink:
                shutil.copyfileobj(source, sink)
            os.unlink(path)
            path = target
        out.append(path)
    return out


def _score(con: Any, findings: str) -> tuple[int, int]:
    con.execute(f"""CREATE OR REPLACE TEMP VIEW found AS SELECT class, message_id
                    FROM read_parquet('{findings}/**/*.parquet', hive_partitioning = true)""")
    found = con.execute("""SELECT count(*) FROM planted p WHERE EXISTS (
        SELECT 1 FROM found f WHERE f.class = p.class AND f.message_id = p.message_id)
        """).fetchone()[0]
    false = con.execute("""SELECT count(*) FROM found f WHERE NOT EXISTS (
        SELECT 1 FROM planted p WHERE p.class = f.class AND p.message_id = f.message_id)
        """).fetchone()[0]
    return int(found), int(false)


def run_incremental_bench(events: int, more: int, *, workdir: str | None = None,
                          keep: bool = False, master: str = "local[*]",
                          driver_memory: str = "4g", shuffle_partitions: int | None = None,
                          conf: Mapping[str, str] | None = None,
                          segment_bytes: int = SEGMENT_BYTES,
                          progress: Callable[[str], None] = lambda text: None
                          ) -> dict[str, Any]:
    """The figures of the module doc for N = ``events`` and M = ``more``."""
    import duckdb
    from pyspark import SparkContext

    from mqguard.audit.incremental import run_incremental
    from mqguard.audit.runner import AuditOptions, run_audit
    from mqguard.audit.session import build_session
    from mqguard.bench.audit import load_average

    root = tempfile.mkdtemp(prefix="mqguard-bench-incremental-", dir=workdir)
    load_before = load_average()
    try:
        con = duckdb.connect()
        progress(f"generating {events:,} + {more:,} events")
        data = generate(os.path.join(root, "all"), events + more, con,
                        segment_bytes=segment_bytes)
        segments = sorted(((*_rows_and_first(f), f) for f in _rotate_live(data.files)),
                          key=lambda x: (x[1], x[2]))
        history: list[str] = []
        new: list[str] = []
        seen = 0
        for rows, _, path in segments:
            (history if seen < events else new).append(path)
            seen += rows
        if not history or not new:
            raise ValueError(f"{len(segments)} segment(s) cannot be split at {events:,} "
                             "events: lower --segment-bytes")
        before = sum(r for r, _, p in segments if p in history)
        inbox, fresh_dir = os.path.join(root, "inbox"), os.path.join(root, "fresh")
        os.makedirs(inbox)
        os.makedirs(fresh_dir)
        for path in history:
            os.link(path, os.path.join(inbox, os.path.basename(path)))
        for path in new:
            os.link(path, os.path.join(fresh_dir, os.path.basename(path)))

        reused = SparkContext._active_spark_context is not None
        progress("Spark: starting a session (not timed)")
        spark = build_session(master, shuffle_partitions=shuffle_partitions,
                              driver_memory=driver_memory, conf=conf,
                              log_path=os.path.join(root, "spark.log"))
        try:
            def options(inputs: str, out: str) -> AuditOptions:
                return AuditOptions(inputs=[inputs], out=os.path.join(root, out),
                                    grace_ms=GRACE_MS,
                                    max_delivery_attempts=MAX_DELIVERY_ATTEMPTS, html=False)

            state = os.path.join(root, "state")
            progress(f"Spark: auditing the history ({before:,} events, {len(history)} "
                     "segments; not timed)")
            run_incremental(spark, options(inbox, "out-history"), state)
            for path in new:
                os.link(path, os.path.join(inbox, os.path.basename(path)))
            progress(f"Spark: incremental audit of {len(new)} new segments")
            started = time.perf_counter()
            result = run_incremental(spark, options(inbox, "out-incremental"), state)
            incremental_s = time.perf_counter() - started
            progress("Spark: fresh audit of the new segments alone")
            started = time.perf_counter()
            run_audit(spark, options(fresh_dir, "out-fresh"))
            fresh_s = time.perf_counter() - started
        finally:
            if not reused:
                spark.stop()
        found, false_positives = _score(con, os.path.join(root, "out-incremental", "findings"))
        con.close()
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    planted = sum(data.planted.values())
    ratio = incremental_s / fresh_s if fresh_s > 0 else None
    return {
        "events": events + more,
        "events_before": before,
        "events_new": events + more - before,
        "segments_before": len(history),
        "segments_new": len(new),
        "incremental_s": round(incremental_s, 3),
        "fresh_s": round(fresh_s, 3),
        "incremental_ratio": round(ratio, 3) if ratio is not None else None,
        "open_events": result.summary["incremental"]["open_events"],
        "reopened_messages": result.summary["incremental"]["reopened_messages"],
        "files_read_again": result.summary["incremental"]["files_read_again"],
        "incremental_stages_s": result.summary["incremental"]["seconds"],
        "planted": planted,
        "found": found,
        "false_positives": false_positives,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "workdir": root if keep else None,
        "goals": {"incremental_ratio": GOAL, "found": "== planted", "false_positives": 0},
        "met": {"incremental_ratio": ratio is not None and ratio <= GOAL,
                "found": found == planted, "false_positives": false_positives == 0},
    }
