"""The audit's checks in DuckDB: the single-machine tool a user might pick instead.

``mqguard bench audit`` runs this on the same files as the Spark audit, so that
``ratio`` says what Spark's plan costs against a fast single-process engine. It
mirrors :mod:`mqguard.audit.checks` (the definitions are in that docstring):
per message id, the writing order of each process pairs a ``delivered`` with
the event after it; per (message, queue) the deliveries, handlings and late
deliveries; per message the send, fate and copy facts; the watermark and the
per-address drain evidence; then every class. A bench-only extra (``duckdb``
in the ``bench`` extra); the product's audit is the Spark one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mqguard.audit.checks import COPIED, DELIVER_PATH, TERMINAL
from mqguard.events import SCHEMA_VERSION

_COLUMNS = ("{v: 'BIGINT', ts: 'BIGINT', type: 'VARCHAR', node: 'VARCHAR', "
            "address: 'VARCHAR', message_id: 'VARCHAR', queue: 'VARCHAR', target: 'VARCHAR', "
            "new_message_id: 'VARCHAR', ack_reason: 'VARCHAR', expiration: 'BIGINT', "
            "delivery_count: 'BIGINT', delay_ms: 'BIGINT', handled: 'BOOLEAN', "
            "delivered_ts: 'BIGINT'}")


def _in(values: Sequence[object]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


_FIELDS = ("v, ts, type, node, address, message_id, queue, target, new_message_id, "
           "ack_reason, expiration, delivery_count, delay_ms, handled, delivered_ts")


def _source(files: Sequence[str], fmt: str) -> str:
    listed = "[" + ", ".join(f"'{f}'" for f in files) + "]"
    if fmt == "parquet":
        return f"read_parquet({listed})"
    return (f"read_json({listed}, format = 'newline_delimited', columns = {_COLUMNS}, "
            "filename = true, ignore_errors = true)")


def _load_mixed(files: Sequence[str]) -> str:
    """The event log as the writer leaves it: rotated Parquet segments (file row
    numbers from the file itself) and JSONL files (rows numbered in scan order)."""
    parquet = [f for f in files if f.endswith(".parquet")]
    jsonl = [f for f in files if not f.endswith(".parquet")]
    parts = []
    if parquet:
        listed = "[" + ", ".join(f"'{f}'" for f in parquet) + "]"
        parts.append(f"SELECT {_FIELDS}, filename AS file, file_row_number AS row "
                     f"FROM read_parquet({listed}, filename = true, file_row_number = true)")
    if jsonl:
        parts.append(f"SELECT {_FIELDS}, filename AS file, row_number() OVER () AS row "
                     f"FROM {_source(jsonl, 'jsonl')}")
    return " UNION ALL ".join(parts)


def audit_sql(files: Sequence[str], *, fmt: str = "jsonl", grace_ms: int, limit: int,
              tolerance_ms: int, ordered: bool = False) -> list[str]:
    """The statements; the last leaves table ``findings(class, message_id, ...)``.

    As the Spark audit: a handling is an ``acked`` (normal) with ``handled`` and
    ``delivered_ts`` (hash aggregations only); ``ordered`` pairs each ``delivered``
    with the next event of its process instead (a window in writing order), as for
    logs written before those fields existed.
    """
    if fmt == "parquet":
        order = "file, row"
        load = (f"SELECT v, ts, type, node, address, message_id, queue, target, "
                f"new_message_id, ack_reason, expiration, delivery_count, delay_ms, handled, "
                f"delivered_ts, file, row "
                f"FROM {_source(files, fmt)}")
    elif fmt == "mixed":
        order = "file, row"
        load = _load_mixed(files)
    else:
        order = "file, row"
        # Rows numbered in scan order: DuckDB keeps the insertion order of a scan.
        load = (f"SELECT v, ts, type, node, address, message_id, queue, target, "
                f"new_message_id, ack_reason, expiration, delivery_count, delay_ms, handled, "
                f"delivered_ts, filename AS file, row_number() OVER () AS row "
                f"FROM {_source(files, fmt)}")
    terminal, deliver_path = _in([str(t) for t in TERMINAL]), _in([str(t) for t in DELIVER_PATH])
    own = f"""
            SELECT message_id AS key, node, file, row, ts, ack_reason, target, expiration,
                   delivery_count, delay_ms, type, address, queue, handled, delivered_ts FROM e
            WHERE v = {SCHEMA_VERSION} AND type IS NOT NULL AND ts IS NOT NULL
              AND message_id IS NOT NULL
            UNION ALL
            SELECT new_message_id, node, file, row, ts, ack_reason, target, expiration,
                   delivery_count, delay_ms, '{COPIED}', target, NULL, NULL, NULL FROM e
            WHERE v = {SCHEMA_VERSION} AND type = 'moved' AND new_message_id IS NOT NULL"""
    if ordered:
        # ``handling``: the delivered event itself, when the next event of its process is
        # an acked (normal); its position is its own.
        rows = f"""CREATE OR REPLACE TEMP TABLE r AS
        WITH own AS ({own})
        SELECT * REPLACE (coalesce(type = 'delivered'
                   AND lead(type) OVER w = 'acked' AND lead(ack_reason) OVER w = 'normal'
                   AND lead(queue) OVER w IS NOT DISTINCT FROM queue
                   AND lead(node) OVER w IS NOT DISTINCT FROM node, false) AS handled,
                   ts AS delivered_ts)
        FROM own
        WINDOW w AS (PARTITION BY key ORDER BY queue NULLS FIRST, node, {order})"""
    else:
        # ``handling``: the acked event that says so; its position is its delivery's time
        # with its own row (orders as the delivery does against every other one).
        rows = f"""CREATE OR REPLACE TEMP TABLE r AS
        SELECT * REPLACE (coalesce(type = 'acked' AND ack_reason = 'normal' AND handled
                                   AND delivered_ts IS NOT NULL, false) AS handled)
        FROM ({own})"""
    return [
        f"CREATE OR REPLACE TEMP TABLE e AS {load}",
        rows,
        f"""CREATE OR REPLACE TEMP TABLE q AS
        SELECT key, queue,
               greatest(count(*) FILTER (WHERE type = 'delivered'),
                        coalesce(max(delivery_count) FILTER (WHERE type = 'delivered'), 0))
                   AS deliveries,
               count(*) FILTER (WHERE handled) AS handlings,
               min(delivered_ts) FILTER (WHERE handled) AS first_handled_ts,
               coalesce(count(*) FILTER (WHERE handled) >= 2
                        OR max((ts, file, row)) FILTER (WHERE type = 'delivered')
                           > min((delivered_ts, file, row)) FILTER (WHERE handled), false)
                   AS duplicated,
               count(*) FILTER (WHERE type = 'delivered' AND expiration > 0
                                AND ts > expiration + {tolerance_ms}) AS late
        FROM r WHERE queue IS NOT NULL GROUP BY key, queue""",
        f"""CREATE OR REPLACE TEMP TABLE f AS
        SELECT key,
               coalesce(max(address) FILTER (WHERE type = 'sent'),
                        max(address) FILTER (WHERE type = '{COPIED}'), max(address)) AS address,
               count(*) FILTER (WHERE type = 'sent') AS sent,
               min(ts) FILTER (WHERE type = 'sent') AS first_sent_ts,
               count(*) FILTER (WHERE type = 'send_failed') AS send_failed,
               count(*) FILTER (WHERE type = '{COPIED}') AS copies,
               count(*) FILTER (WHERE type IN {deliver_path}
                                OR (type = 'moved' AND queue IS NOT NULL)) AS deliver_path,
               count(*) FILTER (WHERE type = 'delivered') AS delivered,
               min(ts) FILTER (WHERE type IN {terminal}) AS terminal_ts,
               min(ts) FILTER (WHERE type <> '{COPIED}') AS first_ts,
               max(ts) FILTER (WHERE type <> '{COPIED}') AS last_ts,
               max(ts + coalesce(delay_ms, 0)) FILTER (WHERE type = 'redelivery_scheduled')
                   AS redelivery_due,
               list(DISTINCT target) FILTER (WHERE type = 'dead_lettered'
                                             AND target IS NOT NULL) AS dl_targets,
               list(DISTINCT target) FILTER (WHERE type = 'expired'
                                             AND target IS NOT NULL) AS exp_targets,
               coalesce(list(DISTINCT target) FILTER (WHERE type = 'moved'), []) AS moved_targets,
               min(delivery_count) FILTER (WHERE type = 'dead_lettered') AS dl_count
        FROM r GROUP BY key""",
        f"""CREATE OR REPLACE TEMP TABLE findings AS
        WITH mark AS (SELECT max(ts) - {grace_ms} AS mark FROM e
                      WHERE v = {SCHEMA_VERSION} AND type IS NOT NULL AND ts IS NOT NULL),
        drained AS (SELECT address, max(first_sent_ts) FILTER (WHERE terminal_ts IS NOT NULL)
                    AS drained_to FROM f GROUP BY address),
        j AS (
            SELECT f.*, mark.mark,
                   NOT (starts_with(key, 'unguarded:') OR starts_with(key, 'broker:'))
                       AS guarded,
                   (f.last_ts > mark.mark OR coalesce(f.redelivery_due > mark.mark, false)
                    OR NOT coalesce(f.first_sent_ts <= d.drained_to, false)) AS in_flight
            FROM f CROSS JOIN mark LEFT JOIN drained d USING (address)
        ),
        per_message AS (
            SELECT CASE WHEN in_flight THEN 'unseen' ELSE 'lost' END AS class,
                   key, address, NULL AS queue, first_sent_ts AS ts FROM j
            WHERE guarded AND sent > 0 AND first_sent_ts <= mark AND terminal_ts IS NULL
            UNION ALL
            SELECT 'unexpected', key, address, NULL, first_ts FROM j
            WHERE guarded AND sent = 0 AND send_failed = 0 AND copies = 0
              AND deliver_path > 0 AND first_ts <= mark
            UNION ALL
            SELECT 'recovered', key, address, NULL, first_ts FROM j
            WHERE guarded AND sent = 0 AND send_failed > 0 AND deliver_path > 0
            UNION ALL
            SELECT 'indeterminate', key, address, NULL, first_ts FROM j
            WHERE guarded AND sent = 0 AND send_failed > 0 AND deliver_path = 0
              AND first_ts <= mark
            UNION ALL
            SELECT 'unguarded', key, address, NULL, first_ts FROM j
            WHERE NOT guarded AND deliver_path > 0
            UNION ALL
            SELECT 'early_dead_letter', key, address, NULL, terminal_ts FROM j
            WHERE dl_count < {limit}
            UNION ALL
            SELECT 'dead_letter_not_moved', key, address, NULL, terminal_ts FROM j
            WHERE len(list_filter(dl_targets, lambda x: NOT list_contains(moved_targets, x))) > 0
            UNION ALL
            SELECT 'expiry_not_moved', key, address, NULL, terminal_ts FROM j
            WHERE len(list_filter(exp_targets, lambda x: NOT list_contains(moved_targets, x))) > 0
        ),
        per_queue AS (
            SELECT 'duplicated' AS class, q.key, f.address, q.queue, q.first_handled_ts AS ts
            FROM q JOIN f USING (key) WHERE q.duplicated
            UNION ALL
            SELECT 'over_delivered', q.key, f.address, q.queue, f.first_ts
            FROM q JOIN f USING (key) WHERE q.deliveries > {limit}
            UNION ALL
            SELECT 'late_delivery', q.key, f.address, q.queue, f.first_ts
            FROM q JOIN f USING (key) WHERE q.late > 0
        )
        SELECT class, key AS message_id, address, queue, ts FROM per_message
        UNION ALL SELECT class, key, address, queue, ts FROM per_queue""",
    ]


def run_checks(con: Any, files: Sequence[str], *, fmt: str = "jsonl", grace_ms: int,
               limit: int, tolerance_ms: int, out: str | None = None,
               ordered: bool = False) -> None:
    """Run every statement on ``con``; the findings are written to ``out`` as Parquet."""
    for statement in audit_sql(files, fmt=fmt, grace_ms=grace_ms, limit=limit,
                               tolerance_ms=tolerance_ms, ordered=ordered):
        con.execute(statement)
    if out is not None:
        con.execute(f"COPY findings TO '{out}' (FORMAT PARQUET)")
