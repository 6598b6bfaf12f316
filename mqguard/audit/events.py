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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mqguard.audit.inline import local_frame
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


@dataclass(frozen=True)
class EventInputs:
    """What :func:`load_event_inputs` read: every event, and how, for the names pass."""

    #: Every event with the ordering columns (see :func:`load_events`).
    frame: DataFrame
    #: The local Parquet files in ``frame`` (segments and converted live tails): their
    #: names and time range come from pyarrow (:mod:`mqguard.audit.footers`).
    local_parquet: tuple[str, ...]
    #: The events of every other file (JSON Spark parses, URLs), without ordering
    #: columns: the names pass reads these with Spark. None: there are none.
    others: DataFrame | None


def load_events(spark: SparkSession, files: Sequence[str],
                cache_jsonl_bytes: int = 0, convert_dir: str | None = None) -> DataFrame:
    """The events of ``files`` (JSONL, gzipped JSONL, Parquet segments) with three
    ordering columns added (:func:`load_event_inputs`'s ``frame``)."""
    return load_event_inputs(spark, files, cache_jsonl_bytes, convert_dir).frame


def load_event_inputs(spark: SparkSession, files: Sequence[str],
                      cache_jsonl_bytes: int = 0, convert_dir: str | None = None
                      ) -> EventInputs:
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

    ``convert_dir``: local JSONL files are first converted to Parquet there by
    :func:`convert_jsonl` (pyarrow's C++ reader on the driver: about 5x less CPU
    than Spark's JSON parser, and every event is then in one Parquet scan); a file
    it cannot read exactly as Spark would is read by Spark. The caller deletes the
    directory once the audit's jobs have run.
    """
    if not files:
        raise AuditInputError("no input files")
    if len(files) > MAX_FILES:
        raise AuditInputError(f"{len(files)} input files: at most {MAX_FILES:,} per audit")
    by_name = {f.name: f for f in EVENT_SCHEMA.fields}
    converted = convert_jsonl(files, convert_dir) if convert_dir is not None else {}
    parquet = [f for f in files if f.endswith(".parquet")] + list(converted.values())
    jsonl = [f for f in files if not f.endswith(".parquet") and f not in converted]
    frames = []
    parquet_schema = StructType([by_name[n] for n in AUDIT_FIELDS])
    if parquet:
        # Rotated segments the writer converted: the same fields, typed, no bad lines.
        frames.append(spark.read.schema(parquet_schema)
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
    # The names pass (mqguard/audit/lean.py) reads local Parquet files with pyarrow and
    # every other file with Spark: the JSON Spark parses, and URLs.
    local_parquet = tuple(f for f in parquet if not _is_url(f) and os.path.isfile(f))
    names_frames = [frames[-1].drop("file")] if jsonl else []
    remote = [f for f in parquet if f not in local_parquet]
    if remote:
        names_frames.append(spark.read.schema(parquet_schema)
                            .option("ignoreMissingFiles", "true").parquet(*remote)
                            .select(*AUDIT_FIELDS,
                                    F.lit(None).cast(StringType()).alias(CORRUPT_COLUMN)))
    others = (names_frames[0] if len(names_frames) == 1
              else names_frames[0].unionByName(names_frames[1]) if names_frames else None)
    frame = frames[0] if len(frames) == 1 else frames[0].unionAll(frames[1])
    # Each file's rank in the listing, by a broadcast join on its path (one scan per
    # format: a scan per file would compile and warm up code per file). Spark packs
    # small files into a partition largest first, so the scan order alone is not
    # the writing order across a rotation (a delivery at the end of one segment, its
    # ack at the start of the next); (file_rank, row) is.
    # A converted file takes its source's rank and name (the writing-order plan sorts
    # by file name within a node).
    ranks = local_frame(spark, _rank_rows(files, converted), _RANKS_SCHEMA)
    frame = frame.join(F.broadcast(ranks), "file", "left")
    frame = frame.select(*[F.coalesce("source", "file").alias("file") if name == "file"
                           else name for name in frame.columns if name != "source"])
    return EventInputs(frame.select("*", F.monotonically_increasing_id().alias("row")),
                       local_parquet, others)


_RANKS_SCHEMA = StructType([StructField("file", StringType()),
                            StructField("file_rank", IntegerType()),
                            StructField("source", StringType())])


def _rank_rows(files: Sequence[str], converted: Mapping[str, str] | None = None
               ) -> list[tuple[str, int, str]]:
    """(path as Spark may spell it, rank, the listed path) for every file, and for the
    Parquet copy of every ``converted`` one (its source's rank and path): Spark's
    ``_metadata.file_path`` is a URI (``file:/x``, ``file:///x``, percent-encoded or not,
    depending on the version); every spelling maps to the same rank."""
    rows: dict[str, tuple[int, str]] = {}
    converted = converted or {}
    for rank, path in enumerate(files):
        if _is_url(path):
            rows.setdefault(path, (rank, path))
            continue
        for read in (path, converted.get(path)):
            if read is None:
                continue
            absolute = os.path.abspath(read)
            quoted = urllib.parse.quote(absolute)
            for spelling in (absolute, f"file:{absolute}", f"file://{absolute}",
                             f"file:{quoted}", f"file://{quoted}"):
                rows.setdefault(spelling, (rank, path))
    return [(spelling, rank, path) for spelling, (rank, path) in rows.items()]


#: Largest JSONL file :func:`convert_jsonl` takes (it holds one file in memory at a
#: time): 4x the writer's default max-bytes. Larger ones are read by Spark.
CONVERT_JSONL_BYTES = 256 * 1024 * 1024


def _arrow_schema(fields: Sequence[str] = AUDIT_FIELDS) -> Any:
    import pyarrow as pa

    types: dict[DataType, pa.DataType] = {
        LongType(): pa.int64(), StringType(): pa.string(), BooleanType(): pa.bool_(),
    }
    by_name = {f.name: f for f in EVENT_SCHEMA.fields}
    return pa.schema([(name, types[by_name[name].dataType]) for name in fields])


def convert_jsonl(files: Sequence[str], directory: str,
                  max_bytes: int = CONVERT_JSONL_BYTES) -> dict[str, str]:
    """{JSONL file: its Parquet copy in ``directory``} for the local ``.jsonl`` files of
    ``files`` that pyarrow reads exactly as Spark's reader would.

    Spark's JSON reader costs about 15 us of CPU per event (the live tails at 10
    million events: 9 s of the audit's CPU, then a cache for the later passes);
    pyarrow's parses the same file in a twentieth of that on the driver's threads,
    with the explicit schema. It is stricter: a value of another type, a line that
    is not one object, invalid UTF-8 fail the whole file, whose rows Spark would
    keep as unreadable lines (or coerce). So a file is taken only when pyarrow
    reads it without error into exactly one row per line, every line ended by a
    newline (a half-written last line is Spark's to count); otherwise, and for
    files larger than ``max_bytes``, gzipped or remote ones, Spark reads it as
    before. Each file is read once into memory, so its copy is one consistent
    snapshot of a file the writer may still be appending to.
    """
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    schema = _arrow_schema()
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                            newlines_in_values=False)
    converted: dict[str, str] = {}
    for index, path in enumerate(files):
        if _is_url(path) or not path.endswith(".jsonl"):
            continue
        try:
            if os.path.getsize(path) > max_bytes:
                continue
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
        except OSError:
            continue  # gone since the listing: Spark's reader decides (ignoreMissingFiles)
        if len(data) > max_bytes or (data and not data.endswith(b"\n")):
            continue
        try:
            # pyarrow-stubs type the source as a path or IO, leaving out pyarrow's own
            # NativeFile, which reads the bytes without a copy.
            table = pj.read_json(pa.BufferReader(data),  # type: ignore[arg-type]
                                 parse_options=parse,
                                 read_options=pj.ReadOptions(block_size=16 << 20))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            continue
        if table.num_rows != data.count(b"\n"):
            continue  # a blank line, or two objects on one line: Spark's to judge
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, f"{index:06d}.parquet")
        pq.write_table(table, target, compression="none")
        converted[path] = target
    return converted


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
