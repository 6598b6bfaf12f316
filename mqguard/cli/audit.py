"""``mqguard audit``: judge event logs with Spark (lost, duplicated, late...).

PySpark is the optional ``spark`` extra, so it is imported only when the
command runs: ``mqguard --help`` and every other command work without it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

import click

DEFAULT_OUT = "mqguard-audit"

EXIT_OK, EXIT_ANOMALIES, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3

log = logging.getLogger("mqguard.audit")


class AuditFailed(click.ClickException):
    """The audit could not run (Spark failed, pyspark missing): exit 3, not 1, so a
    CI gate never mistakes a broken audit for anomalies -- or for a clean run."""

    exit_code = EXIT_FAILED


class WatermarkType(click.ParamType):
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it names an offset)."""

    name = "MS|ISO-TIME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{value!r} is neither epoch milliseconds nor an ISO 8601 time "
                      "(e.g. 2025-01-31T12:00:00Z)", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)


def _spark_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--conf")
        conf[key.strip()] = value.strip()
    return conf


def _prepare_class_archive(quiet: bool) -> None:
    try:
        from mqguard.audit import class_archive
    except ImportError as exc:
        raise AuditFailed(f"mqguard audit needs PySpark ({exc}): "
                          "pip install 'mqguard[spark]'") from None
    if not quiet:
        click.echo(f"making {class_archive.archive_path()} (a small audit in a JVM that "
                   "archives its classes at exit)", err=True)
    try:
        seconds = class_archive.create()
    except RuntimeError as exc:
        raise AuditFailed(str(exc)) from None
    if not quiet:
        click.echo(f"done in {seconds:.1f} s; local audits now start from it", err=True)


@click.command()
@click.argument("inputs", nargs=-1, metavar="[INPUT]...")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="mqguard.toml (default ./mqguard.toml if present): per-address "
                   "max-delivery-attempts and targets, disabled plugins, and the event-log "
                   "directory used when no INPUT is given.")
@click.option("--out", default=DEFAULT_OUT, show_default=True,
              type=click.Path(file_okay=False),
              help="Output directory: summary.json, findings/class=<class>/ (Parquet), "
                   "spark.log; while the audit runs, also a Parquet copy of the live "
                   ".jsonl files (.live-jsonl-*, deleted at the end).")
@click.option("--watermark", type=WatermarkType(),
              help="Messages sent after this time are not judged (epoch ms or ISO 8601). "
                   "Default: the last event's time minus --grace-ms.")
@click.option("--grace-ms", type=click.IntRange(min=0), default=5000, show_default=True,
              help="Default watermark distance from the last event.")
@click.option("--assume-drained", is_flag=True,
              help="The consumers drained every address before the watermark: every "
                   "accepted message without a fate is lost (not unseen).")
@click.option("--max-delivery-attempts", type=int,
              help="Judge every address against this limit (<= 0: unlimited) instead of "
                   "the configured max-delivery-attempts.")
@click.option("--expiry-tolerance-ms", type=click.IntRange(min=0), default=1000,
              show_default=True, help="A delivery this long after the expiration is late.")
@click.option("--examples", type=click.IntRange(0, 1000), default=5, show_default=True,
              help="Example message ids per class and address in the summary.")
@click.option("--redis", "redis_url", metavar="URL",
              help="Also check the guard's Redis state (redis://, rediss://, unix://, "
                   "redis+cluster://): duplicate-ID rings and delivery counts against the "
                   "event log. Read in parallel by Spark tasks; the password is never printed.")
@click.option("--redis-namespace", default="mqg", show_default=True,
              help="Key namespace of the store to read.")
@click.option("--broker-log", "broker_logs", multiple=True, metavar="[KIND:]PATH",
              help="Broker log (file or glob, plain or gzip; repeatable). KIND (activemq, "
                   "rabbitmq, mosquitto) is detected from the lines unless given. Checks "
                   "redeliveries against connection losses and broker dead letters against "
                   "the event log.")
@click.option("--tolerance-ms", type=click.IntRange(min=0), default=2000, show_default=True,
              help="With --redis / --broker-log: events of different processes and broker "
                   "log lines this close in time may be in either order.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL (local[N], spark://..., yarn, k8s://...).")
@click.option("--shuffle-partitions", type=click.IntRange(min=1),
              help="spark.sql.shuffle.partitions (default: 2 per local core).")
@click.option("--driver-memory", default="2g", show_default=True,
              help="Driver memory of a local session.")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="Any Spark setting (repeatable).")
@click.option("--no-html", is_flag=True,
              help="Do not write OUT/report.html (the offline HTML report with charts).")
@click.option("--class-archive/--no-class-archive", default=True, show_default=True,
              help="Start a local session from the JVM class-data archive when one was "
                   "made (--prepare): seconds off the start.")
@click.option("--prepare", is_flag=True,
              help="Make the JVM class-data archive local sessions start from (once per "
                   "machine, JDK and PySpark version: ~150 MB in ~/.cache/mqguard, "
                   "$MQGUARD_CACHE_DIR; 1-2 min) and exit.")
