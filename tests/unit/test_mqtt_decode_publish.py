"""The MQTT adapter's lean PUBLISH decoder agrees with paho's, or leaves the packet to paho."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.adapters.mqtt import decode_publish_v5

_TEXT = st.text(alphabet=st.sampled_from(list("ab/é\x00\ufeff-=")), max_size=8)


def _packet_bytes(topic: str, mid: int, qos: int, properties: Properties, payload: bytes) -> bytes:
    encoded = topic.encode()
    data = len(encoded).to_bytes(2, "big") + encoded
    if qos:
        data += mid.to_bytes(2, "big")
    return data + bytes(properties.pack()) + payload


def _paho(header: int, data: bytes) -> object:
    try:
        return _packet.decode_publish(header, data, MQTTProtocolVersion.MQTTv5)
    except Exception as exc:  # paho's verdict on a bad packet
        return exc


def _check(header: int, data: bytes) -> bool:
    """Assert agreement; True when the lean decoder took the packet."""
    ours = decode_publish_v5(header, data)
    theirs = _paho(header, data)
    if ours is None:
        return False
    assert not isinstance(theirs, Exception), (data, theirs)
    assert ours.topic == theirs.topic.decode()
    assert (ours.mid, ours.qos, ours.dup, ours.retain) == (theirs.mid, theirs.qos, theirs.dup,
                                                           theirs.retain)
    assert ours.payload == theirs.payload
    for name in ("UserProperty", "MessageExpiryInterval", "PayloadFormatIndicator"):
        assert getattr(ours.properties, name) == getattr(theirs.properties, name, None), name
    return True


def test_guarded_publish_is_decoded_like_paho() -> None:
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("mqguard-id", "abc"), ("k", "v"), ("k", "w")]
    props.MessageExpiryInterval = 30
    props.PayloadFormatIndicator = 1
    data = _packet_bytes("orders/eu", 7, 1, props, b"body")
    assert _check(0x32 | 0x08, data)
    message = decode_publish_v5(0x32, data)
    assert message is not None and message.topic == "orders/eu" and message.mid == 7


def test_other_properties_and_bad_text_go_to_paho() -> None:
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    assert decode_publish_v5(0x32, _packet_bytes("t", 1, 1, props, b"x")) is None
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "a\x00b")]
    data = _packet_bytes("t", 1, 1, props, b"x")
    assert decode_publish_v5(0x32, data) is None
    assert isinstance(_paho(0x32, data), Exception)
    assert decode_publish_v5(0x34, _packet_bytes("t", 1, 2, Properties(PacketTypes.PUBLISH),
                                                 b"")) is None  # QoS 2: paho's
    assert decode_publish_v5(0x32, b"\x00\x05ab") is None  # truncated


@settings(max_examples=150, deadline=None)
@given(_TEXT, st.integers(1, 65535), st.integers(0, 1), st.booleans(), st.booleans(),
       st.lists(st.tuples(_TEXT, _TEXT), max_size=4), st.none() | st.integers(0, 2**32 - 1),
       st.binary(max_size=10), st.integers(0, 6))
def test_same_as_paho(topic: str, mid: int, qos: int, dup: bool, retain: bool,
                      pairs: list[tuple[str, str]], expiry: int | None, payload: bytes,
                      cut: int) -> None:
    props = Properties(PacketTypes.PUBLISH)
    if pairs:
        props.UserProperty = pairs
    if expiry is not None:
        props.MessageExpiryInterval = expiry
    data = _packet_bytes(topic, mid, qos, props, payload)
    header = 0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    _check(header, data)
    _check(header, data[:-cut] if cut else data)  # truncated packets too


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_TEXT, _TEXT, max_size=5), st.none() | st.integers(1, 2**32 - 1))
def test_packed_properties_read_back_by_paho(headers: dict[str, str],
                                             expiry: int | None) -> None:
    from mqguard.adapters.mqtt import _PackedProperties, check_mqtt_string
    from mqguard.errors import AdapterError

    packed = _PackedProperties(headers, expiry)
    refused = 0
    for text in [*headers, *headers.values()]:
        try:
            check_mqtt_string(text, "x")
        except AdapterError:
            refused += 1
    assert packed.invalid == bool(refused)
    if any(c in "".join(headers) + "".join(headers.values()) for c in "\x00\ufeff"):
        return  # paho's reader refuses these
    read = Properties(PacketTypes.PUBLISH)
    read.unpack(packed.pack())
    assert getattr(read, "UserProperty", []) == list(headers.items())
    assert getattr(read, "MessageExpiryInterval", None) == expiry
