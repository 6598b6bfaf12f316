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
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.consumer_crash import (
    MAX_ATTEMPTS,
    POISON_EVERY,
    TOTAL,
    consume_forever,
    crash_config,
    handled,
)

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
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


@pytest.mark.redis
@pytest.mark.parametrize("kind", BROKERS)
def test_sigkill_mid_stream_loses_nothing(kind: tuple[str, str], request: pytest.FixtureRequest,
                                          mqguard_redis_url: str, tmp_path: Path,
                                          mqguard_unique_name: str) -> None:
    server, scheme = kind
    url = request.getfixturevalue(f"mqguard_{server}_server").urls[scheme]
    log_path = tmp_path / "handled.log"
    context = multiprocessing.get_context("spawn")
    client_id = f"crash-{mqguard_unique_name[-10:]}"

    def start(node: str) -> Any:
        config = crash_config(mqguard_unique_name, mqguard_redis_url, tmp_path / "events", node)
        process = context.Process(target=consume_forever, daemon=True,
                                  args=(url, mqguard_unique_name, config, str(log_path), client_id))
        process.start()
        return process

    bodies = [f"poison-{i}" if i % POISON_EVERY == 5 else f"ok-{i}" for i in range(TOTAL)]
    dead: list[Message] = []
    with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as probe, \
            GuardedConsumer(open_adapter(url), f"{mqguard_unique_name}.DLA", dead.append, probe):
        first = start("crash-1")
        try:
            wait_for(lambda: "ready" in handled(log_path), 30, "the first consumer")
            with GuardedProducer(open_adapter(url), probe) as producer:
                sent = {m.body.decode(): m.message_id for m in
                        (producer.send(mqguard_unique_name,
                                       body.encode()).message for body in bodies)}
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
