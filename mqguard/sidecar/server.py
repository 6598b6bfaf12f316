"""The sidecar process: listener, sessions, admin port, expiry reaper, shutdown.

:class:`Sidecar` runs on one asyncio event loop. Each client connection is a
:class:`~mqguard.sidecar.session.ProxySession`; one failing never disturbs
the others. The guard (store, event log, plugins) is shared by all sessions;
its redelivery timer is the sidecar's redelivery scheduler. The expiry reaper
runs on a thread of its own over a separate broker connection, and so does the
redistributor of each broker group given with ``redistribute``
(docs/load-balancing.md).

Guard decisions run on the event loop: with a Redis store every SEND and
MESSAGE costs one Redis round trip at most (usually none, see the plugins), and
a slow Redis slows every connection of this sidecar alike. Run several sidecars
(they share one Redis) to spread that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from mqguard.config import MqguardConfig, SidecarConfig
from mqguard.errors import ConfigError
from mqguard.pipeline import Guard
from mqguard.registry import redact_url
from mqguard.sidecar.connection import FrameConnection
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    Frame,
    FrameDecoder,
    FrameLimits,
    broker_leg_limits,
    encode,
)
from mqguard.sidecar.gctune import GcTuning
from mqguard.sidecar.metrics import SidecarMetrics
from mqguard.sidecar.session import ProxySession, address_of

log = logging.getLogger("mqguard.sidecar")

#: Addresses the reaper learns from traffic, at most (configured ones always count).
MAX_WATCHED_ADDRESSES = 10_000


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the sidecar connects for each client."""

    host: str
    port: int
    ssl_context: ssl.SSLContext | None
    #: The URL as given, for the reaper's own connection (may hold its credentials).
    url: str

    @property
    def where(self) -> str:
        return redact_url(self.url)


