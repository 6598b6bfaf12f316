"""``mqguard bench ...``: performance figures as commands, with JSON output.

Each benchmark runs with no arguments on a fresh machine (it installs and
starts the local servers it needs and stops them afterwards); given URLs, it
uses those servers. Figures are ratios measured in the same run, because single
rates swing between runs on a small or shared machine (docs/benchmarks.md).
"""

from __future__ import annotations

import click

from mqguard.cli.bench_audit import audit
from mqguard.cli.bench_peer import peer
from mqguard.cli.bench_proxy import proxy
from mqguard.cli.table import environment, print_table, write_json
from mqguard.errors import MqguardError
from mqguard.reaper import MAX_BATCH
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
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="Rounds per case; medians are reported. Within a round raw and "
                   "guarded alternate batch by batch (produce) or drain by drain of 1000 "
                   "messages (consume). Five by default: on a small or shared machine one "
                   "round's ratio can swing from 0.6 to 1.5, and a median of three "
                   "follows single bad rounds.")
@click.option("--warmup", type=click.IntRange(0, 1_000_000), default=2000, show_default=True,
              help="Messages per case sent or consumed on both sides, untimed, before the "
                   "first round: a freshly started broker is several times slower until "
                   "its JIT has compiled the hot paths.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def client(brokers: tuple[str, ...], stores: tuple[str, ...], activemq_url: str | None,
           rabbitmq_url: str | None, mosquitto_url: str | None, redis_url: str | None,
           messages: int, size: int, batch: int, prefetch: int, rounds: int,
           warmup: int, json_path: str | None) -> None:
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
                                    messages, size, batch, prefetch, rounds, warmup)
                    cases.append(case.to_json())
                    click.echo(f"{broker}/{store}/{direction}: raw {case.raw_per_s:,.0f}/s "
                               f"guarded {case.guarded_per_s:,.0f}/s ratio {case.ratio:.3f}",
                               err=True)
    print_table("mqguard bench client (messages/s, median of rounds)", cases,
                ["broker", "store", "direction", "raw_per_s", "guarded_per_s", "ratio"])
    write_json(json_path, {"benchmark": "client", "environment": environment(),
                           "parameters": {"messages": messages, "size": size, "batch": batch,
                                          "prefetch": prefetch, "rounds": rounds,
                                          "warmup": warmup},
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


@bench.command("reap")
@click.option("--broker", "brokers", multiple=True, type=click.Choice(BROKERS),
              help="Broker(s) to measure (repeatable; default: all three).")
@click.option("--activemq-url", help="stomp:// URL of an ActiveMQ to use instead of a local one.")
@click.option("--rabbitmq-url", help="stomp:// URL of a RabbitMQ to use instead of a local one.")
@click.option("--mosquitto-url", help="mqtt:// URL of a Mosquitto to use instead of a local one.")
@click.option("-n", "--messages", type=click.IntRange(100, 10_000_000), default=100_000,
              show_default=True, help="Messages at rest per queue.")
@click.option("--expired-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.5, show_default=True,
              help="Share of them already expired, spread evenly (0.5: every other one).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=MAX_BATCH,
              show_default=True, help="Reaper batch (messages moved per broker transaction).")
# 8: every body starts with the message's 8-digit index.
@click.option("--size", type=click.IntRange(8, 1_000_000), default=200,
              show_default=True, help="Body size in bytes.")
@click.option("--native-wait", type=click.FloatRange(0, 3600), default=35.0, show_default=True,
              help="Seconds the brokers are left alone once messages are due, to see what "
                   "they expire at rest (ActiveMQ's expiry task runs every 30 s by default).")
@click.option("--idle-ms", type=click.IntRange(1, 600_000), default=None,
              help="Reaper idle time: a scan ends when no message arrived for this long "
                   "(default: the reaper's own, 300 ms).")
@click.option("--reaper-timeout", type=click.FloatRange(1, 86_400), default=900.0,
              show_default=True,
              help="Seconds the reaper gets per queue; a scan still running then is cut off "
                   "and the figures say how far it got.")
@click.option("--timeout", type=click.FloatRange(1, 86_400), default=600.0, show_default=True,
              help="Bound in seconds on every other wait (fill, drains, the broker's expiry).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def reap(brokers: tuple[str, ...], activemq_url: str | None, rabbitmq_url: str | None,
         mosquitto_url: str | None, messages: int, expired_fraction: float, batch: int,
         size: int, native_wait: float, idle_ms: int | None, reaper_timeout: float,
         timeout: float, json_path: str | None) -> None:
    """Expiry reaper vs the broker's own expiry: N messages at rest, part already expired.

    No Redis: the reaper keeps no shared state (the guard's MemoryStore is enough).
    Exits 1, after writing the figures, when the reaper could not move every expired
    message (the notes say why).
    """
    from mqguard.bench.reap import BenchError, run_case

    brokers = brokers or BROKERS
    given = {"activemq": activemq_url, "rabbitmq": rabbitmq_url, "mosquitto": mosquitto_url}
    cases = []
    with server_urls(brokers, given) as urls:
        for broker in brokers:
            try:
                case = run_case(broker, urls[broker], messages=messages,
                                expired_fraction=expired_fraction, size=size, batch=batch,
                                native_wait=native_wait, idle_ms=idle_ms,
                                reaper_timeout=reaper_timeout, timeout=timeout)
            except (BenchError, MqguardError) as exc:
                raise click.ClickException(f"{broker}: {exc}") from None
            cases.append(case.to_json())
            reaper = ("not applicable" if case.reaper_moved is None else
                      f"moved {case.reaper_moved} of {case.expired} in {case.reaper_s:.2f} s")
            click.echo(f"{broker}: reaper {reaper}; native {case.native_s:.2f} s", err=True)
    # Short column names: the table has to fit an 80-column terminal.
    print_table("mqguard bench reap (expired messages moved / gone per second)",
                [{"broker": c["broker"], "expired": c["expired"], "moved": c["reaper_moved"],
                  "reaper s": c["reaper_s"], "reaper/s": c["reaper_per_s"],
                  "native s": c["native_s"], "native/s": c["native_per_s"]} for c in cases],
                ["broker", "expired", "moved", "reaper s", "reaper/s", "native s", "native/s"])
    for case_json in cases:
        click.echo(f"{case_json['broker']}: {case_json['native_mechanism']}; "
                   f"{case_json['notes']}")
    write_json(json_path, {"benchmark": "reap", "environment": environment(),
                           "parameters": {"messages": messages,
                                          "expired_fraction": expired_fraction,
                                          "batch": batch, "size": size,
                                          "native_wait": native_wait, "idle_ms": idle_ms,
                                          "reaper_timeout": reaper_timeout,
                                          "timeout": timeout},
                           "cases": cases})
    incomplete = [c["broker"] for c in cases if c["reaper_complete"] is False]
    if incomplete:
        raise click.ClickException(f"the reaper did not move every expired message on "
                                   f"{', '.join(incomplete)} (see the notes)")


bench.add_command(proxy)
bench.add_command(peer)
bench.add_command(audit)
