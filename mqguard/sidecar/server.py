"""The sidecar process: listener, sessions, admin port, expiry reaper, shutdown.

Each client connection is a session of the native runtime (``mqguard_native``: its
sockets, framing and per-frame state in Rust, see :mod:`mqguard.sidecar.native_bridge`);
one failing never disturbs the others. The guard (store, event log, plugins) is shared
by all sessions and called once per read batch on the runtime's thread; its redelivery
timer is the sidecar's redelivery scheduler. :class:`Sidecar` itself runs on an asyncio
event loop that serves the admin port and signals. The expiry reaper runs on a thread of
its own over a separate broker connection, and so does the redistributor of each broker
group given with ``redistribute`` (docs/load-balancing.md).

With a Redis store every batch of SENDs or MESSAGEs costs one Redis round trip at most
(usually none, see the plugins), and a slow Redis slows every connection of this sidecar
alike. Run several sidecars (they share one Redis) to spread that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mqguard.config import MqguardConfig, SidecarConfig
from mqguard.errors import ConfigError
from mqguard.loopthread import LoopThread
from mqguard.pipeline import Guard
from mqguard.redact import redact_url, split_server_url
from mqguard.registry import open_adapter
from mqguard.sidecar.admin import (
    RequestTooLarge,
    UpstreamProbe,
    linger_and_close,
    read_request_line,
)
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.fdlimit import FDS_PER_SESSION, descriptor_budget
from mqguard.sidecar.frames import Frame, FrameLimits, broker_leg_limits, encode
from mqguard.sidecar.gctune import GcTuning
from mqguard.sidecar.malloctune import fix_mmap_threshold
from mqguard.sidecar.metrics import SidecarMetrics
from mqguard.sidecar.native_bridge import NativeSessionHandle, NativeSessions
from mqguard.stomp_brokers import DEFAULT_PORTS, address_of

log = logging.getLogger("mqguard.sidecar")

#: Addresses the reaper learns from traffic, at most (configured ones always count).
MAX_WATCHED_ADDRESSES = 10_000
#: Seconds between two log lines about clients refused for want of descriptors.
_FD_WARNING_INTERVAL = 30.0


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the sidecar connects for each client."""

    host: str
    port: int
    ssl_context: ssl.SSLContext | None
    #: The URL as given, for the reaper's own connection (may hold its credentials).
    url: str
    #: How ``ssl_context`` was made, for the native data plane's own TLS (rustls).
    cafile: str | None = None
    insecure: bool = False

    @property
    def where(self) -> str:
        return redact_url(self.url)


