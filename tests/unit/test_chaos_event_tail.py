"""The fault harness's incremental reading of terminal events survives log rotation.

Pure logic: a stand-in plan and real event logs on disk (no servers). The harness settles
only once every poison message has a ``dead_lettered`` event and every short-lived one an
``expired`` event, so an event that a rotation moved out of the live file must still be seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from mqguard.demo.plan import Kind
from mqguard.events import EventLog
from mqguard.message import Message
from mqguard.testing.chaos import LEGS, ChaosRun, ChaosSettings


@dataclass(frozen=True)
class _Planned:
    index: int
    kind: Kind
    duplicate_id: str


class _Spec:
    def __init__(self, events_dir: Path, count: int) -> None:
        self.events_dir = str(events_dir)
        self._planned = {leg: [_Planned(i, Kind.POISON, f"{leg}-{i}") for i in range(count)]
                         for leg in LEGS}

    def planned(self, leg: str) -> list[_Planned]:
        return self._planned[leg]


@pytest.mark.parametrize("rotated_format", ["parquet", "jsonl.gz"])
def test_terminal_events_are_seen_across_rotations(tmp_path: Path, rotated_format: str) -> None:
    events_dir = tmp_path / "events"
    run = ChaosRun(ChaosSettings(messages=10), tmp_path / "work")
    run.spec = _Spec(events_dir, 40)  # type: ignore[assignment]
    # Small segments: the 80 events below rotate the file several times.
    log = EventLog(events_dir, node_id="consumer", max_bytes=2048, sync=True,
                   rotated_format=rotated_format)
    try:
        expected: dict[str, set[int]] = {leg: set() for leg in LEGS}
        for i in range(40):
            for leg in LEGS:
                log.emit("dead_lettered", Message("q", duplicate_id=f"{leg}-{i}",
                                                  message_id=f"m-{leg}-{i}"), target="DLQ.q")
                expected[leg].add(i)
            if i % 7 == 0:  # read between writes, as the harness polls during the run
                run._terminal_events()
        log.flush()
    finally:
        log.close()
    assert list(events_dir.glob(f"*.{rotated_format}")), "the log never rotated"
    ended = run._terminal_events()
    assert ended == expected
