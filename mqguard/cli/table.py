"""A command's results: a table for the terminal, JSON for a file.

Shared by the production commands (``reap``, ``dedup``, ``redistribute``, ``demo``) and the
benchmarks, so it lives with the CLI: a production command never imports ``mqguard.bench``.

Tables are built to stay whole in an 80-column terminal: a cell or header wider than its
column folds onto the next line instead of being cut with an ellipsis, so a figure or a
name is never shown half.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["environment", "format_value", "print_table", "results_table", "write_json"]


def environment() -> dict[str, Any]:
    """Facts about the machine a figure was measured on."""
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def format_value(value: Any) -> str:
    """A cell's text: small floats with three decimals, large ones as grouped integers."""
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:,.0f}"
    return "" if value is None else str(value)


def _numeric(values: Sequence[Any]) -> bool:
    present = [v for v in values if v is not None and v != ""]
    return bool(present) and all(isinstance(v, int | float) and not isinstance(v, bool)
                                 for v in present)


def results_table(title: str | None, rows: Sequence[Mapping[str, Any]],
                  columns: Sequence[str]) -> Table:
    """One row per mapping, one column per key in ``columns``.

    Columns of numbers are right-aligned (digits line up), every other column left.
    """
    table = Table(title=title)
    for column in columns:
        numeric = _numeric([row.get(column) for row in rows])
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(format_value(row.get(c)) for c in columns))
    return table


def print_table(title: str | None, rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                *, console: Console | None = None) -> None:
    """Print :func:`results_table` on ``console`` (standard output by default)."""
    (console or Console()).print(results_table(title, rows, columns))


def write_json(path: str | Path | None, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` to ``path`` as indented JSON; nothing when ``path`` is None."""
    if path is None:
        return
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")
