"""The anomaly classes and the Spark plan that finds them.

Classes follow Jepsen's queue checkers (``lost``, ``unexpected``, ``duplicated``,
``recovered``, ``unseen``) plus the guarantees mqguard itself promises (delivery
limits, dead letters, expiry). Each is defined on the events of one message id:

- **lost**: accepted (a ``sent`` event: the broker confirmed it, or its
  transaction committed) before the watermark, no terminal fate (``acked``,
  ``dead_lettered``, ``expired``, ``delivery_dropped``), and not in flight.
- **unseen** (not an error): the same, but still in flight at the watermark:
  events after it, a redelivery due after it, or -- Jepsen's Kafka checker's rule
  -- no message sent later on the same address has a fate yet, so nothing shows
  the consumers got past it (``assume_drained`` turns that last rule off, for a run
  whose consumers drained every address before the watermark).
- **unexpected**: seen at a consumer but never sent: no ``sent`` / ``send_failed``
  event and not the copy made by a ``moved`` (dead letter, expiry); the copy a
  ``dlq_retried`` names counts as sent. Ids that
  consumers gave to messages not sent through a guard (``unguarded:`` and
  ``broker:`` prefixes) are counted as **unguarded** (not an error) instead.
- **duplicated**: handed to the application more than once per queue after a
  success: a *handling* is an ``acked`` event with ``handled`` true (the guard
  writes it when the handler returned; ``delivered_ts`` is its ``delivered``
  event's time), or, in logs written before those fields existed, a
  ``delivered`` event immediately followed, in the writing order of that
  process, by ``acked`` with ``ack_reason`` normal. Two handlings, or any
  ``delivered`` after the first handling's ``delivered``, is a duplicate.
  Redeliveries after ``handler_failed`` or a crash (``delivered`` without an
  outcome) are legitimate at-least-once retries, and a delivery the consumer
  audit suppressed never reached a handler. (A topic's subscriptions must use
  distinct queue names, as the shared consumer audit also requires.)
- **recovered** (not an error): a send whose outcome was unknown
  (``send_failed``), seen at a consumer. **indeterminate** (not an error): the
  same, never seen.
- **over_delivered**: more deliveries on one queue than the address's
  ``max-delivery-attempts``. **early_dead_letter**: dead-lettered at a delivery
  count below it.
- **dead_letter_not_moved** / **expiry_not_moved**: a ``dead_lettered`` /
  ``expired`` event names a target that no ``moved`` event of the message reached.
- **late_delivery**: ``delivered`` after the message's expiration (beyond a
  tolerance for the time the other plugins take between the expiry check and the
  event).

The plan reads the events once and shuffles once, by message id, then only
hash-aggregates (:mod:`mqguard.audit.hashed`). Logs without ``handled`` take
:func:`message_facts` instead: a window in (queue, node, file, row) order pairs
each ``delivered`` with the event after it, per-queue aggregates are windows
over the same sort, and one aggregation per message id yields the facts.
Copies are attributed to their own id by ``posexplode`` in the same scan (no
self-join). No Python UDF, no collect of
per-message data: only per-address rows reach the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mqguard.audit.events import CORRUPT_COLUMN, valid_event
from mqguard.audit.inline import local_frame
from mqguard.audit.limits import AddressLimits
from mqguard.events import EventType as E
from mqguard.verdict import AckReason


@dataclass(frozen=True, slots=True)
class FindingClass:
    """One class of finding; ``anomaly`` classes make the audit fail (exit 1)."""

    name: str
    anomaly: bool
    description: str


CLASSES: tuple[FindingClass, ...] = (
    FindingClass("lost", True, "accepted by the broker, no terminal fate, not in flight"),
    FindingClass("unexpected", True, "seen at a consumer but never sent"),
    FindingClass("duplicated", True, "handed to a handler again after a successful handling"),
    FindingClass("over_delivered", True, "more deliveries than max-delivery-attempts"),
    FindingClass("early_dead_letter", True, "dead-lettered below max-delivery-attempts"),
    FindingClass("dead_letter_not_moved", True, "dead-lettered without a copy moved to the target"),
    FindingClass("expiry_not_moved", True, "expired without a copy moved to the expiry target"),
    FindingClass("late_delivery", True, "delivered to a handler after its expiration"),
    FindingClass("unseen", False, "still in flight at the watermark"),
    FindingClass("recovered", False, "send outcome unknown, delivered anyway"),
    FindingClass("indeterminate", False, "send outcome unknown, never seen at a consumer"),
    FindingClass("unguarded", False, "seen at a consumer, not sent through a guard"),
)
ANOMALIES = frozenset(c.name for c in CLASSES if c.anomaly)

#: Synthetic event type: the row a ``moved`` event contributes to its copy's id.
COPIED = "copied"
#: A ``dlq_retried`` event contributes a ``sent`` row to its copy's id instead: a retried
#: dead letter starts a second life at its original address, which must reach a fate like
#: any accepted message (else it is lost), under an id of its own (its deliveries do not
#: count against the first life's max-delivery-attempts, nor as duplicates of it).
TERMINAL = (E.ACKED, E.DEAD_LETTERED, E.EXPIRED, E.DELIVERY_DROPPED)
#: The terminal types by precedence, for a message's fate when two share its first
#: millisecond: a dead-lettered or expired message's ack (reason killed / expired) is
#: written in the same millisecond as the move, and the move is what happened to it.
FATE_PRECEDENCE = (E.DEAD_LETTERED, E.EXPIRED, E.DELIVERY_DROPPED, E.ACKED)
DELIVER_PATH = (E.DELIVERED, E.HANDLER_FAILED, E.ACKED, E.NACKED, E.DELIVERY_DROPPED,
                E.REDELIVERY_SCHEDULED, E.DEAD_LETTERED, E.EXPIRED,
                E.DUPLICATE_DELIVERY_SUPPRESSED, E.DUPLICATE_DELIVERY_LOGGED)
UNGUARDED_PREFIXES = ("unguarded:", "broker:")


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """Tolerances of the checks."""

    #: A delivery this long after the expiration is late (the expiry check runs
    #: first among the plugins; the others' time until the event is tolerated).
    expiry_tolerance_ms: int = 1000
    #: Every address was drained before the watermark: what has no fate is lost.
    assume_drained: bool = False


def _types(*names: str) -> Column:
    return F.col("type").isin([str(n) for n in names])


def _is(name: str) -> Column:
    return F.col("type") == F.lit(str(name))


def _fate_rank() -> Column:
    """A terminal event's place in :data:`FATE_PRECEDENCE` (a tie-break at equal times)."""
    return F.coalesce(*[F.when(_is(name), F.lit(rank))
                        for rank, name in enumerate(FATE_PRECEDENCE)]).alias("rank")


