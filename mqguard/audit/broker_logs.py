"""Broker logs as audit input (``mqguard audit --broker-log [KIND:]PATH``).

Parsed by pattern, in Spark tasks (one per file; plain or gzip), into records of
what the broker says happened to connections and, where it says so, to
messages. Lines are read with a bounded length (:data:`MAX_LINE_BYTES`; longer
ones are skipped and counted); a line no pattern knows is counted as
``unknown``, never fatal; stack-trace lines under a record are
``continuation``. The broker kind is detected from the first lines
(:func:`detect_kind`) unless given as ``activemq:PATH``, ``rabbitmq:PATH`` or
``mosquitto:PATH``.

Line formats (checked against the logs the local servers write):

- ActiveMQ Classic ``activemq.log``, log4j ``%d | %-5p | %m | %c | %t``:
  ``2026-11-21 17:53:22,070 | INFO  | message | logger | thread``;
- RabbitMQ: ``2026-11-21 15:05:53.236261+00:00 [info] <0.223.0> message``;
- Mosquitto: ``2026-11-21T16:19:46: message`` (``log_timestamp_format
  %Y-%m-%dT%H:%M:%S``) or the default ``1700000000: message``.

Times without a zone (ActiveMQ, Mosquitto) are read as UTC.

Record kinds: ``open``, ``close`` (orderly), ``lost`` (abrupt: socket error,
keep-alive timeout, takeover), ``broker_start``, ``broker_stop``,
``dead_letter`` and ``expired`` (with the broker's message id and destination).
What each broker does and does not log is in docs/audit.md.

Checks (:func:`broker_findings`):

- **unexplained_redelivery**: a ``delivered`` event that follows, on the same
  queue and message id, an earlier delivery with no outcome in the event log
  (no ``handler_failed``, ``nacked``, ``redelivery_scheduled``, ack or move:
  the consumer vanished mid-delivery), while no broker log shows a connection
  end (``close``, ``lost``, broker stop or start) between ``tolerance_ms``
  before the first delivery and ``tolerance_ms`` after the second. Judged only
  against logs of brokers that log every connection end (RabbitMQ, Mosquitto;
  ActiveMQ only with the logging broker plugin's connection events), and only
  for redeliveries within the time those logs cover. A clean run (failures
  nacked, nothing killed) has no outcome-less delivery, so it finds none.
- **broker_dead_letter_unrecorded**: a broker-side dead-letter or expiry
  record whose message the event log does not show ``dead_lettered``,
  ``expired`` or ``nacked`` (matched by ``broker_message_id``).
"""

from __future__ import annotations

import glob
import gzip
import io
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mqguard.audit.checks import FINDINGS_SCHEMA, FindingClass
from mqguard.audit.events import AuditInputError
from mqguard.audit.inline import local_frame
from mqguard.events import EventType as E

BROKER_CLASSES: tuple[FindingClass, ...] = (
    FindingClass("unexplained_redelivery", True,
                 "redelivered after an outcome-less delivery, no connection end in the broker log"),
    FindingClass("broker_dead_letter_unrecorded", True,
                 "the broker dead-lettered or expired a message mqguard's events do not show so"),
)

KINDS: Final = ("activemq", "rabbitmq", "mosquitto")
#: Longest line parsed; longer ones (a huge message dump) are skipped and counted.
MAX_LINE_BYTES: Final = 65_536
#: Lines looked at to detect a file's broker kind.
DETECT_LINES: Final = 200
#: Record kinds that end a connection (and so may cause a redelivery).
CONNECTION_ENDS: Final = ("close", "lost", "broker_stop", "broker_start")

_ACTIVEMQ_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \| (\w+)\s*\| (.*) \| ([\w.$]+) \| ([^|]*)$")
_RABBITMQ_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)) \[(\w+)\] <([\d.]+)> (.*)$")
_MOSQUITTO_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|\d{9,11}): (.*)$")
_CONTINUATION = re.compile(r"^(\s|Caused by:|\.\.\. \d+ more|[\w.$]+(Exception|Error)\b)")

# -- message patterns: (kind, regex with optional groups conn / id / dest) ------------------

