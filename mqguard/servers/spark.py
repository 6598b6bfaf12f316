"""A Spark standalone cluster on loopback, from the installed PySpark.

A master and ``workers`` workers, each its own JVM (``spark-class
org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker``), with ports from the
kernel and every directory (work, logs, local scratch) in the state dir. It exists so that
``mqguard audit --master spark://...`` and ``mqguard bench audit --master`` can run against a
real cluster on one machine: the executors are separate JVMs on separate workers, they run
their Python tasks with this interpreter (``PYSPARK_PYTHON``), and they reach the driver on
127.0.0.1.

Readiness is the master's JSON (``http://127.0.0.1:UI/json/``) listing every worker
``ALIVE``; each wait is bounded. The handle ends the processes by PID (workers first).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    ServerUnavailable,
    make_state_dir,
    spawn,
    terminate_pid,
)
from mqguard.servers.ports import LOOPBACK, free_ports, wait_until

__all__ = ["master_json", "spark_home", "start_spark_cluster", "worker_json"]

#: Seconds the master, then all workers together, may take to be ready.
START_TIMEOUT = 90.0
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The installed PySpark's directory, which holds ``bin/spark-class`` and the jars."""
    try:
        import pyspark
    except ImportError as exc:
        raise ServerUnavailable(f"a Spark cluster needs PySpark ({exc}): "
                                "pip install 'mqguard[spark]'") from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise ServerUnavailable(f"{home} has no bin/spark-class")
    return home


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read().decode("utf-8"))


def master_json(handle: ServerHandle) -> dict[str, Any]:
    """The master's status: ``workers``, ``activeapps``, ``completedapps``, ``aliveworkers``..."""
    data = _get_json(handle.urls["ui"] + "/json/")
    if not isinstance(data, dict):
        raise ServerStartError(f"the Spark master's /json/ is not an object: {data!r:.200}")
    return data


def worker_json(url: str) -> dict[str, Any]:
    """A worker's status (``executors``, ``finishedexecutors``...) from its web UI URL."""
    data = _get_json(url.rstrip("/") + "/json/")
    if not isinstance(data, dict):
        raise ServerStartError(f"the Spark worker's /json/ is not an object: {data!r:.200}")
    return data


def _alive_workers(handle: ServerHandle) -> int:
    try:
        return int(master_json(handle).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def _env(state: Path, java_home: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(state / "logs"),
        "SPARK_LOCAL_DIRS": str(state / "local"),
        # The daemons only keep the cluster's books: the default 1 GB heap each is waste.
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    # An application's own conf dir would change the daemons' logging and defaults.
    env.pop("SPARK_CONF_DIR", None)
    if java_home:
        env["JAVA_HOME"] = java_home
    return env


def start_spark_cluster(state_dir: Path | str | None = None, *, workers: int = 2,
                        worker_cores: int = 1, worker_memory: str = "1g",
                        java_home: str | None = None) -> ServerHandle:
    """Start a master and ``workers`` workers on 127.0.0.1; wait until all are registered.

    ``urls``: ``master`` (``spark://127.0.0.1:PORT``), ``ui`` (the master's web UI, whose
    ``/json/`` lists workers and applications) and ``worker-N-ui`` per worker. ``meta``:
    ``workers``, ``work_dir`` (executors' stdout/stderr under ``app-*/ID/``) and
    ``start_seconds``. Raises :class:`ServerStartError` (with the log tail) on a failed start.
    """
    if workers < 1:
        raise ValueError("workers must be at least 1")
    started = time.monotonic()
    home = spark_home()
    state = make_state_dir("spark", state_dir)
    for sub in ("logs", "local", "work"):
        (state / sub).mkdir(exist_ok=True)
    env = _env(state, java_home)
    spark_class = str(home / "bin" / "spark-class")
    port, ui, *worker_ports = free_ports(2 + 2 * workers)
    master_url = f"spark://{LOOPBACK}:{port}"
    master_log = state / "master.log"
    master = spawn([spark_class, MASTER_CLASS, "--host", LOOPBACK, "--port", str(port),
                    "--webui-port", str(ui)], state_dir=state, env=env, console_log=master_log)
    handle = ServerHandle(kind="spark", urls={"master": master_url, "ui": f"http://{LOOPBACK}:{ui}"},
                          pid=master.pid, state_dir=state, log_path=master_log,
                          version=_version(home),
                          meta={"workers": str(workers), "work_dir": str(state / "work")})
    handle.record_pid(master.pid, extra=False)
    try:
        wait_until(lambda: _alive_workers(handle) == 0 and _answers(handle), START_TIMEOUT,
                   what="the Spark master's web UI", proc=master, log_path=master_log,
                   interval=0.2)
        logs = [master_log]
        for n in range(workers):
            rpc, web = worker_ports[2 * n], worker_ports[2 * n + 1]
            work = state / "work" / f"worker-{n}"
            work.mkdir(exist_ok=True)
            log = state / f"worker-{n}.log"
            logs.append(log)
            proc = spawn([spark_class, WORKER_CLASS, "--host", LOOPBACK, "--port", str(rpc),
                          "--webui-port", str(web), "--cores", str(worker_cores),
                          "--memory", worker_memory, "--work-dir", str(work), master_url],
                         state_dir=state, env=env, console_log=log)
            handle.record_pid(proc.pid)
            handle.urls[f"worker-{n}-ui"] = f"http://{LOOPBACK}:{web}"
        wait_until(lambda: _alive_workers(handle) == workers, START_TIMEOUT,
                   what=f"{workers} Spark workers registered with the master", proc=master,
                   log_path=logs, interval=0.2)
    except BaseException:
        for pid in handle.all_pids():
            terminate_pid(pid, handle.pid_start_times.get(str(pid)), timeout=10.0)
        raise
    handle.meta["start_seconds"] = f"{time.monotonic() - started:.2f}"
    handle.save()
    return handle


def _answers(handle: ServerHandle) -> bool:
    try:
        master_json(handle)
    except (OSError, ValueError):
        return False
    return True


def _version(home: Path) -> str:
    try:
        import pyspark

        return str(pyspark.__version__)
    except (ImportError, AttributeError):
        return home.name
