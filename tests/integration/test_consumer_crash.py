"""A consumer killed with SIGKILL mid-stream loses nothing, and counts stay right.

The consumer runs in a child process with a Redis store; it is killed while it holds
prefetched, in-flight and held-for-redelivery messages, and a second one takes over
(same MQTT client id, so the persistent session carries over). Every message must then be
handled, every poison message dead-lettered, and the delivery counts seen by the handler
must go on increasing across the restart.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.message import ORIG_MESSAGE_ID_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param(("activemq", "stomp"), marks=pytest.mark.activemq, id="activemq"),
    pytest.param(("rabbitmq", "stomp"), marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param(("mosquitto", "mqtt"), marks=pytest.mark.mosquitto, id="mosquitto"),
]

TOTAL, POISON_EVERY, MAX_ATTEMPTS = 60, 12, 3


def crash_config(address: str, store: str, events: Path, node: str) -> dict[str, Any]:
    return {
        "mqguard": {"store": store, "node-id": node,
                    "event-log": {"directory": str(events), "flush-interval-ms": 20}},
        "address-settings": {address: {"dead-letter-address": f"{address}.DLA",
                                       "max-delivery-attempts": MAX_ATTEMPTS,
                                       "redelivery-delay": 100}},
    }


def consume_forever(url: str, address: str, config: dict[str, Any], log_path: str,
                    client_id: str) -> None:
    """Child process: handle messages, writing one line per handler call, until killed."""
    guard = Guard(parse_config(config)).start()
    options = {"client_id": client_id} if url.startswith("mqtt") else {}
    with open(log_path, "a", buffering=1) as log:
        def handle(message: Message) -> None:
            log.write(f"{message.body.decode()} {message.delivery_count}\n")
            time.sleep(0.01)
            if message.body.startswith(b"poison"):
                raise Nack("poison")

        GuardedConsumer(open_adapter(url, **options), address, handle, guard).start()
        log.write("ready 0\n")
        while True:
            time.sleep(1)


def handled(log_path: Path) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = defaultdict(list)
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            body, _, count = line.rpartition(" ")
            if body and count.isdigit():
                calls[body].append(int(count))
    return calls


@pytest.mark.redis
@pytest.mark.parametrize("kind", BROKERS)
def test_sigkill_mid_stream_loses_nothing(kind: tuple[str, str], request: pytest.FixtureRequest,
                                          redis_url: str, tmp_path: Path,
                                          unique_name: str) -> None:
    server, scheme = kind
    url = request.getfixturevalue(f"{server}_server").urls[scheme]
    log_path = tmp_path / "handled.log"
    context = multiprocessing.get_context("spawn")
    client_id = f"crash-{unique_name[-10:]}"

    def start(node: str) -> Any:
        config = crash_config(unique_name, redis_url, tmp_path / "events", node)
        process = context.Process(target=consume_forever, daemon=True,
                                  args=(url, unique_name, config, str(log_path), client_id))
        process.start()
        return process

    bodies = [f"poison-{i}" if i % POISON_EVERY == 5 else f"ok-{i}" for i in range(TOTAL)]
    dead: list[Message] = []
    with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as probe, \
            GuardedConsumer(open_adapter(url), f"{unique_name}.DLA", dead.append, probe):
        first = start("crash-1")
        try:
            wait_for(lambda: "ready" in handled(log_path), 30, "the first consumer")
            with GuardedProducer(open_adapter(url), probe) as producer:
                sent = {m.body.decode(): m.message_id for m in
                        (producer.send(unique_name, body.encode()).message for body in bodies)}
            wait_for(lambda: sum(map(len, handled(log_path).values())) >= 20, 30,
                     "20 handler calls")
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.join(10)
        second = start("crash-2")
        try:
            poison = {body for body in bodies if body.startswith("poison")}
            wait_for(lambda: {b for b in bodies if b not in poison} <= set(handled(log_path)),
                     60, "every good message to be handled")
            wait_for(lambda: {m.headers[ORIG_MESSAGE_ID_HEADER] for m in dead}
                     >= {sent[b] for b in poison}, 60, "every poison message dead-lettered")
            time.sleep(0.5)
        finally:
            os.kill(second.pid, signal.SIGKILL)
            second.join(10)

    calls = handled(log_path)
    assert first.exitcode == -signal.SIGKILL
    for body in bodies:
        counts = calls[body]
        assert counts, f"{body} was lost"
        assert counts == sorted(set(counts)), f"{body}: counts {counts} not increasing"
        if body.startswith("poison"):
            assert max(counts) <= MAX_ATTEMPTS, (body, counts)
    # The kill hit messages in flight: they came back to the second consumer counted as
    # later deliveries, not as first ones.
    again = {b: c for b, c in calls.items() if b.startswith("ok") and (len(c) > 1 or c[0] > 1)}
    assert again, "the kill did not catch any message in flight"
    assert {m.headers[ORIG_MESSAGE_ID_HEADER] for m in dead} == {
        sent[b] for b in bodies if b.startswith("poison")}
