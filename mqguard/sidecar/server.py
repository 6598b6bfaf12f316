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
import errno
import functools
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
from mqguard.sidecar.connection import FrameConnection
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.fdlimit import FDS_PER_SESSION, SpareDescriptor, descriptor_budget
from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    Frame,
    FrameDecoder,
    FrameLimits,
    broker_leg_limits,
    encode,
)
from mqguard.sidecar.gctune import GcTuning
from mqguard.sidecar.malloctune import fix_mmap_threshold
from mqguard.sidecar.metrics import Count, SidecarMetrics
from mqguard.sidecar.native_bridge import NativeSessionHandle, NativeSessions
from mqguard.sidecar.native_connection import NativeConnection, NativeTransport
from mqguard.sidecar.native_plane import DATA_PLANES, NativePlane
from mqguard.sidecar.session import ProxySession
from mqguard.stomp_brokers import DEFAULT_PORTS, address_of

log = logging.getLogger("mqguard.sidecar")

#: Addresses the reaper learns from traffic, at most (configured ones always count).
MAX_WATCHED_ADDRESSES = 10_000
#: Errors of accept() that mean the process (or system) is out of descriptors or memory.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
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
                 data_plane: str | None = None,
                 tls_files: tuple[str, str] | None = None) -> None:
        """``data_plane``: ``python`` or ``native`` (default: the ``data-plane`` setting);
        ``tls_files``: the certificate and key files of ``tls`` (the native plane serves
        TLS with rustls, which cannot use an ``ssl.SSLContext``)."""
        self.mqguard_config = config
        self.config: SidecarConfig = config.core.sidecar
        self.upstream = upstream
        self.listen_on = listen
        self.admin_on = admin
        self.tls = tls
        self.tls_files = tls_files
        self.data_plane = data_plane or config.core.sidecar.data_plane
        if self.data_plane not in DATA_PLANES:
            raise ConfigError(f"data-plane must be one of {', '.join(DATA_PLANES)}, "
                              f"got {self.data_plane!r}")
        if self.data_plane != "python" and tls is not None and tls_files is None:
            raise ConfigError(f"data-plane = {self.data_plane} serves TLS from the certificate "
                              "and key files (--tls-cert / --tls-key)")
        #: The tokio runtime of the native data plane, while it runs.
        self.native: NativePlane | None = None
        #: The runtime of the native-session data plane, while it runs.
        self.native_sessions: NativeSessions | None = None
        self.limits = FrameLimits(max_frame_bytes=self.config.max_frame_bytes,
                                  max_header_count=self.config.max_header_count,
                                  max_header_line_bytes=self.config.max_header_line_bytes)
        #: The broker leg admits every MESSAGE of a SEND the client leg admitted.
        self.broker_limits = broker_leg_limits(self.limits)
        self.metrics = SidecarMetrics()
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(config, role="sidecar")
        #: Client sessions open now, on whichever data plane serves them.
        self.sessions: set[ProxySession | NativeSessionHandle] = set()
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
        #: Sessions still waiting for their CONNECT, oldest first (see _accept).
        self._handshakes: dict[ProxySession, None] = {}
        self.max_handshakes = self._handshake_budget()
        self._listeners: list[socket.socket] = []
        self._accept_tasks: list[asyncio.Task[None]] = []
        #: Accepted sockets whose transport (and TLS handshake) is still being set up.
        self._setting_up = 0
        self._spare: SpareDescriptor | None = None
        self._fd_refusals = 0
        self._fd_warned_at = 0.0

    # -- start / stop --------------------------------------------------------------------

    def use_data_plane(self, data_plane: str) -> None:
        """Serve on ``data_plane`` (``python`` or ``native``); before :meth:`start`."""
        if data_plane not in DATA_PLANES:
            raise ConfigError(f"data-plane must be one of {', '.join(DATA_PLANES)}, "
                              f"got {data_plane!r}")
        if data_plane != "python" and self.tls is not None and self.tls_files is None:
            raise ConfigError(f"data-plane = {data_plane} serves TLS from the certificate "
                              "and key files (--tls-cert / --tls-key)")
        self.data_plane = data_plane

    async def start(self) -> None:
        self.guard.start()
        self._check_descriptors()
        host, port = self.listen_on
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        if self.data_plane == "native":
            self._start_native(loop, [str(info[4][0]) for info in infos], port)
        elif self.data_plane == "native-session":
            self._start_native_sessions(loop, [str(info[4][0]) for info in infos], port)
        else:
            self._listeners = _listen(infos, port)
            self.port = self._listeners[0].getsockname()[1]
            self._spare = SpareDescriptor()
            self._accept_tasks = [loop.create_task(self._accept_loop(sock))
                                  for sock in self._listeners]
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
        log.info("sidecar listening on %s:%d%s (%s data plane), upstream %s%s", host,
                 self.port, " (TLS)" if self.tls else "", self.data_plane, self.upstream.where,
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
        if self.native is not None:
            self.native.close()
            self.native = None
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

    def _start_native(self, loop: asyncio.AbstractEventLoop, hosts: list[str],
                      port: int) -> None:
        """Start the tokio runtime; it listens and accepts (see native_plane)."""
        plane = NativePlane(loop)
        try:
            plane.on_accept = self._accept_native
            plane.on_refused = self.refused_by_native
            if self.upstream.ssl_context is not None:
                plane.upstream_tls(self.upstream.cafile, self.upstream.insecure)
            self.port = plane.listen(
                list(dict.fromkeys(hosts)), port,
                refusal=_refusal("too many connections: the sidecar is out of file "
                                 "descriptors; try again later"),
                limits=self.limits,
                tls_files=self.tls_files if self.tls is not None else None,
                max_tls_handshakes=self.max_handshakes,
                handshake_timeout=self.config.connect_timeout_ms / 1000.0)
        except BaseException:
            plane.close()
            raise
        self.native = plane

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

    def _accept_native(self, transport: NativeTransport) -> None:
        assert self.native is not None
        self.native.client_transport(transport, self.client_connection(), self.tls)

    def refused_by_native(self, why: str) -> None:
        """The native runtime refused a client itself: why ("fd", "tls", "max")."""
        self.metrics.connections_total.labels("refused").inc()
        if why == "fd":
            self._fd_refusals += 1
            self._warn_fd_refusals()

    async def open_upstream(self, decoder: FrameDecoder, counter: Count) -> FrameConnection:
        """A connection to the broker on this sidecar's data plane, connected; OSError,
        TimeoutError or ssl.SSLError if it cannot be made."""
        upstream = self.upstream
        if self.native is not None:
            connection: FrameConnection = NativeConnection(decoder, counter)
            await self.native.connect(connection, upstream.host, upstream.port,
                                      tls=upstream.ssl_context is not None)
            return connection
        connection = FrameConnection(decoder, counter)
        await asyncio.get_running_loop().create_connection(
            lambda: connection, upstream.host, upstream.port, ssl=upstream.ssl_context,
            server_hostname=upstream.host if upstream.ssl_context else None)
        return connection

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accept clients one at a time, the others' reads served in between.

        Not ``loop.create_server``: when accept() fails for want of descriptors, asyncio
        logs a traceback and uvloop closes the client without a word; here the spare
        descriptor makes room to tell the client why (see _refuse_unaccepted). And one
        accept per loop turn: a server accepting its whole backlog at once under a flood
        of idle connections would evict a real client's handshake (see _accept) before
        reading the CONNECT that came with it.
        """
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._refuse_unaccepted(listener)
                    # Let sessions end and free descriptors before trying again.
                    await asyncio.sleep(0.01)
                # Otherwise a client that left before it was accepted (ECONNABORTED...).
                continue
            if self.tls is not None and self._setting_up >= self.max_handshakes:
                # TLS handshakes in progress count as pending handshakes; over the budget
                # there is no way to say why in plain text.
                self.metrics.connections_total.labels("refused").inc()
                sock.close()
                continue
            self._setting_up += 1
            if self.tls is None:
                await self._set_up(sock)  # the transport is made within a loop turn
                continue
            task = loop.create_task(self._set_up(sock))  # a TLS handshake takes round trips
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(0)

    async def _set_up(self, sock: socket.socket) -> None:
        """Make the accepted socket a client connection (its TLS handshake included)."""
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            timeout = self.config.connect_timeout_ms / 1000.0
            await asyncio.get_running_loop().connect_accepted_socket(
                self.client_connection, sock, ssl=self.tls,
                ssl_handshake_timeout=timeout if self.tls else None)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            # A TLS handshake that failed or timed out: nothing to tell in plain text.
            log.debug("client connection not set up: %s", type(exc).__name__)
            with contextlib.suppress(OSError):
                sock.close()
        except asyncio.CancelledError:  # the sidecar stops
            with contextlib.suppress(OSError):
                sock.close()
            raise
        except Exception:
            # A bug: the accept loop must go on serving the others.
            log.exception("setting up a client connection failed inside the sidecar")
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            self._setting_up -= 1

    def _refuse_unaccepted(self, listener: socket.socket) -> None:
        """Out of descriptors: free the spare one, accept, tell the client, close."""
        self.metrics.connections_total.labels("refused").inc()
        spare = self._spare
        if spare is None or not spare.release():
            return  # nothing to make room with; the client waits in the backlog
        try:
            sock, _ = listener.accept()
        except OSError:
            sock = None
        try:
            if sock is not None:
                self._fd_refusals += 1
                if self.tls is None:
                    with contextlib.suppress(OSError):
                        sock.setblocking(False)
                        sock.send(_refusal("too many connections: the sidecar is out of file "
                                           "descriptors; try again later"))
                with contextlib.suppress(OSError):
                    sock.close()
        finally:
            spare.take()
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
        if self.native is not None:
            self.native.close_listeners()
        if self.native_sessions is not None:
            self.native_sessions.close_listeners()
        for task in self._accept_tasks:
            task.cancel()
        self._accept_tasks = []
        for sock in self._listeners:
            with contextlib.suppress(OSError):
                sock.close()
        self._listeners = []
        if self._spare is not None:
            self._spare.close()
            self._spare = None

    def client_connection(self) -> FrameConnection:
        """The protocol of an accepted connection; its session starts once it is made."""
        # Client frames are always encoded again (see ProxySession._write_broker): no
        # need to keep their received octets.
        decoder = FrameDecoder(limits=self.limits, commands=CLIENT_COMMANDS, keep_wire=False)
        kind = NativeConnection if self.data_plane == "native" else FrameConnection
        return kind(
            decoder, self.metrics.bytes.labels("client"), on_made=self._accept,
            handshake_bytes=min(self.config.max_handshake_frame_bytes,
                                self.config.max_frame_bytes))

    def _accept(self, connection: FrameConnection) -> None:
        if self._stopping or len(self.sessions) >= self.max_sessions:
            if self._stopping:
                reason = "the sidecar is shutting down"
            elif self.max_sessions < self.config.max_connections:
                reason = (f"too many connections (the sidecar's limit on open files allows "
                          f"{self.max_sessions}; max-connections = "
                          f"{self.config.max_connections})")
            else:
                reason = f"too many connections (max-connections = {self.max_sessions})"
            self.metrics.connections_total.labels("refused").inc()
            connection.stop_reading()
            with contextlib.suppress(Exception):
                connection.write(_refusal(reason))
                assert connection.transport is not None
                connection.transport.close()  # after the ERROR is written
            return
        if len(self._handshakes) >= self.max_handshakes:
            # The oldest pending handshake makes room, not the newest: under a flood of
            # connections that never send CONNECT the budget is always full, and refusing
            # newcomers would refuse every real client too; a real client sends its CONNECT
            # at once, so it is never the oldest for long.
            oldest = next(iter(self._handshakes))
            del self._handshakes[oldest]
            # Counted under its outcome ("no-connect") once it has ended.
            oldest.evict(f"too many pending handshakes (max-pending-handshakes = "
                         f"{self.max_handshakes}): no CONNECT in time")
        session = ProxySession(self, connection)
        self.sessions.add(session)
        self._handshakes[session] = None
        # Its CONNECT arrived: no longer evictable, even before the session has read it.
        connection.on_first_frame = functools.partial(self.handshake_over, session)
        self.metrics.connections.inc()
        task = asyncio.get_running_loop().create_task(self._serve(session))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def handshake_over(self, session: ProxySession) -> None:
        """``session`` has its CONNECT (or ended without one): no longer a pending handshake."""
        self._handshakes.pop(session, None)

    async def _serve(self, session: ProxySession) -> None:
        try:
            outcome = await session.run()
            self.metrics.connections_total.labels(_outcome_label(outcome)).inc()
        finally:
            self.sessions.discard(session)
            self._handshakes.pop(session, None)
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


def _listen(infos: Sequence[tuple[Any, ...]], port: int) -> list[socket.socket]:
    """Listening, non-blocking sockets on every address ``getaddrinfo`` gave (as asyncio's
    create_server binds them); OSError if one cannot be bound."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # With port 0, every address gets the free port the first one got.
            sock.bind((address[0], port, *address[2:]))
            sock.listen(128)
            sock.setblocking(False)
            port = sock.getsockname()[1]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _outcome_label(outcome: str) -> str:
    # Bounded label values: broker error texts must not become label values.
    known = {"disconnect", "client-closed", "client-lost", "protocol-error", "shutdown",
             "broker-closed", "broker-error", "no-connect", "broker-refused", "client-error"}
    return outcome if outcome in known else "other"


#: The environment variable that picks the data plane of every :class:`SidecarThread`
#: not given one (so that a test suite runs against either plane).
DATA_PLANE_ENV = "MQGUARD_DATA_PLANE"


class SidecarThread(LoopThread[Sidecar]):
    """A sidecar on an event loop of its own thread (tests, benchmarks, the demo)."""

    def __init__(self, sidecar: Sidecar, *, event_loop: str = "asyncio",
                 data_plane: str | None = None) -> None:
        """``data_plane``: ``python`` or ``native`` instead of the sidecar's own; when
        None, the environment variable :data:`DATA_PLANE_ENV` if set."""
        data_plane = data_plane or os.environ.get(DATA_PLANE_ENV) or None
        if data_plane is not None:
            sidecar.use_data_plane(data_plane)
        super().__init__(sidecar, loop_factory(event_loop)(), "mqguard-sidecar")

    @property
    def admin_port(self) -> int:
        return self.sidecar.admin_port
