"""Terminal tables stay whole at 80 columns: no header or cell is cut short."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.console import Console
from rich.table import Table

from mqguard.cli.demo import TRAFFIC_ROWS, audit_table, traffic_table
from mqguard.cli.table import print_table, results_table
from mqguard.demo.outcome import LegOutcome
from mqguard.demo.plan import DemoPlan, Kind

WIDTH = 80


def rendered(table: Table, width: int = WIDTH) -> list[str]:
    # The recording is what the test reads; the file only keeps the output off stdout.
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text(styles=False).splitlines()


def cells(lines: list[str]) -> list[list[str]]:
    """Each table line split into its stripped cells (title and rules left out)."""
    return [[cell.strip() for cell in line.strip()[1:-1].split(line.strip()[0])]
            for line in lines if line.strip()[:1] in ("┃", "│")]


def leg(address: str, messages: int, unacked: int) -> LegOutcome:
    planned = DemoPlan(messages).messages_for(address.rpartition(".")[2])
    handled = Counter({p.index: 1 for p in planned if p.kind is Kind.NORMAL})
    handled.update({p.index: 3 for p in planned if p.kind is Kind.POISON})
    kinds = Counter(p.kind for p in planned)
    return LegOutcome(address, planned, handled, dead_letters=kinds[Kind.POISON],
                      expired_copies=kinds[Kind.SHORT_LIVED], failover_unacked=unacked)


@pytest.mark.parametrize("messages", [60, 100_000])  # the smallest and largest run -n allows
def test_demo_traffic_table_is_whole_at_80_columns(messages: int) -> None:
    base = "demo.m0NriKMy"
    legs = [leg(f"{base}.orders", messages, 0), leg(f"{base}.payments", messages, 10),
            leg(f"{base}.devices", messages, 0)]
    lines = rendered(traffic_table(legs))

    assert all(len(line) <= WIDTH for line in lines), lines
    assert not any("…" in line for line in lines), "\n".join(lines)
    rows = cells(lines)
    # Header: two lines per address column ("orders" over "via sidecar").
    assert rows[0] == ["", "orders", "payments", "devices"]
    assert rows[1] == ["", "via sidecar", "via wrappers", "via MQTT sidecar"]
    body = {row[0]: row[1:] for row in rows[2:]}
    assert list(body) == list(TRAFFIC_ROWS)  # each label on one line, none folded
    normal = round(messages * 0.9)
    poison = short = round(messages * 0.05)
    assert body["messages (distinct)"] == [str(messages)] * 3
    assert body["sent twice (copy rejected)"] == [str(round(messages * 0.1))] * 3
    assert body["handled once / planned"] == [f"{normal}/{normal}"] * 3
    assert body["dead-lettered / planned"] == [f"{poison}/{poison}"] * 3
    assert body["expired / planned"] == [f"{short}/{short}"] * 3
    assert body["handled twice"] == ["0", "0", "0"]
    assert body["unacked at the failover cut"] == ["-", "10", "-"]
    assert "what the clients saw (demo.m0NriKMy.*)" in lines[0]


def test_demo_audit_table_has_a_line_per_address_and_its_anomalies() -> None:
    base = "demo.m0NriKMy"
    figures = {"messages": 100_000, "sent": 100_000, "deliveries": 105_000,
               "with_fate": 99_999}
    summary = {
        "addresses": {f"{prefix}{base}.{leg}": figures for leg in ("orders", "devices")
                      for prefix in ("", "DLQ.")} | {"elsewhere": figures},
        "classes": {"lost": {"anomaly": True, "by_address": {f"{base}.devices": {"count": 1}}},
                    "unseen": {"anomaly": False,
                               "by_address": {f"{base}.orders": {"count": 7}}}}}
    lines = rendered(audit_table(summary, base))

    assert all(len(line) <= WIDTH for line in lines), lines
    rows = cells(lines)
    assert rows[0] == ["address", "messages", "sent", "deliveries", "with fate", "anomalies"]
    assert [row[0] for row in rows[1:]] == ["devices", "DLQ.devices", "orders", "DLQ.orders"]
    assert rows[1][1:] == ["100,000", "100,000", "105,000", "99,999", "1"]
    assert rows[3][-1] == "0"  # a finding that is not an anomaly is not counted


def test_results_table_right_aligns_numbers_and_keeps_text_whole() -> None:
    rows = [{"address": "orders.eu.west", "strategy": "browse-and-move", "expired": 12,
             "seconds": 0.25},
            {"address": "payments", "strategy": "native", "expired": 3_000_000,
             "seconds": 12.5}]
    columns = ["address", "strategy", "expired", "seconds"]
    table = results_table("mqguard reap", rows, columns)
    assert [c.justify for c in table.columns] == ["left", "left", "right", "right"]
    lines = rendered(table)
    assert cells(lines)[1:] == [["orders.eu.west", "browse-and-move", "12", "0.250"],
                                ["payments", "native", "3000000", "12"]]


def test_a_narrow_terminal_folds_cells_instead_of_cutting_them() -> None:
    address = "demo.m0NriKMy.payments.with.a.long.name"
    table = results_table(None, [{"address": address, "configured_id_cache_size": 20000}],
                          ["address", "configured_id_cache_size"])
    lines = rendered(table, width=30)
    assert not any("…" in line for line in lines), "\n".join(lines)
    columns = list(zip(*cells(lines), strict=True))
    assert "".join(columns[0]).replace(" ", "") == "address" + address
    assert "".join(columns[1]).replace(" ", "") == "configured_id_cache_size20000"


def test_print_table_writes_to_the_console_given(capsys: pytest.CaptureFixture[str]) -> None:
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    print_table("t", [{"figure": "ratio", "value": 1.0}], ["figure", "value"], console=console)
    assert "ratio" in console.export_text() and capsys.readouterr().out == ""


def test_audit_summary_keeps_example_ids_whole_at_80_columns() -> None:
    """What ``mqguard audit`` and the demo print: a class name may fold, an example id
    (looked up in the findings) is never split or cut."""
    from mqguard.audit.checks import CLASSES
    from mqguard.audit.cross_checks import CROSS_CLASSES
    from mqguard.audit.summary import print_summary

    ids = ["zxE_MvKmcUnegmDLE8Ms.16", "zxE_MvKmcUnegmDLE8Ms.33"]
    found = {"broker_dead_letter_unrecorded", "unseen", "dead_letter_not_moved"}
    classes = {c.name: {"anomaly": c.anomaly, "description": c.description,
                        "count": 1234 if c.name in found else 0,
                        "by_address": {"demo.UzCdyna0.payments": {"count": 1234,
                                                                  "examples": ids}}
                        if c.name in found else {}}
               for c in (*CLASSES, *CROSS_CLASSES)}
    summary = {"classes": classes, "ok": False, "anomalies": 2468, "events": 540,
               "bad_lines": 0, "files": 2, "messages": 144,
               "watermark_time": "2026-11-26T14:57:28.088Z",
               "watermark_source": "last event - 0 ms", "out": "/tmp/demo/audit"}
    # As the demo's console: long lines are not wrapped unless a printer asks.
    console = Console(width=WIDTH, record=True, color_system=None, file=io.StringIO(),
                      soft_wrap=True)
    print_summary(summary, console)
    lines = console.export_text(styles=False).splitlines()

    assert all(len(line) <= WIDTH for line in lines), lines
    assert not any("…" in line for line in lines), "\n".join(lines)
    rows = cells(lines)
    assert rows[0] == ["class", "kind", "count", "addresses", "examples"]
    assert [row[4] for row in rows[1:]] == ids * len(found)
    names = "".join(row[0] for row in rows[1:])
    for name in found:
        assert name in names, name
