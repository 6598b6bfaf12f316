"""A process that races others to accept duplicate ids in one Redis store."""

from __future__ import annotations

import random
from typing import Any

from mqguard.stores.redis import RedisStore


def race_worker(url: str, ids: list[bytes], seed: int, start: Any, results: Any) -> None:
    store = RedisStore.from_url(url)
    rng = random.Random(seed)
    mine = ids[:]
    rng.shuffle(mine)
    accepted: list[bytes] = []
    start.wait(timeout=60)
    i = 0
    while i < len(mine):
        size = rng.randint(1, 9)
        batch = mine[i:i + size]
        flags = store.ring_check_and_add("race", batch, 1000)
        accepted += [item for item, dup in zip(batch, flags, strict=True) if not dup]
        i += size
    store.close()
    results.put(accepted)