_ACTIVEMQ_RULES: Final = (
    ("lost", re.compile(r"^Transport Connection to: (?P<conn>\S+) failed: ")),
    ("open", re.compile(r"^Adding Connection: ConnectionInfo \{.*?clientIp = (?P<conn>[^,}]+)")),
    ("close", re.compile(r"^Removing Connection: ConnectionInfo \{.*?clientIp = (?P<conn>[^,}]+)")),
    ("broker_stop", re.compile(r"^Apache ActiveMQ \S+ \(.*\) is shutting down")),
    ("broker_start", re.compile(r"^Apache ActiveMQ \S+ \(.*\) started")),
    ("dead_letter", re.compile(r"^Sending to DLQ: .*?messageId = (?P<id>[^,}]+)"
                               r"(?:.*?destination = (?P<dest>[^,}]+))?")),
    ("expired", re.compile(r"^Message has expired: .*?messageId = (?P<id>[^,}]+)"
                           r"(?:.*?destination = (?P<dest>[^,}]+))?")),
)
_RABBITMQ_RULES: Final = (
    ("open", re.compile(r"^accepting (?:STOMP|MQTT|AMQP) connection (?:<[\d.]+> )?"
                        r"\((?P<conn>[^)]*)\)")),
    ("close", re.compile(r"^closing (?:STOMP|MQTT|AMQP) connection (?:<[\d.]+> )?"
                         r"\((?P<conn>[^)]*)\)")),
    ("lost", re.compile(r"^MQTT connection \"(?P<conn>[^\"]*)\" will terminate because|"
                        r"^(?:STOMP|MQTT) detected network error|"
                        r"^client unexpectedly closed TCP connection|"
                        r"^(?:missed heartbeats from client|closing .*connection.*timeout)")),
    ("broker_start", re.compile(r"^Server startup complete")),
    ("broker_stop", re.compile(r"^RabbitMQ is asked to stop")),
)
_MOSQUITTO_RULES: Final = (
    ("open", re.compile(r"^New client connected from \S+ as (?P<conn>\S+) \(")),
    ("close", re.compile(r"^Client (?P<conn>\S+) disconnected\.$")),
    ("lost", re.compile(r"^(?:Client (?P<conn>\S+) (?:closed its connection\.|"
                        r"has exceeded timeout, disconnecting\.|disconnected[ ,].*|"
                        r"already connected, closing old connection\.)"
                        r"|Socket error on client (?P<conn2>\S+), disconnecting\.)")),
    ("broker_start", re.compile(r"^mosquitto version \S+ running")),
    ("broker_stop", re.compile(r"^mosquitto version \S+ terminating")),
)
RULES: Final = {"activemq": _ACTIVEMQ_RULES, "rabbitmq": _RABBITMQ_RULES,
                "mosquitto": _MOSQUITTO_RULES}
LINES: Final = {"activemq": _ACTIVEMQ_LINE, "rabbitmq": _RABBITMQ_LINE,
                "mosquitto": _MOSQUITTO_LINE}
#: Kinds whose default logging shows every connection end (see docs/audit.md).
LOGS_CONNECTION_ENDS: Final = {"activemq": False, "rabbitmq": True, "mosquitto": True}

RECORD_SCHEMA = StructType([
    StructField("file", StringType(), nullable=False),
    StructField("broker", StringType(), nullable=False),
    StructField("line", LongType(), nullable=False),
    StructField("ts", LongType()),
    StructField("kind", StringType(), nullable=False),
    StructField("connection", StringType()),
    StructField("broker_message_id", StringType()),
    StructField("destination", StringType()),
])
STATS_SCHEMA = StructType([
    StructField("file", StringType(), nullable=False),
    StructField("broker", StringType()),
    StructField("lines", LongType()),
    StructField("parsed", LongType()),
    StructField("records", LongType()),
    StructField("unknown", LongType()),
    StructField("continuation", LongType()),
    StructField("too_long", LongType()),
    StructField("first_ts", LongType()),
    StructField("last_ts", LongType()),
])


@dataclass(frozen=True, slots=True)
class BrokerLog:
    """One file to parse; ``kind`` None: detect it."""

    path: str
    kind: str | None = None


