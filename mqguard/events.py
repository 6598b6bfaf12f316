"""The event log: every decision the guard makes, as one JSON object per line.

It is the Spark audit's main input, so it must be complete: the pipeline
writes an event for every send outcome and every delivery outcome. It must also
be cheap: :meth:`EventLog.emit` only appends a small dict to a buffer; a
background thread encodes and writes, at the latest every
``flush-interval-ms`` and whenever ``buffer-events`` accumulate. Nothing is
dropped: if the writer falls far behind, ``emit`` writes synchronously
(back-pressure), and :meth:`EventLog.close` (also run at interpreter exit)
writes whatever is left. A SIGKILL skips that: with ``sync`` (``[mqguard.event-log]
sync = true``) every event is written by ``emit`` itself, so none is lost that way.

Schema (version 1, documented in ``docs/events.md``)::

    {"v": 1, "ts": <epoch ms>, "type": "<EventType>", "node": "<node id>",
     "address": "...", "message_id": "...", ...optional fields, absent when unset}
"""

from __future__ import annotations

import atexit
import enum
import gzip
import json
import logging
import os
import queue
import re
import shutil
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from mqguard.message import Message

SCHEMA_VERSION = 1

_log = logging.getLogger("mqguard.events")


class EventType(enum.StrEnum):
    """Every kind of decision. The audit relies on these names: never rename one."""

    #: The broker confirmed a guarded send.
    SENT = "sent"
    #: The send failed (broker error, timeout); the outcome may be unknown.
    SEND_FAILED = "send_failed"
    #: A plugin rejected the send; the caller got an error.
    REJECTED = "rejected"
    #: A plugin dropped the send; the caller was told it succeeded.
    DROPPED = "dropped"
    #: Dropped because its duplicate id was already cached.
    DUPLICATE_REJECTED = "duplicate_rejected"
    #: A transaction committed / rolled back.
    TX_COMMITTED = "tx_committed"
    TX_ROLLED_BACK = "tx_rolled_back"
    #: A message was handed to the application handler.
    DELIVERED = "delivered"
    #: A delivery was acknowledged (field ``ack_reason``).
    ACKED = "acked"
    #: A delivery was negatively acknowledged to the broker.
    NACKED = "nacked"
    #: The handler raised; field ``reason`` holds the exception.
    HANDLER_FAILED = "handler_failed"
    REDELIVERY_SCHEDULED = "redelivery_scheduled"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED = "expired"
    #: The consumer audit found a duplicate delivery and kept it from the handler.
    DUPLICATE_DELIVERY_SUPPRESSED = "duplicate_delivery_suppressed"
    #: The consumer audit found a duplicate delivery and let it through (action = log).
    DUPLICATE_DELIVERY_LOGGED = "duplicate_delivery_logged"
    #: A copy was sent to another address (field ``target``).
    MOVED = "moved"
    #: A delivery was discarded by a plugin without reaching the handler.
    DELIVERY_DROPPED = "delivery_dropped"
    #: ``mqguard dlq retry``: a dead letter was sent back (field ``target``) as a copy with
    #: the id ``new_message_id``, whose second life the audit follows like a sent message.
    DLQ_RETRIED = "dlq_retried"
    #: ``mqguard dlq purge``: a dead letter was deleted.
    DLQ_PURGED = "dlq_purged"
    #: ``mqguard dlq list`` / ``show``: an address was inspected (fields ``count``, ``reason``).
    DLQ_INSPECTED = "dlq_inspected"


def message_fields(message: Message) -> dict[str, Any]:
    """The event fields that describe ``message``."""
    record = _record(0, "", "", message)
    for key in ("v", "ts", "type", "node"):
        del record[key]
    return record


_SAFE_NODE = re.compile(r"[^A-Za-z0-9_.-]")


