"""The JVM class-data archive: made by `mqguard audit --prepare`, used by local sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqguard.audit import class_archive
from mqguard.audit.session import session_conf

pytestmark = pytest.mark.spark


def test_local_sessions_add_the_archive_only_when_it_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQGUARD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(class_archive.ENV_SWITCH, raising=False)
    key = "spark.driver.extraJavaOptions"
    assert key not in session_conf("local[2]")

    path = class_archive.archive_path()
    assert path.parent.parent == tmp_path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    option = f"-XX:SharedArchiveFile={path}"
    assert session_conf("local[2]")[key] == option
    # The user's own driver options are kept, the archive's come after them.
    assert session_conf("local[*]", extra={key: "-Dx=1"})[key] == f"-Dx=1 {option}"
    assert key not in session_conf("local[2]", class_archive=False)
    assert key not in session_conf("spark://cluster:7077")  # executors' JVMs are not ours
    monkeypatch.setenv(class_archive.ENV_SWITCH, "0")
    assert key not in session_conf("local[2]")


def _events(directory: Path) -> Path:
    directory.mkdir()
    lines = []
    for n in range(20):
        base = {"v": 1, "ts": 1_700_000_000_000 + n, "node": "n", "address": "orders",
                "message_id": f"m-{n}"}
        lines += [{**base, "type": "sent"},
                  {**base, "type": "delivered", "queue": "orders", "delivery_count": 1},
                  {**base, "type": "acked", "queue": "orders", "ack_reason": "normal",
                   "handled": True, "delivered_ts": base["ts"]}]
    (directory / "events-n.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def test_prepare_makes_an_archive_the_next_audit_maps(tmp_path: Path) -> None:
    env = {**os.environ, "MQGUARD_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(class_archive.ENV_SWITCH, None)
    cli = [sys.executable, "-m", "mqguard.cli"]
    made = subprocess.run([*cli, "audit", "--prepare"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert made.returncode == 0, made.stderr
    archives = list((tmp_path / "cache" / "spark-cds").glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000
    assert not list((tmp_path / "cache" / "spark-cds").glob("*.partial"))
    assert oct(archives[0].stat().st_mode & 0o777) == "0o600"

    out = tmp_path / "out"
    audited = subprocess.run(
        [*cli, "audit", str(_events(tmp_path / "events")), "--out", str(out), "--no-html",
         "--json", "--conf", "spark.driver.extraJavaOptions=-Xlog:cds=info"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert audited.returncode == 0, audited.stderr
    assert json.loads(audited.stdout)["messages"] == 20
    log = (out / "spark.log").read_text()
    # The JVM mapped the dynamic (mqguard's) archive and kept it: the class path matched.
    assert f"Opened archive {archives[0]}" in log
    assert "Mapped dynamic region" in log
    assert "mismatch" not in log and "Unable to use shared archive" not in log
