"""A fault-injection TCP proxy: the demo's failover, and failover tests against real brokers.

Delivery guarantees only matter when something breaks, and a real broker on
127.0.0.1 never breaks on its own. :class:`FaultProxy` sits between a client
(stomp.py, paho-mqtt) and the broker so a test can break the link on cue:

* :meth:`FaultProxy.cut` resets a consumer's connection while it holds
  handled-but-unacked messages, so the broker must redeliver them to the
  reconnected (or another) consumer -- the case duplicate detection and
  delivery counting exist for.
* :meth:`FaultProxy.blackhole` with ``"upstream"`` makes client frames (ACKs,
  PUBACKs) vanish while the TCP connection stays up, so handled messages stay
  unacked on the broker; ``"downstream"`` starves the client instead.
* :meth:`FaultProxy.refuse` makes the "broker" look down to new connections,
  so reconnect loops can be tested without stopping the real server.

It is plain ``socket`` + ``threading``: one accept thread and two pump threads
per connection, all daemons. Every socket is closed by the thread that owns it
(the fault controls only shut sockets down to wake their threads), so a file
descriptor is never reused under a thread still blocked on it.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Direction", "FaultProxy"]

log = logging.getLogger(__name__)

Direction = Literal["upstream", "downstream", "both"]

_BUFFER = 64 * 1024
# Bounds every wait: stop() must never hang a test session.
_CONNECT_TIMEOUT = 2.0
_STOP_TIMEOUT = 2.0
# SO_LINGER on, 0 s: close() sends RST instead of FIN -- an abrupt failure, not a goodbye.
_LINGER_RESET = struct.pack("ii", 1, 0)


def _reset_close(sock: socket.socket) -> None:
    """Close ``sock`` with an RST; never raises."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with suppress(OSError):
        sock.close()


