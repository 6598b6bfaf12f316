"""The MQTT sidecar's message mapping (pure logic: no broker)."""

from __future__ import annotations

from mqguard.adapter import Delivery
from mqguard.message import DUPLICATE_ID_HEADER, ORIG_ADDRESS_HEADER, Message, now_ms
from mqguard.mqtt_sidecar.leg import DeliveryToken, MqttLeg, Publications
from mqguard.mqtt_sidecar.messages import (
    MqttMessage,
    content_message_id,
    delivery_message,
    expiry_interval,
    send_message,
    user_properties,
)


def mqtt(topic: str = "a/b", payload: bytes = b"p", user: list[tuple[str, str]] | None = None,
         expiry: int | None = None, dup: bool = False) -> MqttMessage:
    return MqttMessage(topic, 1, False, dup, 7, user or [], expiry, payload)


def test_send_message_maps_topic_headers_and_expiry() -> None:
    before = now_ms()
    message = send_message(mqtt(user=[(DUPLICATE_ID_HEADER, "d1"), ("k", "1"), ("k", "2")],
                                expiry=10))
    assert message.address == "a.b"
    assert message.duplicate_id == "d1"
    assert message.headers == {"k": "1"}  # the first value of a name wins
    assert before + 10_000 <= message.expiration <= now_ms() + 10_000


def test_delivery_message_id_is_the_guards_or_the_contents() -> None:
    guarded = delivery_message(mqtt(user=[("mqguard-id", "X" * 20 + ".5")]))
    assert guarded.message_id == "X" * 20 + ".5"
    assert (guarded.producer_id, guarded.sequence) == ("X" * 20, 5)
    one, again = delivery_message(mqtt(dup=False)), delivery_message(mqtt(dup=True))
    assert one.message_id == again.message_id and one.message_id.startswith("content:")
    assert delivery_message(mqtt(topic="a/c")).message_id != one.message_id
    # A 3.1.1 client's send takes the same id (the audit pairs send and delivery).
    assert content_message_id(mqtt()) == one.message_id


def test_expiry_interval_rounds_up_and_never_reaches_zero() -> None:
    assert expiry_interval(0) is None
    assert expiry_interval(10_001, at_ms=0) == 11
    assert expiry_interval(5, at_ms=10) == 1  # already expired: the minimum


def test_user_properties_adds_only_what_the_publish_lacks() -> None:
    message = Message("a.b", b"", {"k": "v"}, message_id="m1", duplicate_id="d1")
    assert user_properties(message, [("k", "v"), (DUPLICATE_ID_HEADER, "d1")]) == [
        ("mqguard-id", "m1")]


class _Plane:
    def __init__(self) -> None:
        self.acks: list[tuple[int, int, int]] = []

    def ack(self, conn: int, packet_id: int, qos: int) -> bool:
        self.acks.append((conn, packet_id, qos))
        return True


def test_leg_acks_once_and_not_what_the_client_acknowledged() -> None:
    plane = _Plane()
    leg = MqttLeg(plane, 3, level=5, broker="mosquitto",  # type: ignore[arg-type]
                  publications=Publications(), jobs=None)  # type: ignore[arg-type]
    mine = Delivery(Message("a"), "c", DeliveryToken(9, 1))
    clients = Delivery(Message("a"), "c", DeliveryToken(10, 2, acked=True))
    leg.ack(mine)
    leg.ack(mine)
    leg.ack(clients)
    assert plane.acks == [(3, 9, 1)]
    assert not leg.can_settle(mine)


def test_dead_letter_topic_of_mqtt311_carries_count_and_original_topic() -> None:
    leg = MqttLeg(_Plane(), 1, level=4, broker="mqtt",  # type: ignore[arg-type]
                  publications=Publications(), jobs=None)  # type: ignore[arg-type]
    copy = Message("DLQ.mqtt", headers={ORIG_ADDRESS_HEADER: "plant.line-1",
                                        "mqguard-orig-delivery-count": "3"})
    assert leg.topic_of(copy) == "DLQ/mqtt/3/plant/line-1"
    v5 = MqttLeg(_Plane(), 1, level=5, broker="mqtt",  # type: ignore[arg-type]
                 publications=Publications(), jobs=None)  # type: ignore[arg-type]
    assert v5.topic_of(copy) == "DLQ/mqtt"


def test_cli_refuses_stomp_only_options_and_bad_upstreams() -> None:
    from click.testing import CliRunner

    from mqguard.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["sidecar", "--protocol", "mqtt", "--upstream",
                                  "mqtt://127.0.0.1:1883", "--reap", "q"])
    assert result.exit_code == 2 and "--reap: STOMP sidecar only" in result.output
    result = runner.invoke(main, ["sidecar", "--protocol", "mqtt", "--upstream",
                                  "mqtt://user:secret@127.0.0.1:1883"])
    assert result.exit_code == 1 and "takes no credentials" in result.output
    assert "secret" not in result.output


def test_parse_mqtt_upstream() -> None:
    import pytest

    from mqguard.errors import ConfigError
    from mqguard.mqtt_sidecar.server import parse_mqtt_upstream

    assert parse_mqtt_upstream("mqtt://h") == ("h", 1883, "mqtt", False)
    assert parse_mqtt_upstream("mqtts://h?broker=rabbitmq") == ("h", 8883, "rabbitmq", True)
    assert parse_mqtt_upstream("mqtt://h:1") == ("h", 1, "mqtt", False)
    for bad in ("stomp://h:1", "mqtt://h?broker=kafka", "mqtt://:1"):
        with pytest.raises(ConfigError):
            parse_mqtt_upstream(bad)
