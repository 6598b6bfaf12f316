"""One audit, start to finish: read, judge, write, summarise.

Kept apart from the CLI so that tests (and other programs) run exactly what
``mqguard audit`` runs, on a SparkSession they own.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from mqguard.audit import hashed, report
from mqguard.audit.checks import (
    CheckOptions,
    address_stats,
    classify,
    context_frame,
    message_facts,
)
from mqguard.audit.cross_checks import CROSS_CLASSES, CrossChecks, CrossInputs, prepare
from mqguard.audit.events import expand_inputs, load_events
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


@dataclass(frozen=True)
class AuditResult:
    summary: dict[str, Any]

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
    events = load_events(spark, files)
    # The hash plan (mqguard/audit/hashed.py) needs acked events that say whether they
    # end a handling; a log written before that goes by writing order (one sort).
    grouped = hashed.groups(events, options.checks).persist(StorageLevel.MEMORY_AND_DISK)
    dictionary = hashed.address_dictionary(grouped)
    details: Callable[[DataFrame], DataFrame] | None = None
    if dictionary.legacy:
        grouped.unpersist()
        plan = "writing order"
        facts = message_facts(events, options.checks)
    else:
        plan = "hash"
        facts = hashed.facts(spark, grouped, dictionary)
        details = functools.partial(hashed.details, grouped)
    # Used three times (per-address figures, charts, the classification): computed once.
    facts = facts.persist(StorageLevel.MEMORY_AND_DISK)
    cross: CrossChecks | None = None
    try:
        stats = [row.asDict() for row in address_stats(facts).collect()]
        last = max((s["last_ts"] for s in stats if s["last_ts"] is not None), default=None)
        if options.watermark is not None:
            watermark, source = options.watermark, "given"
        elif last is not None:
            watermark, source = last - options.grace_ms, f"last event - {options.grace_ms} ms"
        else:
            watermark, source = 0, "no events"
        addresses = [s["address"] for s in stats if s["messages"] and s["address"] is not None]
        limits = resolve_limits(options.config, addresses,
                                max_delivery_attempts=options.max_delivery_attempts)
        drained = {s["address"]: s["drained_to"] for s in stats if s["address"] is not None}
        if options.html:
            progress("charting")
            first = min((s["first_ts"] for s in stats if s["first_ts"] is not None),
                        default=None)
            charts = report.chart_data(facts, first, last)

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
        facts.unpersist()
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
    #: How deliveries were paired with their outcome (see mqguard/audit/hashed.py).
    summary["plan"] = plan
    if cross is not None:
        summary.update(cross.summary)
    summary["report"] = None
    if options.html:
        progress("writing the report")
        examples = report.first_findings(read_findings(spark, path), options.examples)
        summary["report"] = report.write_report(summary, charts, examples, options.out)
    write_summary(summary, options.out)
    return AuditResult(summary)
