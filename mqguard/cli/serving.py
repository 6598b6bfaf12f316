"""Serve a sidecar in the foreground until SIGTERM or SIGINT, then stop it (draining)."""

from __future__ import annotations

import asyncio
import signal
from typing import Protocol

import click

__all__ = ["Serving", "serve_until_signalled"]


class Serving(Protocol):
    """A sidecar as the command line runs it."""

    listen_on: tuple[str, int]
    admin_port: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def port(self) -> int: ...


async def serve_until_signalled(proxy: Serving, name: str, stopping: str) -> None:
    """Start ``proxy``, say where it listens (``name listening on HOST:PORT``: the line
    supervisors and the benchmarks wait for), serve until a signal, then stop it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await proxy.start()
    click.echo(f"{name} listening on {proxy.listen_on[0]}:{proxy.port}"
               + (f", admin on port {proxy.admin_port}" if proxy.admin_port else ""), err=True)
    await stop.wait()
    click.echo(f"mqguard sidecar: {stopping}", err=True)
    await proxy.stop()
