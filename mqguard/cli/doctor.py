"""``mqguard doctor``: check what mqguard's guarantees rely on; exit 0 / 1 / 2."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.markup import escape

from mqguard.cli.table import print_table
from mqguard.doctor import DoctorOptions, Report, run_doctor

__all__ = ["doctor"]

_STYLE = {"ok": "green", "warning": "yellow", "error": "bold red", "skipped": "dim"}


def _print(report: Report, console: Console) -> None:
    rows = [{"area": c.area, "check": c.name,
             "status": f"[{_STYLE[c.status.value]}]{c.status.value}[/]",
             # Details quote TOML keys ("[mqguard] store"), which rich would take for markup.
             "detail": escape(c.detail + (f"\nfix: {c.fix}" if c.fix else ""))}
            for c in report.checks]
    print_table("mqguard doctor", rows, ["area", "check", "status", "detail"], console=console)
    counts = report.counts()
    console.print(f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['error']} "
                  f"error(s), {counts['skipped']} skipped: exit {report.exit_code}")


@click.command()
@click.option("--url", metavar="BROKER",
              help="Broker URL (stomp://, stomp+ssl://, mqtt://, mqtts://); default: the "
                   "first broker group's local node. Credentials are never printed.")
@click.option("--store", metavar="URL",
              help="Store URL (redis://, redis+cluster://...); default: [mqguard] store of "
                   "the configuration.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              metavar="mqguard.toml",
              help="mqguard.toml (default ./mqguard.toml if present, else the defaults).")
@click.option("--broker-config", type=click.Path(dir_okay=False), metavar="FILE",
              help="The broker's own configuration (activemq.xml, mosquitto.conf), for what "
                   "it does not show over its protocol.")
@click.option("--management-url", metavar="URL",
              help="RabbitMQ management API (default http://<broker host>:15672).")
@click.option("--rabbitmqctl", "rabbitmqctl", metavar="COMMAND",
              help="RabbitMQ: a rabbitmqctl command line (e.g. 'rabbitmqctl -n rabbit@host') "
                   "to read queues, policies and the clock with, instead of the management "
                   "API.")
@click.option("--addresses", type=click.IntRange(min=1), metavar="N",
              help="Addresses to budget duplicate-ID rings for (default: those the "
                   "configuration names, wildcard keys counting one each).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(url: str | None, store: str | None, config_path: str | None,
           broker_config: str | None, management_url: str | None, rabbitmqctl: str | None,
           addresses: int | None, as_json: bool) -> None:
    """Check the configuration, the broker, Redis and the clocks; each check ok, warning or
    error with the fix. Exit 0 when all is well, 1 with warnings, 2 with errors
    (docs/doctor.md)."""
    options = DoctorOptions(url=url, store=store, config_path=config_path,
                            broker_config=broker_config, management_url=management_url,
                            rabbitmqctl=rabbitmqctl, addresses=addresses)
    if as_json:
        report = run_doctor(options)
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = Console()
        # The spinner goes to standard error, so that the table can be piped.
        with Console(stderr=True).status("checking") as status:
            report = run_doctor(options, lambda step: status.update(f"checking {step}"))
        _print(report, console)
    sys.exit(report.exit_code)