def expand_broker_logs(specs: Sequence[str]) -> list[BrokerLog]:
    """``[KIND:]PATH`` (a file or a glob) -> files; an input matching nothing is an error."""
    logs: list[BrokerLog] = []
    for spec in specs:
        kind, sep, rest = spec.partition(":")
        if sep and kind.lower() in KINDS:
            kind, path = kind.lower(), rest
        else:
            kind, path = None, spec  # type: ignore[assignment]
        path = os.path.expanduser(path)
        matches = sorted(glob.glob(path)) if any(ch in path for ch in "*?[") else [path]
        files = [m for m in matches if os.path.isfile(m)]
        if not files:
            raise AuditInputError(f"--broker-log {spec}: no such file"
                                  + (" matches" if matches != [path] else ""))
        logs.extend(BrokerLog(os.path.abspath(f), kind) for f in files)
    return list({(b.path, b.kind): b for b in logs}.values())


def _open(path: str) -> io.BufferedIOBase:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _lines(handle: io.BufferedIOBase) -> Iterator[str | None]:
    """Decoded lines without the newline; None for a line longer than MAX_LINE_BYTES."""
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the long line
                raw = handle.readline(MAX_LINE_BYTES)
            yield None
            continue
        yield raw.rstrip(b"\r\n").decode("utf-8", "replace")


def detect_kind(lines: Sequence[str]) -> str | None:
    """The broker kind most of ``lines`` match, or None."""
    scores = {kind: sum(1 for line in lines if LINES[kind].match(line)) for kind in KINDS}
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] else None


