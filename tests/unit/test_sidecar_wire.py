"""Relaying frames as received (Frame.wire) and the encoder's fast path (sidecar codec)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mqguard_tests.frame_strategies import BODY, COMMAND, PROPERTY, TEXT, decoded_form, frames

from mqguard.sidecar.frames import (
    _UNESCAPED_COMMANDS,
    MAX_WIRE_KEPT,
    STOMP_VERSIONS,
    Frame,
    FrameDecoder,
    FrameError,
    _encode_checked,
    encode,
    wire_of,
)

NAMES = st.sampled_from(["receipt", "ack", "destination", "content-length", "x"]) | TEXT


def _decode_one(data: bytes, version: str) -> Frame:
    (frame,) = FrameDecoder(version=version).feed(data)
    assert isinstance(frame, Frame)
    return frame


@pytest.mark.parametrize("version", STOMP_VERSIONS)
@PROPERTY
@given(command=COMMAND, headers=st.lists(st.tuples(TEXT, TEXT), max_size=5), body=BODY)
def test_property_fast_encoding_is_the_checked_one(version, command, headers, body):
    """Whatever the fast path encodes, header by header encoding gives the same octets; what
    that refuses, encode() refuses too."""
    escaped = version != "1.0" and command not in _UNESCAPED_COMMANDS
    try:
        expected = _encode_checked(command, headers, body, version, escaped)
    except FrameError as exc:
        with pytest.raises(FrameError) as raised:
            encode(Frame(command, headers, body), version)
        assert raised.value.reason == exc.reason
        return
    assert encode(Frame(command, headers, body), version) == expected


@pytest.mark.parametrize("version", STOMP_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_property_wire_is_the_received_frame(version, data):
    """A decoded frame keeps its octets; decoded again they give the same frame, also after
    a header was removed (cut out of the octets, or the octets dropped)."""
    frame = data.draw(frames(version))
    encoded = encode(frame, version)
    crlf = data.draw(st.booleans())
    if crlf and version != "1.0":
        # The same frame with CRLF line ends (the decoder accepts them in every version).
        head, sep, rest = encoded.partition(b"\n\n")
        encoded = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest if sep else encoded
    decoded = _decode_one(encoded, version)
    assert decoded.wire == encoded
    assert wire_of(decoded, version) == encoded
    name = data.draw(NAMES)
    decoded.remove(name)
    assert all(key != name for key, _ in decoded.headers)
    if decoded.wire is not None:
        assert _decode_one(decoded.wire, version) == decoded
    # Encoded again when the octets went: a body holding a NUL gets its content-length back.
    assert _decode_one(wire_of(decoded, version), version) == decoded_form(decoded)


def test_remove_cuts_the_line_out_of_the_octets():
    raw = b"MESSAGE\r\nsubscription:1\r\nreceipt:mqguard-r-7\r\nmessage-id:ID\\cx\r\n\r\nhi\0"
    frame = _decode_one(raw, "1.2")
    frame.remove("receipt")
    assert frame.wire == b"MESSAGE\r\nsubscription:1\r\nmessage-id:ID\\cx\r\n\r\nhi\0"
    frame.remove("not-there")
    assert frame.wire is not None  # nothing removed, octets still valid
    frame.set("subscription", "2")
    assert frame.wire is None  # set() rewrites: the frame is encoded again


def test_repeated_header_is_not_cut_but_encoded():
    frame = _decode_one(b"MESSAGE\nreceipt:a\nreceipt:b\nx:y\n\n\0", "1.2")
    frame.remove("receipt")
    assert frame.wire is None
    assert wire_of(frame, "1.2") == b"MESSAGE\nx:y\n\n\0"


def test_ambiguous_content_length_is_never_relayed_as_received():
    """Two content-lengths: the proxy read the first; a peer reading the last would see other
    frame boundaries (smuggling), so the frame is encoded again with the first one only."""
    frame = _decode_one(b"MESSAGE\ncontent-length:4\ncontent-length:2\n\nbody\0", "1.2")
    assert frame.wire is None
    assert wire_of(frame, "1.2") == b"MESSAGE\ncontent-length:4\n\nbody\0"


def test_big_frames_do_not_keep_their_octets():
    body = b"x" * MAX_WIRE_KEPT
    frame = _decode_one(b"MESSAGE\nsubscription:1\n\n" + body + b"\0", "1.2")
    assert frame.body == body and frame.wire is None
    small = _decode_one(b"MESSAGE\n\n" + body[:100] + b"\0", "1.2")
    assert small.wire is not None
