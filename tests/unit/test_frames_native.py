"""The native codec's Python face: what the classes of mqguard_native owe Python callers."""

from __future__ import annotations

import copy
import pickle

import mqguard_native
import pytest

from mqguard.errors import MqguardError
from mqguard.sidecar.frames import (
    HEARTBEAT,
    SERVER_COMMANDS,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    Oversized,
    encode,
    wire_of,
    with_plain_header,
)


def test_the_codec_is_the_native_one() -> None:
    assert Frame is mqguard_native.Frame
    assert FrameDecoder is mqguard_native.FrameDecoder
    assert Oversized is mqguard_native.Oversized


def test_native_errors_are_the_python_frame_error_with_what_was_decoded() -> None:
    decoder = FrameDecoder(commands=SERVER_COMMANDS)
    with pytest.raises(FrameError) as info:
        decoder.feed(b"RECEIPT\nreceipt-id:1\n\n\0\nSEND\n\n\0")
    error = info.value
    assert isinstance(error, MqguardError)
    assert (error.reason, error.detail) == ("unknown command", "SEND")
    assert error.frames == [Frame("RECEIPT", [("receipt-id", "1")]), HEARTBEAT]
    with pytest.raises(FrameError, match="NUL in header"):
        encode(Frame("SEND", [("k", "a\0")]))


def test_frames_copy_and_pickle_like_the_dataclass_did() -> None:
    (frame,) = FrameDecoder().feed(b"SEND\na:1\n\nbody\0")
    assert isinstance(frame, Frame)
    shallow = copy.copy(frame)
    assert shallow == frame and shallow.headers is frame.headers and shallow.wire == frame.wire
    deep = copy.deepcopy(frame)
    assert deep == frame and deep.headers is not frame.headers
    again = pickle.loads(pickle.dumps(frame))
    assert again == frame and wire_of(again, "1.2") == b"SEND\na:1\n\nbody\0"
    item = Oversized(frame, "too many headers", "more than 1", True)
    assert pickle.loads(pickle.dumps(item)) == item
    with pytest.raises(TypeError):
        hash(frame)  # mutable, compared by value: unhashable, as the dataclass was


def test_headers_and_body_may_be_replaced_and_edited() -> None:
    frame = Frame("SEND", [("a", "1")], b"x", wire=b"SEND\na:1\n\nx\0")
    frame.headers.append(("b", "2"))
    frame.wire = None
    assert encode(frame) == b"SEND\na:1\nb:2\n\nx\0"
    frame.headers = [("c", "3")]
    frame.body = b"y"
    assert wire_of(frame, "1.0") == b"SEND\nc:3\n\ny\0"
    assert frame.header_dict() == {"c": "3"}


def test_decoder_keeps_its_limits_object_and_reads_them() -> None:
    limits = FrameLimits(max_frame_bytes=64, max_header_count=1)
    decoder = FrameDecoder(limits=limits, oversized=True)
    assert decoder.limits is limits and decoder.oversized
    (item,) = decoder.feed(b"SEND\na:1\nb:2\n\nx\0")
    assert isinstance(item, Oversized) and item.reason == "too many headers" and item.body_kept
    decoder.oversized = False
    with pytest.raises(FrameError, match="too many headers"):
        decoder.feed(b"SEND\na:1\nb:2\n\nx\0")


def test_with_plain_header_needs_an_encoded_frame() -> None:
    assert with_plain_header(b"ACK\nid:1\n\n\0", "receipt", "r-1") == (
        b"ACK\nreceipt:r-1\nid:1\n\n\0")
    with pytest.raises(ValueError, match="no LF"):
        with_plain_header(b"ACK", "receipt", "r-1")
