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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mqguard.audit.checks import COPIED, TERMINAL, UNGUARDED_PREFIXES, CheckOptions, event_rows
from mqguard.audit.events import EventInputs, valid_event
from mqguard.audit.footers import FileNames, parquet_names
from mqguard.audit.hashed import _FATE_BITS, FATES, details_of, group_rows
from mqguard.audit.inline import local_frame, sql_string
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


def _in(*codes: int) -> str:
    return f"code IN ({', '.join(str(code) for code in codes)})"


# The expressions below are SQL text, one ``F.expr`` per output column: built with
# the Column API they took ~7,800 Py4J round trips (1,600 for this projection), each
# a fraction of a millisecond or more -- seconds of driver time before a job ran.


def narrow(events: DataFrame, options: CheckOptions | None = None) -> DataFrame:
    """Every event (and copy row) as the fixed-width columns of the module doc."""
    options = options or CheckOptions()
    rows = event_rows(events)
    q = sql_string
    simple = {E.SENT: SENT, E.SEND_FAILED: SEND_FAILED, E.DELIVERED: DELIVERED,
              E.HANDLER_FAILED: HANDLER_FAILED, E.NACKED: NACKED,
              E.DELIVERY_DROPPED: DELIVERY_DROPPED,
              E.REDELIVERY_SCHEDULED: REDELIVERY_SCHEDULED, E.DEAD_LETTERED: DEAD_LETTERED,
              E.EXPIRED: EXPIRED, E.DUPLICATE_DELIVERY_SUPPRESSED: DUP_SUPPRESSED,
              E.DUPLICATE_DELIVERY_LOGGED: DUP_LOGGED}
    normal_ack = (f"type = {q(E.ACKED)} AND ack_reason = {q(AckReason.NORMAL.value)} "
                  "AND queue IS NOT NULL")
    code = " ".join([
        f"CASE WHEN type IS NULL THEN (CASE WHEN unsupported THEN {UNSUPPORTED} ELSE {BAD} END)",
        f"WHEN type = {q(COPIED)} THEN {COPY}",
        f"WHEN {normal_ack} AND coalesce(handled, false) AND delivered_ts IS NOT NULL "
        f"THEN {ACK_HANDLING}",
        f"WHEN {normal_ack} AND handled IS NULL THEN {ACK_LEGACY}",
        f"WHEN type = {q(E.ACKED)} THEN {ACKED}",
        f"WHEN type = {q(E.MOVED)} THEN (CASE WHEN queue IS NOT NULL THEN {MOVED_ON_QUEUE} "
        f"ELSE {MOVED} END)",
        *[f"WHEN type = {q(name)} THEN {number}" for name, number in simple.items()],
        f"WHEN startswith(type, 'tx_') THEN {TRANSACTION} ELSE {OTHER} END"])
    names_target = (f"(type IN ({q(E.MOVED)}, {q(E.DEAD_LETTERED)}, {q(E.EXPIRED)}) "
                    "AND target IS NOT NULL)")
    val = (f"CASE WHEN type = {q(E.DELIVERED)} OR type = {q(E.DEAD_LETTERED)} "
           f"THEN delivery_count WHEN type = {q(E.REDELIVERY_SCHEDULED)} "
           f"THEN ts + coalesce(delay_ms, 0) WHEN type = {q(E.ACKED)} THEN delivered_ts END")
    late_by = (f"CASE WHEN type = {q(E.DELIVERED)} AND expiration > 0 "
               f"AND ts > expiration + {int(options.expiry_tolerance_ms)} "
               "THEN ts - expiration END")
    unguarded = " OR ".join(f"startswith(key, {q(prefix)})" for prefix in UNGUARDED_PREFIXES)
    return rows.select(*[F.expr(text) for text in (
        "is_message AS m",
        "CASE WHEN is_message THEN xxhash64(key) ELSE row END AS key",
        "CASE WHEN is_message THEN hash(key) ELSE 0 END AS chk",
        f"(is_message AND ({unguarded})) AS ung",
        f"CASE WHEN NOT {names_target} AND queue IS NOT NULL THEN xxhash64(queue) END AS gq",
        f"CASE WHEN {names_target} THEN xxhash64(target) END AS gt",
        "CASE WHEN address IS NOT NULL THEN xxhash64(address) END AS addr",
        f"{code} AS code", "ts", f"{val} AS val", f"{late_by} AS late_by", "file_rank", "row")])


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
    fate_code = ("CASE " + " ".join(f"WHEN {_in(*_TERMINAL_CODES[name])} THEN {number}"
                                    for number, name in enumerate(FATES)) + " END")
    readable = f"code NOT IN ({COPY}, {BAD}, {UNSUPPORTED})"
    aggregates = [
        "min(chk) != max(chk) AS collisions",
        "max(ung) AS ung",
        f"coalesce(max(CASE WHEN code = {SENT} THEN addr END), "
        f"max(CASE WHEN code = {COPY} THEN addr END), max(addr)) AS address_h",
        f"count_if(code != {COPY}) AS events",
        f"count_if(code = {BAD}) AS bad",
        f"count_if(code = {UNSUPPORTED}) AS unsupported",
        f"count_if(code = {SENT}) AS sent",
        f"min(CASE WHEN code = {SENT} THEN ts END) AS first_sent_ts",
        f"count_if(code = {SEND_FAILED}) AS send_failed",
        f"count_if(code = {COPY}) AS copies",
        f"count_if({_in(*_DELIVER_PATH)}) AS deliver_path",
        f"count_if(code = {DELIVERED}) AS delivered",
        f"max(CASE WHEN code = {DELIVERED} THEN val END) AS max_count",
        f"min(CASE WHEN ({fate_code}) IS NOT NULL THEN ts * {_FATE_BITS} + ({fate_code}) END)"
        " AS terminal",
        f"min(CASE WHEN {readable} THEN ts END) AS first_ts",
        f"max(CASE WHEN {readable} THEN ts END) AS last_ts",
        f"max(CASE WHEN code = {REDELIVERY_SCHEDULED} THEN val END) AS redelivery_due",
        f"min(CASE WHEN code = {DEAD_LETTERED} THEN val END) AS dead_letter_count",
        f"count_if(code = {DEAD_LETTERED} AND gt IS NOT NULL) AS dead_letters",
        f"count_if(code = {EXPIRED} AND gt IS NOT NULL) AS expiries",
        f"count_if(code = {TRANSACTION}) AS transactions",
        f"count_if(code = {ACK_LEGACY}) AS legacy",
        "count_if(file_rank IS NULL) AS unranked",
        f"count_if(code = {ACK_HANDLING}) AS handlings",
        # Times, not the (time, file, row) positions of the hash plan: a DECIMAL(38)
        # buffer turns off Spark's fast hash map for the whole aggregation.
        f"min(CASE WHEN code = {ACK_HANDLING} THEN val END) AS first_handled_ts",
        f"max(CASE WHEN code = {DELIVERED} THEN ts END) AS last_delivery_ts",
        "count_if(late_by IS NOT NULL) AS max_late"]
    per_key = rows.groupBy("m", "key").agg(*[F.expr(text) for text in aggregates])
    return per_key.select(*[F.expr(text) for text in (
        "key", "m AS is_message", "NOT ung AS guarded", "collisions", "legacy", "unranked",
        "address_h", "events", "bad", "unsupported", "sent", "first_sent_ts", "send_failed",
        "copies", "deliver_path", "delivered",
        f"CAST(floor(terminal / {_FATE_BITS}) AS BIGINT) AS terminal_ts",
        f"CAST(terminal % {_FATE_BITS} AS INT) AS fate_code",
        "first_ts", "last_ts", "redelivery_due", "dead_letter_count", "transactions",
        "dead_letters", "expiries",
        "greatest(delivered, coalesce(max_count, 0)) AS max_queue_deliveries",
        "(handlings >= 2 OR coalesce(delivered >= 2 AND last_delivery_ts >= first_handled_ts,"
        " false)) AS any_duplicated",
        "max_late")])


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
        return local_frame(spark, self.addresses, NAMES_SCHEMA)

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


