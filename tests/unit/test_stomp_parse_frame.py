"""The STOMP adapter's receive parser (the native codec) gives exactly what stomp.py's
parse_frame gives."""

from __future__ import annotations

import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.adapters.stomp import parse_frame
from mqguard.sidecar.frames import parse_received

_TEXT = st.text(alphabet=st.sampled_from(list("ab:\\\r\nc-é ")), max_size=12)
#: Octets that matter to a head: EOLs, colons, escapes, broken and valid UTF-8, a NUL.
_OCTETS = st.lists(st.sampled_from([b"\n", b"\r", b":", b"\\", b"a", b"c", b"n", b"r", b"t",
                                    b"\xff", b"\xc3\xa9", b"\xed\xa0\x80", b"\xe2\x82", b" ",
                                    b"\x00"]), max_size=40).map(b"".join)


def _same(data: bytes) -> None:
    ours, theirs = parse_frame(data), stomp.utils.parse_frame(data)
    if theirs is None:
        assert ours is None
        assert parse_received(data) is None
        return
    assert isinstance(ours, stomp.utils.Frame)
    assert (ours.cmd, ours.headers, ours.body) == (theirs.cmd, theirs.headers, theirs.body)
    assert list(ours.headers) == list(theirs.headers)  # the same order too
    assert ours.original_headers == theirs.original_headers
    assert ours.original_headers is not ours.headers


def test_message_frame_with_escapes_and_repeats() -> None:
    data = (b"MESSAGE\nsubscription:1\nmessage-id:ID\\c1\nk\\\\ey:v\\nal\\x\n"
            b"subscription:2\nnovalue\n:empty-name\nx:y:z\n\nbody\n\nmore")
    frame = parse_frame(data)
    assert frame.cmd == "MESSAGE"
    assert frame.headers == {"subscription": "1", "message-id": "ID:1", "k\\ey": "v\nal\\x",
                             "x": "y:z"}
    assert frame.body == b"body\n\nmore"
    _same(data)


def test_crlf_frames_and_leading_newlines() -> None:
    _same(b"\n\r\nRECEIPT\r\nreceipt-id:7\r\n\r\n")
    _same(b"MESSAGE\na:b\r\n\nbody")
    _same(b"MESSAGE\r\na:b\r\r\n\r\nbody")
    _same(b"MESSAGE\r\na:b\r\n\r\n\nbody\n\n")  # the CRLF blank line starts first
    _same(b"\n\n")
    _same(b"CONNECTED")
    _same(b"")


def test_escapes_undone_in_every_frame_and_unknown_ones_kept() -> None:
    frame = parse_frame(b"CONNECTED\nserver:a\\cb\\t\\\n\n")
    assert frame.headers == {"server": "a:b\\t\\"}
    _same(b"CONNECTED\nserver:a\\cb\\t\\\n\n")


def test_invalid_utf8_is_replaced_as_stomp_py_does() -> None:
    frame = parse_frame(b"MESSAGE\nk:\xff\xed\xa0\x80v\n\n\xff")
    assert frame.headers == {"k": "\ufffd" * 4 + "v"}
    assert frame.body == b"\xff"
    _same(b"MESSAGE\nk:\xff\xed\xa0\x80v\n\n\xff")


def test_many_headers_first_occurrence_wins() -> None:
    lines = [f"h{i % 40}:{i}" for i in range(120)] + ["h\\c0:x", "h:0:y"]
    data = ("MESSAGE\n" + "\n".join(lines) + "\n\n").encode()
    frame = parse_frame(data)
    assert len(frame.headers) == 42
    assert frame.headers["h7"] == "7"
    assert frame.headers["h:0"] == "x"
    _same(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=6), st.binary(max_size=20),
       st.sampled_from(["\n", "\r\n"]), st.integers(0, 2))
def test_same_as_stomp_py(headers: list[tuple[str, str]], body: bytes, eol: str,
                          leading: int) -> None:
    head = eol * leading + "MESSAGE" + "".join(f"{eol}{k}:{v}" for k, v in headers)
    _same((head + eol + eol).encode() + body)
    _same(head.encode())


@settings(max_examples=500, deadline=None)
@given(_OCTETS)
def test_same_as_stomp_py_on_arbitrary_octets(data: bytes) -> None:
    _same(data)
