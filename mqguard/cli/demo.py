"""``mqguard demo``: the main job on embedded defaults — a guarded round trip.

Starts a local broker (unless given a URL), sends messages through a
:class:`~mqguard.producer.GuardedProducer` and receives them through a
:class:`~mqguard.consumer.GuardedConsumer` with the MemoryStore, then reads the
event log back and checks that every message was sent, delivered once and
acknowledged.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from mqguard.config import load_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import MqguardError
from mqguard.events import read_events
from mqguard.message import Message, new_message_id
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter, redact_url
from mqguard.servers.ensure import server_urls

BROKERS = ("activemq", "rabbitmq", "mosquitto")


@click.command()
@click.option("--broker", type=click.Choice(BROKERS), default="activemq", show_default=True,
              help="Which broker to run the round trip through.")
@click.option("--url", help="Broker URL (stomp://..., mqtt://...); default: start a local one.")
@click.option("-n", "--messages", type=click.IntRange(1, 1_000_000), default=1000,
              show_default=True, help="Messages to send.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="mqguard.toml (default: ./mqguard.toml if present, else built-in defaults).")
@click.option("--events-dir", type=click.Path(file_okay=False), default="mqguard-events",
              show_default=True, help="Where the event log is written.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for every message to come back.")
def demo(broker: str, url: str | None, messages: int, config_path: str | None,
         events_dir: str, timeout: float) -> None:
    """Guarded send -> deliver -> ack round trip through a real broker; checks the event log.

    Every tenth message is sent a second time with the same _AMQ_DUPL_ID; the
    duplicate_detection plugin must keep those copies from the broker.
    """
    console = Console(soft_wrap=True)
    try:
        config = load_config(config_path)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    config = config.with_overrides(
        event_log=config.core.event_log.model_copy(update={"directory": events_dir}))
    address = f"mqguard.demo.{new_message_id()[:8]}"
    with server_urls([broker], {broker: url}) as urls:
        broker_url = urls[broker]
        console.print(f"broker {broker} at {redact_url(broker_url)}, address {address}, "
                      f"store {config.core.store}")
        received: list[Message] = []
        done = threading.Event()

        def handle(message: Message) -> None:
            received.append(message)
            if len(received) >= messages:
                done.set()

        started = time.perf_counter()
        with Guard(config, role="app") as guard:
            consumer = GuardedConsumer(open_adapter(broker_url), address, handle, guard)
            with consumer, GuardedProducer(open_adapter(broker_url), guard) as producer:
                batch = [producer.message(address, f"demo message {i}".encode(),
                                          headers={"demo-index": str(i)},
                                          duplicate_id=f"demo-{i}")
                         for i in range(messages)]
                # Every tenth message is sent twice: duplicate detection must drop the copy.
                batch += [producer.message(address, b"duplicate", duplicate_id=f"demo-{i}")
                          for i in range(0, messages, 10)]
                for start in range(0, len(batch), 100):
                    producer.send_batch(batch[start:start + 100])
                if not done.wait(timeout):
                    raise click.ClickException(
                        f"only {len(received)} of {messages} messages came back in {timeout}s")
                # Let the last acknowledgements reach the broker before disconnecting.
                time.sleep(0.2)
            node = guard.node_id
        elapsed = time.perf_counter() - started
    events = [e for e in read_events(events_dir) if e.get("node") == node]
    counts = Counter(e["type"] for e in events)
    table = Table(title=f"mqguard demo: {messages} messages via {broker} in {elapsed:.2f}s")
    table.add_column("event")
    table.add_column("count", justify="right")
    for kind, count in sorted(counts.items()):
        table.add_row(kind, str(count))
    console.print(table)
    ids = [m.message_id for m in received]
    problems = []
    if len(set(ids)) != messages:
        problems.append(f"{len(ids) - len(set(ids))} duplicate deliveries")
    duplicates = len(range(0, messages, 10))
    expected = {"sent": messages, "delivered": messages, "acked": messages}
    if guard.plugins.get_plugin("duplicate_detection") is not None:
        expected["duplicate_rejected"] = duplicates
    for kind, want in expected.items():
        if counts[kind] != want:
            problems.append(f"{counts[kind]} '{kind}' events, expected {want}")
    console.print(f"event log: {Path(events_dir).resolve()}")
    if problems:
        raise click.ClickException("; ".join(problems))
    console.print(f"[green]OK[/green]: {messages} messages sent, delivered once and "
                  f"acknowledged; {counts['duplicate_rejected']} duplicate sends rejected "
                  f"({messages / elapsed:.0f} msg/s round trip)")
