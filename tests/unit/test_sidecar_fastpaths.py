"""The sidecar's per-message encoders give exactly what encode() gives, and the frames it
handles once per message (RECEIPT, ACK, NACK) decode the same however they are split."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    STOMP_VERSIONS,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    encode,
    encode_bodiless,
    encode_one_header,
)
from mqguard.sidecar.metrics import SidecarMetrics

# Names and values with every character STOMP treats specially, and some that it does not.
_TEXT = st.text(alphabet=st.sampled_from("ab:\\\n\r\0é-_. 1"), max_size=8)
_HEADERS = st.lists(st.tuples(_TEXT, _TEXT), max_size=4)


@settings(max_examples=400, deadline=None)
@given(command=st.sampled_from(sorted(CLIENT_COMMANDS | SERVER_COMMANDS)),
       headers=_HEADERS, version=st.sampled_from(STOMP_VERSIONS))
def test_encode_bodiless_is_encode(command: str, headers: list[tuple[str, str]],
                                   version: str) -> None:
    try:
        expected: bytes | str = encode(Frame(command, list(headers)), version)
    except FrameError as exc:
        expected = exc.reason
    try:
        got: bytes | str = encode_bodiless(command, headers, version)
    except FrameError as exc:
        got = exc.reason
    assert got == expected


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_an_activemq_ack_id_round_trips(version: str) -> None:
    token = "ID:host-37451-1763768000000-1:1:1:1:123"
    wire = encode_bodiless("ACK", [("id", token), ("subscription", "s\\1")], version)
    assert b"\\c" in wire  # the colons are escaped, not passed raw
    decoder = FrameDecoder(commands=CLIENT_COMMANDS, version=version)
    (frame,) = decoder.feed(wire)
    assert isinstance(frame, Frame)
    assert frame.headers == [("id", token), ("subscription", "s\\1")]


def test_removing_a_header_cuts_its_line_from_the_received_octets() -> None:
    wire = (b"MESSAGE\nsubscription:1\nreceipt:mqguard-r-7\nmessage-id:m\n\n"
            b"receipt:mqguard-r-7\n\0")
    decoder = FrameDecoder(commands=SERVER_COMMANDS)
    for _ in range(2):  # the second time from the cached line start
        (frame,) = decoder.feed(wire)
        assert isinstance(frame, Frame)
        frame.remove("receipt")
        assert frame.wire == (b"MESSAGE\nsubscription:1\nmessage-id:m\n\n"
                              b"receipt:mqguard-r-7\n\0")  # the body keeps its text
    for name in ("content-length", "a:b"):  # never cut from the octets
        frame = Frame("MESSAGE", [(name, "1")], b"x", wire=b"MESSAGE\nx:1\n\nx\0")
        frame.remove(name)
        assert frame.wire is None


def test_observe_many_counts_each_observation() -> None:
    metrics = SidecarMetrics()
    metrics.send_guard.observe_many(3e-5, 4)
    metrics.send_guard.observe(3e-5)
    text = metrics.render().decode()
    assert 'mqguard_sidecar_guard_seconds_count{path="send"} 5.0' in text
    assert 'mqguard_sidecar_guard_seconds_bucket{le="5e-05",path="send"} 5.0' in text


_NAMES = st.sampled_from(["receipt", "a", "ab", "content-length", "x:y", "b\\c"])


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(_NAMES, _TEXT), max_size=5), body=_TEXT,
       name=_NAMES, crlf=st.booleans(), version=st.sampled_from(STOMP_VERSIONS))
def test_removing_a_header_keeps_the_octets_true_to_the_frame(
        headers: list[tuple[str, str]], body: str, name: str, crlf: bool, version: str) -> None:
    # Whatever the octets left after remove() (the line cut, or None for encode()), they
    # decode to exactly the frame's headers and body: what a peer gets is what it holds.
    try:
        wire = encode(Frame("MESSAGE", headers, body.encode()), version)
    except FrameError:
        return
    if crlf:
        head, sep, rest = wire.partition(b"\n\n")
        wire = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest
    (frame,) = FrameDecoder(commands=SERVER_COMMANDS, version=version).feed(wire)
    assert isinstance(frame, Frame)
    frame.remove(name)
    assert all(key != name for key, _ in frame.headers)
    if frame.wire is not None:
        (again,) = FrameDecoder(commands=SERVER_COMMANDS, version=version).feed(frame.wire)
        assert again == frame


def test_a_header_line_is_cut_by_its_value_not_from_the_body() -> None:
    wire = (b"MESSAGE\nsubscription:1\nreceipt:mqguard-r-7\ncontent-length:21\n\n"
            b"\nreceipt:mqguard-r-7\n\0")
    (frame,) = FrameDecoder(commands=SERVER_COMMANDS).feed(wire)
    assert isinstance(frame, Frame)
    frame.remove("receipt")
    assert frame.wire == (b"MESSAGE\nsubscription:1\ncontent-length:21\n\n"
                          b"\nreceipt:mqguard-r-7\n\0")


@settings(max_examples=600, deadline=None)
@given(command=st.sampled_from(sorted(CLIENT_COMMANDS | SERVER_COMMANDS)),
       name=st.sampled_from(["id", "receipt-id", "message-id", "subscription", "a:b", "x"]),
       value=_TEXT, version=st.sampled_from(STOMP_VERSIONS))
def test_the_one_header_shortcut_is_encode(command: str, name: str, value: str,
                                           version: str) -> None:
    try:
        expected: bytes | str = encode(Frame(command, [(name, value)]), version)
    except FrameError as exc:
        expected = exc.reason
    try:
        got: bytes | str = encode_one_header(command, name, value, version)
    except FrameError as exc:
        got = exc.reason
    assert got == expected


# Frames shaped like the shortcut's (a prefix, a value, an end), with everything that must
# send them the general way instead: escapes, CR, NUL, bad UTF-8, more headers, a body,
# an incomplete end; and limits small enough to be hit.
_PREFIXES = st.sampled_from([b"RECEIPT\nreceipt-id:", b"ACK\nid:", b"NACK\nid:", b"MESSAGE\nid:",
                             b"RECEIPT\n", b"ACK\nids:"])
_VALUE = st.lists(st.sampled_from([b"mqguard-r-1", b"ID:x", b"\\c", b"\\", b"\xc3\xa9", b"\xff",
                                   b":", b"\r", b"\0", b"x" * 9, b""]), max_size=3)
_ENDS = st.sampled_from([b"\n\n\0", b"\n\n\0\n", b"\r\n\r\n\0", b"\n\n", b"\n", b"\nx:1\n\n\0",
                         b"\n\nbody\0", b"\n\r\n\0", b"\n\n\0\r\n"])
_FRAMES = st.lists(st.tuples(_PREFIXES, _VALUE, _ENDS), min_size=1, max_size=4)


def _decoded(decoder: FrameDecoder, chunks: list[bytes], *, reasons: bool = True) -> list[object]:
    """Items with their kept octets, and the error that ended decoding (its reason only
    when ``reasons``: a frame breaking two limits may be stopped by either, depending
    on which one the octets received so far break first)."""
    out: list[object] = []
    for chunk in chunks:
        try:
            items = decoder.feed(chunk)
        except FrameError as exc:
            out.extend((item, getattr(item, "wire", None)) for item in exc.frames)
            out.append(("error", exc.reason if reasons else None))
            break
        out.extend((item, getattr(item, "wire", None)) for item in items)
    return out


@settings(max_examples=600, deadline=None)
@given(frames=_FRAMES, cuts=st.lists(st.integers(0, 120), max_size=3),
       version=st.sampled_from(STOMP_VERSIONS), keep_wire=st.booleans(),
       line=st.sampled_from([6, 16, 8192]), frame_max=st.sampled_from([12, 30, 1 << 20]),
       commands=st.sampled_from([CLIENT_COMMANDS, SERVER_COMMANDS]))
def test_per_message_frames_decode_the_same_however_split(
        frames: list[tuple[bytes, list[bytes], bytes]], cuts: list[int], version: str,
        keep_wire: bool, line: int, frame_max: int, commands: frozenset[str]) -> None:
    data = b"".join(prefix + b"".join(value) + end for prefix, value, end in frames)
    bounds = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in pairwise(bounds)] or [b""]
    limits = FrameLimits(max_header_line_bytes=line, max_frame_bytes=frame_max)
    whole = FrameDecoder(limits=limits, commands=commands, version=version, keep_wire=keep_wire)
    split = FrameDecoder(limits=limits, commands=commands, version=version, keep_wire=keep_wire)
    assert _decoded(split, chunks, reasons=False) == _decoded(whole, [data], reasons=False)


def test_plain_receipts_and_acks_decode() -> None:
    decoder = FrameDecoder(commands=SERVER_COMMANDS)
    data = b"RECEIPT\nreceipt-id:mqguard-r-1\n\n\0\n"
    items = decoder.feed(data)
    assert items == [Frame("RECEIPT", [("receipt-id", "mqguard-r-1")]), HEARTBEAT]
    assert isinstance(items[0], Frame) and items[0].wire == data[:-1]
    (ack,) = FrameDecoder(commands=CLIENT_COMMANDS, keep_wire=False).feed(b"ACK\nid:T@@1\n\n\0")
    assert isinstance(ack, Frame)
    assert ack.headers == [("id", "T@@1")] and ack.wire is None


def test_activemq_ack_ids_with_escaped_colons_decode() -> None:
    data = b"ACK\nid:ID\\chost-1-2\\c1\\c1\\c7\n\n\0"
    decoded = FrameDecoder(commands=CLIENT_COMMANDS, keep_wire=False).feed(data)
    assert decoded == [Frame("ACK", [("id", "ID:host-1-2:1:1:7")])]
    (ack,) = FrameDecoder(commands=CLIENT_COMMANDS, version="1.0").feed(data)
    assert isinstance(ack, Frame) and ack.headers == [("id", "ID\\chost-1-2\\c1\\c1\\c7")]


@pytest.mark.parametrize("data", [
    b"RECEIPT\nreceipt-id:a\r\n\n\0",  # CRLF: the CR belongs to the EOL, not the value
    b"RECEIPT\nreceipt-id:a\rb\n\n\0",
    b"RECEIPT\nreceipt-id:a\\cb\n\n\0",  # escaped
    b"RECEIPT\nreceipt-id:a\\xb\n\n\0",  # a bad escape: an error either way
    b"RECEIPT\nreceipt-id:a\0\n\n\0",  # NUL in the header block
    b"RECEIPT\nreceipt-id:\xff\n\n\0",  # not UTF-8
    b"RECEIPT\nreceipt-id:a\n\nb\0",  # a body
    b"RECEIPT\nreceipt-id:a\nx:1\n\n\0",  # a second header
    b"RECEIPT\nreceipt-id:a\n\n",  # incomplete
    b"ACK\nid:ID:1:2\n\n\0\nNACK\nid:\xc3\xa9\n\n\0",
    b"ACK\nid:" + b"x" * 9000 + b"\n\n\0",  # a header line over the limit
])
@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_odd_per_message_shapes_decode_the_same_byte_by_byte(data: bytes, version: str) -> None:
    commands = CLIENT_COMMANDS | SERVER_COMMANDS
    whole = FrameDecoder(commands=commands, version=version)
    split = FrameDecoder(commands=commands, version=version)
    assert _decoded(split, [data[at:at + 1] for at in range(len(data))]) == _decoded(whole, [data])
