"""MqttAdapter against a real Mosquitto 2.0 broker (no mocks)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest
from mqguard_tests.adapter_contract import DeferContract, Inbox
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.adapter import Capabilities, SubscribeOptions
from mqguard.adapters.mqtt import PROPERTY_ERRORS_KEY, MqttAdapter
from mqguard.errors import AdapterError
from mqguard.message import (
    MOVE_REASON_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    Message,
    new_message_id,
    now_ms,
)

pytestmark = pytest.mark.mosquitto

Factory = Callable[..., MqttAdapter]

BINARY_BODY = bytes(range(256)) + b"\x00end"
HEADERS = {"colon": "a:b", "backslash": "c\\d", "unicode": "žluť 🐇", "x-app": "1"}


@pytest.fixture
def mqtt(mqguard_mosquitto_server: Any) -> Iterator[Factory]:
    """MQTT adapters on the session Mosquitto, closed after the test."""
    url = mqguard_mosquitto_server.urls["mqtt"]
    adapters: list[MqttAdapter] = []

    def make(*, connect: bool = True, **options: Any) -> MqttAdapter:
        options.setdefault("broker", "mosquitto")
        options.setdefault("connect_timeout", 5.0)
        options.setdefault("publish_timeout", 5.0)
        adapter = MqttAdapter(url, **options)
        adapters.append(adapter)
        if connect:
            adapter.connect()
        return adapter

    yield make
    for adapter in adapters:
        adapter.close()


@pytest.fixture
def address(mqguard_unique_name: str) -> str:
    """A two-level address: ``mqg-<test>-<id>.orders`` is the topic ``mqg-.../orders``."""
    return f"{mqguard_unique_name}.orders"


def test_mqtt5_round_trip_with_user_properties_and_guard_headers(
        mqtt: Factory, address: str) -> None:
    consumer = mqtt()
    assert consumer.broker == "mosquitto"
    assert consumer.capabilities == Capabilities(native_ttl=True, persistent=True,
                                                 expiry_reaping="native-drop")
    inbox = Inbox()
    sub_id = consumer.subscribe(address, inbox)

    sent = Message(address, BINARY_BODY, headers=dict(HEADERS), message_id=new_message_id(),
                   duplicate_id="dup-1", producer_id="p", sequence=3,
                   expiration=now_ms() + 60_000)
    mqtt().send(sent)

    (delivery,) = inbox.wait_for(1)
    got = delivery.message
    assert got.address == address
    assert delivery.raw_headers["mqtt-topic"] == address.replace(".", "/")
    assert got.body == BINARY_BODY
    assert got.headers == HEADERS
    assert (got.message_id, got.duplicate_id, got.producer_id, got.sequence, got.expiration) == (
        sent.message_id, "dup-1", "p", 3, sent.expiration)
    assert 59 <= int(delivery.raw_headers["message-expiry-interval"]) <= 60
    assert delivery.subscription_id == sub_id
    assert delivery.redelivered is False
    mid, qos, _connection = delivery.ack_token
    assert qos == 1 and mid > 0
    assert consumer.can_settle(delivery)
    consumer.ack(delivery)



def test_a_batch_wakes_the_network_thread_twice_and_arrives_whole(
        mqtt: Factory, address: str) -> None:
    consumer = mqtt()
    inbox = Inbox()

    def acking(delivery: Any) -> None:
        inbox(delivery)
        consumer.ack(delivery)  # the broker holds back more than 20 unacknowledged

    consumer.subscribe(address, acking)
    producer = mqtt()
    client = producer._client
    wakes = 0
    pair = client._sockpairW
    real_send = pair.send

    class CountingPair:
        def send(self, data: bytes) -> int:
            nonlocal wakes
            wakes += 1
            return real_send(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(pair, name)

    client._sockpairW = CountingPair()
    try:
        producer.send_many([Message(address, b"%d" % i) for i in range(50)])
    finally:
        client._sockpairW = pair
    # paho wakes its network thread once per publish; a batch does it for its first
    # PUBLISH and once at its end -- and still every message is published and confirmed.
    assert wakes == 2
    got = inbox.wait_for(50)
    assert sorted(int(d.message.body) for d in got) == list(range(50))


# -- threads: callbacks inline on paho's network thread, blocking work through defer() ------------

def test_callbacks_run_inline_on_the_delivery_thread(mqtt: Factory, address: str) -> None:
    adapter = mqtt()
    inbox = Inbox()
    seen: list[tuple[bool, str]] = []

    def callback(delivery: Any) -> None:
        seen.append((adapter.on_delivery_thread(), threading.current_thread().name))
        adapter.ack(delivery)  # never waits: fine inline
        inbox(delivery)

    assert adapter.on_delivery_thread() is False
    adapter.subscribe(address, callback)
    mqtt().send_many([Message(address, str(i).encode()) for i in range(5)])
    assert [d.message.body for d in inbox.wait_for(5)] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(inline for inline, _ in seen)
    names = {name for _, name in seen}
    assert len(names) == 1  # one thread, in arrival order
    assert names.pop().startswith("paho-mqtt-client-")
    assert adapter.on_delivery_thread() is False


def test_blocking_calls_in_a_callback_raise_at_once_and_defer_can_send(
        mqtt: Factory, address: str) -> None:
    # Only the network thread reads PUBACKs and SUBACKs: a callback waiting for one would
    # deadlock, so the adapter refuses at once; the guard moves messages (send a copy, ack the
    # original) through defer(), whose jobs run on the dispatcher thread and may wait.
    client_id = f"consumer-{uuid.uuid4().hex[:8]}"
    adapter = mqtt(client_id=client_id, publish_timeout=3.0)
    moved_address = f"{address}.moved"
    moved = Inbox()
    adapter.subscribe(moved_address, moved)
    calls: dict[str, Callable[[], object]] = {
        "send": lambda: adapter.send(Message(moved_address, b"direct")),
        "send_many": lambda: adapter.send_many([Message(moved_address, b"direct")]),
        "subscribe": lambda: adapter.subscribe(f"{address}.other", Inbox()),
    }

    contract = DeferContract(adapter, calls, lambda body: Message(moved_address, body))
    adapter.subscribe(address, contract)
    mqtt().send_many([Message(address, b"m1"), Message(address, b"m2")])
    contract.check(moved, [b"m1", b"m2"])
    for delivery in moved.deliveries:
        adapter.ack(delivery)
    adapter.close()

    # The deferred acks went through: the resumed session resends nothing.
    again = mqtt(client_id=client_id)
    resent = Inbox()
    again.subscribe(address, resent)
    assert resent.quiet(0.5) == []


def test_unsubscribe_and_close_in_a_callback_do_not_wait(mqtt: Factory, address: str) -> None:
    client_id = f"consumer-{uuid.uuid4().hex[:8]}"
    adapter = mqtt(client_id=client_id)
    inbox = Inbox()
    timings: dict[str, float] = {}

    def callback(delivery: Any) -> None:
        adapter.ack(delivery)
        started = time.monotonic()
        adapter.unsubscribe(sub_id)
        timings["unsubscribe"] = time.monotonic() - started
        started = time.monotonic()
        adapter.close()
        timings["close"] = time.monotonic() - started
        inbox(delivery)

    sub_id = adapter.subscribe(address, callback)
    mqtt().send_many([Message(address, b"first"), Message(address, b"second")])
    assert [d.message.body for d in inbox.wait_for(1)] == [b"first"]
    assert [d.message.body for d in inbox.quiet(0.3)] == [b"first"]
    assert timings["unsubscribe"] < 1.0 and timings["close"] < 1.0, timings
    assert not adapter.connected
    with pytest.raises(AdapterError, match="closed"):
        adapter.defer(lambda: None)

    # "first" was acked before the DISCONNECT: the resumed session does not resend it.
    again = mqtt(client_id=client_id)
    resent = Inbox()
    again.subscribe(address, resent)
    assert b"first" not in [d.message.body for d in resent.quiet(0.5)]


def test_dispatch_thread_option_lets_callbacks_send(mqtt: Factory, address: str) -> None:
    # The old behaviour, kept as an option: callbacks on the dispatcher thread may wait.
    adapter = mqtt(publish_timeout=3.0, dispatch_thread=True)
    moved = Inbox()
    adapter.subscribe(f"{address}.moved", moved)
    inline: list[bool] = []

    def move(delivery: Any) -> None:
        inline.append(adapter.on_delivery_thread())
        adapter.send(Message(f"{address}.moved", delivery.message.body))
        adapter.ack(delivery)

    adapter.subscribe(address, move)
    adapter.send_many([Message(address, b"m1"), Message(address, b"m2")])
    assert [d.message.body for d in moved.wait_for(2)] == [b"m1", b"m2"]
    assert inline == [False, False]


def test_control_characters_are_refused_before_they_reach_the_broker(
        mqtt: Factory, address: str) -> None:
    # Mosquitto drops the connection on a newline in a user property ("Malformed UTF-8"), and
    # paho would resend that PUBLISH after every reconnect: refuse it up front.
    adapter = mqtt()
    with pytest.raises(AdapterError, match="U\\+000A"):
        adapter.send(Message(address, b"x", headers={"newline": "l1\nl2"}))
    with pytest.raises(AdapterError, match="U\\+0000"):
        adapter.send(Message(address + "\x00", b"x"))
    adapter.send(Message(address, b"fine"))  # the connection is intact


def test_unacked_message_is_redelivered_to_the_same_session(mqtt: Factory, address: str) -> None:
    client_id = f"consumer-{uuid.uuid4().hex[:8]}"
    first = mqtt(client_id=client_id)
    inbox = Inbox()
    first.subscribe(address, inbox)
    producer = mqtt()
    kept, acked, nacked = (Message(address, body, message_id=new_message_id())
                           for body in (b"unacked", b"acked", b"nacked"))
    producer.send_many([kept, acked, nacked])
    d_kept, d_acked, d_nacked = inbox.wait_for(3)
    first.ack(d_acked)
    first.nack(d_nacked)  # MQTT cannot give it back: it just stays unacknowledged
    first.close()

    # Same client id, clean_start False: the broker resumes the session and resends the two
    # unacked messages at once -- possibly before subscribe() is called; the adapter holds them.
    second = mqtt(client_id=client_id)
    assert second.session_present
    again = Inbox()
    second.subscribe(address, again)
    redelivered = again.wait_for(2)
    assert sorted(d.message.body for d in redelivered) == [b"nacked", b"unacked"]
    assert all(d.redelivered for d in redelivered)  # DUP flag
    assert {d.message.message_id for d in redelivered} == {kept.message_id, nacked.message_id}
    for delivery in redelivered:
        second.ack(delivery)
    second.close()

    third = mqtt(client_id=client_id)
    nothing = Inbox()
    third.subscribe(address, nothing)
    assert nothing.quiet(0.5) == []


def test_message_expiry_interval_is_honoured(mqtt: Factory, address: str) -> None:
    client_id = f"offline-{uuid.uuid4().hex[:8]}"
    offline = mqtt(client_id=client_id)
    offline.subscribe(address, Inbox())
    offline.close()  # the session (and its subscription) stays on the broker

    producer = mqtt()
    producer.send_many([
        Message(address, b"already-expired", expiration=now_ms() - 5_000),  # sent with 1 s
        Message(address, b"one-second", expiration=now_ms() + 500),  # rounded up to 1 s
        Message(address, b"forever"),
    ])
    time.sleep(2.1)

    back = mqtt(client_id=client_id)
    inbox = Inbox()
    back.subscribe(address, inbox)
    assert [d.message.body for d in inbox.wait_for(1)] == [b"forever"]
    assert [d.message.body for d in inbox.quiet(0.3)] == [b"forever"]


def test_oversized_malformed_and_duplicate_user_properties_are_skipped(
        mqtt: Factory, mqguard_mosquitto_server: Any, address: str) -> None:
    consumer = mqtt(max_property_bytes=32, max_user_properties=4)
    inbox = Inbox()
    consumer.subscribe(address, inbox)

    raw = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    raw.connect("127.0.0.1", mqguard_mosquitto_server.port("mqtt"))
    raw.loop_start()
    try:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("ok", "1"), ("big", "x" * 100), ("ok", "2"), ("fine", "y"),
                              ("beyond", "the count limit")]
        raw.publish(address.replace(".", "/"), b"odd", qos=1,
                    properties=props).wait_for_publish(5)
    finally:
        raw.disconnect()
        raw.loop_stop()

    (delivery,) = inbox.wait_for(1)
    assert delivery.message.headers == {"ok": "1", "fine": "y"}
    problems = delivery.raw_headers[PROPERTY_ERRORS_KEY]
    assert "beyond the limit of 4" in problems
    assert "longer than 32 bytes" in problems
    assert "duplicate user property 'ok'" in problems
    consumer.ack(delivery)


def test_mqtt311_refuses_headers_but_carries_plain_messages(mqtt: Factory, address: str) -> None:
    consumer = mqtt(protocol="3.1.1")
    assert consumer.capabilities.native_ttl is False
    inbox = Inbox()
    consumer.subscribe(address, inbox)
    with pytest.raises(AdapterError, match=r"MQTT 3\.1\.1, which has no properties"):
        consumer.send(Message(address, b"x", message_id=new_message_id()))
    consumer.send(Message(address, b"plain"))
    (delivery,) = inbox.wait_for(1)
    assert (delivery.message.body, delivery.message.headers) == (b"plain", {})
    consumer.ack(delivery)
    # The guard's dead-letter copy: what its properties would say goes into the topic.
    moved = {ORIG_ADDRESS_HEADER: "plant.line-1", MOVE_REASON_HEADER: "poison",
             ORIG_DELIVERY_COUNT_HEADER: "3"}
    dead = Inbox()
    consumer.subscribe(f"{address}.DLA.#", dead)
    consumer.send(Message(f"{address}.DLA", b"dead", headers=moved,
                          message_id=new_message_id()))
    (letter,) = dead.wait_for(1)
    topic = address.replace(".", "/")
    assert letter.raw_headers["mqtt-topic"] == f"{topic}/DLA/3/plant/line-1"
    assert (letter.message.body, letter.message.headers) == (b"dead", {})
    consumer.ack(letter)
    # Any other copy with an original address (a dlq retry's, say) is refused as before.
    with pytest.raises(AdapterError, match=r"MQTT 3\.1\.1, which has no properties"):
        consumer.send(Message(f"{address}.DLA", b"x",
                              headers={ORIG_ADDRESS_HEADER: "plant.line-1"}))


def test_unsupported_operations_raise_adapter_error(mqtt: Factory, address: str) -> None:
    idle = mqtt(connect=False)
    with pytest.raises(AdapterError, match="connect\\(\\) has not been called"):
        idle.send(Message(address, b"x"))
    adapter = mqtt()
    with pytest.raises(AdapterError, match="no transactions"):
        adapter.begin()
    with pytest.raises(AdapterError, match="no transactions"):
        adapter.send(Message(address, b"x"), transaction="t")
    with pytest.raises(AdapterError, match="wildcards"):
        adapter.send(Message(f"{address}.#", b"x"))
    with pytest.raises(AdapterError):
        adapter.subscribe(address, Inbox(), SubscribeOptions(selector="a = 1"))
    with pytest.raises(AdapterError, match="cannot connect") as info:
        MqttAdapter("mqtt://user:s3cr3t@127.0.0.1:1", connect_timeout=1.0).connect()
    assert "s3cr3t" not in str(info.value)
