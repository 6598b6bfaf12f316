"""Message wire decoding: guard headers from the network never raise."""

from __future__ import annotations

import pytest

from mqguard.message import (
    EXPIRATION_HEADER,
    ID_LENGTH,
    MAX_WIRE_INTEGER,
    MESSAGE_ID_HEADER,
    PRODUCER_ID_HEADER,
    SEQUENCE_HEADER,
    Message,
    derived_message_id,
    new_message_id,
    parse_wire_int,
    split_derived_id,
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


def test_excluded_headers_are_left_out_and_guard_fields_still_read() -> None:
    wire = {"destination": "/queue/q", "ack": "7", "app": "1", SEQUENCE_HEADER: "3",
            **Message("q", b"", message_id="m", duplicate_id="d").wire_headers()}
    got = Message.from_wire("q", b"", wire, exclude={"destination", "ack", "absent"})
    assert got.headers == {"app": "1"}
    assert (got.message_id, got.duplicate_id, got.sequence) == ("m", "d", 3)
    assert "ack" in wire  # the caller's headers are not changed


def test_guard_headers_round_trip() -> None:
    sent = Message("q", b"x", {"app": "1"}, message_id="m", duplicate_id="d", expiration=5,
                   producer_id="p", sequence=7)
    got = Message.from_wire("q", b"x", sent.wire_headers())
    assert (got.message_id, got.duplicate_id, got.expiration, got.producer_id, got.sequence,
            got.headers) == ("m", "d", 5, "p", 7, {"app": "1"})


def test_a_derived_id_carries_producer_and_sequence_in_one_header() -> None:
    producer = new_message_id()
    message = Message("q", message_id=derived_message_id(producer, 42), producer_id=producer,
                      sequence=42)
    wire = message.wire_headers()
    assert wire == {MESSAGE_ID_HEADER: f"{producer}.42"}
    back = Message.from_wire("q", b"", wire)
    assert (back.message_id, back.producer_id, back.sequence) == (f"{producer}.42", producer, 42)
    assert back.headers == {}


def test_an_id_not_derived_from_the_producer_keeps_the_separate_headers() -> None:
    # An application's producer id: the message id is random, so both fields travel apart.
    message = Message("q", message_id=new_message_id(), producer_id="orders", sequence=7)
    wire = message.wire_headers()
    assert wire[PRODUCER_ID_HEADER] == "orders" and wire[SEQUENCE_HEADER] == "7"
    back = Message.from_wire("q", b"", wire)
    assert (back.producer_id, back.sequence) == ("orders", 7)


@pytest.mark.parametrize("message_id", [
    "short.5",                                  # producer part not an mqguard id's length
    "A" * ID_LENGTH + ".",                      # no sequence
    "A" * ID_LENGTH + ".12x",                   # not a number
    "A" * ID_LENGTH + "." + "9" * 17,           # beyond MAX_WIRE_INTEGER's digits
    "A" * ID_LENGTH + "-5",                     # not the separator
])
def test_ids_of_another_shape_are_not_split(message_id: str) -> None:
    assert split_derived_id(message_id) is None
    back = Message.from_wire("q", b"", {MESSAGE_ID_HEADER: message_id})
    assert (back.producer_id, back.sequence) == (None, None)


def test_explicit_producer_headers_win_over_the_id() -> None:
    derived = derived_message_id("B" * ID_LENGTH, 3)
    back = Message.from_wire("q", b"", {MESSAGE_ID_HEADER: derived,
                                        PRODUCER_ID_HEADER: "other", SEQUENCE_HEADER: "9"})
    assert (back.message_id, back.producer_id, back.sequence) == (derived, "other", 9)


def test_guarded_producer_derives_ids_only_from_its_own_producer_id() -> None:
    from mqguard.config import parse_config
    from mqguard.pipeline import Guard
    from mqguard.producer import GuardedProducer
    from mqguard.testing.loopback import LoopbackAdapter

    guard = Guard(parse_config({"mqguard": {"event-log": {"enabled": False}}}))
    own = GuardedProducer(LoopbackAdapter(), guard)
    first, second = own.message("q", b"a"), own.message("q", b"b")
    assert [first.message_id, second.message_id] == [
        derived_message_id(own.producer_id, 1), derived_message_id(own.producer_id, 2)]
    named = GuardedProducer(LoopbackAdapter(), guard, producer_id="orders")
    assert named.message("q", b"a").message_id == ""  # the guard stamps a random one