def _record(ts: int, event_type: str, node: str, message: Message) -> dict[str, Any]:
    """An event's record with the fields that describe ``message`` (:func:`message_fields`).

    Two events per delivery and one per send make this the hot path of the log: one dict
    display and a test per optional field measured 0.7-0.8 µs a record, against ~2 µs
    for a copied head plus an item assignment per field."""
    record: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": ts, "type": event_type, "node": node,
                              "address": message.address, "message_id": message.message_id}
    if message.duplicate_id is not None:
        record["duplicate_id"] = message.duplicate_id
    if message.producer_id is not None:
        record["producer_id"] = message.producer_id
        record["seq"] = message.sequence
    if message.expiration:
        record["expiration"] = message.expiration
    if message.delivery_count:
        record["delivery_count"] = message.delivery_count
    if message.broker_message_id is not None:
        record["broker_message_id"] = message.broker_message_id
    return record


class EventLog:
    """Buffered, rotating JSONL writer. Thread-safe; one file per process (node)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        node_id: str,
        max_bytes: int = 64 * 1024 * 1024,
        backup_count: int = 20,
        flush_interval_ms: int = 200,
        buffer_events: int = 4096,
        fsync: bool = False,
        sync: bool = False,
        rotated_format: str = "parquet",
    ) -> None:
        if rotated_format not in ROTATED_FORMATS:
            raise ValueError(f"rotated_format {rotated_format!r}: expected one of "
                             f"{', '.join(ROTATED_FORMATS)}")
        self._rotated_format = rotated_format
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.node_id = node_id
        self._stem = f"events-{_SAFE_NODE.sub('_', node_id)}"
        self.path = self.directory / f"{self._stem}.jsonl"
        self._max_bytes = max_bytes
        self._backup_count = backup_count
        self._interval = flush_interval_ms / 1000.0
        self._buffer_events = buffer_events
        # Past this many pending events, emit() writes itself: memory stays
        # bounded and nothing is dropped when the disk is slow.
        self._max_pending = buffer_events * 16
        self._fsync = fsync
        # Synchronous: emit() writes before it returns, so an event the guard acted on is in
        # the file (the OS's page cache) even if the process is SIGKILLed the next instant.
        self._sync = sync
        # A deque, not a list under a lock: append and popleft are atomic, so emit()
        # takes no lock at all, and flush() can drain it while emitters keep appending.
        self._pending: deque[dict[str, Any]] = deque()
        self._flush_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._closed = False
        self._file = open(self.path, "ab")  # noqa: SIM115 - owned for the log's lifetime
        self._size = self._file.tell()
        self._rotation = self._next_rotation_number()
        #: Closed segments waiting for their conversion (see _rotate); None ends it.
        self._segments: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._converter: threading.Thread | None = None
        if rotated_format == "parquet":
            # Started now, so that it imports pyarrow (a few hundred ms holding the GIL)
            # while the process starts, not in the middle of the first rotation.
            self._start_converter()
        # A segment a process left unconverted (it ended during the conversion) is
        # converted now; until then it is read as the JSONL it is.
        for segment in self._rotated_files():
            if segment.name.endswith(".jsonl"):
                self._convert_later(segment)
        self._writer = threading.Thread(target=self._run, name="mqguard-eventlog", daemon=True)
        self._writer.start()
        _open_logs.add(self)

    # -- producing events ---------------------------------------------------------

    def emit(self, event_type: EventType | str, message: Message | None = None,
             **fields: Any) -> None:
        """Record one event. Cheap: no I/O, no JSON encoding on the caller's thread."""
        if self._closed:
            raise RuntimeError(f"event log {self.path} is closed; event {event_type} not written")
        ts = time.time_ns() // 1_000_000
        record = (_record(ts, str(event_type), self.node_id, message) if message is not None
                  else {"v": SCHEMA_VERSION, "ts": ts, "type": str(event_type),
                        "node": self.node_id})
        for key, value in fields.items():
            if value is not None:
                record[key] = value
        pending = self._pending
        pending.append(record)
        self._after_append(len(pending))

    def emit_many(self, event_type: EventType | str, messages: Iterable[Message], *,
                  ts: int | None = None, names: tuple[str, ...] = (),
                  values: Iterable[tuple[Any, ...]] | None = None) -> None:
        """Record one event per message at one timestamp (``ts``, default now).

        The same records :meth:`emit` writes, built in one loop and appended in one
        ``extend``: the send path records the ``sent`` events of a whole batch of
        confirmations at once, the deliver path the ``delivered`` / ``acked`` events
        of one read. Further fields: ``names`` and, per message, a tuple of their
        ``values`` (None values are left out, as :meth:`emit` does), e.g.
        ``names=("queue",), values=[("orders",), ...]``.
        """
        if self._closed:
            raise RuntimeError(f"event log {self.path} is closed; event {event_type} not written")
        if ts is None:
            ts = time.time_ns() // 1_000_000
        kind, node = str(event_type), self.node_id
        if values is None:
            records = [_record(ts, kind, node, message) for message in messages]
        else:
            records = []
            for message, row in zip(messages, values, strict=True):
                record = _record(ts, kind, node, message)
                for name, value in zip(names, row, strict=True):
                    if value is not None:
                        record[name] = value
                records.append(record)
        pending = self._pending
        pending.extend(records)
        self._after_append(len(pending))

    def _after_append(self, backlog: int) -> None:
        if self._sync:
            self.flush()
            return
        if backlog >= self._buffer_events:
            # Set once: until the writer drains the backlog, every emit gets here, and
            # setting an Event takes its lock.
            if not self._wakeup.is_set():
                self._wakeup.set()
            if backlog >= self._max_pending:
                self.flush()

    # -- writing --------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event now."""
        # One flusher at a time, so batches reach the file in emission order.
        with self._flush_lock:
            pending = self._pending
            batch = [pending.popleft() for _ in range(len(pending))]
            if batch:
                self._write(batch)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        # orjson: ~5x faster than json; the writer shares the GIL with the hot path.
        data = b"".join([orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
                         for record in batch])
        with self._write_lock:
            self._file.write(data)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._size += len(data)
            if self._size >= self._max_bytes:
                self._rotate()

    def _run(self) -> None:
        while not self._closed:
            self._wakeup.wait(self._interval)
            self._wakeup.clear()
            try:
                self.flush()
            except Exception:
                time.sleep(self._interval)

    # -- rotation ---------------------------------------------------------------------

    def _rotated_files(self) -> list[Path]:
        """This node's rotated segments (Parquet, gzip, or JSONL awaiting conversion),
        oldest first."""
        found = [(int(m.group(1)), p) for p in self.directory.glob(f"{self._stem}.*")
                 if (m := _ROTATED_NAME.fullmatch(p.name.removeprefix(self._stem)))]
        return [p for _, p in sorted(found)]

    def _next_rotation_number(self) -> int:
        numbers = [int(m.group(1)) for p in self._rotated_files()
                   if (m := _ROTATED_NAME.fullmatch(p.name.removeprefix(self._stem)))]
        return max(numbers, default=0) + 1

    def _rotate(self) -> None:
        # Called with _write_lock held. The full file is renamed to its segment's name
        # (still JSONL, read as such) and a new live file opened at once; the conversion
        # runs on a thread of its own (_convert_segments). It takes about 2 s of CPU per
        # 64 MiB: done here, it held the writer, and pyarrow's threads took every core
        # for a second, which showed in the sidecar's latency tail on a small machine.
        self._file.close()
        segment = self.directory / f"{self._stem}.{self._rotation:06d}.jsonl"
        os.replace(self.path, segment)
        self._rotation += 1
        self._file = open(self.path, "wb")  # noqa: SIM115
        self._size = 0
        self._convert_later(segment)

    def _convert_later(self, segment: Path) -> None:
        self._segments.put(segment)
        self._start_converter()

    def _start_converter(self) -> None:
        if self._converter is None:
            self._converter = threading.Thread(target=self._convert_segments,
                                               name="mqguard-eventlog-rotate", daemon=True)
            self._converter.start()

    def _convert_segments(self) -> None:
        _lower_thread_priority()
        while (segment := self._segments.get()) is not None:
            try:
                if self._rotated_format == "parquet":
                    # Imported at first use, inside the try: an import that fails (out of
                    # descriptors, say) is tried again at the next segment instead of
                    # ending this thread.
                    import pyarrow.json
                    import pyarrow.parquet  # noqa: F401 - used by _to_parquet
                self._convert(segment)
            except Exception as exc:
                # It stays JSONL, which every reader reads: nothing is lost.
                _log.warning("event-log segment %s not converted (%s: %s); kept as JSONL",
                             segment, type(exc).__name__, exc)
                _log.debug("event-log segment %s not converted", segment, exc_info=True)
            if self._backup_count:
                try:
                    for old in self._rotated_files()[: -self._backup_count]:
                        old.unlink(missing_ok=True)
                except OSError as exc:
                    _log.warning("old event-log segments not pruned: %s", exc)

    def _convert(self, segment: Path) -> None:
        """The JSONL ``segment`` as Parquet or ``.jsonl.gz``, written under a temporary
        name and renamed, then the JSONL removed."""
        if not segment.exists():
            return  # pruned by backup-count before its turn
        stem = segment.with_suffix("")  # events-<node>.<NNNNNN>
        converted = False
        if self._rotated_format == "parquet":
            converted = _to_parquet(segment, stem.with_name(stem.name + ".parquet"),
                                    use_threads=False)
        if not converted:
            # jsonl.gz by choice, or a segment Parquet cannot hold exactly (a line cut
            # by a killed process, a field of another type): kept whole, gzipped.
            target = stem.with_name(stem.name + ".jsonl.gz")
            partial = target.with_name(target.name + ".partial")
            with (open(segment, "rb") as src,
                  gzip.open(partial, "wb", compresslevel=6) as dst):
                shutil.copyfileobj(src, dst)
            partial.rename(target)
        segment.unlink()

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Write everything pending and close the file. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        self._writer.join(timeout=10)
        self.flush()
        with self._write_lock:
            self._file.close()
        if self._converter is not None:
            # The conversions still queued finish first (a segment left unconverted
            # would be read as JSONL anyway, and converted by the node's next writer).
            self._segments.put(None)
            self._converter.join(timeout=CLOSE_CONVERT_TIMEOUT_S)
        _open_logs.discard(self)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NullEventLog(EventLog):
    """An event log that writes nothing (``[mqguard.event-log] enabled = false``)."""

    def __init__(self, node_id: str = "null") -> None:
        self.node_id = node_id

    def emit(self, event_type: EventType | str, message: Message | None = None,
             **fields: Any) -> None:
        return None

    def emit_many(self, event_type: EventType | str, messages: Iterable[Message], *,
                  ts: int | None = None, names: tuple[str, ...] = (),
                  values: Iterable[tuple[Any, ...]] | None = None) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


