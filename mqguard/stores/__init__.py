"""Stores: the shared state behind the plugins. See :mod:`mqguard.stores.base`."""

from __future__ import annotations

from mqguard.stores.base import RingOutcome, RingStats, ScheduledItem, Store
from mqguard.stores.memory import MemoryStore

__all__ = ["MemoryStore", "RingOutcome", "RingStats", "ScheduledItem", "Store", "open_store"]


def open_store(url: str) -> Store:
    """Open the store named by ``url``: ``memory`` or a Redis URL (see :mod:`mqguard.config`)."""
    if url == "memory":
        return MemoryStore()
    # Imported lazily so a MemoryStore-only process never pays for redis-py.
    from mqguard.stores.redis import RedisStore

    return RedisStore.from_url(url)
