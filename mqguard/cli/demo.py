"""``mqguard demo``: the main job on embedded defaults, start to finish.

Starts a local Redis, broker and Mosquitto (unless given URLs), the sidecar and the MQTT
sidecar, producers that send duplicates, poison and short-lived messages through the
sidecar, through the wrappers and through the MQTT sidecar, consumers (one of them
through an injected failover, one that drops its MQTT session on poison messages); then
runs the Spark audit over what mqguard recorded, what Redis holds and what the brokers
logged, and prints a summary table, the audit's figures per address and the path of the
HTML report. Every process and server it
started is stopped before it returns.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.table import Table

from mqguard.config import MqguardConfig, parse_config
from mqguard.demo.outcome import LegOutcome
from mqguard.demo.plan import DemoPlan, Kind, expected_fates
from mqguard.demo.scenario import DemoScenario
from mqguard.message import new_message_id
from mqguard.reaper import DEFAULT_HOLDING_QUEUE
from mqguard.registry import redact_url
from mqguard.servers import ServerHandle
from mqguard.servers.ensure import server_urls

BROKERS = ("activemq", "rabbitmq")
#: RabbitMQ policy (name, queue pattern, definition) routing what the broker expires in the
#: demo's queues to the expiry reaper's holding queue.
RABBITMQ_POLICY = ("mqguard-demo-expiry", r"^demo\.", json.dumps(
    {"dead-letter-exchange": "", "dead-letter-routing-key": DEFAULT_HOLDING_QUEUE}))
RABBITMQ_POLICY_COMMAND = ("rabbitmqctl set_policy --apply-to queues "
                           + " ".join(f"'{part}'" for part in RABBITMQ_POLICY))
#: The demo's redelivery policy: small numbers so poison messages die quickly.
MAX_DELIVERY_ATTEMPTS = 3
#: The MQTT leg's address (``<base>.devices``) takes duplicate ids from the content: its
#: device, on MQTT 3.1.1, cannot set a header.
DEVICES_SETTINGS = ("demo.*.devices", {"duplicate-id-from": "content"})
#: Column headings of :func:`traffic_table` under each address: how its clients connect.
PATHS = ("sidecar", "wrappers", "MQTT sidecar")
#: Rows of :func:`traffic_table`: what the clients of each address saw, against the plan.
TRAFFIC_ROWS = ("messages (distinct)", "sent twice (copy rejected)", "handled once / planned",
                "dead-lettered / planned", "expired / planned", "handled twice",
                "unacked at the failover cut")


def demo_configs(events_dir: Path, redis_url: str
                 ) -> tuple[MqguardConfig, MqguardConfig, MqguardConfig]:
    """The sidecar's, the application's and the MQTT sidecar's settings: one Redis, one
    event log directory, the same address settings."""

    def config(node: str) -> MqguardConfig:
        return parse_config({
            "mqguard": {"node-id": node, "store": redis_url,
                        "message-expiry-scan-period": 1000,
                        "event-log": {"directory": str(events_dir),
                                      "flush-interval-ms": 100}},
            "address-settings": {"#": {
                "max-delivery-attempts": MAX_DELIVERY_ATTEMPTS,
                "redelivery-delay": 50,
                "auto-create-dead-letter-resources": True,
                "auto-create-expiry-resources": True},
                DEVICES_SETTINGS[0]: DEVICES_SETTINGS[1]},
        }, "<demo>")

    return config("demo-sidecar"), config("demo-app"), config("demo-mqtt-sidecar")


@click.command()
@click.option("--broker", type=click.Choice(BROKERS), default="activemq", show_default=True,
              help="Which broker to guard (a local one is started unless --url is given).")
@click.option("--url", help="stomp:// URL of a running broker to use instead.")
@click.option("--redis", "redis_url", help="redis:// URL to use instead of a local Redis.")
@click.option("--mqtt", "mqtt_url",
              help="mqtt:// URL of a running Mosquitto for the MQTT leg instead of a local one.")
@click.option("-n", "--messages", type=click.IntRange(20, 100_000), default=500,
              show_default=True, help="Distinct messages per address (three addresses).")
@click.option("--out", type=click.Path(file_okay=False), default="mqguard-demo",
              show_default=True, help="Directory for the event log and the audit's output.")
@click.option("--seed", type=int, default=20261121, show_default=True,
              help="Seed of the message mix (which are duplicates, poison, short-lived).")
@click.option("--timeout", type=click.FloatRange(5, 3600), default=180.0, show_default=True,
              help="Seconds to wait for every message to reach its fate.")
@click.option("--no-audit", is_flag=True, help="Skip the Spark audit (no PySpark needed).")
def demo(broker: str, url: str | None, redis_url: str | None, mqtt_url: str | None,
         messages: int, out: str, seed: int, timeout: float, no_audit: bool) -> None:
    """Run every guarantee on real servers, then audit the outcome with Spark.

    Each of three addresses gets MESSAGES messages: 10% sent twice (duplicate
    detection drops the copy), 5% poison (the handler fails: dead-lettered after 3
    deliveries), 5% short-lived (expired before the consumers start: moved to the
    expiry address). One address is used by plain stomp.py clients through the
    sidecar, one by GuardedProducer / GuardedConsumer, whose connection is cut once
    while it holds handled, unacknowledged messages, and one (on Mosquitto) by paho
    clients through the MQTT sidecar: an MQTT 3.1.1 device without headers (duplicate
    ids from the content), an MQTT 5 application (_AMQ_DUPL_ID), and a subscriber that
    drops its session before acknowledging a poison message. Exit code 1 when a client
    saw something wrong or the audit found an anomaly.

    On RabbitMQ the demo's queues need an expiry policy (docs/expiry.md): the demo
    sets it on a broker it starts; with --url, set it first:
    rabbitmqctl set_policy --apply-to queues mqguard-demo-expiry '^demo\\.'
    '{"dead-letter-exchange":"","dead-letter-routing-key":"mqguard.expired"}'
    """
    console = Console(soft_wrap=True)
    out_dir = Path(out)
    events_dir = out_dir / "events"
    if events_dir.exists() and any(events_dir.iterdir()):
        raise click.UsageError(f"{events_dir} holds an earlier run's events; give another "
                               "--out or remove it (the audit would judge both runs)")
    if mqtt_url is not None and urlsplit(mqtt_url).scheme != "mqtt":
        raise click.BadParameter(f"must be mqtt://HOST:PORT, got {redact_url(mqtt_url)}",
                                 param_hint="--mqtt")
    plan = DemoPlan(messages, seed=seed)
    with _logs_to(out_dir / "demo.log"):
        _run(console, plan, broker, {broker: url, "redis": redis_url, "mosquitto": mqtt_url},
             out_dir, events_dir, timeout, no_audit)


def _run(console: Console, plan: DemoPlan, broker: str, given: dict[str, str | None],
         out_dir: Path, events_dir: Path, timeout: float, no_audit: bool) -> None:
    base = f"demo.{new_message_id()[:8]}"
    started_at = time.monotonic()
    started: dict[str, ServerHandle] = {}
    with console.status("starting Redis, the broker and Mosquitto...") as status, \
            server_urls([broker, "redis", "mosquitto"], given, started=started) as urls:
        console.print(f"[bold]servers[/bold]: {broker} at {redact_url(urls[broker])}, "
                      f"Redis at {redact_url(urls['redis'])}, Mosquitto at "
                      f"{redact_url(urls['mosquitto'])}")
        if broker == "rabbitmq":
            _rabbitmq_expiry_policy(console, started.get(broker))
        sidecar_config, app_config, mqtt_config = demo_configs(events_dir, urls["redis"])

        def report(text: str) -> None:
            # Wrapped here, at word boundaries: the console keeps long lines whole (a
            # path stays one word to copy), which a terminal would break mid-word.
            console.print(textwrap.fill(text, width=max(40, console.width),
                                        initial_indent="  ", subsequent_indent="    ",
                                        break_long_words=False, break_on_hyphens=False))
            status.update(text)

        status.update("sending...")
        scenario = DemoScenario(urls[broker], sidecar_config, app_config, plan, base,
                                mqtt_url=urls["mosquitto"], mqtt_config=mqtt_config,
                                report=report, timeout=timeout)
        try:
            legs = scenario.run()
        except (TimeoutError, RuntimeError) as exc:
            raise click.ClickException(f"the demo's traffic did not complete: {exc}") \
                from None
        console.print(f"traffic done in {time.monotonic() - started_at:.1f} s; event log "
                      f"in {events_dir}")
        problems = _client_problems(legs)
        console.print(traffic_table(legs))
        audit_summary = None
        if not no_audit:
            status.update("auditing with Spark (starting a local session)...")
            broker_logs = [f"{kind}:{started[kind].log_path}" for kind in (broker, "mosquitto")
                           if kind in started]
            audit_summary = _audit(console, out_dir, events_dir, app_config,
                                   urls["redis"], broker_logs, status)
            console.print(audit_table(audit_summary, base))
    elapsed = time.monotonic() - started_at
    if audit_summary is not None and audit_summary["anomalies"]:
        problems.append(f"the audit found {audit_summary['anomalies']} anomalies")
    if problems:
        for problem in problems:
            console.print(f"[red]problem[/red]: {problem}")
        sys.exit(1)
    console.print(f"[green]OK[/green]: every message met its planned fate "
                  f"({elapsed:.0f} s in all)")


def _rabbitmq_expiry_policy(console: Console, handle: ServerHandle | None) -> None:
    """RabbitMQ expires short-lived messages itself; the policy dead-letters them to the
    reaper's holding queue, from which the sidecar's reaper moves them to ``EXP.<address>``
    (docs/expiry.md). Set on a broker the demo started; asked for with ``--url``."""
    if handle is None:
        console.print("[yellow]note[/yellow]: on your RabbitMQ the demo's queues need the "
                      "expiry policy, or the broker drops the short-lived messages unseen "
                      f"(docs/expiry.md):\n  {RABBITMQ_POLICY_COMMAND}")
        return
    from mqguard.servers.rabbitmq import rabbitmqctl

    rabbitmqctl(handle, "set_policy", "--apply-to", "queues", *RABBITMQ_POLICY)


@contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """Logs go to a file while the demo runs: a WARN per dead-lettered or expired message
    is the demo working, not news for the terminal. The handlers before are restored."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for old in saved:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for old in saved:
            root.addHandler(old)
        root.setLevel(level)


