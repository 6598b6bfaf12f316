"""``mqguard bench proxy --protocol mqtt``: an MQTT 5 client direct to the broker vs
through the MQTT sidecar, in the same run (the method of :mod:`mqguard.bench.proxy`).

The client (:mod:`mqguard.bench.mqtt_client`) is identical on both paths; only the port
differs. Everything is QoS 1. Send: ``n`` PUBLISHes with unique ``_AMQ_DUPL_ID`` user
properties, ``batch`` pipelined, timed from the first PUBLISH to the last PUBACK.
Consume: a persistent session subscribed beforehand receives ``n`` messages published
(untimed) through the sidecar, so both paths carry the sidecar's user properties; timed
from CONNECT to the ``n``-th PUBLISH, one PUBACK each. Latency: one message at a time to
the connection's own subscription. Rounds alternate which path goes first; throughput is
the median of rounds, latencies are pooled. The sidecar runs as its own process
(``mqguard sidecar --protocol mqtt``, default plugins, in-memory or Redis store, event
log on); ``sidecar_cpu_us`` is its CPU time per message (send, consume) or round trip
(latency), from ``/proc`` (Linux).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mqguard.bench import mqtt_client
from mqguard.bench.stats import median

__all__ = ["MQTT_GOALS", "mqtt_table_rows", "run_mqtt_case"]

#: The targets of the MQTT sidecar path (the issue "The MQTT sidecar").
MQTT_GOALS: dict[str, float] = {"send_ratio": 0.9, "consume_ratio": 0.9, "added_p99_ms": 1.0,
                                "sidecar_cpu_us": 30.0}

_READY = "mqguard sidecar (mqtt) listening on "


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def _sidecar(broker_url: str, store_url: str, tmp: Path) -> Iterator[tuple[int, int]]:
    """``mqguard sidecar --protocol mqtt`` as a process: (port, pid)."""
    config = tmp / "mqguard.toml"
    config.write_text(f'[mqguard]\nstore = {json.dumps(store_url)}\n\n'
                      f'[mqguard.event-log]\ndirectory = {json.dumps(str(tmp / "events"))}\n')
    log_path = tmp / "sidecar.log"
    command = [sys.executable, "-m", "mqguard.cli", "sidecar", "--protocol", "mqtt",
               "--listen", "127.0.0.1:0", "--upstream", broker_url, "-c", str(config)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        port = 0
        while not port:
            text = log_path.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith(_READY):
                    port = int(line[len(_READY):].split(",")[0].rpartition(":")[2])
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the MQTT sidecar did not start:\n{text[-2000:]}")
            time.sleep(0.05)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_mqtt_case(broker_url: str, store_url: str, *, messages: int, size: int, rounds: int,
                  latency_samples: int, batch: int = 100, warmup: int = 500,
                  progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """One case: both paths, ``rounds`` alternating rounds; its JSON form."""
    parts = urlsplit(broker_url)
    direct_port = parts.port or 1883
    bodies = [os.urandom(size // 2).hex().encode()[:size] for _ in range(messages)]
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-mqtt-") as tmp_name, \
            _sidecar(broker_url, store_url, Path(tmp_name)) as (proxy_port, pid):
        ports = {"direct": direct_port, "proxy": proxy_port}
        cpu: dict[str, list[float]] = {"send": [], "consume": [], "latency": []}

        def timed(side: str, phase: str, count: int, run: Callable[[], float]) -> float:
            before = _cpu_seconds(pid) if side == "proxy" else None
            result = run()
            after = _cpu_seconds(pid) if before is not None else None
            if before is not None and after is not None:
                cpu[phase].append((after - before) / count * 1e6)
            return result

        if warmup:
            for side in ports:
                topic = f"bench/warm/{uuid.uuid4().hex}"
                mqtt_client.produce(ports[side], topic, bodies[:warmup], batch)
                mqtt_client.latency(ports[side], topic + "/l", min(warmup, 500), size)
        figures: dict[str, dict[str, list[float]]] = {
            side: {"send": [], "consume": [], "latency": []} for side in ports}

        def measure(side: str) -> None:
            port = ports[side]
            topic = f"bench/{side}/{uuid.uuid4().hex}"
            seconds = timed(side, "send", messages, lambda: mqtt_client.produce(
                port, topic + "/s", bodies, batch))
            figures[side]["send"].append(messages / seconds)
            client_id = f"bench-c-{uuid.uuid4().hex[:12]}"
            mqtt_client.subscribe_session(port, client_id, topic + "/c")
            mqtt_client.fill(proxy_port, topic + "/c", bodies)
            seconds = timed(side, "consume", messages, lambda: mqtt_client.consume(
                port, client_id, messages))
            figures[side]["consume"].append(messages / seconds)
            samples: list[float] = []

            def latency() -> float:
                samples.extend(mqtt_client.latency(port, topic + "/l", latency_samples, size,
                                                   warmup=100))
                return 0.0

            timed(side, "latency", latency_samples + 100, latency)
            figures[side]["latency"].extend(samples)

        for number in range(rounds):
            for side in (["direct", "proxy"] if number % 2 == 0 else ["proxy", "direct"]):
                measure(side)
                progress(f"mqtt round {number + 1}/{rounds} {side}: send "
                         f"{figures[side]['send'][-1]:.0f}/s, consume "
                         f"{figures[side]['consume'][-1]:.0f}/s")
    direct, proxy = figures["direct"], figures["proxy"]
    case: dict[str, Any] = {
        "broker": "mosquitto", "protocol": "mqtt", "qos": 1, "store": store_url,
        "sidecar": "process", "data_plane": "native",
        "direct_send_per_s": median(direct["send"]), "proxy_send_per_s": median(proxy["send"]),
        "direct_consume_per_s": median(direct["consume"]),
        "proxy_consume_per_s": median(proxy["consume"]),
        "direct_p50_ms": _percentile(direct["latency"], 0.5),
        "direct_p99_ms": _percentile(direct["latency"], 0.99),
        "proxy_p50_ms": _percentile(proxy["latency"], 0.5),
        "proxy_p99_ms": _percentile(proxy["latency"], 0.99),
        "sidecar_cpu_us": {phase: (median(values) if values else None)
                           for phase, values in cpu.items()},
        "runs": {f"{side}_{phase}_per_s": values for side in ("direct", "proxy")
                 for phase, values in figures[side].items() if phase != "latency"},
    }
    case["send_ratio"] = case["proxy_send_per_s"] / case["direct_send_per_s"]
    case["consume_ratio"] = case["proxy_consume_per_s"] / case["direct_consume_per_s"]
    case["added_p50_ms"] = case["proxy_p50_ms"] - case["direct_p50_ms"]
    case["added_p99_ms"] = case["proxy_p99_ms"] - case["direct_p99_ms"]
    send_cpu = case["sidecar_cpu_us"]["send"]
    case["goals_met"] = {
        "send_ratio": case["send_ratio"] >= MQTT_GOALS["send_ratio"],
        "consume_ratio": case["consume_ratio"] >= MQTT_GOALS["consume_ratio"],
        "added_p99_ms": case["added_p99_ms"] <= MQTT_GOALS["added_p99_ms"],
        "sidecar_cpu_us": send_cpu is not None and send_cpu <= MQTT_GOALS["sidecar_cpu_us"],
    }
    return case


def mqtt_table_rows(case: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure of a case, for :func:`~mqguard.cli.table.print_table`."""
    met = case["goals_met"]

    def yes(value: bool) -> str:
        return "yes" if value else "NO"

    cpu = {phase: "n/a" if value is None else f"{value:.1f}"
           for phase, value in case["sidecar_cpu_us"].items()}
    return [
        {"broker": case["broker"], "figure": "send msg/s", "direct": case["direct_send_per_s"],
         "proxy": case["proxy_send_per_s"], "result": f"ratio {case['send_ratio']:.2f}",
         "goal": f">= {MQTT_GOALS['send_ratio']}", "met": yes(met["send_ratio"])},
        {"broker": case["broker"], "figure": "consume msg/s",
         "direct": case["direct_consume_per_s"], "proxy": case["proxy_consume_per_s"],
         "result": f"ratio {case['consume_ratio']:.2f}",
         "goal": f">= {MQTT_GOALS['consume_ratio']}", "met": yes(met["consume_ratio"])},
        {"broker": case["broker"], "figure": "p50 ms", "direct": case["direct_p50_ms"],
         "proxy": case["proxy_p50_ms"], "result": f"{case['added_p50_ms']:+.2f} ms",
         "goal": "", "met": ""},
        {"broker": case["broker"], "figure": "p99 ms", "direct": case["direct_p99_ms"],
         "proxy": case["proxy_p99_ms"], "result": f"{case['added_p99_ms']:+.2f} ms",
         "goal": f"<= +{MQTT_GOALS['added_p99_ms']}", "met": yes(met["added_p99_ms"])},
        {"broker": case["broker"], "figure": "sidecar cpu us/msg (send)", "direct": "",
         "proxy": cpu["send"], "result": f"consume {cpu['consume']}; rtt {cpu['latency']}",
         "goal": f"<= {MQTT_GOALS['sidecar_cpu_us']}", "met": yes(met["sidecar_cpu_us"])},
    ]
