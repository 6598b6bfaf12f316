"""The audit's HTML report: one self-contained file that opens offline.

Charts are drawn by matplotlib as SVG and inlined into the page: no JavaScript,
no CDN, no external font or style sheet, so the file can be mailed, attached
to a CI run or opened on an air-gapped machine. Text stays text in the SVG
(``svg.fonttype = none``), which keeps a report of a few charts around 100 kB.

Contents: the verdict and input figures, counts per class, fates per address
over time (per time bucket a bar per fate, log scale: acked, dead-lettered,
expired, dropped, no fate yet), the delivery-count histogram, findings per
class and address, and the first findings of each class with their details.

Spark side (:func:`chart_data`): one aggregation over the message facts the
audit already holds, so only a few hundred rows reach the driver.
"""

from __future__ import annotations

import html
import io
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

REPORT_FILE = "report.html"
_DECIMALS = re.compile(r"(?<=[\s\"(,])(-?\d+\.\d)\d+")
_INDENT = re.compile(r"\n[ \t]+")
#: Time buckets of the fates-over-time chart.
BUCKETS = 60
#: Addresses drawn in the fates-over-time chart (the busiest); the rest are summed.
MAX_ADDRESSES = 8
#: Deliveries at or above this share the histogram's last bar.
MAX_DELIVERIES = 20
FATES = ("acked", "dead_lettered", "expired", "delivery_dropped", "none")
FATE_COLOURS = {"acked": "#4c9a2a", "dead_lettered": "#c0392b", "expired": "#e67e22",
                "delivery_dropped": "#8e44ad", "none": "#95a5a6"}
OTHER = "(other addresses)"


