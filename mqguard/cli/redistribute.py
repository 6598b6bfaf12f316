"""``mqguard redistribute``: move messages of consumer-less queues to nodes with consumers."""

from __future__ import annotations

import json
import threading

import click

from mqguard.cli.table import print_table
from mqguard.config import load_config
from mqguard.errors import MqguardError
from mqguard.pipeline import Guard
from mqguard.redistributor import MAX_BATCH, QueueResult, Redistributor


@click.command()
@click.option("-g", "--group", required=True,
              help="The [mqguard.groups.<name>] to redistribute.")
@click.option("-q", "--queue", "queues", multiple=True,
              help="Queue to redistribute (repeatable), besides the group's `queues`.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="mqguard.toml (default ./mqguard.toml if present): groups, "
                   "redistribution-delay, store (shared with the consumers), event log.")
@click.option("--loop", is_flag=True,
              help="Scan every redistribution-scan-period-ms until interrupted.")
@click.option("--period", type=click.IntRange(min=10), default=None,
              help="Scan period in ms for --loop (default: the group's "
                   "redistribution-scan-period-ms).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=100, show_default=True,
              help="Messages moved per batch (one confirmed send per target, one store call).")
@click.option("--pause-ms", type=click.IntRange(0, 60_000), default=0, show_default=True,
              help="Pause between batches: caps the rate at which a backlog is moved.")
@click.option("--first-wait-ms", type=click.IntRange(0, 600_000), default=1000,
              show_default=True,
              help="How long a move waits for the first message of a queue (deep ActiveMQ "
                   "queues take a while to page in).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per result.")
def redistribute(group: str, queues: tuple[str, ...], config_path: str | None, loop: bool,
                 period: int | None, batch: int, pause_ms: int, first_wait_ms: int,
                 as_json: bool) -> None:
    """Redistribute a broker group's queues (Artemis message redistribution).

    A node's queue with no live consumer for redistribution-delay ms (address setting;
    -1 never, 0 at once) has its messages moved round robin to the nodes whose consumers
    accept them, under message-load-balancing ON_DEMAND or OFF_WITH_REDISTRIBUTION. One
    pass by default. Consumers announce themselves through the store, so use the store
    they use (a Redis URL). See docs/load-balancing.md.
    """
    try:
        config = load_config(config_path)
        with Guard(config, role="redistributor") as guard:
            redistributor = Redistributor(guard, group, queues=queues, batch_size=batch,
                                          pause_ms=pause_ms, first_wait_ms=first_wait_ms)
            if not redistributor.queues:
                raise click.UsageError(
                    "no queues: give --queue or set `queues` in the group's configuration")
            try:
                if not loop:
                    _report(redistributor.scan(), as_json)
                    return
                stop = threading.Event()
                try:
                    redistributor.run(stop, period)
                except KeyboardInterrupt:
                    stop.set()
            finally:
                redistributor.close()
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None


def _report(results: list[QueueResult], as_json: bool) -> None:
    if as_json:
        for result in results:
            click.echo(json.dumps(result.to_json()))
        return
    print_table("mqguard redistribute", [r.to_json() for r in results],
                ["queue", "node", "state", "moved"])