_open_logs: weakref.WeakSet[EventLog] = weakref.WeakSet()


@atexit.register
def _close_open_logs() -> None:
    # A process that forgets close() must still not lose its last events.
    for log in list(_open_logs):
        log.close()


def iter_event_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Expand directories into their event files (rotated ones first, in order:
    ``.parquet`` and ``.jsonl.gz`` segments by name, then the live ``.jsonl`` files).
    Segments still being converted (``*.partial``) are never listed."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted([*path.glob("*.jsonl.gz"), *path.glob("*.parquet")])
            yield from sorted(path.glob("*.jsonl"))
        else:
            yield path


def read_events(*paths: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Read events back from files or directories (``.jsonl``, ``.jsonl.gz`` and
    ``.parquet`` segments), each as the dict the writer wrote: absent fields absent.

    The writer ends every event with a newline, so a last line without one is an event
    cut short by a crash of its writer (SIGKILL halfway through a write): it is left
    out, as the audit's reader leaves it out. Any other line that is not JSON raises."""
    for path in iter_event_files(paths):
        if path.suffix == ".parquet":
            yield from _read_parquet(path)
            continue
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n") and not _json_complete(line):
                    break  # the torn end of a killed writer's file
                if line.strip():
                    yield json.loads(line)


def _json_complete(line: str) -> bool:
    """Whether ``line`` parses as JSON (an unterminated last line may still be whole)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


# -- Parquet segments ------------------------------------------------------------------

#: Formats of rotated segments (``[mqguard.event-log] rotated-format``).
ROTATED_FORMATS = ("parquet", "jsonl.gz")
#: A rotated segment's name after the stem: ``.<number>.parquet`` / ``.<number>.jsonl.gz``,
#: or ``.<number>.jsonl`` while it waits for its conversion.
_ROTATED_NAME = re.compile(r"\.(\d{6,})\.(?:parquet|jsonl\.gz|jsonl)")
#: How long :meth:`EventLog.close` waits for queued conversions (a bound for a stuck disk).
CLOSE_CONVERT_TIMEOUT_S = 120.0
#: The converting thread's nice value (Linux: per thread): a rotation yields the CPU
#: to the guard's hot path, the broker and the clients on a busy machine.
CONVERTER_NICE = 10


def _lower_thread_priority() -> None:
    """Lower the calling thread's priority, where a thread can have its own (Linux)."""
    if sys.platform != "linux":
        return  # elsewhere setpriority(PRIO_PROCESS, id) targets processes, not threads
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(current, CONVERTER_NICE))
    except OSError:
        pass  # not permitted here: the conversion still runs, at normal priority

