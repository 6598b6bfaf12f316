"""A service with an async start/stop, run on an asyncio loop of its own thread.

The sidecars run this way inside tests, benchmarks and the demo: the caller's thread
stays free to drive clients while the service serves on its loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Generic, Protocol, Self, TypeVar

__all__ = ["LoopThread", "Served"]


class Served(Protocol):
    """What :class:`LoopThread` runs: started and stopped on its loop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def port(self) -> int: ...


S = TypeVar("S", bound=Served)


class LoopThread(Generic[S]):
    """Runs ``service`` on ``loop`` in a daemon thread named ``name``; a context manager.
    :meth:`start` returns once the service serves (or raises what its start raised)."""

    def __init__(self, service: S, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.sidecar = service
        self._loop = loop
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, timeout: float = 30.0) -> Self:
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"{self._thread.name} did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.sidecar.start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    @property
    def port(self) -> int:
        return self.sidecar.port

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop)
        try:
            future.result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
