"""The MQTT codec's Python face: decode, field access, encode, errors, redaction."""

from __future__ import annotations

import pytest

from mqguard.mqtt_codec import (
    MqttCodecError,
    MqttDecoder,
    decode_all,
    mqtt_ack,
    mqtt_connect,
    mqtt_publish,
    mqtt_simple,
    mqtt_subscribe,
)


def test_publish_v5_round_trip_keeps_user_properties_in_order() -> None:
    packet = mqtt_publish(
        "a/b",
        b"hello",
        qos=1,
        packet_id=7,
        retain=True,
        properties=[
            ("user_property", ("_AMQ_DUPL_ID", "x1")),
            ("message_expiry_interval", 30),
            ("user_property", ("k", "v")),
        ],
    )
    wire = packet.encode()
    [decoded] = decode_all(wire, "5")
    assert decoded == packet
    assert (decoded.type, decoded.topic, decoded.qos, decoded.packet_id) == ("PUBLISH", "a/b", 1, 7)
    assert decoded.retain is True and decoded.dup is False
    assert decoded.payload == b"hello"
    assert decoded.user_properties == [("_AMQ_DUPL_ID", "x1"), ("k", "v")]
    assert decoded.message_expiry_interval == 30
    assert decoded.encode() == wire


def test_any_split_gives_the_same_packets() -> None:
    stream = b"".join(
        p.encode()
        for p in (
            mqtt_connect(
                "dev-1",
                version="3.1.1",
                username="u",
                password=b"pw",
                will={"topic": "last/will", "payload": b"bye", "qos": 1},
            ),
            mqtt_subscribe(1, [("a/#", 1)], version="3.1.1"),
            mqtt_publish("a/b", b"x" * 300, qos=2, packet_id=2, version="3.1.1"),
            mqtt_ack("PUBREL", 2, version="3.1.1"),
            mqtt_simple("PINGREQ", version="3.1.1"),
            mqtt_simple("DISCONNECT", version="3.1.1"),
        )
    )
    whole = decode_all(stream)
    assert [p.type for p in whole] == [
        "CONNECT",
        "SUBSCRIBE",
        "PUBLISH",
        "PUBREL",
        "PINGREQ",
        "DISCONNECT",
    ]
    assert (
        whole[0].version == "3.1.1"
        and whole[0].will_topic == "last/will"
        and whole[0].will_qos == 1
    )
    for step in (1, 2, 7, 100):
        decoder = MqttDecoder()
        split = [p for i in range(0, len(stream), step) for p in decoder.feed(stream[i : i + step])]
        assert split == whole
        assert decoder.version == "3.1.1"


def test_credentials_never_in_repr_or_errors() -> None:
    connect = mqtt_connect(
        "c",
        username="alice",
        password=b"hunter2",
        properties=[("authentication_method", "PLAIN"), ("authentication_data", b"topsecret")],
    )
    [decoded] = decode_all(connect.encode())
    assert decoded.password == b"hunter2" and decoded.username == "alice"
    for text in (repr(connect), repr(decoded), str(decoded)):
        assert "hunter2" not in text and "alice" not in text and "topsecret" not in text
    truncated = connect.encode()[:-3]
    fixed = bytes([truncated[0], len(truncated) - 2]) + truncated[2:]
    with pytest.raises(MqttCodecError) as caught:
        decode_all(fixed)
    assert "hunter" not in str(caught.value) and "password" in str(caught.value)
    assert caught.value.kind == "malformed" and caught.value.reason_code == 0x81


def test_packet_size_refused_from_the_fixed_header() -> None:
    decoder = MqttDecoder("5", max_packet_bytes=1024)
    decoder.feed(mqtt_simple("PINGREQ").encode())
    with pytest.raises(MqttCodecError) as caught:
        decoder.feed(b"\xc0\x00\x30\x80\x80\x40")  # a PINGREQ, then a 1 MiB PUBLISH header
    assert caught.value.kind == "too-large" and caught.value.reason_code == 0x95
    assert [p.type for p in caught.value.packets] == ["PINGREQ"]
    with pytest.raises(MqttCodecError):
        decoder.feed(b"\xc0\x00")  # a failed stream stays failed


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x30\x05\x00\x03a\x00b", r"U\+0000"),
        (b"\x30\x05\x00\x03a\xffb", "UTF-8"),
        (b"\x36\x00", "QoS 3"),
        (b"\x82\x06\x00\x01\x00\x01#\x03", "options"),
        (b"\x40\x02\x00\x00", "identifier 0"),
    ],
)
def test_errors_name_the_problem(data: bytes, words: str) -> None:
    with pytest.raises(MqttCodecError, match=words):
        decode_all(data, "3.1.1")


def test_builders_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="takes an int"):
        mqtt_publish("a", b"", properties=[("message_expiry_interval", "soon")])
    with pytest.raises(ValueError, match="unknown MQTT 5 property"):
        mqtt_publish("a", b"", properties=[("no_such", 1)])
    with pytest.raises(MqttCodecError, match="packet identifier"):
        mqtt_publish("a", b"", qos=1).encode()
    with pytest.raises(MqttCodecError, match=r"3\.1\.1"):
        mqtt_ack("PUBACK", 1, reason_code=0x10, version="3.1.1").encode()
    assert mqtt_ack("PUBACK", 1, reason_code=0x10).encode() == b"\x40\x03\x00\x01\x10"
