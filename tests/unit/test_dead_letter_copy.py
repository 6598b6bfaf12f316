"""What a dead-letter copy carries (loopback adapter; real brokers in
tests/integration/test_dead_letter_expiration.py)."""

from __future__ import annotations

import time
from pathlib import Path

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.message import ACTUAL_EXPIRY_HEADER, ORIG_MESSAGE_ID_HEADER, Message
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
