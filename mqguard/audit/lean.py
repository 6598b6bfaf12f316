"""The lean plan: the hash plan on 64-bit keys, strings only for the survivors.

:mod:`mqguard.audit.hashed` groups by the message id *string* and carries every
event column through the shuffle. Its aggregations then run Spark's generic
hash map (variable-width keys) and the shuffle moves about 40 bytes of id per
event. This plan projects every event once into a few fixed-width columns:

- ``key``: ``xxhash64`` of the message id (of a ``moved`` event's copy id for the
  row it contributes to the copy), ``chk``: its 32-bit Murmur3 ``hash`` (an
  independent function, for the collision check below); events without a
  message id take their scan row as key and ``m`` false, as the string plan
  gives them a key of their own;
- ``gq`` / ``gt`` / ``addr``: ``xxhash64`` of the queue, target and address;
- ``code``: a small integer for the event type (one ``CASE`` over ``type``, with
  the ``acked`` variants the checks tell apart: a handling, a legacy ack, any
  other), ``val`` the one number the type needs (delivery count, redelivery due
  time, the handled delivery's time), ``late_by`` the lateness of a late delivery.

Stage 1 (by message, queue, target, address) and stage 2 (by message) are then
the hash plan's aggregations on these columns: fixed-width keys and buffers, so
Spark uses its code-generated fast hash map, and nothing is cached between them.

Exactness: two ids with the same 64-bit hash would be merged into one message.
Stage 1 and 2 keep ``min(chk)`` and ``max(chk)`` of every key; when they differ
(two ids share ``key``; their 32-bit hashes then differ with probability
1 - 2^-32) the runner does not trust the result and audits again with the
string-keyed hash plan (``plan`` says so in the summary).

Names come back only where they are needed: the address dictionary from one
``distinct`` over the address and target columns (a few rows), and the message
ids, per-queue facts and target sets of the classification's pre-filter
survivors (a few in a thousand) from a second read of the log keeping just the
events whose key hash is a survivor's (a broadcast semi join), grouped by the
string plan (:func:`mqguard.audit.hashed.group_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mqguard.audit.checks import COPIED, TERMINAL, UNGUARDED_PREFIXES, CheckOptions, event_rows
from mqguard.audit.events import EventInputs, valid_event
from mqguard.audit.footers import FileNames, parquet_names
from mqguard.audit.hashed import _FATE_BITS, FATES, details_of, group_rows
from mqguard.events import EventType as E
from mqguard.verdict import AckReason

# Type codes (see module doc). Order does not matter; fates are coded separately.
OTHER, SENT, SEND_FAILED, DELIVERED, HANDLER_FAILED = 0, 1, 2, 3, 4
ACKED, ACK_HANDLING, ACK_LEGACY, NACKED, DELIVERY_DROPPED = 5, 6, 7, 8, 9
REDELIVERY_SCHEDULED, DEAD_LETTERED, EXPIRED, MOVED_ON_QUEUE, MOVED = 10, 11, 12, 13, 14
DUP_SUPPRESSED, DUP_LOGGED, TRANSACTION, COPY, BAD, UNSUPPORTED = 15, 16, 17, 18, 19, 20

_ACKS = (ACKED, ACK_HANDLING, ACK_LEGACY)
#: DELIVER_PATH of :mod:`mqguard.audit.checks` plus ``moved`` on a queue, as codes.
_DELIVER_PATH = (DELIVERED, HANDLER_FAILED, *_ACKS, NACKED, DELIVERY_DROPPED,
                 REDELIVERY_SCHEDULED, DEAD_LETTERED, EXPIRED, DUP_SUPPRESSED, DUP_LOGGED,
                 MOVED_ON_QUEUE)
_TERMINAL_CODES = {str(E.ACKED): _ACKS, str(E.DEAD_LETTERED): (DEAD_LETTERED,),
                   str(E.EXPIRED): (EXPIRED,), str(E.DELIVERY_DROPPED): (DELIVERY_DROPPED,)}
assert set(_TERMINAL_CODES) == {str(t) for t in TERMINAL}


def _in(*codes: int) -> Column:
    return F.col("code").isin(list(codes))


def narrow(events: DataFrame, options: CheckOptions | None = None) -> DataFrame:
    """Every event (and copy row) as the fixed-width columns of the module doc."""
    options = options or CheckOptions()
    c = F.col
    rows = event_rows(events)
    t = c("type")
    queued = c("queue").isNotNull()
    normal_ack = (t == F.lit(str(E.ACKED))) & (c("ack_reason") == F.lit(AckReason.NORMAL.value)) \
        & queued
    simple = {E.SENT: SENT, E.SEND_FAILED: SEND_FAILED, E.DELIVERED: DELIVERED,
              E.HANDLER_FAILED: HANDLER_FAILED, E.NACKED: NACKED,
              E.DELIVERY_DROPPED: DELIVERY_DROPPED,
              E.REDELIVERY_SCHEDULED: REDELIVERY_SCHEDULED, E.DEAD_LETTERED: DEAD_LETTERED,
              E.EXPIRED: EXPIRED, E.DUPLICATE_DELIVERY_SUPPRESSED: DUP_SUPPRESSED,
              E.DUPLICATE_DELIVERY_LOGGED: DUP_LOGGED}
    code = F.when(t.isNull(), F.when(c("unsupported"), F.lit(UNSUPPORTED)).otherwise(F.lit(BAD)))
    code = code.when(t == F.lit(COPIED), F.lit(COPY))
    code = code.when(normal_ack & F.coalesce(c("handled"), F.lit(False))
                     & c("delivered_ts").isNotNull(), F.lit(ACK_HANDLING))
    code = code.when(normal_ack & c("handled").isNull(), F.lit(ACK_LEGACY))
    code = code.when(t == F.lit(str(E.ACKED)), F.lit(ACKED))
    code = code.when(t == F.lit(str(E.MOVED)),
                     F.when(queued, F.lit(MOVED_ON_QUEUE)).otherwise(F.lit(MOVED)))
    for name, number in simple.items():
        code = code.when(t == F.lit(str(name)), F.lit(number))
    code = code.when(t.startswith("tx_"), F.lit(TRANSACTION)).otherwise(F.lit(OTHER))

    names_target = t.isin(str(E.MOVED), str(E.DEAD_LETTERED), str(E.EXPIRED)) \
        & c("target").isNotNull()
    delivered = t == F.lit(str(E.DELIVERED))
    val = (F.when(delivered | (t == F.lit(str(E.DEAD_LETTERED))), c("delivery_count"))
           .when(t == F.lit(str(E.REDELIVERY_SCHEDULED)),
                 c("ts") + F.coalesce(c("delay_ms"), F.lit(0)))
           .when(t == F.lit(str(E.ACKED)), c("delivered_ts")))
    late_by = F.when(delivered & (c("expiration") > 0)
                     & (c("ts") > c("expiration") + F.lit(options.expiry_tolerance_ms)),
                     c("ts") - c("expiration"))
    m = c("is_message")
    key = c("key")
    return rows.select(
        m.alias("m"),
        F.when(m, F.xxhash64(key)).otherwise(c("row")).alias("key"),
        F.when(m, F.hash(key)).otherwise(F.lit(0)).alias("chk"),
        (m & (key.startswith(UNGUARDED_PREFIXES[0]) | key.startswith(UNGUARDED_PREFIXES[1]))
         ).alias("ung"),
        F.when(~names_target & queued, F.xxhash64("queue")).alias("gq"),
        F.when(names_target, F.xxhash64("target")).alias("gt"),
        F.when(c("address").isNotNull(), F.xxhash64("address")).alias("addr"),
        code.alias("code"), "ts", val.alias("val"), late_by.alias("late_by"), "file_rank",
        "row")




def facts(rows: DataFrame) -> DataFrame:
    """One aggregation by (``m``, ``key``) of :func:`narrow`'s rows: the columns of
    :func:`mqguard.audit.hashed.facts` with ``key`` and ``address_h`` hashes, the fate as
    its code (``terminal``: ``ts * 8 + code``), plus ``guarded``, ``collisions`` (true:
    two ids share the key), ``legacy`` and ``unranked`` (events whose file was not
    matched to the listing: their writing order would be wrong).

    The per-queue scalars (``max_queue_deliveries``, ``any_duplicated``, ``max_late``)
    and ``dead_letters`` / ``expiries`` are taken over the whole message: exact for a
    message on one queue, and for one on several (a topic's subscriptions) a
    necessary condition of the per-queue one, which is all the pre-filter needs:
    the survivors' exact per-queue facts come from :func:`survivor_details`.

    ``any_duplicated`` is such a condition too: a queue's duplicate is a second
    handling, or a delivery after the first handling in writing order, which is not
    the handled delivery itself (written before its ack), so the message has two
    deliveries and its last one is no earlier than the first handled one. A message
    redelivered and then handled once passes it (the survivors' read decides); the
    exact positions (:func:`mqguard.audit.hashed._position`, a ``DECIMAL(38, 0)``)
    would turn off Spark's fast hash map for every message.
    """
    c = F.col
    code = c("code")
    handling = code == F.lit(ACK_HANDLING)
    delivered = code == F.lit(DELIVERED)
    fate_code = F.lit(None).cast("long")
    for number, name in enumerate(FATES):
        fate_code = F.when(_in(*_TERMINAL_CODES[name]), F.lit(number)).otherwise(fate_code)
    readable = ~_in(COPY, BAD, UNSUPPORTED)
    per_key = rows.groupBy("m", "key").agg(
        (F.min("chk") != F.max("chk")).alias("collisions"),
        F.max("ung").alias("ung"),
        F.coalesce(F.max(F.when(code == F.lit(SENT), c("addr"))),
                   F.max(F.when(code == F.lit(COPY), c("addr"))),
                   F.max("addr")).alias("address_h"),
        F.count_if(code != F.lit(COPY)).alias("events"),
        F.count_if(code == F.lit(BAD)).alias("bad"),
        F.count_if(code == F.lit(UNSUPPORTED)).alias("unsupported"),
        F.count_if(code == F.lit(SENT)).alias("sent"),
        F.min(F.when(code == F.lit(SENT), c("ts"))).alias("first_sent_ts"),
        F.count_if(code == F.lit(SEND_FAILED)).alias("send_failed"),
        F.count_if(code == F.lit(COPY)).alias("copies"),
        F.count_if(_in(*_DELIVER_PATH)).alias("deliver_path"),
        F.count_if(delivered).alias("delivered"),
        F.max(F.when(delivered, c("val"))).alias("max_count"),
        F.min(F.when(fate_code.isNotNull(), c("ts") * F.lit(_FATE_BITS) + fate_code)
              ).alias("terminal"),
        F.min(F.when(readable, c("ts"))).alias("first_ts"),
        F.max(F.when(readable, c("ts"))).alias("last_ts"),
        F.max(F.when(code == F.lit(REDELIVERY_SCHEDULED), c("val"))).alias("redelivery_due"),
        F.min(F.when(code == F.lit(DEAD_LETTERED), c("val"))).alias("dead_letter_count"),
        F.count_if((code == F.lit(DEAD_LETTERED)) & c("gt").isNotNull()).alias("dead_letters"),
        F.count_if((code == F.lit(EXPIRED)) & c("gt").isNotNull()).alias("expiries"),
        F.count_if(code == F.lit(TRANSACTION)).alias("transactions"),
        F.count_if(code == F.lit(ACK_LEGACY)).alias("legacy"),
        F.count_if(c("file_rank").isNull()).alias("unranked"),
        F.count_if(handling).alias("handlings"),
        # Times, not the (time, file, row) positions of the hash plan: a DECIMAL(38)
        # buffer turns off Spark's fast hash map for the whole aggregation.
        F.min(F.when(handling, c("val"))).alias("first_handled_ts"),
        F.max(F.when(delivered, c("ts"))).alias("last_delivery_ts"),
        F.count_if(c("late_by").isNotNull()).alias("max_late"))
    return per_key.select(
        "key", c("m").alias("is_message"), (~c("ung")).alias("guarded"), "collisions",
        "legacy", "unranked", "address_h", "events", "bad", "unsupported", "sent",
        "first_sent_ts",
        "send_failed", "copies", "deliver_path", "delivered",
        F.floor(c("terminal") / F.lit(_FATE_BITS)).cast(LongType()).alias("terminal_ts"),
        (c("terminal") % F.lit(_FATE_BITS)).cast("int").alias("fate_code"),
        "first_ts", "last_ts", "redelivery_due", "dead_letter_count", "transactions",
        "dead_letters", "expiries",
        F.greatest(c("delivered"), F.coalesce(c("max_count"), F.lit(0))
                   ).alias("max_queue_deliveries"),
        ((c("handlings") >= 2)
         | F.coalesce((c("delivered") >= 2) & (c("last_delivery_ts") >= c("first_handled_ts")),
                      F.lit(False))).alias("any_duplicated"),
        "max_late")


NAMES_SCHEMA = StructType([StructField("address_h", LongType()),
                           StructField("address", StringType())])


@dataclass(frozen=True)
class Names:
    """The distinct address (and target) names of the log with their 64-bit hashes,
    and the time range of its readable events (the watermark's and the charts' base)."""

    addresses: list[tuple[int, str]]
    first_ts: int | None
    last_ts: int | None

    def frame(self, spark: SparkSession) -> DataFrame:
        return spark.createDataFrame(self.addresses, NAMES_SCHEMA)

    def by_hash(self) -> dict[int, str]:
        return dict(self.addresses)


def address_names(inputs: EventInputs) -> Names:
    """The names and time range of every event of ``inputs``: the local Parquet files'
    from pyarrow (:mod:`mqguard.audit.footers`: statistics and dictionaries, no scan of
    the events), the other files' from one Spark pass over their address, target and
    time columns (a few rows)."""
    found = parquet_names(inputs.local_parquet)
    if inputs.others is not None:
        found.merge(_spark_names(inputs.others))
    present = sorted(found.names)
    hashed_names = list(zip(xxhash64_strings(present), present, strict=True))
    if len({h for h, _ in hashed_names}) != len(hashed_names):
        raise RuntimeError("two addresses share a 64-bit hash")
    return Names(hashed_names, found.first_ts, found.last_ts)


def _spark_names(events: DataFrame) -> FileNames:
    c = F.col
    readable_ts = F.when(valid_event(), c("ts"))
    pairs = (events.groupBy("address", "target")
             .agg(F.min(readable_ts).alias("first"), F.max(readable_ts).alias("last"))
             .collect())
    found = FileNames({name for r in pairs for name in (r["address"], r["target"])
                       if name is not None})
    for r in pairs:
        found.add_range(r["first"], r["last"])
    return found


def xxhash64_strings(values: list[str]) -> list[int]:
    """Spark's ``xxhash64`` of each string, computed here: XXH64 of the UTF-8 bytes with
    Spark's seed 42, as a signed long (tested against Spark). A Spark job for a few
    names would be the session's first, and a cold JVM took 5-9 s to run it."""
    import xxhash

    hashed = (xxhash.xxh64_intdigest(value.encode(), seed=_SPARK_XXHASH64_SEED)
              for value in values)
    return [h - (1 << 64) if h >= 1 << 63 else h for h in hashed]


_SPARK_XXHASH64_SEED = 42


def _by_address(values: dict[int, int | None]) -> Column:
    """A column of ``values[address_h]`` (null for other addresses), without a join."""
    column = F.lit(None).cast(LongType())
    for h, value in values.items():
        if value is not None:
            column = F.when(F.col("address_h") == F.lit(h), F.lit(value)).otherwise(column)
    return column


def summarise(facts_frame: DataFrame, names: Names, limits: dict[str, int | None],
              watermark: int) -> DataFrame:
    """The one pass over the facts: a few rows, cached by the runner.

    Grouped by (address, chart bucket, fate, capped deliveries, survivor key): the
    per-address figures and the chart counts are sums of these groups, and every
    message the pre-filter (:func:`mqguard.audit.checks.may_be_finding`) keeps is a
    group of its own (``survivor`` true) holding its facts.
    """
    from mqguard.audit.checks import may_be_finding
    from mqguard.audit.report import BUCKETS, MAX_DELIVERIES

    c = F.col
    limit = _by_address({h: limits.get(name) for h, name in names.addresses})
    keep = may_be_finding(c("guarded"), F.lit(watermark).cast(LongType()), limit)
    survivor = c("is_message") & keep
    at = F.coalesce(c("first_sent_ts"), c("first_ts"))
    charted = c("is_message") & at.isNotNull()
    first = names.first_ts if names.first_ts is not None else 0
    last = names.last_ts if names.last_ts is not None else first
    width = max(1, -(-(last - first + 1) // BUCKETS))
    message = c("is_message")
    with_fate = message & c("terminal_ts").isNotNull()
    fact_columns = [name for name in facts_frame.columns
                    if name not in ("key", "is_message", "address_h", "unranked")]
    return facts_frame.groupBy(
        "address_h",
        survivor.alias("survivor"),
        F.when(survivor, c("key")).alias("key"),
        F.when(charted, ((at - F.lit(first)) / F.lit(width)).cast("long")).alias("bucket"),
        F.when(charted, c("fate_code")).alias("fate_code_c"),
        F.when(charted, F.least(c("delivered"), F.lit(MAX_DELIVERIES))).alias("deliveries_c"),
    ).agg(
        F.count_if(charted).alias("charted"),
        F.count_if(message).alias("messages"),
        F.sum("events").alias("sum_events"),
        F.sum("bad").alias("sum_bad"),
        F.sum("unsupported").alias("sum_unsupported"),
        F.sum("transactions").alias("sum_transactions"),
        F.count_if(message & (c("sent") > 0)).alias("sum_sent"),
        F.sum("delivered").alias("sum_deliveries"),
        F.count_if(with_fate).alias("with_fate"),
        F.min("first_ts").alias("min_first_ts"),
        F.max("last_ts").alias("max_last_ts"),
        F.max(F.when(with_fate, c("first_sent_ts"))).alias("drained_to"),
        F.sum("legacy").alias("sum_legacy"),
        F.sum("unranked").alias("sum_unranked"),
        F.count_if("collisions").alias("sum_collisions"),
        # A survivor's group is its one message: max() is its value.
        *[F.max(F.when(survivor, c(name))).alias(name) for name in fact_columns],
    ).select("*", F.lit(width).alias("width"))


def stats_of(summary: DataFrame, names: Names) -> list[dict[str, object]]:
    """The per-address figures of :func:`mqguard.audit.checks.address_stats` (plus
    ``legacy``, ``unranked`` and ``collisions``) from :func:`summarise`'s rows."""
    rows = summary.groupBy("address_h").agg(
        F.sum("messages").alias("messages"), F.sum("sum_events").alias("events"),
        F.sum("sum_bad").alias("bad"), F.sum("sum_unsupported").alias("unsupported"),
        F.sum("sum_transactions").alias("transactions"), F.sum("sum_sent").alias("sent"),
        F.sum("sum_deliveries").alias("deliveries"), F.sum("with_fate").alias("with_fate"),
        F.min("min_first_ts").alias("first_ts"), F.max("max_last_ts").alias("last_ts"),
        F.max("drained_to").alias("drained_to"), F.sum("sum_legacy").alias("legacy"),
        F.sum("sum_unranked").alias("unranked"),
        F.sum("sum_collisions").alias("collisions")).collect()
    by_hash = names.by_hash()
    stats = []
    for r in rows:
        row = r.asDict()
        h = row.pop("address_h")
        row["address"] = by_hash[h] if h is not None else None
        stats.append({k: (int(v) if isinstance(v, int | float) and k != "address" else v)
                      for k, v in row.items()})
    return stats


def chart_of(summary: DataFrame, names: Names) -> dict[str, object]:
    """:func:`mqguard.audit.report.chart_data` from :func:`summarise`'s rows."""
    if names.first_ts is None or names.last_ts is None:
        return {"first_ts": None, "width_ms": 1, "rows": []}
    rows = (summary.filter(F.col("charted") > 0)
            .groupBy("address_h", "bucket", "fate_code_c", "deliveries_c", "width")
            .agg(F.sum("charted").alias("count")).collect())
    by_hash = names.by_hash()
    width = rows[0]["width"] if rows else 1
    return {"first_ts": names.first_ts, "width_ms": int(width),
            "rows": [(by_hash.get(r["address_h"], "") if r["address_h"] is not None else "",
                      int(r["bucket"]),
                      FATES[r["fate_code_c"]] if r["fate_code_c"] is not None else "none",
                      int(r["deliveries_c"]), int(r["count"])) for r in rows]}


def survivors(summary: DataFrame, names: DataFrame) -> DataFrame:
    """The pre-filter's survivors as facts rows for :func:`mqguard.audit.checks.classify`
    (``key`` still the hash; its details bring the message id)."""
    c = F.col
    fates = F.array(*[F.lit(name) for name in FATES])
    rows = summary.filter(c("survivor")).join(F.broadcast(names), "address_h", "left")
    return rows.select(
        "key", F.lit(True).alias("is_message"), "address",
        *[name for name in summary.columns if name in _FACT_COLUMNS],
        F.element_at(fates, c("fate_code") + 1).alias("fate"))


_FACT_COLUMNS = ("guarded", "events", "bad", "unsupported", "sent", "first_sent_ts",
                 "send_failed", "copies", "deliver_path", "delivered", "terminal_ts",
                 "first_ts", "last_ts", "redelivery_due", "dead_letter_count", "transactions",
                 "dead_letters", "expiries", "max_queue_deliveries", "any_duplicated",
                 "max_late")


def survivor_details(events: DataFrame, survivors: DataFrame,
                     options: CheckOptions | None = None) -> DataFrame:
    """(``key`` long, ``message_id``, ``queues``, target sets) of ``survivors``' keys,
    from the events whose key hash is one of them (a second read, semi-joined with the
    survivors' keys by broadcast: a list of them in the plan as an ``IN`` set took the
    driver 96 s to plan at 40,000 survivors)."""
    c = F.col
    keys = survivors.select(c("key").alias("key_h")).distinct()
    rows = (event_rows(events).filter(c("is_message"))
            .join(F.broadcast(keys), F.xxhash64("key") == c("key_h"), "left_semi"))
    found = details_of(group_rows(rows, options))
    return found.select(F.xxhash64("key").alias("key"), c("key").alias("message_id"),
                        "queues", "dead_letter_targets", "expiry_targets", "moved_targets")
