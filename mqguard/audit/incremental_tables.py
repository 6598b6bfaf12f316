"""The state of an incremental audit as Arrow tables, computed on the driver.

An incremental run's bookkeeping (the new events' ids and last time, the closed
messages they reopen, each judged message's fate, the open events, closed ids and
findings carried to the next run) is small next to the audit proper: a few columns
of the new segments and a few thousand carried events. As Spark jobs it cost about
a second each (planning, a scan, a shuffle); pyarrow does the same work on the
driver in a fraction of that, so the run's only Spark work is the audit itself.

Events carry their global writing order: ``g_rank`` (the file's rank among every
file the state has audited) and ``g_row`` (the row within that file).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as arrow_compute
import pyarrow.dataset as ds
import pyarrow.json as pj
import pyarrow.parquet as pq
from pyspark.sql.types import BooleanType, LongType, StringType

from mqguard.audit.checks import TERMINAL
from mqguard.audit.events import AUDIT_FIELDS, EVENT_SCHEMA
from mqguard.events import SCHEMA_VERSION

#: pyarrow's compute kernels, untyped here: the stubs' overloads reject the mix of
#: arrays, chunked arrays and scalars these kernels take.
pc: Any = arrow_compute

__all__ = ["EVENT_TYPES", "STATE_TYPES", "Segment", "closed_spans", "events_of",
           "fates", "keys_of", "read_findings_table", "read_table", "segment_events",
           "write_findings_table", "write_one_file"]

_ARROW: dict[Any, pa.DataType] = {LongType(): pa.int64(), StringType(): pa.string(),
                                   BooleanType(): pa.bool_()}
_SPARK_TYPES = {f.name: f.dataType for f in EVENT_SCHEMA.fields}
#: The audited fields as the audit's Spark reader types them.
EVENT_TYPES = pa.schema([(name, _ARROW[_SPARK_TYPES[name]]) for name in AUDIT_FIELDS])
#: Carried events: the audited fields and the global writing order.
STATE_TYPES = pa.schema([*EVENT_TYPES, ("g_rank", pa.int32()), ("g_row", pa.int64())])
#: Largest decompressed gzipped JSONL segment read on the driver (4x the writer's
#: default max-bytes, as :func:`mqguard.audit.events.convert_jsonl`); larger ones
#: are read by Spark.
JSON_BYTES = 256 * 1024 * 1024
_KEY_COLUMNS = ("message_id", "new_message_id")


@dataclass(frozen=True)
class Segment:
    """One audited file's readable events (``STATE_TYPES``), and the file the audit
    proper reads for it (a Parquet copy of a gzipped JSONL segment pyarrow parsed)."""

    events: pa.Table
    audit_path: str


def _conform(table: pa.Table) -> pa.Table:
    """``table`` with exactly the audited fields, typed as Spark's reader types them
    (a field a file lacks is all null, as with Spark's explicit schema)."""
    columns = []
    for field in EVENT_TYPES:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=EVENT_TYPES)


def _json_table(path: str) -> pa.Table | None:
    """A gzipped JSONL segment parsed by pyarrow, when it reads exactly as Spark's
    reader would (every line one object of the schema's types, ended by a newline);
    None otherwise (Spark reads it then, and judges its unreadable lines)."""
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read(JSON_BYTES + 1)
    except (OSError, EOFError):
        return None
    if len(data) > JSON_BYTES or (data and not data.endswith(b"\n")):
        return None
    if not data:
        return EVENT_TYPES.empty_table()
    parse = pj.ParseOptions(explicit_schema=EVENT_TYPES, unexpected_field_behavior="ignore",
                            newlines_in_values=False)
    try:
        table = pj.read_json(pa.BufferReader(data),  # type: ignore[arg-type]
                             parse_options=parse,
                             read_options=pj.ReadOptions(block_size=16 << 20))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return None
    return table if table.num_rows == data.count(b"\n") else None


def _ordered(table: pa.Table, rank: int, rows: Any = None) -> pa.Table:
    """The readable events of ``table`` with their writing order."""
    table = _conform(table)
    rows = pa.array(np.arange(table.num_rows, dtype=np.int64)) if rows is None else rows
    table = table.append_column("g_rank", pa.array(np.full(table.num_rows, rank, np.int32)))
    table = table.append_column("g_row", rows)
    valid = pc.and_(pc.and_(pc.is_valid(table["type"]), pc.is_valid(table["ts"])),
                    pc.equal(table["v"], SCHEMA_VERSION))
    return table.filter(pc.fill_null(valid, False))


def segment_events(path: str, rank: int, copy: str | None,
                   spark_read: Callable[[str], pa.Table]) -> Segment:
    """The events of the rotated segment ``path`` (rank ``rank``).

    Parquet segments are read with pyarrow. A gzipped JSONL one is read from its
    Parquet ``copy`` when that exists (written by the run that audited it); else
    parsed by pyarrow when it reads exactly, and then written to ``copy`` (the
    audit reads the copy, so the file is parsed once, and so does a later run that
    reads it again); anything else is read by ``spark_read`` (its events with a
    ``row`` column in writing order, invalid lines dropped)."""
    local = "://" not in path and os.path.isfile(path)
    if local and path.endswith(".parquet"):
        return Segment(_ordered(_read_events(path), rank), path)
    if copy is not None and os.path.isfile(copy):
        return Segment(_ordered(_read_events(copy), rank), copy)
    parsed = _json_table(path) if local and path.endswith(".jsonl.gz") else None
    if parsed is None:
        read = spark_read(path).sort_by("row")
        return Segment(_ordered(read.drop_columns(["row"]), rank,
                                read.column("row").cast(pa.int64())), path)
    if copy is None:
        return Segment(_ordered(parsed, rank), path)
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    # Every line, readable or not: the audit counts them as it would in the original.
    pq.write_table(parsed, copy)
    return Segment(_ordered(parsed, rank), copy)


