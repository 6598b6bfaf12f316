"""A guarded consumer in a child process whose handler hangs until it is SIGKILLed."""

from __future__ import annotations

import time
from typing import Any

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.registry import open_adapter

HANG = "hang"


def consume_until_killed(url: str, address: str, config: dict[str, Any], log_path: str,
                         client_id: str) -> None:
    """Child process: handle messages; the first delivery of HANG never returns."""
    guard = Guard(parse_config(config)).start()
    with open(log_path, "a", buffering=1) as log:
        def handle(message: Message) -> None:
            log.write(f"{message.body.decode()} {message.delivery_count}\n")
            if message.body == HANG.encode() and message.delivery_count == 1:
                time.sleep(600)  # killed here, its delivered event long written

        GuardedConsumer(open_adapter(url, client_id=client_id), address, handle,
                        guard).start()
        log.write("ready 0\n")
        while True:
            time.sleep(1)
