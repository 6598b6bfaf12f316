"""A consumer SIGKILLed mid-stream through a real Mosquitto, audited with --redis and
--broker-log: the redeliveries the kill caused are explained by the connection loss in
mosquitto.log, and the Redis state agrees with the event log."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.consumer_crash import crash_config, handled
from mqguard_tests.crash_audit import HANG, consume_until_killed

from mqguard.audit.broker_logs import BROKER_CLASSES
from mqguard.audit.cross_checks import CrossInputs
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.state_checks import STATE_CLASSES
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.message import Message, now_ms
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.testing.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.redis, pytest.mark.mosquitto]

TOTAL = 40


def test_sigkill_redeliveries_are_explained_by_the_mosquitto_log(
        spark: Any, mqguard_mosquitto_server: Any, mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    url = mqguard_mosquitto_server.urls["mqtt"]
    events = tmp_path / "events"
    log_path = tmp_path / "handled.log"
    context = multiprocessing.get_context("spawn")
    client_id = f"audit-{mqguard_unique_name[-10:]}"
    settings = crash_config(mqguard_unique_name, mqguard_redis_url, events, "producer")

    def start(node: str) -> Any:
        config = crash_config(mqguard_unique_name, mqguard_redis_url, events, node)
        process = context.Process(target=consume_until_killed, daemon=True,
                                  args=(url, mqguard_unique_name, config, str(log_path), client_id))
        process.start()
        return process

    bodies = [f"ok-{i}" for i in range(TOTAL // 2)] + [HANG] + [
        f"ok-{i}" for i in range(TOTAL // 2, TOTAL)]
    dead: list[Message] = []
    with Guard(parse_config(settings)) as guard, \
            GuardedConsumer(open_adapter(url), f"{mqguard_unique_name}.DLA", dead.append, guard):
        first = start("crash-1")
        try:
            wait_for(lambda: "ready" in handled(log_path), 30, "the first consumer")
            with GuardedProducer(open_adapter(url), guard) as producer:
                for body in bodies:
                    producer.send(mqguard_unique_name, body.encode(), duplicate_id=body)
            wait_for(lambda: HANG in handled(log_path), 30, "the handler to hang")
            time.sleep(0.5)  # its delivered event is written (flush-interval-ms 20)
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.join(10)
        second = start("crash-2")
        try:
            wait_for(lambda: set(bodies) <= set(handled(log_path))
                     and len(handled(log_path)[HANG]) == 2, 60, "every message to be handled")
            time.sleep(1.0)  # the last acks and events are written
        finally:
            second.terminate()
            second.join(10)

    result = run_audit(spark, AuditOptions(
        [str(events)], out=str(tmp_path / "out"), config=parse_config(settings),
        watermark=now_ms(),
        cross=CrossInputs(redis_url=mqguard_redis_url,
                          broker_logs=(str(mqguard_mosquitto_server.log_path),))))
    summary = result.summary
    mine = {c.name for c in (*STATE_CLASSES, *BROKER_CLASSES) if c.anomaly}
    found = {name: entry["by_address"] for name, entry in summary["classes"].items()
             if entry["count"] and name in mine}
    assert found == {}, found
    logs = summary["broker_logs"]
    assert logs["files"][0]["broker"] == "mosquitto" and logs["unknown_lines"] == 0
    # The kill left deliveries without an outcome; their redeliveries were judged.
    assert logs["redeliveries_judged"] >= 1, logs
    assert logs["records"]["lost"] >= 1
