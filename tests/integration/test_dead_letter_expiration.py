"""A dead letter never expires out of its dead-letter address, on real brokers.

Artemis gives every copy it moves to a dead-letter (or expiry) address an expiration of
0 (``QueueImpl.makeCopy``; ``Message.referenceOriginalMessage`` resets it as well): the
original's TTL was about the original's delivery, and a dead letter that vanished with it
would be lost. Here a poison message with a short TTL is dead-lettered at once; the dead
letter must still be there after the TTL has passed, through the wrapper (memory and
Redis stores) and through the sidecar, on ActiveMQ and RabbitMQ (which would expire a
copy sent with an ``expiration`` header by itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.events import read_events
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    EXPIRATION_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    Message,
    now_ms,
)
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]
STORES = [pytest.param("memory", id="memory"),
          pytest.param("redis", marks=pytest.mark.redis, id="redis")]

#: The poison message's time to live: long enough to be delivered and dead-lettered
#: inside it, short enough to wait out.
TTL_MS = 2500
#: How long after the TTL the dead letter is looked for (the brokers' own expiry runs on
#: delivery attempts, RabbitMQ's at the queue head: both at once here).
PAST_TTL_S = 1.0


def _settings(address: str) -> dict[str, Any]:
    return {"max-delivery-attempts": 1, "dead-letter-address": f"{address}.DLA",
            "expiry-address": f"{address}.EXP"}


def _core(tmp_path: Path, node: str, store: str) -> dict[str, Any]:
    return {"node-id": node, "store": store,
            "event-log": {"directory": str(tmp_path / node), "flush-interval-ms": 20}}


def _events(guard: Guard, tmp_path: Path, node: str) -> list[dict[str, Any]]:
    guard.events.flush()
    return list(read_events(tmp_path / node))


def _sleep_until(deadline_ms: int) -> None:
    left = (deadline_ms - now_ms()) / 1000
    if left > 0:
        time.sleep(left)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", BROKERS)
def test_wrapper_dead_letter_outlives_the_original_ttl(
        kind: str, store: str, request: pytest.FixtureRequest, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    url = request.getfixturevalue(f"mqguard_{kind}_server").urls["stomp"]
    store_url = request.getfixturevalue("mqguard_redis_url") if store == "redis" else "memory"
    guard = Guard(parse_config({
        "mqguard": _core(tmp_path, "poison", store_url),
        "address-settings": {mqguard_unique_name: _settings(mqguard_unique_name)}})).start()
    failed: list[Message] = []

    def poison(message: Message) -> None:
        failed.append(message)
        raise Nack("poison")

    try:
        with GuardedConsumer(open_adapter(url), mqguard_unique_name, poison, guard), \
                GuardedProducer(open_adapter(url), guard) as producer:
            sent = producer.send(mqguard_unique_name, b"poison", ttl_ms=TTL_MS).message
            assert sent.expiration > 0
            wait_for(lambda: any(e["type"] == "dead_lettered"
                                 for e in _events(guard, tmp_path, "poison")),
                     TTL_MS / 1000, "the dead letter, inside the TTL")
        assert len(failed) == 1
        _sleep_until(sent.expiration + int(PAST_TTL_S * 1000))

        # A guarded consumer of the dead-letter address, with its own expiry address: a
        # dead letter that kept the TTL would be expired there instead of delivered.
        inbox: list[Message] = []
        dla = f"{mqguard_unique_name}.DLA"
        reader = Guard(parse_config({
            "mqguard": _core(tmp_path, "dla-reader", "memory"),
            "address-settings": {dla: {"expiry-address": f"{dla}.EXP"}}})).start()
        try:
            with GuardedConsumer(open_adapter(url), dla, inbox.append, reader):
                wait_for(lambda: inbox, 10, "the dead letter, after the original's TTL")
                time.sleep(0.3)
            kinds = [e["type"] for e in _events(reader, tmp_path, "dla-reader")]
        finally:
            reader.close()
        (dead,) = inbox
        assert dead.body == b"poison"
        assert dead.headers[ORIG_MESSAGE_ID_HEADER] == sent.message_id
        assert dead.expiration == 0 and EXPIRATION_HEADER not in dead.headers
        assert ACTUAL_EXPIRY_HEADER not in dead.headers  # a dead letter, not an expiry
        assert "expired" not in kinds
    finally:
        guard.close()


class Client(stomp.ConnectionListener):  # type: ignore[misc]
    """A plain stomp.py client of the sidecar that records its MESSAGE frames."""

    def __init__(self, port: int) -> None:
        self.frames: list[Any] = []
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        self.frames.append(frame)

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()


@pytest.fixture
def proxy(request: pytest.FixtureRequest, tmp_path: Path, mqguard_unique_name: str
          ) -> Iterator[tuple[str, SidecarThread]]:
    kind = request.param
    dla = f"{mqguard_unique_name}.DLA"
    config = parse_config({
        "mqguard": {**_core(tmp_path, "sidecar", "memory"),
                    "message-expiry-scan-period": -1},
        "address-settings": {mqguard_unique_name: _settings(mqguard_unique_name),
                             dla: {"expiry-address": f"{dla}.EXP"}}})
    server = request.getfixturevalue(f"mqguard_{kind}_server")
    sidecar = Sidecar(config, parse_upstream(server.urls["stomp"]), admin=("127.0.0.1", 0))
    with SidecarThread(sidecar) as running:
        yield kind, running


@pytest.mark.parametrize("proxy", BROKERS, indirect=True)
def test_sidecar_dead_letter_outlives_the_original_ttl(
        proxy: tuple[str, SidecarThread], tmp_path: Path, mqguard_unique_name: str) -> None:
    kind, running = proxy
    client = Client(running.port)
    try:
        queue = f"/queue/{mqguard_unique_name}"
        sent_at = now_ms()
        # Each broker's own way of saying it: ActiveMQ's absolute ``expires``, RabbitMQ's
        # relative ``expiration``.
        ttl = ({"expires": str(sent_at + TTL_MS)} if kind == "activemq"
               else {"expiration": str(TTL_MS)})
        client.conn.send(queue, "poison", headers=ttl, receipt="sent")
        client.conn.subscribe(queue, id="s", ack="client-individual")
        wait_for(lambda: client.frames, TTL_MS / 1000, "the poison message")
        client.conn.nack(client.frames[0].headers["ack"], receipt="nacked")
        wait_for(lambda: any(e["type"] == "dead_lettered"
                             for e in _events(running.sidecar.guard, tmp_path, "sidecar")),
                 TTL_MS / 1000, "the dead letter, inside the TTL")
        client.conn.unsubscribe("s")
        _sleep_until(sent_at + TTL_MS + int(PAST_TTL_S * 1000))

        client.conn.subscribe(f"/queue/{mqguard_unique_name}.DLA", id="d", ack="client-individual")
        wait_for(lambda: len(client.frames) >= 2, 10,
                 "the dead letter, after the original's TTL")
        time.sleep(0.3)
        assert len(client.frames) == 2
        dead = client.frames[1]
        client.conn.ack(dead.headers["ack"])
        assert dead.body == "poison"
        assert dead.headers.get("expires", "0") == "0"
        assert "expiration" not in dead.headers
        assert EXPIRATION_HEADER not in dead.headers
        kinds = [e["type"] for e in _events(running.sidecar.guard, tmp_path, "sidecar")]
        assert "expired" not in kinds
    finally:
        client.close()