def _epoch_ms(stamp: str, kind: str) -> int | None:
    try:
        if kind == "activemq":
            moment = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        elif kind == "mosquitto" and stamp.isdigit():
            return int(stamp) * 1000
        else:
            moment = datetime.fromisoformat(stamp.replace(" ", "T", 1).replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    except ValueError:
        return None


def parse_line(line: str, kind: str) -> tuple[int | None, str, dict[str, str | None]] | None:
    """(epoch ms, record kind or '' for a known line without a record, fields), or None
    when the line is not in ``kind``'s format."""
    match = LINES[kind].match(line)
    if match is None:
        return None
    stamp = match.group(1)
    message = match.group(3) if kind == "activemq" else match.group(match.lastindex or 2)
    ts = _epoch_ms(stamp, kind)
    for record, pattern in RULES[kind]:
        found = pattern.search(message)
        if found:
            groups = found.groupdict()
            conn = groups.get("conn") or groups.get("conn2")
            return ts, record, {"connection": conn, "id": groups.get("id"),
                                "dest": groups.get("dest")}
    return ts, "", {}


def parse_file(log: BrokerLog) -> Iterator[tuple[Any, ...]]:
    """("rec", ...RECORD_SCHEMA) rows, then one ("stats", ...STATS_SCHEMA) row."""
    lines = parsed = records = unknown = continuation = too_long = 0
    first_ts: int | None = None
    last_ts: int | None = None
    kind = log.kind
    try:
        with _open(log.path) as handle:
            if kind is None:
                head = [line for line in itertools.islice(_lines(handle), DETECT_LINES)
                        if line is not None]
                kind = detect_kind(head)
                handle.seek(0)
            for line in _lines(handle):
                lines += 1
                if line is None:
                    too_long += 1
                    continue
                if kind is None:
                    unknown += 1
                    continue
                result = parse_line(line, kind)
                if result is None:
                    if line and _CONTINUATION.match(line):
                        continuation += 1
                    elif line.strip():
                        unknown += 1
                    continue
                parsed += 1
                ts, record, fields = result
                if ts is not None:
                    first_ts = ts if first_ts is None else min(first_ts, ts)
                    last_ts = ts if last_ts is None else max(last_ts, ts)
                if record:
                    records += 1
                    yield ("rec", log.path, kind, lines, ts, record, fields.get("connection"),
                           fields.get("id"), fields.get("dest"))
    except (OSError, EOFError) as exc:  # a truncated gzip still counts what it held
        unknown += 1
        yield ("error", log.path, f"{type(exc).__name__}: {exc}"[:300])
    yield ("stats", log.path, kind, lines, parsed, records, unknown, continuation, too_long,
           first_ts, last_ts)


@dataclass(frozen=True)
class BrokerLogs:
    """Parsed broker logs: the records (persisted) and per-file figures."""

    records: DataFrame
    files: list[dict[str, Any]]
    errors: list[str]

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for row in self.records.groupBy("kind").count().collect():
            kinds[row["kind"]] = int(row["count"])
        return {"files": self.files, "records": kinds,
                "unknown_lines": sum(int(f["unknown"] or 0) for f in self.files),
                "too_long_lines": sum(int(f["too_long"] or 0) for f in self.files),
                "errors": self.errors}

    def unpersist(self) -> None:
        self.records.unpersist()


def read_broker_logs(spark: SparkSession, logs: Sequence[BrokerLog]) -> BrokerLogs:
    """Parse ``logs`` in parallel (one task per file)."""
    sc = spark.sparkContext
    rows = (sc.parallelize(list(logs), max(1, len(logs))).flatMap(parse_file)
            .persist(StorageLevel.MEMORY_AND_DISK))
    records = spark.createDataFrame(rows.filter(lambda r: r[0] == "rec").map(lambda r: r[1:]),
                                    RECORD_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    records.count()
    files = [dict(zip(STATS_SCHEMA.fieldNames(), r[1:], strict=True))
             for r in rows.filter(lambda r: r[0] == "stats").collect()]
    errors = [f"{r[1]}: {r[2]}" for r in rows.filter(lambda r: r[0] == "error").collect()]
    rows.unpersist()
    return BrokerLogs(records, sorted(files, key=lambda f: f["file"]), errors)


def _finding(frame: DataFrame, name: str, **cols: Any) -> DataFrame:
    none = F.lit(None)
    ts = cols.get("ts", none).cast(LongType())
    return frame.select(
        F.lit(name).alias("class"),
        cols.get("message_id", none).cast(StringType()).alias("message_id"),
        cols.get("address", none).cast(StringType()).alias("address"),
        cols.get("queue", none).cast(StringType()).alias("queue"),
        ts.alias("ts"),
        F.date_format(F.timestamp_millis(ts), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("time"),
        cols.get("deliveries", none).cast(LongType()).alias("deliveries"),
        cols.get("limit", none).cast(LongType()).alias("limit"),
        cols["detail"].cast(StringType()).alias("detail"),
    )


OUTCOMES: Final = (E.HANDLER_FAILED, E.NACKED, E.REDELIVERY_SCHEDULED, E.ACKED, E.MOVED,
                   E.DEAD_LETTERED, E.EXPIRED, E.DELIVERY_DROPPED,
                   E.DUPLICATE_DELIVERY_SUPPRESSED)


def redelivery_findings(spark: SparkSession, events: DataFrame, logs: BrokerLogs,
                        tolerance_ms: int) -> tuple[DataFrame, dict[str, Any]]:
    """``unexplained_redelivery`` findings, and how many redeliveries were judged."""
    c = F.col
    judging = [f for f in logs.files if f["broker"] and LOGS_CONNECTION_ENDS[f["broker"]]
               and f["first_ts"] is not None]
    capable = {f["file"] for f in judging}
    ends = logs.records.filter(c("kind").isin(list(CONNECTION_ENDS)))
    # ActiveMQ counts only when its log shows orderly connection ends too (the logging
    # broker plugin's connection events): by default it logs failures alone, and
    # not even a killed client (an EOF is logged at DEBUG).
    capable |= {r["file"] for r in logs.records.filter(
        (c("broker") == "activemq") & c("kind").isin("open", "close"))
        .select("file").distinct().collect()}
    covered = [f for f in logs.files if f["file"] in capable and f["first_ts"] is not None]
    info: dict[str, Any] = {"judged_by": sorted(capable)}
    if not covered:
        info["redeliveries_judged"] = 0
        return local_frame(spark, [], FINDINGS_SCHEMA), info
    start = min(f["first_ts"] for f in covered)
    stop = max(f["last_ts"] for f in covered)
    tol = F.lit(tolerance_ms)
    path = events.filter(c("message_id").isNotNull() & c("queue").isNotNull()
                         & c("type").isin([str(t) for t in (E.DELIVERED, *OUTCOMES)]))
    ordered = Window.partitionBy("queue", "message_id").orderBy("ts", "file", "row")
    grouped = path.withColumn(
        "g", F.sum(F.when(c("type") == str(E.DELIVERED), 1).otherwise(0)).over(ordered))
    attempts = (grouped.filter(c("g") > 0)
                .groupBy("queue", "message_id", "g")
                .agg(F.min(F.when(c("type") == str(E.DELIVERED), c("ts"))).alias("at"),
                     F.first("address", ignorenulls=True).alias("address"),
                     F.count_if(c("type").isin([str(t) for t in OUTCOMES])).alias("outcomes"),
                     F.max(F.when(c("type") == str(E.DELIVERED), c("delivery_count")))
                     .alias("delivery_count")))
    previous = Window.partitionBy("queue", "message_id").orderBy("g")
    redeliveries = (attempts
                    .withColumn("prev_at", F.lag("at").over(previous))
                    .withColumn("prev_outcomes", F.lag("outcomes").over(previous))
                    .filter(c("prev_at").isNotNull() & (c("prev_outcomes") == 0)
                            & (c("prev_at") >= F.lit(start)) & (c("at") <= F.lit(stop))))
    marks = F.broadcast(ends.filter(c("file").isin(sorted(capable)) & c("ts").isNotNull())
                        .select(c("ts").alias("end_ts")))
    explained = redeliveries.join(
        marks, (c("end_ts") >= c("prev_at") - tol) & (c("end_ts") <= c("at") + tol), "left_semi")
    unexplained = redeliveries.join(explained.select("queue", "message_id", "g"),
                                    ["queue", "message_id", "g"], "left_anti")
    info["redeliveries_judged"] = redeliveries.count()
    found = _finding(
        unexplained, "unexplained_redelivery", message_id=c("message_id"),
        address=c("address"), queue=c("queue"), ts=c("at"), deliveries=c("delivery_count"),
        detail=F.format_string(
            "redelivered at %d after a delivery at %d with no outcome, and no broker log shows "
            "a connection closed or lost in between", c("at"), c("prev_at")))
    return found, info


def dead_letter_findings(events: DataFrame, logs: BrokerLogs) -> DataFrame:
    """``broker_dead_letter_unrecorded`` findings."""
    c = F.col
    broker_side = (logs.records.filter(c("kind").isin("dead_letter", "expired")
                                       & c("broker_message_id").isNotNull())
                   .select("broker_message_id", "kind", "destination", "ts", "file", "line"))
    known = (events.filter(c("broker_message_id").isNotNull())
             .groupBy("broker_message_id")
             .agg(F.first("message_id", ignorenulls=True).alias("message_id"),
                  F.first("address", ignorenulls=True).alias("address"),
                  F.first("queue", ignorenulls=True).alias("queue"),
                  F.count_if(c("type").isin(str(E.DEAD_LETTERED), str(E.EXPIRED),
                                            str(E.NACKED))).alias("agreeing"),
                  F.collect_set("type").alias("types")))
    joined = broker_side.join(known, "broker_message_id", "left")
    bad = joined.filter(F.coalesce(c("agreeing"), F.lit(0)) == 0)
    destination = F.regexp_replace(c("destination"), r"^(queue|topic)://", "")
    return _finding(
        bad, "broker_dead_letter_unrecorded",
        message_id=F.coalesce(c("message_id"), c("broker_message_id")),
        address=F.coalesce(c("address"), destination), queue=c("queue"), ts=c("ts"),
        detail=F.format_string(
            "the broker logged %s for %s (%s line %d); mqguard's events show %s",
            F.when(c("kind") == "dead_letter", F.lit("a dead letter")).otherwise(
                F.lit("an expiry")),
            c("broker_message_id"), c("file"), c("line"),
            F.coalesce(F.array_join(F.array_sort(c("types")), ", "),
                       F.lit("nothing of this message"))))


def broker_findings(spark: SparkSession, events: DataFrame, logs: BrokerLogs,
                    tolerance_ms: int = 2000) -> tuple[DataFrame, dict[str, Any]]:
    """Every finding of this module and the figures for the summary."""
    redeliveries, info = redelivery_findings(spark, events, logs, tolerance_ms)
    found = redeliveries.unionByName(dead_letter_findings(events, logs))
    return found.select(*FINDINGS_SCHEMA.fieldNames()), info


__all__ = ["BROKER_CLASSES", "BrokerLog", "BrokerLogs", "broker_findings", "detect_kind",
           "expand_broker_logs", "parse_file", "parse_line", "read_broker_logs"]