#: Types of every field of schema version 1 (docs/events.md): Parquet columns are
#: typed, and a segment's columns must not depend on which fields it happened to hold.
FIELD_TYPES: dict[str, type] = {
    "v": int, "ts": int, "type": str, "node": str, "address": str, "message_id": str,
    "duplicate_id": str, "producer_id": str, "seq": int, "expiration": int,
    "delivery_count": int, "native_delivery_count": int, "delay_ms": int, "mechanism": str,
    "broker_message_id": str, "queue": str, "transaction": str, "reason": str,
    "target": str, "new_message_id": str, "ack_reason": str, "handled": bool,
    "delivered_ts": int, "requeue": bool, "count": int, "group": str, "mode": str,
    "target_node": str, "source_node": str, "bridge_id": str,
}


def _arrow_schema() -> Any:
    import pyarrow as pa

    kinds: dict[type, pa.DataType] = {int: pa.int64(), str: pa.string(), bool: pa.bool_()}
    return pa.schema([(name, kinds[kind]) for name, kind in FIELD_TYPES.items()])


def _to_parquet(source: Path, target: Path, *, use_threads: bool = True) -> bool:
    """Convert the JSONL segment ``source`` to ``target`` (via ``target.partial`` and a
    rename). False, and nothing written, when a line does not fit the schema: the
    caller then keeps the segment as JSONL, so no event is ever lost to a conversion.
    ``use_threads=False`` parses on the calling thread only (pyarrow's pool would
    otherwise take every core)."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    partial = target.with_name(target.name + ".partial")
    try:
        table = pj.read_json(source, read_options=pj.ReadOptions(use_threads=use_threads),
                             parse_options=pj.ParseOptions(
            explicit_schema=_arrow_schema(),
            # Fields added after this writer (docs/events.md allows new optional
            # ones) are kept with the type read, not dropped.
            unexpected_field_behavior="infer",
            newlines_in_values=False))
        # Dictionary-encoded strings (types, nodes, addresses, queues repeat) and
        # zstd: small files the audit reads column by column.
        pq.write_table(table, partial, compression="zstd", use_dictionary=True,
                       row_group_size=1 << 20)
    except Exception:
        partial.unlink(missing_ok=True)
        return False
    partial.rename(target)
    return True


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
        for row in batch.to_pylist():
            yield {k: v for k, v in row.items() if v is not None}
