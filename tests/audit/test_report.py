"""The HTML report renders, offline, with every chart and every class found."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from mqguard.audit.checks import CLASSES
from mqguard.audit.report import render
from mqguard.audit.runner import AuditOptions, run_audit
from tests.audit.synthetic import Cluster
from tests.audit.test_planted import CONFIG, plant

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
