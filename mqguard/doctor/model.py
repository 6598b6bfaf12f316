"""What ``mqguard doctor`` reports: one :class:`Check` per fact, each ok / warning / error.

A check that could not be made (no broker URL given, the memory store needs no Redis, a
fact the broker does not show over its protocol) is ``skipped`` with the reason and how to
make it possible; skipped checks do not change the exit code, so that a deployment gate
fails only on what was found wrong, and the table still shows what was not verified.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEMA_VERSION", "Check", "Report", "Status"]

#: Version of the JSON document ``mqguard doctor --json`` prints (docs/doctor.md).
SCHEMA_VERSION = 1


class Status(enum.Enum):
    """Outcome of one check, in increasing severity (``skipped`` counts as nothing)."""

    SKIPPED = "skipped"
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


_EXIT_CODES: Mapping[Status, int] = {Status.SKIPPED: 0, Status.OK: 0, Status.WARNING: 1,
                                     Status.ERROR: 2}


@dataclass(frozen=True, slots=True)
class Check:
    """One verified fact: where (``area``), what (``name``), the verdict and the fix."""

    #: ``config``, ``broker``, ``redis`` or ``clock``.
    area: str
    #: Short, stable identifier inside the area (``maxmemory-policy``, ``scheduler``...).
    name: str
    status: Status
    #: What was found, in one sentence; never holds a credential.
    detail: str
    #: What to change, for a warning or an error (and how to make a skipped check run).
    fix: str = ""
    #: Measured values (versions, milliseconds, bytes) for the JSON output.
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"area": self.area, "name": self.name, "status": self.status.value,
                "detail": self.detail, "fix": self.fix, "data": dict(self.data)}


@dataclass(slots=True)
class Report:
    """Every check of one run, in the order they were made."""

    checks: list[Check] = field(default_factory=list)

    def add(self, checks: Check | Iterable[Check]) -> None:
        if isinstance(checks, Check):
            self.checks.append(checks)
        else:
            self.checks.extend(checks)

    @property
    def exit_code(self) -> int:
        """0 when nothing is wrong, 1 with warnings only, 2 with any error."""
        return max((_EXIT_CODES[c.status] for c in self.checks), default=0)

    def counts(self) -> dict[str, int]:
        return {status.value: sum(1 for c in self.checks if c.status is status)
                for status in Status}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "exit_code": self.exit_code,
                "counts": self.counts(), "checks": [c.to_json() for c in self.checks]}