def _client_problems(legs: list[LegOutcome]) -> list[str]:
    problems = []
    for leg in legs:
        if twice := leg.handled_twice():
            problems.append(f"{leg.address}: {twice} messages handed to the handler twice")
        poison = {p.index for p in leg.planned if p.kind is Kind.POISON}
        over = [i for i in poison if leg.handled[i] > MAX_DELIVERY_ATTEMPTS]
        if over:
            problems.append(f"{leg.address}: {len(over)} poison messages delivered more "
                            f"than {MAX_DELIVERY_ATTEMPTS} times")
        expired = {p.index for p in leg.planned if p.kind is Kind.SHORT_LIVED}
        if late := [i for i in expired if leg.handled[i]]:
            problems.append(f"{leg.address}: {len(late)} expired messages handed to the "
                            "handler")
    return problems


def traffic_table(legs: list[LegOutcome]) -> Table:
    """What the clients saw, one column per address and one row per figure.

    Three addresses and seven figures: laid out this way the table stays whole in an
    80-column terminal whatever the message count, where a column per figure cut its
    headers. Cells fold instead of being cut should a terminal be narrower still.
    """
    table = Table(title=f"what the clients saw ({legs[0].address.rpartition('.')[0]}.*)")
    table.add_column("", justify="left", overflow="fold")
    paths = PATHS[:len(legs)]
    for leg, path in zip(legs, paths, strict=True):
        table.add_column(f"{leg.address.rpartition('.')[2]}\nvia {path}", justify="right",
                         overflow="fold")
    rows: dict[str, list[str]] = {label: [] for label in TRAFFIC_ROWS}
    for leg, path in zip(legs, paths, strict=True):
        want = expected_fates(leg.planned)
        normal = [p.index for p in leg.planned if p.kind is Kind.NORMAL]
        once = sum(1 for i in normal if leg.handled[i] == 1)
        for label, value in zip(TRAFFIC_ROWS, (
                str(len(leg.planned)), str(want["duplicate_rejected"]),
                f"{once}/{want['handled']}", f"{leg.dead_letters}/{want['dead_lettered']}",
                f"{leg.expired_copies}/{want['expired']}", str(leg.handled_twice()),
                str(leg.failover_unacked) if path == "wrappers" else "-"), strict=True):
            rows[label].append(value)
    for label, values in rows.items():
        table.add_row(label, *values)
    return table


