"""The ``acked`` event says whether it ends a successful handling (the audit's hash plan
pairs deliveries with handlings from it: mqguard/audit/hashed.py)."""

from __future__ import annotations

from pathlib import Path

from mqguard_tests.consumer_audit import consume_a_duplicate, events


def test_handling_ack_names_its_delivery_and_a_suppressed_duplicate_does_not(
        tmp_path: Path) -> None:
    guard, _, sent, _ = consume_a_duplicate(tmp_path)
    log = [e for e in events(guard) if e.get("message_id") == sent.message_id]
    (delivered,) = [e for e in log if e["type"] == "delivered"]
    first, second = [e for e in log if e["type"] == "acked"]
    # The handler returned: the ack says so and when its delivery was written.
    assert first["ack_reason"] == "normal" and first["handled"] is True
    assert first["delivered_ts"] == delivered["ts"]
    assert log.index(delivered) < log.index(first)
    # The consumer audit acknowledged the duplicate without the handler: normal, not handled.
    assert second["ack_reason"] == "normal" and second["handled"] is False
    assert "delivered_ts" not in second
    guard.close()
