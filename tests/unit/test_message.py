"""Message wire decoding: guard headers from the network never raise."""

from __future__ import annotations

import pytest

from mqguard.message import (
    EXPIRATION_HEADER,
    MAX_WIRE_INTEGER,
    SEQUENCE_HEADER,
    Message,
    parse_wire_int,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("42", 42), (str(MAX_WIRE_INTEGER), MAX_WIRE_INTEGER),
    (str(MAX_WIRE_INTEGER + 1), None), ("", None), ("-1", None), ("+1", None), (" 1", None),
    ("1.0", None), ("²", None), ("٣", None), ("9" * 17, None), ("0x10", None),
])
def test_parse_wire_int_is_strict(text: str, expected: int | None) -> None:
    assert parse_wire_int(text) == expected


@pytest.mark.parametrize("bad", ["²", "٣", "-5", "9" * 40, "12abc"])
def test_malformed_guard_headers_stay_application_headers(bad: str) -> None:
    message = Message.from_wire("q", b"", {SEQUENCE_HEADER: bad, EXPIRATION_HEADER: bad})
    assert message.sequence is None and message.expiration == 0
    assert message.headers == {SEQUENCE_HEADER: bad, EXPIRATION_HEADER: bad}


def test_guard_headers_round_trip() -> None:
    sent = Message("q", b"x", {"app": "1"}, message_id="m", duplicate_id="d", expiration=5,
                   producer_id="p", sequence=7)
    got = Message.from_wire("q", b"x", sent.wire_headers())
    assert (got.message_id, got.duplicate_id, got.expiration, got.producer_id, got.sequence,
            got.headers) == ("m", "d", 5, "p", 7, {"app": "1"})
