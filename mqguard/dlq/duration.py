"""Durations as operators type them: ``90s``, ``10m``, ``2h``, ``7d``."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_duration"]

_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
                 "w": 604_800_000}
_FORM: Final = re.compile(r"^\s*(\d{1,12})\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(text: str, *, name: str = "duration") -> int:
    """Milliseconds of ``text``: a whole number and one unit (ms, s, m, h, d, w).

    ValueError names ``name`` and says what is accepted: a bare number is refused,
    since minutes and milliseconds are both plausible readings of it.
    """
    match = _FORM.match(text)
    if match is None:
        raise ValueError(f"{name} {text!r}: expected a whole number and a unit "
                         f"(ms, s, m, h, d, w), e.g. 10m, 2h, 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]
