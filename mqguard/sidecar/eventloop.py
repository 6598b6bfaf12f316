"""The sidecar's event loop: uvloop where it is installed, asyncio's own otherwise.

The sidecar does little per frame, so the event loop's own cost (waking on a
readable socket, handing the bytes to the stream, writing) is a large share of
what it adds to every exchange. uvloop (libuv, in C) does that part several
times cheaper than the pure-Python selector loop; ``pip install mqguard[sidecar]``
installs it. Both loops run the same code: the choice changes speed only.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Final

from mqguard.errors import ConfigError

#: ``--event-loop`` choices: ``auto`` picks uvloop when it is importable.
LOOP_KINDS: Final = ("auto", "uvloop", "asyncio")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(kind: str) -> str:
    """``uvloop`` or ``asyncio`` for a ``--event-loop`` value; ConfigError if impossible."""
    if kind not in LOOP_KINDS:
        raise ConfigError(f"event loop must be one of {', '.join(LOOP_KINDS)}, not {kind!r}")
    if kind == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if kind == "uvloop" and not uvloop_available():
        raise ConfigError("event loop 'uvloop' asked for, but uvloop is not installed "
                          "(pip install 'mqguard[sidecar]')")
    return kind


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function making a new event loop of ``kind`` (see :func:`resolve`)."""
    if resolve(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop
