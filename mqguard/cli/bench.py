"""``mqguard bench ...``: performance figures as commands, with JSON output.

Each benchmark runs with no arguments on a fresh machine (it installs and
starts the local servers it needs and stops them afterwards); given URLs, it
uses those servers. Figures are ratios measured in the same run, because the
machines we run on are shared and noisy.
"""

from __future__ import annotations

import click

from mqguard.bench.report import environment, print_table, write_json
from mqguard.servers.ensure import server_urls

BROKERS = ("activemq", "rabbitmq", "mosquitto")


@click.group()
def bench() -> None:
    """Measure the guard's cost against the raw clients (JSON with --json)."""


@bench.command("client")
@click.option("--broker", "brokers", multiple=True, type=click.Choice(BROKERS),
              help="Broker(s) to measure (repeatable; default: all three).")
@click.option("--store", "stores", multiple=True, type=click.Choice(("memory", "redis")),
              help="Store(s) for the guarded side (repeatable; default: both).")
@click.option("--activemq-url", help="stomp:// URL of an ActiveMQ to use instead of a local one.")
@click.option("--rabbitmq-url", help="stomp:// URL of a RabbitMQ to use instead of a local one.")
@click.option("--mosquitto-url", help="mqtt:// URL of a Mosquitto to use instead of a local one.")
@click.option("--redis", "redis_url", help="Redis URL for the RedisStore cases.")
@click.option("-n", "--messages", type=click.IntRange(100, 1_000_000), default=5000,
              show_default=True, help="Messages per run.")
@click.option("--size", type=click.IntRange(8, 1_000_000), default=200, show_default=True,
              help="Body size in bytes.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Sends pipelined before waiting for their confirmations.")
@click.option("--prefetch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Consumer prefetch (unacknowledged messages in flight).")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Alternating raw/guarded rounds per case; medians are reported.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def client(brokers: tuple[str, ...], stores: tuple[str, ...], activemq_url: str | None,
           rabbitmq_url: str | None, mosquitto_url: str | None, redis_url: str | None,
           messages: int, size: int, batch: int, prefetch: int, rounds: int,
           json_path: str | None) -> None:
    """Raw stomp.py / paho-mqtt vs GuardedProducer / GuardedConsumer, per broker and store."""
    from mqguard.bench.client import run_case

    brokers = brokers or BROKERS
    stores = stores or ("memory", "redis")
    kinds = list(brokers) + (["redis"] if "redis" in stores else [])
    given = {"activemq": activemq_url, "rabbitmq": rabbitmq_url,
             "mosquitto": mosquitto_url, "redis": redis_url}
    cases = []
    with server_urls(kinds, given) as urls:
        for broker in brokers:
            for store in stores:
                store_url = urls["redis"] if store == "redis" else "memory"
                for direction in ("produce", "consume"):
                    case = run_case(broker, urls[broker], store, store_url, direction,
                                    messages, size, batch, prefetch, rounds)
                    cases.append(case.to_json())
                    click.echo(f"{broker}/{store}/{direction}: raw {case.raw_per_s:,.0f}/s "
                               f"guarded {case.guarded_per_s:,.0f}/s ratio {case.ratio:.3f}",
                               err=True)
    print_table("mqguard bench client (messages/s, median of rounds)", cases,
                ["broker", "store", "direction", "raw_per_s", "guarded_per_s", "ratio"])
    write_json(json_path, {"benchmark": "client", "environment": environment(),
                           "parameters": {"messages": messages, "size": size, "batch": batch,
                                          "prefetch": prefetch, "rounds": rounds},
                           "goals": {"ratio_redis": 0.9, "ratio_memory": 0.95},
                           "cases": cases})


@bench.command("dedup")
@click.option("--redis", "redis_url", help="Redis URL (standalone); default: start a local one.")
@click.option("--ids", type=click.IntRange(1000, 10_000_000), default=200_000, show_default=True,
              help="Ids checked-and-added per throughput figure.")
@click.option("--batch", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="Ids per script call on the batched path.")
@click.option("--capacity", type=click.IntRange(1, 10_000_000), default=20000,
              show_default=True, help="Ring capacity (id-cache-size) for the throughput runs.")
@click.option("--memory-ids", type=click.IntRange(1000, 10_000_000), default=1_000_000,
              show_default=True, help="Ids cached for the bytes-per-id figure.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def dedup(redis_url: str | None, ids: int, batch: int, capacity: int, memory_ids: int,
          json_path: str | None) -> None:
    """Duplicate-ID cache: batched Redis check-and-add vs redis-benchmark, memory per id."""
    from mqguard.bench.dedup import run

    with server_urls(["redis"], {"redis": redis_url}) as urls:
        result = run(urls["redis"], ids=ids, batch=batch, capacity=capacity,
                     memory_ids=memory_ids)
    goals = result["goals"]
    rows = [{"figure": key, "value": value, "goal": goals.get(key, "")}
            for key, value in result.items() if key != "goals"]
    print_table("mqguard bench dedup", rows, ["figure", "value", "goal"])
    write_json(json_path, {"benchmark": "dedup", "environment": environment(),
                           "parameters": {"ids": ids, "batch": batch, "capacity": capacity,
                                          "memory_ids": memory_ids}, **result})
