"""Run scenarios on several paths and compare each path with the reference: Artemis when it
can run the scenario, else the first mqguard path that did (then the paths are at least
compared with each other)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqguard.conformance.compare import Difference, compare
from mqguard.conformance.model import Observation, Scenario
from mqguard.conformance.paths import ADDRESS_PREFIX, ConformancePath

__all__ = ["ScenarioResult", "run_scenarios"]


@dataclass
class ScenarioResult:
    index: int
    scenario: Scenario
    reference: str | None
    observations: dict[str, Observation] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """False when fewer than two paths ran the scenario: nothing was compared."""
        return len(self.observations) >= 2

    @property
    def undocumented(self) -> list[Difference]:
        return [d for d in self.differences if d.deviation is None]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "scenario": self.scenario.describe().splitlines(),
                "reference": self.reference, "compared": self.compared,
                "observations": {k: v.to_json() for k, v in self.observations.items()},
                "skipped": self.skipped,
                "differences": [d.to_json() for d in self.differences]}


def run_scenarios(scenarios: Sequence[Scenario], paths: Sequence[ConformancePath], *,
                  progress: Callable[[ScenarioResult], None] | None = None
                  ) -> list[ScenarioResult]:
    """Run every scenario on every path (in order; the first path is the preferred
    reference) and compare."""
    run_id = uuid.uuid4().hex[:8]
    results = []
    for index, scenario in enumerate(scenarios):
        result = ScenarioResult(index, scenario, None)
        addresses: dict[str, str] = {}
        for path in paths:
            reason = path.skip_reason(scenario)
            if reason:
                result.skipped[path.name] = reason
                continue
            address = f"{ADDRESS_PREFIX}{run_id}.{index}.{path.name}"
            addresses[path.name] = address
            result.observations[path.name] = path.run(scenario, address)
        names = list(result.observations)
        if names:
            ref = result.reference = names[0]
            for name in names[1:]:
                result.differences += compare(
                    scenario, ref, result.observations[ref], addresses[ref],
                    name, result.observations[name], addresses[name])
        results.append(result)
        if progress is not None:
            progress(result)
    return results
