"""The sidecar's Prometheus metrics (served on the admin port at ``/metrics``).

One registry per sidecar, so that several sidecars in one process (tests) do not
share counters. Names follow Prometheus conventions: ``_total`` counters, base
units (seconds, bytes).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# ``*_created`` series double the output and tell an operator nothing here.
disable_created_metrics()

#: Buckets for the time the guard spends on one frame (seconds): 10 us .. 0.5 s.
_GUARD_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.5)


class Count:
    """One labelled series of a :class:`_Tally`: a plain number, bumped on the loop thread."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Tally:
    """A counter with labels, kept as plain numbers and turned into Prometheus samples only
    when ``/metrics`` is scraped.

    The per-frame counters are bumped several times per relayed message; a
    ``prometheus_client`` child takes a lock and checks its state on every increment,
    which cost more than the rest of the bookkeeping. Every bump happens on one thread
    (the native runtime's, inside the guard's batch calls) or is a plain assignment of a
    count the runtime kept (at a scrape), so no lock is needed; a scrape reads them under
    the GIL.
    """

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], Count] = {}

    def labels(self, *values: str) -> Count:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
            child = self._children[values] = Count()
        return child

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        return family


class FrameCounts(dict[str, Count]):
    """The ``frames_total`` series of one direction, by command: ``counts[command].value += 1``
    is one dict lookup and no call (a frame counter is bumped once per relayed frame)."""

    def __init__(self, tally: _Tally, direction: str) -> None:
        super().__init__()
        self._tally = tally
        self._direction = direction

    def __missing__(self, command: str) -> Count:
        child = self[command] = self._tally.labels(self._direction, command)
        return child


class _Timing:
    """One labelled series of a :class:`_Histogram` (see there)."""

    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bucket (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value

    def observe_many(self, value: float, count: int) -> None:
        """``count`` observations of ``value`` (each frame's share of a batch's time)."""
        self.counts[bisect_left(self.buckets, value)] += count
        self.total += value * count


class _Histogram:
    """A histogram with labels kept as plain numbers, like :class:`_Tally` (one observation
    per guarded message); ``le`` buckets are inclusive, as Prometheus defines them."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...],
                 buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.buckets = tuple(sorted(buckets))
        self._children: dict[tuple[str, ...], _Timing] = {}

    def labels(self, *values: str) -> _Timing:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
            child = self._children[values] = _Timing(self.buckets)
        return child

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*self.buckets, math.inf), child.counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(values), buckets, child.total)
        return family


class _HotMetrics(Collector):
    """Hands the plain-number metrics to the registry at scrape time."""

    def __init__(self, *metrics: _Tally | _Histogram) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            yield metric.family()


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
        # Bumped per frame / message: plain numbers (see _Tally), loop thread only.
        self.frames = _Tally(
            "mqguard_sidecar_frames_total", "Frames relayed or answered, by direction and "
            "command.", ("direction", "command"))
        self.bytes = _Tally(
            "mqguard_sidecar_bytes_total", "Bytes read, by direction.", ("direction",))
        self.messages = _Tally(
            "mqguard_sidecar_messages_total", "Messages by path (send, deliver) and the guard's "
            "verdict (continue, reject, drop, move, redeliver, ...).", ("path", "verdict"))
        self.guard_seconds = _Histogram(
            "mqguard_sidecar_guard_seconds", "Time the guard spent deciding on one frame.",
            ("path",), _GUARD_BUCKETS)
        self.registry.register(_HotMetrics(self.frames, self.bytes, self.messages,
                                           self.guard_seconds))
        self.protocol_errors = Counter(
            "mqguard_sidecar_protocol_errors_total", "Connections ended by a malformed or "
            "over-limit frame, by side.", ["side"], registry=self.registry)
        self.upstream_failures = Counter(
            "mqguard_sidecar_upstream_failures_total", "Broker connections that failed or "
            "were lost.", ["phase"], registry=self.registry)
        # Children resolved once: label lookups cost more than the increments.
        self.frames_in: dict[str, FrameCounts] = {
            direction: FrameCounts(self.frames, direction) for direction in ("client", "broker")}
        self._verdicts: dict[tuple[str, str], Count] = {}
        self.send_guard = self.guard_seconds.labels("send")
        self.deliver_guard = self.guard_seconds.labels("deliver")

    def frame(self, direction: str, command: str) -> None:
        self.frame_counts(direction)[command].value += 1

    def frame_counts(self, direction: str) -> FrameCounts:
        """The per-command frame counters of ``direction`` (client, broker)."""
        counts = self.frames_in.get(direction)
        if counts is None:
            counts = self.frames_in[direction] = FrameCounts(self.frames, direction)
        return counts

    def message(self, path: str, verdict: str) -> None:
        """Count one message on ``path`` (send, deliver) with the guard's verdict."""
        child = self._verdicts.get((path, verdict))
        if child is None:
            child = self._verdicts[path, verdict] = self.messages.labels(path, verdict)
        child.value += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)
