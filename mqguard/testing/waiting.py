"""Polling helper for tests that wait on real servers."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             interval: float = 0.02) -> None:
    """Poll ``condition`` until it is truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
