"""Rotated event-log segments: Parquet by default, gzipped JSONL on request or when a
segment cannot be converted exactly; readers see every event once, never a partial file."""

from __future__ import annotations

import gzip
import json
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


def _events_of(count: int, start: int = 0) -> list[Message]:
    return [Message("orders", message_id=str(i)) for i in range(start, start + count)]


def test_a_rotation_does_not_wait_for_its_conversion(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The full file becomes a JSONL segment at once and the writer goes on; the
    conversion runs on its own thread, at a lower priority (Linux), and close() waits
    for it. Meanwhile readers see every event once, in order."""
    import os
    import sys
    import threading

    import mqguard.events as events_module

    release = threading.Event()
    seen_nice: list[int] = []
    original = events_module._to_parquet

    def slow_to_parquet(source: Path, target: Path, *, use_threads: bool = True) -> bool:
        seen_nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert use_threads is False  # one core: the hot path keeps the other
        assert release.wait(10)
        return original(source, target, use_threads=use_threads)

    monkeypatch.setattr(events_module, "_to_parquet", slow_to_parquet)
    log = EventLog(tmp_path, node_id="n", max_bytes=4096, buffer_events=10)
    for message in _events_of(100):
        log.emit(EventType.SENT, message)
    log.flush()
    segment = tmp_path / "events-n.000001.jsonl"
    assert segment.exists()  # rotated, conversion pending (blocked above)
    for message in _events_of(100, start=100):
        log.emit(EventType.SENT, message)
    log.flush()  # the writer was not held by the conversion
    ids = [int(event["message_id"]) for event in read_events(tmp_path)]
    assert ids == list(range(200))
    release.set()
    log.close()
    assert not list(tmp_path.glob("events-n.0*.jsonl"))  # every segment converted
    assert [int(e["message_id"]) for e in read_events(tmp_path)] == list(range(200))
    assert seen_nice
    if sys.platform == "linux":
        assert min(seen_nice) >= events_module.CONVERTER_NICE


def test_a_segment_left_unconverted_is_converted_by_the_next_writer(tmp_path: Path) -> None:
    with EventLog(tmp_path, node_id="n", max_bytes=10_000_000) as log:
        for message in _events_of(5):
            log.emit(EventType.SENT, message)
    # As a process leaves it when it ends during a conversion: the renamed JSONL.
    (tmp_path / "events-n.jsonl").rename(tmp_path / "events-n.000001.jsonl")
    (tmp_path / "events-n.000001.parquet.partial").write_bytes(b"PAR1 half")
    assert [int(e["message_id"]) for e in read_events(tmp_path)] == list(range(5))
    with EventLog(tmp_path, node_id="n", max_bytes=4096, buffer_events=10) as log:
        for message in _events_of(100, start=5):
            log.emit(EventType.SENT, message)
    assert (tmp_path / "events-n.000001.parquet").exists()
    assert not (tmp_path / "events-n.000001.jsonl").exists()
    numbers = sorted(int(p.name.split(".")[1]) for p in tmp_path.glob("events-n.0*.parquet"))
    assert numbers == list(range(1, len(numbers) + 1))  # the numbering went on after it
    assert [int(e["message_id"]) for e in read_events(tmp_path)] == list(range(105))


def test_a_torn_last_line_is_left_out_and_a_bad_line_inside_raises(tmp_path: Path) -> None:
    """A writer SIGKILLed halfway through a write leaves its last event without the
    newline every event ends with: reading skips that one (as the audit does), while a
    line that is not JSON anywhere else is corruption and raises."""
    good = '{"v":1,"ts":1,"type":"sent"}\n{"v":1,"ts":2,"type":"acked"}\n'
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "events-n.jsonl").write_text(good + '{"v":1,"ts":3,"type":"redis')
    assert [e["ts"] for e in read_events(tmp_path / "torn")] == [1, 2]
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "events-n.jsonl").write_text(good + '{"v":1,"ts":3,"type":"x"}')
    assert [e["ts"] for e in read_events(tmp_path / "whole")] == [1, 2, 3]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "events-n.jsonl").write_text('{"v":1,"ts":1,"ty\n' + good)
    with pytest.raises(json.JSONDecodeError):
        list(read_events(tmp_path / "bad"))


def test_a_failed_pyarrow_import_keeps_jsonl_and_later_segments_convert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of descriptors, importing pyarrow fails: that segment stays JSONL (nothing is
    lost), the converter says why without a traceback, and goes on with the next one."""
    import builtins
    import sys

    real_import = builtins.__import__
    failures = [OSError(24, "Too many open files")]

    def flaky_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("pyarrow") and failures:
            raise failures.pop()
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    for module in [m for m in sys.modules if m == "pyarrow.json"]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(builtins, "__import__", flaky_import)
    with caplog.at_level("WARNING", logger="mqguard.events"):
        _write(tmp_path, 500)
    kept = sorted(tmp_path.glob("events-n.*.jsonl"))
    converted = sorted(tmp_path.glob("events-n.*.parquet"))
    assert not failures and len(kept) == 1 and len(converted) >= 2, (kept, converted)
    assert len(list(read_events(tmp_path))) == 1000
    warning = next(r for r in caplog.records if "not converted" in r.getMessage())
    assert "Too many open files" in warning.getMessage() and warning.exc_info is None
