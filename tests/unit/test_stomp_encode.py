"""The STOMP adapter's SEND encoder: what stomp.py's parser reads back is what was sent."""

from __future__ import annotations

import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.adapters.stomp import _encode_send

_NAME = st.text(alphabet=st.sampled_from(list("abz-_.é")), min_size=1, max_size=8)
_VALUE = st.text(alphabet=st.sampled_from(list("ab:\\\r\nc-é 0")), max_size=12)


def _read_back(frame: bytes) -> stomp.utils.Frame:
    assert frame.endswith(b"\x00")
    return stomp.utils.parse_frame(frame[:-1])


def test_plain_frame_bytes() -> None:
    frame = _encode_send("/queue/a", b"hi", {"receipt": "r-1", "persistent": "true"})
    assert frame == (b"SEND\ndestination:/queue/a\nreceipt:r-1\npersistent:true\n"
                     b"content-length:2\n\nhi\x00")
    assert _encode_send("/queue/a", b"", {}) == b"SEND\ndestination:/queue/a\n\n\x00"


def test_escapes_values_and_destination() -> None:
    frame = _encode_send("/queue/a:b", b"\x00x", {"k": "line\none\\two:three\r"})
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
    parsed = _read_back(_encode_send(destination, body, headers))
    assert parsed.cmd == "SEND"
    expected = {"destination": destination, **headers}
    if body:
        expected["content-length"] = str(len(body))
    assert parsed.headers == expected
    assert parsed.body == body


class _Transport:
    blocking = True

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.writes.append(data)


def test_batch_is_written_with_an_early_first_chunk() -> None:
    from types import SimpleNamespace

    from mqguard.adapters import stomp as adapter_module

    frames = [("/queue/a", b"x%d" % i, {"receipt": f"r-{i}"}) for i in range(40)]
    conn = SimpleNamespace(transport=_Transport())
    adapter_module.StompAdapter._write(SimpleNamespace(where="test"), conn, frames)
    writes = conn.transport.writes
    expected = [_encode_send(*frame) for frame in frames]
    # The broker gets the first frames at once, the rest in one more write; nothing is
    # lost, duplicated or reordered, and no frame straddles two writes.
    assert writes == [b"".join(expected[:adapter_module.FIRST_CHUNK_FRAMES]),
                      b"".join(expected[adapter_module.FIRST_CHUNK_FRAMES:])]
    conn.transport.writes.clear()
    adapter_module.StompAdapter._write(SimpleNamespace(where="test"), conn, frames[:10])
    assert conn.transport.writes == [b"".join(expected[:10])]  # small batches: one write
