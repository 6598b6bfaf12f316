"""The message facts by hash aggregation: one shuffle, no sort, no window.

Which ``delivered`` a successful handling settled used to be found by writing
order (the event after it in its process), which costs a sort of every event by
(message id, queue, node, file, row): at 10 million events that sort and the
windows over it were 59% of the audit's CPU. The guard's ``acked`` event now says
it instead: ``handled`` (true when the handler returned) and ``delivered_ts``
(when that delivery's ``delivered`` event was written). Every fact is then a
count, a minimum or a maximum, which Spark computes in hash aggregations
(``HashAggregate``: fixed-width buffers only, code-generated) after one shuffle
by message id:

1. :func:`groups` -- events grouped by (message id, queue, target, address);
   ``queue`` is left out (null) for the events that name a target (``moved``,
   ``dead_lettered``, ``expired``), so a target's decision and its copy meet in
   one group whatever queue they came from. A queue's delivery facts are exact
   in its group: deliveries and handlings carry no target.
2. :func:`facts` -- the groups of one message id aggregated again (the data is
   already partitioned by message id: no second shuffle), strings kept out of the
   buffers: the address as its 64-bit hash (names restored from the few distinct
   addresses, :func:`address_dictionary`), the fate as a code packed under the
   time of the first terminal event.

Positions ("a delivery after the first handling") compare (time, then the scan
row within a millisecond) packed into one ``DECIMAL(38, 0)``; the handling's
position is its delivery's time with the ack's row, which orders exactly as the
delivery itself against every other delivery of the message on that queue.

Logs written before ``handled`` existed (an ``acked`` with ``ack_reason`` normal
on a queue and no ``handled``) cannot be paired this way: :func:`address_dictionary`
counts such events (``legacy``) and the runner then uses the writing-order plan
(:func:`mqguard.audit.checks.message_facts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mqguard.audit.checks import (
    COPIED,
    DELIVER_PATH,
    FATE_PRECEDENCE,
    TERMINAL,
    CheckOptions,
    event_rows,
)
from mqguard.audit.inline import local_frame
from mqguard.events import EventType as E
from mqguard.verdict import AckReason

#: Terminal types by precedence: the code breaks a tie at the same millisecond as the
#: writing-order plan's ``min(struct(ts, rank, type))`` does.
FATES: tuple[str, ...] = tuple(str(t) for t in FATE_PRECEDENCE)
_FATE_BITS = 8  # codes 0..len(FATES)-1 under ts * 8

_POSITION = "DECIMAL(38, 0)"


def _is(name: str) -> Column:
    return F.col("type") == F.lit(str(name))


def _types(*names: str) -> Column:
    return F.col("type").isin([str(n) for n in names])


def _position(ts: Column) -> Column:
    """(``ts``, ``file_rank``, ``row``) as one number ordered like the triple: ``ts``
    below 10**13 (epoch ms until the year 2286), ``file_rank`` below 10**6
    (:data:`mqguard.audit.events.MAX_FILES`), ``row`` below 10**19 (a long)."""
    return (ts.cast(_POSITION) * F.expr(f"CAST(10000000000000000000000000 AS {_POSITION})")
            + F.coalesce(F.col("file_rank"), F.lit(0)).cast(_POSITION)
            * F.expr(f"CAST(10000000000000000000 AS {_POSITION})")
            + F.col("row").cast(_POSITION))


def groups(events: DataFrame, options: CheckOptions | None = None) -> DataFrame:
    """Stage 1: one row per (``key``, ``queue``, ``target``, ``address``); see module doc."""
    return group_rows(event_rows(events), options)


def group_rows(rows: DataFrame, options: CheckOptions | None = None) -> DataFrame:
    """:func:`groups` of rows already made by :func:`mqguard.audit.checks.event_rows`."""
    options = options or CheckOptions()
    c = F.col
    delivered = _is(E.DELIVERED)
    normal_ack = (_is(E.ACKED) & (c("ack_reason") == F.lit(AckReason.NORMAL.value))
                  & c("queue").isNotNull())
    handling = normal_ack & F.coalesce(c("handled"), F.lit(False)) & c("delivered_ts").isNotNull()
    names_target = _types(E.MOVED, E.DEAD_LETTERED, E.EXPIRED) & c("target").isNotNull()
    late = (delivered & (c("expiration") > 0)
            & (c("ts") > c("expiration") + F.lit(options.expiry_tolerance_ms)))
    terminal = _types(*TERMINAL)
    fate_code = F.coalesce(*[F.when(_is(name), F.lit(code)) for code, name in enumerate(FATES)])
    event = c("pos") == 0
    readable = event & c("type").isNotNull()
    sent = _is(E.SENT)
    dead_lettered = _is(E.DEAD_LETTERED)

    grouped = (rows
               .select("*", F.when(~names_target, c("queue")).alias("gq"),
                       F.when(names_target, c("target")).alias("gt"))
               # One shuffle by message id; both aggregations below run on its partitions.
               .repartition("key")
               .groupBy("key", "gq", "gt", "address")
               .agg(F.max("is_message").alias("is_message"),
                    F.count_if(event).alias("events"),
                    F.count_if(event & c("bad")).alias("bad"),
                    F.count_if(event & c("unsupported")).alias("unsupported"),
                    F.count_if(sent).alias("sent"),
                    F.min(F.when(sent, c("ts"))).alias("first_sent_ts"),
                    F.count_if(_is(E.SEND_FAILED)).alias("send_failed"),
                    F.count_if(_is(COPIED)).alias("copies"),
                    F.count_if(_types(*DELIVER_PATH)
                               | (_is(E.MOVED) & c("queue").isNotNull())).alias("deliver_path"),
                    F.count_if(delivered).alias("delivered"),
                    F.max(F.when(delivered, c("delivery_count"))).alias("max_count"),
                    F.min(F.when(terminal, c("ts") * F.lit(_FATE_BITS) + fate_code)
                          ).alias("terminal"),
                    F.min(F.when(readable, c("ts"))).alias("first_ts"),
                    F.max(F.when(readable, c("ts"))).alias("last_ts"),
                    F.max(F.when(_is(E.REDELIVERY_SCHEDULED),
                                 c("ts") + F.coalesce(c("delay_ms"), F.lit(0)))
                          ).alias("redelivery_due"),
                    F.count_if(dead_lettered).alias("dead_lettered"),
                    F.count_if(_is(E.EXPIRED)).alias("expired"),
                    F.count_if(_is(E.MOVED)).alias("moved"),
                    F.min(F.when(dead_lettered, c("delivery_count"))).alias("dead_letter_count"),
                    F.count_if(c("type").startswith("tx_")).alias("transactions"),
                    F.count_if(normal_ack & c("handled").isNull()).alias("legacy"),
                    F.count_if(handling).alias("handlings"),
                    F.min(F.when(handling, c("delivered_ts"))).alias("first_handled_ts"),
                    F.min(F.when(handling, _position(c("delivered_ts")))
                          ).alias("first_handled"),
                    F.max(F.when(delivered, _position(c("ts")))).alias("last_delivery"),
                    F.count_if(late).alias("late"),
                    F.min(F.when(late, c("ts"))).alias("first_late_ts"),
                    F.max(F.when(late, c("ts") - c("expiration"))).alias("late_by_ms")))
    return grouped.select(
        "*",
        F.when(c("address").isNotNull(), F.xxhash64("address")).alias("address_h"),
        F.greatest(c("delivered"), F.coalesce(c("max_count"), F.lit(0))).alias("deliveries"),
        ((c("handlings") >= 2)
         | F.coalesce(c("last_delivery") > c("first_handled"), F.lit(False))).alias("duplicated"),
    )


@dataclass(frozen=True)
class AddressDictionary:
    """The distinct addresses of the groups, and whether the log needs the writing order."""

    #: (64-bit hash, address) pairs.
    addresses: list[tuple[int, str]]
    #: ``acked`` (normal, on a queue) events without ``handled``: pre-field writers.
    legacy: int


DICTIONARY_SCHEMA = StructType([StructField("address_h", LongType()),
                                StructField("address", StringType())])


def address_dictionary(grouped: DataFrame) -> AddressDictionary:
    """Stage 1 materialised (cache it first) and summed up per address: a few rows."""
    rows = (grouped.groupBy("address_h", "address")
            .agg(F.sum("legacy").alias("legacy")).collect())
    addresses = [(int(r["address_h"]), r["address"]) for r in rows if r["address"] is not None]
    hashes = [h for h, _ in addresses]
    if len(set(hashes)) != len(hashes):  # two names, one 64-bit hash: never seen, but say so
        raise RuntimeError("two addresses share a 64-bit hash; audit with the writing-order "
                           "plan (mqguard.audit.checks.message_facts)")
    return AddressDictionary(addresses, int(sum(r["legacy"] or 0 for r in rows)))


def facts(spark: SparkSession, grouped: DataFrame, dictionary: AddressDictionary) -> DataFrame:
    """Stage 2: one row per message id, the columns of
    :func:`mqguard.audit.checks.message_facts` except the arrays (see :func:`details`)."""
    c = F.col
    queue_row = c("gq").isNotNull()
    target_row = c("gt").isNotNull()
    per_key = grouped.groupBy("key").agg(
        F.max("is_message").alias("is_message"),
        F.coalesce(F.max(F.when(c("sent") > 0, c("address_h"))),
                   F.max(F.when(c("copies") > 0, c("address_h"))),
                   F.max("address_h")).alias("address_h"),
        *[F.sum(name).alias(name) for name in (
            "events", "bad", "unsupported", "sent", "send_failed", "copies", "deliver_path",
            "delivered", "transactions")],
        F.min("first_sent_ts").alias("first_sent_ts"),
        F.min("terminal").alias("terminal"),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
        F.max("redelivery_due").alias("redelivery_due"),
        F.min("dead_letter_count").alias("dead_letter_count"),
        F.count_if(target_row & (c("dead_lettered") > 0)).alias("dead_letters"),
        F.count_if(target_row & (c("expired") > 0)).alias("expiries"),
        F.max(F.when(queue_row, c("deliveries"))).alias("max_queue_deliveries"),
        F.max(F.when(queue_row, c("duplicated"))).alias("any_duplicated"),
        F.max(F.when(queue_row, c("late"))).alias("max_late"),
    )
    names = local_frame(spark, dictionary.addresses, DICTIONARY_SCHEMA)
    fates = F.array(*[F.lit(name) for name in FATES])
    return per_key.join(F.broadcast(names), "address_h", "left").select(
        "key", "is_message", "address", "events", "bad", "unsupported", "sent",
        "first_sent_ts", "send_failed", "copies", "deliver_path", "delivered",
        F.floor(c("terminal") / F.lit(_FATE_BITS)).cast(LongType()).alias("terminal_ts"),
        F.element_at(fates, (c("terminal") % F.lit(_FATE_BITS)).cast("int") + 1).alias("fate"),
        "first_ts", "last_ts", "redelivery_due", "dead_letter_count", "transactions",
        "dead_letters", "expiries", "max_queue_deliveries", "any_duplicated", "max_late")


def details(grouped: DataFrame, keys: DataFrame) -> DataFrame:
    """The per-queue facts and target sets of ``keys`` (few: the pre-filter's survivors),
    as the writing-order plan has them in every fact row."""
    return details_of(grouped.join(keys.hint("shuffle_hash"), "key", "left_semi"))


def details_of(chosen: DataFrame) -> DataFrame:
    """:func:`details` of every key of the groups ``chosen``."""
    c = F.col
    queue_fact = F.struct(
        c("gq").alias("queue"), c("deliveries"), c("handlings"), c("first_handled_ts"),
        c("duplicated"), c("late"), c("first_late_ts"), c("late_by_ms"))
    target_row = c("gt").isNotNull()
    return chosen.groupBy("key").agg(
        F.collect_list(F.when(c("gq").isNotNull(), queue_fact)).alias("queues"),
        F.collect_set(F.when(target_row & (c("dead_lettered") > 0), c("gt"))
                      ).alias("dead_letter_targets"),
        F.collect_set(F.when(target_row & (c("expired") > 0), c("gt"))).alias("expiry_targets"),
        F.collect_set(F.when(target_row & (c("moved") > 0), c("gt"))).alias("moved_targets"),
    )

