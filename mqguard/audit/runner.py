"""One audit, start to finish: read, judge, write, summarise.

Kept apart from the CLI so that tests (and other programs) run exactly what
``mqguard audit`` runs, on a SparkSession they own.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from mqguard.audit import hashed, lean, report
from mqguard.audit.checks import (
    CheckOptions,
    address_stats,
    classify,
    context_frame,
    message_facts,
)
from mqguard.audit.cross_checks import CROSS_CLASSES, CrossChecks, CrossInputs, prepare
from mqguard.audit.events import expand_inputs, load_event_inputs, uncache
from mqguard.audit.limits import resolve_limits
from mqguard.audit.summary import (
    build_summary,
    class_counts,
    read_findings,
    write_findings,
    write_summary,
)
from mqguard.config import MqguardConfig, parse_config

DEFAULT_GRACE_MS = 5000
DEFAULT_OUT = "mqguard-audit"
#: JSONL input parsed once and cached when Parquet segments are read too and it is
#: at most this large (the live tails: up to max-bytes per node).
JSONL_CACHE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class AuditOptions:
    """What to audit and how strictly."""

    inputs: Sequence[str]
    out: str = DEFAULT_OUT
    config: MqguardConfig = field(default_factory=lambda: parse_config({}, "<defaults>"))
    #: Epoch ms; messages sent after it are not judged. None: last event - grace.
    watermark: int | None = None
    grace_ms: int = DEFAULT_GRACE_MS
    #: Overrides every address's max-delivery-attempts (<= 0: unlimited).
    max_delivery_attempts: int | None = None
    checks: CheckOptions = field(default_factory=CheckOptions)
    #: Example message ids per class and address in the summary.
    examples: int = 5
    #: Redis state and broker logs to check against the event log (--redis, --broker-log).
    cross: CrossInputs = field(default_factory=CrossInputs)
    #: Write ``out/report.html`` (charts need matplotlib, in the ``spark`` extra).
    html: bool = True
    #: Per address, the latest send time of a message with a fate in events audited
    #: before (``--state``, :mod:`mqguard.audit.incremental`): evidence for the *unseen*
    #: rule that these inputs no longer hold.
    drained_floor: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditResult:
    summary: dict[str, Any]
    #: Per address, the latest send time of a message with a fate (``drained_floor``
    #: included): what an incremental audit carries to the next run.
    drained: Mapping[str, int] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return int(self.summary["anomalies"])

    @property
    def exit_code(self) -> int:
        """1 when anything is wrong (so CI can gate on it), else 0."""
        return 1 if self.anomalies else 0


def _no_progress(stage: str) -> None:
    return None


def run_audit(spark: SparkSession, options: AuditOptions,
              progress: Callable[[str], None] = _no_progress) -> AuditResult:
    """Audit ``options.inputs``; writes ``out/findings``, ``out/summary.json`` and
    (``options.html``) ``out/report.html``.

    Raises :class:`~mqguard.audit.events.AuditInputError` when an input names nothing.
    """
    started = time.perf_counter()
    files = expand_inputs(options.inputs)
    os.makedirs(options.out, exist_ok=True)

    progress(f"reading {len(files)} file(s)")
    # The live JSONL tails are converted to Parquet by pyarrow (a temporary copy in
    # the output directory, which a cluster's executors share), so every event is
    # in one Parquet scan; JSON that only Spark reads exactly is parsed once for the
    # three passes below (at most a few segments' worth: max-bytes per node).
    converted = tempfile.mkdtemp(prefix=".live-jsonl-", dir=options.out)
    try:
        inputs = load_event_inputs(spark, files, cache_jsonl_bytes=JSONL_CACHE_BYTES,
                                   convert_dir=converted)
        events = inputs.frame
        # The lean plan (mqguard/audit/lean.py): a pass for the names and time range,
        # one pass on 64-bit keys for everything else, a filtered read for the few
        # messages that may be findings. Logs written before acked said whether it ended
        # a handling go by writing order (one sort); a 64-bit key collision by the
        # string-keyed hash plan (mqguard/audit/hashed.py).
        names = lean.address_names(inputs)
        if options.watermark is not None:
            watermark, source = options.watermark, "given"
        elif names.last_ts is not None:
            watermark = names.last_ts - options.grace_ms
            source = f"last event - {options.grace_ms} ms"
        else:
            watermark, source = 0, "no events"
        all_limits = resolve_limits(options.config, [a for _, a in names.addresses],
                                    max_delivery_attempts=options.max_delivery_attempts)
        summary_rows = lean.summarise(
            lean.facts(lean.narrow(events, options.checks)), names,
            {x.address: x.max_delivery_attempts for x in all_limits}, watermark,
        ).persist(StorageLevel.MEMORY_AND_DISK)
    except BaseException:
        shutil.rmtree(converted, ignore_errors=True)
        raise
    facts: DataFrame | None = None
    grouped: DataFrame | None = None
    details: Callable[[DataFrame], DataFrame] | None = None
    cross: CrossChecks | None = None
    try:
        # Figures of Spark rows (ints, strings or None), as Row.asDict gives them below.
        stats: list[dict[str, Any]] = lean.stats_of(summary_rows, names)
        legacy = sum(s.pop("legacy") or 0 for s in stats)
        unranked = sum(s.pop("unranked") or 0 for s in stats)
        if unranked and not any("://" in f for f in files):
            # Local files are ranked by path; a miss would order segments wrongly, silently.
            raise RuntimeError(f"{unranked} events of files not matched to the listing "
                               "(Spark spelled their paths in an unknown way)")
        collisions = sum(s.pop("collisions") or 0 for s in stats)
        plan = "lean"
        if legacy or collisions:
            if legacy:
                plan = "writing order"
                facts = message_facts(events, options.checks)
            else:
                plan = "hash (string keys: two message ids share a 64-bit hash)"
                grouped = hashed.groups(events, options.checks).persist(
                    StorageLevel.MEMORY_AND_DISK)
                facts = hashed.facts(spark, grouped, hashed.address_dictionary(grouped))
                details = functools.partial(hashed.details, grouped)
            # Used three times (per-address figures, charts, the classification).
            facts = facts.persist(StorageLevel.MEMORY_AND_DISK)
            stats = [row.asDict() for row in address_stats(facts).collect()]
        addresses = [s["address"] for s in stats if s["messages"] and s["address"] is not None]
        limits = resolve_limits(options.config, addresses,
                                max_delivery_attempts=options.max_delivery_attempts)
        drained = {s["address"]: s["drained_to"] for s in stats if s["address"] is not None}
        for address, floor in options.drained_floor.items():
            seen = drained.get(address)
            drained[address] = floor if seen is None else max(seen, floor)
        if options.html:
            progress("charting")
            if facts is None:
                charts = lean.chart_of(summary_rows, names)
            else:
                first = min((s["first_ts"] for s in stats if s["first_ts"] is not None),
                            default=None)
                last = max((s["last_ts"] for s in stats if s["last_ts"] is not None),
                           default=None)
                charts = report.chart_data(facts, first, last)
        if facts is None:
            facts = lean.survivors(summary_rows, names.frame(spark))
            details = functools.partial(lean.survivor_details, events, options=options.checks)

        progress("checking messages")
        findings = classify(facts, context_frame(spark, limits, drained), watermark,
                            options.checks, details)
        if options.cross.wanted:
            cross = prepare(spark, files, options.cross, options.config,
                            max_delivery_attempts=options.max_delivery_attempts,
                            progress=progress)
            findings = findings.unionByName(cross.findings)
        path = write_findings(findings, options.out)
    finally:
        uncache()
        shutil.rmtree(converted, ignore_errors=True)
        summary_rows.unpersist()
        if facts is not None:
            facts.unpersist()
        if grouped is not None:
            grouped.unpersist()
        if cross is not None:
            cross.close()

    progress("summarising")
    classes = class_counts(read_findings(spark, path), options.examples,
                           CROSS_CLASSES if cross is not None else ())
    summary = build_summary(
        files=files, stats=stats, classes=classes, watermark=watermark,
        watermark_source=source, out=options.out,
        settings={"config": options.config.source,
                  "max_delivery_attempts": options.max_delivery_attempts,
                  "expiry_tolerance_ms": options.checks.expiry_tolerance_ms,
                  "assume_drained": options.checks.assume_drained},
        seconds={"audit": time.perf_counter() - started})
    #: How the facts were computed (see mqguard/audit/lean.py, hashed.py, checks.py).
    summary["plan"] = plan
    if cross is not None:
        summary.update(cross.summary)
    summary["report"] = None
    if options.html:
        progress("writing the report")
        examples = report.first_findings(read_findings(spark, path), options.examples)
        summary["report"] = report.write_report(summary, charts, examples, options.out)
    write_summary(summary, options.out)
    return AuditResult(summary, {a: int(t) for a, t in drained.items() if t is not None})
