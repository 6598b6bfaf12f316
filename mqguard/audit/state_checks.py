"""Checks of the guard's Redis state against the event log (``mqguard audit --redis``).

The event log says what the guard decided; Redis holds what it remembers. They
must agree, or the next decision will be wrong (a duplicate let through, a
poison message redelivered forever). Classes, each defined on what both sides
record (the event log's fields: docs/events.md):

- **ring_mismatch**: per address, the Redis duplicate-ID ring must hold exactly
  the digests (:func:`mqguard.digest.id_digest`) of the last ``capacity``
  duplicate ids the log shows accepted (``sent`` or ``send_failed`` events with a
  ``duplicate_id``: the id entered the ring before the broker answered).
  Flagged: an id among the last ``capacity`` accepted that the ring lacks, a
  ring id the log never shows accepted, and a ring id accepted so long ago that
  it should have been evicted. Events carry their process's time, not Redis'
  insertion order, so ids within ``tolerance_ms`` of the window's edge are
  given the benefit of the doubt. Only addresses the log mentions are judged
  (other rings are counted in the summary), and ``BRIDGE.*`` rings are skipped:
  ``_AMQ_BRIDGE_DUP`` is not in the event log.
- **rejected_without_twin**: a ``duplicate_rejected`` (with a ``duplicate_id``)
  needs an accepted twin (same address and id) such that fewer than
  ``capacity`` other ids were certainly accepted between the two (accepted
  after the twin + tolerance and before the rejection - tolerance); otherwise
  the twin had been evicted and the message was rejected wrongly. Rejections
  by a duplicate in the same transaction (whose twin was never accepted) and of
  bridge ids are skipped.
- **count_over_max**: a Redis delivery count above the address's
  ``max-delivery-attempts``.
- **count_behind**: a message still in flight on a queue (no terminal event
  there) after a failed or repeated delivery, whose Redis count is below the
  highest ``delivery_count`` the log recorded: the count was lost (a flushed
  store), so the limit would be enforced late.
- **count_stale** (not an error): a Redis count left for a message whose
  delivery on that queue ended (the plugin clears it on acknowledgement).
- **dead_letter_untraced**: a message delivered from a dead-letter address
  that is no ``moved`` copy (``new_message_id``) of an original, or a ``moved``
  to a dead-letter address without the original's id: the dead letter cannot
  be traced back.

Counts are judged only for queues the log mentions, and only when the
``delivery_counting`` plugin is enabled in the configuration audited with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mqguard.audit.checks import FINDINGS_SCHEMA, UNGUARDED_PREFIXES, FindingClass
from mqguard.audit.events import CORRUPT_COLUMN, read_schema, valid_event
from mqguard.audit.inline import local_frame
from mqguard.audit.limits import resolve_limits
from mqguard.audit.redis_state import RedisState
from mqguard.config import MqguardConfig
from mqguard.digest import id_digest
from mqguard.events import EventType as E

STATE_CLASSES: tuple[FindingClass, ...] = (
    FindingClass("ring_mismatch", True,
                 "Redis duplicate-ID ring differs from the last accepted ids of the event log"),
    FindingClass("rejected_without_twin", True,
                 "duplicate_rejected without an accepted twin within the id-cache-size window"),
    FindingClass("count_over_max", True, "Redis delivery count above max-delivery-attempts"),
    FindingClass("count_behind", True,
                 "Redis delivery count below the deliveries logged for an in-flight message"),
    FindingClass("dead_letter_untraced", True,
                 "dead letter not traceable to its original's id"),
    FindingClass("count_stale", False, "Redis delivery count left after the delivery ended"),
)

#: Event fields these checks read (a second, narrow read of the event files).
STATE_FIELDS = ("v", "ts", "type", "node", "address", "message_id", "duplicate_id", "queue",
                "target", "new_message_id", "delivery_count", "broker_message_id", "reason")
ACCEPTED = (E.SENT, E.SEND_FAILED)
TERMINAL = (E.ACKED, E.DEAD_LETTERED, E.EXPIRED, E.DELIVERY_DROPPED)
#: Reason text of a rejection whose twin is in the same, never committed, transaction.
_SAME_TRANSACTION = "already in this transaction"
_BRIDGE_CACHE = "cache of BRIDGE."


@dataclass(frozen=True, slots=True)
class StateCheckOptions:
    #: Events of different processes this close in time may be in either order.
    tolerance_ms: int = 2000
    #: Overrides every address's max-delivery-attempts (as ``mqguard audit``'s option).
    max_delivery_attempts: int | None = None


def load_state_events(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    """The readable events of ``files`` with :data:`STATE_FIELDS` and (file, row) order."""
    frame = (spark.read.schema(read_schema(STATE_FIELDS))
             .option("mode", "PERMISSIVE")
             .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
             .option("ignoreMissingFiles", "true")
             .json(list(files)))
    return (frame.select("*", F.col("_metadata.file_path").alias("file"),
                         F.monotonically_increasing_id().alias("row"))
            .filter(valid_event()).drop(CORRUPT_COLUMN))


def _is(*types: str) -> Column:
    return F.col("type").isin([str(t) for t in types])


def _finding(frame: DataFrame, name: str, *, message_id: Column, address: Column,
             detail: Column, ts: Column | None = None, queue: Column | None = None,
             deliveries: Column | None = None, limit: Column | None = None) -> DataFrame:
    none = F.lit(None)
    stamp = (ts if ts is not None else none).cast(LongType())
    return frame.select(
        F.lit(name).alias("class"),
        message_id.cast(StringType()).alias("message_id"),
        address.cast(StringType()).alias("address"),
        (queue if queue is not None else none).cast(StringType()).alias("queue"),
        stamp.alias("ts"),
        F.date_format(F.timestamp_millis(stamp), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("time"),
        (deliveries if deliveries is not None else none).cast(LongType()).alias("deliveries"),
        (limit if limit is not None else none).cast(LongType()).alias("limit"),
        detail.cast(StringType()).alias("detail"),
    )


_CAPACITY_SCHEMA = StructType([
    StructField("address", StringType(), nullable=False),
    StructField("configured", LongType()),
])


def _capacities(spark: SparkSession, events: DataFrame, state: RedisState,
                config: MqguardConfig) -> DataFrame:
    """(address, capacity, in_redis) of every address the log mentions whose ring is judged.

    The capacity is the ring's own (``cap``), else the configured ``id-cache-size``
    (the ring is then missing: every recent accepted id is a mismatch).
    """
    addresses = sorted(r["address"] for r in events.select("address").distinct().collect()
                       if r["address"] is not None and not r["address"].startswith("BRIDGE."))
    repository = config.address_settings_repository()
    enabled = "duplicate_detection" not in config.core.disabled_plugins
    rows = [(a, repository.resolve(a).id_cache_size if enabled else 0) for a in addresses]
    configured = local_frame(spark, rows, _CAPACITY_SCHEMA)
    rings = state.rings.select("address", F.col("capacity").alias("redis_capacity"),
                               F.lit(True).alias("in_redis"))
    joined = configured.join(rings, "address", "left")
    return joined.select(
        "address",
        F.coalesce("redis_capacity", "configured").alias("capacity"),
        F.coalesce("in_redis", F.lit(False)).alias("in_redis"),
    ).filter(F.col("capacity") > 0)


# No annotations: PySpark reads them to guess a pandas UDF (and warns when it cannot).
def _digest_hex(value):  # type: ignore[no-untyped-def]  # noqa: ANN001
    return None if value is None else id_digest(value).hex()


def _digest_udf() -> Any:
    # A plain Python UDF (no Arrow: pyarrow is not a dependency), run only on the
    # events that carry a duplicate id.
    return F.udf(_digest_hex, StringType(), useArrow=False)


def ring_findings(events: DataFrame, state: RedisState, capacities: DataFrame,
                  tolerance_ms: int) -> DataFrame:
    """``ring_mismatch`` findings (see the module docstring)."""
    c = F.col
    tol = F.lit(tolerance_ms)
    digest = _digest_udf()
    accepted = (events.filter(_is(*ACCEPTED) & c("duplicate_id").isNotNull()
                              & c("address").isNotNull())
                .join(F.broadcast(capacities), "address"))
    newest_first = Window.partitionBy("address").orderBy(c("ts").desc(), c("file").desc(),
                                                         c("row").desc())
    ranked = accepted.select("address", "capacity", "message_id", "ts",
                             digest(c("duplicate_id")).alias("digest"),
                             F.row_number().over(newest_first).alias("k"))
    # The oldest id that should still be in the ring: its time is the window's edge.
    edge = (ranked.filter(c("k") == c("capacity"))
            .select("address", c("ts").alias("edge_ts")))
    per_digest = Window.partitionBy("address", "digest").orderBy("k")
    log_side = (ranked.withColumn("n", F.row_number().over(per_digest)).filter(c("n") == 1)
                .join(edge, "address", "left"))
    ring_side = (state.ring_ids.join(F.broadcast(capacities.select("address", "capacity")),
                                     "address")
                 .select("address", "digest", "pos",
                         c("capacity").alias("ring_capacity")))
    both = log_side.join(ring_side, ["address", "digest"], "full_outer")
    cap = F.coalesce(c("capacity"), c("ring_capacity"))
    expected = c("k") <= cap
    near_edge_after = c("edge_ts").isNotNull() & (c("ts") <= c("edge_ts") + tol)
    near_edge_before = c("edge_ts").isNull() | (c("ts") >= c("edge_ts") - tol)
    missing = c("k").isNotNull() & expected & c("pos").isNull() & ~near_edge_after
    unknown = c("pos").isNotNull() & c("k").isNull()
    evicted = c("pos").isNotNull() & c("k").isNotNull() & ~expected & ~near_edge_before
    flagged = both.filter(missing | unknown | evicted)
    detail = (F.when(missing, F.format_string(
                  "accepted as the %d-th newest id (ring capacity %d), but not in the Redis ring",
                  c("k"), cap))
              .when(unknown, F.format_string(
                  "digest %s at ring position %d was never accepted according to the event log",
                  c("digest"), c("pos")))
              .otherwise(F.format_string(
                  "digest at ring position %d was accepted as the %d-th newest id: beyond the "
                  "capacity %d, it should have been evicted", c("pos"), c("k"), cap)))
    return _finding(flagged, "ring_mismatch",
                    message_id=F.coalesce(c("message_id"), F.concat(F.lit("digest:"),
                                                                    c("digest"))),
                    address=c("address"), ts=c("ts"), detail=detail)


def rejection_findings(events: DataFrame, capacities: DataFrame,
                       tolerance_ms: int) -> DataFrame:
    """``rejected_without_twin`` findings (see the module docstring)."""
    c = F.col
    tol = F.lit(tolerance_ms)
    rejected = (events.filter(_is(E.DUPLICATE_REJECTED) & c("duplicate_id").isNotNull()
                              & c("address").isNotNull()
                              & ~F.coalesce(c("reason").contains(_SAME_TRANSACTION)
                                            | c("reason").contains(_BRIDGE_CACHE), F.lit(False)))
                .join(F.broadcast(capacities), "address")
                .select("address", "duplicate_id", "capacity", "message_id", "ts",
                        F.concat_ws("#", "file", c("row").cast("string")).alias("rid")))
    accepted = (events.filter(_is(*ACCEPTED) & c("duplicate_id").isNotNull()
                              & c("address").isNotNull())
                .join(F.broadcast(capacities.select("address")), "address")
                .select("address", "duplicate_id", c("ts").alias("twin_ts"),
                        F.concat_ws("#", "file", c("row").cast("string")).alias("twin")))
    # A deterministic pair id: the frame is used three times and recomputed each time.
    pairs = (rejected.join(accepted, ["address", "duplicate_id"])
             .filter(c("twin_ts") <= c("ts") + tol)
             .withColumn("pid", F.concat_ws("|", "rid", "twin")))
    # Running count of accepted ids per address; probes read it at two times:
    # before the rejection (ts - tol, strictly earlier: ord 0 sorts before an
    # accepted id of the same ms) and after the twin (twin_ts + tol, inclusive: ord 2).
    stream = accepted.select("address", c("twin_ts").alias("at"), F.lit(1).alias("ord"),
                             F.lit(1).alias("w"), F.lit(None).cast(StringType()).alias("pid"),
                             F.lit(None).cast(StringType()).alias("role"))
    probes = pairs.select("address", (c("ts") - tol).alias("at"), F.lit(0).alias("ord"),
                          F.lit(0).alias("w"), "pid", F.lit("r").alias("role")).unionByName(
        pairs.select("address", (c("twin_ts") + tol).alias("at"), F.lit(2).alias("ord"),
                     F.lit(0).alias("w"), "pid", F.lit("t").alias("role")))
    running = Window.partitionBy("address").orderBy("at", "ord").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    counted = (stream.unionByName(probes).withColumn("n", F.sum("w").over(running))
               .filter(c("pid").isNotNull())
               .groupBy("pid").agg(F.sum(F.when(c("role") == "r", c("n"))).alias("before_r"),
                                   F.sum(F.when(c("role") == "t", c("n"))).alias("after_t")))
    ok = (pairs.join(counted, "pid")
          .filter(c("before_r") - c("after_t") < c("capacity"))
          .select("rid").distinct())
    twins = pairs.groupBy("rid").agg(F.count(F.lit(1)).alias("twins"))
    flagged = (rejected.join(ok, "rid", "left_anti").join(twins, "rid", "left"))
    detail = F.when(c("twins").isNull(), F.format_string(
        "duplicate id %s rejected, but no accepted twin on this address before it",
        c("duplicate_id"))).otherwise(F.format_string(
            "duplicate id %s rejected, but more than %d ids were accepted since each of its "
            "%d twin(s): the twin had been evicted", c("duplicate_id"), c("capacity"),
            c("twins")))
    return _finding(flagged, "rejected_without_twin",
                    message_id=F.coalesce(c("message_id"),
                                          F.concat(F.lit("duplicate_id:"), c("duplicate_id"))),
                    address=c("address"), ts=c("ts"), detail=detail, limit=c("capacity"))


_LIMIT_SCHEMA = StructType([
    StructField("address", StringType(), nullable=False),
    StructField("max_delivery_attempts", LongType()),
    StructField("dead_letter_target", StringType()),
])


def count_findings(spark: SparkSession, events: DataFrame, state: RedisState,
                   config: MqguardConfig, options: StateCheckOptions) -> DataFrame:
    """``count_over_max``, ``count_behind`` and ``count_stale`` findings."""
    c = F.col
    if "delivery_counting" in config.core.disabled_plugins:
        return local_frame(spark, [], FINDINGS_SCHEMA)
    on_queue = events.filter(c("message_id").isNotNull() & c("queue").isNotNull())
    facts = on_queue.groupBy("queue", "message_id").agg(
        F.first(c("address"), ignorenulls=True).alias("address"),
        F.max(F.when(_is(E.DELIVERED), c("delivery_count"))).alias("logged"),
        F.count_if(_is(E.DELIVERED)).alias("deliveries"),
        F.count_if(_is(E.HANDLER_FAILED)).alias("failures"),
        F.count_if(_is(*TERMINAL)).alias("terminal"),
        F.max("ts").alias("last_ts"))
    queues = on_queue.select("queue", "address").filter(c("address").isNotNull()).distinct()
    address_rows = [r["address"] for r in queues.select("address").distinct().collect()]
    limits = local_frame(
        spark,
        [(x.address, x.max_delivery_attempts, x.dead_letter_target) for x in resolve_limits(
            config, address_rows, max_delivery_attempts=options.max_delivery_attempts)],
        _LIMIT_SCHEMA)
    judged_queues = queues.groupBy("queue").agg(F.min("address").alias("queue_address"))
    counts = state.counts.join(F.broadcast(judged_queues), "queue")
    both = (counts.join(facts, ["queue", "message_id"], "full_outer")
            .filter(c("queue_address").isNotNull() | c("address").isNotNull())
            .withColumn("address", F.coalesce("address", "queue_address"))
            .join(F.broadcast(limits), "address", "left"))
    limit = c("max_delivery_attempts")
    in_flight = F.coalesce(c("terminal"), F.lit(0)) == 0
    expected = F.greatest(F.coalesce(c("logged"), F.lit(0)),
                          F.when(c("failures") > 0, F.lit(1)).otherwise(F.lit(0)))
    repeated = (c("failures") > 0) | (c("logged") > 1)
    stored = F.coalesce(c("count"), F.lit(0))
    over = both.filter(c("count").isNotNull() & limit.isNotNull() & (c("count") > limit))
    behind = both.filter(c("deliveries").isNotNull() & in_flight
                         & F.coalesce(repeated, F.lit(False)) & (stored < expected))
    stale = both.filter(c("count").isNotNull() & (c("terminal") > 0))
    return _finding(
        over, "count_over_max", message_id=c("message_id"), address=c("address"),
        queue=c("queue"), ts=c("last_ts"), deliveries=c("count"), limit=limit,
        detail=F.format_string("Redis counts %d deliveries on queue %s > max-delivery-attempts "
                               "%d", c("count"), c("queue"), limit),
    ).unionByName(_finding(
        behind, "count_behind", message_id=c("message_id"), address=c("address"),
        queue=c("queue"), ts=c("last_ts"), deliveries=stored, limit=limit,
        detail=F.format_string("in flight after delivery %d (%d handler failure(s)), but Redis "
                               "counts %d on queue %s: a count was lost", expected,
                               c("failures"), stored, c("queue")),
    )).unionByName(_finding(
        stale, "count_stale", message_id=c("message_id"), address=c("address"),
        queue=c("queue"), ts=c("last_ts"), deliveries=c("count"), limit=limit,
        detail=F.format_string("Redis still counts %d on queue %s; the delivery ended",
                               c("count"), c("queue")),
    ))


def untraced_findings(spark: SparkSession, events: DataFrame,
                      config: MqguardConfig) -> DataFrame:
    """``dead_letter_untraced`` findings (see the module docstring)."""
    c = F.col
    senders = [r["address"] for r in events.filter(_is(E.SENT) & c("address").isNotNull())
               .select("address").distinct().collect()]
    targets = sorted({x.dead_letter_target for x in resolve_limits(config, senders)
                      if x.dead_letter_target})
    if not targets:
        return local_frame(spark, [], FINDINGS_SCHEMA)
    copies = (events.filter(_is(E.MOVED) & c("new_message_id").isNotNull())
              .select(c("new_message_id").alias("message_id")).distinct())
    guarded = ~(c("message_id").startswith(UNGUARDED_PREFIXES[0])
                | c("message_id").startswith(UNGUARDED_PREFIXES[1]))
    on_dla = (events.filter(_is(E.DELIVERED) & c("address").isin(targets)
                            & c("message_id").isNotNull() & guarded)
              .groupBy("message_id", "address").agg(F.min("ts").alias("ts"),
                                                    F.first("queue").alias("queue")))
    untraced = on_dla.join(copies, "message_id", "left_anti")
    anonymous = events.filter(_is(E.MOVED) & c("target").isin(targets)
                              & (c("message_id").isNull() | c("new_message_id").isNull()))
    return _finding(
        untraced, "dead_letter_untraced", message_id=c("message_id"), address=c("address"),
        queue=c("queue"), ts=c("ts"),
        detail=F.lit("delivered from a dead-letter address, but no moved event made it: "
                     "its original is unknown"),
    ).unionByName(_finding(
        anonymous, "dead_letter_untraced",
        message_id=F.coalesce(c("new_message_id"), c("message_id")), address=c("target"),
        queue=c("queue"), ts=c("ts"),
        detail=F.lit("moved to a dead-letter address without the original's and the copy's "
                     "ids both recorded"),
    ))


def state_findings(spark: SparkSession, events: DataFrame, state: RedisState,
                   config: MqguardConfig, options: StateCheckOptions = StateCheckOptions()
                   ) -> DataFrame:
    """Every finding of this module (:data:`~mqguard.audit.checks.FINDINGS_SCHEMA`)."""
    # ``events`` should be persisted by the caller (cross_checks.prepare does): every
    # check below reads it. ``capacities`` is a small local table joined with the
    # persisted Redis state: cheap to recompute.
    capacities = _capacities(spark, events, state, config)
    parts = [
        ring_findings(events, state, capacities, options.tolerance_ms),
        rejection_findings(events, capacities, options.tolerance_ms),
        count_findings(spark, events, state, config, options),
        untraced_findings(spark, events, config),
    ]
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    return found.select(*FINDINGS_SCHEMA.fieldNames())


__all__ = ["STATE_CLASSES", "STATE_FIELDS", "StateCheckOptions", "load_state_events",
           "state_findings"]
