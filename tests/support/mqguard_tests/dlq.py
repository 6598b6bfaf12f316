"""Dead letters on a real broker, for the ``mqguard dlq`` tests: a poison run, a fixed
consumer, the commands, and a retry in a child process (so that it can be SIGKILLed)."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from mqguard.adapter import Adapter
from mqguard.cli.dlq import dlq
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.dlq import attach, open_dlq_adapter, peek
from mqguard.errors import Nack
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param("mosquitto", marks=pytest.mark.mosquitto, id="mosquitto"),
]
POISON = 20


def broker_url(kind: str, request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue(f"mqguard_{kind}_server")
    return str(server.urls["mqtt" if kind == "mosquitto" else "stomp"])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def write_toml(path: Path, config: dict[str, Any]) -> Path:
    """A two-level mqguard.toml (tables of scalars, one nested table level)."""
    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        lines.append(f"[{name}]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for key, value in body.items():
            if isinstance(value, dict):
                table(f"{name}.{json.dumps(key)}", value)

    for name, body in config.items():
        table(json.dumps(name) if "." in name else name, body)
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Scenario:
    """One queue, its dead-letter address, an event log and a store."""

    kind: str
    url: str
    name: str
    tmp: Path
    store: str = "memory"
    handled: list[bytes] = field(default_factory=list)

    @property
    def dla(self) -> str:
        return f"{self.name}.DLA"

    @property
    def events(self) -> Path:
        return self.tmp / "events"

    def config(self, node: str) -> dict[str, Any]:
        return {"mqguard": {"node-id": node, "store": self.store,
                            "event-log": {"directory": str(self.events),
                                          "flush-interval-ms": 20}},
                "address-settings": {self.name: {"max-delivery-attempts": 1,
                                                 "dead-letter-address": self.dla}}}

    def toml(self, node: str) -> Path:
        return write_toml(self.tmp / f"{node}.toml", self.config(node))

    def adapter(self, role: str) -> Adapter:
        if self.kind == "mosquitto":
            return open_adapter(self.url, broker="mosquitto",
                                client_id=f"{role}-{self.name}"[-60:])
        return open_adapter(self.url)

    def read_events(self) -> list[dict[str, Any]]:
        return list(read_events(self.events))

    def dead_letter(self, count: int = POISON, *, binary: bool = False) -> list[bytes]:
        """``count`` messages sent and dead-lettered by a handler that always fails; with
        ``binary``, the last one's body is 1 KiB of every byte value (not UTF-8)."""
        dla = open_dlq_adapter(self.url, self.dla)
        dla.connect()
        try:
            attach(dla, self.dla)  # MQTT keeps nothing for a topic nobody holds
        finally:
            dla.close()
        bodies = [f"m-{i}".encode() for i in range(count)]
        if binary:
            bodies[-1] = bytes(range(256)) * 4

        def poison(message: Message) -> None:
            raise Nack("poison")

        with Guard(parse_config(self.config("poison"))) as guard:
            with GuardedConsumer(self.adapter("consumer"), self.name, poison, guard), \
                    GuardedProducer(self.adapter("producer"), guard) as producer:
                for body in bodies:
                    producer.send(self.name, body)
                wait_for(lambda: sum(e["type"] == "dead_lettered"
                                     for e in read_events(self.events)) >= count,
                         30, "the dead letters")
        return bodies

    @contextlib.contextmanager
    def fixed_consumer(self) -> Iterator[list[bytes]]:
        """The handler fixed: every message is handled (recorded) and acknowledged."""
        def handle(message: Message) -> None:
            self.handled.append(message.body)

        with Guard(parse_config(self.config("fixed"))) as guard, \
                GuardedConsumer(self.adapter("consumer"), self.name, handle, guard):
            yield self.handled

    def dla_contents(self) -> list[Any]:
        adapter = open_dlq_adapter(self.url, self.dla)
        adapter.connect()
        try:
            return peek(adapter, self.dla, idle_ms=300, first_wait_ms=1000)
        finally:
            adapter.close()

    def cli(self, *args: str, node: str = "dlq", stdin: str = "") -> Result:
        """``mqguard dlq ARGS`` in this process (click's runner): fast, output captured."""
        command = [*args, "--url", self.url, "-c", str(self.toml(node)), "--idle-ms", "200"]
        return CliRunner().invoke(dlq, command, input=stdin, catch_exceptions=False)

    def run(self, *args: str, node: str = "dlq") -> str:
        result = self.cli(*args, node=node)
        assert result.exit_code == 0, result.output
        return result.stdout


def retry_in_child(url: str, address: str, config: dict[str, Any], rate: float | None,
                   batch: int) -> None:
    """Child process (spawned): ``mqguard.dlq.retry`` of ``address``, paced by ``rate``."""
    from mqguard.dlq import RetryOptions, retry

    adapter = open_dlq_adapter(url, address)
    adapter.connect()
    with Guard(parse_config(config)) as guard:
        retry(guard, adapter, address, RetryOptions(rate=rate, batch=batch))
    adapter.close()


def once_each(handled: list[bytes], bodies: list[bytes]) -> dict[bytes, int]:
    """The bodies not handled exactly once, with their counts (empty: all good)."""
    counts = Counter(handled)
    return {body: counts[body] for body in bodies if counts[body] != 1} | {
        body: n for body, n in counts.items() if body not in bodies}


def wait_handled(scenario: Scenario, bodies: list[bytes], timeout: float = 60) -> None:
    wait_for(lambda: set(bodies) <= set(scenario.handled), timeout, "every retried message")
    time.sleep(0.5)  # anything handled twice would show by now
