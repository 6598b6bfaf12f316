"""``mqguard bench audit``: the Spark audit on N synthetic events vs DuckDB.

Registered on the ``bench`` group (``bench.add_command(audit)``); the method is
described in :mod:`mqguard.bench.audit`. Needs the ``spark`` and ``bench``
extras (pyspark, matplotlib, duckdb); no server.
"""

from __future__ import annotations

from typing import Any

import click

from mqguard.cli.table import environment, print_table, write_json


@click.command("audit")
@click.option("--events", type=click.IntRange(1000, 1_000_000_000), default=10_000_000,
              show_default=True, help="Synthetic events to generate and audit.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, exists=True),
              help="Where to write the event logs (default: the system temp directory; "
                   "10 million events take about 2 GB).")
@click.option("--keep", is_flag=True, help="Keep the generated logs and outputs.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--workers", type=click.IntRange(1, 64),
              help="Start a Spark standalone master and this many workers on loopback for the "
                   "run (from the installed PySpark; not timed) and audit on them instead of "
                   "--master.")
@click.option("--worker-cores", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cores of each --workers worker.")
@click.option("--worker-memory", default="2g", show_default=True,
              help="Memory of each --workers worker (its executor gets three quarters).")
@click.option("--driver-memory", default="4g", show_default=True,
              help="Driver memory of the local session.")
@click.option("--shuffle-partitions", type=click.IntRange(min=1),
              help="spark.sql.shuffle.partitions (default: the audit's, 2 per local core).")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="Any Spark setting (repeatable).")
@click.option("--no-html", is_flag=True, help="Audit without the HTML report.")
@click.option("--segment-bytes", type=click.IntRange(min=0), default=64 * 1024 * 1024,
              show_default=True,
              help="Rotate each node's log to a Parquet segment every this many bytes of "
                   "JSONL, as the event log writer does (its max-bytes default); the rest "
                   "stays in the live JSONL file. 0: one JSONL file per node.")
@click.option("--class-archive/--no-class-archive", default=True, show_default=True,
              help="Start the local session from the JVM class-data archive (mqguard audit "
                   "--prepare), making it first when missing; the making is reported "
                   "(class_archive_s), not counted in spark_s.")
@click.option("--incremental", "more", type=click.IntRange(min=1000),
              help="Instead of the DuckDB comparison: audit --events with a state "
                   "(mqguard audit --state), then about this many more events, timed "
                   "(incremental_s), against a fresh audit of those alone (fresh_s).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def audit(events: int, workdir: str | None, keep: bool, master: str, workers: int | None,
          worker_cores: int, worker_memory: str, driver_memory: str,
          shuffle_partitions: int | None, spark_conf: tuple[str, ...], no_html: bool,
          segment_bytes: int, class_archive: bool, more: int | None,
          json_path: str | None) -> None:
    """N synthetic events with every finding class planted: Spark audit time, DuckDB
    time for the same checks, planted vs found. Exits 1 when a planted finding is
    missed or a false one is reported."""
    try:
        import duckdb  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"bench audit needs pyspark and duckdb ({exc}): "
                                   "pip install 'mqguard[spark,bench]'") from None
    from mqguard.bench.audit import run
    from mqguard.cli.audit import _spark_conf

    if more is not None:
        _incremental(events, more, workdir=workdir, keep=keep, master=master,
                     driver_memory=driver_memory, shuffle_partitions=shuffle_partitions,
                     conf=_spark_conf(spark_conf), segment_bytes=segment_bytes,
                     json_path=json_path)
        return

    result = run(events, workdir=workdir, keep=keep, master=master,
                 driver_memory=driver_memory, shuffle_partitions=shuffle_partitions,
                 conf=_spark_conf(spark_conf), html=not no_html, segment_bytes=segment_bytes,
                 class_archive=class_archive, workers=workers, worker_cores=worker_cores,
                 worker_memory=worker_memory,
                 progress=lambda text: click.echo(text, err=True))
    goals, met = result["goals"], result["met"]
    rows = [{"figure": key, "value": result[key], "goal": goals.get(key, ""),
             "met": met.get(key, "")}
            for key in ("events", "spark_s", "spark_start_s", "duckdb_s", "ratio", "planted",
                        "found", "false_positives", "duckdb_found", "duckdb_false_positives",
                        "generate_s", "class_archive", "class_archive_s", "master",
                        "workers", "cluster_start_s")]
    print_table("mqguard bench audit", rows, ["figure", "value", "goal", "met"])
    click.echo(f"load average before {result['load_average_before']}, "
               f"after {result['load_average_after']}", err=True)
    write_json(json_path, {"benchmark": "audit", "environment": environment(),
                           "parameters": {"events": events, "master": master,
                                          "workers": workers, "worker_cores": worker_cores,
                                          "worker_memory": worker_memory,
                                          "driver_memory": driver_memory,
                                          "shuffle_partitions": shuffle_partitions,
                                          "conf": list(spark_conf),
                                          "segment_bytes": segment_bytes,
                                          "class_archive": class_archive},
                           **result})
    if not (met["found"] and met["false_positives"]):
        raise click.ClickException(
            f"found {result['found']} of {result['planted']} planted findings, "
            f"{result['false_positives']} false positive(s)")


def _incremental(events: int, more: int, *, json_path: str | None, **settings: Any) -> None:
    from mqguard.bench.audit_incremental import run_incremental_bench

    result = run_incremental_bench(events, more, **settings,
                                   progress=lambda text: click.echo(text, err=True))
    goals, met = result["goals"], result["met"]
    rows = [{"figure": key, "value": result[key], "goal": goals.get(key, ""),
             "met": met.get(key, "")}
            for key in ("events_before", "events_new", "segments_before", "segments_new",
                        "incremental_s", "fresh_s", "incremental_ratio", "open_events",
                        "reopened_messages", "files_read_again", "incremental_stages_s",
                        "planted", "found",
                        "false_positives")]
    print_table("mqguard bench audit --incremental", rows, ["figure", "value", "goal", "met"])
    click.echo(f"load average before {result['load_average_before']}, "
               f"after {result['load_average_after']}", err=True)
    write_json(json_path, {"benchmark": "audit-incremental", "environment": environment(),
                           "parameters": {"events": events, "incremental": more,
                                          **{k: v for k, v in settings.items()
                                             if k in ("master", "segment_bytes")}},
                           **result})
    if not (met["found"] and met["false_positives"]):
        raise click.ClickException(
            f"found {result['found']} of {result['planted']} planted findings, "
            f"{result['false_positives']} false positive(s)")
