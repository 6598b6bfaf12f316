"""A producer process that races others to send the same duplicate ids through a broker."""

from __future__ import annotations

import time
from typing import Any

from mqguard.config import parse_config
from mqguard.errors import MessageRejected
from mqguard.pipeline import Guard
from mqguard.plugins.duplicate_detection import IN_FLIGHT_CODE
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter


def race_worker(url: str, redis_url: str, address: str, events_dir: str, node: str,
                 ids: list[str], queue: Any, start: Any) -> None:
    guard = Guard(parse_config({"mqguard": {"store": redis_url, "node-id": node,
                                            "event-log": {"directory": events_dir}}}))
    accepted = 0
    with guard, GuardedProducer(open_adapter(url), guard) as producer:
        start.wait(60)  # every racer connected: now they overlap
        for dup in ids:
            while True:
                try:
                    result = producer.send(address, dup.encode(), duplicate_id=dup)
                    break
                except MessageRejected as exc:
                    # Another racer's send of this id is not confirmed yet: its fate decides.
                    assert IN_FLIGHT_CODE in exc.reason, exc
                    time.sleep(0.005)
            accepted += result.sent
    queue.put(accepted)
