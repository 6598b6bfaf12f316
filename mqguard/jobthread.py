"""A thread of an adapter's own that runs jobs one at a time, in submission order.

Adapters deliver messages inline on their network thread (fast), so anything
that must wait for the broker's confirmation -- a send whose RECEIPT or PUBACK
only the network thread can read -- cannot run there. :class:`JobThread` runs
such work instead: ``Adapter.defer()`` jobs (the guard moves a message to a
dead-letter address through one) and, with ``dispatch_thread=True``, every
delivery callback.

The queue is unbounded on purpose: blocking the network thread when it is full
would bring the deadlock back; the broker's prefetch / Receive Maximum window
bounds the deliveries of acknowledged subscriptions.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("mqguard.adapters")


class JobThread:
    """Runs submitted jobs on one thread, in order; a job's exception is logged, not fatal."""


    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._jobs is not None and self._thread is not None and self._thread.is_alive():
                return
            # A stopped thread may still be finishing its own queue: it gets no new jobs.
            jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
            thread = threading.Thread(target=self._run, args=(jobs,), name=self._name,
                                      daemon=True)
            self._jobs, self._thread = jobs, thread
            thread.start()

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue ``job``; False (and not queued) when the dispatcher is stopped."""
        with self._lock:
            if self._jobs is None:
                return False
            self._jobs.put(job)
            return True

    def is_current(self) -> bool:
        """True on the dispatcher's own thread."""
        thread = self._thread
        return thread is not None and thread is threading.current_thread()

    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until the jobs queued so far have run."""
        if self.is_current():
            return  # they are queued behind the caller
        done = threading.Event()
        if self.submit(done.set):
            done.wait(timeout)

    def stop(self, timeout: float, *, join: bool = True) -> None:
        """Run what is queued, then end the thread; wait for that unless ``join`` is False."""
        with self._lock:
            jobs, thread = self._jobs, self._thread
            self._jobs = self._thread = None
            if jobs is None:
                return
            jobs.put(None)
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @staticmethod
    def _run(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:
                log.exception("a job on the adapter's dispatcher thread raised")
