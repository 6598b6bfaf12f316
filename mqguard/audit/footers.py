"""Address names and time range of local Parquet event files, without a Spark pass.

The lean plan needs two things before its main pass: every address (and dead-letter
or expiry target) name, to resolve per-address limits and to turn 64-bit address
hashes back into names, and the time range of the readable events (the watermark
and the chart buckets). A Spark pass over the address, target and time columns cost
10-14 s of wall at 10 million events (a job, its planning, a scan of 35 files); the
Parquet files already hold both answers in a form pyarrow reads in milliseconds:

- the time range from each row group's statistics of ``ts``, when they prove every
  row readable (``v`` is the schema version throughout, no ``ts`` or ``type`` is
  null); otherwise from the ``v``, ``ts`` and ``type`` columns themselves;
- the names from the ``address`` and ``target`` columns read as dictionaries: a
  Parquet writer stores a few distinct names once per column chunk plus small
  indices, so this decodes the indices and looks at each distinct value once.

Only local files are read so (a URL's bytes would cross the network to the driver);
the caller runs the Spark pass over everything else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mqguard.audit.events import AuditInputError
from mqguard.events import SCHEMA_VERSION

#: The columns this module reads; a file without one of them has it as all null,
#: as Spark's reader with the explicit schema gives it.
NAME_COLUMNS = ("address", "target")
_READABLE_COLUMNS = ("v", "ts", "type")


@dataclass
class FileNames:
    """What :func:`parquet_names` found: distinct non-null names, readable time range."""

    names: set[str] = field(default_factory=set)
    first_ts: int | None = None
    last_ts: int | None = None

    def add_range(self, low: int | None, high: int | None) -> None:
        if low is not None:
            self.first_ts = low if self.first_ts is None else min(self.first_ts, low)
        if high is not None:
            self.last_ts = high if self.last_ts is None else max(self.last_ts, high)

    def merge(self, other: FileNames) -> None:
        self.names |= other.names
        self.add_range(other.first_ts, other.last_ts)


def parquet_names(paths: Iterable[str]) -> FileNames:
    """The names and readable time range of the local Parquet event files ``paths``."""

    found = FileNames()
    for path in paths:
        try:
            found.merge(_file_names(path))
        except FileNotFoundError:
            continue  # deleted since the listing (backup-count): Spark skips it too
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise AuditInputError(f"{path}: not a readable Parquet event file ({exc})") from exc
    return found


def _file_names(path: str) -> FileNames:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    present = set(parquet.schema_arrow.names)
    found = FileNames(_distinct_names(path, parquet.metadata.num_rows,
                                      [c for c in NAME_COLUMNS if c in present]))
    from_stats = _range_from_statistics(parquet.metadata, present)
    found.add_range(*(_range_from_columns(parquet, present) if from_stats is None
                      else from_stats))
    return found


def _distinct_names(path: str, rows: int, columns: list[str]) -> set[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not columns or rows == 0:
        return set()
    table = pq.ParquetFile(path, read_dictionary=columns).read(columns=columns)
    names: set[str] = set()
    for name in columns:
        for chunk in table.column(name).chunks:
            if isinstance(chunk, pa.DictionaryArray):
                # The values the rows use, not the whole dictionary page.
                used = chunk.dictionary.take(pc.unique(chunk.indices.drop_null()))
            else:
                used = pc.unique(chunk)
            names.update(value for value in used.to_pylist() if value is not None)
    return names


Range = tuple[int | None, int | None]


def _range_from_statistics(metadata: Any, present: set[str]) -> Range | None:
    """(first, last) ``ts`` from the row groups' statistics, or None when they do not
    prove every row readable (or are missing)."""
    if not set(_READABLE_COLUMNS) <= present:
        return None
    index = {metadata.schema.column(i).name: i for i in range(metadata.num_columns)}
    low: int | None = None
    high: int | None = None
    for group_number in range(metadata.num_row_groups):
        group = metadata.row_group(group_number)
        if group.num_rows == 0:
            continue
        stats = {name: group.column(index[name]).statistics for name in _READABLE_COLUMNS}
        if any(s is None or s.null_count is None or s.null_count for s in stats.values()):
            return None
        if not (stats["v"].has_min_max and stats["ts"].has_min_max
                and stats["v"].min == SCHEMA_VERSION == stats["v"].max):
            return None
        low = stats["ts"].min if low is None else min(low, stats["ts"].min)
        high = stats["ts"].max if high is None else max(high, stats["ts"].max)
    return low, high


def _range_from_columns(parquet: Any, present: set[str]) -> Range:
    """(first, last) ``ts`` of the readable rows, read from the columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not set(_READABLE_COLUMNS) <= present:
        return None, None  # a missing column is all null: no row is readable
    table = parquet.read(columns=list(_READABLE_COLUMNS))
    readable = pc.and_(pc.and_(pc.is_valid(table.column("type")), pc.is_valid(table.column("ts"))),
                       pc.equal(table.column("v"), pa.scalar(SCHEMA_VERSION)))
    times = table.column("ts").filter(pc.fill_null(readable, False))
    if len(times) == 0:
        return None, None
    bounds = pc.min_max(times)
    return bounds["min"].as_py(), bounds["max"].as_py()
