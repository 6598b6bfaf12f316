"""``mqguard bench proxy --protocol mqtt`` on REAL Mosquitto: the report's figures are
consistent (a small run; the goals are judged by the command itself, not here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.cli.bench_proxy import proxy
from mqguard.servers import ServerHandle

pytestmark = pytest.mark.mosquitto


def test_bench_proxy_mqtt_report(mqguard_mosquitto_server: ServerHandle, tmp_path: Path) -> None:
    path = tmp_path / "mqtt.json"
    result = CliRunner().invoke(proxy, [
        "--protocol", "mqtt", "--mosquitto-url", mqguard_mosquitto_server.urls["mqtt"],
        "-n", "300", "--rounds", "2", "--latency-samples", "50", "--warmup", "100",
        "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert report["protocol"] == "mqtt" and report["parameters"]["qos"] == 1
    [case] = report["cases"]
    for side in ("direct", "proxy"):
        assert case[f"{side}_send_per_s"] > 0 and case[f"{side}_consume_per_s"] > 0
        assert 0 < case[f"{side}_p50_ms"] <= case[f"{side}_p99_ms"]
        assert len(case["runs"][f"{side}_send_per_s"]) == 2
    assert case["send_ratio"] == pytest.approx(case["proxy_send_per_s"]
                                               / case["direct_send_per_s"])
    assert case["added_p99_ms"] == pytest.approx(case["proxy_p99_ms"] - case["direct_p99_ms"])
    assert set(case["sidecar_cpu_us"]) == {"send", "consume", "latency"}
    assert all(value is not None and value >= 0 for value in case["sidecar_cpu_us"].values())
    assert set(case["goals_met"]) == {"send_ratio", "consume_ratio", "added_p99_ms",
                                      "sidecar_cpu_us"}
