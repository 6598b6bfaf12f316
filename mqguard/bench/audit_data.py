"""Synthetic event logs for ``mqguard bench audit``, written in bulk by DuckDB.

A Python loop per event (``EventLog.emit``) writes about 300,000 events a second
here, so 10 million would take half a minute before the audit even starts.
Instead every message is one row of a DuckDB table, every event one row of a
join with a small table of *templates* (the event sequence the guard pipeline
writes for one kind of message: mqguard/pipeline.py, as
``tests/support/mqguard_tests/synthetic.py`` replays it), and each node's file is one ``COPY``
of JSON lines built in SQL, in writing order, with absent fields left out as
the real writer leaves them out. 10 million events take seconds.

Kinds: ``ok`` and a few legitimate paths that must *not* be flagged
(``ok_retried``, ``ok_dead_lettered``, ``ok_expired``, ``ok_suppressed``), and one kind per
finding class of :data:`mqguard.audit.checks.CLASSES`, named after it. One message in
every :data:`PERIOD` is planted per class, spread over :data:`ADDRESSES` addresses.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

T0 = 1_700_000_000_000
#: One message of each planted kind in every PERIOD messages.
PERIOD = 1000
ADDRESSES = 8
#: Messages per address block: consecutive messages share an address.
BLOCK = 1000
#: The limit the bench audits against (``--max-delivery-attempts``).
MAX_DELIVERY_ATTEMPTS = 3
#: Closing messages are sent this long after the last planted one, so the
#: default watermark (last event - grace) judges every planted message.
CLOSING_GAP_MS = 60_000
#: Padding events (a transaction that committed nothing) carry no message id.
PAD_TYPE = "tx_committed"

# A template step: (type, role, dt ms, fields). Roles: p producer, c consumer,
# c2 the other consumer, d the dead-letter consumer. Fields: id (own | copy |
# unguarded), addr (own | DLA | EXP), queue (bool), dc (delivery count), ack,
# target, new_id (bool: the copy's id), delay, reason.
Step = tuple[str, str, int, Mapping[str, Any]]

_SENT: Step = ("sent", "p", 0, {})


def _delivered(dt: int, dc: int = 1, role: str = "c") -> Step:
    return ("delivered", role, dt, {"queue": True, "dc": dc})


def _acked(dt: int, ack: str = "normal", role: str = "c", handled: int | None = None) -> Step:
    """``handled``: the dt of the delivery this ack ends a successful handling of."""
    return ("acked", role, dt, {"queue": True, "ack": ack, "handled": handled})


def _failed(dt: int) -> Step:
    return ("handler_failed", "c", dt, {"queue": True,
                                        "reason": "Nack: handler raised ValueError: bad"})


def _dead_lettered(dt: int, dc: int) -> Step:
    return ("dead_lettered", "c", dt, {"queue": True, "dc": dc, "target": "DLA",
                                       "reason": "max-delivery-attempts"})


def _moved(dt: int, target: str, reason: str) -> Step:
    return ("moved", "c", dt, {"queue": True, "target": target, "new_id": True,
                               "reason": reason})


def _expired(dt: int) -> Step:
    return ("expired", "c", dt, {"queue": True, "target": "EXP", "reason": "expired"})


OK: list[Step] = [_SENT, _delivered(1), _acked(2, handled=1)]

#: kind -> (event steps, expiration offset from the send time or None).
KINDS: dict[str, tuple[list[Step], int | None]] = {
    "ok": (OK, None),
    "ok_retried": ([_SENT, _delivered(1), _failed(2), ("nacked", "c", 3, {"queue": True}),
                    _delivered(4, 2), _acked(5, handled=4)], None),
    "ok_dead_lettered": ([_SENT, _delivered(1, 3), _failed(2),
                          _moved(3, "DLA", "max-delivery-attempts"), _dead_lettered(4, 3),
                          _acked(5, "killed"),
                          ("delivered", "d", 6, {"id": "copy", "addr": "DLA", "queue": True,
                                                 "dc": 1}),
                          ("acked", "d", 7, {"id": "copy", "addr": "DLA", "queue": True,
                                             "ack": "normal", "handled": 6})], None),
    "ok_expired": ([_SENT, _moved(2, "EXP", "expired"), _expired(3), _acked(4, "expired")], 1),
    "ok_suppressed": ([*OK, ("duplicate_delivery_suppressed", "c", 3,
                             {"queue": True, "dc": 2, "reason": "duplicate delivery"}),
                       _acked(4)], None),
    # -- anomalies
    "lost": ([_SENT], None),
    "unexpected": ([_delivered(1), _acked(2, handled=1)], None),
    "duplicated": ([*OK, _delivered(3, 2, "c2"), _acked(4, role="c2", handled=3)], None),
    "over_delivered": ([_SENT, _delivered(1, MAX_DELIVERY_ATTEMPTS + 1),
                        _acked(2, handled=1)], None),
    "early_dead_letter": ([_SENT, _delivered(1, 1), _failed(2),
                           _moved(3, "DLA", "max-delivery-attempts"), _dead_lettered(4, 1),
                           _acked(5, "killed")], None),
    "dead_letter_not_moved": ([_SENT, _delivered(1, MAX_DELIVERY_ATTEMPTS), _failed(2),
                               _dead_lettered(3, MAX_DELIVERY_ATTEMPTS),
                               _acked(4, "killed")], None),
    "expiry_not_moved": ([_SENT, _expired(2), _acked(3, "expired")], 1),
    "late_delivery": ([_SENT, _delivered(2000), _acked(2001, handled=2000)], 10),
    # -- reported, not errors
    "unseen": ([_SENT, _delivered(1), _failed(2),
                ("redelivery_scheduled", "c", 3, {"queue": True, "dc": 1,
                                                  "delay": 3_600_000}),
                ("nacked", "c", 4, {"queue": True})], None),
    "recovered": ([("send_failed", "p", 0, {"reason": "TimeoutError()"}), _delivered(1),
                   _acked(2, handled=1)], None),
    "indeterminate": ([("send_failed", "p", 0, {"reason": "TimeoutError()"})], None),
    "unguarded": ([("delivered", "c", 1, {"id": "unguarded", "queue": True, "dc": 1}),
                   ("acked", "c", 2, {"id": "unguarded", "queue": True, "ack": "normal",
                                      "handled": 1})],
                  None),
}
#: Kinds that are findings (named after their class), in slot order.
PLANTED = ("lost", "unexpected", "duplicated", "over_delivered", "early_dead_letter",
           "dead_letter_not_moved", "expiry_not_moved", "late_delivery", "unseen",
           "recovered", "indeterminate", "unguarded")
#: Slot (message index % PERIOD) -> kind; every other slot is ``ok``.
SLOTS = (*PLANTED, "ok_retried", "ok_dead_lettered", "ok_expired", "ok_suppressed")


@dataclass(frozen=True)
class Generated:
    """What :func:`generate` wrote."""

    directory: str
    files: list[str]
    events: int
    messages: int
    #: Planted findings per class.
    planted: dict[str, int]
    bytes: int


def _kind_counts(messages: int) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    full, rest = divmod(messages, PERIOD)
    for slot in range(PERIOD):
        kind = SLOTS[slot] if slot < len(SLOTS) else "ok"
        counts[kind] += full + (1 if slot < rest else 0)
    return counts


def _events_for(messages: int) -> int:
    counts = _kind_counts(messages)
    return sum(len(KINDS[k][0]) * n for k, n in counts.items()) + ADDRESSES * len(OK)


def plan(events: int) -> tuple[int, int]:
    """(messages, padding events) that make exactly ``events`` events."""
    average = _events_for(100 * PERIOD) / (100 * PERIOD)
    messages = max(0, int((events - ADDRESSES * len(OK)) / average))
    while messages and _events_for(messages) > events:
        messages -= 1
    return messages, events - _events_for(messages)


def _templates_sql() -> str:
    rows = []
    for kind, (steps, expiration) in KINDS.items():
        for number, (event_type, role, dt, f) in enumerate(steps):
            def q(value: Any) -> str:
                return "NULL" if value is None else (
                    f"'{value}'" if isinstance(value, str) else str(value))
            rows.append("(" + ", ".join([
                q(kind), str(number), q(event_type), q(role), str(dt), q(f.get("id", "own")),
                q(f.get("addr", "own")), "true" if f.get("queue") else "false", q(f.get("dc")),
                q(f.get("ack")), q(f.get("target")), "true" if f.get("new_id") else "false",
                q(f.get("delay")), q(f.get("reason")), q(expiration),
                q(f.get("handled"))]) + ")")
    return ("SELECT * FROM (VALUES " + ",\n".join(rows) + ") AS t(kind, step, type, role, dt, "
            "idk, addrk, has_queue, dc, ack, target, new_id, delay, reason, expoff, hdt)")


def _line_sql() -> str:
    """One JSON line per event, fields in the writer's order, absent when unset."""
    def opt_str(name: str) -> str:
        return f"coalesce(',\"{name}\":\"' || {name} || '\"', '')"

    def opt_num(name: str) -> str:
        return f"coalesce(',\"{name}\":' || {name}, '')"

    return ("'{\"v\":1,\"ts\":' || ts || ',\"type\":\"' || type || '\",\"node\":\"' || node "
            "|| '\"' || " + " || ".join([
                opt_str("address"), opt_str("message_id"), opt_str("producer_id"),
                opt_num("seq"), opt_num("expiration"), opt_num("delivery_count"),
                opt_str("queue"), opt_num("delay_ms"), opt_str("reason"), opt_str("target"),
                opt_str("new_message_id"), opt_str("ack_reason"), opt_num("handled"),
                opt_num("delivered_ts"), opt_num("count"),
                opt_str("transaction")]) + " || '}'")


