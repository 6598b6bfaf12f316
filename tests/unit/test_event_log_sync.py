"""``[mqguard.event-log] sync = true``: every event is in the file when ``emit`` returns,
so a process SIGKILLed right after acting on a message loses none of its events."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

from mqguard_tests.event_log_sync import emit_then_hang

from mqguard.config import parse_config
from mqguard.pipeline import make_event_log


def _events_after_sigkill(tmp_path: Path, sync: bool) -> list[dict[str, object]]:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    process = context.Process(target=emit_then_hang, args=(str(tmp_path), sync, ready))
    process.start()
    assert ready.wait(60)
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    text = (tmp_path / "events-victim.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_sync_events_survive_a_sigkill(tmp_path: Path) -> None:
    events = _events_after_sigkill(tmp_path, sync=True)
    assert [e["n"] for e in events] == [0, 1, 2, 3, 4]


def test_buffered_events_do_not_survive_a_sigkill(tmp_path: Path) -> None:
    # The control: what sync is for.
    assert _events_after_sigkill(tmp_path, sync=False) == []


def test_sync_is_read_from_the_config(tmp_path: Path) -> None:
    config = parse_config({"mqguard": {"event-log": {"directory": str(tmp_path),
                                                     "sync": True}}})
    log = make_event_log(config)
    try:
        log.emit("sent", None, address="q")
        assert (tmp_path / f"events-{config.node_id}.jsonl").read_text().count("\n") == 1
    finally:
        log.close()