def parse_upstream(url: str, *, cafile: str | None = None,
                   insecure: bool = False) -> Upstream:
    """``stomp://host:port`` or ``stomp+ssl://host:port``; ConfigError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("stomp", "stomp+ssl"):
        raise ConfigError(f"--upstream {redact_url(url)!r}: scheme must be stomp:// or "
                          "stomp+ssl://")
    if not parts.hostname:
        raise ConfigError(f"--upstream {redact_url(url)!r} has no host")
    try:
        port = parts.port or (61614 if parts.scheme == "stomp+ssl" else 61613)
    except ValueError:
        raise ConfigError(f"--upstream {redact_url(url)!r} has an invalid port") from None
    context = None
    if parts.scheme == "stomp+ssl":
        context = ssl.create_default_context(cafile=cafile)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    return Upstream(parts.hostname, port, context, url)


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (port 0 = any free port); ConfigError naming ``what`` otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


class Sidecar:
    """A running STOMP proxy; see the module docstring."""

    def __init__(self, config: MqguardConfig, upstream: Upstream, *,
                 listen: tuple[str, int] = ("127.0.0.1", 0),
                 admin: tuple[str, int] | None = None,
                 tls: ssl.SSLContext | None = None,
                 reap_addresses: Sequence[str] = (),
                 guard: Guard | None = None,
                 redistribute: Sequence[str] = ()) -> None:
        self.mqguard_config = config
        self.config: SidecarConfig = config.core.sidecar
        self.upstream = upstream
        self.listen_on = listen
        self.admin_on = admin
        self.tls = tls
        self.limits = FrameLimits(max_frame_bytes=self.config.max_frame_bytes,
                                  max_header_count=self.config.max_header_count,
                                  max_header_line_bytes=self.config.max_header_line_bytes)
        #: The broker leg admits every MESSAGE of a SEND the client leg admitted.
        self.broker_limits = broker_leg_limits(self.limits)
        self.metrics = SidecarMetrics()
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(config, role="sidecar")
        self.sessions: set[ProxySession] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._admin: asyncio.Server | None = None
        self._stopping = False
        self._reap_addresses = list(dict.fromkeys(reap_addresses))
        self._watched: set[str] = set(self._reap_addresses)
        self._reaper: object | None = None
        self._reaper_stop = threading.Event()
        self._reaper_thread: threading.Thread | None = None
        #: Broker groups whose queues this sidecar redistributes (docs/load-balancing.md).
        self._redistribute = list(dict.fromkeys(redistribute))
        self._redistributors: list[object] = []
        self._redistributor_threads: list[threading.Thread] = []
        self.port = 0
        self.admin_port = 0
        #: The collector settings of a sidecar that owns its process (see gctune).
        self._gc = GcTuning()

    # -- start / stop --------------------------------------------------------------------

    async def start(self) -> None:
        self.guard.start()
        host, port = self.listen_on
        self._server = await asyncio.get_running_loop().create_server(
            self.client_connection, host, port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.admin_on is not None:
            self._admin = await asyncio.start_server(self._serve_admin, *self.admin_on)
            self.admin_port = self._admin.sockets[0].getsockname()[1]
        self._start_reaper()
        self._start_redistributors()
        if self._gc.apply():
            log.debug("sidecar owns the process: young-generation GC threshold raised, "
                      "start-up objects frozen")
        log.info("sidecar listening on %s:%d%s, upstream %s%s", host, self.port,
                 " (TLS)" if self.tls else "", self.upstream.where,
                 f", admin on {self.admin_on[0]}:{self.admin_port}"
                 if self._admin and self.admin_on else "")

    async def stop(self) -> None:
        """Graceful: stop accepting, let every session drain (bounded), then release all."""
        if self._stopping:
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.shutdown()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.config.drain_timeout_ms / 1000 + 3)
        self._stop_reaper()
        self._stop_redistributors()
        if self._admin is not None:
            self._admin.close()
        if self._owns_guard:
            await asyncio.to_thread(self.guard.close)
        self._gc.restore()
        log.info("sidecar stopped")

    # -- connections ---------------------------------------------------------------------

    def client_connection(self) -> FrameConnection:
        """The protocol of an accepted connection; its session starts once it is made."""
        # Client frames are always encoded again (see ProxySession._write_broker): no
        # need to keep their received octets.
        decoder = FrameDecoder(limits=self.limits, commands=CLIENT_COMMANDS, keep_wire=False)
        return FrameConnection(decoder, self.metrics.bytes.labels("client"),
                               on_made=self._accept)

    def _accept(self, connection: FrameConnection) -> None:
        if self._stopping or len(self.sessions) >= self.config.max_connections:
            reason = ("the sidecar is shutting down" if self._stopping
                      else f"too many connections (max-connections = "
                           f"{self.config.max_connections})")
            self.metrics.connections_total.labels("refused").inc()
            connection.stop_reading()
            with contextlib.suppress(Exception):
                connection.write(encode(Frame("ERROR", [("message", reason)]), "1.0"))
                assert connection.transport is not None
                connection.transport.close()  # after the ERROR is written
            return
        session = ProxySession(self, connection)
        self.sessions.add(session)
        self.metrics.connections.inc()
        task = asyncio.get_running_loop().create_task(self._serve(session))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, session: ProxySession) -> None:
        try:
            outcome = await session.run()
            self.metrics.connections_total.labels(_outcome_label(outcome)).inc()
        finally:
            self.sessions.discard(session)
            self.metrics.connections.dec()

    # -- expiry reaper -------------------------------------------------------------------

    def watch_expiring(self, address: str) -> None:
        """An expiring message was sent to ``address``: the reaper scans it from now on."""
        if address in self._watched or len(self._watched) >= MAX_WATCHED_ADDRESSES:
            return
        self._watched.add(address)
        reaper = self._reaper
        if reaper is not None:
            reaper.watch(address)  # type: ignore[attr-defined]

    def _start_reaper(self) -> None:
        period = self.mqguard_config.core.message_expiry_scan_period
        if period <= 0:
            return
        from mqguard.adapters.stomp import StompAdapter
        from mqguard.reaper import ExpiryReaper

        adapter = StompAdapter(self.upstream.url)
        reaper = ExpiryReaper(self.guard, adapter, [address_of(a) for a in self._watched])
        self._reaper = reaper

        def run() -> None:
            try:
                reaper.run(self._reaper_stop, period)
            except Exception:
                log.exception("expiry reaper stopped by an error; expired messages are still "
                              "moved when a guarded consumer receives them")
            finally:
                with contextlib.suppress(Exception):
                    adapter.close()

        self._reaper_thread = threading.Thread(target=run, name="mqguard-sidecar-reaper",
                                               daemon=True)
        self._reaper_thread.start()

    def _stop_reaper(self) -> None:
        self._reaper_stop.set()
        if self._reaper_thread is not None:
            self._reaper_thread.join(10)

    # -- redistributor -------------------------------------------------------------------

    def _start_redistributors(self) -> None:
        """One thread per group given with ``redistribute`` (ConfigError for unknown
        groups), over connections of its own; the stop event is the reaper's."""
        if not self._redistribute:
            return
        from mqguard.balancing import group_config
        from mqguard.redistributor import Redistributor

        for name in self._redistribute:
            group_config(self.mqguard_config, name)  # unknown group: ConfigError now
        from prometheus_client import Counter

        moved = Counter("mqguard_redistributed_total", "Messages the sidecar's redistributor "
                        "moved, by group, source node and target node.",
                        ["group", "source", "target"], registry=self.metrics.registry)
        for name in self._redistribute:
            redistributor = Redistributor(
                self.guard, name,
                on_move=lambda group, queue, source, target, count: moved.labels(
                    group, source, target).inc(count))
            self._redistributors.append(redistributor)

            def run(redistributor: Redistributor = redistributor) -> None:
                try:
                    redistributor.run(self._reaper_stop)
                except Exception:
                    log.exception("redistributor of group %s stopped by an error",
                                  redistributor.group_name)
                finally:
                    redistributor.close()

            thread = threading.Thread(target=run, name=f"mqguard-redistributor-{name}",
                                      daemon=True)
            thread.start()
            self._redistributor_threads.append(thread)

    def _stop_redistributors(self) -> None:
        self._reaper_stop.set()
        for thread in self._redistributor_threads:
            thread.join(10)

    # -- admin port ----------------------------------------------------------------------

    async def _serve_admin(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # headers: none are needed
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] != "GET":
                status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, kind = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                body = self.metrics.render()
            elif path == "/health":
                healthy, report = await self.health()
                status = "200 OK" if healthy else "503 Service Unavailable"
                kind, body = "application/json", json.dumps(report).encode() + b"\n"
            else:
                status, kind, body = "404 Not Found", "text/plain", b"try /metrics or /health\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, OSError, UnicodeError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def health(self) -> tuple[bool, dict[str, object]]:
        """Serving, and the broker accepts TCP connections."""
        upstream_ok = True
        try:
            async with asyncio.timeout(2):
                _, writer = await asyncio.open_connection(self.upstream.host, self.upstream.port)
            writer.close()
        except (OSError, TimeoutError):
            upstream_ok = False
        healthy = upstream_ok and not self._stopping
        return healthy, {"status": "ok" if healthy else "unavailable",
                         "stopping": self._stopping, "upstream_reachable": upstream_ok,
                         "connections": len(self.sessions), "upstream": self.upstream.where}


def _outcome_label(outcome: str) -> str:
    # Bounded label values: broker error texts must not become label values.
    known = {"disconnect", "client-closed", "client-lost", "protocol-error", "shutdown",
             "broker-closed", "broker-error", "no-connect", "broker-refused", "client-error"}
    return outcome if outcome in known else "other"


class SidecarThread:
    """A sidecar on an event loop of its own thread (tests, benchmarks, the demo)."""

    def __init__(self, sidecar: Sidecar, *, event_loop: str = "asyncio") -> None:
        self.sidecar = sidecar
        self._loop = loop_factory(event_loop)()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mqguard-sidecar", daemon=True)

    def start(self, timeout: float = 30.0) -> SidecarThread:
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError("sidecar did not start in time")
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

    @property
    def admin_port(self) -> int:
        return self.sidecar.admin_port

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop)
        try:
            future.result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> SidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
