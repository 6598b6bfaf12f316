"""Differential conformance: generated scenarios run on real Apache ActiveMQ Artemis and
through mqguard (sidecar and wrappers, on ActiveMQ and RabbitMQ), and what an application can
observe is compared. ``mqguard conformance`` is the command; docs/artemis-compat.md lists the
differences that are deliberate.

The generator (:mod:`mqguard.conformance.generator`) needs hypothesis, a test dependency, and
the runner (:mod:`mqguard.conformance.runner`) imports it: import them by their module names.
"""

from __future__ import annotations

from mqguard.conformance.compare import DEVIATIONS, Difference, compare
from mqguard.conformance.model import PATH_NAMES, Observation, Scenario

__all__ = [
    "DEVIATIONS",
    "PATH_NAMES",
    "Difference",
    "Observation",
    "Scenario",
    "compare",
]
