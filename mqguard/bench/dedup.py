"""``mqguard bench dedup``: the duplicate-ID cache's speed and memory.

Figures (all from one run against one Redis):

* ``batched_ids_per_s``: check-and-add through :class:`RedisStore`, ``batch``
  ids per script call, from one Python process.
* ``reserve_ids_per_s``: what the plugin does per batch since ids are two-phase: reserve
  ``batch`` ids in one script call that also confirms the previous batch's ids.
* ``pipelined_ids_per_s``: the naive alternative for context — one script call
  per id, redis-py pipelines of 100.
* ``redis_benchmark_per_s``: ``redis-benchmark`` calling the store's own
  check-and-add script with one id per call, 1 client, ``-P 16``: what Redis
  itself does when a fast C client drives the one-id path.
* ``ratio`` = batched / redis_benchmark (goal >= 1.0).
* ``bytes_per_id``: growth of Redis ``used_memory`` per cached id after adding
  1,000,000 ids (36-character UUID strings) to one ring (goal <= 64).
* ``memory_store_ops_per_s``: MemoryStore check-and-add, batched like the Redis
  figure (goal >= 1,000,000); ``memory_store_ops_per_cpu_s`` the same per CPU-second
  of the process (the figure an idle core would give on a shared machine);
  ``memory_store_single_ops_per_s`` one id per call;
  ``memory_store_reserve_ops_per_s`` reserve-and-confirm, batched.
* ``digest_per_s``: BLAKE2b-64 digests of UUID strings (paid once per send).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from mqguard.digest import id_digest
from mqguard.stores.memory import MemoryStore
from mqguard.stores.redis import RedisStore


def _digests(count: int) -> list[bytes]:
    return [id_digest(str(uuid.uuid4())) for _ in range(count)]


def batched_rate(store: RedisStore, ids: list[bytes], batch: int, capacity: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(ids), batch):
        store.ring_check_and_add("bench.batched", ids[start:start + batch], capacity)
    return len(ids) / (time.perf_counter() - started)


def reserve_rate(store: RedisStore | MemoryStore, ids: list[bytes], batch: int,
                 capacity: int) -> float:
    """Reservations of ``batch`` ids per call, each call confirming the previous batch."""
    previous: list[bytes] = []
    started = time.perf_counter()
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        store.ring_reserve("bench.reserve", chunk, capacity, 10_000, confirm=previous)
        previous = chunk
    store.ring_confirm("bench.reserve", previous)
    return len(ids) / (time.perf_counter() - started)


def pipelined_rate(store: RedisStore, ids: list[bytes], capacity: int, depth: int = 100) -> float:
    client = store._client  # the naive path bypasses the store on purpose
    keys = store._ring_keys("bench.pipelined")
    script = store._s_check_and_add
    started = time.perf_counter()
    for start in range(0, len(ids), depth):
        pipe = client.pipeline(transaction=False)
        for item in ids[start:start + depth]:
            script(keys=keys, args=[capacity, item], client=pipe)
        pipe.execute()
    return len(ids) / (time.perf_counter() - started)


def redis_benchmark_rate(store: RedisStore, url: str, requests: int, capacity: int) -> float:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark not found (Debian package redis-tools)")
    parts = urlsplit(url)
    keys = store._ring_keys("bench.redis-benchmark")
    sha = store._s_check_and_add.sha
    store._client.script_load(store._s_check_and_add.script)
    cmd = [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379),
           "-c", "1", "-P", "16", "-n", str(requests), "-r", "1000000000", "--csv",
           "EVALSHA", sha, "2", *keys, str(capacity), "__rand_int__"]
    if parts.password:
        cmd[1:1] = ["-a", parts.password, "--no-auth-warning"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    for line in out.splitlines():
        fields = [f.strip('"') for f in line.split(",")]
        if len(fields) > 1 and fields[0] != "test":
            return float(fields[1])
    raise RuntimeError(f"could not parse redis-benchmark output: {out!r}")


def bytes_per_id(store: RedisStore, count: int, batch: int = 5000) -> float:
    store.flush_namespace()
    before = store.memory_usage_bytes()
    for start in range(0, count, batch):
        ids = [id_digest(str(uuid.uuid4())) for _ in range(min(batch, count - start))]
        store.ring_check_and_add("bench.memory", ids, count)
    after = store.memory_usage_bytes()
    store.flush_namespace()
    return (after - before) / count


def memory_store_rates(ids: list[bytes], batch: int, capacity: int
                       ) -> tuple[float, float, float]:
    """Batched and single-id ops/s (wall), and batched ops per CPU-second of this process
    (what the wall figure would be on an idle core: this machine is shared)."""
    store = MemoryStore()
    started, cpu_started = time.perf_counter(), time.process_time()
    for start in range(0, len(ids), batch):
        store.ring_check_and_add("bench", ids[start:start + batch], capacity)
    batched = len(ids) / (time.perf_counter() - started)
    batched_cpu = len(ids) / max(time.process_time() - cpu_started, 1e-9)
    single_store = MemoryStore()
    check = single_store.ring_check_and_add
    started = time.perf_counter()
    for item in ids:
        check("bench", (item,), capacity)
    single = len(ids) / (time.perf_counter() - started)
    return batched, single, batched_cpu


def digest_rate(count: int) -> float:
    values = [str(uuid.uuid4()) for _ in range(count)]
    started = time.perf_counter()
    for value in values:
        id_digest(value)
    return count / (time.perf_counter() - started)


def run(url: str, *, ids: int, batch: int, capacity: int, memory_ids: int) -> dict[str, Any]:
    store = RedisStore.from_url(url)
    try:
        store.flush_namespace()
        digests = _digests(ids)
        batched = batched_rate(store, digests, batch, capacity)
        reserved = reserve_rate(store, digests, batch, capacity)
        pipelined = pipelined_rate(store, digests, capacity)
        benchmark = redis_benchmark_rate(store, url, ids, capacity)
        per_id = bytes_per_id(store, memory_ids)
    finally:
        store.flush_namespace()
        store.close()
    memory_digests = _digests(1_000_000)
    memory_batched, memory_single, memory_cpu = memory_store_rates(memory_digests, batch,
                                                                   capacity)
    memory_reserve = reserve_rate(MemoryStore(), memory_digests, batch, capacity)
    return {
        "batched_ids_per_s": batched,
        "reserve_ids_per_s": reserved,
        "pipelined_ids_per_s": pipelined,
        "redis_benchmark_per_s": benchmark,
        "ratio": batched / benchmark,
        "bytes_per_id": per_id,
        "memory_store_ops_per_s": memory_batched,
        "memory_store_ops_per_cpu_s": memory_cpu,
        "memory_store_single_ops_per_s": memory_single,
        "memory_store_reserve_ops_per_s": memory_reserve,
        "digest_per_s": digest_rate(200_000),
        "goals": {"ratio": 1.0, "bytes_per_id": 64, "memory_store_ops_per_s": 1_000_000},
    }
