"""expiry plugin: Artemis's expiry-delay rules (table-driven) and expiry at delivery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.events import read_events
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    Message,
    now_ms,
)
from mqguard.pipeline import Guard
from mqguard.plugins.expiry import apply_expiry_settings
from mqguard.producer import GuardedProducer
from mqguard.settings import AddressSettings
from mqguard.testing.loopback import LoopbackAdapter

NOW = 1_000_000
UNSET = -1

# (settings, expiration given, expiration expected, the Artemis rule)
RULES = [
    ({}, 0, 0, "nothing configured: no expiration"),
    ({}, NOW + 5, NOW + 5, "nothing configured: kept"),
    ({"no_expiry": True}, NOW + 5, 0, "no-expiry removes it"),
    ({"no_expiry": True, "expiry_delay": 10}, 0, 0, "no-expiry wins over expiry-delay"),
    ({"expiry_delay": 10}, 0, NOW + 10, "expiry-delay applies to a message without one"),
    ({"expiry_delay": 10}, NOW + 5000, NOW + 5000, "expiry-delay leaves a set expiration"),
    ({"expiry_delay": 10, "max_expiry_delay": 100}, NOW + 5000, NOW + 5000,
     "with expiry-delay set, min/max are not applied"),
    ({"expiry_delay": 0}, 0, NOW, "expiry-delay 0 expires at once"),
    ({"max_expiry_delay": 100}, 0, NOW + 100, "no expiration gets max"),
    ({"max_expiry_delay": 100}, NOW + 5000, NOW + 100, "above max is lowered"),
    ({"max_expiry_delay": 100}, NOW + 50, NOW + 50, "within max is kept"),
    ({"max_expiry_delay": 0}, NOW + 50, NOW, "max 0 expires at once"),
    ({"min_expiry_delay": 100}, 0, NOW + 100, "no expiration gets min when max is unset"),
    ({"min_expiry_delay": 100}, NOW + 50, NOW + 100, "below min is raised"),
    ({"min_expiry_delay": 100}, NOW + 500, NOW + 500, "above min is kept"),
    ({"min_expiry_delay": 100, "max_expiry_delay": 1000}, 0, NOW + 1000,
     "no expiration gets max even with min"),
    ({"min_expiry_delay": 100, "max_expiry_delay": 1000}, NOW + 50, NOW + 100,
     "between: below min raised"),
    ({"min_expiry_delay": 100, "max_expiry_delay": 1000}, NOW + 5000, NOW + 1000,
     "between: above max lowered"),
    ({"min_expiry_delay": 100, "max_expiry_delay": 1000}, NOW + 500, NOW + 500,
     "between: kept"),
]


@pytest.mark.parametrize(("values", "given", "expected", "rule"), RULES,
                         ids=[rule for *_, rule in RULES])
def test_artemis_expiry_rules(values: dict[str, Any], given: int, expected: int,
                              rule: str) -> None:
    settings = AddressSettings(**{"expiry_delay": UNSET, **values})
    assert apply_expiry_settings(given, settings, NOW) == expected, rule


def make_guard(tmp_path: Path, **settings: Any) -> Guard:
    config = parse_config({"mqguard": {"event-log": {"directory": str(tmp_path / "events")}},
                           "address-settings": {"q": settings}})
    return Guard(config).start()


def events(guard: Guard) -> list[dict[str, Any]]:
    guard.events.flush()
    return list(read_events(guard.config.core.event_log.directory))


def test_send_applies_address_settings(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, **{"max-expiry-delay": 60_000})
    adapter = LoopbackAdapter()
    before = now_ms()
    sent = GuardedProducer(adapter, guard).send("q", b"x", ttl_ms=3_600_000).message
    assert before + 60_000 <= sent.expiration <= now_ms() + 60_000
    (queued,) = adapter.loop.drain("q")
    assert queued.expiration == sent.expiration
    guard.close()


def test_expired_at_delivery_moves_to_the_expiry_address(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, **{"expiry-address": "EXPIRED"})
    adapter = LoopbackAdapter()
    producer = GuardedProducer(adapter, guard)
    stale = producer.send("q", b"stale", expiration=now_ms() - 1).message
    fresh = producer.send("q", b"fresh", ttl_ms=60_000).message
    handled: list[Message] = []
    with GuardedConsumer(adapter, "q", handled.append, guard):
        adapter.pump()
    assert [m.message_id for m in handled] == [fresh.message_id]
    (copy,) = adapter.loop.drain("EXPIRED")
    assert copy.expiration == 0 and copy.body == b"stale"
    assert copy.headers[ORIG_ADDRESS_HEADER] == "q" and copy.headers[ORIG_QUEUE_HEADER] == "q"
    assert copy.headers[ORIG_MESSAGE_ID_HEADER] == stale.message_id
    assert int(copy.headers[ACTUAL_EXPIRY_HEADER]) >= stale.expiration
    kinds = [(e["type"], e.get("ack_reason")) for e in events(guard)
             if e.get("message_id") == stale.message_id]
    assert ("expired", None) in kinds and ("acked", "expired") in kinds
    guard.close()


def test_expired_without_expiry_address_is_dropped(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    guard = make_guard(tmp_path)
    adapter = LoopbackAdapter()
    GuardedProducer(adapter, guard).send("q", b"stale", expiration=now_ms() - 1)
    with GuardedConsumer(adapter, "q", lambda m: pytest.fail("delivered"), guard):
        adapter.pump()
    assert len(adapter.acked) == 1
    expired = [e for e in events(guard) if e["type"] == "expired"]
    assert len(expired) == 1 and "no expiry-address" in expired[0]["reason"]
    assert "no expiry-address is configured" in caplog.text
    guard.close()


def test_auto_created_expiry_queue_and_hook(tmp_path: Path) -> None:
    import mqguard

    seen: list[str | None] = []

    class Watcher:
        @mqguard.hookimpl
        def message_expired(self, moved_to: str | None) -> None:
            seen.append(moved_to)

    guard = make_guard(tmp_path, **{"auto-create-expiry-resources": True})
    guard.plugins.register(Watcher())
    adapter = LoopbackAdapter()
    GuardedProducer(adapter, guard).send("q", b"stale", expiration=now_ms() - 1)
    with GuardedConsumer(adapter, "q", lambda m: None, guard):
        adapter.pump()
    assert adapter.loop.depth("EXP.q") == 1 and seen == ["EXP.q"]
    guard.close()
