"""Progress of an audit on a terminal: the stage, Spark's task counts, the time.

The runner names its stages (``reading 5 file(s)``, ``checking messages``...);
within a stage the work is Spark's, so a watcher thread polls Spark's status
tracker twice a second and shows the tasks done of the active stages. Shown on
stderr and only on a terminal: ``--json`` and ``--quiet`` output stays clean.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

POLL_S = 0.5


def spark_tasks(spark: Any) -> str:
    """``tasks 12/24`` over Spark's active stages ('' when none is running)."""
    try:
        tracker = spark.sparkContext.statusTracker()
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
    except Exception:  # the session stopping under the watcher: show nothing
        return ""
    return f"tasks {done}/{total}" if total else ""


class Progress:
    """Stage callback for :func:`~mqguard.audit.runner.run_audit` plus the Spark watcher."""

    def __init__(self, show: Callable[[str], None], *, live: bool = True) -> None:
        self._show = show
        self._live = live
        self._stage = "starting Spark"
        self._started = time.monotonic()
        self._spark: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, stage: str) -> None:
        self._stage = stage
        self._refresh()

    def watch(self, spark: Any) -> None:
        """Start polling ``spark``'s task counts."""
        self._spark = spark
        if self._live and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="audit-progress",
                                            daemon=True)
            self._thread.start()

    def _refresh(self) -> None:
        tasks = spark_tasks(self._spark) if self._spark is not None else ""
        elapsed = time.monotonic() - self._started
        self._show(f"{self._stage}{'  ' + tasks if tasks else ''}  [{elapsed:.0f} s]")

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._refresh()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


@contextlib.contextmanager
def terminal_progress(enabled: bool, stream_is_tty: bool) -> Iterator[Progress]:
    """A rich spinner on stderr when ``enabled`` and stderr is a terminal; else silent."""
    if not enabled or not stream_is_tty:
        silent = Progress(lambda text: None, live=False)
        yield silent
        return
    from rich.console import Console

    with Console(stderr=True).status("starting Spark") as status:
        progress = Progress(status.update)
        try:
            yield progress
        finally:
            progress.close()
