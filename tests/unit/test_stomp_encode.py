"""The STOMP adapter's frame encoding (the native codec): what stomp.py's parser reads back is
what was sent, byte for byte what the adapter's former Python encoder wrote."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Final

import pytest
import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.adapters import stomp as adapter_module
from mqguard.errors import AdapterError
from mqguard.sidecar.frames import FrameError, encode_send
from mqguard.stomp_brokers import RESERVED_SEND_HEADERS

_NAME = st.text(alphabet=st.sampled_from(list("abz-_.é")), min_size=1, max_size=8)
_VALUE = st.text(alphabet=st.sampled_from(list("ab:\\\r\nc-é 0")), max_size=12)
# What the adapter can be given: any text but NUL and lone surrogates (no frame can carry
# them, see test_refuses_what_no_frame_can_carry); names as
# mqguard.stomp_brokers lets them through (no ':', '\\', CR, LF; not reserved).
_ANY_VALUE = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=16)
_ANY_NAME = st.text(st.characters(codec="utf-8", blacklist_characters="\x00:\\\r\n"), min_size=1,
                    max_size=10).filter(lambda name: name not in RESERVED_SEND_HEADERS)

# -- the former Python encoder, kept here only as the reference ------------------------------

_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"})
_NEEDS_ESCAPE: Final = re.compile(r"[\\\r\n:]")


def _reference_encode_send(destination: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    if (_NEEDS_ESCAPE.search("".join(headers.values())) is not None
            or _NEEDS_ESCAPE.search(destination) is not None):
        destination = destination.translate(_ESCAPES)
        headers = {key: value.translate(_ESCAPES) for key, value in headers.items()}
    parts = ["SEND\ndestination:", destination]
    for key, value in headers.items():
        parts += ("\n", key, ":", value)
    if body:
        parts.append(f"\ncontent-length:{len(body)}")
    parts.append("\n\n")
    return b"".join(("".join(parts).encode("utf-8"), body, b"\x00"))


def _read_back(frame: bytes) -> stomp.utils.Frame:
    assert frame.endswith(b"\x00")
    return stomp.utils.parse_frame(frame[:-1])


def test_plain_frame_bytes() -> None:
    frame = encode_send("/queue/a", {"receipt": "r-1", "persistent": "true"}, b"hi")
    assert frame == (b"SEND\ndestination:/queue/a\nreceipt:r-1\npersistent:true\n"
                     b"content-length:2\n\nhi\x00")
    assert encode_send("/queue/a", {}, b"") == b"SEND\ndestination:/queue/a\n\n\x00"


def test_escapes_values_and_destination() -> None:
    frame = encode_send("/queue/a:b", {"k": "line\none\\two:three\r"}, b"\x00x")
    assert b"destination:/queue/a\\cb\n" in frame
    assert b"k:line\\none\\\\two\\cthree\\r\n" in frame
    parsed = _read_back(frame)
    assert parsed.headers == {"destination": "/queue/a:b", "k": "line\none\\two:three\r",
                              "content-length": "2"}
    assert parsed.body == b"\x00x"


@settings(max_examples=300, deadline=None)
@given(destination=_VALUE.map(lambda v: "/queue/" + v), body=st.binary(max_size=20),
       headers=st.dictionaries(_NAME, _VALUE, max_size=6))
def test_round_trips_through_stomp_py(destination: str, body: bytes,
                                      headers: dict[str, str]) -> None:
    headers = {k: v for k, v in headers.items() if k not in ("destination", "content-length")}
    parsed = _read_back(encode_send(destination, headers, body))
    assert parsed.cmd == "SEND"
    expected = {"destination": destination, **headers}
    if body:
        expected["content-length"] = str(len(body))
    assert parsed.headers == expected
    assert parsed.body == body


@settings(max_examples=500, deadline=None)
@given(destination=_ANY_VALUE, body=st.binary(max_size=24),
       headers=st.dictionaries(_ANY_NAME | _NAME, _ANY_VALUE | _VALUE, max_size=8))
def test_same_bytes_as_the_former_python_encoder(destination: str, body: bytes,
                                                 headers: dict[str, str]) -> None:
    assert encode_send(destination, headers, body) == _reference_encode_send(
        destination, body, headers)


def test_refuses_what_no_frame_can_carry() -> None:
    with pytest.raises(FrameError) as nul:
        encode_send("/queue/a", {"k": "a\x00b"}, b"")
    assert nul.value.reason == "NUL in header"
    with pytest.raises(FrameError) as surrogate:
        encode_send("/queue/\ud800", {}, b"x")
    assert surrogate.value.reason == "header not representable"


#: What StompAdapter._write reads of the adapter.
_ADAPTER: Any = SimpleNamespace(where="test")


class _Transport:
    blocking = True

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.writes.append(data)


def test_batch_is_written_with_an_early_first_chunk() -> None:
    frames = [("/queue/a", b"x%d" % i, {"receipt": f"r-{i}"}) for i in range(40)]
    conn = SimpleNamespace(transport=_Transport())
    adapter_module.StompAdapter._write(_ADAPTER, conn, frames)
    writes = conn.transport.writes
    expected = [_reference_encode_send(*frame) for frame in frames]
    # The broker gets the first frames at once, the rest in one more write; nothing is
    # lost, duplicated or reordered, and no frame straddles two writes.
    assert writes == [b"".join(expected[:adapter_module.FIRST_CHUNK_FRAMES]),
                      b"".join(expected[adapter_module.FIRST_CHUNK_FRAMES:])]
    conn.transport.writes.clear()
    adapter_module.StompAdapter._write(_ADAPTER, conn, frames[:10])
    assert conn.transport.writes == [b"".join(expected[:10])]  # small batches: one write


def test_a_header_no_frame_can_carry_is_an_adapter_error() -> None:
    conn = SimpleNamespace(transport=_Transport())
    frames = [("/queue/a", b"x", {"receipt": "r-1"}), ("/queue/a", b"y", {"k": "a\x00b"})]
    with pytest.raises(AdapterError, match="cannot be sent over STOMP: NUL in header"):
        adapter_module.StompAdapter._write(_ADAPTER, conn, frames)
    assert conn.transport.writes == []  # a small batch: nothing was written


def test_ack_and_nack_frames() -> None:
    acks: list[bytes] = []
    others: list[bytes] = []
    conn = SimpleNamespace(transport=SimpleNamespace(blocking=True),
                           mqguard_acks=SimpleNamespace(ack=acks.append, send=others.append))
    write_ack = adapter_module.StompAdapter._write_ack
    write_ack(conn, "ACK", "ID:host-1:42")
    write_ack(conn, "ACK", "t\\1", transaction="tx:1")
    write_ack(conn, "NACK", "ID:7", extra={"requeue": "false"})
    assert acks == [b"ACK\nid:ID\\chost-1\\c42\n\n\x00"]
    assert others == [b"ACK\nid:t\\\\1\ntransaction:tx\\c1\n\n\x00",
                      b"NACK\nid:ID\\c7\nrequeue:false\n\n\x00"]