def parse_upstream(url: str, *, cafile: str | None = None,
                   insecure: bool = False) -> Upstream:
    """``stomp://host:port`` or ``stomp+ssl://host:port``; ConfigError otherwise.

    Errors show the URL masked (:func:`mqguard.redact.redact_url`); a password holding an
    unencoded ``/``, ``?`` or ``#`` is refused: a parser would connect to part of it.
    """
    try:
        parts, host, port = split_server_url(url, DEFAULT_PORTS, what="--upstream")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    context = None
    if parts.scheme == "stomp+ssl":
        context = ssl.create_default_context(cafile=cafile)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    return Upstream(host, port, context, url, cafile, insecure)


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
                 redistribute: Sequence[str] = (),
                 tls_files: tuple[str, str] | None = None) -> None:
        """``tls``: clients connect with TLS, served from ``tls_files``, the certificate
        and key files (the runtime serves TLS with rustls, which cannot use an
        ``ssl.SSLContext``)."""
        self.mqguard_config = config
        self.config: SidecarConfig = config.core.sidecar
        self.upstream = upstream
        self.listen_on = listen
        self.admin_on = admin
        self.tls = tls
        self.tls_files = tls_files
        if tls is not None and tls_files is None:
            raise ConfigError("the sidecar serves TLS from the certificate and key files "
                              "(--tls-cert / --tls-key)")
        #: The native runtime serving the sessions, while it runs.
        self.native_sessions: NativeSessions | None = None
        self.limits = FrameLimits(max_frame_bytes=self.config.max_frame_bytes,
                                  max_header_count=self.config.max_header_count,
                                  max_header_line_bytes=self.config.max_header_line_bytes)
        #: The broker leg admits every MESSAGE of a SEND the client leg admitted.
        self.broker_limits = broker_leg_limits(self.limits)
        self.metrics = SidecarMetrics()
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(config, role="sidecar")
        #: Client sessions open now.
        self.sessions: set[NativeSessionHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
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
        #: Sessions served at once: max-connections, or fewer if the limit on open files
        #: does not allow that many (set at start, see fdlimit).
        self.max_sessions = self.config.max_connections
        #: Sessions that may wait for their CONNECT at once (the runtime evicts the
        #: oldest to make room, see native/src/transport/admission.rs).
        self.max_handshakes = self._handshake_budget()
        self._fd_refusals = 0
        self._fd_warned_at = 0.0

    # -- start / stop --------------------------------------------------------------------

    async def start(self) -> None:
        self.guard.start()
        self._check_descriptors()
        host, port = self.listen_on
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        self._start_native_sessions(loop, [str(info[4][0]) for info in infos], port)
        if self.admin_on is not None:
            self._admin = await asyncio.start_server(self._serve_admin, *self.admin_on)
            self.admin_port = self._admin.sockets[0].getsockname()[1]
        self._start_reaper()
        self._start_dla_depth()
        self._start_redistributors()
        if self._gc.apply():
            log.debug("sidecar owns the process: young-generation GC threshold raised, "
                      "start-up objects frozen; malloc's mmap threshold %s",
                      "fixed" if fix_mmap_threshold() else "left as it is")
        log.info("sidecar listening on %s:%d%s, upstream %s%s", host,
                 self.port, " (TLS)" if self.tls else "", self.upstream.where,
                 f", admin on {self.admin_on[0]}:{self.admin_port}"
                 if self._admin and self.admin_on else "")

    async def stop(self) -> None:
        """Graceful: stop accepting, let every session drain (bounded), then release all."""
        if self._stopping:
            return
        self._stopping = True
        self._stop_listening()
        for session in list(self.sessions):
            session.shutdown()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.config.drain_timeout_ms / 1000 + 3)
        self._stop_reaper()
        self._stop_redistributors()
        if self._admin is not None:
            self._admin.close()
        if self.native_sessions is not None:
            self.native_sessions.close(self.config.drain_timeout_ms / 1000)
            self.native_sessions = None
        if self._owns_guard:
            await asyncio.to_thread(self.guard.close)
        self._gc.restore()
        log.info("sidecar stopped")

    # -- connections ---------------------------------------------------------------------

    def _handshake_budget(self) -> int:
        # At most half of the sessions: a flood of idle connections always leaves the
        # other half to clients that finished their handshake.
        return min(self.config.max_pending_handshakes, max(1, self.max_sessions // 2))

    def _check_descriptors(self) -> None:
        """Raise the soft limit on open files; serve no more sessions than it allows."""
        budget = descriptor_budget(self.config.max_connections)
        if budget.raised_from is not None:
            log.debug("limit on open files raised from %d to %d", budget.raised_from,
                      budget.soft)
        self.max_sessions = budget.max_sessions
        self.max_handshakes = self._handshake_budget()
        if budget.shortfall(self.config.max_connections):
            log.warning(
                "max-connections = %d needs about %d file descriptors, but the limit on open "
                "files is %s (hard limit %s, %d in use): at most %d sessions are served at "
                "once, further clients are refused with an ERROR frame. Raise the limit "
                "(ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) or lower "
                "max-connections.", self.config.max_connections,
                self.config.max_connections * FDS_PER_SESSION + 32, budget.soft, budget.hard,
                budget.in_use, budget.max_sessions)

    def _start_native_sessions(self, loop: asyncio.AbstractEventLoop, hosts: list[str],
                               port: int) -> None:
        """Start the runtime serving whole sessions (see native_bridge)."""
        sessions = NativeSessions(self, loop)
        try:
            self.port = sessions.listen(
                list(dict.fromkeys(hosts)), port,
                refusal=_refusal("too many connections: the sidecar is out of file "
                                 "descriptors; try again later"),
                limits=self.limits, broker_limits=self.broker_limits,
                tls_files=self.tls_files if self.tls is not None else None,
                max_tls_handshakes=self.max_handshakes)
        except BaseException:
            sessions.close()
            raise
        self.native_sessions = sessions

    def refused_by_native(self, why: str) -> None:
        """The native runtime refused a client itself: why ("fd", "tls", "max")."""
        self.metrics.connections_total.labels("refused").inc()
        if why == "fd":
            self._fd_refusals += 1
            self._warn_fd_refusals()

    def _warn_fd_refusals(self) -> None:
        now = time.monotonic()
        if self._fd_refusals and now - self._fd_warned_at >= _FD_WARNING_INTERVAL:
            self._fd_warned_at = now
            log.warning("out of file descriptors: %d client(s) refused with an ERROR frame "
                        "(raise the limit on open files or lower max-connections)",
                        self._fd_refusals)
            self._fd_refusals = 0

    def _stop_listening(self) -> None:
        if self.native_sessions is not None:
            self.native_sessions.close_listeners()

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
        from mqguard.reaper import ExpiryReaper

        # Through the registry, like every other front end: the core names no adapter module.
        adapter = open_adapter(self.upstream.url)
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

    def _start_dla_depth(self) -> None:
        """``mqguard_dla_depth`` / ``mqguard_dla_moved_total`` on /metrics
        (:mod:`mqguard.sidecar.dla_depth`); its thread stops with the reaper's event."""
        from mqguard.sidecar.dla_depth import DeadLetterDepth

        depth = DeadLetterDepth(self.guard, self.upstream.url)
        self.guard.plugins.register(depth)
        self.metrics.registry.register(depth)
        threading.Thread(target=depth.run, args=(self._reaper_stop,),
                         name="mqguard-sidecar-dla-depth", daemon=True).start()

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
        """One HTTP request on the admin port, bounded (mqguard.sidecar.admin), then close."""
        try:
            try:
                async with asyncio.timeout(5):
                    request = await read_request_line(reader)
            except RequestTooLarge as refused:
                log.debug("admin port: request refused (%s): %s", refused.status, refused)
                status, kind, body = refused.status, "text/plain", f"{refused}\n".encode()
            else:
                parts = request.split()
                path = parts[1] if len(parts) >= 2 else ""
                if len(parts) < 2 or parts[0] != "GET":
                    status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
                elif path == "/metrics":
                    status, kind = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                    if self.native_sessions is not None:
                        self.native_sessions.refresh_metrics()
                    body = self.metrics.render()
                elif path == "/health":
                    healthy, report = await self.health()
                    status = "200 OK" if healthy else "503 Service Unavailable"
                    kind, body = "application/json", json.dumps(report).encode() + b"\n"
                else:
                    status, kind, body = ("404 Not Found", "text/plain",
                                          b"try /metrics or /health\n")
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            async with asyncio.timeout(5):
                await writer.drain()
        except (TimeoutError, ConnectionError, OSError, UnicodeError,
                asyncio.IncompleteReadError):
            pass  # the client left or stalled: nothing to answer
        finally:
            await linger_and_close(reader, writer)

    @property
    def _upstream_probe(self) -> UpstreamProbe:
        # Made on first use: only a sidecar with an admin port asks.
        probe: UpstreamProbe | None = self.__dict__.get("_probe")
        if probe is None:
            probe = self.__dict__["_probe"] = UpstreamProbe(self.upstream)
        return probe

    async def health(self) -> tuple[bool, dict[str, object]]:
        """Serving, and the broker answers a STOMP CONNECT (mqguard.sidecar.admin).

        A broker that accepts TCP connections but does not answer (frozen, overloaded) is
        unhealthy: its clients' CONNECTs time out. The check is cached briefly, so the
        admin port cannot be used to flood the broker.
        """
        probe = await self._upstream_probe.check()
        healthy = probe.ok and not self._stopping
        reason = None
        if self._stopping:
            reason = "sidecar stopping"
        elif not probe.ok:
            reason = probe.detail
        return healthy, {"status": "ok" if healthy else "unavailable", "reason": reason,
                         "stopping": self._stopping, "upstream_reachable": probe.ok,
                         "upstream_answer": probe.detail,
                         "checked_ms_ago": round((time.monotonic() - probe.at) * 1000),
                         "connections": len(self.sessions), "upstream": self.upstream.where}


def _refusal(reason: str) -> bytes:
    return encode(Frame("ERROR", [("message", reason)]), "1.0")


class SidecarThread(LoopThread[Sidecar]):
    """A sidecar on an event loop of its own thread (tests, benchmarks, the demo)."""

    def __init__(self, sidecar: Sidecar, *, event_loop: str = "asyncio") -> None:
        super().__init__(sidecar, loop_factory(event_loop)(), "mqguard-sidecar")

    @property
    def admin_port(self) -> int:
        return self.sidecar.admin_port
