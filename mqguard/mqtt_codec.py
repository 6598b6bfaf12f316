"""The MQTT 3.1.1 / 5.0 codec of the native data plane, for Python callers and tests.

Decode a byte stream with :class:`MqttDecoder` (one per direction of a connection; the
client's direction learns the protocol version from CONNECT, the broker's direction is
told it), read fields off :class:`MqttPacket`, and encode with ``packet.encode()`` or the
``mqtt_*`` builders. A packet that was not changed encodes to the octets it came from.
``repr()`` and errors never show a password or authentication data.
"""

from __future__ import annotations

from mqguard_native import (
    MqttCodecError,
    MqttDecoder,
    MqttPacket,
    mqtt_ack,
    mqtt_connect,
    mqtt_publish,
    mqtt_simple,
    mqtt_subscribe,
)

__all__ = [
    "MqttCodecError",
    "MqttDecoder",
    "MqttPacket",
    "decode_all",
    "mqtt_ack",
    "mqtt_connect",
    "mqtt_publish",
    "mqtt_simple",
    "mqtt_subscribe",
]


def decode_all(data: bytes, version: str | None = None) -> list[MqttPacket]:
    """Every packet of ``data``; raises :class:`MqttCodecError` if octets are left over."""
    decoder = MqttDecoder(version)
    packets = decoder.feed(data)
    if decoder.buffered:
        raise MqttCodecError(
            f"malformed packet: {decoder.buffered} octets of an unfinished packet at the end"
        )
    return packets
