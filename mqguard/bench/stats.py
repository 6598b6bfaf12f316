"""Small statistics shared by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["median"]


def median(values: Sequence[float]) -> float:
    """The median of ``values``; 0.0 for none (a case that measured nothing)."""
    return statistics.median(values) if values else 0.0
