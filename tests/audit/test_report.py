"""The HTML report renders, offline, with every chart and every class found."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.planted import CONFIG, plant
from mqguard_tests.synthetic import Cluster

from mqguard.audit.checks import CLASSES
from mqguard.audit.report import render
from mqguard.audit.runner import AuditOptions, run_audit

pytestmark = pytest.mark.spark


class Page(HTMLParser):
    """Collects what the checks below look at: figures, svg, row ids, links, text."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, int] = {}
        self.svgs = 0
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.text: list[str] = []
        self._figure: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.tags.add(tag)
        if tag == "figure":
            self._figure = values.get("class") or ""
            self.figures[self._figure] = 0
        if tag == "svg":
            self.svgs += 1
            if self._figure is not None:
                self.figures[self._figure] += 1
        if values.get("id"):
            self.ids.add(values["id"] or "")
        for name in ("src", "href", "xlink:href", "action"):
            if values.get(name):
                self.links.append(values[name] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def test_report_renders_offline_with_charts_and_every_class(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watermark, expected = plant(Cluster(tmp_path / "events", monkeypatch))
    out = tmp_path / "out"
    result = run_audit(spark, AuditOptions([str(tmp_path / "events")], out=str(out),
                                           config=CONFIG, watermark=watermark))

    report = out / "report.html"
    assert result.summary["report"] == str(report)
    assert json.loads((out / "summary.json").read_text())["report"] == str(report)
    text = report.read_text(encoding="utf-8")
    page = parse(text)
    # Offline: nothing fetched -- no script, no style sheet link, no URL at all.
    assert "script" not in page.tags and "link" not in page.tags
    assert "http://" not in text and "https://" not in text
    assert all(link.startswith("#") for link in page.links), page.links
    # Every chart drawn, as inline SVG.
    assert page.figures == {"chart-timeline": 1, "chart-deliveries": 1, "chart-classes": 1}
    assert page.svgs == 3
    words = " ".join(page.text)
    for name in ("acked", "dead_lettered", "expired"):  # fates in the timeline's legend
        assert name in words, name
    # Every class has its row; every class found is in the classes chart and the
    # first-findings table, with its planted example ids.
    assert {f"class-{c.name}" for c in CLASSES} <= page.ids
    for name, ids in expected.items():
        assert words.count(name) >= 3, name
        for message_id in ids:
            assert message_id in words, (name, message_id)
    assert "orders" in words
    assert len(text) < 400_000  # self-contained but not bloated


def test_no_html(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(tmp_path / "events", monkeypatch)
    cluster.handled(cluster.send("only"))
    cluster.close()
    out = tmp_path / "out"
    result = run_audit(spark, AuditOptions([str(tmp_path / "events")], out=str(out),
                                           html=False))
    assert result.summary["report"] is None
    assert not (out / "report.html").exists()


def test_render_with_nothing_to_draw() -> None:
    """An audit of no messages still renders a page (no charts, no division by zero)."""
    classes = {c.name: {"anomaly": c.anomaly, "description": c.description, "count": 0,
                        "by_address": {}} for c in CLASSES}
    summary = {"ok": True, "anomalies": 0, "events": 0, "bad_lines": 0,
               "unsupported_events": 0, "messages": 0, "files": 1, "first_ts": None,
               "last_ts": None, "watermark_time": "1970-01-01T00:00:00.000Z",
               "watermark_source": "no events", "seconds": {"audit": 0.1},
               "classes": classes, "out": "x"}
    page = parse(render(summary, {"first_ts": None, "width_ms": 1, "rows": []}, []))
    assert page.svgs == 0
    assert "no anomalies" in " ".join(page.text)


def test_progress_names_the_stage_and_stays_silent_when_asked() -> None:
    from mqguard.audit.progress import Progress, terminal_progress

    shown: list[str] = []
    progress = Progress(shown.append, live=False)
    progress("checking messages")
    assert shown and shown[-1].startswith("checking messages") and shown[-1].endswith("s]")
    progress.watch(object())  # not live: no watcher thread
    assert progress._thread is None
    with terminal_progress(False, True) as silent:
        silent("reading 1 file(s)")  # prints nothing, raises nothing
    with terminal_progress(True, False) as silent:  # not a terminal
        silent("reading 1 file(s)")


# -- the fates-over-time chart (no Spark) ---------------------------------------------

#: 2026-11-26T15:00:00Z, a chart's first event.
T0 = 1_795_705_200_000


def timeline_rows(fates: dict[str, dict[int, int]], address: str = "orders",
                  deliveries: int = 1) -> list[tuple[str, int, str, int, int]]:
    return [(address, bucket, fate, deliveries, count)
            for fate, per_bucket in fates.items() for bucket, count in per_bucket.items()]


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    """The timeline tests keep their figures to inspect them; pyplot holds them until closed."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def bars(axis: Any) -> dict[str, list[Any]]:
    """The bars of one panel, by fate (the container's label)."""
    return {container.get_label(): list(container) for container in axis.containers}


def test_timeline_x_axis_spans_the_buckets_that_hold_messages() -> None:
    """Sends in buckets 40-45 of 60 (a run whose consumers went on long after the sends):
    the axis starts at bucket 40 and ends after bucket 45, in seconds from bucket 40."""
    from mqguard.audit.report import timeline_figure

    rows = timeline_rows({"acked": {b: 500 for b in range(40, 46)}, "expired": {45: 2}})
    figure = timeline_figure({"first_ts": T0, "width_ms": 1000, "rows": rows})
    (axis,) = [a for a in figure.axes if a.get_visible()]
    low, high = axis.get_xlim()
    assert (low, high) == (0, 6)  # six buckets of one second
    drawn = [bar for group in bars(axis).values() for bar in group]
    assert min(b.get_x() for b in drawn) == low
    assert max(b.get_x() + b.get_width() for b in drawn) == pytest.approx(high)
    assert axis.get_xlabel() == "seconds after 2026-11-26T15:00:40.000Z (by send time)"


@pytest.mark.parametrize("width_ms, unit", [(4, "milliseconds"), (1_000, "seconds"),
                                            (30_000, "minutes"), (600_000, "hours")])
def test_timeline_x_axis_unit_suits_the_span(width_ms: int, unit: str) -> None:
    from mqguard.audit.report import BUCKETS, timeline_figure

    rows = timeline_rows({"acked": {b: 1 for b in range(BUCKETS)}})
    figure = timeline_figure({"first_ts": T0, "width_ms": width_ms, "rows": rows})
    axis = figure.axes[0]
    assert axis.get_xlabel().startswith(f"{unit} after ")
    unit_ms = {"milliseconds": 1, "seconds": 1_000, "minutes": 60_000, "hours": 3_600_000}
    assert axis.get_xlim()[1] == pytest.approx(BUCKETS * width_ms / unit_ms[unit])


def test_timeline_draws_every_fate_with_messages_however_few() -> None:
    """Thousands acknowledged next to a handful dead-lettered, expired, dropped and
    without fate: every fate has its bars, visible above the log axis' floor, and the
    legend names each with its total; a fate with no message is left out."""
    from mqguard.audit.report import FATES, render, timeline_figure

    orders = {"acked": {b: 20_000 for b in range(60)}, "dead_lettered": {3: 1},
              "expired": {10: 2, 11: 1}, "none": {59: 4}}
    payments = {"acked": {b: 9_000 for b in range(30, 60)}, "delivery_dropped": {31: 1}}
    rows = timeline_rows(orders) + timeline_rows(payments, "payments", deliveries=2)
    data = {"first_ts": T0, "width_ms": 1000, "rows": rows}
    figure = timeline_figure(data)
    panels = {a.get_title(loc="left").split("\n")[0]: a for a in figure.axes}
    for address, fates in (("orders", orders), ("payments", payments)):
        axis = panels[address]
        drawn = bars(axis)
        assert set(drawn) == set(fates), address
        for fate, per_bucket in fates.items():
            heights = sorted(bar.get_height() for bar in drawn[fate])
            assert heights == sorted(per_bucket.values()), (address, fate)
        assert axis.get_yscale() == "log"
        assert axis.get_ylim()[0] < 1  # a single message is a bar, not the axis line
        low, high = axis.get_xlim()
        assert all(low <= bar.get_x() and bar.get_x() + bar.get_width() <= high + 1e-9
                   for group in drawn.values() for bar in group)
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend == ["acked (1,470,000)", "dead_lettered (1)", "expired (3)",
                      "delivery_dropped (1)", "no terminal event (4)"]
    assert len(FATES) == len(legend)
    # The same in the page: the legend is text in the inline SVG.
    classes = {c.name: {"anomaly": c.anomaly, "description": c.description, "count": 0,
                        "by_address": {}} for c in CLASSES}
    summary = {"ok": True, "anomalies": 0, "events": 1, "bad_lines": 0,
               "unsupported_events": 0, "messages": 1, "files": 1, "first_ts": T0,
               "last_ts": T0 + 60_000, "watermark_time": "2026-11-26T15:01:00.000Z",
               "watermark_source": "last event", "seconds": {"audit": 0.1},
               "classes": classes, "out": "x"}
    words = " ".join(parse(render(summary, data, [])).text)
    for label in legend:
        assert label in words, label


def test_timeline_legend_leaves_out_fates_no_message_met() -> None:
    from mqguard.audit.report import timeline_figure

    rows = timeline_rows({"acked": {0: 5}, "expired": {0: 1}})
    figure = timeline_figure({"first_ts": T0, "width_ms": 50, "rows": rows})
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["acked (5)",
                                                                      "expired (1)"]


@pytest.mark.parametrize("plan", ["lean", "hash", "writing order"])
def test_a_move_and_its_ack_in_one_millisecond_chart_as_the_move(
        plan: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead-lettered or expired message's ack (reason killed / expired) is written in the
    millisecond of its move: its fate is the move, in each of the audit's three plans."""
    import mqguard.audit.report as report
    from mqguard.audit import lean

    cluster = Cluster(tmp_path / "events", monkeypatch, legacy=plan == "writing order")
    clock = cluster.clock
    cluster.handled(cluster.send("ok"))
    poison, short = cluster.send("poison"), cluster.send("short", expiration=clock.now_ms + 1)
    clock.advance(10)
    monkeypatch.setattr(clock, "advance", lambda ms=1: clock.now_ms)  # one millisecond
    cluster.dead_lettered(poison, count=1)
    cluster.expired(short)
    cluster.close()
    if plan == "hash":
        narrow = lean.narrow

        def colliding(*args: Any, **kwargs: Any) -> Any:  # as if 64-bit keys collided
            from pyspark.sql import functions as F

            rows = narrow(*args, **kwargs)
            return rows.withColumn("key", F.when(F.col("m"), F.col("key") % 2)
                                   .otherwise(F.col("key")))

        monkeypatch.setattr(lean, "narrow", colliding)
    charted: list[Any] = []
    render = report.render

    def keeping(summary: Any, data: Any, examples: Any) -> str:
        charted.append(data)
        return render(summary, data, examples)

    monkeypatch.setattr(report, "render", keeping)
    result = run_audit(spark, AuditOptions([str(tmp_path / "events")],
                                           out=str(tmp_path / "out"),
                                           max_delivery_attempts=1))
    assert result.summary["plan"].startswith(plan)
    fates = sorted(fate for _, _, fate, _, count in charted[0]["rows"] for _ in range(count))
    assert fates == ["acked", "dead_lettered", "expired"]
