"""What a dead-letter copy carries (loopback adapter; real brokers in
tests/integration/test_dead_letter_expiration.py)."""

from __future__ import annotations

import time
from pathlib import Path

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    MOVED_AT_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    SENT_AT_HEADER,
    Message,
    now_ms,
)
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter


def _dead_letter(tmp_path: Path, dla_settings: dict[str, object]) -> tuple[Message, Message]:
    config = parse_config({
        "mqguard": {"event-log": {"directory": str(tmp_path / "events")}},
        "address-settings": {"q": {"dead-letter-address": "DLA", "max-delivery-attempts": 1},
                             "DLA": dla_settings}})
    adapter = LoopbackAdapter()
    with Guard(config) as guard:
        sent = GuardedProducer(adapter, guard).send("q", b"poison", ttl_ms=60_000).message

        def poison(message: Message) -> None:
            raise Nack("poison")

        with GuardedConsumer(adapter, "q", poison, guard):
            deadline = time.monotonic() + 5
            while adapter.loop.depth("DLA") == 0:
                assert time.monotonic() < deadline, "no dead letter"
                adapter.pump()
                time.sleep(0.005)
    (dead,) = adapter.loop.drain("DLA")
    return sent, dead


def test_a_dead_letter_does_not_keep_the_original_expiration(tmp_path: Path) -> None:
    sent, dead = _dead_letter(tmp_path, {})
    assert sent.expiration > 0
    assert dead.expiration == 0  # Artemis QueueImpl.makeCopy: copy.setExpiration(0)
    assert dead.headers[ORIG_MESSAGE_ID_HEADER] == sent.message_id
    assert ACTUAL_EXPIRY_HEADER not in dead.headers


def test_the_dead_letter_address_expiry_settings_are_not_applied_to_the_copy(
        tmp_path: Path) -> None:
    """Deviation from Artemis, pinned: Artemis routes the copy to the dead-letter address
    like any message (PostOfficeImpl.route -> applyExpiryDelay), so that address's
    expiry-delay / max-expiry-delay would give the dead letter a new expiration. mqguard
    sends the copy without running the send hooks, so a dead letter never expires."""
    _, dead = _dead_letter(tmp_path, {"expiry-delay": 5000, "max-expiry-delay": 5000})
    assert dead.expiration == 0


def test_the_copy_carries_the_original_send_time(tmp_path: Path) -> None:
    before = now_ms()
    sent, dead = _dead_letter(tmp_path, {})
    assert before <= sent.sent_at <= now_ms()  # stamped at the first guarded send
    assert dead.sent_at == sent.sent_at  # kept by the copy, as Artemis keeps a timestamp
    assert dead.wire_headers()[SENT_AT_HEADER] == str(sent.sent_at)
    assert sent.sent_at <= int(dead.headers[MOVED_AT_HEADER])


def test_the_send_time_is_stamped_once_and_only_where_a_move_can_happen(
        tmp_path: Path) -> None:
    config = parse_config({
        "mqguard": {"event-log": {"directory": str(tmp_path / "events")}},
        "address-settings": {"q": {"dead-letter-address": "DLA"},
                             "e": {"auto-create-expiry-resources": True}}})
    adapter = LoopbackAdapter()
    with Guard(config) as guard:
        producer = GuardedProducer(adapter, guard)
        # Sent again (a forward, a resend): the first send time stays.
        (again,) = [r.message for r in producer.send_batch(
            [Message(address="q", body=b"a", sent_at=5)])]
        assert again.sent_at == 5
        batch = [result.message for result in producer.send_batch(
            [Message(address=a, body=b"b") for a in ("q", "e", "plain", "q")])]
        assert [bool(m.sent_at) for m in batch] == [True, True, False, True]
        assert len({m.sent_at for m in batch if m.sent_at}) == 1  # one clock read a batch
        # Nothing moves a message of "plain" anywhere: no header to pay for.
        assert SENT_AT_HEADER not in batch[2].wire_headers()
    received = {m.body: m for m in adapter.loop.drain("q")}
    assert received[b"a"].sent_at == 5