class _Link:
    """One client connection and, once connected, its upstream socket."""

    def __init__(self, client: socket.socket, peer: object) -> None:
        self.client = client
        self.peer = peer
        self.upstream: socket.socket | None = None
        self.established = False
        self.aborted = False
        self.pumps_left = 2

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class FaultProxy:
    """TCP proxy from a local listening port to ``upstream_host:upstream_port``.

    Counters and fault controls are thread-safe and apply at once to live and new
    connections. Usable as a context manager (``with FaultProxy(h, p).start() as
    proxy`` or ``with FaultProxy(h, p) as proxy``, which starts it).
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._listen_address = (listen_host, listen_port)
        self._cond = threading.Condition(threading.Lock())
        self._links: set[_Link] = set()
        # Every connection thread, not just those of live links: a thread that has
        # dropped its link is still closing sockets, and stop() must wait for it too.
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._bound: tuple[str, int] | None = None
        self._started = False
        self._stopping = False
        self._drop_upstream = False
        self._drop_downstream = False
        self._refusing = False
        self._accepted = 0
        self._refused = 0
        self._discarded_upstream = 0
        self._discarded_downstream = 0

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Bind (a free port when ``listen_port`` is 0) and serve in daemon threads."""
        with self._cond:
            if self._started:
                raise RuntimeError("FaultProxy already started (it cannot be restarted)")
            self._started = True
        host, port = self._listen_address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=64)
        # Non-blocking: a client that resets between select() and accept() must not
        # block the accept thread where stop() cannot wake it.
        listener.setblocking(False)
        self._listener = listener
        self._bound = listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"faultproxy-accept-{self.port}", daemon=True
        )
        self._accept_thread.start()
        log.debug(
            "fault proxy %s:%d -> %s:%d", *self._bound, self.upstream_host, self.upstream_port
        )
        return self

    def stop(self) -> None:
        """Close the listener and every connection; joins threads for at most ~2 s."""
        with self._cond:
            if not self._started or self._stopping:
                return
            self._stopping = True
            for link in self._links:
                self._abort(link)
            self._cond.notify_all()
        if self._wake_w is not None:
            with suppress(OSError):
                self._wake_w.send(b"x")
        deadline = time.monotonic() + _STOP_TIMEOUT
        if self._accept_thread is not None:
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            # The accept thread is done (or hopeless), so no links or threads are added now.
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            leftovers = list(self._links)
            self._links.clear()
            self._cond.notify_all()
        for link in leftovers:  # only threads stuck past the deadline leave links behind
            log.debug("fault proxy: forcing close of %s", link.peer)
            for sock in link.sockets():
                _reset_close(sock)
        for own in (self._listener, self._wake_r, self._wake_w):
            if own is not None:
                with suppress(OSError):
                    own.close()

    def __enter__(self) -> FaultProxy:
        return self if self._started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ------------------------------------------------------------

    @property
    def host(self) -> str:
        """The host the proxy listens on (as bound)."""
        return self._address()[0]

    @property
    def port(self) -> int:
        """The port the proxy listens on (the real one when 0 was asked for)."""
        return self._address()[1]

    def url_for(self, scheme: str) -> str:
        """``scheme://host:port`` of the proxy, e.g. ``stomp://127.0.0.1:40123``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def through(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's (scheme, credentials and
        path kept): the URL a client uses to reach the same server through the proxy."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = f"{host}:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))

    def _address(self) -> tuple[str, int]:
        if self._bound is None:
            raise RuntimeError("FaultProxy is not started")
        return self._bound

    # -- fault controls -------------------------------------------------------

    def cut(self) -> int:
        """Reset every live connection (both sides); returns how many were cut.

        The listener stays open, so clients can reconnect at once. A client sees
        EOF or ``ConnectionResetError``, the broker sees the connection drop.
        """
        with self._cond:
            cut = sum(self._abort(link) for link in list(self._links))
            self._cond.notify_all()
        log.debug("fault proxy: cut %d connection(s)", cut)
        return cut

    def blackhole(self, direction: Direction) -> None:
        """Read and discard bytes going ``"upstream"``, ``"downstream"`` or ``"both"`` ways.

        Connections stay up; only the bytes vanish (see ``discarded_*``).
        """
        if direction not in ("upstream", "downstream", "both"):
            raise ValueError(f"direction must be upstream, downstream or both, not {direction!r}")
        with self._cond:
            self._drop_upstream = self._drop_upstream or direction in ("upstream", "both")
            self._drop_downstream = self._drop_downstream or direction in ("downstream", "both")

    def restore(self) -> None:
        """Stop discarding traffic in both directions (bytes already discarded stay lost)."""
        with self._cond:
            self._drop_upstream = self._drop_downstream = False

    def refuse(self, flag: bool) -> None:
        """While True, new clients are accepted and reset at once; live ones are untouched."""
        with self._cond:
            self._refusing = flag

    # -- observation ----------------------------------------------------------

    @property
    def connections(self) -> int:
        """Live proxied connections (client and upstream both connected, not cut)."""
        with self._cond:
            return self._live()

    @property
    def accepted(self) -> int:
        """Client connections ever accepted, refused ones included."""
        with self._cond:
            return self._accepted

    @property
    def refused(self) -> int:
        """Client connections closed at once because of :meth:`refuse`."""
        with self._cond:
            return self._refused

    @property
    def discarded_upstream(self) -> int:
        """Client-to-broker bytes swallowed by :meth:`blackhole`."""
        with self._cond:
            return self._discarded_upstream

    @property
    def discarded_downstream(self) -> int:
        """Broker-to-client bytes swallowed by :meth:`blackhole`."""
        with self._cond:
            return self._discarded_downstream

    def wait_for_connections(self, n: int, timeout: float) -> bool:
        """Wait until at least ``n`` connections are live; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._live() >= n, timeout)

    def _live(self) -> int:
        return sum(1 for link in self._links if link.established and not link.aborted)

    # -- internals (threads) --------------------------------------------------

    def _abort(self, link: _Link) -> bool:
        """Mark ``link`` aborted and wake its threads; caller holds the lock.

        Only shuts the sockets down: the link's own threads close them (with an
        RST, as SO_LINGER is set here) once they have stopped using them.
        """
        if link.aborted:
            return False
        link.aborted = True
        for sock in link.sockets():
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return True

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_r is not None
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self._listener, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in selector.select():
                        if key.fileobj is self._listener and not self._stopping:
                            self._accept_one()
        except Exception:
            log.debug("fault proxy accept loop failed", exc_info=True)

    def _accept_one(self) -> None:
        assert self._listener is not None
        try:
            client, peer = self._listener.accept()
        except BlockingIOError:
            return
        except OSError:
            # EMFILE and friends leave the listener readable: pause, do not spin.
            log.debug("fault proxy accept failed", exc_info=True)
            time.sleep(0.05)
            return
        with self._cond:
            self._accepted += 1
            if self._refusing or self._stopping:
                self._refused += 1
                _reset_close(client)
                log.debug("fault proxy: refused %s", peer)
                return
            client.setblocking(True)
            with suppress(OSError):
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, peer)
            self._links.add(link)
            self._spawn(self._serve, (link,), f"faultproxy-up-{peer}")

    def _spawn(self, target: Callable[..., None], args: tuple[object, ...], name: str) -> None:
        """Start a daemon thread and remember it for stop(); caller holds the lock.

        Started under the lock so stop() never sees a thread it cannot join.
        """
        self._threads = [t for t in self._threads if t.is_alive()]  # bound the list
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve(self, link: _Link) -> None:
        """Connect upstream, then pump client->broker here and broker->client in a new thread."""
        try:
            upstream = socket.create_connection(
                (self.upstream_host, self.upstream_port), timeout=_CONNECT_TIMEOUT
            )
            upstream.settimeout(None)
            with suppress(OSError):
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            log.debug("fault proxy: upstream connect failed for %s: %s", link.peer, exc)
            with self._cond:
                self._links.discard(link)
                self._cond.notify_all()
            _reset_close(link.client)
            return
        with self._cond:
            if link.aborted:  # cut or stopped while connecting
                self._links.discard(link)
                self._cond.notify_all()
                abandon = True
            else:
                abandon = False
                link.upstream = upstream
                link.established = True
                self._spawn(
                    self._pump,
                    (link, upstream, link.client, "downstream"),
                    f"faultproxy-down-{link.peer}",
                )
                self._cond.notify_all()
        if abandon:
            _reset_close(upstream)
            _reset_close(link.client)
            return
        self._pump(link, link.client, upstream, "upstream")

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, direction: str) -> None:
        """Copy ``src`` to ``dst`` until EOF or error; never raises."""
        try:
            while True:
                data = src.recv(_BUFFER)
                if not data:
                    break
                if self._discard(direction, len(data)):
                    continue
                dst.sendall(data)
            # Clean EOF: pass the half-close on and let the other direction finish.
            with suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
        except Exception as exc:
            log.debug("fault proxy %s pump for %s ended: %r", direction, link.peer, exc)
            with self._cond:
                self._abort(link)
                self._cond.notify_all()
        finally:
            self._pump_done(link)

    def _discard(self, direction: str, size: int) -> bool:
        with self._cond:
            if direction == "upstream" and self._drop_upstream:
                self._discarded_upstream += size
                return True
            if direction == "downstream" and self._drop_downstream:
                self._discarded_downstream += size
                return True
            return False

    def _pump_done(self, link: _Link) -> None:
        with self._cond:
            link.pumps_left -= 1
            if link.pumps_left > 0:
                return
            self._links.discard(link)
            self._cond.notify_all()
        for sock in link.sockets():
            with suppress(OSError):
                sock.close()