def event_rows(events: DataFrame) -> DataFrame:
    """The events as rows keyed by message id (``key``), copies attributed to their own id.

    Events without a message id (transactions, unreadable lines, other schema
    versions) get a key of their own (``\\0<row>``) and ``is_message`` false:
    they are counted in the same pass instead of a second scan, and cannot
    pile up in one partition as a null key would.
    """
    valid = valid_event()
    is_message = valid & F.col("message_id").isNotNull()
    own_key = F.when(is_message, F.col("message_id")).otherwise(
        F.concat(F.lit("\u0000"), F.col("row").cast("string")))
    # A ``dlq_retried`` names its copy too: the copy's row is its send (see COPIED).
    copy_key = F.when(valid & _types(E.MOVED, E.DLQ_RETRIED), F.col("new_message_id"))
    # Not array_compact: it is a lambda (filter), evaluated row by row outside the
    # generated code; this CASE gives the same arrays (own_key is never null).
    keys = F.when(copy_key.isNull(), F.array(own_key)).otherwise(F.array(own_key, copy_key))
    exploded = events.select("*", F.posexplode(keys).alias("pos", "key"))
    copy = F.col("pos") == 1
    rows = exploded.select(
        "key", "pos", "node", "file", "file_rank", "row", "ts", "ack_reason", "target",
        "expiration", "delivery_count", "delay_ms", "handled", "delivered_ts",
        F.when(copy & _is(E.DLQ_RETRIED), F.lit(str(E.SENT))).when(copy, F.lit(COPIED))
        .when(valid, F.col("type")).alias("type"),
        F.when(copy, F.col("target")).otherwise(F.col("address")).alias("address"),
        F.when(~copy, F.col("queue")).alias("queue"),
        (copy | is_message).alias("is_message"),
        (F.col(CORRUPT_COLUMN).isNotNull() | F.col("type").isNull()
         | F.col("ts").isNull()).alias("bad"),
        (F.col(CORRUPT_COLUMN).isNull() & F.col("type").isNotNull() & F.col("ts").isNotNull()
         & ~valid).alias("unsupported"),
    )
    return rows


