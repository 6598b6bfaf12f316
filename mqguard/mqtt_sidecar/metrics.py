"""The MQTT sidecar's Prometheus metrics (``/metrics`` on the admin port).

Plain numbers bumped on the loop thread and turned into samples when scraped, one
registry per sidecar (several sidecars in one process do not share counters).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["MqttMetrics"]


class MqttMetrics(Collector):
    """Connections, messages by path and verdict, protocol errors."""

    def __init__(self) -> None:
        self.connections = 0
        self.connections_total: dict[str, float] = {}
        self.messages: dict[tuple[str, str], float] = {}
        self.protocol_errors: dict[tuple[str, str], float] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def connection(self, outcome: str) -> None:
        self.connections_total[outcome] = self.connections_total.get(outcome, 0) + 1

    def message(self, path: str, verdict: str, count: int = 1) -> None:
        key = (path, verdict)
        self.messages[key] = self.messages.get(key, 0) + count

    def protocol_error(self, side: str, kind: str) -> None:
        key = (side, kind)
        self.protocol_errors[key] = self.protocol_errors.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("mqguard_mqtt_sidecar_connections",
                                  "Client connections open now.")
        gauge.add_metric([], self.connections)
        yield gauge
        total = CounterMetricFamily("mqguard_mqtt_sidecar_connections",
                                    "Client connections ended, by outcome.", labels=["outcome"])
        for outcome, value in sorted(self.connections_total.items()):
            total.add_metric([outcome], value)
        yield total
        messages = CounterMetricFamily("mqguard_mqtt_sidecar_messages",
                                       "PUBLISHes by path (send, deliver) and verdict.",
                                       labels=["path", "verdict"])
        for (path, verdict), value in sorted(self.messages.items()):
            messages.add_metric([path, verdict], value)
        yield messages
        errors = CounterMetricFamily("mqguard_mqtt_sidecar_protocol_errors",
                                     "Packets the codec refused, by side and kind.",
                                     labels=["side", "kind"])
        for (side, kind), value in sorted(self.protocol_errors.items()):
            errors.add_metric([side, kind], value)
        yield errors

    def render(self) -> bytes:
        return generate_latest(self.registry)
