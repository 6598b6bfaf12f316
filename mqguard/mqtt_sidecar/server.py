"""The MQTT sidecar process: the native plane, the bridge to the guard, the admin port."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from urllib.parse import urlsplit

from mqguard.config import MqguardConfig
from mqguard.errors import ConfigError
from mqguard.mqtt_sidecar.admin import MqttProbe, serve_admin_request
from mqguard.mqtt_sidecar.bridge import MqttBridge
from mqguard.mqtt_sidecar.metrics import MqttMetrics
from mqguard.mqtt_sidecar.plane import PlaneDriver
from mqguard.pipeline import Guard
from mqguard.sidecar.dla_depth import DeadLetterDepth

__all__ = ["MqttSidecar", "parse_mqtt_upstream"]

log = logging.getLogger("mqguard.mqtt_sidecar")

_BROKERS = ("mqtt", "mosquitto", "rabbitmq", "activemq")


def parse_mqtt_upstream(url: str) -> tuple[str, int, str, bool]:
    """``mqtt[s]://HOST[:PORT][?broker=NAME]`` -> (host, port, broker name, TLS).

    ``mqtts://`` reaches the broker over TLS (port 8883 by default). The broker name goes
    to the plugins (MQTT has no server identification); the clients' credentials pass
    through and none are taken from the URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ConfigError(f"--upstream for MQTT must be mqtt://HOST:PORT or mqtts://HOST:PORT, "
                          f"got scheme {parts.scheme!r}")
    if parts.username or parts.password:
        raise ConfigError("--upstream takes no credentials: MQTT clients bring their own")
    if not parts.hostname:
        raise ConfigError("--upstream has no host")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise ConfigError(f"--upstream: {exc}") from None
    broker = "mqtt"
    for item in parts.query.split("&"):
        name, _, value = item.partition("=")
        if name == "broker" and value:
            if value not in _BROKERS:
                raise ConfigError(f"--upstream broker= must be one of {', '.join(_BROKERS)}")
            broker = value
    return parts.hostname, port, broker, tls


class MqttSidecar:
    """A running MQTT proxy (docs/sidecar-mqtt.md)."""

    def __init__(self, config: MqguardConfig, upstream: tuple[str, int], *,
                 listen: tuple[str, int] = ("127.0.0.1", 0),
                 admin: tuple[str, int] | None = None, broker: str = "mqtt",
                 guard: Guard | None = None, release_grace_ms: int = 5000,
                 tls_files: tuple[str, str] | None = None,
                 upstream_tls: tuple[str | None, bool] | None = None) -> None:
        """``tls_files``: PEM certificate (chain) and key files to serve clients over TLS;
        ``upstream_tls``: (CA file, insecure) to reach the broker over TLS."""
        self.config = config
        self.upstream = upstream
        self.listen_on = listen
        self.admin_on = admin
        self.broker = broker
        self.metrics = MqttMetrics()
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(config, role="sidecar")
        self.bridge = MqttBridge(self.guard, broker=broker, metrics=self.metrics)
        # mqguard_dla_depth / mqguard_dla_moved_total, from the guard's moves; never a
        # broker count on MQTT (mqguard.sidecar.dla_depth: only the dead-letter session
        # reads its topic), so no connection and no thread of its own.
        self.dla_depth = DeadLetterDepth(
            self.guard, f"mqtt{'s' if upstream_tls else ''}://{upstream[0]}:{upstream[1]}")
        self.metrics.registry.register(self.dla_depth)
        self.release_grace_ms = release_grace_ms
        self.tls_files = tls_files
        self.upstream_tls = upstream_tls
        self.driver: PlaneDriver | None = None
        self._admin: asyncio.Server | None = None
        self._probe = MqttProbe(*upstream)
        self._stopping = False
        self.port = 0
        self.admin_port = 0

    async def start(self) -> None:
        self.guard.start()
        self.guard.plugins.register(self.dla_depth)
        limits = self.config.core.sidecar
        self.driver = PlaneDriver(
            asyncio.get_running_loop(), self.bridge, upstream=self.upstream,
            max_packet_bytes=limits.max_frame_bytes, max_properties=limits.max_header_count,
            max_property_bytes=limits.max_header_line_bytes,
            release_grace_ms=self.release_grace_ms, max_connections=limits.max_connections,
            tls_files=self.tls_files, max_handshake_bytes=limits.max_handshake_frame_bytes,
            upstream_tls=self.upstream_tls)
        self.bridge.attach(self.driver.plane)
        self.port = self.driver.listen(*self.listen_on)
        if self.admin_on is not None:
            self._admin = await asyncio.start_server(
                functools.partial(serve_admin_request, metrics=self.metrics.render,
                                  health=self.health), *self.admin_on)
            self.admin_port = self._admin.sockets[0].getsockname()[1]
        log.info("MQTT sidecar listening on %s:%d%s, upstream mqtt%s://%s:%d%s",
                 self.listen_on[0], self.port, " (TLS)" if self.tls_files else "",
                 "s" if self.upstream_tls else "", *self.upstream,
                 f", admin on port {self.admin_port}" if self.admin_port else "")

    async def stop(self) -> None:
        """Stop accepting, end every connection, then release the guard."""
        if self._stopping:
            return
        self._stopping = True
        if self._admin is not None:
            self._admin.close()
        driver = self.driver
        if driver is not None:
            # Clients are told and let go; what they had in flight settles meanwhile
            # (bounded by drain-timeout-ms), the events still dispatched by the loop.
            driver.plane.close_listeners()
            driver.plane.shutdown_sessions()
            deadline = time.monotonic() + self.config.core.sidecar.drain_timeout_ms / 1000
            while driver.plane.connection_count() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            driver.close()
            # What the sessions reported last (settled sends, acks) reaches the guard.
            driver.dispatch()
            await asyncio.get_running_loop().run_in_executor(None, driver.plane.shutdown, 1000)
            driver.dispatch()
        self.bridge.close()
        if self.guard.plugins.is_registered(self.dla_depth):
            self.guard.plugins.unregister(self.dla_depth)
        if self._owns_guard:
            self.guard.close()

    async def health(self) -> tuple[bool, dict[str, object]]:
        probe = await self._probe.check()
        healthy = probe.ok and not self._stopping
        connections = self.driver.plane.connection_count() if self.driver else 0
        return healthy, {"status": "ok" if healthy else "unavailable",
                         "stopping": self._stopping, "upstream_reachable": probe.ok,
                         "upstream_answer": probe.detail, "connections": connections,
                         "upstream": f"mqtt://{self.upstream[0]}:{self.upstream[1]}"}
