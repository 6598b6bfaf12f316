"""``mqguard audit --state DIR``: audit only what was written since the last audit.

The state directory remembers:

- ``state.json``: every event file already audited, in the order they were audited,
  with its size, modification time and SHA-256 of its first and last 64 KiB (a file
  rewritten since is noticed and the state refused: the findings it holds would no
  longer be the file's); the watermark, the last event time, the settings the
  findings were judged with, and per address the latest send time of a message with a
  fate (the *unseen* rule's evidence, ``drained``);
- ``open/``: the events (Parquet, in writing order) of every message still open at
  the watermark: without a terminal fate (acked, dead-lettered, expired, dropped), or
  with an event after the watermark;
- ``open_keys/``: their ids (a carried event may also name a closed message: the
  closed original of a copy still open, which rides along unjudged);
- ``closed/``: the ids of the messages closed so far, with the first and last audited
  file that holds their events: one Parquet part per run (``run=N``, listed in
  ``state.json``), written once and never rewritten, so a run's cost does not grow with
  the history it closed. A message judged again in a later run gets a row in that
  run's part too; a reader takes the widest span of its rows and ignores ids open
  now. Past :data:`CLOSED_PARTS_BOUND` parts they are compacted into one (one row
  per id);
- ``copies/``: a Parquet copy of every gzipped JSONL segment audited (named by its
  rank and content checks), written by the run that parsed it: a message reopened
  later is read again from the copy, not by parsing the JSON again;
- ``findings/``: the last run's findings: a closed message's, which no later watermark
  changes (only a message's own events decide them once it has a fate), and an open
  one's, which the next run drops as it judges that message again.

A run reads the new files plus ``open/``: the audit proper
(:func:`mqguard.audit.runner.run_audit`) sees every event of every message it judges,
the open ones carried over and the new ones. A new event of a message closed
earlier (a redelivery after its acknowledgement, say) reopens it: its events are
read again from the audited files between its first and last (the only case that
reads them again), so a
duplicate is judged as a full audit would judge it. The findings written are those
of the closed messages kept in the state plus this run's, equal to a full audit's
over the same files.

The bookkeeping around the audit proper (the new events' ids and last time, the
reopened messages, the fates, the state written) is done on the driver with pyarrow
(:mod:`mqguard.audit.incremental_tables`): the audit is the run's only Spark work. A
gzipped JSONL segment is parsed once, by pyarrow, and the audit reads its Parquet
copy (a file pyarrow cannot read exactly is read by Spark, as a full audit reads it,
and has no copy).

Only rotated segments (``.parquet``, ``.jsonl.gz``) are consumed: the live
``.jsonl`` file is still being written, and its events come back in its next rotated
segment; it is left for the run after its rotation (counted in the summary).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as arrow_compute
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from mqguard.audit.events import (
    AUDIT_FIELDS,
    AuditInputError,
    expand_inputs,
    load_event_inputs,
    valid_event,
)
from mqguard.audit.incremental_tables import (
    STATE_TYPES,
    closed_spans,
    events_of,
    fates,
    keys_of,
    read_findings_table,
    read_table,
    segment_events,
    write_findings_table,
    write_one_file,
)
from mqguard.audit.runner import AuditOptions, AuditResult, run_audit
from mqguard.audit.summary import class_counts, read_findings, write_summary

#: pyarrow's compute kernels, untyped here: the stubs' overloads reject the mix of
#: arrays, chunked arrays and scalars these kernels take.
pc: Any = arrow_compute

__all__ = ["CLOSED_PARTS_BOUND", "STATE_VERSION", "FileMark", "StateError", "mark_file",
           "run_incremental"]

STATE_VERSION = 2
#: Closed-id parts kept before a run compacts them into one (bounds the files read).
CLOSED_PARTS_BOUND = 8
STATE_FILE = "state.json"
#: Bytes hashed at each end of a file: a rewrite changes its size, time or one end.
HASHED_BYTES = 64 * 1024
_ROTATED = (".parquet", ".jsonl.gz")


class StateError(AuditInputError):
    """The state directory does not fit the inputs or settings (a usage error: exit 2)."""


@dataclass(frozen=True)
class FileMark:
    """What identifies an audited file's content without reading all of it."""

    path: str
    size: int
    mtime_ns: int
    head: str
    tail: str


