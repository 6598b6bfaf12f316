"""``mqguard bench audit``: the Spark audit on N synthetic events against DuckDB.

Method, in one run:

1. :mod:`mqguard.bench.audit_data` writes N events (default 10 million) as the
   event log writes them -- per node, in writing order, segments of the writer's
   rotation size (64 MiB of JSONL) rotated to Parquet and the rest in the live JSONL
   file (``segment_bytes`` 0: one JSONL file per node) -- with one
   message of every finding class planted in every 1,000 (lost, unexpected,
   duplicated, over_delivered, early_dead_letter, dead_letter_not_moved,
   expiry_not_moved, late_delivery, and the reported classes unseen, recovered,
   indeterminate, unguarded) and legitimate look-alikes that must not be flagged
   (retries, proper dead letters and expiries, suppressed duplicates).
2. ``spark_s``: a fresh local SparkSession (``spark_start_s``) and exactly what
   ``mqguard audit`` runs (:func:`mqguard.audit.runner.run_audit`: findings
   written as Parquet, summary; the HTML report too unless ``--no-html``). The
   session starts from the JVM class-data archive as ``mqguard audit`` does once
   ``mqguard audit --prepare`` made it (:mod:`mqguard.audit.class_archive`); the
   bench makes it first when missing, untimed (``class_archive``: created, reused
   or off; ``class_archive_s``: the making).
3. ``duckdb_s``: the same checks on the same files in DuckDB
   (:mod:`mqguard.bench.audit_duckdb`), findings written as Parquet.
4. ``found`` / ``false_positives``: Spark's findings joined with the planted
   (class, message id) pairs; DuckDB's are reported the same way
   (``duckdb_found``, ``duckdb_false_positives``) as a cross-check of the plan.

``ratio`` = (spark_s - spark_start_s) / duckdb_s. Load averages before and after
are reported: the machine may be shared.

On a cluster (``master`` any Spark URL; or ``workers`` N: a standalone master and N
workers started on loopback for the run, :mod:`mqguard.servers.spark`, untimed,
``cluster_start_s``) the same audit runs with the cluster's executors; the events are
the same for the same N, so runs with 1 and 2 workers compare directly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from mqguard.bench.audit_data import MAX_DELIVERY_ATTEMPTS, SEGMENT_BYTES, generate
from mqguard.servers.handle import ServerHandle

GOALS = {"spark_s": 45.0, "ratio": 2.5}
GRACE_MS = 5000
TOLERANCE_MS = 1000


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _score(con: Any, table: str) -> tuple[int, int, dict[str, int]]:
    """(found, false positives, found per class) of findings ``table`` against ``planted``."""
    found = dict(con.execute(f"""
        SELECT p.class, count(*) FROM planted p
        WHERE EXISTS (SELECT 1 FROM {table} f
                      WHERE f.class = p.class AND f.message_id = p.message_id)
        GROUP BY p.class""").fetchall())
    false = con.execute(f"""
        SELECT count(*) FROM {table} f
        WHERE NOT EXISTS (SELECT 1 FROM planted p
                          WHERE p.class = f.class AND p.message_id = f.message_id)
    """).fetchone()[0]
    return int(sum(found.values())), int(false), {k: int(v) for k, v in found.items()}


def _class_archive(wanted: bool, progress: Callable[[str], None]
                   ) -> tuple[str, float | None]:
    """("off" | "reused" | "created", seconds the making took) -- made before the
    timed part: once per machine, JDK and PySpark version, like an install step."""
    from mqguard.audit import class_archive

    if not wanted or not class_archive.enabled():
        return "off", None
    if class_archive.java_options() is not None:
        return "reused", None
    progress("making the JVM class-data archive (once per machine; not timed)")
    return "created", round(class_archive.create(), 3)


def _executor_memory(worker_memory: str) -> str:
    """Most of a worker's memory for its one executor (Spark's 1 GB default wastes a 2 GB
    worker); the rest is the JVM's overhead beyond the heap."""
    units = {"m": 1, "g": 1024}
    text = worker_memory.strip().lower().removesuffix("b")
    if not text or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"worker memory {worker_memory!r} is not like 512m or 2g")
    megabytes = int(text[:-1]) * units[text[-1]]
    return f"{max(512, megabytes * 3 // 4)}m"


