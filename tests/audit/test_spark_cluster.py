"""``mqguard audit --master spark://...`` on a real standalone cluster (a master and two
workers on loopback): the findings of ``local[*]``, the application on the master, and the
executors of both workers running the audit's tasks, the Redis readers included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.planted import CONFIG, plant
from mqguard_tests.synthetic import Cluster

from mqguard.audit.cross_checks import CrossInputs
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.summary import read_findings
from mqguard.digest import id_digest
from mqguard.servers.handle import ServerHandle
from mqguard.servers.spark import master_json, worker_json
from mqguard.stores.redis import RedisStore

pytestmark = [pytest.mark.spark, pytest.mark.redis]

CONFIG_TOML = """
[address-settings.orders]
max-delivery-attempts = 3
dead-letter-address = "DLA"
expiry-address = "EXP"
"""


def _findings(spark: Any, out: Path) -> set[tuple[str, str]]:
    rows = read_findings(spark, str(out / "findings")).select("class", "message_id").collect()
    return {(r["class"], r["message_id"]) for r in rows}


def _redis_state(url: str) -> None:
    """Rings on a dozen addresses (spread over the Cluster's slots) and delivery counts,
    one ring id the log never accepted: work for Redis readers on every node."""
    store = RedisStore.from_url(url)
    try:
        for n in range(12):
            store.ring_check_and_add(f"spread-{n}", [id_digest(f"spread-{n}-{i}")
                                                     for i in range(3)], 4)
            store.delivery_count_incr("orders", f"stale-{n}")
        store.ring_check_and_add("orders", [id_digest("phantom")], 5)
    finally:
        store.close()


def test_cluster_audit_equals_local(spark: Any, mqguard_spark_cluster: ServerHandle,
                                    mqguard_redis_cluster_url: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    events = tmp_path / "events"
    watermark, expected = plant(Cluster(events, monkeypatch, max_bytes=4096, flush_each=True))
    _redis_state(mqguard_redis_cluster_url)
    config = tmp_path / "mqguard.toml"
    config.write_text(CONFIG_TOML)

    local = run_audit(spark, AuditOptions(
        [str(events)], out=str(tmp_path / "local"), config=CONFIG, watermark=watermark,
        cross=CrossInputs(redis_url=mqguard_redis_cluster_url), html=False))
    local_findings = _findings(spark, tmp_path / "local")
    # The planted classes, plus what the Redis state adds (a phantom ring id, stale counts).
    assert {m for c, m in local_findings if c in expected} >= set().union(*expected.values())
    assert any(c == "ring_mismatch" for c, _ in local_findings)

    master = mqguard_spark_cluster.urls["master"]
    # No PYSPARK_PYTHON, SPARK_LOCAL_IP or driver host given: a loopback master implies them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mqguard.cli", "audit", str(events), "-c", str(config),
         "--watermark", str(watermark), "--redis", mqguard_redis_cluster_url,
         "--master", master, "--out", str(tmp_path / "cluster"), "--no-html", "--json",
         # A few hundred events: Spark's default of 200 shuffle partitions would be
         # mostly task overhead.
         "--shuffle-partitions", "4",
         "--conf", "spark.app.name=mqguard-audit-cluster-test"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    seconds = time.monotonic() - started
    assert done.returncode == 1, done.stderr + (tmp_path / "cluster" / "spark.log").read_text()
    summary = json.loads(done.stdout)
    assert _findings(spark, tmp_path / "cluster") == local_findings
    assert summary["classes"] == local.summary["classes"]
    assert summary["redis"]["nodes"] == 3

    # The application ran on the master, with both workers' executors.
    status = master_json(mqguard_spark_cluster)
    apps = [a for a in status["completedapps"] + status["activeapps"]
            if a["name"] == "mqguard-audit-cluster-test"]
    assert len(apps) == 1, status
    app_id = apps[0]["id"]
    ran_python: list[str] = []
    for n in range(2):
        ui = mqguard_spark_cluster.urls[f"worker-{n}-ui"]
        executors = worker_json(ui)["finishedexecutors"] + worker_json(ui)["executors"]
        assert any(e["appid"] == app_id for e in executors), (n, executors)
        logs = list((Path(mqguard_spark_cluster.meta["work_dir"]) / f"worker-{n}" / app_id)
                    .glob("*/stderr"))
        text = "".join(p.read_text(errors="replace") for p in logs)
        assert "Running task" in text, f"worker {n} ran no task of {app_id}"
        # Python tasks are the audit's Redis readers (the event plan runs in the JVM only).
        if "Times: total" in text:
            ran_python.append(f"worker-{n}")
    assert ran_python == ["worker-0", "worker-1"], ran_python
    print(f"cluster start {mqguard_spark_cluster.meta['start_seconds']} s, "
          f"cluster audit (CLI, driver start included) {seconds:.1f} s, {summary['seconds']}")


def test_bench_audit_on_the_cluster(mqguard_spark_cluster: ServerHandle, tmp_path: Path) -> None:
    """``mqguard bench audit --master spark://...``: every planted finding, nothing else, on
    the cluster's executors (a process of its own: this one's Spark session is local)."""
    if not os.environ.get("CI"):  # in CI the test extra brings duckdb: missing is a failure
        pytest.importorskip("duckdb")
    path = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "mqguard.cli", "bench", "audit", "--events", "5000",
         "--master", mqguard_spark_cluster.urls["master"], "--no-html", "--segment-bytes",
         "65536", "--shuffle-partitions", "4", "--dir", str(tmp_path), "--json", str(path)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(path.read_text())
    assert figures["master"] == mqguard_spark_cluster.urls["master"]
    assert figures["found"] == figures["planted"] > 0 and figures["false_positives"] == 0
    assert figures["class_archive"] == "off"  # the executors' JVMs are not the driver's
    status = master_json(mqguard_spark_cluster)
    assert any(a["name"] == "mqguard-audit" for a in status["completedapps"]), status
