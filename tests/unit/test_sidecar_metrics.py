"""The sidecar's per-frame metrics: plain numbers, Prometheus samples at scrape time."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqguard.sidecar.metrics import SidecarMetrics


def samples(metrics: SidecarMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_counters_render_as_prometheus_counters() -> None:
    metrics = SidecarMetrics()
    for _ in range(3):
        metrics.frame("client", "SEND")
    metrics.frame("broker", "RECEIPT")
    metrics.message("send", "continue")
    metrics.message("send", "continue")
    metrics.message("deliver", "taken")
    metrics.bytes.labels("client").inc(120)
    got = samples(metrics)
    assert got["mqguard_sidecar_frames_total",
               (("command", "SEND"), ("direction", "client"))] == 3
    assert got["mqguard_sidecar_frames_total",
               (("command", "RECEIPT"), ("direction", "broker"))] == 1
    assert got["mqguard_sidecar_messages_total",
               (("path", "send"), ("verdict", "continue"))] == 2
    assert got["mqguard_sidecar_messages_total",
               (("path", "deliver"), ("verdict", "taken"))] == 1
    assert got["mqguard_sidecar_bytes_total", (("direction", "client"),)] == 120


def test_histogram_buckets_are_inclusive_and_cumulative() -> None:
    metrics = SidecarMetrics()
    for seconds in (1e-5, 2e-5, 0.3, 7.0):  # on a bound, inside, near the top, above all
        metrics.send_guard.observe(seconds)
    got = samples(metrics)

    def bucket(le: str) -> float:
        return got["mqguard_sidecar_guard_seconds_bucket", (("le", le), ("path", "send"))]

    assert bucket("1e-05") == 1  # le is "less than or equal"
    assert bucket("2.5e-05") == 2
    assert bucket("0.05") == 2
    assert bucket("0.5") == 3
    assert bucket("+Inf") == 4
    assert got["mqguard_sidecar_guard_seconds_count", (("path", "send"),)] == 4
    assert abs(got["mqguard_sidecar_guard_seconds_sum", (("path", "send"),)] - 7.30003) < 1e-9
    assert got["mqguard_sidecar_guard_seconds_count", (("path", "deliver"),)] == 0


def test_wrong_label_count_is_refused() -> None:
    metrics = SidecarMetrics()
    with pytest.raises(ValueError, match="direction"):
        metrics.frames.labels("client")
    with pytest.raises(ValueError, match="path"):
        metrics.guard_seconds.labels()
