"""``mqguard bench peer``: Artemis next to ActiveMQ / RabbitMQ with mqguard, one workload.

Registered on the ``bench`` group (``bench.add_command(peer)``); the method is described in
:mod:`mqguard.bench.peer`.
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

import click

from mqguard.cli.outfile import output_file
from mqguard.cli.table import environment, print_table, write_json
from mqguard.redact import redact_url
from mqguard.servers import ServerHandle
from mqguard.servers.ensure import server_urls

__all__ = ["peer"]

BROKERS = ("activemq", "rabbitmq")
VIAS = ("sidecar", "wrappers")
#: What the JSON records of a server started here, besides its version.
_SERVER_FACTS = ("heap", "journal_buffer_timeout_ns")


def _stomp_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A given broker URL must be ``stomp://HOST[:PORT]`` (the bench's clients speak plain
    STOMP); refused here rather than as a connection error later."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        ok = parts.scheme == "stomp" and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise click.BadParameter(f"{redact_url(value)}: expected stomp://HOST[:PORT]")
    return value


def _reachable(kind: str, url: str) -> None:
    """Fail at once, naming the option, when a given broker does not accept connections."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "", parts.port or 61613), timeout=5).close()
    except OSError as exc:
        raise click.ClickException(
            f"--{kind}-url {redact_url(url)}: cannot connect ({exc.strerror or exc})") from None


@click.command("peer")
@click.option("--broker", "brokers", multiple=True, type=click.Choice(BROKERS),
              help="Broker(s) to put mqguard in front of (repeatable; default: both).")
@click.option("--via", "vias", multiple=True, type=click.Choice((*VIAS, "direct")),
              help="How mqguard is used: the sidecar, the wrappers (GuardedProducer / "
                   "GuardedConsumer), or direct (no mqguard: the broker alone, duplicates "
                   "delivered). Repeatable; default: sidecar and wrappers.")
@click.option("--artemis-url", callback=_stomp_url,
              help="stomp:// URL of an Artemis to use instead of a local one.")
@click.option("--activemq-url", callback=_stomp_url,
              help="stomp:// URL of an ActiveMQ to use instead of a local one.")
@click.option("--rabbitmq-url", callback=_stomp_url,
              help="stomp:// URL of a RabbitMQ to use instead of a local one.")
@click.option("--store", type=click.Choice(("memory", "redis")), default="redis",
              show_default=True,
              help="mqguard's store: redis keeps duplicate ids across restarts and processes, "
                   "as Artemis's journal does; memory is per process.")
@click.option("--redis", "redis_url", help="Redis URL for --store redis (default: a local one).")
@click.option("-n", "--messages", type=click.IntRange(100, 1_000_000), default=5000,
              show_default=True, help="Messages sent per path and round (duplicates included).")
@click.option("--size", type=click.IntRange(8, 1_000_000), default=200, show_default=True,
              help="Body size in bytes.")
@click.option("--duplicate-every", type=click.IntRange(0, 1000), default=10, show_default=True,
              help="One message in this many repeats an earlier duplicate id (10: 10%; "
                   "0: none).")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Sends pipelined before waiting for their receipts.")
@click.option("--prefetch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Consumer prefetch (unacknowledged messages in flight).")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="Rounds; every path once per round, the order rotated each round. "
                   "Rates: median of rounds; latency: pooled rounds.")
@click.option("--latency-samples", type=click.IntRange(10, 1_000_000), default=1000,
              show_default=True, help="One-at-a-time send/receive exchanges per path and round.")
@click.option("--warmup", type=click.IntRange(0, 1_000_000), default=2000, show_default=True,
              help="Untimed messages through every path before the first round.")
@click.option("--json", "json_path", callback=output_file, metavar="FILE",
              help="Write the results as JSON to this file.")
def peer(brokers: tuple[str, ...], vias: tuple[str, ...], artemis_url: str | None,
         activemq_url: str | None, rabbitmq_url: str | None, store: str,
         redis_url: str | None, messages: int, size: int, duplicate_every: int, batch: int,
         prefetch: int, rounds: int, latency_samples: int, warmup: int,
         json_path: str | None) -> None:
    """Artemis with its own duplicate detection vs ActiveMQ / RabbitMQ with mqguard.

    One workload on every path: persistent sends with receipts and duplicate ids (10%
    repeated), then a consume with individual acks, and one-at-a-time latency. No goal:
    the figures side by side. Exits 1, after writing them, if a path delivered a
    duplicate it promised to drop.
    """
    from mqguard.bench.peer import Workload, run

    brokers = brokers or BROKERS
    vias = tuple(dict.fromkeys(vias)) or VIAS
    work = Workload(messages=messages, size=size, batch=batch, prefetch=prefetch,
                    duplicate_every=duplicate_every, rounds=rounds,
                    latency_samples=latency_samples, warmup=warmup)
    kinds = ["artemis", *brokers] + (["redis"] if store == "redis" else [])
    given = {"artemis": artemis_url, "activemq": activemq_url, "rabbitmq": rabbitmq_url,
             "redis": redis_url}
    for kind in ("artemis", *brokers):
        if given[kind]:
            _reachable(kind, str(given[kind]))
    load_before = _load_average()
    click.echo(f"starting or reaching: {', '.join(kinds)}", err=True)
    started: dict[str, ServerHandle] = {}
    with server_urls(kinds, given, started=started) as urls:
        store_url = urls["redis"] if store == "redis" else "memory"
        paths = run(urls, brokers, vias, store_url, work,
                    progress=lambda text: click.echo(text, err=True))
    results = [p.to_json() for p in paths]
    print_table(f"mqguard bench peer (store {store}; {messages} sends per round, 1 in "
                f"{duplicate_every or 'no'} a duplicate; rates: median of {rounds} rounds)",
                [_row(r) for r in results],
                ["path", "send/s", "consume/s", "p50 ms", "p99 ms", "dups through"])
    write_json(json_path, {"benchmark": "peer",
                           "environment": {**environment(), "load_average_before": load_before,
                                           "load_average_after": _load_average()},
                           "parameters": {"messages": messages, "size": size,
                                          "duplicate_every": duplicate_every, "batch": batch,
                                          "prefetch": prefetch, "rounds": rounds,
                                          "latency_samples": latency_samples,
                                          "warmup": warmup, "store": store,
                                          "brokers": list(brokers), "vias": list(vias)},
                           "servers": {kind: {"version": handle.version,
                                              **{k: v for k, v in handle.meta.items()
                                                 if k in _SERVER_FACTS}}
                                       for kind, handle in started.items()},
                           "paths": results})
    leaked = [r["path"] for r in results
              if r["via"] != "direct" and r["duplicates_delivered"]]
    if leaked:
        raise click.ClickException(f"duplicates delivered on {', '.join(leaked)}")


def _row(result: dict[str, Any]) -> dict[str, Any]:
    return {"path": result["path"], "send/s": result["send_per_s"],
            "consume/s": result["consume_per_s"], "p50 ms": result["p50_ms"],
            "p99 ms": result["p99_ms"], "dups through": result["duplicates_delivered"]}


def _load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: the machine's other work, for reading the figures."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None
