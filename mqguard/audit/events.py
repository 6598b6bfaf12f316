"""Reading mqguard event logs into Spark.

The schema is explicit, never inferred: inference reads every file twice, guesses
``int`` for epoch milliseconds (Spark's ANSI mode then fails on sums) and turns a
field absent from a sample into a missing column. Lines that do not parse are kept
as ``_corrupt_record`` and counted, never fatal: the file a process is still
writing may end in half a line.

Inputs are directories (every ``*.jsonl`` and rotated ``*.jsonl.gz`` file in
them, as :func:`mqguard.events.iter_event_files` reads them), files or globs.
Local inputs are expanded here, so that a rotation in progress
(``*.jsonl.gz.partial``) is never read and a typo is an error rather than an
empty audit; URLs (``hdfs://``, ``s3a://``...) are handed to Spark unchanged.
"""

from __future__ import annotations

import glob
import os
import urllib.parse
from collections.abc import Iterable, Sequence

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mqguard.errors import MqguardError
from mqguard.events import SCHEMA_VERSION

#: Every field of schema version 1 (docs/events.md). Numbers are longs: epoch
#: milliseconds overflow Spark's int, and ANSI mode makes an overflow an error.
EVENT_SCHEMA = StructType([
    StructField("v", LongType()),
    StructField("ts", LongType()),
    StructField("type", StringType()),
    StructField("node", StringType()),
    StructField("address", StringType()),
    StructField("message_id", StringType()),
    StructField("duplicate_id", StringType()),
    StructField("producer_id", StringType()),
    StructField("seq", LongType()),
    StructField("expiration", LongType()),
    StructField("delivery_count", LongType()),
    StructField("native_delivery_count", LongType()),
    StructField("delay_ms", LongType()),
    StructField("mechanism", StringType()),
    StructField("broker_message_id", StringType()),
    StructField("queue", StringType()),
    StructField("transaction", StringType()),
    StructField("reason", StringType()),
    StructField("target", StringType()),
    StructField("new_message_id", StringType()),
    StructField("ack_reason", StringType()),
    StructField("requeue", BooleanType()),
    StructField("count", LongType()),
    # On ``acked``: true when it ends a successful handling (the handler returned),
    # whose ``delivered`` event was written at ``delivered_ts``. Absent in logs
    # written before these fields existed: the audit then pairs by writing order.
    StructField("handled", BooleanType()),
    StructField("delivered_ts", LongType()),
])

#: The fields the checks use. The JSON parser materialises only the fields of the
#: schema it is given, so long ``reason`` texts are skipped, not copied.
AUDIT_FIELDS = ("v", "ts", "type", "node", "address", "message_id", "queue", "target",
                "new_message_id", "ack_reason", "expiration", "delivery_count", "delay_ms",
                "handled", "delivered_ts")

CORRUPT_COLUMN = "_corrupt_record"

_EVENT_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
#: Positions pack the file's rank into 6 decimal digits (mqguard/audit/hashed.py).
MAX_FILES = 999_999
#: Rotated segments: Parquet (the writer's default) or gzipped JSONL (older writers).
_ROTATED_SUFFIXES = (".parquet", ".jsonl.gz")


class AuditInputError(MqguardError):
    """An input names nothing that can be read (no such file, empty directory, no match)."""


def _is_url(path: str) -> bool:
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme != "file" and scheme.isidentifier()


def _directory_files(directory: str) -> list[str]:
    # Rotated files first, then the current one: the order EventLog wrote them in.
    names = sorted(os.listdir(directory))
    rotated = [n for n in names if n.endswith(_ROTATED_SUFFIXES)]
    current = [n for n in names if n.endswith(".jsonl")]
    return [os.path.join(directory, n) for n in (*rotated, *current)
            if os.path.isfile(os.path.join(directory, n))]


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """The files to read for ``inputs`` (directories, files, globs, URLs), in order.

    Raises :class:`AuditInputError` for an input that yields no file: an audit of
    nothing would report "no anomalies" and mislead whoever gates on it.
    """
    files: list[str] = []
    for raw in inputs:
        if _is_url(raw):
            files.append(raw)
            continue
        path = os.path.expanduser(raw.removeprefix("file://"))
        if any(ch in path for ch in "*?["):
            found: list[str] = []
            for match in sorted(glob.glob(path)):
                if os.path.isdir(match):
                    found.extend(_directory_files(match))
                elif match.endswith(_EVENT_SUFFIXES):
                    found.append(match)
            if not found:
                raise AuditInputError(f"{raw}: no event files (*.jsonl, *.jsonl.gz, *.parquet) "
                                      "match")
            files.extend(found)
        elif os.path.isdir(path):
            found = _directory_files(path)
            if not found:
                raise AuditInputError(f"{raw}: no event files (*.jsonl, *.jsonl.gz, *.parquet) "
                                      "in this directory")
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise AuditInputError(f"{raw}: no such file or directory")
    # The same file named twice (a directory and a glob over it) must not double its events.
    return list(dict.fromkeys(os.path.abspath(f) if not _is_url(f) else f for f in files))