def mark_file(path: str) -> FileMark:
    stat = os.stat(path)
    with open(path, "rb") as handle:
        head = hashlib.sha256(handle.read(HASHED_BYTES)).hexdigest()
        handle.seek(max(0, stat.st_size - HASHED_BYTES))
        tail = hashlib.sha256(handle.read(HASHED_BYTES)).hexdigest()
    return FileMark(path, stat.st_size, stat.st_mtime_ns, head, tail)


def _settings(options: AuditOptions) -> dict[str, Any]:
    return {"config": options.config.source,
            "max_delivery_attempts": options.max_delivery_attempts,
            "expiry_tolerance_ms": options.checks.expiry_tolerance_ms,
            "assume_drained": options.checks.assume_drained}


def _load_state(directory: str) -> dict[str, Any] | None:
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            state: dict[str, Any] = json.load(handle)
    except (OSError, ValueError) as exc:
        raise StateError(f"--state {directory}: {STATE_FILE} is unreadable ({exc}); "
                         "remove the directory to audit from scratch") from None
    if state.get("version") != STATE_VERSION:
        raise StateError(f"--state {directory}: state version {state.get('version')!r}, "
                         f"this mqguard writes {STATE_VERSION}; remove the directory to "
                         "audit from scratch")
    return state


def _check_recorded(directory: str, state: Mapping[str, Any], settings: Mapping[str, Any],
                    watermark: int | None) -> list[FileMark]:
    """The recorded files' marks, each checked against its file; raises
    :class:`StateError`."""
    if state["settings"] != settings:
        raise StateError(f"--state {directory} holds findings judged with other settings "
                         f"({state['settings']}, now {dict(settings)}); use another state "
                         "directory or remove this one")
    if watermark is not None and watermark < state["watermark"]:
        raise StateError(f"--watermark {watermark} is before the state's ({state['watermark']}): "
                         f"{directory} closed messages on a later one")
    recorded = []
    for entry in state["files"]:
        mark = FileMark(**entry)
        if not os.path.exists(mark.path):
            raise StateError(f"{mark.path} was audited (recorded in --state {directory}) and "
                             "is gone; remove the state directory to audit from scratch")
        if mark_file(mark.path) != mark:
            raise StateError(f"{mark.path} changed since it was audited (size, time or "
                             f"content; recorded in --state {directory}): remove the state "
                             "directory to audit from scratch")
        recorded.append(mark)
    return recorded


def _copy_name(rank: int, mark: FileMark) -> str:
    """The Parquet copy of the gzipped JSONL segment of rank ``rank``: named by the
    file's content checks too, so a copy never stands for another file."""
    return f"{rank:06d}-{mark.size}-{mark.tail[:16]}.parquet"


