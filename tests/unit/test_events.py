"""The JSONL event log: schema, buffering, rotation, nothing lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from mqguard.events import SCHEMA_VERSION, EventLog, EventType, read_events
from mqguard.message import Message


def test_events_have_the_schema_fields(tmp_path: Path) -> None:
    with EventLog(tmp_path, node_id="n1") as log:
        msg = Message("orders", b"x", message_id="m1", duplicate_id="d1", producer_id="p",
                      sequence=3)
        log.emit(EventType.SENT, msg, transaction=None)
    (event,) = list(read_events(tmp_path))
    assert event["v"] == SCHEMA_VERSION
    assert event["type"] == "sent" and event["node"] == "n1"
    assert (event["address"], event["message_id"], event["duplicate_id"]) == ("orders", "m1", "d1")
    assert (event["producer_id"], event["seq"]) == ("p", 3)
    assert "transaction" not in event  # None fields are omitted
    assert isinstance(event["ts"], int)


def test_time_bound_flush_without_close(tmp_path: Path) -> None:
    log = EventLog(tmp_path, node_id="n", flush_interval_ms=20)
    log.emit(EventType.SENT, Message("a", message_id="1"))
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not list(read_events(tmp_path)):
        time.sleep(0.01)
    assert len(list(read_events(tmp_path))) == 1
    log.close()


def test_rotation_compresses_and_loses_nothing(tmp_path: Path) -> None:
    with EventLog(tmp_path, node_id="n", max_bytes=4096, buffer_events=10,
                  rotated_format="jsonl.gz") as log:
        for i in range(2000):
            log.emit(EventType.SENT, Message("a", message_id=str(i)))
    assert list(tmp_path.glob("events-n.*.jsonl.gz")), "rotation produced no gzip file"
    ids = [int(e["message_id"]) for e in read_events(tmp_path)]
    assert sorted(ids) == list(range(2000))


def test_backup_count_bounds_rotated_files(tmp_path: Path) -> None:
    with EventLog(tmp_path, node_id="n", max_bytes=4096, backup_count=2, buffer_events=5) as log:
        for i in range(3000):
            log.emit(EventType.SENT, Message("a", message_id=str(i)))
    assert len(list(tmp_path.glob("events-n.*.parquet"))) == 2


def test_concurrent_emitters(tmp_path: Path) -> None:
    log = EventLog(tmp_path, node_id="n", buffer_events=64)

    def work(t: int) -> None:
        for i in range(1000):
            log.emit(EventType.DELIVERED, Message("a", message_id=f"{t}-{i}"))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    assert len({e["message_id"] for e in read_events(tmp_path)}) == 4000


def test_emit_after_close_fails_loudly(tmp_path: Path) -> None:
    log = EventLog(tmp_path, node_id="n")
    log.close()
    try:
        log.emit(EventType.SENT)
    except RuntimeError as exc:
        assert "closed" in str(exc)
    else:
        raise AssertionError("emit after close must not be silently dropped")


def test_node_id_is_sanitised_in_file_name(tmp_path: Path) -> None:
    with EventLog(tmp_path, node_id="../evil/name") as log:
        log.emit(EventType.SENT)
    assert [p.name for p in tmp_path.iterdir()] == ["events-.._evil_name.jsonl"]


def test_emit_many_writes_the_records_emit_writes(tmp_path: Path) -> None:
    messages = [Message("orders", b"x", message_id="m1", duplicate_id="d1", producer_id="p",
                        sequence=3, expiration=99, delivery_count=2, broker_message_id="b1"),
                Message("other", b"y", message_id="m2")]
    with EventLog(tmp_path / "one", node_id="n1") as log:
        for message in messages:
            log.emit(EventType.SENT, message)
    with EventLog(tmp_path / "many", node_id="n1") as log:
        log.emit_many(EventType.SENT, messages)
    one, many = list(read_events(tmp_path / "one")), list(read_events(tmp_path / "many"))
    assert len(many) == 2
    assert len({event["ts"] for event in many}) == 1  # one timestamp for the batch
    for event in one + many:
        event.pop("ts")
    assert many == one
    assert many[0]["broker_message_id"] == "b1" and "duplicate_id" not in many[1]


def test_emit_many_in_sync_mode_is_written_before_it_returns(tmp_path: Path) -> None:
    log = EventLog(tmp_path, node_id="n", sync=True, flush_interval_ms=60_000)
    try:
        log.emit_many(EventType.SENT, [Message("a", message_id=str(i)) for i in range(3)])
        assert [e["message_id"] for e in read_events(tmp_path)] == ["0", "1", "2"]
    finally:
        log.close()