def _audit(console: Console, out_dir: Path, events_dir: Path, config: MqguardConfig,
           redis_url: str, broker_logs: list[str], status: Any) -> dict[str, Any]:
    try:
        from mqguard.audit.cross_checks import CrossInputs
        from mqguard.audit.runner import AuditOptions, run_audit
        from mqguard.audit.session import build_session
        from mqguard.audit.summary import print_summary
    except ImportError as exc:
        raise click.ClickException(f"the audit needs PySpark ({exc}): pip install "
                                   "'mqguard[spark]', or run the demo with --no-audit") \
            from None
    audit_dir = out_dir / "audit"
    os.makedirs(audit_dir, exist_ok=True)
    options = AuditOptions(
        inputs=[str(events_dir)], out=str(audit_dir), config=config, grace_ms=0,
        cross=CrossInputs(redis_url=redis_url, broker_logs=broker_logs))
    from pyspark import SparkContext

    # A session already running in this process (a notebook, a test) is used, not stopped.
    owned = SparkContext._active_spark_context is None
    spark = build_session(log_path=str(audit_dir / "spark.log"))
    try:
        result = run_audit(spark, options, lambda stage: status.update(f"audit: {stage}"))
    finally:
        if owned:
            spark.stop()
    status.stop()  # the audit is over: its summary is the spinner's last word
    print_summary(result.summary, console)
    console.print(f"audit summary: {(audit_dir / 'summary.json').resolve()}")
    return result.summary


