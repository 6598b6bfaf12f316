"""``mqguard bench proxy``: stomp.py direct to the broker vs through the sidecar.

Registered on the ``bench`` group (``bench.add_command(proxy)``); the method is
described in :mod:`mqguard.bench.proxy`.
"""

from __future__ import annotations

import os

import click

from mqguard.cli.table import environment, print_table, write_json
from mqguard.errors import MqguardError
from mqguard.servers.ensure import server_urls
from mqguard.sidecar.eventloop import LOOP_KINDS
from mqguard.sidecar.eventloop import resolve as resolve_loop

BROKERS = ("activemq", "rabbitmq")


@click.command("proxy")
@click.option("--protocol", type=click.Choice(("stomp", "mqtt")), default="stomp",
              show_default=True, help="stomp: the brokers below; mqtt: MQTT 5 at QoS 1 "
                                      "through the MQTT sidecar to Mosquitto.")
@click.option("--mosquitto-url", help="mqtt:// URL of a Mosquitto to use instead of a local "
                                      "one (--protocol mqtt).")
@click.option("--broker", "brokers", multiple=True, type=click.Choice(BROKERS),
              help="Broker(s) to measure (repeatable; default: both).")
@click.option("--activemq-url", help="stomp:// URL of an ActiveMQ to use instead of a local one.")
@click.option("--rabbitmq-url", help="stomp:// URL of a RabbitMQ to use instead of a local one.")
@click.option("--store", type=click.Choice(("memory", "redis")), default="memory",
              show_default=True, help="The sidecar's store.")
@click.option("--redis", "redis_url",
              help="Redis URL for --store redis (default: start a local one).")
@click.option("--sidecar", "sidecar_mode", type=click.Choice(("thread", "process")),
              default="process", show_default=True,
              help="Run the sidecar as its own process (as it is deployed), or on a thread "
                   "of this process (sharing the GIL with the stomp.py client).")
@click.option("--event-loop", "event_loop", type=click.Choice(LOOP_KINDS), default="auto",
              show_default=True,
              help="The sidecar's event loop (auto: uvloop when installed, as mqguard sidecar).")
@click.option("-n", "--messages", type=click.IntRange(100, 1_000_000), default=10_000,
              show_default=True, help="Messages per throughput run.")
@click.option("--size", type=click.IntRange(8, 1_000_000), default=200, show_default=True,
              help="Body size in bytes.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Sends pipelined before waiting for their receipts.")
@click.option("--prefetch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Consumer prefetch (unacknowledged messages in flight).")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="Alternating direct/proxy rounds; medians (throughput) and pooled "
                   "percentiles (latency) are reported. Five by default: the direct "
                   "rates alone swing by 2x between rounds on a shared machine.")
@click.option("--latency-samples", type=click.IntRange(10, 1_000_000), default=2000,
              show_default=True, help="Request/response round trips per round and path.")
@click.option("--warmup", type=click.IntRange(0, 1_000_000), default=500, show_default=True,
              help="Untimed messages sent and consumed on both paths before the first round "
                   "(0 also skips the untimed exchanges before the first latency round).")
@click.option("--baselines", is_flag=True,
              help="Also measure, in the same rounds, a bare sidecar (every built-in plugin "
                   "disabled, no event log) and a do-nothing TCP relay, to split the "
                   "sidecar's cost into the hop, the relaying and the guarantees (slower: "
                   "four paths per round instead of two).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the results as JSON to this file.")
def proxy(protocol: str, mosquitto_url: str | None, brokers: tuple[str, ...],
          activemq_url: str | None, rabbitmq_url: str | None,
          store: str, redis_url: str | None, sidecar_mode: str, event_loop: str, messages: int,
          size: int, batch: int, prefetch: int, rounds: int, latency_samples: int, warmup: int,
          baselines: bool, json_path: str | None) -> None:
    """Send / consume throughput and added latency of the sidecar, per broker."""
    if protocol == "mqtt":
        from mqguard.cli.bench_proxy_mqtt import run_mqtt_bench

        run_mqtt_bench(mosquitto_url=mosquitto_url, store=store, redis_url=redis_url,
                       messages=messages, size=size, batch=batch, rounds=rounds,
                       latency_samples=latency_samples, warmup=warmup, json_path=json_path)
        return
    try:
        loop_name = resolve_loop(event_loop)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    from mqguard.bench.proxy import BASELINES, GOALS, run_case, table_rows

    brokers = brokers or BROKERS
    kinds = list(brokers) + (["redis"] if store == "redis" else [])
    given = {"activemq": activemq_url, "rabbitmq": rabbitmq_url, "redis": redis_url}
    cases = []
    load_before = _load_average()
    with server_urls(kinds, given) as urls:
        store_url = urls["redis"] if store == "redis" else "memory"
        for broker in brokers:
            case = run_case(broker, urls[broker], store, store_url, messages=messages,
                            size=size, rounds=rounds, latency_samples=latency_samples,
                            batch=batch, prefetch=prefetch, warmup=warmup,
                            sidecar_mode=sidecar_mode, event_loop=event_loop,
                            baselines=BASELINES if baselines else (),
                            progress=lambda text: click.echo(text, err=True))
            cases.append(case.to_json())
    print_table(f"mqguard bench proxy (store {store}, sidecar on a {sidecar_mode}, "
                f"{loop_name} loop; "
                "throughput: median of rounds, latency: pooled rounds)",
                [row for case in cases for row in table_rows(case)],
                ["broker", "figure", "direct", "proxy", "result", "goal", "met"])
    write_json(json_path, {"benchmark": "proxy",
                           "environment": {**environment(),
                                           "load_average_before": load_before,
                                           "load_average_after": _load_average()},
                           "parameters": {"messages": messages, "size": size, "batch": batch,
                                          "prefetch": prefetch, "rounds": rounds,
                                          "latency_samples": latency_samples,
                                          "warmup": warmup, "store": store,
                                          "sidecar": sidecar_mode,
                                          "event_loop": loop_name,
                                          "baselines": list(BASELINES) if baselines
                                          else []},
                           "goals": GOALS, "cases": cases})


def _load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: the machine's other work, for reading the figures."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None
