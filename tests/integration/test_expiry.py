"""Message expiry through REAL brokers: at delivery, and at rest with the expiry reaper."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mqguard_tests.brokers import BROKERS, broker_of

import mqguard
from mqguard.cli import main
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import AdapterError
from mqguard.events import read_events
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    Message,
    now_ms,
)
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.reaper import DEFAULT_HOLDING_QUEUE, ExpiryReaper
from mqguard.registry import open_adapter
from mqguard.servers.rabbitmq import rabbitmqctl
from mqguard.testing.waiting import wait_for


@pytest.fixture
def url(request: pytest.FixtureRequest) -> str:
    return broker_of(request)[1]


def make_guard(tmp_path: Path, address: str) -> Guard:
    config = parse_config({
        "mqguard": {"node-id": "expiry", "event-log": {"directory": str(tmp_path / "events"),
                                                       "flush-interval-ms": 20}},
        "address-settings": {address: {"expiry-address": f"{address}.EXP"}},
    })
    return Guard(config).start()


@pytest.fixture
def expired_inbox(url: str, mqguard_unique_name: str) -> Iterator[list[Message]]:
    """Consumes the expiry address (subscribed first: MQTT keeps nothing otherwise)."""
    got: list[Message] = []
    with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as guard, \
            GuardedConsumer(open_adapter(url), f"{mqguard_unique_name}.EXP", got.append, guard):
        yield got


def check_expiry_copy(copy: Message, original: Message, address: str) -> None:
    assert copy.body == original.body
    assert copy.expiration == 0
    assert copy.headers[ORIG_ADDRESS_HEADER] == address
    assert copy.headers[ORIG_MESSAGE_ID_HEADER] == original.message_id
    assert int(copy.headers[ACTUAL_EXPIRY_HEADER]) >= original.expiration


@pytest.mark.parametrize("url", BROKERS, indirect=True)
def test_expired_in_flight_never_reaches_the_handler(url: str, expired_inbox: list[Message],
                                                    tmp_path: Path,
                                                    mqguard_unique_name: str) -> None:
    """A message that expires while waiting behind a slow handler is moved at delivery;
    the others are delivered untouched and in order."""
    guard = make_guard(tmp_path, mqguard_unique_name)
    handled: list[bytes] = []

    def handler(message: Message) -> None:
        handled.append(message.body)
        if message.body == b"blocker":
            time.sleep(1.2)  # the next messages wait in the client meanwhile

    with GuardedConsumer(open_adapter(url), mqguard_unique_name, handler, guard):
        with GuardedProducer(open_adapter(url), guard) as producer:
            producer.send(mqguard_unique_name, b"blocker")
            short = producer.send(mqguard_unique_name, b"short-lived", ttl_ms=400).message
            producer.send(mqguard_unique_name, b"fresh", ttl_ms=60_000)
            producer.send(mqguard_unique_name, b"no expiry")
        wait_for(lambda: len(handled) >= 3 and expired_inbox, 20, "deliveries and the move")
        time.sleep(0.3)
    assert handled == [b"blocker", b"fresh", b"no expiry"]
    (copy,) = expired_inbox
    check_expiry_copy(copy, short, mqguard_unique_name)
    guard.events.flush()
    kinds = {(e["type"], e.get("ack_reason")) for e in read_events(tmp_path / "events")
             if e.get("message_id") == short.message_id}
    assert {("expired", None), ("acked", "expired"), ("moved", None)} <= kinds
    assert ("delivered", None) not in kinds
    guard.close()


class ScanWatcher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    @mqguard.hookimpl
    def before_expiry_scan(self, address: str) -> None:
        self.calls.append(("before", address, None))

    @mqguard.hookimpl
    def after_expiry_scan(self, address: str, expired: int) -> None:
        self.calls.append(("after", address, expired))

    @mqguard.hookimpl
    def message_expired(self, message: Message, moved_to: str | None) -> None:
        self.calls.append(("expired", message.message_id, moved_to))


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_activemq_reaper_moves_expired_at_rest(url: str, expired_inbox: list[Message],
                                               tmp_path: Path, mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name)
    watcher = ScanWatcher()
    guard.plugins.register(watcher)
    with GuardedProducer(open_adapter(url), guard) as producer:
        first = producer.send(mqguard_unique_name, b"stale-1", expiration=now_ms() - 1000).message
        producer.send(mqguard_unique_name, b"fresh-1", ttl_ms=60_000)
        second = producer.send(mqguard_unique_name, b"stale-2", ttl_ms=200).message
        producer.send(mqguard_unique_name, b"none")
    time.sleep(0.4)
    adapter = open_adapter(url)
    reaper = ExpiryReaper(guard, adapter, [mqguard_unique_name], batch_size=1, idle_ms=300)
    (result,) = reaper.scan()
    assert (result.address, result.expired, result.strategy) == (mqguard_unique_name, 2, "selector")
    wait_for(lambda: len(expired_inbox) == 2, 10, "the two expired copies")
    by_body = {m.body: m for m in expired_inbox}
    check_expiry_copy(by_body[b"stale-1"], first, mqguard_unique_name)
    check_expiry_copy(by_body[b"stale-2"], second, mqguard_unique_name)
    assert watcher.calls[0] == ("before", mqguard_unique_name, None)
    assert watcher.calls[-1] == ("after", mqguard_unique_name, 2)
    assert {c[1] for c in watcher.calls if c[0] == "expired"} == {first.message_id,
                                                                  second.message_id}
    # The others were neither consumed nor reordered.
    rest: list[bytes] = []
    with GuardedConsumer(open_adapter(url), mqguard_unique_name, lambda m: rest.append(m.body),
                         guard):
        wait_for(lambda: len(rest) == 2, 10, "the unexpired messages")
    assert rest == [b"fresh-1", b"none"]
    assert reaper.scan()[0].expired == 0
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_activemq_reaper_writes_events_before_commit(url: str, expired_inbox: list[Message],
                                                     tmp_path: Path,
                                                     mqguard_unique_name: str) -> None:
    # A kill between the COMMIT and the events left moved messages with no event (fault
    # suite: 10 such, called lost by the audit). The events now go first; a COMMIT that does
    # not happen leaves the messages in the queue, and the next scan moves them again.
    guard = make_guard(tmp_path, mqguard_unique_name)
    with GuardedProducer(open_adapter(url), guard) as producer:
        stale = producer.send(mqguard_unique_name, b"stale", expiration=now_ms() - 1000).message
    adapter = open_adapter(url)
    commit = adapter.commit
    seen_at_commit: list[int] = []

    def commit_that_never_happens(tx: str) -> None:
        guard.events.flush()
        seen_at_commit.extend(1 for e in read_events(tmp_path / "events")
                              if e["type"] == "expired" and e["message_id"] == stale.message_id)
        adapter.abort(tx)  # as if the broker died before it had the COMMIT
        raise AdapterError("COMMIT lost")

    adapter.commit = commit_that_never_happens  # type: ignore[method-assign]
    reaper = ExpiryReaper(guard, adapter, [mqguard_unique_name], idle_ms=300)
    with pytest.raises(AdapterError, match="COMMIT lost"):
        reaper.scan()
    assert seen_at_commit == [1]  # the event was in the log before the COMMIT
    adapter.commit = commit  # type: ignore[method-assign]
    assert reaper.scan()[0].expired == 1  # still in the queue: moved by the next scan
    wait_for(lambda: len(expired_inbox) == 1, 10, "the expired copy")
    time.sleep(0.3)
    assert len(expired_inbox) == 1  # one copy, not two
    check_expiry_copy(expired_inbox[0], stale, mqguard_unique_name)
    guard.events.flush()
    kinds = [e["type"] for e in read_events(tmp_path / "events")
             if e["message_id"] == stale.message_id]
    assert kinds.count("expired") == 2 and kinds.count("moved") == 2
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_activemq_reaper_sees_past_a_deep_unexpired_head(url: str, expired_inbox: list[Message],
                                                         tmp_path: Path,
                                                         mqguard_unique_name: str) -> None:
    """250 unexpired messages ahead of 50 expired ones: with ActiveMQ's default page of
    200 the selector would never reach the expired ones; the local broker's policy (and
    docs/expiry.md) raise maxPageSize, and the reaper moves all 50."""
    guard = make_guard(tmp_path, mqguard_unique_name)
    with GuardedProducer(open_adapter(url), guard) as producer:
        producer.send_batch([producer.message(mqguard_unique_name, b"fresh-%d" % i, ttl_ms=600_000)
                             for i in range(250)])
        producer.send_batch([producer.message(mqguard_unique_name, b"stale-%d" % i,
                                              expiration=now_ms() - 1000) for i in range(50)])
    adapter = open_adapter(url)
    (result,) = ExpiryReaper(guard, adapter, [mqguard_unique_name], first_wait_ms=2000).scan()
    assert result.expired == 50
    wait_for(lambda: len(expired_inbox) == 50, 20, "the 50 expired copies")
    assert sorted(m.body for m in expired_inbox) == sorted(b"stale-%d" % i for i in range(50))
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_running_reaper_moves_within_one_scan_period(url: str, expired_inbox: list[Message],
                                                     tmp_path: Path,
                                                     mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name)
    adapter = open_adapter(url)
    reaper = ExpiryReaper(guard, adapter, [mqguard_unique_name], idle_ms=100)
    stop = threading.Event()
    runner = threading.Thread(target=reaper.run, args=(stop, 500), daemon=True)
    runner.start()
    try:
        time.sleep(0.3)
        with GuardedProducer(open_adapter(url), guard) as producer:
            producer.send(mqguard_unique_name, b"expiring", ttl_ms=100)
        expired_at = time.monotonic() + 0.1
        wait_for(lambda: expired_inbox, 5, "the reaper to move the expired message")
        took = time.monotonic() - expired_at
        print(f"reaped {took * 1000:.0f} ms after expiry (scan period 500 ms)")
        assert took <= 0.5 + 0.5  # one period, plus a scan's own time on a loaded box
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[1:2], indirect=True)
def test_rabbitmq_reaper_routes_what_the_broker_expired(
        url: str, expired_inbox: list[Message], mqguard_rabbitmq_server: Any, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name)
    adapter = open_adapter(url)
    reaper = ExpiryReaper(guard, adapter, [], idle_ms=300)
    reaper.scan()  # declares the holding queue: RabbitMQ drops dead letters with no route
    rabbitmqctl(mqguard_rabbitmq_server, "set_policy", "--apply-to", "queues",
                f"exp-{mqguard_unique_name}",
                f"^{mqguard_unique_name}$", json.dumps({"dead-letter-exchange": "",
                                                "dead-letter-routing-key":
                                                    DEFAULT_HOLDING_QUEUE}))
    with GuardedProducer(open_adapter(url), guard) as producer:
        stale = producer.send(mqguard_unique_name, b"stale", ttl_ms=200).message
        producer.send(mqguard_unique_name, b"fresh", ttl_ms=60_000)
    time.sleep(1.0)  # RabbitMQ expires the head of the queue by itself
    (result,) = reaper.scan()
    assert (result.expired, result.strategy) == (1, "dead-letter")
    wait_for(lambda: len(expired_inbox) == 1, 10, "the expired copy")
    check_expiry_copy(expired_inbox[0], stale, mqguard_unique_name)
    rest: list[bytes] = []
    with GuardedConsumer(open_adapter(url), mqguard_unique_name, lambda m: rest.append(m.body),
                         guard):
        wait_for(lambda: rest, 10, "the fresh message")
        time.sleep(0.3)
    assert rest == [b"fresh"]
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[2:], indirect=True)
def test_mqtt_reaper_reports_native_expiry(url: str, tmp_path: Path,
                                           mqguard_unique_name: str) -> None:
    guard = make_guard(tmp_path, mqguard_unique_name)
    adapter = open_adapter(url)
    (result,) = ExpiryReaper(guard, adapter, [mqguard_unique_name]).scan()
    assert (result.expired, result.strategy) == (0, "native-drop")
    assert result.note and "drops expired messages itself" in result.note
    adapter.close()
    guard.close()


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_reap_command_one_pass(url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    config = tmp_path / "mqguard.toml"
    config.write_text(f'[mqguard.event-log]\ndirectory = "{tmp_path / "ev"}"\n'
                      f'[address-settings."{mqguard_unique_name}"]\n'
                      f'expiry-address = "{mqguard_unique_name}.EXP"\n')
    with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as guard, \
            GuardedProducer(open_adapter(url), guard) as producer:
        producer.send(mqguard_unique_name, b"stale", expiration=now_ms() - 1)
    result = CliRunner().invoke(main, ["reap", "--url", url, "-a", mqguard_unique_name, "-c",
                                       str(config), "--json"])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert (line["address"], line["expired"], line["strategy"]) == (mqguard_unique_name, 1,
                                                                    "selector")
    result = CliRunner().invoke(main, ["reap", "--url", url, "-c", str(config)])
    assert result.exit_code == 2 and "--address" in result.output


@pytest.mark.parametrize("url", BROKERS[:1], indirect=True)
def test_reap_command_loop_until_sigterm(url: str, expired_inbox: list[Message],
                                         tmp_path: Path, mqguard_unique_name: str) -> None:
    import signal
    import subprocess
    import sys

    config = tmp_path / "mqguard.toml"
    config.write_text(f'[mqguard.event-log]\ndirectory = "{tmp_path / "ev"}"\n'
                      f'[address-settings."{mqguard_unique_name}"]\n'
                      f'expiry-address = "{mqguard_unique_name}.EXP"\n')
    process = subprocess.Popen(
        [sys.executable, "-m", "mqguard.cli", "reap", "--url", url, "-a", mqguard_unique_name,
         "-c", str(config), "--loop", "--period", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}})) as guard, \
                GuardedProducer(open_adapter(url), guard) as producer:
            producer.send(mqguard_unique_name, b"expiring", ttl_ms=200)
        wait_for(lambda: expired_inbox, 15, "the looping reaper to move the message")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 128 + signal.SIGTERM, output.decode(errors="replace")
    assert expired_inbox[0].body == b"expiring"


def test_reaper_loop_skips_overrun_ticks(tmp_path: Path) -> None:
    """Unit-level: a scan longer than the period makes the loop skip ticks, not pile up."""
    from mqguard.testing.loopback import LoopbackAdapter

    guard = make_guard(tmp_path, "q")
    reaper = ExpiryReaper(guard, LoopbackAdapter(), ["q"])
    scans: list[float] = []

    def slow_scan() -> list[Any]:
        scans.append(time.monotonic())
        time.sleep(0.25)
        return []

    reaper.scan = slow_scan  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=reaper.run, args=(stop, 100))
    thread.start()
    time.sleep(1.0)
    stop.set()
    thread.join(5)
    gaps = [b - a for a, b in itertools.pairwise(scans)]
    assert scans and all(gap >= 0.25 for gap in gaps)
    assert len(scans) <= 4  # not 10: overrun ticks were skipped
    guard.close()
