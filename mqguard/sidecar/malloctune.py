"""Large frame buffers go back to the operating system when they are freed.

The STOMP codec (native, Rust) buffers a frame until it is complete: up to
``max-frame-bytes`` (16 MiB) per leg, allocated with the C library's ``malloc``. glibc
serves such a block with its own ``mmap`` and unmaps it on ``free``, but only while the
block is above the *dynamic* mmap threshold, which starts at 128 KiB and rises to the
size of every mmapped block freed (up to 32 MiB). After the first burst of large frames
the threshold sits above them, the next ones come from the heap, and freeing them returns
nothing: 20 sessions ended mid-way through 12 MiB SENDs left the sidecar 26 MiB to
177 MiB larger after the second such burst (test_sidecar_handshake_flood.py). Setting
the threshold once fixes it where it is (glibc then no longer adjusts it), so a block of
1 MiB or more is always its own mapping.

Only a sidecar that owns its process applies this, as with the collector settings
(:mod:`mqguard.sidecar.gctune`); on a C library without ``mallopt`` it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Final

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]

#: Blocks of at least this many bytes are mapped on their own and unmapped when freed.
MMAP_THRESHOLD: Final = 1 << 20
#: glibc's mallopt parameter number for the mmap threshold (malloc.h).
_M_MMAP_THRESHOLD: Final = -3


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; True when the C library took it."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
