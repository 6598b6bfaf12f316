"""A click callback for options naming a file a command writes when it is done."""

from __future__ import annotations

import os
from pathlib import Path

import click

__all__ = ["output_file"]


def output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse, before any work, a file the command could not write at its end: a long run
    must not end in a traceback and lose its results."""
    if value is None:
        return None
    path = Path(value)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory")
    if not parent.is_dir():
        raise click.BadParameter(f"{value}: no directory {parent}")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise click.BadParameter(f"{value}: not writable")
    return value
