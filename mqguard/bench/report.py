"""Printing benchmark results as a table and writing them as JSON."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def environment() -> dict[str, Any]:
    """Facts about the machine a figure was measured on."""
    import os

    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def print_table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("broker", "store",
                                                                "direction") else "right")
    for row in rows:
        table.add_row(*(_fmt(row.get(c)) for c in columns))
    Console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:,.0f}"
    return "" if value is None else str(value)


def write_json(path: str | Path | None, payload: Mapping[str, Any]) -> None:
    if path is None:
        return
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")
