"""The sidecar's Prometheus metrics (served on the admin port at ``/metrics``).

One registry per sidecar, so that several sidecars in one process (tests) do not
share counters. Names follow Prometheus conventions: ``_total`` counters, base
units (seconds, bytes).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# ``*_created`` series double the output and tell an operator nothing here.
disable_created_metrics()

#: Buckets for the time the guard spends on one frame (seconds): 10 us .. 0.5 s.
_GUARD_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.5)


class SidecarMetrics:
    """Counters, gauges and histograms of one sidecar."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.connections = Gauge(
            "mqguard_sidecar_open_connections", "Client connections open now.",
            registry=self.registry)
        self.connections_total = Counter(
            "mqguard_sidecar_connections_total",
            "Client connections accepted, by how they ended.", ["outcome"],
            registry=self.registry)
        self.frames = Counter(
            "mqguard_sidecar_frames_total", "Frames relayed or answered, by direction and "
            "command.", ["direction", "command"], registry=self.registry)
        self.bytes = Counter(
            "mqguard_sidecar_bytes_total", "Bytes read, by direction.", ["direction"],
            registry=self.registry)
        self.messages = Counter(
            "mqguard_sidecar_messages_total", "Messages by path (send, deliver) and the guard's "
            "verdict (continue, reject, drop, move, redeliver, ...).", ["path", "verdict"],
            registry=self.registry)
        self.protocol_errors = Counter(
            "mqguard_sidecar_protocol_errors_total", "Connections ended by a malformed or "
            "over-limit frame, by side.", ["side"], registry=self.registry)
        self.guard_seconds = Histogram(
            "mqguard_sidecar_guard_seconds", "Time the guard spent deciding on one frame.",
            ["path"], buckets=_GUARD_BUCKETS, registry=self.registry)
        self.upstream_failures = Counter(
            "mqguard_sidecar_upstream_failures_total", "Broker connections that failed or "
            "were lost.", ["phase"], registry=self.registry)
        # Children resolved once: label lookups cost more than the increments.
        self.frames_in: dict[str, dict[str, Any]] = {"client": {}, "broker": {}}
        self._verdicts: dict[tuple[str, str], Any] = {}
        self.send_guard = self.guard_seconds.labels("send")
        self.deliver_guard = self.guard_seconds.labels("deliver")

    def frame(self, direction: str, command: str) -> None:
        cache = self.frames_in.setdefault(direction, {})
        child = cache.get(command)
        if child is None:
            child = cache[command] = self.frames.labels(direction, command)
        child.inc()

    def message(self, path: str, verdict: str) -> None:
        """Count one message on ``path`` (send, deliver) with the guard's verdict."""
        child = self._verdicts.get((path, verdict))
        if child is None:
            child = self._verdicts[path, verdict] = self.messages.labels(path, verdict)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
