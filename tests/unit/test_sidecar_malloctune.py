"""The sidecar fixes glibc's mmap threshold, so large frame buffers are unmapped when freed."""

from __future__ import annotations

import platform
import sys

from mqguard.sidecar.malloctune import MMAP_THRESHOLD, fix_mmap_threshold


def test_glibc_takes_the_threshold() -> None:
    on_glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert fix_mmap_threshold(MMAP_THRESHOLD) is on_glibc


def test_the_threshold_is_below_the_frames_it_is_for() -> None:
    # A frame over the threshold is its own mapping: 1 MiB is far below max-frame-bytes.
    assert MMAP_THRESHOLD == 1 << 20