def _by_address(values: dict[int, int | None]) -> str:
    """SQL of ``values[address_h]`` (null for other addresses), without a join."""
    cases = " ".join(f"WHEN address_h = {h}L THEN {int(value)}L"
                     for h, value in values.items() if value is not None)
    return f"CAST(CASE {cases} END AS BIGINT)" if cases else "CAST(NULL AS BIGINT)"


def summarise(facts_frame: DataFrame, names: Names, limits: dict[str, int | None],
              watermark: int) -> DataFrame:
    """The one pass over the facts: a few rows, cached by the runner.

    Grouped by (address, chart bucket, fate, capped deliveries, survivor key): the
    per-address figures and the chart counts are sums of these groups, and every
    message the pre-filter (:func:`mqguard.audit.checks.may_be_finding`) keeps is a
    group of its own (``survivor`` true) holding its facts.
    """
    from mqguard.audit.checks import may_be_finding_sql
    from mqguard.audit.report import BUCKETS, MAX_DELIVERIES

    limit = _by_address({h: limits.get(name) for h, name in names.addresses})
    keep = may_be_finding_sql("guarded", f"CAST({int(watermark)} AS BIGINT)", limit)
    first = names.first_ts if names.first_ts is not None else 0
    last = names.last_ts if names.last_ts is not None else first
    width = max(1, -(-(last - first + 1) // BUCKETS))
    fact_columns = [name for name in facts_frame.columns
                    if name not in ("key", "is_message", "address_h", "unranked")]
    at = "coalesce(first_sent_ts, first_ts)"
    marked = facts_frame.select("*", *[F.expr(text) for text in (
        f"is_message AND {keep} AS survivor",
        f"is_message AND {at} IS NOT NULL AS charted_",
        "is_message AND terminal_ts IS NOT NULL AS with_fate_")])
    return marked.groupBy(*[F.expr(text) for text in (
        "address_h", "survivor",
        "CASE WHEN survivor THEN key END AS key",
        f"CASE WHEN charted_ THEN CAST(({at} - {int(first)}L) / {int(width)}L AS BIGINT) END"
        " AS bucket",
        "CASE WHEN charted_ THEN fate_code END AS fate_code_c",
        f"CASE WHEN charted_ THEN least(delivered, {int(MAX_DELIVERIES)}) END AS deliveries_c",
    )]).agg(*[F.expr(text) for text in (
        "count_if(charted_) AS charted",
        "count_if(is_message) AS messages",
        "sum(events) AS sum_events",
        "sum(bad) AS sum_bad",
        "sum(unsupported) AS sum_unsupported",
        "sum(transactions) AS sum_transactions",
        "count_if(is_message AND sent > 0) AS sum_sent",
        "sum(delivered) AS sum_deliveries",
        "count_if(with_fate_) AS with_fate",
        "min(first_ts) AS min_first_ts",
        "max(last_ts) AS max_last_ts",
        "max(CASE WHEN with_fate_ THEN first_sent_ts END) AS drained_to",
        "sum(legacy) AS sum_legacy",
        "sum(unranked) AS sum_unranked",
        "count_if(collisions) AS sum_collisions",
        # A survivor's group is its one message: max() is its value.
        *[f"max(CASE WHEN survivor THEN {name} END) AS {name}" for name in fact_columns],
    )]).select("*", F.lit(width).alias("width"))


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
