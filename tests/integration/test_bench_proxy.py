"""``mqguard bench proxy`` against the session's REAL brokers, small: the figures it reports
exist, are positive and agree with each other (ratios and added latencies are computed from
the figures next to them)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqguard.bench.proxy import percentile, running_sidecar, stomp_latency
from mqguard.cli.bench_proxy import proxy
from mqguard.servers import ServerHandle

FIGURES = ("direct_send_per_s", "proxy_send_per_s", "direct_consume_per_s",
           "proxy_consume_per_s", "direct_p50_ms", "direct_p99_ms", "proxy_p50_ms",
           "proxy_p99_ms")


def run_bench(args: list[str], json_path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(proxy, [*args, "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(json_path.read_text())
    return report


@pytest.mark.activemq
def test_bench_proxy_figures_are_consistent(mqguard_activemq_server: ServerHandle,
                                            tmp_path: Path) -> None:
    report = run_bench(["--broker", "activemq", "--activemq-url",
                        mqguard_activemq_server.urls["stomp"], "-n", "300", "--rounds", "1",
                        "--latency-samples", "100", "--warmup", "100",
                        "--event-loop", "asyncio", "--baselines"],
                       tmp_path / "proxy.json")
    assert report["benchmark"] == "proxy"
    assert report["parameters"]["messages"] == 300
    assert report["parameters"]["sidecar"] == "process"  # the default: as deployed
    assert report["parameters"]["event_loop"] == "asyncio"
    assert report["goals"] == {"send_ratio": 0.9, "consume_ratio": 0.9, "added_p99_ms": 1.0,
                               "sidecar_cpu_us": 30.0, "bare_cpu_us": 8.0}
    assert "load_average_before" in report["environment"]
    (case,) = report["cases"]
    print(json.dumps(case, indent=1))
    assert (case["broker"], case["store"], case["event_loop"]) == ("activemq", "memory",
                                                                   "asyncio")
    for figure in FIGURES:
        assert case[figure] > 0, figure
    assert case["send_ratio"] == pytest.approx(
        case["proxy_send_per_s"] / case["direct_send_per_s"], rel=1e-9)
    assert case["consume_ratio"] == pytest.approx(
        case["proxy_consume_per_s"] / case["direct_consume_per_s"], rel=1e-9)
    assert case["added_p50_ms"] == pytest.approx(case["proxy_p50_ms"] - case["direct_p50_ms"])
    assert case["added_p99_ms"] == pytest.approx(case["proxy_p99_ms"] - case["direct_p99_ms"])
    for side in ("direct", "proxy"):
        assert case[f"{side}_p99_ms"] >= case[f"{side}_p50_ms"]
    # One round: the medians are the runs themselves.
    runs = case["runs"]
    assert all(len(values) == 1 for values in runs.values())
    assert runs["proxy_send_per_s"] == [case["proxy_send_per_s"]]
    assert runs["direct_consume_per_s"] == [case["direct_consume_per_s"]]
    cpu, bare = case["sidecar_cpu_us"], case["baselines"]["bare"]["cpu_us"]
    expected = {"send_ratio": case["send_ratio"] >= 0.9,
                "consume_ratio": case["consume_ratio"] >= 0.9,
                "added_p99_ms": case["added_p99_ms"] <= 1.0}
    if cpu["send"] is not None and cpu["consume"] is not None:
        expected["sidecar_cpu_us"] = max(cpu["send"], cpu["consume"]) <= 30
    if bare["send"] is not None and bare["consume"] is not None:
        expected["bare_cpu_us"] = max(bare["send"], bare["consume"]) <= 8
    assert case["goals_met"] == expected
    assert set(case["sidecar_cpu_us"]) == {"send", "consume", "latency"}
    assert all(value is None or value >= 0 for value in case["sidecar_cpu_us"].values())
    # --baselines: the bare sidecar and the do-nothing relay ran in the same rounds, and
    # their figures agree with the direct path's as the sidecar's do.
    assert report["parameters"]["baselines"] == ["bare", "relay"]
    assert set(case["baselines"]) == {"bare", "relay"}
    for name, figures in case["baselines"].items():
        for figure in ("send_per_s", "consume_per_s", "p50_ms", "p99_ms"):
            assert figures[figure] > 0, (name, figure)
        assert figures["send_ratio"] == pytest.approx(
            figures["send_per_s"] / case["direct_send_per_s"], rel=1e-9)
        assert figures["consume_ratio"] == pytest.approx(
            figures["consume_per_s"] / case["direct_consume_per_s"], rel=1e-9)
        assert figures["added_p99_ms"] == pytest.approx(
            figures["p99_ms"] - case["direct_p99_ms"])
        assert figures["runs"]["send_per_s"] == [figures["send_per_s"]]
        assert set(figures["cpu_us"]) == {"send", "consume", "latency"}
    # The relay decodes nothing: it costs less CPU per message than the sidecar does.
    relay_cpu, sidecar_cpu = (case["baselines"]["relay"]["cpu_us"]["send"],
                              case["sidecar_cpu_us"]["send"])
    if relay_cpu is not None and sidecar_cpu is not None:
        # CPU time is read from /proc in clock ticks: two readings per figure, each up to one
        # tick short, so two equal costs may differ by that much per message.
        resolution_us = 2 / os.sysconf("SC_CLK_TCK") / 300 * 1e6
        assert relay_cpu <= sidecar_cpu + resolution_us


@pytest.mark.rabbitmq
def test_request_response_through_the_sidecar_never_stalls(mqguard_rabbitmq_server: ServerHandle,
                                                            mqguard_unique_name: str) -> None:
    """Regression: RabbitMQ ends frames with NUL EOL; relayed as heart-beats around the
    sidecar's own RECEIPTs they put "\\n\\n" in front of a MESSAGE, and stomp.py 9 dropped
    that MESSAGE (the one-at-a-time client then waited for ever)."""
    with running_sidecar(mqguard_rabbitmq_server.urls["stomp"], "memory") as sidecar:
        samples = stomp_latency(sidecar.url, mqguard_unique_name, 200, 64, timeout=5.0)
    assert len(samples) == 200
    assert 0 < percentile(samples, 50) <= percentile(samples, 99)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) == 0.0
