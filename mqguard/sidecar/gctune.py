"""Garbage-collector settings for a process that is a sidecar.

Every guarded message allocates short-lived container objects in Python (its batch's
plain data, the guard's ``Message``, ``Delivery`` and context, the verdicts). Nearly all
die by reference counting, yet the cyclic collector runs whenever 700 more container
objects were allocated than freed. When frames were also parsed into Python objects,
100,000 messages (sends and consumes) made 570 young, 52 middle and 5 full collections,
0.46-0.62 s of CPU, 7-9% of the total (measured with ``gc.callbacks``). With the young
generation's threshold at 10,000 and start-up objects frozen: 1-2 collections,
0.04-0.05 s. Cycles (asyncio's tasks and exceptions make some) are still collected, a
little later. :meth:`GcTuning.apply` freezes what start-up created (modules, plugins,
configuration), so the collector never traverses those again.

A collection that comes later must not decide when memory comes back, though: a
session's buffers (up to ``max-frame-bytes`` per leg) are the runtime's and freed when
it ends, and its Python side (``BridgedSession``, its ``UpstreamLeg``) is released when
the runtime reports the end, by reference counting
(``tests/integration/test_sidecar_handshake_flood.py`` checks both without the collector).

Only a sidecar that owns its process applies this (:class:`~mqguard.sidecar.server.Sidecar`
running on the main thread, as ``mqguard sidecar`` does); one hosted on a thread of
another program (tests, ``bench proxy --sidecar thread``) leaves that program's
collector alone.
"""

from __future__ import annotations

import gc
import threading
from typing import Final

#: Young-generation threshold while a sidecar runs (CPython's default is 700).
YOUNG_THRESHOLD: Final = 10_000


class GcTuning:
    """Applies the sidecar's collector settings; :meth:`restore` undoes them."""

    __slots__ = ("_previous",)

    def __init__(self) -> None:
        self._previous: tuple[int, int, int] | None = None

    def apply(self) -> bool:
        """Tune the collector if this sidecar owns the process; True when applied."""
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return False
        previous = gc.get_threshold()
        self._previous = previous
        gc.collect()
        gc.freeze()
        gc.set_threshold(max(previous[0], YOUNG_THRESHOLD), previous[1], previous[2])
        return True

    def restore(self) -> None:
        """Back to the settings before :meth:`apply` (no-op if it did nothing)."""
        previous, self._previous = self._previous, None
        if previous is not None:
            gc.set_threshold(*previous)
            gc.unfreeze()
