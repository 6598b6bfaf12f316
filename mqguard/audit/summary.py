"""The audit's outputs: Parquet tables of findings, the JSON summary, a terminal table.

Findings are written once, partitioned by class (``findings/class=lost/...``:
one directory per class, readable as one table with a ``class`` column or one
class at a time). The summary is computed from what was written, so the two
always agree, and only aggregates and a few example ids per class and address
reach the driver -- never the findings themselves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from mqguard.audit.checks import CLASSES, FINDINGS_SCHEMA, FindingClass
from mqguard.audit.inline import local_frame

if TYPE_CHECKING:
    from rich.console import Console

SUMMARY_VERSION = 1
FINDINGS_DIR = "findings"
SUMMARY_FILE = "summary.json"


def write_findings(findings: DataFrame, out: str) -> str:
    """Write ``findings`` under ``out/findings`` (replacing an earlier run's); the path."""
    path = os.path.join(out, FINDINGS_DIR)
    findings.write.mode("overwrite").partitionBy("class").parquet(path)
    return path


def read_findings(spark: SparkSession, path: str) -> DataFrame:
    """The findings written by :func:`write_findings` (empty when there were none)."""
    if not any(name.startswith("class=") for name in os.listdir(path)):
        return local_frame(spark, [], FINDINGS_SCHEMA)
    return spark.read.parquet(path)


def class_counts(findings: DataFrame, examples: int,
                 extra_classes: Sequence[FindingClass] = ()) -> dict[str, dict[str, Any]]:
    """Per class and address: the count and the first ``examples`` message ids (by time).

    ``extra_classes``: classes of the checks that ran besides the event log's
    (``--redis``, ``--broker-log``: :data:`mqguard.audit.cross_checks.CROSS_CLASSES`).

    One job: the count rides along each kept row as a window aggregate, so only
    ``examples`` rows per class and address reach the driver.
    """
    group = Window.partitionBy("class", "address")
    picked = (findings
              .select("class", "address", "message_id",
                      F.count(F.lit(1)).over(group).alias("count"),
                      F.row_number().over(group.orderBy("ts", "message_id")).alias("n"))
              .filter(F.col("n") <= max(1, examples))
              .collect())
    classes: dict[str, dict[str, Any]] = {
        c.name: {"anomaly": c.anomaly, "description": c.description, "count": 0,
                 "by_address": {}} for c in (*CLASSES, *extra_classes)}
    for row in sorted(picked, key=lambda r: r["n"]):
        entry = classes[row["class"]]
        address = row["address"] or ""
        if row["n"] == 1:
            entry["count"] += row["count"]
            entry["by_address"][address] = {"count": row["count"], "examples": []}
        if row["n"] <= examples:
            entry["by_address"][address]["examples"].append(row["message_id"])
    for entry in classes.values():
        entry["by_address"] = dict(sorted(entry["by_address"].items(),
                                          key=lambda kv: (-kv[1]["count"], kv[0])))
    return classes


def build_summary(*, files: Sequence[str], stats: Sequence[Mapping[str, Any]],
                  classes: Mapping[str, Mapping[str, Any]], watermark: int,
                  watermark_source: str, out: str, settings: Mapping[str, Any],
                  seconds: Mapping[str, float]) -> dict[str, Any]:
    """The JSON summary.

    ``ok`` / ``anomalies``: the verdict; ``files``, ``events`` (lines read, unreadable
    ones included), ``bad_lines``, ``unsupported_events`` (another schema version:
    left out of the checks), ``messages``; ``first_ts`` / ``last_ts`` / ``watermark``
    in epoch ms (``watermark_time``: the same in ISO 8601, UTC); ``classes``: per
    class ``anomaly``, ``description``, ``count`` and ``by_address`` (``count`` and
    the first ``examples`` by time); ``addresses``:
    per address ``messages``, ``sent`` (accepted), ``deliveries``, ``with_fate``;
    ``settings`` the audit ran with; ``out``; ``seconds``. The runner adds ``report``:
    the path of the HTML report (None with ``--no-html``).
    """
    messages = [s for s in stats if s["messages"]]

    def total(field: str) -> int:
        return int(sum(s[field] or 0 for s in stats))

    first = [s["first_ts"] for s in stats if s["first_ts"] is not None]
    last = [s["last_ts"] for s in stats if s["last_ts"] is not None]
    anomalies = sum(entry["count"] for entry in classes.values() if entry["anomaly"])
    return {
        "version": SUMMARY_VERSION,
        "ok": anomalies == 0,
        "anomalies": anomalies,
        "files": len(files),
        "events": total("events"),
        "bad_lines": total("bad"),
        "unsupported_events": total("unsupported"),
        "messages": total("messages"),
        "first_ts": min(first, default=None),
        "last_ts": max(last, default=None),
        "watermark": watermark,
        "watermark_time": _iso(watermark),
        "watermark_source": watermark_source,
        "classes": dict(classes),
        "addresses": {
            s["address"]: {"messages": s["messages"], "sent": s["sent"],
                           "deliveries": s["deliveries"], "with_fate": s["with_fate"]}
            for s in sorted(messages, key=lambda s: s["address"] or "")},
        "settings": dict(settings),
        "out": out,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }


def _iso(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_summary(summary: Mapping[str, Any], out: str) -> str:
    path = os.path.join(out, SUMMARY_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    return path


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    """A short table for a terminal: one row per class that has findings.

    ``console``: where to print (a new console on standard output by default). The
    table fits 80 columns: example ids go one per line and the other columns narrow
    first (an id is looked up whole); a cell that still does not fit folds onto the
    next line rather than being cut.
    """
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="mqguard audit")
    for column, justify in (("class", "left"), ("kind", "left"), ("count", "right"),
                            ("addresses", "right")):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    # Not wrapped: the other columns give way first; folded only past that.
    table.add_column("examples", no_wrap=True, overflow="fold")
    for name, entry in summary["classes"].items():
        if not entry["count"]:
            continue
        examples = [e for a in entry["by_address"].values() for e in a["examples"]][:2]
        table.add_row(name, "anomaly" if entry["anomaly"] else "info", f"{entry['count']:,}",
                      str(len(entry["by_address"])), "\n".join(examples))
    if table.row_count:
        console.print(table)
    verdict = ("[bold green]no anomalies[/]" if summary["ok"]
               else f"[bold red]{summary['anomalies']:,} anomalies[/]")
    console.print(
        f"{summary['events']:,} events ({summary['bad_lines']:,} unreadable) in "
        f"{summary['files']} file(s), {summary['messages']:,} messages, watermark "
        f"{summary['watermark_time']} ({summary['watermark_source']}): {verdict}. "
        f"Details: {summary['out']}", soft_wrap=False)  # wrapped at words, whatever console
    if summary.get("report"):
        console.print(f"Report: {summary['report']}", highlight=False, soft_wrap=True)
