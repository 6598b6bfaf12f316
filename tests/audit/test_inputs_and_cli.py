"""Inputs (rotated gzip files, globs, unreadable lines) and the ``mqguard audit`` command."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from mqguard_tests.synthetic import Cluster

from mqguard.audit.events import AuditInputError, expand_inputs
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.summary import print_summary
from mqguard.cli.audit import audit

pytestmark = pytest.mark.spark


def small_run(cluster: Cluster, messages: int = 60) -> int:
    """Handled messages with one lost and one duplicated; returns a watermark after all."""
    c = cluster
    c.send("lost-1")
    for n in range(messages):
        c.handled(c.send(f"ok-{n}"))
    twice = c.send("duplicated-1")
    c.handled(twice)
    c.handled(twice, node="consumer-2")
    c.close()
    return c.clock.advance(1)


@pytest.mark.parametrize("rotated_format", ["parquet", "jsonl.gz"])
def test_rotated_files_bad_lines_and_other_versions(spark: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    rotated_format: str) -> None:
    """Rotated Parquet segments (the writer's default) or gzipped JSONL, plus the live
    JSONL files: every event read once, in one audit."""
    events = tmp_path / "events"
    watermark = small_run(Cluster(events, monkeypatch, max_bytes=4096, flush_each=True,
                                  rotated_format=rotated_format))
    rotated = sorted(events.glob(f"*.{rotated_format}"))
    assert len(rotated) >= 4, "the run should have rotated several times"
    assert not list(events.glob("*.gz" if rotated_format == "parquet" else "*.parquet"))
    if rotated_format == "parquet":
        lines = sum(pq.ParquetFile(p).metadata.num_rows for p in rotated)
    else:
        lines = sum(len(gzip.decompress(p.read_bytes()).splitlines()) for p in rotated)
    lines += sum(len(p.read_bytes().splitlines()) for p in events.glob("*.jsonl"))
    # A half-written last line, a future schema version, and a rotation in progress.
    with open(events / "events-consumer-1.jsonl", "a") as handle:
        handle.write('{"v": 2, "ts": 1, "type": "sent", "node": "n", "message_id": "v2"}\n')
        handle.write('{"v": 1, "ts": 17000000')
    (events / "events-producer.000099.jsonl.gz.partial").write_bytes(b"\x1f\x8b not yet")
    (events / "events-producer.000098.parquet.partial").write_bytes(b"PAR1 not yet")

    result = run_audit(spark, AuditOptions([str(events)], out=str(tmp_path / "out"),
                                           watermark=watermark))
    summary = result.summary
    assert summary["files"] == len(rotated) + 3
    assert summary["events"] == lines + 2
    assert (summary["bad_lines"], summary["unsupported_events"]) == (1, 1)
    counts = {name: entry["count"] for name, entry in summary["classes"].items()
              if entry["count"]}
    assert counts == {"lost": 1, "duplicated": 1}
    assert summary["classes"]["duplicated"]["by_address"]["orders"]["examples"] == [
        "duplicated-1"]


def test_inputs_are_expanded_and_typos_refused(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    for name in ("events-a.000001.jsonl.gz", "events-a.000002.parquet", "events-a.jsonl",
                 "events-b.jsonl", "events-a.000003.parquet.partial",
                 "events-a.000002.jsonl.gz.partial", "notes.txt"):
        (events / name).write_text("")
    names = [Path(p).name for p in expand_inputs([str(events)])]
    assert names == ["events-a.000001.jsonl.gz", "events-a.000002.parquet", "events-a.jsonl",
                     "events-b.jsonl"]
    globbed = expand_inputs([str(events / "events-a*"), str(events / "events-a.jsonl")])
    assert [Path(p).name for p in globbed] == ["events-a.000001.jsonl.gz",
                                               "events-a.000002.parquet", "events-a.jsonl"]
    assert expand_inputs(["s3a://bucket/events/*.jsonl*"]) == ["s3a://bucket/events/*.jsonl*"]
    for bad in (str(tmp_path / "missing"), str(tmp_path / "nothing-*.jsonl")):
        with pytest.raises(AuditInputError):
            expand_inputs([bad])
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditInputError, match="no event files"):
        expand_inputs([str(tmp_path / "empty")])


def test_cli_usage_errors_exit_2_before_spark_starts(tmp_path: Path) -> None:
    runner = CliRunner()
    cases = [
        [str(tmp_path / "missing")],
        [str(tmp_path), "--json", "--quiet"],
        [str(tmp_path), "--watermark", "yesterday"],
        [str(tmp_path), "--conf", "no-equals-sign"],
    ]
    for args in cases:
        result = runner.invoke(audit, args)
        assert result.exit_code == 2, (args, result.output)


def test_cli_json_quiet_table_and_exit_codes(spark: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events"
    watermark = small_run(Cluster(events, monkeypatch))
    runner = CliRunner()
    common = ["--master", "local[2]", "--shuffle-partitions", "2",
              "--watermark", str(watermark)]

    result = runner.invoke(audit, [str(events), "--out", str(tmp_path / "a"), "--json",
                                   *common])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.output)
    assert summary["anomalies"] == 2 and summary["watermark_source"] == "given"
    assert json.loads((tmp_path / "a" / "summary.json").read_text()) == summary
    assert {p.name for p in (tmp_path / "a" / "findings").iterdir() if p.is_dir()} == {
        "class=lost", "class=duplicated"}

    print_summary(summary)  # what the command prints without --json / --quiet
    table = capsys.readouterr().out
    assert "duplicated" in table and "lost-1" in table and "2 anomalies" in table

    # Judged only up to a watermark before "lost-1" was sent: nothing is wrong yet.
    clean = ["--watermark", "2000-01-01T00:00:00Z", "--master", "local[2]"]
    result = runner.invoke(audit, [str(events / "events-producer.jsonl"), "--out",
                                   str(tmp_path / "c"), "--quiet", *clean])
    assert (result.exit_code, result.output) == (0, "")
    assert spark.sparkContext._jsc is not None, "the CLI must not stop a session it did not start"