def message_facts(events: DataFrame, options: CheckOptions = CheckOptions()) -> DataFrame:
    """One row per message id (``key``) with everything the checks need, by writing order.

    The plan for logs whose ``acked`` events do not say whether they end a
    handling (written before ``handled`` / ``delivered_ts`` existed): a sort by
    (message id, queue, node, file, row) and windows over it. Logs that have the
    fields take :mod:`mqguard.audit.hashed` instead (hash aggregation, no sort).
    """
    rows = event_rows(events)

    # Writing order of one process within a message id, grouped by queue: a
    # delivery's outcome is the next event of the same queue and node.
    in_order = Window.partitionBy("key").orderBy("queue", "node", "file", "row")
    following = F.lead(F.struct("type", "ack_reason", "queue", "node")).over(in_order)
    handled = (_is(E.DELIVERED) & (following["type"] == F.lit(str(E.ACKED)))
               & (following["ack_reason"] == F.lit(AckReason.NORMAL.value))
               & following["queue"].eqNullSafe(F.col("queue"))
               & following["node"].eqNullSafe(F.col("node")))
    rows = rows.withColumn("handled", F.coalesce(handled, F.lit(False)))

    # Per queue: windows over the same sort (no second shuffle or sort).
    queue_ordered = Window.partitionBy("key", "queue").orderBy("node", "file", "row")
    per_queue = queue_ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    delivered = _is(E.DELIVERED)
    position = F.struct("ts", "node", "file", "row")
    late = (delivered & (F.col("expiration") > 0)
            & (F.col("ts") > F.col("expiration") + F.lit(options.expiry_tolerance_ms)))
    deliveries = F.count_if(delivered).over(per_queue)
    max_count = F.max(F.when(delivered, F.col("delivery_count"))).over(per_queue)
    handlings = F.count_if(F.col("handled")).over(per_queue)
    first_handled = F.min(F.when(F.col("handled"), position)).over(per_queue)
    last_delivery = F.max(F.when(delivered, position)).over(per_queue)
    queue_fact = F.struct(
        F.col("queue").alias("queue"),
        F.greatest(deliveries, F.coalesce(max_count, F.lit(0))).alias("deliveries"),
        handlings.alias("handlings"),
        first_handled["ts"].alias("first_handled_ts"),
        ((handlings >= 2) | F.coalesce(last_delivery > first_handled, F.lit(False)))
        .alias("duplicated"),
        F.count_if(late).over(per_queue).alias("late"),
        F.min(F.when(late, F.col("ts"))).over(per_queue).alias("first_late_ts"),
        F.max(F.when(late, F.col("ts") - F.col("expiration"))).over(per_queue)
        .alias("late_by_ms"),
    )
    first_of_queue = F.row_number().over(queue_ordered) == 1
    rows = rows.withColumn(
        "queue_fact", F.when(first_of_queue & F.col("queue").isNotNull(), queue_fact))

    terminal = _types(*TERMINAL)
    sent = _is(E.SENT)
    event = F.col("pos") == 0
    readable = event & F.col("type").isNotNull()  # times of unreadable lines mean nothing
    return rows.groupBy("key").agg(
        F.max("is_message").alias("is_message"),
        F.coalesce(F.max(F.when(sent, F.col("address"))),
                   F.max(F.when(_is(COPIED), F.col("address"))),
                   F.max("address")).alias("address"),
        F.count_if(event).alias("events"),
        F.count_if(event & F.col("bad")).alias("bad"),
        F.count_if(event & F.col("unsupported")).alias("unsupported"),
        F.count_if(sent).alias("sent"),
        F.min(F.when(sent, F.col("ts"))).alias("first_sent_ts"),
        F.count_if(_is(E.SEND_FAILED)).alias("send_failed"),
        F.count_if(_is(COPIED)).alias("copies"),
        F.count_if(_types(*DELIVER_PATH)
                   | (_is(E.MOVED) & F.col("queue").isNotNull())).alias("deliver_path"),
        F.count_if(delivered).alias("delivered"),
        F.min(F.when(terminal, F.col("ts"))).alias("terminal_ts"),
        # The first terminal event's type: the fate drawn in the report's timeline.
        F.min(F.when(terminal, F.struct("ts", _fate_rank(), "type")))["type"].alias("fate"),
        F.min(F.when(readable, F.col("ts"))).alias("first_ts"),
        F.max(F.when(readable, F.col("ts"))).alias("last_ts"),
        F.max(F.when(_is(E.REDELIVERY_SCHEDULED),
                     F.col("ts") + F.coalesce(F.col("delay_ms"), F.lit(0)))
              ).alias("redelivery_due"),
        F.collect_set(F.when(_is(E.DEAD_LETTERED), F.col("target"))).alias("dead_letter_targets"),
        F.collect_set(F.when(_is(E.EXPIRED), F.col("target"))).alias("expiry_targets"),
        F.collect_set(F.when(_is(E.MOVED), F.col("target"))).alias("moved_targets"),
        F.count_if(_is(E.DEAD_LETTERED) & F.col("target").isNotNull()).alias("dead_letters"),
        F.count_if(_is(E.EXPIRED) & F.col("target").isNotNull()).alias("expiries"),
        F.min(F.when(_is(E.DEAD_LETTERED), F.col("delivery_count"))).alias("dead_letter_count"),
        F.count_if(F.col("type").startswith("tx_")).alias("transactions"),
        F.collect_list("queue_fact").alias("queues"),
        # Scalars of ``queues``: classify's cheap pre-filter (see there).
        F.max(F.col("queue_fact.deliveries")).alias("max_queue_deliveries"),
        F.max(F.col("queue_fact.duplicated")).alias("any_duplicated"),
        F.max(F.col("queue_fact.late")).alias("max_late"),
    )