def chart_data(facts: Any, first_ts: int | None, last_ts: int | None) -> dict[str, Any]:
    """Timeline and delivery histogram from the message facts (a Spark DataFrame).

    Each message counts once, at its first send time (or first event when it was
    never sent), under its first terminal event (``none`` when it has none).
    """
    from pyspark.sql import functions as F

    if first_ts is None or last_ts is None:
        return {"first_ts": None, "width_ms": 1, "rows": []}
    width = max(1, -(-(last_ts - first_ts + 1) // BUCKETS))
    at = F.coalesce(F.col("first_sent_ts"), F.col("first_ts"))
    rows = (facts.filter(F.col("is_message") & at.isNotNull())
            .groupBy(F.col("address"),
                     ((at - F.lit(first_ts)) / F.lit(width)).cast("long").alias("bucket"),
                     F.coalesce(F.col("fate"), F.lit("none")).alias("fate"),
                     F.least(F.col("delivered"), F.lit(MAX_DELIVERIES)).alias("deliveries"))
            .count().collect())
    return {"first_ts": first_ts, "width_ms": width,
            "rows": [(r["address"] or "", int(r["bucket"]), r["fate"], int(r["deliveries"]),
                      int(r["count"])) for r in rows]}


def first_findings(findings: Any, per_class: int) -> list[dict[str, Any]]:
    """The first ``per_class`` findings of each class by time, with their details."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if per_class <= 0:
        return []
    order = Window.partitionBy("class").orderBy("ts", "message_id")
    rows = (findings.withColumn("n", F.row_number().over(order))
            .filter(F.col("n") <= per_class)
            .select("class", "message_id", "address", "queue", "time", "detail", "n")
            .collect())
    return [r.asDict() for r in sorted(rows, key=lambda r: (r["class"], r["n"]))]


# -- rendering (no Spark) -------------------------------------------------------------


def _svg(figure: Any) -> str:
    """The figure as an inline ``<svg>`` element: no XML prolog, DOCTYPE or metadata."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight",
                   metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(figure)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    # Namespace names are identifiers, not links, but an HTML5 page needs none of
    # them and a report with no URL at all is easy to check for.
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text, count=3)
    # A tenth of a point is finer than any screen shows: coordinates rounded and
    # indentation dropped make the SVG about half as large.
    text = _DECIMALS.sub(r"\1", text)
    return _INDENT.sub("\n", text)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "mqguard",
                                "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def _iso(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _iso_ms(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: Units of the timeline's x-axis, smallest first (see :func:`_time_unit`).
_UNITS = (("milliseconds", 1), ("seconds", 1_000), ("minutes", 60_000), ("hours", 3_600_000),
          ("days", 86_400_000))
#: Labels of the fates in the timeline's legend and panel titles.
FATE_LABELS = {"acked": "acked", "dead_lettered": "dead_lettered", "expired": "expired",
               "delivery_dropped": "delivery_dropped", "none": "no terminal event"}


def _time_unit(span_ms: int) -> tuple[str, int]:
    """The largest unit the span shown is at least two of: ticks read 0, 1, 2 s rather
    than 0.000, 0.010, 0.020 min."""
    chosen = _UNITS[0]
    for name, ms in _UNITS:
        if span_ms >= 2 * ms:
            chosen = (name, ms)
    return chosen


def _count_label(value: float, _: Any) -> str:
    return f"{value:,.0f}" if value >= 1 else ""


def timeline_figure(data: Mapping[str, Any]) -> Any:
    """The fates-over-time chart as a matplotlib figure (None when there is nothing to draw).

    One panel per busy address. In each time bucket every fate has its own bar, side by
    side, on a log scale: a few dead-lettered or expired messages stay visible next to
    thousands acknowledged, which a stack of linear bands hid. The x-axis spans the
    buckets that hold messages, not the audit's whole time range: messages are placed by
    send time, and a run's sends end well before its last event. The legend names every
    fate present with its total; each panel's title gives its own totals.
    """
    rows = data["rows"]
    if not rows:
        return None
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator

    totals: dict[str, int] = defaultdict(int)
    for address, _, _, _, count in rows:
        totals[address] += count
    busiest = sorted(totals, key=lambda a: (-totals[a], a))
    shown = busiest[:MAX_ADDRESSES] + ([OTHER] if len(busiest) > MAX_ADDRESSES else [])
    buckets = [min(max(bucket, 0), BUCKETS - 1) for _, bucket, _, _, count in rows if count]
    first, last = min(buckets), max(buckets)
    span = last - first + 1
    series: dict[str, dict[str, list[int]]] = {a: {f: [0] * span for f in FATES} for a in shown}
    for address, bucket, fate, _, count in rows:
        panel = address if address in series else OTHER
        at = min(max(bucket, 0), BUCKETS - 1) - first
        series[panel][fate if fate in FATES else "none"][at] += count
    fate_totals = {f: sum(sum(series[a][f]) for a in shown) for f in FATES}
    # A fate that never happened would only add an empty bar slot and a legend entry.
    fates = [f for f in FATES if fate_totals[f]]
    width_ms = data["width_ms"]
    unit, unit_ms = _time_unit(span * width_ms)
    step = width_ms / unit_ms
    origin = data["first_ts"] + first * width_ms
    columns = 2 if len(shown) > 1 else 1
    lines = -(-len(shown) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 2.3 * lines),
                                squeeze=False, sharex=True)
    for index, address in enumerate(shown):
        axis = axes[index // columns][index % columns]
        peak = 1
        # A bucket is shared by the fates of this panel only: wider bars where few
        # fates happened (the colours, not the positions, tell the fates apart).
        here = [f for f in fates if any(series[address][f])]
        slot = step / max(1, len(here))
        for offset, fate in enumerate(here):
            counts = series[address][fate]
            drawn = [(b, c) for b, c in enumerate(counts) if c]
            peak = max(peak, *(c for _, c in drawn))
            axis.bar([b * step + offset * slot for b, _ in drawn], [c for _, c in drawn],
                     width=slot, align="edge", color=FATE_COLOURS[fate], label=fate,
                     log=True)
        # Down to half a message, so that a bucket's single message is a visible bar.
        axis.set_ylim(0.5, peak * 2)
        axis.yaxis.set_major_locator(LogLocator(base=10))
        axis.yaxis.set_major_formatter(FuncFormatter(_count_label))
        axis.set_xlim(0, span * step)
        mine = [f"{FATE_LABELS[f]} {sum(series[address][f]):,}" for f in here]
        axis.set_title(address + "\n" + " \u00b7 ".join(mine), fontsize=8, loc="left")
        axis.set_ylabel("messages")
    bottom = list(axes[-1])
    for index in range(len(shown), lines * columns):
        axes[index // columns][index % columns].set_visible(False)
        # The panel above an empty slot is the last of its column: it takes the x-axis.
        bottom[index % columns] = axes[index // columns - 1][index % columns]
    for axis in bottom:
        axis.xaxis.set_tick_params(labelbottom=True)
        axis.set_xlabel(f"{unit} after {_iso_ms(origin)} (by send time)")
    handles = [Patch(color=FATE_COLOURS[f], label=f"{FATE_LABELS[f]} ({fate_totals[f]:,})")
               for f in fates]
    figure.tight_layout()
    # Above the panels, whatever their number (the SVG is cropped to what is drawn).
    figure.legend(handles=handles, loc="lower center", ncol=len(fates), frameon=False,
                  bbox_to_anchor=(0.5, 1.0))
    return figure


def timeline_chart(data: Mapping[str, Any]) -> str | None:
    """:func:`timeline_figure` as inline SVG."""
    figure = timeline_figure(data)
    return None if figure is None else _svg(figure)


def histogram_chart(data: Mapping[str, Any]) -> str | None:
    """Messages per number of deliveries (log scale: the tail is what matters)."""
    counts = [0] * (MAX_DELIVERIES + 1)
    for _, _, _, deliveries, count in data["rows"]:
        counts[min(deliveries, MAX_DELIVERIES)] += count
    if not any(counts):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 2.6))
    labels = [str(n) for n in range(MAX_DELIVERIES)] + [f"{MAX_DELIVERIES}+"]
    bars = axis.bar(labels, counts, color="#2e86c1", log=True)
    axis.bar_label(bars, labels=[f"{c:,}" if c else "" for c in counts], fontsize=7)
    axis.set_xlabel("deliveries to a handler (all queues)")
    axis.set_ylabel("messages")
    return _svg(figure)


def classes_chart(classes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Findings per class, stacked by address (the busiest addresses named)."""
    present = [(name, entry) for name, entry in classes.items() if entry["count"]]
    if not present:
        return None
    plt = _pyplot()
    totals: dict[str, int] = defaultdict(int)
    for _, entry in present:
        for address, item in entry["by_address"].items():
            totals[address] += item["count"]
    named = sorted(totals, key=lambda a: (-totals[a], a))[:MAX_ADDRESSES]
    stack = [*named, OTHER] if len(totals) > len(named) else named
    figure, axis = plt.subplots(figsize=(8, 0.35 * len(present) + 1.2))
    names = [name for name, _ in present][::-1]
    left = [0] * len(names)
    colours = plt.get_cmap("tab10")
    for index, address in enumerate(stack):
        values = []
        for name in names:
            by_address = classes[name]["by_address"]
            if address == OTHER:
                values.append(sum(v["count"] for a, v in by_address.items() if a not in named))
            else:
                values.append(by_address.get(address, {}).get("count", 0))
        axis.barh(names, values, left=left, label=address or "(none)",
                  color=colours(index % 10))
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, total in enumerate(left):
        axis.text(total, y, f" {total:,}", va="center", fontsize=7)
    axis.set_xlabel("findings")
    axis.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.08, 1))
    return _svg(figure)


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1e7e34}.bad{color:#b52a1c}.info{color:#777}code{font-size:.95em}
figure{margin:1em 0}svg{max-width:100%;height:auto}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def render(summary: Mapping[str, Any], data: Mapping[str, Any],
           examples: Sequence[Mapping[str, Any]]) -> str:
    """The whole page."""
    classes = summary["classes"]
    verdict = ('<span class="ok">no anomalies</span>' if summary["ok"] else
               f'<span class="bad">{summary["anomalies"]:,} anomalies</span>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>mqguard audit</title>", f"<style>{_STYLE}</style></head><body>",
        f"<h1>mqguard audit: {verdict}</h1>",
        "<table>",
        *(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in (
            ("events", f"{summary['events']:,} ({summary['bad_lines']:,} unreadable, "
                       f"{summary['unsupported_events']:,} of another schema version)"),
            ("messages", f"{summary['messages']:,}"),
            ("files", summary["files"]),
            ("first / last event", " / ".join(_iso(t) if t is not None else "-"
                                              for t in (summary["first_ts"],
                                                        summary["last_ts"]))),
            ("watermark", f"{summary['watermark_time']} ({summary['watermark_source']})"),
            ("seconds", ", ".join(f"{k} {v}" for k, v in summary["seconds"].items())),
        )),
        "</table>",
        "<h2>Findings per class</h2>",
        "<table><tr><th>class</th><th>kind</th><th>count</th><th>addresses</th>"
        "<th>meaning</th></tr>",
    ]
    for name, entry in classes.items():
        kind = ('<span class="bad">anomaly</span>' if entry["anomaly"] and entry["count"]
                else "anomaly" if entry["anomaly"] else '<span class="info">info</span>')
        parts.append(f'<tr id="class-{_e(name)}"><td><code>{_e(name)}</code></td>'
                     f'<td>{kind}</td><td class="n">{entry["count"]:,}</td>'
                     f'<td class="n">{len(entry["by_address"])}</td>'
                     f"<td>{_e(entry['description'])}</td></tr>")
    parts.append("</table>")
    for title, chart, css in (
            ("Fates per address over time", timeline_chart(data), "chart-timeline"),
            ("Delivery-count histogram", histogram_chart(data), "chart-deliveries"),
            ("Findings per class and address", classes_chart(classes), "chart-classes")):
        parts.append(f"<h2>{title}</h2>")
        parts.append(f'<figure class="{css}">{chart}</figure>' if chart
                     else f'<p class="info {css}">nothing to draw</p>')
    parts.append("<h2>Findings per address</h2>")
    rows = [(name, address, item) for name, entry in classes.items()
            for address, item in entry["by_address"].items()]
    if rows:
        parts.append("<table><tr><th>class</th><th>address</th><th>count</th>"
                     "<th>first examples</th></tr>")
        parts.extend(f"<tr><td><code>{_e(n)}</code></td><td>{_e(a)}</td>"
                     f'<td class="n">{i["count"]:,}</td>'
                     f"<td><code>{_e(', '.join(i['examples']))}</code></td></tr>"
                     for n, a, i in rows)
        parts.append("</table>")
    else:
        parts.append('<p class="info">no findings</p>')
    parts.append("<h2>First findings of each class</h2>")
    if examples:
        parts.append("<table><tr><th>class</th><th>message id</th><th>address</th>"
                     "<th>queue</th><th>time</th><th>detail</th></tr>")
        parts.extend(f"<tr><td><code>{_e(x['class'])}</code></td>"
                     f"<td><code>{_e(x['message_id'])}</code></td><td>{_e(x['address'])}</td>"
                     f"<td>{_e(x['queue'])}</td><td>{_e(x['time'])}</td>"
                     f"<td>{_e(x['detail'])}</td></tr>" for x in examples)
        parts.append("</table>")
    else:
        parts.append('<p class="info">no findings</p>')
    parts.append(f'<p class="info">Every finding: <code>{_e(summary["out"])}/findings/'
                 f'class=&lt;class&gt;/</code> (Parquet); the summary: '
                 f"<code>summary.json</code>.</p></body></html>")
    return "\n".join(parts) + "\n"


def write_report(summary: Mapping[str, Any], data: Mapping[str, Any],
                 examples: Sequence[Mapping[str, Any]], out: str) -> str:
    """Write ``out/report.html``; its path."""
    path = os.path.join(out, REPORT_FILE)
    text = render(summary, data, examples)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