def build_events(con: Any, events: int, *, legacy: bool = False) -> tuple[int, int]:
    """Create the DuckDB table ``ev`` of exactly ``events`` events; (messages, padding).

    ``legacy``: ``acked`` events without ``handled`` / ``delivered_ts``, as writers before
    them wrote (the audit then pairs by writing order)."""
    messages, padding = plan(events)
    slots = " ".join(f"WHEN {n} THEN '{kind}'" for n, kind in enumerate(SLOTS))
    con.execute(f"CREATE OR REPLACE TEMP TABLE tpl AS {_templates_sql()}")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE msgs AS
        SELECT i, md5('m' || i) AS id,
               'orders-' || ((i // {BLOCK}) % {ADDRESSES}) AS address,
               {T0} + i AS t,
               CASE i % {PERIOD} {slots} ELSE 'ok' END AS kind
        FROM range({messages}) r(i)
        UNION ALL  -- closing messages: one per address, after the last planted one
        SELECT {messages} + a, md5('closing' || a), 'orders-' || a,
               {T0} + {messages} + {CLOSING_GAP_MS} + a, 'ok'
        FROM range({ADDRESSES}) r(a)""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE ev AS
        SELECT m.t + p.dt AS ts, m.i AS i, p.step AS step, p.type AS type,
               CASE p.role WHEN 'p' THEN 'producer-' || (m.i % 2)
                           WHEN 'c' THEN 'consumer-' || (m.i // 2 % 2)
                           WHEN 'c2' THEN 'consumer-' || (1 - m.i // 2 % 2)
                           ELSE 'dla-consumer' END AS node,
               CASE p.addrk WHEN 'own' THEN m.address ELSE p.addrk END AS address,
               CASE p.idk WHEN 'own' THEN m.id WHEN 'copy' THEN 'c' || substr(m.id, 2)
                          ELSE 'unguarded:' || m.id END AS message_id,
               CASE WHEN p.idk <> 'unguarded' THEN 'producer-' || (m.i % 2) END
                   AS producer_id,
               CASE WHEN p.idk <> 'unguarded' THEN m.i END AS seq,
               CASE WHEN p.expoff IS NOT NULL AND p.idk = 'own' THEN m.t + p.expoff END
                   AS expiration,
               p.dc AS delivery_count,
               CASE WHEN p.has_queue THEN
                   CASE p.addrk WHEN 'own' THEN m.address ELSE p.addrk END END AS queue,
               p.delay AS delay_ms, p.reason AS reason, p.target AS target,
               CASE WHEN p.new_id THEN 'c' || substr(m.id, 2) END AS new_message_id,
               p.ack AS ack_reason,
               CASE WHEN p.type = 'acked' AND NOT {legacy} THEN p.hdt IS NOT NULL END
                   AS handled,
               CASE WHEN NOT {legacy} THEN m.t + p.hdt END AS delivered_ts,
               NULL::BIGINT AS count, NULL::VARCHAR AS transaction
        FROM msgs m JOIN tpl p ON m.kind = p.kind
        UNION ALL
        SELECT {T0} + i * {max(1, messages // max(1, padding))}, -1, i, '{PAD_TYPE}',
               'producer-0', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, 0, 'tx-' || i
        FROM range({padding}) r(i)""")
    return messages, padding


def planted_findings(con: Any) -> dict[str, int]:
    """Create table ``planted(class, message_id)``; the count per class."""
    kinds = ", ".join(f"'{k}'" for k in PLANTED)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE planted AS
        SELECT kind AS class,
               CASE kind WHEN 'unguarded' THEN 'unguarded:' || id ELSE id END AS message_id
        FROM msgs WHERE kind IN ({kinds})""")
    counts = dict(con.execute("SELECT class, count(*) FROM planted GROUP BY class").fetchall())
    return {k: int(counts.get(k, 0)) for k in PLANTED}


NODES = ("producer-0", "producer-1", "consumer-0", "consumer-1", "dla-consumer")


#: The event log writer's rotation size (``[mqguard.event-log] max-bytes`` default).
SEGMENT_BYTES = 64 * 1024 * 1024


def write_jsonl(con: Any, directory: str, segment_bytes: int = 0) -> list[str]:
    """Each node's events in writing order (time, then step), as the writer leaves them:
    segments of ``segment_bytes`` of JSONL rotated to ``events-<node>.<NNNNNN>.parquet``
    (the writer's default format, its column types and row group size), the rest in
    the live ``events-<node>.jsonl``; ``segment_bytes`` 0: one JSONL file per node."""
    from mqguard.events import FIELD_TYPES

    os.makedirs(directory, exist_ok=True)
    table = "ev"
    if segment_bytes:
        # The writer rotates once a file reaches segment_bytes: a line's segment is
        # where its first byte falls in the node's JSONL stream.
        con.execute(f"""CREATE OR REPLACE TEMP TABLE evs AS
            SELECT *, ((sum(length(line) + 1) OVER w - length(line) - 1) // {segment_bytes})
                      AS seg
            FROM (SELECT *, {_line_sql()} AS line FROM ev)
            WINDOW w AS (PARTITION BY node ORDER BY ts, i, step ROWS UNBOUNDED PRECEDING)""")
        con.execute("ALTER TABLE evs DROP COLUMN line")
        table = "evs"
    present = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    sql_types = {int: "BIGINT", str: "VARCHAR", bool: "BOOLEAN"}
    columns = ", ".join(
        (f"CAST({name} AS {sql_types[kind]})" if name in present else
         ("1" if name == "v" else f"NULL::{sql_types[kind]}")) + f' AS "{name}"'
        for name, kind in FIELD_TYPES.items())
    files = []
    for node in NODES:
        last = 0
        if segment_bytes:
            last = con.execute(f"SELECT coalesce(max(seg), 0) FROM evs WHERE node = '{node}'"
                               ).fetchone()[0]
            for number in range(last):
                path = os.path.join(directory, f"events-{node}.{number + 1:06d}.parquet")
                con.execute(f"""COPY (SELECT {columns} FROM evs
                                      WHERE node = '{node}' AND seg = {number}
                                      ORDER BY ts, i, step)
                                TO '{path}' (FORMAT PARQUET, COMPRESSION zstd,
                                             ROW_GROUP_SIZE 1048576)""")
                files.append(path)
        path = os.path.join(directory, f"events-{node}.jsonl")
        where = f"node = '{node}'" + (f" AND seg = {last}" if segment_bytes else "")
        con.execute(f"""COPY (SELECT {_line_sql()} AS line FROM {table} WHERE {where}
                              ORDER BY ts, i, step)
                        TO '{path}' (FORMAT CSV, HEADER false, QUOTE '', ESCAPE '',
                                     DELIMITER '\x01')""")
        files.append(path)
    return files


def generate(directory: str, events: int, con: Any | None = None, *,
             legacy: bool = False, segment_bytes: int = 0) -> Generated:
    """Write exactly ``events`` events as event logs under ``directory`` (``legacy``: as
    writers before ``handled`` / ``delivered_ts`` wrote them; ``segment_bytes``: rotated
    to Parquet segments of that many JSONL bytes, see :func:`write_jsonl`)."""
    import duckdb

    con = con or duckdb.connect()
    messages, _ = build_events(con, events, legacy=legacy)
    planted = planted_findings(con)
    files = write_jsonl(con, directory, segment_bytes)
    return Generated(directory=directory, files=files, events=events, messages=messages,
                     planted=planted, bytes=sum(os.path.getsize(f) for f in files))


def count_lines(files: Sequence[str]) -> int:
    """Events in ``files``: lines of JSONL files, rows of Parquet segments."""
    total = 0
    for path in files:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            total += pq.ParquetFile(path).metadata.num_rows
            continue
        with open(path, "rb") as handle:
            total += sum(chunk.count(b"\n")
                         for chunk in iter(functools.partial(handle.read, 1 << 24), b""))
    return total
