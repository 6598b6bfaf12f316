"""Compare what two paths let an application observe, and tell documented deviations from
differences nobody has explained.

Compared: each batch's outcome; how many times each message was delivered; the order of
first deliveries; the whole delivery sequence (where a redelivered message comes back); which
messages reached the dead-letter and expiry queues and their ``_AMQ_ORIG_ADDRESS`` /
``_AMQ_ORIG_QUEUE`` values and whether ``_AMQ_ORIG_MESSAGE_ID`` and ``_AMQ_ACTUAL_EXPIRY``
are there. Not compared (tolerances): timestamps and ids (each broker has its own), the
values of ``_AMQ_ORIG_MESSAGE_ID`` and ``_AMQ_ACTUAL_EXPIRY``, the order inside the
dead-letter and expiry queues, and when a delayed redelivery came (only that it came).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mqguard.conformance.model import Moved, Observation, Scenario

__all__ = ["DEVIATIONS", "Difference", "compare", "documented_deviation"]


@dataclass(frozen=True)
class Difference:
    """One way ``path`` differs from ``reference`` on a scenario."""

    kind: str
    reference: str
    path: str
    detail: str
    #: The ``###`` heading of docs/artemis-compat.md that explains it (None: unexplained).
    deviation: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "reference": self.reference, "path": self.path,
                "detail": self.detail, "deviation": self.deviation}


#: Documented deviations: heading in docs/artemis-compat.md -> (difference kind, paths it
#: applies to). Every heading is a ``###`` of that page (a test checks it).
DEVIATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ActiveMQ: a redelivered message goes to the back of the queue": (
        "redelivery-position", ("sidecar-activemq", "wrapper-activemq")),
}


def documented_deviation(kind: str, path: str, reference: str = "artemis") -> str | None:
    """The heading that explains a ``kind`` difference between ``reference`` and ``path``
    (a deviation of either side: two mqguard paths are compared when Artemis cannot run
    the scenario)."""
    for heading, (dkind, paths) in DEVIATIONS.items():
        if dkind == kind and (path in paths or reference in paths):
            return heading
    return None


def _moved_key(m: Moved) -> tuple[int, str | None, str | None, bool, bool]:
    return (m.key, m.orig_address, m.orig_queue, m.has_orig_message_id, m.has_actual_expiry)


def _normalise(moved: list[Moved], address: str) -> list[tuple[object, ...]]:
    # Addresses differ per path only by the name each run was given.
    out = []
    for m in moved:
        k = _moved_key(m)
        out.append((k[0], None if k[1] is None else k[1] == address,
                    None if k[2] is None else k[2] == address, k[3], k[4]))
    return sorted(out, key=repr)


def compare(scenario: Scenario, reference: str, ref: Observation, ref_address: str,
            path: str, obs: Observation, address: str) -> list[Difference]:
    """The differences of ``obs`` (``path``) from ``ref`` (``reference``)."""
    diffs: list[Difference] = []

    def add(kind: str, detail: str) -> None:
        diffs.append(Difference(kind, reference, path, detail,
                                documented_deviation(kind, path, reference)))

    if obs.strays:
        add("stray-message", "; ".join(obs.strays[:5]))
    for i in range(max(len(ref.batches), len(obs.batches))):
        # A path that stopped early has no outcome for the batches it never ran.
        a = ref.batches[i] if i < len(ref.batches) else "not run"
        b = obs.batches[i] if i < len(obs.batches) else "not run"
        if a != b:
            add("batch-outcome", f"batch {i} ({scenario.batches[i].transaction}): "
                                 f"{reference} {a}, {path} {b}")
    counts_a = Counter(k for k, _ in ref.deliveries)
    counts_b = Counter(k for k, _ in obs.deliveries)
    for key in sorted(set(counts_a) | set(counts_b)):
        if counts_a[key] != counts_b[key]:
            add("delivery-count", f"m{key} delivered {counts_a[key]}x on {reference}, "
                                  f"{counts_b[key]}x on {path}")
    first_a = [k for k, n in ref.deliveries if n == 1]
    first_b = [k for k, n in obs.deliveries if n == 1]
    if first_a != first_b and sorted(first_a) == sorted(first_b):
        add("first-delivery-order", f"{reference} {first_a}, {path} {first_b}")
    if (counts_a == counts_b and first_a == first_b and ref.deliveries != obs.deliveries):
        add("redelivery-position", f"{reference} {_seq(ref)}, {path} {_seq(obs)}")
    for kind, a_m, b_m in (("dead-letters", ref.dead_letters, obs.dead_letters),
                           ("expired", ref.expired, obs.expired)):
        na, nb = _normalise(a_m, ref_address), _normalise(b_m, address)
        if na != nb:
            add(kind, f"{reference} {_moved(a_m, ref_address)}, {path} {_moved(b_m, address)}")
    return diffs


def _seq(obs: Observation) -> str:
    return " ".join(f"m{k}#{n}" for k, n in obs.deliveries)


def _moved(moved: list[Moved], address: str) -> str:
    def one(m: Moved) -> str:
        flags = []
        if m.orig_address != address:
            flags.append(f"_AMQ_ORIG_ADDRESS={m.orig_address}")
        if m.orig_queue != address:
            flags.append(f"_AMQ_ORIG_QUEUE={m.orig_queue}")
        if not m.has_orig_message_id:
            flags.append("no _AMQ_ORIG_MESSAGE_ID")
        if m.has_actual_expiry:
            flags.append("_AMQ_ACTUAL_EXPIRY")
        return f"m{m.key}" + (f"({', '.join(flags)})" if flags else "")
    return "[" + ", ".join(one(m) for m in sorted(moved, key=lambda m: m.key)) + "]"
