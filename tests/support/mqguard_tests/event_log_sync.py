"""A process that writes events and waits to be SIGKILLed."""

from __future__ import annotations

import multiprocessing
import signal

from mqguard.events import EventLog


def emit_then_hang(directory: str, sync: bool, ready: multiprocessing.synchronize.Event
                    ) -> None:
    # A long flush interval: without sync nothing reaches the file before the kill.
    log = EventLog(directory, node_id="victim", flush_interval_ms=60_000, sync=sync)
    for n in range(5):
        log.emit("sent", None, address="q", n=n)
    ready.set()
    signal.pause()
