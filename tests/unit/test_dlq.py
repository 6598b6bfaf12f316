"""Pure logic of ``mqguard.dlq``: durations, body previews, selection, the retried copy."""

from __future__ import annotations

import base64

import pytest

from mqguard.adapter import Delivery
from mqguard.dlq import DeadLetter, Selection, body_preview, parse_duration, retry_copy
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    BRIDGE_DUPLICATE_ID_HEADER,
    MOVE_REASON_HEADER,
    MOVED_AT_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    Message,
)


@pytest.mark.parametrize(("text", "ms"), [("10m", 600_000), ("2h", 7_200_000),
                                          ("7d", 604_800_000), ("0s", 0), ("250ms", 250),
                                          (" 1w ", 604_800_000)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["10", "", "m", "-1h", "1.5h", "10 parsecs", "1y"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ValueError, match=r"--older-than .*7d"):
        parse_duration(text, name="--older-than")


def test_previews_are_bounded_and_binary_safe() -> None:
    assert body_preview(b"hello\nworld", 256) == {"size": 11, "truncated": False,
                                                 "text": "hello\nworld"}
    binary = bytes(range(256))
    out = body_preview(binary, 16)
    assert out["truncated"] and base64.b64decode(out["base64"]) == binary[:16]
    # A character cut in half by the limit is still text.
    assert body_preview(("é" * 10).encode(), 5)["text"] == "éé"


def _letter(**headers: str) -> DeadLetter:
    message = Message(address="orders.DLA", body=b"x", message_id="D" * 20,
                      producer_id="P" * 20, sequence=7, duplicate_id="dup-1",
                      headers={ORIG_ADDRESS_HEADER: "orders", ORIG_QUEUE_HEADER: "orders",
                               ORIG_MESSAGE_ID_HEADER: "P" * 20 + ".7",
                               MOVE_REASON_HEADER: "max-delivery-attempts (1) reached",
                               MOVED_AT_HEADER: "1000", ORIG_DELIVERY_COUNT_HEADER: "1",
                               "app": "kept", **headers})
    return DeadLetter.from_delivery(Delivery(message, "s", None), "orders.DLA")


def test_a_dead_letter_is_read_from_its_headers() -> None:
    letter = _letter()
    assert (letter.original_address, letter.original_queue, letter.delivery_count,
            letter.moved_at, letter.kind) == ("orders", "orders", 1, 1000, "dead-letter")
    assert _letter(**{ACTUAL_EXPIRY_HEADER: "2000"}).kind == "expired"


def test_selection() -> None:
    letter = _letter()
    assert Selection().accepts(letter, 0)
    assert Selection.of(ids=["D" * 20]).accepts(letter, 0)
    assert Selection.of(ids=["P" * 20 + ".7"]).accepts(letter, 0)
    assert not Selection.of(ids=["other"]).accepts(letter, 0)
    assert Selection.of(original="orders").accepts(letter, 0)
    assert Selection.of(original="#").accepts(letter, 0)
    assert not Selection.of(original="payments").accepts(letter, 0)
    assert Selection.of(older_than_ms=500).accepts(letter, 1500)
    assert not Selection.of(older_than_ms=501).accepts(letter, 1500)


def test_the_retried_copy_follows_artemis_retry_messages() -> None:
    letter = _letter(**{ACTUAL_EXPIRY_HEADER: "2000"})
    letter.message.expiration = 5
    copy = retry_copy(letter, "orders", "dlq:" + "D" * 20)
    assert copy.address == "orders" and copy.body == b"x"
    assert copy.message_id == "D" * 20 + "~r"  # the same for every attempt
    assert (copy.producer_id, copy.sequence, copy.duplicate_id) == ("P" * 20, 7, "dup-1")
    assert copy.expiration == 0 and copy.delivery_count == 0
    assert copy.headers == {ORIG_ADDRESS_HEADER: "orders.DLA", ORIG_QUEUE_HEADER: "orders.DLA",
                            ORIG_MESSAGE_ID_HEADER: "D" * 20, "app": "kept",
                            BRIDGE_DUPLICATE_ID_HEADER: "dlq:" + "D" * 20}


def test_activemq_own_dead_letters_name_their_queue() -> None:
    message = Message(address="ActiveMQ.DLQ", body=b"x", broker_message_id="ID:1")
    delivery = Delivery(message, "s", None, raw_headers={
        "original-destination": "/queue/orders", "timestamp": "1234"})
    letter = DeadLetter.from_delivery(delivery, "ActiveMQ.DLQ")
    assert (letter.original_address, letter.reason, letter.moved_at, letter.message_id) == (
        "orders", "dead-lettered by ActiveMQ", 1234, "ID:1")
    # Retried to that queue under a new random id (no mqguard id to derive one from).
    copy = retry_copy(letter, "orders", None)
    assert copy.address == "orders" and copy.message_id and BRIDGE_DUPLICATE_ID_HEADER \
        not in copy.headers