def _replace(source: str, target: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    os.replace(source, target)


def _spark_reader(spark: SparkSession) -> Callable[[str], pa.Table]:
    """Spark's reading of one file pyarrow cannot read exactly (its unreadable lines
    counted out as the audit counts them), in writing order (``row``)."""
    def read(path: str) -> pa.Table:
        frame = load_event_inputs(spark, [path]).frame.filter(valid_event())
        return frame.select(*AUDIT_FIELDS, "row").toArrow()
    return read


def _concat(tables: Sequence[pa.Table | None]) -> pa.Table | None:
    present = [t.select(STATE_TYPES.names).cast(STATE_TYPES) for t in tables
               if t is not None]
    return pa.concat_tables(present) if present else None


def _keys(table: pa.Table | None) -> pa.Array:
    """The distinct ids of the messages ``table``'s events belong to."""
    if table is None or not table.num_rows:
        return pa.array([], pa.string())
    return pc.unique(keys_of(table)["key"].combine_chunks())


def run_incremental(spark: SparkSession, options: AuditOptions, state_dir: str,
                    progress: Callable[[str], None] = lambda stage: None) -> AuditResult:
    """Audit the files of ``options.inputs`` not audited before, with the state in
    ``state_dir`` (created on the first run); see the module doc.

    Raises :class:`StateError` when the state does not fit (a recorded file changed
    or vanished, other settings, an earlier watermark) and
    :class:`~mqguard.audit.events.AuditInputError` for inputs that name nothing.
    """
    if options.cross.wanted:
        raise StateError("--state audits the event log only: --redis and --broker-log "
                         "judge a moment's state, which an incremental run cannot carry")
    files = expand_inputs(options.inputs)
    settings = _settings(options)
    os.makedirs(state_dir, exist_ok=True)
    state = _load_state(state_dir)
    recorded_marks = (_check_recorded(state_dir, state, settings, options.watermark)
                      if state else [])
    recorded = [m.path for m in recorded_marks]
    known = set(recorded)
    live = [f for f in files if not f.endswith(_ROTATED)]
    new = [f for f in files if f.endswith(_ROTATED) and f not in known]
    # Marked before reading: a file rewritten while this run reads it is caught next time.
    marks = [mark_file(f) for f in new]
    open_dir = os.path.join(state_dir, "open")
    closed_dir = os.path.join(state_dir, "closed")
    kept_dir = os.path.join(state_dir, "findings")
    copies_dir = os.path.join(state_dir, "copies")
    open_keys_dir = os.path.join(state_dir, "open_keys")
    work = tempfile.mkdtemp(prefix=".incremental-", dir=state_dir)
    spark_read = _spark_reader(spark)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    try:
        progress(f"{len(new)} new file(s), {len(recorded)} audited before")
        segments = [segment_events(path, len(recorded) + i,
                                   os.path.join(work, "copies", _copy_name(len(recorded) + i,
                                                                           mark)),
                                   spark_read) for i, (path, mark) in enumerate(zip(
                                       new, marks, strict=True))]
        fresh = _concat([s.events for s in segments])
        carried = (read_table(open_dir) if state and os.path.isdir(open_dir)
                   and state.get("open_events") else None)
        fresh_ts = pc.max(fresh["ts"]).as_py() if fresh is not None else None
        last_ts = max([t for t in (state["last_ts"] if state else None, fresh_ts)
                       if t is not None], default=None)
        if options.watermark is not None:
            watermark, source = options.watermark, "given"
        elif last_ts is not None:
            watermark, source = last_ts - options.grace_ms, f"last event - {options.grace_ms} ms"
        else:
            watermark, source = 0, "no events"
        if state is not None:
            watermark = max(watermark, int(state["watermark"]))

        # Messages closed earlier that the new events touch are read again.
        reopened = files_read_again = 0
        prior: list[pa.Table | None] = [carried]
        closed_runs: list[int] = list(state.get("closed_runs", [])) if state else []
        open_before = (read_table(open_keys_dir)["key"] if state
                       and os.path.isdir(open_keys_dir) else None)
        closed = (closed_spans([read_table(os.path.join(closed_dir, f"run={r}"))
                                for r in closed_runs], open_before)
                  if closed_runs else None)
        new_keys = _keys(fresh)
        if fresh is not None and closed is not None:
            touched = closed.filter(pc.fill_null(
                pc.is_in(closed["key"], value_set=new_keys), False))
            reopened = touched.num_rows
            if reopened:
                # Only the audited files between each message's first and last: the
                # messages a new segment reopens were mostly closed in the last ones.
                spans = zip(touched["first_rank"].to_numpy().tolist(),
                            touched["last_rank"].to_numpy().tolist(), strict=True)
                ranks = sorted({rank for first, last in spans
                                for rank in range(first, last + 1)})
                progress(f"{reopened} closed message(s) have new events: reading their "
                         f"events again from {len(ranks)} file(s)")
                for rank in ranks:
                    copy = os.path.join(copies_dir, _copy_name(rank, recorded_marks[rank]))
                    prior.append(events_of(segment_events(recorded[rank], rank, copy,
                                                          spark_read).events,
                                           touched["key"]))
                files_read_again = len(ranks)
        prior_table = _concat(prior)
        prior_file = None
        if prior_table is not None and prior_table.num_rows:
            prior_file = os.path.join(work, "prior", "events.parquet")
            prior_table = write_one_file(prior_table, prior_file)
        inputs = ([prior_file] if prior_file else []) + [s.audit_path for s in segments]
        seconds["carry_in"] = time.perf_counter() - clock
        if not inputs:
            if state is None:
                raise StateError(f"no rotated segment to audit yet: --state consumes rotated "
                                 f"segments only ({len(live)} live file(s) wait for their "
                                 "rotation)")
            progress("nothing new since the last audit")
            return _unchanged(spark, state_dir, options, live)

        drained = {a: int(t) for a, t in (state or {}).get("drained", {}).items()}
        progress(f"auditing {len(inputs)} file(s)")
        result = run_audit(spark, AuditOptions(
            inputs=inputs, out=options.out, config=options.config, watermark=watermark,
            grace_ms=options.grace_ms, max_delivery_attempts=options.max_delivery_attempts,
            checks=options.checks, examples=options.examples, html=False,
            drained_floor=drained), progress)
        seconds["audit"] = time.perf_counter() - clock - seconds["carry_in"]

        progress("recording what stays open")
        audited = _concat([fresh, prior_table if prior_file else None])
        assert audited is not None  # the audit had inputs
        # Judged here: the messages open before and every message of a new event. Another
        # id on a carried event (the closed original of a copy still open) only rides
        # along: its findings and its closed state stay as they were.
        judged = pc.unique(pa.chunked_array(
            [new_keys, *([open_before] if open_before is not None else [])],
            type=pa.string()))
        per_key = fates(keys_of(audited), judged, watermark)
        open_keys = per_key.filter(per_key["open"])["key"]
        new_open_keys = os.path.join(work, "open_keys")
        os.makedirs(new_open_keys)
        pq.write_table(pa.table({"key": open_keys}),
                       os.path.join(new_open_keys, "part-0.parquet"))
        new_open = os.path.join(work, "open")
        open_events = write_one_file(events_of(audited, open_keys),
                                     os.path.join(new_open, "part-0.parquet")).num_rows

        # Append-only: this run's closed ids are a new part; the earlier parts stay as
        # they are (an id judged again here, now open, is masked by open_keys/ on reading).
        run_id = max(closed_runs, default=0) + 1
        closed_now = per_key.filter(pc.invert(per_key["open"])).select(
            ["key", "first_rank", "last_rank"])
        if len(closed_runs) + 1 > CLOSED_PARTS_BOUND and closed is not None:
            closed_now = closed_spans([closed, closed_now], open_keys)
            runs_out = [run_id]
        else:
            runs_out = [*closed_runs, run_id]
        new_closed = os.path.join(work, "closed")
        os.makedirs(new_closed)
        pq.write_table(closed_now, os.path.join(new_closed, "part-0.parquet"))

        # Findings: the earlier closed messages' (those not judged again here) and this run's.
        judged_ids = per_key["key"]
        combined = os.path.join(work, "findings")
        kept: list[pa.Table] = []
        mine = read_findings_table(os.path.join(options.out, "findings"))
        if mine is not None:
            kept.append(mine.filter(pc.fill_null(
                pc.is_in(mine["message_id"], value_set=judged_ids), False)))
        old = read_findings_table(kept_dir) if state else None
        if old is not None:
            kept.append(old.filter(pc.invert(pc.fill_null(
                pc.is_in(old["message_id"], value_set=judged_ids), False))))
        # Kept as written: an open message's findings are dropped by the next run, which
        # judges it again (its id is in open_keys/), so they need no second pass here.
        write_findings_table(kept, combined)
        new_kept = combined
        drained_out = dict(drained)
        for address, at in result.drained.items():
            drained_out[address] = max(at, drained_out.get(address, at))
        summary = dict(result.summary)
        _publish_findings(spark, combined, options, summary)
        seconds["carry_out"] = time.perf_counter() - clock - sum(seconds.values())
        summary["incremental"] = {
            "state": state_dir, "files_before": len(recorded), "files_new": len(new),
            "live_files_left": len(live), "open_events": open_events,
            "reopened_messages": reopened, "files_read_again": files_read_again,
            "watermark_source": source,
            # carry_in: the new files' ids and last time, reopened messages read again,
            # the open events written for the audit; carry_out: the next run's state.
            "seconds": {k: round(v, 3) for k, v in seconds.items()}}
        summary["watermark_source"] = source
        write_summary(summary, options.out)

        for source_dir, target in ((new_open, open_dir), (new_open_keys, open_keys_dir),
                                   (new_kept, kept_dir)):
            _replace(source_dir, target)
        os.makedirs(closed_dir, exist_ok=True)
        _replace(new_closed, os.path.join(closed_dir, f"run={run_id}"))
        os.makedirs(copies_dir, exist_ok=True)
        for segment in segments:
            if os.path.dirname(segment.audit_path) == os.path.join(work, "copies"):
                os.replace(segment.audit_path, os.path.join(
                    copies_dir, os.path.basename(segment.audit_path)))
        with open(os.path.join(state_dir, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
        _save_state(state_dir, {
            "version": STATE_VERSION,
            "files": [vars(m) for m in
                      ([FileMark(**e) for e in state["files"]] if state else []) + marks],
            "watermark": watermark, "last_ts": last_ts, "settings": settings,
            "drained": drained_out, "open_events": open_events, "closed_runs": runs_out})
        # Copies of files no longer recorded (left by an interrupted run) are never read.
        listed = {_copy_name(rank, mark) for rank, mark in enumerate([*recorded_marks,
                                                                        *marks])}
        for name in os.listdir(copies_dir):
            if name not in listed:
                os.unlink(os.path.join(copies_dir, name))
        # Parts compacted away (or left by an interrupted run) are no longer listed.
        for name in os.listdir(closed_dir):
            if name not in {f"run={r}" for r in runs_out}:
                shutil.rmtree(os.path.join(closed_dir, name), ignore_errors=True)
        return AuditResult(summary, drained_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish_findings(spark: SparkSession, combined: str, options: AuditOptions,
                      summary: dict[str, Any]) -> None:
    """Make ``combined`` the output's findings and count them in ``summary``."""
    target = os.path.join(options.out, "findings")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(combined, target)
    classes = class_counts(read_findings(spark, target), options.examples)
    summary["classes"] = classes
    summary["anomalies"] = sum(e["count"] for e in classes.values() if e["anomaly"])
    summary["ok"] = summary["anomalies"] == 0


def _unchanged(spark: SparkSession, state_dir: str, options: AuditOptions,
               live: Sequence[str]) -> AuditResult:
    """No new file and nothing open: the last run's findings and summary stand."""
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(state_dir, "summary.json"), encoding="utf-8") as handle:
        summary: dict[str, Any] = json.load(handle)
    summary["incremental"] = {**summary.get("incremental", {}), "files_new": 0,
                              "live_files_left": len(live), "reopened_messages": 0}
    kept = os.path.join(state_dir, "findings")
    if os.path.isdir(kept):
        _publish_findings(spark, kept, options, summary)
    write_summary(summary, options.out)
    return AuditResult(summary)


def _save_state(directory: str, state: Mapping[str, Any]) -> None:
    path = os.path.join(directory, STATE_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)
