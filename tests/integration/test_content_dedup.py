"""Content-based duplicate detection on REAL brokers with the REAL Redis store: through the
wrappers (GuardedProducer) and through the sidecar (a stock stomp.py client that cannot set
``_AMQ_DUPL_ID``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
from mqguard_tests.brokers import STOMP_BROKERS, broker_of

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.digest import content_id
from mqguard.events import read_events
from mqguard.message import DUPLICATE_ID_HEADER, Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

SIDECAR_BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]


def config_of(tmp_path: Path, store: str, name: str) -> dict[str, Any]:
    """``name``: content ids; ``name.dev``: content ids with the ``device`` header;
    ``name.plain``: ids from headers only (the default)."""
    return {"mqguard": {"store": store, "node-id": "content-dedup",
                        "event-log": {"directory": str(tmp_path / "events"),
                                      "flush-interval-ms": 20}},
            "address-settings": {
                name: {"duplicate-id-from": "content"},
                f"{name}.dev": {"duplicate-id-from": "content",
                                "duplicate-id-headers": ["device"]}}}


def rejected_ids(tmp_path: Path) -> list[str]:
    return [e["duplicate_id"] for e in read_events(tmp_path / "events")
            if e["type"] == "duplicate_rejected"]


class Collector:
    """A guarded consumer of ``address`` (subscribed before anything is sent: MQTT has no
    queues)."""

    def __init__(self, url: str, address: str, guard: Guard) -> None:
        self.got: list[Message] = []
        self.arrived = threading.Event()
        self.consumer = GuardedConsumer(open_adapter(url), address, self._handle, guard)
        self.consumer.start()

    def _handle(self, message: Message) -> None:
        self.got.append(message)
        self.arrived.set()

    def wait(self, expected: int) -> list[Message]:
        """``expected`` messages and, for one second more, anything a missed duplicate
        would add."""
        try:
            deadline = time.monotonic() + 20
            while len(self.got) < expected and time.monotonic() < deadline:
                self.arrived.wait(0.2)
                self.arrived.clear()
            time.sleep(1.0)
        finally:
            self.consumer.stop()
        return self.got


def collect(url: str, address: str, guard: Guard, expected: int) -> list[Message]:
    return Collector(url, address, guard).wait(expected)


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    return broker_of(request)[1]


@pytest.mark.redis
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_wrappers_content_dedup(broker_url: str, mqguard_redis_url: str, tmp_path: Path,
                                mqguard_unique_name: str) -> None:
    name = mqguard_unique_name
    with Guard(parse_config(config_of(tmp_path, mqguard_redis_url, name))) as guard:
        with GuardedProducer(open_adapter(broker_url), guard) as producer:
            sent = [producer.send(name, b"reading=1").sent,
                    producer.send(name, b"reading=1").sent,    # the same payload: rejected
                    producer.send(name, b"reading=2").sent,    # another payload
                    producer.send(f"{name}.dev", b"on", headers={"device": "a"}).sent,
                    producer.send(f"{name}.dev", b"on", headers={"device": "b"}).sent,
                    producer.send(f"{name}.dev", b"on", headers={"device": "a"}).sent,
                    producer.send(f"{name}.plain", b"same").sent,
                    producer.send(f"{name}.plain", b"same").sent]
        assert sent == [True, False, True, True, True, False, True, True]
        got = collect(broker_url, name, guard, 2)
        dev = collect(broker_url, f"{name}.dev", guard, 2)
        plain = collect(broker_url, f"{name}.plain", guard, 2)
        guard.events.flush()
    assert sorted(m.body for m in got) == [b"reading=1", b"reading=2"]
    # The content id travels as the message's _AMQ_DUPL_ID.
    assert {m.duplicate_id for m in got} == {content_id(b"reading=1", {}),
                                             content_id(b"reading=2", {})}
    assert sorted(m.headers["device"] for m in dev) == ["a", "b"]
    assert [m.body for m in plain] == [b"same", b"same"]
    assert all(m.duplicate_id is None for m in plain)
    assert rejected_ids(tmp_path) == [content_id(b"reading=1", {}),
                                      content_id(b"on", {"device": "a"}, ["device"])]


@pytest.mark.redis
@pytest.mark.mosquitto
def test_wrappers_content_dedup_mqtt(mqguard_mosquitto_server: Any, mqguard_redis_url: str,
                                     tmp_path: Path, mqguard_unique_name: str) -> None:
    """MQTT 5 (topic = address): a producer that sets no id is deduplicated by content,
    and the consumer sees the content id as the _AMQ_DUPL_ID user property."""
    url = mqguard_mosquitto_server.urls["mqtt"]
    name = mqguard_unique_name
    with Guard(parse_config(config_of(tmp_path, mqguard_redis_url, name))) as guard:
        sink = Collector(url, name, guard)
        time.sleep(0.5)  # the subscription is in place before the first publish
        with GuardedProducer(open_adapter(url), guard) as device:
            sent = [device.send(name, body).sent
                    for body in (b"t=21", b"t=21", b"t=22", b"t=21")]
        got = sink.wait(2)
        guard.events.flush()
    assert sent == [True, False, True, False]
    assert sorted(m.body for m in got) == [b"t=21", b"t=22"]
    assert sorted(m.duplicate_id or "" for m in got) == sorted(
        [content_id(b"t=21", {}), content_id(b"t=22", {})])
    assert rejected_ids(tmp_path) == [content_id(b"t=21", {})] * 2


@pytest.fixture
def sidecar(request: pytest.FixtureRequest, tmp_path: Path, mqguard_redis_url: str,
            mqguard_unique_name: str) -> Iterator[SidecarThread]:
    config = parse_config(config_of(tmp_path, mqguard_redis_url, mqguard_unique_name))
    server = request.getfixturevalue(f"mqguard_{request.param}_server")
    with SidecarThread(Sidecar(config, parse_upstream(server.urls["stomp"]),
                               admin=("127.0.0.1", 0))) as running:
        yield running


class Client(stomp.ConnectionListener):  # type: ignore[misc]
    """A stock STOMP client: it sets no _AMQ_DUPL_ID."""

    def __init__(self, port: int) -> None:
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        self.messages.append(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def send(self, queue: str, body: str, **headers: str) -> None:
        receipt = f"r{len(self.receipts)}-{time.monotonic_ns()}"
        self.conn.send(queue, body, receipt=receipt, headers=headers)
        wait_for(lambda: receipt in self.receipts, 10, f"the receipt of {body!r}")

    def drain(self, queue: str, expected: int) -> list[Any]:
        self.messages.clear()
        self.conn.subscribe(queue, id=queue, ack="auto")
        wait_for(lambda: len(self.messages) >= expected, 20, f"{expected} messages")
        time.sleep(1.0)  # a missed duplicate would arrive meanwhile
        self.conn.unsubscribe(id=queue)
        return list(self.messages)


@pytest.mark.redis
@pytest.mark.parametrize("sidecar", SIDECAR_BROKERS, indirect=True)
def test_sidecar_content_dedup(sidecar: SidecarThread, tmp_path: Path,
                               mqguard_unique_name: str) -> None:
    name = mqguard_unique_name
    queue, dev, plain = f"/queue/{name}", f"/queue/{name}.dev", f"/queue/{name}.plain"
    client = Client(sidecar.port)
    try:
        for body in ("reading=1", "reading=1", "reading=2"):
            client.send(queue, body)
        for device in ("a", "b", "a"):
            client.send(dev, "on", device=device)
        client.send(plain, "same")
        client.send(plain, "same")
        got = client.drain(queue, 2)
        got_dev = client.drain(dev, 2)
        got_plain = client.drain(plain, 2)
    finally:
        client.conn.disconnect()
    assert sorted(f.body for f in got) == ["reading=1", "reading=2"]
    assert sorted(f.headers[DUPLICATE_ID_HEADER] for f in got) == sorted(
        [content_id(b"reading=1", {}), content_id(b"reading=2", {})])
    assert sorted(f.headers["device"] for f in got_dev) == ["a", "b"]
    assert [f.body for f in got_plain] == ["same", "same"]
    assert all(DUPLICATE_ID_HEADER not in f.headers for f in got_plain)
    sidecar.sidecar.guard.events.flush()
    assert rejected_ids(tmp_path) == [content_id(b"reading=1", {}),
                                      content_id(b"on", {"device": "a"}, ["device"])]
