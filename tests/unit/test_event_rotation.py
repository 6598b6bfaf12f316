"""Rotated event-log segments: Parquet by default, gzipped JSONL on request or when a
segment cannot be converted exactly; readers see every event once, never a partial file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mqguard.config import ConfigError, parse_config
from mqguard.events import EventLog, EventType, iter_event_files, read_events
from mqguard.message import Message


def _write(directory: Path, count: int, **options: object) -> None:
    with EventLog(directory, node_id="n", max_bytes=4096, buffer_events=10, backup_count=0,
                  **options) as log:  # type: ignore[arg-type]
        for i in range(count):
            log.emit(EventType.DELIVERED, Message("orders", message_id=str(i)), queue="q",
                     delivery_count=1)
            log.emit(EventType.ACKED, Message("orders", message_id=str(i)), queue="q",
                     ack_reason="normal", handled=True, delivered_ts=17 + i)


def test_rotated_segments_are_parquet_and_read_back_as_written(tmp_path: Path) -> None:
    _write(tmp_path, 500)
    segments = sorted(tmp_path.glob("events-n.*.parquet"))
    assert len(segments) >= 3 and not list(tmp_path.glob("*.gz"))
    table = pq.read_table(segments[0])
    # Typed columns: numbers stay numbers, booleans booleans.
    assert str(table.schema.field("ts").type) == "int64"
    assert str(table.schema.field("handled").type) == "bool"
    events = list(read_events(tmp_path))
    assert len(events) == 1000
    # Writing order kept (rotated segments first, by number, then the live file).
    assert [e["message_id"] for e in events[::2]] == [str(i) for i in range(500)]
    acked = events[1]
    assert acked == {"v": 1, "ts": acked["ts"], "type": "acked", "node": "n",
                     "address": "orders", "message_id": "0", "queue": "q",
                     "ack_reason": "normal", "handled": True, "delivered_ts": 17}
    assert "delivery_count" not in acked  # absent fields stay absent


def test_partial_segments_are_never_read_and_old_gzip_segments_still_are(
        tmp_path: Path) -> None:
    _write(tmp_path, 200, rotated_format="jsonl.gz")
    gz = sorted(tmp_path.glob("events-n.*.jsonl.gz"))
    assert gz
    before = len(list(read_events(tmp_path)))
    # A writer that switched to Parquet continues the numbering after the gzip segments.
    _write(tmp_path, 200)
    numbers = sorted(int(p.name.split(".")[1]) for p in iter_event_files([tmp_path])
                     if p.name != "events-n.jsonl")
    assert numbers == list(range(1, len(numbers) + 1))
    assert list(tmp_path.glob("events-n.*.parquet"))
    # A conversion in progress: never listed, never read.
    (tmp_path / "events-n.999999.parquet.partial").write_bytes(b"PAR1 half")
    assert all(not p.name.endswith(".partial") for p in iter_event_files([tmp_path]))
    assert len(list(read_events(tmp_path))) == before + 400


def test_a_segment_parquet_cannot_hold_is_kept_as_gzip(tmp_path: Path) -> None:
    log = EventLog(tmp_path, node_id="n", max_bytes=10_000_000)
    # A half line, as a killed process leaves it, then a complete one appended after.
    log._file.write(b'{"v": 1, "ts": 17000000\n')
    log.emit(EventType.SENT, Message("orders", message_id="m"))
    log.flush()
    with log._write_lock:
        log._rotate()
    log.close()
    (segment,) = tmp_path.glob("events-n.*.jsonl.gz")
    assert not list(tmp_path.glob("*.parquet*"))
    lines = gzip.decompress(segment.read_bytes()).splitlines()
    assert lines[0] == b'{"v": 1, "ts": 17000000' and b'"m"' in lines[1]


def test_bad_rotated_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rotated_format 'csv'"):
        EventLog(tmp_path, node_id="n", rotated_format="csv")
    with pytest.raises(ConfigError, match="rotated-format"):
        parse_config({"mqguard": {"event-log": {"rotated-format": "csv"}}}, "t.toml")
    config = parse_config({"mqguard": {"event-log": {"rotated-format": "jsonl.gz"}}}, "t.toml")
    assert config.core.event_log.rotated_format == "jsonl.gz"
    assert parse_config({}, "t.toml").core.event_log.rotated_format == "parquet"
