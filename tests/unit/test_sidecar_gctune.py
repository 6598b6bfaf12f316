"""The sidecar's collector settings: applied only by a sidecar that owns the process."""

from __future__ import annotations

import gc
import threading

from mqguard.sidecar.gctune import YOUNG_THRESHOLD, GcTuning


def test_applied_on_the_main_thread_and_restored() -> None:
    before = gc.get_threshold()
    tuning = GcTuning()
    try:
        assert tuning.apply()
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_freeze_count() > 0
        assert not tuning.apply()  # once
    finally:
        tuning.restore()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_left_alone_on_another_thread() -> None:
    before = gc.get_threshold()
    applied: list[bool] = []
    tuning = GcTuning()
    thread = threading.Thread(target=lambda: applied.append(tuning.apply()))
    thread.start()
    thread.join()
    assert applied == [False]
    assert gc.get_threshold() == before
    tuning.restore()  # nothing to undo
    assert gc.get_threshold() == before
