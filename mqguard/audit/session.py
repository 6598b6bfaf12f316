"""The SparkSession the audit runs in.

``local[*]`` is the default because most event logs fit one machine, and a
local session needs no cluster; ``--master`` takes any Spark master URL when they
do not. The local defaults suit a small machine (2 cores is the reference):

- few shuffle partitions (2 per core; adaptive execution coalesces further):
  Spark's default of 200 would make a small audit mostly task overhead; at least 4
  file-scan tasks per core, so that the cores finish the scans together; files
  listed on the driver, not in a listing job;
- no web UI and no console progress bar: the CLI reports progress itself;
- log level WARN, and the JVM's own output sent to a log file (``spark.log`` in
  the output directory) instead of the terminal, so ``--json`` and ``--quiet``
  stay clean;
- the driver bound to loopback, so a host name that resolves oddly costs neither
  a warning nor a DNS timeout;
- UTC as the session time zone, so times in the report do not depend on the
  machine that ran it;
- the JVM class-data archive, when one was made (:mod:`mqguard.audit.class_archive`):
  seconds off the start of every local session.

On a cluster only the settings that do not depend on the machine are applied;
everything else comes from the cluster's defaults or ``--conf``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
APP_NAME = "mqguard-audit"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def is_loopback_cluster(master: str) -> bool:
    """A standalone master on this machine's loopback (``spark://127.0.0.1:PORT``): its
    executors run here, so they reach the driver on loopback and run this interpreter."""
    hosts = master.removeprefix("spark://").split(",") if master.startswith("spark://") else []
    return bool(hosts) and all(h.rsplit(":", 1)[0] in LOOPBACK_HOSTS for h in hosts)


def local_cores(master: str) -> int:
    """Cores a ``local[N]`` / ``local[*]`` master uses."""
    inside = master[len("local["):-1] if master.startswith("local[") else "1"
    if inside.startswith("*") or not inside.split(",")[0].isdigit():
        return os.cpu_count() or 1
    return max(1, int(inside.split(",")[0]))


def session_conf(master: str = DEFAULT_MASTER, *, shuffle_partitions: int | None = None,
                 driver_memory: str | None = "2g",
                 extra: Mapping[str, str] | None = None,
                 class_archive: bool = True) -> dict[str, str]:
    """The configuration :func:`build_session` applies (exposed for tests and docs)."""
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
        "spark.sql.session.timeZone": "UTC",
    }
    if is_local(master):
        conf.update({
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": str(shuffle_partitions
                                                or max(2, 2 * local_cores(master))),
            # At least 4 scan tasks per core: Spark otherwise packs a few hundred MB of
            # segments into 2-3 partitions of up to 128 MB, and the last one runs alone
            # while the other cores wait (at 10 million events the main pass ran as 3
            # tasks on 2 cores).
            "spark.sql.files.minPartitionNum": str(4 * local_cores(master)),
            # Files are listed by the driver: above 32 paths Spark would list them in a
            # distributed job, which on a local master is only a job's overhead.
            "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
        })
        if driver_memory:
            conf["spark.driver.memory"] = driver_memory
    else:
        if is_loopback_cluster(master):
            # The executors connect back to the driver: the machine's name may resolve to
            # an address the cluster's loopback ports are not reachable from.
            conf.update({"spark.driver.host": "127.0.0.1",
                         "spark.driver.bindAddress": "127.0.0.1"})
        if shuffle_partitions:
            conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra or {})
    if class_archive and is_local(master):
        from mqguard.audit import class_archive as archive

        option = archive.java_options()
        if option:  # after the user's own driver options, which it must not replace
            given = conf.get("spark.driver.extraJavaOptions", "")
            conf["spark.driver.extraJavaOptions"] = f"{given} {option}".strip()
    return conf


@contextlib.contextmanager
def _output_to(log_path: str | None) -> Iterator[None]:
    """Point this process's stdout/stderr at ``log_path`` while the JVM is launched.

    The JVM inherits the file descriptors and keeps them, so its start-up chatter
    and later log lines go to the file; Python's own streams are restored at once.
    """
    if log_path is None or SparkContext._gateway is not None:  # JVM already running
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (target, *saved):
            os.close(fd)


def build_session(master: str = DEFAULT_MASTER, *, shuffle_partitions: int | None = None,
                  driver_memory: str | None = "2g", conf: Mapping[str, str] | None = None,
                  log_path: str | None = None, app_name: str = APP_NAME,
                  class_archive: bool = True) -> SparkSession:
    """Start (or join) the SparkSession for an audit.

    ``log_path``: where the JVM's output goes (None: inherit the terminal). Static
    settings such as the driver memory only take effect when this call starts
    the JVM; a session already running in the process is reused as it is.
    ``class_archive``: a local driver maps the JVM class-data archive when one was
    made (:mod:`mqguard.audit.class_archive`): seconds off the session start.
    """
    settings = session_conf(master, shuffle_partitions=shuffle_partitions,
                            driver_memory=driver_memory, extra=conf,
                            class_archive=class_archive)
    if is_local(master) or is_loopback_cluster(master):
        # Read by Spark's launcher scripts before any conf: avoids the "hostname
        # resolves to a loopback address" lookup and warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if is_loopback_cluster(master):
        # The executors' Python tasks (the Redis readers, broker-log parsers) start the
        # interpreter PySpark names; "python3" on PATH may lack mqguard and pyspark.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _output_to(log_path):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
