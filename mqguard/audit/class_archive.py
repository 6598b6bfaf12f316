"""A class-data archive for the local Spark driver's JVM: a faster session start.

A local audit starts a JVM that loads and verifies some 12,000 Spark, Scala and
Hadoop classes before it reads an event, and the first queries run while more
are loaded: the session start and the first trivial query take seconds. Java's
application class-data sharing (CDS, JDK 13+) maps classes a previous run archived
instead, already parsed and verified, which takes seconds off both (on 2 vCPUs the
session starts in about 4 s instead of 8: docs/benchmarks.md).

The archive is made once per machine, JDK and PySpark version
(``mqguard audit --prepare``, or the first ``mqguard bench audit``): a child
process runs a small audit with ``-XX:ArchiveClassesAtExit`` and the JVM writes
the classes it loaded when it exits (about 150 MB, ~20 s). Later local sessions
add ``-XX:SharedArchiveFile``. The JVM checks the archive against its own version
and class path and ignores one that does not match (a warning in ``spark.log``),
so a stale archive costs the speed-up, never the audit. The archive lives in the
user's cache directory (``$MQGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/mqguard``,
else ``~/.cache/mqguard``), created private to the user: the JVM runs code from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Archive creation: the child process's limit (JVM start, a small audit, the dump).
CREATE_TIMEOUT_S = 300.0
#: ``MQGUARD_SPARK_CLASS_ARCHIVE=0`` turns the archive off everywhere.
ENV_SWITCH = "MQGUARD_SPARK_CLASS_ARCHIVE"


def cache_directory() -> Path:
    explicit = os.environ.get("MQGUARD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mqguard"


def _java_identity() -> str:
    """Which JVM a local session starts (as Spark's launcher finds it), and its build."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "no-java"
    real = os.path.realpath(java)
    stat = os.stat(real)
    return f"{real}:{stat.st_size}:{int(stat.st_mtime)}"


def archive_path() -> Path:
    """Where the archive for this JDK and PySpark version is (or would be)."""
    import pyspark

    key = hashlib.sha256(f"{pyspark.__version__}|{_java_identity()}|{sys.version_info[:2]}"
                         .encode()).hexdigest()[:16]
    return cache_directory() / "spark-cds" / f"spark-{pyspark.__version__}-{key}.jsa"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def java_options() -> str | None:
    """The driver JVM option that uses the archive, or None (none made, or turned off)."""
    if not enabled():
        return None
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else None


def create(timeout_s: float = CREATE_TIMEOUT_S) -> float:
    """Make the archive (replacing an existing one); the seconds it took.

    Raises RuntimeError when the child process fails or leaves no archive.
    """
    target = archive_path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = target.with_name(target.name + f".{os.getpid()}.partial")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mqguard-cds-") as work:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "mqguard.audit.class_archive", str(partial), work],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s,
                check=False)
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"making the class-data archive took over {timeout_s:.0f} s"
                               ) from None
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError("making the class-data archive failed: " + " | ".join(tail))
    os.chmod(partial, 0o600)
    os.replace(partial, target)
    return time.perf_counter() - started


def _archive_run(archive: str, work: str) -> None:
    """The child of :func:`create`: a small audit in a JVM that archives at exit."""
    import json

    from pyspark import SparkContext

    from mqguard.audit.runner import AuditOptions, run_audit
    from mqguard.audit.session import build_session
    from mqguard.events import _to_parquet

    events = os.path.join(work, "events")
    os.makedirs(events)
    # A little of everything the audit reads: a Parquet segment and a live JSONL tail,
    # sends, deliveries, acks, a dead letter, an expiry (the classes of every pass).
    rows = []
    for n in range(200):
        base = {"v": 1, "ts": 1_700_000_000_000 + 10 * n, "node": "n", "address": "orders",
                "message_id": f"m-{n}"}
        rows.append({**base, "type": "sent"})
        rows.append({**base, "type": "delivered", "queue": "orders", "delivery_count": 1})
        if n % 50 == 1:
            rows.append({**base, "type": "dead_lettered", "queue": "orders",
                         "target": "DLA", "delivery_count": 3})
        elif n % 50 == 2:
            rows.append({**base, "type": "expired", "queue": "orders", "target": "EXP"})
        else:
            rows.append({**base, "type": "acked", "queue": "orders", "ack_reason": "normal",
                         "handled": True, "delivered_ts": base["ts"]})
    half = len(rows) // 2
    source = os.path.join(work, "segment.jsonl")
    with open(source, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows[:half])
    if not _to_parquet(Path(source), Path(events) / "events-n.000001.parquet"):
        raise RuntimeError("could not write the archive run's Parquet segment")
    with open(os.path.join(events, "events-n.jsonl"), "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows[half:])
    spark = build_session(conf={"spark.driver.extraJavaOptions":
                                f"-XX:ArchiveClassesAtExit={archive}"},
                          log_path=os.path.join(work, "spark.log"), class_archive=False)
    # No HTML report: it is Python's work (matplotlib), no JVM class of its own.
    run_audit(spark, AuditOptions(inputs=[events], out=os.path.join(work, "out"), html=False))
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        raise RuntimeError("no JVM to stop")
    process = getattr(gateway, "proc", None)
    # The JVM writes the archive when it exits normally; pyspark would kill it.
    with contextlib.suppress(Exception):  # the connection drops as the JVM exits
        gateway.jvm.java.lang.System.exit(0)
    if process is not None:
        process.wait(timeout=CREATE_TIMEOUT_S)


if __name__ == "__main__":
    _archive_run(sys.argv[1], sys.argv[2])
