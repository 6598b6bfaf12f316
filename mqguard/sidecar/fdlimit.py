"""File descriptors: how many sessions the process's limit on open files allows.

Each session holds :data:`FDS_PER_SESSION` descriptors: the client's socket, the
broker's socket, and a duplicate of the broker's that the native runtime re-arms TCP
quick-acks through (``native/src/transport/leg.rs``). With the common soft limit of
1024 that is about 330 sessions, not the 1024 of ``max-connections``: past it,
``accept()`` and the broker connection fail with EMFILE. So at start the sidecar raises
its soft limit to the hard one (what any process may do), admits no more sessions than
the limit allows (the others get an ERROR frame like any refused client), and warns
when that is fewer than ``max-connections``.

The native runtime keeps one descriptor in reserve, so that even when something else
used up the limit (the store, the event log, the reaper) a client that could not be
accepted is still accepted, told why, and closed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Final

#: Descriptors one session holds: client socket, broker socket, quick-ack duplicate.
FDS_PER_SESSION: Final = 3
#: Descriptors kept free for everything that is not a session: the store's and the
#: reaper's connections, event-log files, the admin port, refusals in progress.
RESERVED_FDS: Final = 32


@dataclass(frozen=True, slots=True)
class DescriptorBudget:
    """The limit on open files and the sessions it leaves room for."""

    #: The soft limit after raising it (None where the platform has no such limit).
    soft: int | None
    hard: int | None
    #: Whether the soft limit was raised at start.
    raised_from: int | None
    #: Descriptors already open at start.
    in_use: int
    #: Sessions the limit leaves room for, at most ``max_connections``.
    max_sessions: int

    def shortfall(self, max_connections: int) -> bool:
        """True if the limit cannot serve ``max_connections`` sessions at once."""
        return self.max_sessions < max_connections


def open_descriptors() -> int:
    """Descriptors open in this process now (0 where that cannot be counted cheaply)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return max(0, len(os.listdir(path)) - 1)  # less the one listdir opened
    return 0


def descriptor_budget(max_connections: int) -> DescriptorBudget:
    """Raise the soft RLIMIT_NOFILE to the hard one; the sessions that leaves room for."""
    try:
        import resource
    except ImportError:  # not a POSIX system: no such limit to respect
        return DescriptorBudget(None, None, None, 0, max_connections)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised_from = None
    if hard == resource.RLIM_INFINITY or soft < hard:
        # An unlimited hard limit cannot be the soft one (the kernel caps it at
        # fs.nr_open): ask for what max-connections needs, with room to spare.
        wanted = hard if hard != resource.RLIM_INFINITY else max(
            soft, (max_connections + 1) * FDS_PER_SESSION + RESERVED_FDS)
        if wanted > soft:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                raised_from, soft = soft, wanted
    in_use = open_descriptors()
    if soft == resource.RLIM_INFINITY:
        room = max_connections
    else:
        room = max(1, (soft - in_use - RESERVED_FDS) // FDS_PER_SESSION)
    return DescriptorBudget(soft, hard, raised_from, in_use, min(max_connections, room))
