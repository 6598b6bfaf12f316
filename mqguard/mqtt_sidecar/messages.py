"""MQTT messages as the guard sees them, and back.

A PUBLISH crosses from the native plane as plain data (:class:`MqttMessage`). Its topic
``a/b`` is the guard's address ``a.b`` (as the MQTT adapter maps it); its MQTT 5 user
properties are its headers (the first value of a name wins, as in the adapter); its
Message Expiry Interval is its expiration.

A dead letter published over MQTT 3.1.1, which has no user properties, carries its
original topic and delivery count in its topic instead: ``<dead-letter topic>/<count>/<original
topic>`` (:func:`dead_letter_topic`, read back by :func:`split_dead_letter_topic`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from mqguard.digest import content_id
from mqguard.message import Message, now_ms

__all__ = ["MESSAGE_TOPIC_HEADER", "MqttMessage", "address_to_topic", "content_message_id",
           "dead_letter_filter", "dead_letter_topic", "delivery_message", "expiry_interval",
           "send_message", "split_dead_letter_topic", "topic_content_id", "topic_to_address",
           "user_properties"]

#: The header (name) that puts the topic into a content id of a message without one.
MESSAGE_TOPIC_HEADER: Final = "mqtt-topic"


@dataclass(frozen=True, slots=True)
class MqttMessage:
    """One PUBLISH: what the plane reports of it."""

    topic: str
    qos: int
    retain: bool
    dup: bool
    #: Its packet id on the leg it came from (0 at QoS 0).
    packet_id: int
    user: list[tuple[str, str]]
    #: MQTT 5 Message Expiry Interval in seconds, if it has one.
    expiry: int | None
    payload: bytes

    @classmethod
    def from_tuple(cls, item: tuple[str, int, bool, bool, int, list[tuple[str, str]],
                                    int | None, bytes]) -> MqttMessage:
        return cls(*item)


def topic_to_address(topic: str) -> str:
    """``orders/eu`` -> ``orders.eu``."""
    return topic.replace("/", ".")


def address_to_topic(address: str) -> str:
    """``orders.eu`` -> ``orders/eu``."""
    return address.replace(".", "/")


def dead_letter_topic(dla_topic: str, count: int | str, original_topic: str) -> str:
    """The topic of an MQTT 3.1.1 dead letter: ``<dla topic>/<count>/<original topic>``."""
    return f"{dla_topic}/{count}/{original_topic}"


def dead_letter_filter(dla_address: str) -> str:
    """The address (topic filter ``<dla topic>/+/#``) that takes the MQTT 3.1.1 dead letters
    of ``dla_address``, beside the address itself, which takes the MQTT 5 ones."""
    return f"{dla_address}.+.#"


def split_dead_letter_topic(topic: str, dla_topic: str) -> tuple[int, str] | None:
    """The delivery count and original topic that ``topic``, read from ``dla_topic`` or
    below it, encodes (:func:`dead_letter_topic`); None for any other topic (the dead-letter
    topic itself, or one under it that some other client published to)."""
    prefix = dla_topic + "/"
    if not topic.startswith(prefix):
        return None
    count, _, original = topic[len(prefix):].partition("/")
    # ASCII digits only: str.isdigit() also takes other scripts' digits, which int() reads.
    if not original or not count or not all("0" <= ch <= "9" for ch in count):
        return None
    return int(count), original


def _headers(user: list[tuple[str, str]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in user:
        headers.setdefault(name, value)
    return headers


def _expiration(mqtt: MqttMessage, received_ms: int) -> int:
    return received_ms + mqtt.expiry * 1000 if mqtt.expiry is not None else 0


def send_message(mqtt: MqttMessage) -> Message:
    """The guard's message for a client's PUBLISH."""
    message = Message.from_wire(topic_to_address(mqtt.topic), mqtt.payload, _headers(mqtt.user))
    expiration = _expiration(mqtt, now_ms())
    if expiration:
        message.expiration = expiration
    return message


def topic_content_id(topic: str, payload: bytes) -> str:
    """The content id of a payload published to ``topic`` (see :func:`content_message_id`)."""
    return content_id(payload, {MESSAGE_TOPIC_HEADER: topic}, (MESSAGE_TOPIC_HEADER,))


def content_message_id(mqtt: MqttMessage) -> str:
    """The message id of a PUBLISH that cannot carry the guard's: from its topic and payload.

    A delivery without ``mqguard-id`` gets it, and so does an MQTT 3.1.1 client's send
    (nothing can carry an id to the broker), so the audit meets the same id at both ends.
    """
    return topic_content_id(mqtt.topic, mqtt.payload)


def delivery_message(mqtt: MqttMessage) -> Message:
    """The guard's message for a PUBLISH the broker delivers.

    One sent through the sidecar over MQTT 5 carries its mqguard id; any other (MQTT
    3.1.1, or published around the sidecar) gets an id from its topic and payload, so the
    broker's redelivery of it is recognised as the same message.
    """
    message = Message.from_wire(topic_to_address(mqtt.topic), mqtt.payload, _headers(mqtt.user))
    if not message.message_id:
        message.message_id = content_message_id(mqtt)
    expiration = _expiration(mqtt, now_ms())
    if expiration and (not message.expiration or expiration < message.expiration):
        message.expiration = expiration
    return message


def expiry_interval(expiration: int, at_ms: int | None = None) -> int | None:
    """The Message Expiry Interval (whole seconds, rounded up, at least 1) of an absolute
    expiration; None for a message that never expires."""
    if not expiration:
        return None
    remaining = expiration - (now_ms() if at_ms is None else at_ms)
    return max(1, min(0xFFFFFFFF, math.ceil(remaining / 1000)))


def user_properties(message: Message, existing: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The guard's wire headers of ``message`` that the PUBLISH does not carry yet."""
    have = {name for name, _ in existing}
    return [(name, value) for name, value in message.wire_headers().items() if name not in have]
