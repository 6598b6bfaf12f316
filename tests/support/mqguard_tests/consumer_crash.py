"""A guarded consumer in a child process that is SIGKILLed mid-stream, and what it handled."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import Nack
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.registry import open_adapter

TOTAL, POISON_EVERY, MAX_ATTEMPTS = 60, 12, 3


def crash_config(address: str, store: str, events: Path, node: str) -> dict[str, Any]:
    return {
        "mqguard": {"store": store, "node-id": node,
                    "event-log": {"directory": str(events), "flush-interval-ms": 20}},
        "address-settings": {address: {"dead-letter-address": f"{address}.DLA",
                                       "max-delivery-attempts": MAX_ATTEMPTS,
                                       "redelivery-delay": 100}},
    }


def consume_forever(url: str, address: str, config: dict[str, Any], log_path: str,
                    client_id: str) -> None:
    """Child process: handle messages, writing one line per handler call, until killed."""
    guard = Guard(parse_config(config)).start()
    options = {"client_id": client_id} if url.startswith("mqtt") else {}
    with open(log_path, "a", buffering=1) as log:
        def handle(message: Message) -> None:
            log.write(f"{message.body.decode()} {message.delivery_count}\n")
            time.sleep(0.01)
            if message.body.startswith(b"poison"):
                raise Nack("poison")

        GuardedConsumer(open_adapter(url, **options), address, handle, guard).start()
        log.write("ready 0\n")
        while True:
            time.sleep(1)


def handled(log_path: Path) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = defaultdict(list)
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            body, _, count = line.rpartition(" ")
            if body and count.isdigit():
                calls[body].append(int(count))
    return calls
