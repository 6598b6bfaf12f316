"""Reading the guard's Redis state into Spark, in parallel, inside the executors.

What the store keeps (key layout: :mod:`mqguard.stores.redis`) is read by Spark
tasks, each with its own redis-py connection, never dumped by one driver thread:

1. **scan units**, made on the driver: one per (Redis node, key kind). A
   standalone Redis is one node; for a Cluster every primary is one (its keys
   are the keys of its hash slots, so the units cover every slot exactly
   once). Kinds: ``ring`` (``<ns>:{T}:ring`` meta hashes), ``deliveries``
   (``<ns>:{T}:deliveries`` hashes) and ``audit`` (``<ns>:{T}:audit:meta:<P>``).
2. a task per unit runs ``SCAN MATCH <pattern> TYPE hash`` on its node and
   yields key names (few: one per address, queue or producer);
3. the key names are spread over ``partitions`` tasks, which read the contents
   (``HGETALL`` + chunked ``LRANGE`` for rings, ``HSCAN`` for delivery counts,
   ``HGETALL`` + ``BITCOUNT`` for audit windows), each on its own connection
   to the node that holds the key.

The results are DataFrames (:data:`RING_SCHEMA`, :data:`RING_ID_SCHEMA`,
:data:`COUNT_SCHEMA`, :data:`AUDIT_SCHEMA`). Names come back decoded from their
hash tags, so they are addresses and queue names as the event log writes them.

The URL (with its password) travels to the executors inside the task closures
(Spark does not log those); every message this module produces names Redis by
:func:`~mqguard.stores.redis.mask_url` only. The executors need ``mqguard`` and
``redis`` installed (true for ``local[*]``; on a cluster, ship them).

Read the state when the guarded processes are idle: a ring that changes while
it is read is compared as it was at some point during the read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urlsplit, urlunsplit

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mqguard.errors import MqguardError
from mqguard.stores.redis import DEFAULT_NAMESPACE, mask_url

#: Key kinds a scan unit reads, with the SCAN pattern (after the namespace).
KINDS: Final = {"ring": "{*}:ring", "deliveries": "{*}:deliveries", "audit": "{*}:audit:meta:*"}
_SCAN_COUNT: Final = 1000
_LRANGE_CHUNK: Final = 10_000
_DIGEST_BYTES: Final = 8
#: Longest ring read (ids); a ring is never bigger than its capacity, which the
#: store bounds, so this only guards against a key that is not ours.
MAX_RING_IDS: Final = 50_000_000

RING_SCHEMA = StructType([
    StructField("address", StringType(), nullable=False),
    StructField("capacity", LongType()),
    StructField("size", LongType()),
    StructField("node", StringType()),
])
#: One row per id of a ring: ``pos`` 0 is the oldest (the next to be evicted).
RING_ID_SCHEMA = StructType([
    StructField("address", StringType(), nullable=False),
    StructField("pos", LongType(), nullable=False),
    StructField("digest", StringType(), nullable=False),
])
COUNT_SCHEMA = StructType([
    StructField("queue", StringType(), nullable=False),
    StructField("message_id", StringType(), nullable=False),
    StructField("count", LongType()),
])
#: What the reading tasks yield: one shape for every kind, so the rows cross into the
#: JVM once and each frame is a projection of them.
RAW_SCHEMA = StructType([
    StructField("tag", StringType(), nullable=False),
    StructField("name", StringType(), nullable=False),
    StructField("n1", LongType()),
    StructField("n2", LongType()),
    StructField("s1", StringType()),
    StructField("s2", StringType()),
    StructField("blob", BinaryType()),
])
AUDIT_SCHEMA = StructType([
    StructField("scope", StringType(), nullable=False),
    StructField("producer_id", StringType(), nullable=False),
    StructField("window", LongType()),
    StructField("highest", StringType()),
    StructField("marked", LongType()),
])


class RedisStateError(MqguardError):
    """The Redis state could not be read (bad URL, Redis unreachable)."""


@dataclass(frozen=True, slots=True)
class ScanUnit:
    """One SCAN: a node (its URL, credentials included) and a key kind."""

    node_url: str
    kind: str
    namespace: str

    @property
    def pattern(self) -> str:
        return f"{_glob_escape(self.namespace)}:{KINDS[self.kind]}"


@dataclass(frozen=True)
class RedisState:
    """The DataFrames read from one Redis (persisted: the checks and the summary share them)."""

    url: str  #: masked
    nodes: int
    #: Everything read, persisted; the frames below are projections of it.
    raw: DataFrame
    rings: DataFrame
    ring_ids: DataFrame
    counts: DataFrame
    audit: DataFrame

    def unpersist(self) -> None:
        self.raw.unpersist()


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _tag_name(tag: str) -> str:
    # The inverse of mqguard.stores.redis.key_tag.
    return "" if tag == "%" else unquote(tag, encoding="utf-8", errors="surrogatepass")


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogatepass")


def _cluster_seed(url: str) -> str:
    """``redis+cluster://auth@h1:p1,h2:p2/...`` -> ``redis://auth@h1:p1/...``."""
    scheme, rest = url.split("://", 1)
    base = "rediss" if scheme.lower().startswith("rediss") else "redis"
    netloc, sep, tail = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    return f"{base}://{auth}{at}{hosts.split(',')[0]}{sep}{tail}"


