"""The MQTT plane's Python side: the extension's runtime and the dispatch of its events.

``mqguard_native.MqttPlane`` owns the listening socket and every connection's two legs
on its tokio runtime. It makes one descriptor readable when events are pending; the
asyncio loop then takes them all in one ``drain()`` call and hands each to the
:class:`PlaneHandler` (the bridge), in order, on the loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

from mqguard.mqtt_sidecar.messages import MqttMessage

if TYPE_CHECKING:
    from mqguard_native import MqttPlane

__all__ = ["PlaneDriver", "PlaneHandler", "PlaneLimits"]

log = logging.getLogger("mqguard.mqtt_sidecar")

# Event kinds of MqttPlane.drain() (native/src/mqtt_proxy/plane.rs).
_OPENED, _SENDS, _DELIVERIES, _SETTLED, _ACKED, _PUBLISHED, _GONE, _CLOSED, _PROTOCOL = range(9)

#: Reason code the plane reports for an exchange its connection ended before.
LOST: Final = 0xFF


class PlaneLimits(Protocol):
    max_packet_bytes: int
    max_properties: int
    max_property_bytes: int


class PlaneHandler(Protocol):
    """What the plane's events become (all called on the loop's thread)."""

    def opened(self, conn: int, client_id: str, level: int, clean: bool, peer: str) -> None: ...

    def sends(self, conn: int, batch: int, messages: list[MqttMessage]) -> None: ...

    def deliveries(self, conn: int, batch: int, messages: list[MqttMessage]) -> None: ...

    def settled(self, conn: int, outcomes: list[tuple[int, int]]) -> None: ...

    def acked(self, conn: int, packet_ids: list[int]) -> None: ...

    def published(self, token: int, reason: int) -> None: ...

    def gone(self, conn: int, graceful: bool) -> None: ...

    def closed(self, conn: int, reason: str) -> None: ...

    def protocol_error(self, conn: int, side: str, kind: str, detail: str) -> None: ...


class PlaneDriver:
    """One MQTT sidecar's native runtime, watched by the asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handler: PlaneHandler, *,
                 upstream: tuple[str, int], max_packet_bytes: int, max_properties: int,
                 max_property_bytes: int, worker_threads: int = 1,
                 release_grace_ms: int = 5000, max_connections: int = 1024,
                 tls_files: tuple[str, str] | None = None,
                 max_handshake_bytes: int = 65536,
                 upstream_tls: tuple[str | None, bool] | None = None) -> None:
        """``upstream_tls``: reach the broker over TLS, checking its certificate against
        the CA file given (or not at all when the flag, insecure, is set)."""
        from mqguard_native import MqttPlane

        self._loop = loop
        self._handler = handler
        self.plane: MqttPlane = MqttPlane(
            upstream[0], upstream[1], max_packet_bytes=max_packet_bytes,
            max_properties=max_properties, max_property_bytes=max_property_bytes,
            worker_threads=worker_threads, release_grace_ms=release_grace_ms,
            max_connections=max_connections,
            tls_cert=tls_files[0] if tls_files else None,
            tls_key=tls_files[1] if tls_files else None,
            max_handshake_bytes=max_handshake_bytes, upstream_tls=upstream_tls is not None,
            upstream_ca=upstream_tls[0] if upstream_tls else None,
            upstream_insecure=upstream_tls[1] if upstream_tls else False)
        self._fd = self.plane.wake_fd()
        loop.add_reader(self._fd, self.dispatch)
        self._closed = False

    def listen(self, host: str, port: int) -> int:
        return self.plane.listen(host, port)

    def dispatch(self) -> None:
        """Take every pending event and hand it on (the loop's reader callback)."""
        handler = self._handler
        for kind, conn, a, b in self.plane.drain():
            try:
                self._one(handler, kind, conn, a, b)
            except Exception:
                # One event's failure must not strand the others, nor its session, which
                # waits for the batch's verdicts: sends are refused, deliveries withheld
                # (left unacknowledged; the broker redelivers them). A batch answered
                # already ignores this second answer.
                log.exception("MQTT plane event %d on connection %d failed", kind, conn)
                if kind == _SENDS:
                    self.plane.verdicts(a, [])
                elif kind == _DELIVERIES:
                    self.plane.verdicts(a, [(1, 0, None, None, [], None)] * len(b))

    @staticmethod
    def _one(handler: PlaneHandler, kind: int, conn: int, a: Any, b: Any) -> None:
        if kind == _SENDS:
            handler.sends(conn, a, [MqttMessage.from_tuple(item) for item in b])
        elif kind == _DELIVERIES:
            handler.deliveries(conn, a, [MqttMessage.from_tuple(item) for item in b])
        elif kind == _SETTLED:
            handler.settled(conn, a)
        elif kind == _ACKED:
            handler.acked(conn, a)
        elif kind == _OPENED:
            client_id, level, clean = a
            handler.opened(conn, client_id, level, clean, b)
        elif kind == _PUBLISHED:
            handler.published(a, b)
        elif kind == _GONE:
            handler.gone(conn, a)
        elif kind == _CLOSED:
            handler.closed(conn, a)
        elif kind == _PROTOCOL:
            side, what = a
            handler.protocol_error(conn, side, what, b)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self.plane.close_listeners()

    def shutdown(self) -> None:
        self.close()
        self.plane.shutdown(1000)