@click.option("--state", "state_dir", type=click.Path(file_okay=False),
              help="Incremental audit: remember in this directory the files audited and the "
                   "messages still open, and audit only rotated segments not audited before "
                   "(plus those messages); the findings equal a full audit's. Event log "
                   "only (no --redis, --broker-log), no HTML report; the live .jsonl file "
                   "waits for its rotation.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary JSON to stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; the exit status tells.")
def audit(inputs: tuple[str, ...], config_path: str | None, out: str, watermark: int | None,
          grace_ms: int, assume_drained: bool, max_delivery_attempts: int | None,
          expiry_tolerance_ms: int, examples: int, redis_url: str | None,
          redis_namespace: str, broker_logs: tuple[str, ...], tolerance_ms: int, master: str,
          shuffle_partitions: int | None, driver_memory: str, spark_conf: tuple[str, ...],
          no_html: bool, class_archive: bool, prepare: bool, state_dir: str | None,
          as_json: bool, quiet: bool) -> None:
    """Audit event logs: was anything lost, duplicated, over-delivered or late?

    INPUT: event-log directories, files (.jsonl, rotated .parquet or .jsonl.gz) or globs;
    default: the configured [mqguard.event-log] directory. Runs PySpark
    (pip install 'mqguard[spark]'), local[*] unless --master says otherwise.

    Anomalies: lost, unexpected, duplicated, over_delivered, early_dead_letter,
    dead_letter_not_moved, expiry_not_moved, late_delivery. Reported, not
    errors: unseen, recovered, indeterminate, unguarded. With --redis also:
    ring_mismatch, rejected_without_twin, count_over_max, count_behind,
    dead_letter_untraced (and count_stale, not an error). With --broker-log
    also: unexplained_redelivery, broker_dead_letter_unrecorded.

    Exit status: 0 no anomalies, 1 anomalies found, 2 usage error, 3 the audit
    could not run.
    """
    if as_json and quiet:
        raise click.UsageError("--json and --quiet exclude each other")
    if prepare:
        _prepare_class_archive(quiet)
        return
    if state_dir and (redis_url or broker_logs):
        raise click.UsageError("--state audits the event log only: --redis and --broker-log "
                               "judge a moment's state, which an incremental run cannot carry")
    conf = _spark_conf(spark_conf)
    try:
        from pyspark import SparkContext

        from mqguard.audit.checks import CheckOptions
        from mqguard.audit.cross_checks import CrossInputs, validate
        from mqguard.audit.events import AuditInputError, expand_inputs
        from mqguard.audit.progress import terminal_progress
        from mqguard.audit.runner import AuditOptions, run_audit
        from mqguard.audit.session import build_session
        from mqguard.audit.summary import print_summary
    except ImportError as exc:
        raise AuditFailed(f"mqguard audit needs PySpark ({exc}): "
                          "pip install 'mqguard[spark]'") from None
    from mqguard.config import load_config
    from mqguard.errors import ConfigError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if not inputs:
        inputs = (config.core.event_log.directory,)
    cross = CrossInputs(redis_url=redis_url, redis_namespace=redis_namespace,
                        broker_logs=broker_logs, tolerance_ms=tolerance_ms)
    try:
        expand_inputs(inputs)  # a typo is a usage error before Spark takes seconds to start
        validate(cross)
    except AuditInputError as exc:
        raise click.UsageError(str(exc)) from None
    options = AuditOptions(
        inputs=inputs, out=out, config=config, watermark=watermark, grace_ms=grace_ms,
        max_delivery_attempts=max_delivery_attempts, examples=examples,
        checks=CheckOptions(expiry_tolerance_ms=expiry_tolerance_ms,
                            assume_drained=assume_drained), cross=cross,
        html=not no_html)
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, "spark.log")
    # A session already running in this process (a notebook, a test) is used, not stopped.
    owned = SparkContext._active_spark_context is None
    spark = None
    try:
        with terminal_progress(not (quiet or as_json), sys.stderr.isatty()) as progress:
            spark = build_session(master, shuffle_partitions=shuffle_partitions,
                                  driver_memory=driver_memory, conf=conf, log_path=log_path,
                                  class_archive=class_archive)
            progress.watch(spark)
            if state_dir:
                from mqguard.audit.incremental import run_incremental

                result = run_incremental(spark, options, state_dir, progress)
            else:
                result = run_audit(spark, options, progress)
    except AuditInputError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # Spark's errors come in many classes (Py4J, PySpark, Java)
        log.debug("audit failed", exc_info=True)
        text = str(exc).strip().splitlines()
        raise AuditFailed(f"the audit failed: {text[0] if text else type(exc).__name__} "
                          f"(Spark's log: {log_path})") from None
    finally:
        if spark is not None and owned:
            spark.stop()
    if as_json:
        click.echo(json.dumps(result.summary, indent=2))
    elif not quiet:
        print_summary(result.summary)
    sys.exit(result.exit_code)