def read_schema(fields: Sequence[str] = AUDIT_FIELDS) -> StructType:
    """The reading schema: ``fields`` of :data:`EVENT_SCHEMA` plus the corrupt-line column."""
    by_name = {f.name: f for f in EVENT_SCHEMA.fields}
    return StructType([by_name[name] for name in fields]
                      + [StructField(CORRUPT_COLUMN, StringType())])


def load_events(spark: SparkSession, files: Sequence[str],
                cache_jsonl_bytes: int = 0) -> DataFrame:
    """The events of ``files`` (JSONL, gzipped JSONL, Parquet segments) with three
    ordering columns added.

    ``file`` (the file's path), ``file_rank`` (its index in ``files``) and ``row``
    (increasing with the line within a file) give the order one process wrote its
    events in, which the millisecond ``ts`` cannot: a fast handler's ``delivered``
    and ``acked`` share a millisecond. Rotated names sort before the current file
    of the same node (``events-n.000001.parquet`` < ``events-n.jsonl``), and
    :func:`expand_inputs` lists them so, so (file, row) and (file_rank, row) are the
    writing order across rotations too.

    ``cache_jsonl_bytes``: when the JSON files (the live tails next to Parquet
    segments) hold at most this many bytes (gzipped ones counted 8 times), their
    parsed rows are cached, so that the audit's passes parse them once. The caller
    unpersists them (:func:`uncache`).
    """
    if not files:
        raise AuditInputError("no input files")
    if len(files) > MAX_FILES:
        raise AuditInputError(f"{len(files)} input files: at most {MAX_FILES:,} per audit")
    by_name = {f.name: f for f in EVENT_SCHEMA.fields}
    parquet = [f for f in files if f.endswith(".parquet")]
    jsonl = [f for f in files if not f.endswith(".parquet")]
    frames = []
    if parquet:
        # Rotated segments the writer converted: the same fields, typed, no bad lines.
        frames.append(spark.read.schema(StructType([by_name[n] for n in AUDIT_FIELDS]))
                      .option("ignoreMissingFiles", "true").parquet(*parquet)
                      .select(*AUDIT_FIELDS,
                              F.lit(None).cast(StringType()).alias(CORRUPT_COLUMN),
                              F.col("_metadata.file_path").alias("file")))
    if jsonl:
        json_frame = (spark.read.schema(read_schema())
                      .option("mode", "PERMISSIVE")
                      .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
                      # A rotated file deleted (backup-count) between listing and reading.
                      .option("ignoreMissingFiles", "true")
                      .json(list(jsonl))
                      .select(*AUDIT_FIELDS, CORRUPT_COLUMN,
                              F.col("_metadata.file_path").alias("file")))
        if parquet and cache_jsonl_bytes and _json_bytes(jsonl) <= cache_jsonl_bytes:
            json_frame = json_frame.persist(StorageLevel.MEMORY_AND_DISK)
            _CACHED.append(json_frame)
        frames.append(json_frame)
    frame = frames[0] if len(frames) == 1 else frames[0].unionAll(frames[1])
    # Each file's rank in the listing, by a broadcast join on its path (one scan per
    # format: a scan per file would compile and warm up code per file). Spark packs
    # small files into a partition largest first, so the scan order alone is not
    # the writing order across a rotation (a delivery at the end of one segment, its
    # ack at the start of the next); (file_rank, row) is.
    ranks = spark.createDataFrame(_rank_rows(files), "file string, file_rank int")
    frame = frame.join(F.broadcast(ranks), "file", "left")
    return frame.select("*", F.monotonically_increasing_id().alias("row"))


def _rank_rows(files: Sequence[str]) -> list[tuple[str, int]]:
    """(path as Spark may spell it, rank) for every file: Spark's ``_metadata.file_path``
    is a URI (``file:/x``, ``file:///x``, percent-encoded or not, depending on the
    version); every spelling maps to the same rank."""
    rows: dict[str, int] = {}
    for rank, path in enumerate(files):
        if _is_url(path):
            rows.setdefault(path, rank)
            continue
        absolute = os.path.abspath(path)
        quoted = urllib.parse.quote(absolute)
        for spelling in (absolute, f"file:{absolute}", f"file://{absolute}",
                         f"file:{quoted}", f"file://{quoted}"):
            rows.setdefault(spelling, rank)
    return list(rows.items())


#: JSON rows cached by :func:`load_events` and not yet released by :func:`uncache`.
_CACHED: list[DataFrame] = []


def uncache() -> None:
    """Release what :func:`load_events` cached."""
    while _CACHED:
        _CACHED.pop().unpersist()


def _json_bytes(files: Sequence[str]) -> int:
    total = 0
    for path in files:
        if path.endswith(".parquet") or _is_url(path):
            continue
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        total += size * 8 if path.endswith(".gz") else size
    return total


def valid_event() -> Column:
    """True for a line that is a readable event of the supported schema version."""
    return (F.col(CORRUPT_COLUMN).isNull() & F.col("type").isNotNull()
            & F.col("ts").isNotNull() & (F.col("v") == F.lit(SCHEMA_VERSION)))
