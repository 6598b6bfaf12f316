"""The MQTT sidecar's admin port: ``/metrics`` and ``/health``, bounded as the STOMP one.

``/health`` fails when clients would: it performs an MQTT 3.1.1 handshake with the broker
(CONNECT, CONNACK, DISCONNECT; every MQTT broker speaks 3.1.1) with a short timeout. Any
CONNACK counts as alive (a refusal of the probe's anonymous login still shows a broker
that answers; clients bring their own credentials). The result is cached briefly and
concurrent requests share one probe, so the port cannot be used to flood the broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mqguard.sidecar.admin import RequestTooLarge, linger_and_close, read_request_line

__all__ = ["MqttProbe", "ProbeResult", "serve_admin_request"]

log = logging.getLogger("mqguard.mqtt_sidecar")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    detail: str
    at: float


def _connect_packet() -> bytes:
    client_id = f"mqguard-health-{os.getpid()}".encode()
    body = (b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id)
    return bytes([0x10, len(body)]) + body


class MqttProbe:
    """The broker's answer to an MQTT handshake, cached for ``ttl`` seconds."""

    def __init__(self, host: str, port: int, *, timeout: float = 2.0, ttl: float = 1.0) -> None:
        self.host, self.port = host, port
        self.timeout, self.ttl = timeout, ttl
        self._last: ProbeResult | None = None
        self._running: asyncio.Task[ProbeResult] | None = None

    async def check(self) -> ProbeResult:
        last = self._last
        if last is not None and time.monotonic() - last.at < self.ttl:
            return last
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_task(self._probe())
        result = await asyncio.shield(self._running)
        self._last = result
        return result

    async def _probe(self) -> ProbeResult:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(_connect_packet())
                answer = await reader.readexactly(4)
                if answer[0] != 0x20:
                    return ProbeResult(False, f"not an MQTT answer (0x{answer[0]:02x})",
                                       time.monotonic())
                writer.write(b"\xe0\x00")
                return ProbeResult(True, f"CONNACK return code {answer[3]}", time.monotonic())
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            return ProbeResult(False, f"{type(exc).__name__}: {exc}", time.monotonic())
        finally:
            if writer is not None:
                writer.close()


async def serve_admin_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                              metrics: Callable[[], bytes],
                              health: Callable[[], Awaitable[tuple[bool, dict[str, object]]]]
                              ) -> None:
    """One HTTP request on the admin port, bounded (mqguard.sidecar.admin), then close."""
    try:
        try:
            async with asyncio.timeout(5):
                request = await read_request_line(reader)
        except RequestTooLarge as refused:
            status, kind, body = refused.status, "text/plain", f"{refused}\n".encode()
        else:
            parts = request.split()
            path = parts[1] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] != "GET":
                status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, kind = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                body = metrics()
            elif path == "/health":
                healthy, report = await health()
                status = "200 OK" if healthy else "503 Service Unavailable"
                kind, body = "application/json", json.dumps(report).encode() + b"\n"
            else:
                status, kind, body = "404 Not Found", "text/plain", b"try /metrics or /health\n"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: "
                     f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        async with asyncio.timeout(5):
            await writer.drain()
    except (TimeoutError, ConnectionError, OSError, UnicodeError, asyncio.IncompleteReadError):
        pass  # the client left or stalled: nothing to answer
    finally:
        await linger_and_close(reader, writer)