def address_stats(facts: DataFrame) -> DataFrame:
    """Per address: counts, time range, and ``drained_to`` -- the latest send time of
    a message with a fate, the evidence that consumers got that far (see *unseen*)."""
    message = F.col("is_message")
    # The lean plan's facts also say whether its keys can be trusted (lean.py).
    extra = [F.sum(F.col(name).cast("long")).alias(name) for name in ("legacy", "collisions")
             if name in facts.columns]
    return facts.groupBy("address").agg(
        *extra,
        F.count_if(message).alias("messages"),
        F.sum("events").alias("events"),
        F.sum("bad").alias("bad"),
        F.sum("unsupported").alias("unsupported"),
        F.sum("transactions").alias("transactions"),
        F.count_if(message & (F.col("sent") > 0)).alias("sent"),
        F.sum("delivered").alias("deliveries"),
        F.count_if(message & F.col("terminal_ts").isNotNull()).alias("with_fate"),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
        F.max(F.when(message & F.col("terminal_ts").isNotNull(), F.col("first_sent_ts"))
              ).alias("drained_to"),
    )


CONTEXT_SCHEMA = StructType([
    StructField("address", StringType(), nullable=False),
    StructField("max_delivery_attempts", IntegerType()),
    StructField("dead_letter_target", StringType()),
    StructField("expiry_target", StringType()),
    StructField("expiry_enforced", BooleanType(), nullable=False),
    StructField("drained_to", LongType()),
])


def context_frame(spark: SparkSession, limits: Iterable[AddressLimits],
                  drained_to: Mapping[str, int | None]) -> DataFrame:
    """Per-address limits and drain evidence as a small DataFrame (broadcast-joined)."""
    rows = [(x.address, x.max_delivery_attempts, x.dead_letter_target, x.expiry_target,
             x.expiry_enforced, drained_to.get(x.address)) for x in limits]
    return local_frame(spark, rows, CONTEXT_SCHEMA)


FINDINGS_SCHEMA = StructType([
    StructField("class", StringType(), nullable=False),
    StructField("message_id", StringType()),
    StructField("address", StringType()),
    StructField("queue", StringType()),
    StructField("ts", LongType()),
    StructField("time", StringType()),
    StructField("deliveries", LongType()),
    StructField("limit", LongType()),
    StructField("detail", StringType()),
])


def _finding(name: str, detail: Column, *, ts: Column, queue: Column | None = None,
             deliveries: Column | None = None, limit: Column | None = None) -> Column:
    none = F.lit(None)
    return F.struct(
        F.lit(name).alias("class"),
        (queue if queue is not None else none).cast(StringType()).alias("queue"),
        ts.cast(LongType()).alias("ts"),
        (deliveries if deliveries is not None else none).cast(LongType()).alias("deliveries"),
        (limit if limit is not None else none).cast(LongType()).alias("limit"),
        detail.cast(StringType()).alias("detail"),
    )


def may_be_finding(guarded: str, mark: str, limit: str) -> Column:
    """A necessary condition of every class on a message's facts (the pre-filter):
    true for every message :func:`classify` reports, and for few others. The
    arguments are SQL (:func:`may_be_finding_sql`)."""
    return F.expr(may_be_finding_sql(guarded, mark, limit))


