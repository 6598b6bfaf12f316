"""The STOMP adapter's receive parser gives exactly what stomp.py's parse_frame gives."""

from __future__ import annotations

import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.adapters.stomp import parse_frame

_TEXT = st.text(alphabet=st.sampled_from(list("ab:\\\r\nc-é ")), max_size=12)


def _same(data: bytes) -> None:
    ours, theirs = parse_frame(data), stomp.utils.parse_frame(data)
    if theirs is None:
        assert ours is None
        return
    assert (ours.cmd, ours.headers, ours.body) == (theirs.cmd, theirs.headers, theirs.body)


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
    _same(b"\n\n")
    _same(b"CONNECTED")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=6), st.binary(max_size=20),
       st.sampled_from(["\n", "\r\n"]), st.integers(0, 2))
def test_same_as_stomp_py(headers: list[tuple[str, str]], body: bytes, eol: str,
                          leading: int) -> None:
    head = eol * leading + "MESSAGE" + "".join(f"{eol}{k}:{v}" for k, v in headers)
    _same((head + eol + eol).encode() + body)
    _same(head.encode())
