"""``mqguard audit --state DIR``: incremental runs find what one full audit finds, whatever
the split points (messages whose events straddle a split included), and a rewritten file
is refused."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqguard_tests.planted import CONFIG, plant
from mqguard_tests.synthetic import Cluster

from mqguard.audit import incremental
from mqguard.audit.incremental import StateError, run_incremental
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.summary import read_findings
from mqguard.cli import main

pytestmark = pytest.mark.spark


def _first_ts(path: Path) -> int:
    if path.suffix == ".parquet":
        return int(pq.read_table(path, columns=["ts"]).column("ts")[0].as_py())
    with gzip.open(path, "rt") as handle:
        return int(json.loads(handle.readline())["ts"])


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[Path]]:
    """The planted run as rotated segments only (the live tails rotated too), and the
    segments in the order they were written (by first event)."""
    events = tmp_path_factory.mktemp("planted") / "events"
    with pytest.MonkeyPatch.context() as monkeypatch:
        watermark, _ = plant(Cluster(events, monkeypatch, max_bytes=2048, flush_each=True))
    for live in events.glob("*.jsonl"):
        with live.open("rb") as source, gzip.open(
                events / f"{live.stem}.999999.jsonl.gz", "wb") as target:
            shutil.copyfileobj(source, target)
        live.unlink()
    files = sorted(events.iterdir(), key=lambda p: (_first_ts(p), p.name))
    return events, watermark, files


def _found(spark: Any, out: Path) -> set[tuple[str, str]]:
    rows = read_findings(spark, str(out / "findings")).select("class", "message_id").collect()
    return {(r["class"], r["message_id"]) for r in rows}


@pytest.fixture(scope="module")
def full(spark: Any, planted: tuple[Path, int, list[Path]],
         tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    events, watermark, _ = planted
    out = tmp_path_factory.mktemp("full")
    run_audit(spark, AuditOptions([str(events)], out=str(out), config=CONFIG,
                                  watermark=watermark, html=False))
    found = _found(spark, out)
    assert ("duplicated", "duplicated-delivered-after-success") in found
    return found


def _last_ts(paths: list[Path]) -> int:
    last = 0
    for path in paths:
        if path.suffix == ".parquet":
            last = max(last, max(pq.read_table(path, columns=["ts"]).column("ts").to_pylist()))
        else:
            with gzip.open(path, "rt") as handle:
                last = max(last, *(json.loads(line)["ts"] for line in handle))
    return last


def _incremental(spark: Any, files: list[Path], cuts: list[int], watermark: int, root: Path,
                 after_run: Callable[[Path], None] = lambda state: None
                 ) -> tuple[set[tuple[str, str]], list[dict[str, Any]]]:
    """Audit with a state after each cut (files arriving in writing order); each run's
    watermark just behind its last event (so messages close between runs), at most the
    full audit's, which the last run takes. ``after_run`` looks at the state dir."""
    inbox, state, out = root / "inbox", root / "state", root / "out"
    inbox.mkdir()
    summaries = []
    for n, end in enumerate([*cuts, len(files)]):
        for path in files[:end]:
            if not (inbox / path.name).exists():
                os.link(path, inbox / path.name)
        at = watermark if n == len(cuts) else min(watermark, _last_ts(files[:end]) - 10)
        result = run_incremental(spark, AuditOptions(
            [str(inbox)], out=str(out), config=CONFIG, watermark=at, html=False), str(state))
        summaries.append(result.summary)
        after_run(state)
    return _found(spark, out), summaries


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_findings_equal_a_full_audit_whatever_the_splits(
        spark: Any, planted: tuple[Path, int, list[Path]], full: set[tuple[str, str]],
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    _, watermark, files = planted
    cuts = sorted(data.draw(st.sets(st.integers(1, len(files) - 1), min_size=1, max_size=3)))
    found, summaries = _incremental(spark, files, cuts, watermark,
                                    tmp_path_factory.mktemp("incremental"))
    assert found == full, cuts
    assert sum(s["incremental"]["files_new"] for s in summaries) == len(files)


def test_a_duplicate_after_the_acknowledgement_reopens_the_message(
        spark: Any, planted: tuple[Path, int, list[Path]], full: set[tuple[str, str]],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split every second file: a message handled in one run and delivered again in a
    later one is read again from the audited files (their copies) and judged a
    duplicate. The state
    goes through many runs: each adds one closed-id part and leaves the earlier ones as
    they were; past the bound (2 here) they are compacted into one, one row per id."""
    monkeypatch.setattr(incremental, "CLOSED_PARTS_BOUND", 2)
    _, watermark, files = planted
    cuts = list(range(2, len(files), 2))
    parts_seen: list[list[str]] = []
    mtimes: dict[str, int] = {}

    def closed_parts(state: Path) -> None:
        parts = sorted(os.listdir(state / "closed"))
        recorded = json.loads((state / "state.json").read_text())["closed_runs"]
        assert parts == sorted(f"run={r}" for r in recorded)
        assert len(parts) <= 2
        for name in parts:
            # A part is written once: the parts a run keeps are untouched by it.
            stamp = (state / "closed" / name).stat().st_mtime_ns
            assert mtimes.setdefault(name, stamp) == stamp
        if len(parts) == 1:
            keys = pq.read_table(state / "closed" / parts[0], columns=["key"]).column("key")
            assert len(keys) == len(set(keys.to_pylist()))
        parts_seen.append(parts)
        # Each gzipped JSONL segment audited has its Parquet copy (read again from it).
        audited = json.loads((state / "state.json").read_text())["files"]
        assert len(os.listdir(state / "copies")) == sum(
            f["path"].endswith(".jsonl.gz") for f in audited)

    found, summaries = _incremental(spark, files, cuts, watermark, tmp_path, closed_parts)
    assert found == full
    assert sum(s["incremental"]["reopened_messages"] for s in summaries) > 0
    assert all(s["incremental"]["open_events"] >= 0 for s in summaries)
    # Read again: only the audited files that hold the reopened messages, not all of them.
    again = [s["incremental"]["files_read_again"] for s in summaries
             if s["incremental"]["reopened_messages"]]
    assert again and all(0 < n < len(files) for n in again), again
    assert len(cuts) >= 3 and any(len(p) == 1 and p != parts_seen[0] for p in parts_seen[2:])


def test_rewritten_file_is_refused(spark: Any, planted: tuple[Path, int, list[Path]],
                                   tmp_path: Path) -> None:
    _, _, files = planted
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    inbox.mkdir()
    for path in files[:3]:
        shutil.copy(path, inbox / path.name)
    options = AuditOptions([str(inbox)], out=str(tmp_path / "out"), config=CONFIG, html=False)
    run_incremental(spark, options, str(state))
    victim = inbox / files[1].name
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    with pytest.raises(StateError, match=f"{victim.name} changed since it was audited"):
        run_incremental(spark, options, str(state))
    victim.unlink()
    with pytest.raises(StateError, match="is gone"):
        run_incremental(spark, options, str(state))


def test_an_older_state_version_is_refused(spark: Any, tmp_path: Path) -> None:
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    inbox.mkdir()
    state.mkdir()
    (inbox / "events-n.000001.jsonl.gz").write_bytes(b"")
    (state / "state.json").write_text(json.dumps({"version": 1, "files": []}))
    with pytest.raises(StateError, match=r"state version 1, this mqguard writes 2; remove"):
        run_incremental(spark, AuditOptions([str(inbox)], out=str(tmp_path / "out"),
                                            config=CONFIG, html=False), str(state))


def test_cli_refuses_state_with_redis(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["audit", str(tmp_path), "--state", str(tmp_path / "s"),
                                       "--redis", "redis://127.0.0.1:1"])
    assert result.exit_code == 2 and "--state audits the event log only" in result.output


def test_a_segment_pyarrow_cannot_read_exactly_is_read_by_spark(
        spark: Any, planted: tuple[Path, int, list[Path]], tmp_path: Path) -> None:
    """A gzipped segment with a line that is not JSON is not parsed on the driver: Spark
    reads it (dropping that line, as a full audit does), no Parquet copy of it is kept,
    and the findings still equal a full audit's over the same files."""
    _, watermark, files = planted
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for path in files:
        shutil.copy(path, corrupt / path.name)
    gzipped = [p for p in files if p.name.endswith(".jsonl.gz")]
    victim = corrupt / gzipped[len(gzipped) // 2].name
    with gzip.open(victim, "rb") as handle:
        lines = handle.read().splitlines(keepends=True)
    with gzip.open(victim, "wb") as handle:
        handle.writelines([lines[0], b"{not json\n", *lines[1:]])
    moved = sorted(corrupt.iterdir(), key=lambda p: (_first_ts(p), p.name))
    out = tmp_path / "full"
    run_audit(spark, AuditOptions([str(corrupt)], out=str(out), config=CONFIG,
                                  watermark=watermark, html=False))
    expected = _found(spark, out)

    def no_copy_of_the_victim(state: Path) -> None:
        audited = json.loads((state / "state.json").read_text())["files"]
        readable = [f for f in audited
                    if f["path"].endswith(".jsonl.gz") and not f["path"].endswith(victim.name)]
        assert len(os.listdir(state / "copies")) == len(readable)

    (tmp_path / "inc").mkdir()
    found, _ = _incremental(spark, moved, [len(moved) // 2], watermark, tmp_path / "inc",
                            no_copy_of_the_victim)
    assert found == expected