def may_be_finding_sql(guarded: str, mark: str, limit: str) -> str:
    """:func:`may_be_finding` as SQL text: ``guarded`` (whether the id was assigned by a
    guard), ``mark`` (the watermark) and ``limit`` (max delivery attempts) are SQL too."""
    guarded, mark, limit = f"({guarded})", f"({mark})", f"({limit})"
    accepted = "sent > 0"
    seen = "deliver_path > 0"
    origin_known = f"({accepted} OR send_failed > 0 OR copies > 0)"
    return "(" + " OR ".join([
        f"({guarded} AND {accepted} AND first_sent_ts <= {mark} AND terminal_ts IS NULL)",
        f"({guarded} AND NOT {origin_known} AND {seen})",
        f"({guarded} AND NOT ({accepted}) AND send_failed > 0)",
        f"(NOT {guarded} AND {seen})",
        "dead_letter_count IS NOT NULL",
        "dead_letters > 0",
        "expiries > 0",
        "coalesce(any_duplicated, false)",
        "coalesce(max_late > 0, false)",
        f"coalesce({limit} IS NOT NULL AND max_queue_deliveries > {limit}, false)",
    ]) + ")"


def classify(facts: DataFrame, context: DataFrame, watermark: int,
             options: CheckOptions = CheckOptions(),
             details: Callable[[DataFrame], DataFrame] | None = None) -> DataFrame:
    """Every finding, one row each (:data:`FINDINGS_SCHEMA`), in one pass over ``facts``.

    ``details``: for facts without the per-queue and target arrays (the hash plan,
    :mod:`mqguard.audit.hashed`), a function giving them (``key``, ``queues``,
    ``dead_letter_targets``, ``expiry_targets``, ``moved_targets``) for the keys of
    the frame it is passed; it is called only for the messages the pre-filter keeps.
    With the lean plan (:mod:`mqguard.audit.lean`) ``key`` is a 64-bit hash, ``facts``
    has ``guarded`` and the details bring the ``message_id`` string.
    """
    c = F.col
    mark = F.lit(watermark).cast(LongType())
    joined = facts.filter(c("is_message")).join(F.broadcast(context), "address", "left")

    key = c("key")
    if "guarded" in facts.columns:  # the lean plan's keys are hashes: it says so itself
        guarded = c("guarded")
    else:
        guarded = ~(key.startswith(UNGUARDED_PREFIXES[0])
                    | key.startswith(UNGUARDED_PREFIXES[1]))
    accepted = c("sent") > 0
    no_fate = c("terminal_ts").isNull()
    judged_send = guarded & accepted & (c("first_sent_ts") <= mark) & no_fate
    active_after = c("last_ts") > mark
    redelivery_pending = F.coalesce(c("redelivery_due") > mark, F.lit(False))
    if options.assume_drained:
        not_reached = F.lit(False)
    else:
        not_reached = ~F.coalesce(c("first_sent_ts") <= c("drained_to"), F.lit(False))
    in_flight = active_after | redelivery_pending | not_reached
    unseen_why = (F.when(active_after, F.lit("events after the watermark"))
                  .when(redelivery_pending, F.lit("a redelivery is due after the watermark"))
                  .otherwise(F.lit("no message sent later on this address has a fate yet")))
    seen = c("deliver_path") > 0
    origin_known = accepted | (c("send_failed") > 0) | (c("copies") > 0)
    limit = c("max_delivery_attempts")
    dead_letters_unmoved = F.array_except(c("dead_letter_targets"), c("moved_targets"))
    expiries_unmoved = F.array_except(c("expiry_targets"), c("moved_targets"))

    # Most messages yield no finding: a pre-filter made of necessary conditions of
    # every class (plain columns, compiled) spares them the finding structs and the
    # higher-order functions over ``queues`` below, which are evaluated row by row.
    # At 10 million events that building was 20 of the audit's 217 CPU seconds.
    guarded_sql = "guarded" if "guarded" in facts.columns else "NOT (" + " OR ".join(
        f"startswith(key, '{prefix}')" for prefix in UNGUARDED_PREFIXES) + ")"
    joined = joined.filter(may_be_finding(guarded_sql, f"CAST({int(watermark)} AS BIGINT)",
                                          "max_delivery_attempts"))
    if details is not None:
        joined = joined.join(details(joined.select("key")), "key", "left")

    per_message = F.array_compact(F.array(
        F.when(judged_send & ~in_flight, _finding(
            "lost", F.format_string(
                "sent at %d; no acked, dead_lettered, expired or delivery_dropped event"
                + ("" if options.assume_drained else
                   ", though a message sent later on %s has one"),
                c("first_sent_ts"), c("address")),
            ts=c("first_sent_ts"), deliveries=c("delivered"))),
        F.when(judged_send & in_flight, _finding(
            "unseen", F.concat(F.lit("no fate yet, in flight: "), unseen_why),
            ts=c("first_sent_ts"), deliveries=c("delivered"))),
        F.when(guarded & ~origin_known & seen & (c("first_ts") <= mark), _finding(
            "unexpected", F.format_string(
                "%d deliveries, %d deliver-path events; no sent or send_failed event and not "
                "a moved copy", c("delivered"), c("deliver_path")),
            ts=c("first_ts"), deliveries=c("delivered"))),
        F.when(guarded & ~accepted & (c("send_failed") > 0) & seen, _finding(
            "recovered", F.format_string("send failed %d time(s), then seen at a consumer",
                                         c("send_failed")),
            ts=c("first_ts"), deliveries=c("delivered"))),
        F.when(guarded & ~accepted & (c("send_failed") > 0) & ~seen
               & (c("first_ts") <= mark), _finding(
            "indeterminate", F.format_string(
                "send failed %d time(s); never seen at a consumer", c("send_failed")),
            ts=c("first_ts"))),
        F.when(~guarded & seen, _finding(
            "unguarded", F.lit("id assigned at delivery: not sent through a guard"),
            ts=c("first_ts"), deliveries=c("delivered"))),
        F.when(limit.isNotNull() & (c("dead_letter_count") < limit), _finding(
            "early_dead_letter", F.format_string(
                "dead-lettered at delivery %d, below max-delivery-attempts %d",
                c("dead_letter_count"), limit),
            ts=c("terminal_ts"), deliveries=c("dead_letter_count"), limit=limit)),
        F.when(F.size(dead_letters_unmoved) > 0, _finding(
            "dead_letter_not_moved", F.concat(
                F.lit("dead_lettered to "), F.array_join(dead_letters_unmoved, ", "),
                F.lit(" but no moved event reached it")),
            ts=c("terminal_ts"))),
        F.when(F.size(expiries_unmoved) > 0, _finding(
            "expiry_not_moved", F.concat(
                F.lit("expired to "), F.array_join(expiries_unmoved, ", "),
                F.lit(" but no moved event reached it")),
            ts=c("terminal_ts"))),
    ))
    duplicated = F.transform(F.filter(c("queues"), lambda q: q["duplicated"]), lambda q: _finding(
        "duplicated", F.format_string(
            "%d successful handlings, %d deliveries on queue %s", q["handlings"],
            q["deliveries"], q["queue"]),
        ts=q["first_handled_ts"], queue=q["queue"], deliveries=q["deliveries"]))
    over = F.transform(
        F.filter(c("queues"), lambda q: limit.isNotNull() & (q["deliveries"] > limit)),
        lambda q: _finding(
            "over_delivered", F.format_string(
                "%d deliveries on queue %s > max-delivery-attempts %d", q["deliveries"],
                q["queue"], limit),
            ts=c("first_ts"), queue=q["queue"], deliveries=q["deliveries"], limit=limit))
    late = F.transform(
        F.filter(c("queues"), lambda q: F.coalesce(c("expiry_enforced"), F.lit(True))
                 & (q["late"] > 0)),
        lambda q: _finding(
            "late_delivery", F.format_string(
                "%d delivery(ies) after the expiration on queue %s, up to %d ms late",
                q["late"], q["queue"], q["late_by_ms"]),
            ts=q["first_late_ts"], queue=q["queue"], deliveries=q["late"]))

    # The lean plan's details carry the message id string (its ``key`` is a hash).
    message_id = c("message_id") if "message_id" in joined.columns else key
    found = joined.select(message_id.alias("message_id"), "address",
                          F.explode(F.concat(per_message, duplicated, over, late)).alias("f"))
    return found.select(
        c("f.class").alias("class"), "message_id", "address", c("f.queue").alias("queue"),
        c("f.ts").alias("ts"),
        F.date_format(F.timestamp_millis(c("f.ts")), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")
        .alias("time"),
        c("f.deliveries").alias("deliveries"), c("f.limit").alias("limit"),
        c("f.detail").alias("detail"))
