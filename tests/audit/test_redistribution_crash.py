"""SIGKILL of a redistributor process mid-move loses nothing and duplicates nothing.

A backlog on ActiveMQ node A, a guarded consumer on node B (presence and the shared
consumer audit in Redis), ``mqguard redistribute --loop`` in a subprocess killed with
SIGKILL while it moves (five times), then one that finishes. Checked three ways: what the
handler got, direct counts on both brokers, and the Spark audit over every process's
event log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.load_balancing import Received, drain

from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.balancing import GroupConsumer, GroupProducer
from mqguard.config import parse_config
from mqguard.events import read_events
from mqguard.pipeline import Guard
from mqguard.redistributor import REDISTRIBUTED_EVENT

pytestmark = [pytest.mark.spark, pytest.mark.activemq, pytest.mark.redis]
pytest_plugins = ["mqguard.testing.cluster"]

COUNT = 400


def toml_config(path: Path, *, store: str, events: Path, url_a: str, url_b: str,
                queue: str, node_id: str | None) -> dict[str, Any]:
    node = f'node-id = "{node_id}"\n' if node_id else ""
    path.write_text(
        f'[mqguard]\n{node}store = "{store}"\n'
        f'[mqguard.event-log]\ndirectory = "{events}"\nflush-interval-ms = 5\n'
        f'[mqguard.groups.g]\nnodes = ["{url_a}", "{url_b}"]\n'
        'message-load-balancing = "OFF_WITH_REDISTRIBUTION"\n'
        f'queues = ["{queue}"]\npresence-ttl-ms = 3000\n'
        f'[address-settings."{queue}"]\nredistribution-delay = 0\n'
        '[plugins.consumer_audit]\nshared = true\n')
    import tomllib

    return tomllib.loads(path.read_text())


def start_redistributor(config: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mqguard.cli", "redistribute", "-g", "g", "-c",
               str(config), "--loop", "--period", "50", "--batch", "50"]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def test_sigkill_mid_move_loses_and_duplicates_nothing(
        spark: Any, mqguard_activemq_pair: tuple[Any, Any], mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    url_a, url_b = (server.urls["stomp"] for server in mqguard_activemq_pair)
    events = tmp_path / "events"
    data = toml_config(tmp_path / "test.toml", store=mqguard_redis_url, events=events, url_a=url_a,
                       url_b=url_b, queue=mqguard_unique_name, node_id="crash-test")
    process_config = tmp_path / "redistributor.toml"
    toml_config(process_config, store=mqguard_redis_url, events=events, url_a=url_a, url_b=url_b,
                queue=mqguard_unique_name, node_id=None)
    config = parse_config(data, "test.toml")
    received = Received()
    processes: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "redistributor.log"
    with Guard(config) as guard:
        with GroupProducer("g", guard=guard, producer_id="crash-p") as producer:
            sent = [producer.send(mqguard_unique_name, f"m{i}").message for i in range(COUNT)]
        try:
            with GroupConsumer("g", url_b, mqguard_unique_name, received, guard):
                # Kill one mid-move five times, then let the last one finish. Each kill
                # follows the arrival of the first copy of a batch at B by about a
                # millisecond: the redistributor is then between the target's COMMIT and
                # the last of the batch's acks.
                kills: list[int] = []
                for threshold in (51, 101, 151, 201, 251):
                    process = start_redistributor(process_config, log)
                    processes.append(process)
                    deadline = time.monotonic() + 60
                    while len(received.messages) < threshold and time.monotonic() < deadline:
                        time.sleep(0.001)
                    assert len(received.messages) >= threshold, log.read_text()[-2000:]
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait(10)
                    kills.append(len(received.messages))
                assert kills[-1] < COUNT, "the redistributors finished before the last kill"
                processes.append(start_redistributor(process_config, log))
                assert received.wait(COUNT, timeout=90) == COUNT, log.read_text()[-2000:]
                time.sleep(1.0)  # anything extra would arrive now
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(15)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(5)

    # What the handler got: every message exactly once.
    handled = Counter(m.message_id for m in received.messages)
    assert set(handled) == {m.message_id for m in sent}
    assert max(handled.values()) == 1
    # The brokers: nothing left behind on either node.
    assert drain(url_a, mqguard_unique_name) == []
    assert drain(url_b, mqguard_unique_name, first_s=0.5) == []
    all_events = list(read_events(events))
    suppressed = [e for e in all_events if e["type"] == "duplicate_delivery_suppressed"]
    moves = [e for e in all_events if e["type"] == REDISTRIBUTED_EVENT]
    # No second copy ever reached B: markers committed with the copies tell a restarted
    # redistributor which copies a killed one had already sent.
    assert suppressed == []
    assert {e["node"] for e in moves} - {"crash-test"}, "no move events from the processes"
    # The Spark audit over every process's events: nothing lost, nothing duplicated.
    result = run_audit(spark, AuditOptions(inputs=[str(events)], out=str(tmp_path / "audit"),
                                           config=config))
    summary = result.summary
    assert result.anomalies == 0, json.dumps(summary, indent=1)[:3000]
    classes = summary["classes"]
    assert classes["lost"]["count"] == 0 and classes["duplicated"]["count"] == 0
    assert summary["messages"] >= COUNT
    resumed = [e for e in moves if "by an earlier attempt" in e["reason"]]
    by_marker = [e for e in resumed if "marker" in e["reason"]]
    print(f"killed with {kills} of {COUNT} arrived; {len(suppressed)} copies suppressed; "
          f"{len(moves)} move events written, {len(resumed)} of them completing a killed "
          f"process's move ({len(by_marker)} found by their marker)")