def _node_url(seed: str, host: str, port: int) -> str:
    """``seed`` pointing at ``host:port`` (credentials and query kept, database dropped)."""
    parts = urlsplit(seed)
    auth = parts.netloc.rpartition("@")[0]
    where = f"[{host}]" if ":" in host else host
    netloc = f"{auth}@{where}:{port}" if auth else f"{where}:{port}"
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))


def _connect(node_url: str) -> Any:
    import redis

    return redis.Redis.from_url(node_url, decode_responses=False, socket_timeout=30,
                                socket_connect_timeout=5, client_name="mqguard-audit")


def cluster_nodes(url: str) -> list[str]:
    """The node URLs to scan for ``url``: itself (standalone) or every Cluster primary."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        return [url]
    if scheme not in ("redis+cluster", "rediss+cluster"):
        raise RedisStateError(f"unsupported Redis URL {mask_url(url)}: expected redis://, "
                              "rediss://, unix://, redis+cluster:// or rediss+cluster://")
    import redis
    from redis.cluster import RedisCluster

    seed = _cluster_seed(url)
    try:
        client = RedisCluster.from_url(seed, socket_connect_timeout=5)
        try:
            primaries = [(n.host, int(n.port)) for n in client.get_primaries()]
        finally:
            client.close()
    except (redis.RedisError, redis.exceptions.RedisClusterException, ValueError) as exc:
        raise RedisStateError(f"cannot read the slot map of {mask_url(url)}: "
                              f"{type(exc).__name__}") from None
    return [_node_url(seed, host, port) for host, port in sorted(primaries)]


def _scan(unit: ScanUnit) -> Iterator[tuple[str, str, bytes]]:
    """Every key of ``unit`` on its node, as (node_url, kind, key)."""
    client = _connect(unit.node_url)
    try:
        for key in client.scan_iter(match=unit.pattern, count=_SCAN_COUNT, _type="hash"):
            yield unit.node_url, unit.kind, key
    finally:
        client.close()


def _tag_of(key: bytes, namespace: str) -> tuple[str, str]:
    """(name, rest after the tag) of ``<ns>:{tag}:rest``."""
    text = _text(key)[len(namespace) + 2:]
    tag, _, rest = text.partition("}:")
    return _tag_name(tag), rest


def _read_ring(client: Any, key: bytes, namespace: str, node: str) -> Iterator[tuple[Any, ...]]:
    name, _ = _tag_of(key, namespace)
    meta = client.hgetall(key)
    fifo = key + b":ids"
    size = int(client.llen(fifo))
    capacity = int(meta[b"cap"]) if b"cap" in meta else None
    yield ("ring", name, capacity, size, node, None, None)
    start = 0
    while start < min(size, MAX_RING_IDS):
        chunk = client.lrange(fifo, start, start + _LRANGE_CHUNK - 1)
        if not chunk:
            break
        if all(len(digest) == _DIGEST_BYTES for digest in chunk):
            # One row per chunk: Spark splits it (JVM side), far cheaper than a Python
            # row per id crossing into the JVM.
            yield ("ids8", name, start, len(chunk), None, None, b"".join(chunk))
        else:  # ids that are not digests (not written by the guard): one row each
            for offset, digest in enumerate(chunk):
                yield ("id", name, start + offset, None, digest.hex(), None, None)
        start += len(chunk)


def _read_counts(client: Any, key: bytes, namespace: str) -> Iterator[tuple[Any, ...]]:
    queue, _ = _tag_of(key, namespace)
    for field, value in client.hscan_iter(key, count=_SCAN_COUNT):
        try:
            count = int(value)
        except ValueError:
            count = None  # not ours; reported as a null count
        if count is not None and count < 0:
            continue  # settled, kept for its grace period (mqguard.stores.redis): not live
        yield ("count", queue, count, None, _text(field), None, None)


def _read_audit(client: Any, key: bytes, namespace: str) -> Iterator[tuple[Any, ...]]:
    scope, rest = _tag_of(key, namespace)
    producer = _tag_name(rest[len("audit:meta:"):])
    meta = client.hgetall(key)
    bits = key.replace(b":audit:meta:", b":audit:bits:", 1)
    window = int(meta[b"w"]) if b"w" in meta else None
    highest = _text(meta[b"h"]) if b"h" in meta else None
    yield ("audit", scope, window, int(client.bitcount(bits)), producer, highest, None)


def _fetch(items: Iterable[tuple[str, str, bytes]], namespace: str
           ) -> Iterator[tuple[Any, ...]]:
    """Read the contents of the keys of one partition, one connection per node."""
    clients: dict[str, Any] = {}
    try:
        for node_url, kind, key in items:
            client = clients.get(node_url)
            if client is None:
                client = clients[node_url] = _connect(node_url)
            if kind == "ring":
                yield from _read_ring(client, key, namespace, mask_url(node_url))
            elif kind == "deliveries":
                yield from _read_counts(client, key, namespace)
            else:
                yield from _read_audit(client, key, namespace)
    finally:
        for client in clients.values():
            client.close()


def _masked_errors(url: str, fn: Any) -> Any:
    """Run ``fn``; a failure names Redis by its masked URL and never chains the original
    (whose text may hold the URL)."""
    try:
        return fn()
    except Exception as exc:  # Py4J wraps executor errors in many classes
        text = str(exc)
        for secret in _secrets(url):
            text = text.replace(secret, "***")
        lines = [line for line in text.splitlines() if "Error" in line or "error" in line]
        detail = (lines[-1] if lines else type(exc).__name__).strip()[:300]
        raise RedisStateError(f"reading Redis {mask_url(url)} failed: {detail}") from None


def _secrets(url: str) -> list[str]:
    parts = urlsplit(url.replace("+cluster", "", 1))
    found = [s for s in (parts.password, unquote(parts.password or "")) if s]
    return sorted(set(found), key=len, reverse=True)


def read_state(spark: SparkSession, url: str, *, namespace: str = DEFAULT_NAMESPACE,
               partitions: int | None = None) -> RedisState:
    """Read every ring, delivery count and audit window of ``namespace`` from ``url``.

    ``partitions``: tasks reading key contents (default: Spark's default
    parallelism). What is read is persisted and materialised once here, so the
    checks reuse it without reading Redis again.
    """
    nodes = _masked_errors(url, lambda: cluster_nodes(url))
    units = [ScanUnit(node, kind, namespace) for node in nodes for kind in KINDS]
    sc = spark.sparkContext
    width = max(1, partitions or sc.defaultParallelism)
    keys = sc.parallelize(units, len(units)).flatMap(_scan)
    rows = keys.repartition(width).mapPartitions(lambda part: _fetch(part, namespace))
    raw = (spark.createDataFrame(rows, RAW_SCHEMA, verifySchema=False)
           .persist(StorageLevel.MEMORY_AND_DISK))
    _masked_errors(url, raw.count)
    tag = F.col("tag")
    chunks = raw.filter(tag == "ids8").select(
        F.col("name").alias("address"), F.col("n1").alias("start"),
        F.posexplode(F.expr("transform(sequence(0, n2 - 1), "
                            f"i -> lower(hex(substring(blob, i * {_DIGEST_BYTES} + 1, "
                            f"{_DIGEST_BYTES}))))")).alias("offset", "digest"))
    ring_ids = chunks.select("address", (F.col("start") + F.col("offset")).alias("pos"),
                             "digest").unionByName(
        raw.filter(tag == "id").select(F.col("name").alias("address"),
                                       F.col("n1").alias("pos"), F.col("s1").alias("digest")))
    return RedisState(
        url=mask_url(url), nodes=len(nodes), raw=raw,
        rings=raw.filter(tag == "ring").select(
            F.col("name").alias("address"), F.col("n1").alias("capacity"),
            F.col("n2").alias("size"), F.col("s1").alias("node")),
        ring_ids=ring_ids,
        counts=raw.filter(tag == "count").select(
            F.col("name").alias("queue"), F.col("s1").alias("message_id"),
            F.col("n1").alias("count")),
        audit=raw.filter(tag == "audit").select(
            F.col("name").alias("scope"), F.col("s1").alias("producer_id"),
            F.col("n1").alias("window"), F.col("s2").alias("highest"),
            F.col("n2").alias("marked")))


def state_summary(state: RedisState) -> dict[str, Any]:
    """Figures for the JSON summary (aggregates only, one job)."""
    per_tag = {row["tag"]: (int(row["rows"]), int(row["n2"] or 0)) for row in
               state.raw.groupBy("tag").agg(F.count(F.lit(1)).alias("rows"),
                                            F.sum("n2").alias("n2")).collect()}
    return {
        "url": state.url,
        "nodes": state.nodes,
        "rings": per_tag.get("ring", (0, 0))[0],
        "ring_ids": per_tag.get("ids8", (0, 0))[1] + per_tag.get("id", (0, 0))[0],
        "delivery_counts": per_tag.get("count", (0, 0))[0],
        "audit_windows": per_tag.get("audit", (0, 0))[0],
    }


__all__ = ["AUDIT_SCHEMA", "COUNT_SCHEMA", "RING_ID_SCHEMA", "RING_SCHEMA", "RedisState",
           "RedisStateError", "ScanUnit", "cluster_nodes", "read_state", "state_summary"]