def audit_table(summary: dict[str, Any], base: str) -> Table:
    """The audit's figures for each of the demo's addresses and their dead-letter and
    expiry copies: every leg, the MQTT one included, has its own line, anomalies or not.
    Addresses are shown without ``base`` (the title names it) so a row stays one line."""
    table = Table(title=f"what the audit saw (addresses under {base})")
    for column, justify in (("address", "left"), ("messages", "right"), ("sent", "right"),
                            ("deliveries", "right"), ("with fate", "right"),
                            ("anomalies", "right")):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    anomalies: dict[str, int] = {}
    for entry in summary["classes"].values():
        if entry["anomaly"]:
            for address, item in entry["by_address"].items():
                anomalies[address] = anomalies.get(address, 0) + item["count"]
    mine = {address.replace(f"{base}.", ""): address for address in summary["addresses"]
            if f"{base}." in address}
    # Each leg's address, then its copies (DLQ.<leg>, EXP.<leg>).
    for short in sorted(mine, key=lambda name: (name.rpartition(".")[2], name.count("."),
                                                name)):
        address = mine[short]
        figures = summary["addresses"][address]
        table.add_row(short, *(f"{figures[k] or 0:,}" for k in (
            "messages", "sent", "deliveries", "with_fate")), f"{anomalies.get(address, 0):,}")
    return table
