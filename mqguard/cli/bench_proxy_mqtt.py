"""``mqguard bench proxy --protocol mqtt``: the MQTT sidecar's figures (see
:mod:`mqguard.bench.proxy_mqtt`)."""

from __future__ import annotations

import os

import click

from mqguard.cli.table import environment, print_table, write_json
from mqguard.servers.ensure import server_urls

__all__ = ["run_mqtt_bench"]


def run_mqtt_bench(*, mosquitto_url: str | None, store: str, redis_url: str | None,
                   messages: int, size: int, batch: int, rounds: int, latency_samples: int,
                   warmup: int, json_path: str | None) -> None:
    from mqguard.bench.proxy_mqtt import MQTT_GOALS, mqtt_table_rows, run_mqtt_case

    kinds = ["mosquitto"] + (["redis"] if store == "redis" else [])
    load_before = _load_average()
    with server_urls(kinds, {"mosquitto": mosquitto_url, "redis": redis_url}) as urls:
        store_url = urls["redis"] if store == "redis" else "memory"
        case = run_mqtt_case(urls["mosquitto"], store_url, messages=messages, size=size,
                             rounds=rounds, latency_samples=latency_samples, batch=batch,
                             warmup=warmup, progress=lambda text: click.echo(text, err=True))
    print_table(f"mqguard bench proxy --protocol mqtt (QoS 1, store {store}, sidecar process, "
                "native data plane; throughput: median of rounds, latency: pooled rounds)",
                mqtt_table_rows(case), ["broker", "figure", "direct", "proxy", "result",
                                        "goal", "met"])
    write_json(json_path, {"benchmark": "proxy", "protocol": "mqtt",
                           "environment": {**environment(),
                                           "load_average_before": load_before,
                                           "load_average_after": _load_average()},
                           "parameters": {"messages": messages, "size": size, "batch": batch,
                                          "rounds": rounds, "latency_samples": latency_samples,
                                          "warmup": warmup, "store": store, "qos": 1,
                                          "sidecar": "process", "data_plane": "native"},
                           "goals": MQTT_GOALS, "cases": [case]})


def _load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None