def _read_events(path: str) -> pa.Table:
    schema = pq.read_schema(path)
    return pq.read_table(path, columns=[c for c in AUDIT_FIELDS if c in schema.names])


def keys_of(events: pa.Table) -> pa.Table:
    """One row per (event, message it belongs to): its own id and a copy's id
    (``key`` and the event's ``ts``, ``type``, ``g_rank``)."""
    mid, nid = events["message_id"], events["new_message_id"]
    columns = ["ts", "type", "g_rank"]
    own = events.select(columns).append_column("key", mid).filter(pc.is_valid(mid))
    other = pc.fill_null(pc.and_(pc.is_valid(nid),
                                 pc.fill_null(pc.not_equal(nid, mid), True)), False)
    copy = events.select(columns).append_column("key", nid).filter(other)
    return pa.concat_tables([own, copy])


Keys = pa.Array | pa.ChunkedArray


def _set(keys: Keys) -> pa.Array:
    """``keys`` as the one array a set lookup takes."""
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


def events_of(events: pa.Table, keys: Keys) -> pa.Table:
    """The events of ``events`` that belong to a message of ``keys``."""
    keys = _set(keys)
    mask = pc.or_(pc.fill_null(pc.is_in(events["message_id"], value_set=keys), False),
                  pc.fill_null(pc.is_in(events["new_message_id"], value_set=keys), False))
    return events.filter(mask)


def fates(keyed: pa.Table, judged: Keys, watermark: int) -> pa.Table:
    """Per judged message: ``key``, ``first_rank``, ``last_rank``, ``open`` (no terminal
    fate, or an event after ``watermark``)."""
    keyed = keyed.filter(pc.fill_null(pc.is_in(keyed["key"], value_set=_set(judged)), False))
    terminal = pc.is_in(keyed["type"], value_set=pa.array([str(t) for t in TERMINAL]))
    keyed = keyed.append_column("terminal", pc.fill_null(terminal, False))
    per_key = keyed.group_by("key").aggregate([
        ("ts", "max"), ("terminal", "max"), ("g_rank", "min"), ("g_rank", "max")])
    closed = pc.and_(per_key["terminal_max"], pc.less_equal(per_key["ts_max"], watermark))
    return pa.table({"key": per_key["key"],
                     "first_rank": per_key["g_rank_min"].cast(pa.int32()),
                     "last_rank": per_key["g_rank_max"].cast(pa.int32()),
                     "open": pc.invert(pc.fill_null(closed, False))})


def closed_spans(parts: Iterable[pa.Table], open_keys: Keys | None) -> pa.Table:
    """One row per closed id (``key``, ``first_rank``, ``last_rank``): the widest span
    of its rows in ``parts`` (every file that holds an event of it lies between its
    first and last), without the ids of ``open_keys`` (judged again, open now)."""
    tables = [t.select(["key", "first_rank", "last_rank"]) for t in parts]
    if not tables:
        return pa.table({"key": pa.array([], pa.string()),
                         "first_rank": pa.array([], pa.int32()),
                         "last_rank": pa.array([], pa.int32())})
    table = pa.concat_tables(tables, promote_options="permissive")
    if len(tables) > 1:
        spans = table.group_by("key").aggregate([("first_rank", "min"), ("last_rank", "max")])
        table = pa.table({"key": spans["key"],
                          "first_rank": spans["first_rank_min"].cast(pa.int32()),
                          "last_rank": spans["last_rank_max"].cast(pa.int32())})
    if open_keys is not None and len(open_keys):
        table = table.filter(pc.invert(pc.fill_null(
            pc.is_in(table["key"], value_set=_set(open_keys)), False)))
    return table


def read_table(directory: str) -> pa.Table:
    """Every Parquet file of ``directory`` (Spark's or pyarrow's) as one table."""
    return pq.read_table(directory)


def write_one_file(events: pa.Table, path: str) -> pa.Table:
    """``events`` (``STATE_TYPES``) as one Parquet file in writing order, each event
    once; the table written."""
    events = events.select(STATE_TYPES.names).cast(STATE_TYPES)
    events = events.sort_by([("g_rank", "ascending"), ("g_row", "ascending")])
    if events.num_rows > 1:
        rank = events["g_rank"].to_numpy()
        row = events["g_row"].to_numpy()
        first = np.ones(events.num_rows, dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (row[1:] != row[:-1])
        if not first.all():
            events = events.filter(pa.array(first))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(events, path)
    return events


def read_findings_table(directory: str) -> pa.Table | None:
    """The findings under ``directory`` (partitioned by class), None when there are none."""
    if not os.path.isdir(directory) or not any(
            n.startswith("class=") for n in os.listdir(directory)):
        return None
    return ds.dataset(directory, format="parquet", partitioning="hive").to_table()


def write_findings_table(findings: Sequence[pa.Table], directory: str) -> None:
    """``findings`` as one set partitioned by class, as the audit writes them."""
    os.makedirs(directory, exist_ok=True)
    tables = [t for t in findings if t.num_rows]
    if not tables:
        return
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.set_column(table.schema.get_field_index("class"), "class",
                             table["class"].cast(pa.string()))
    pq.write_to_dataset(table, directory, partition_cols=["class"])