def run(events: int, *, workdir: str | None = None, keep: bool = False,
        master: str = "local[*]", driver_memory: str = "4g",
        shuffle_partitions: int | None = None, conf: Mapping[str, str] | None = None,
        html: bool = True, segment_bytes: int = SEGMENT_BYTES, class_archive: bool = True,
        workers: int | None = None, worker_cores: int = 1, worker_memory: str = "2g",
        progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Generate, audit with Spark and DuckDB, score; the figures (see module doc).

    ``workers``: start a loopback standalone cluster of that many workers
    (``worker_cores`` and ``worker_memory`` each) and audit on it instead of ``master``.
    """
    import duckdb
    from pyspark import SparkContext

    from mqguard.audit.runner import AuditOptions, run_audit
    from mqguard.audit.session import build_session, is_local
    from mqguard.bench.audit_duckdb import run_checks

    root = tempfile.mkdtemp(prefix="mqguard-bench-audit-", dir=workdir)
    logs, spark_out = os.path.join(root, "events"), os.path.join(root, "spark-out")
    duck_out = os.path.join(root, "duckdb-findings.parquet")
    load_before = load_average()
    cluster: ServerHandle | None = None
    cluster_start_s: float | None = None
    try:
        con = duckdb.connect()
        progress(f"generating {events:,} events")
        started = time.perf_counter()
        data = generate(logs, events, con, segment_bytes=segment_bytes)
        generate_s = time.perf_counter() - started
        jsonl_bytes = sum(os.path.getsize(f) for f in data.files if f.endswith(".jsonl"))

        if workers:
            from mqguard.servers.spark import start_spark_cluster

            progress(f"starting a Spark master and {workers} worker(s) on loopback (not timed)")
            started = time.perf_counter()
            cluster = start_spark_cluster(os.path.join(root, "cluster"), workers=workers,
                                          worker_cores=worker_cores,
                                          worker_memory=worker_memory)
            cluster_start_s = time.perf_counter() - started
            master = cluster.urls["master"]
            conf = {"spark.executor.memory": _executor_memory(worker_memory), **(conf or {})}
        # A session already running in this process (a test's) is used, not stopped.
        reused = SparkContext._active_spark_context is not None
        archive_state, archive_s = _class_archive(class_archive and not reused
                                                  and is_local(master), progress)
        progress(f"Spark: starting a session ({master})")
        started = time.perf_counter()
        spark = build_session(master, shuffle_partitions=shuffle_partitions,
                              driver_memory=driver_memory, conf=conf,
                              log_path=os.path.join(root, "spark.log"),
                              class_archive=class_archive)
        spark_start_s = time.perf_counter() - started
        try:
            progress("Spark: auditing")
            result = run_audit(spark, AuditOptions(
                inputs=[logs], out=spark_out, grace_ms=GRACE_MS,
                max_delivery_attempts=MAX_DELIVERY_ATTEMPTS, html=html))
            spark_s = time.perf_counter() - started
        finally:
            if not reused:
                spark.stop()

        progress("DuckDB: the same checks")
        duck = duckdb.connect()
        started = time.perf_counter()
        run_checks(duck, data.files, fmt="mixed", grace_ms=GRACE_MS,
                   limit=MAX_DELIVERY_ATTEMPTS,
                   tolerance_ms=TOLERANCE_MS, out=duck_out)
        duckdb_s = time.perf_counter() - started
        duck.close()

        progress("scoring")
        findings = os.path.join(spark_out, "findings")
        con.execute(f"""CREATE TEMP VIEW spark_findings AS SELECT class, message_id
                        FROM read_parquet('{findings}/**/*.parquet', hive_partitioning = true)""")
        con.execute(f"CREATE TEMP VIEW duck_findings AS SELECT * FROM read_parquet('{duck_out}')")
        found, false_positives, found_by_class = _score(con, "spark_findings")
        duck_found, duck_false, _ = _score(con, "duck_findings")
        con.close()
    finally:
        if cluster is not None:
            cluster.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    planted = sum(data.planted.values())
    ratio = (spark_s - spark_start_s) / duckdb_s if duckdb_s > 0 else None
    return {
        "events": result.summary["events"],
        "spark_s": round(spark_s, 3),
        "spark_start_s": round(spark_start_s, 3),
        "duckdb_s": round(duckdb_s, 3),
        "ratio": round(ratio, 3) if ratio is not None else None,
        "planted": planted,
        "found": found,
        "false_positives": false_positives,
        "duckdb_found": duck_found,
        "duckdb_false_positives": duck_false,
        "planted_by_class": data.planted,
        "found_by_class": {k: found_by_class.get(k, 0) for k in data.planted},
        "generate_s": round(generate_s, 3),
        "audit_seconds": result.summary["seconds"],
        "messages": data.messages,
        "files": len(data.files),
        "bytes": data.bytes,
        "format": ("rotated Parquet segments + live JSONL" if segment_bytes else "jsonl"),
        "segment_bytes": segment_bytes,
        "parquet_files": sum(1 for f in data.files if f.endswith(".parquet")),
        "jsonl_bytes": jsonl_bytes,
        "plan": result.summary.get("plan"),
        "html": html,
        "spark_session_reused": reused,
        "master": "loopback cluster" if workers else master,
        "workers": workers,
        "worker_cores": worker_cores if workers else None,
        "cluster_start_s": round(cluster_start_s, 3) if cluster_start_s is not None else None,
        "class_archive": archive_state,
        "class_archive_s": archive_s,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "workdir": root if keep else None,
        "goals": {**GOALS, "found": "== planted", "false_positives": 0},
        "met": {"spark_s": spark_s <= GOALS["spark_s"],
                "ratio": ratio is not None and ratio <= GOALS["ratio"],
                "found": found == planted, "false_positives": false_positives == 0},
    }
