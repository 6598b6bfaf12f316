"""``mqguard reap``: run the expiry reaper once, or in a loop."""

from __future__ import annotations

import json
import threading

import click

from mqguard.cli.table import print_table
from mqguard.config import load_config
from mqguard.errors import MqguardError
from mqguard.pipeline import Guard
from mqguard.reaper import DEFAULT_HOLDING_QUEUE, MAX_BATCH, ExpiryReaper, ScanResult
from mqguard.registry import open_adapter


@click.command()
@click.option("--url", required=True,
              help="Broker URL (stomp://..., mqtt://...); credentials are never printed.")
@click.option("-a", "--address", "addresses", multiple=True,
              help="Queue to scan (repeatable). Not needed on RabbitMQ, where the holding "
                   "queue covers every queue under the expiry policy.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="mqguard.toml (default ./mqguard.toml if present): expiry addresses, "
                   "message-expiry-scan-period, store, event log.")
@click.option("--loop", is_flag=True,
              help="Scan every message-expiry-scan-period until interrupted (Ctrl-C, SIGTERM).")
@click.option("--period", type=click.IntRange(min=1), default=None,
              help="Scan period in ms for --loop (default: message-expiry-scan-period).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=MAX_BATCH, show_default=True,
              help="Messages moved per broker transaction.")
@click.option("--holding-queue", default=DEFAULT_HOLDING_QUEUE, show_default=True,
              help="RabbitMQ: the queue the expiry policy dead-letters to.")
@click.option("--first-wait-ms", type=click.IntRange(0, 600_000), default=0, show_default=True,
              help="How long a scan waits for its first expired message beyond the 300 ms "
                   "idle time: raise it for deep queues (ActiveMQ needs ~2 s at 100k).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per scan result.")
def reap(url: str, addresses: tuple[str, ...], config_path: str | None, loop: bool,
         period: int | None, batch: int, holding_queue: str, first_wait_ms: int,
         as_json: bool) -> None:
    """Move messages that expired at rest to their expiry address (Artemis expiry reaper).

    One pass by default. See docs/expiry.md for what each broker allows.
    """
    try:
        config = load_config(config_path)
        adapter = open_adapter(url)
        adapter.connect()
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    if not addresses and adapter.capabilities.expiry_reaping == "selector":
        adapter.close()
        raise click.UsageError("give the queues to scan with --address (repeatable)")
    try:
        with Guard(config, role="reaper") as guard:
            reaper = ExpiryReaper(guard, adapter, addresses, batch_size=batch,
                                  holding_queue=holding_queue, first_wait_ms=first_wait_ms)
            if not loop:
                _report(reaper.scan(), as_json)
                return
            stop = threading.Event()
            try:
                reaper.run(stop, period)
            except KeyboardInterrupt:
                stop.set()
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        adapter.close()


def _report(results: list[ScanResult], as_json: bool) -> None:
    if as_json:
        for result in results:
            click.echo(json.dumps(result.to_json()))
        return
    print_table("mqguard reap", [result.to_json() for result in results],
                ["address", "strategy", "expired", "seconds"])
    for result in results:
        if result.note:
            click.echo(f"{result.address}: {result.note}")
