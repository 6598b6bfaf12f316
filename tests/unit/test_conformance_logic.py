"""The conformance run's pure parts: seeded generation, the comparison, the list of
documented deviations (each a heading of docs/artemis-compat.md), and the command's refusal
of bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.cli import main
from mqguard.conformance.compare import DEVIATIONS, compare
from mqguard.conformance.generator import MAX_SENDS, generate
from mqguard.conformance.model import Batch, Moved, Observation, Scenario, SendSpec, Settings
from mqguard.conformance.paths import ConformancePath
from mqguard.conformance.runner import run_scenarios

ROOT = Path(__file__).resolve().parents[2]


def test_generation_is_seeded_and_bounded() -> None:
    first, again, other = generate(15, 3), generate(15, 3), generate(15, 4)
    assert first == again
    assert first != other
    # --examples N runs N scenarios, all different (hypothesis repeats small ones).
    for count, seed_value in ((15, 3), (50, 1), (20, 123)):
        found = generate(count, seed_value)
        assert len(found) == count
        assert len({s.describe() for s in found}) == count
    for scenario in first:
        keys = [s.key for b in scenario.batches for s in b.sends]
        assert keys == list(range(1, len(keys) + 1)) and len(keys) <= MAX_SENDS
        for batch in scenario.batches:
            if batch.transaction != "none":
                ids = [s.duplicate_id for s in batch.sends if s.duplicate_id]
                assert len(ids) == len(set(ids))  # the same id twice: deviation b, not here
        assert all(1 <= len(actions) <= 3 for _, actions in scenario.plans)


def test_generation_covers_the_features() -> None:
    used = set().union(*(s.uses for s in generate(40, 0)))
    assert {"fail", "disconnect", "tx-commit", "tx-abort", "duplicate-id", "bridge-id",
            "ttl-short", "ttl-long"} <= used


SCENARIO = Scenario(Settings(max_delivery_attempts=2, dead_letter="address"),
                    (Batch((SendSpec(1), SendSpec(2, "a"))),), ((1, ("fail", "fail")),))


def _obs(deliveries: list[tuple[int, int]], dead: list[Moved] | None = None) -> Observation:
    return Observation(["ok"], deliveries, dead or [], [])


def test_compare_finds_counts_order_and_moved_headers() -> None:
    ref = _obs([(1, 1), (1, 2), (2, 1)], [Moved(1, "A", "A", True, False)])
    assert compare(SCENARIO, "artemis", ref, "A", "sidecar-rabbitmq", ref, "A") == []
    # The address names differ per path: only their relation to the path's own counts.
    renamed = _obs([(1, 1), (1, 2), (2, 1)], [Moved(1, "B", "B", True, False)])
    assert compare(SCENARIO, "artemis", ref, "A", "sidecar-rabbitmq", renamed, "B") == []

    other = _obs([(1, 1), (2, 1), (1, 2), (1, 3)], [Moved(1, "B", "X", False, False)])
    diffs = compare(SCENARIO, "artemis", ref, "A", "sidecar-rabbitmq", other, "B")
    assert {d.kind for d in diffs} == {"delivery-count", "dead-letters"}
    assert all(d.deviation is None for d in diffs)

    tail = _obs([(1, 1), (2, 1), (1, 2)], [Moved(1, "B", "B", True, False)])
    (diff,) = compare(SCENARIO, "artemis", ref, "A", "sidecar-activemq", tail, "B")
    assert diff.kind == "redelivery-position" and diff.deviation is not None
    (diff,) = compare(SCENARIO, "artemis", ref, "A", "sidecar-rabbitmq", tail, "B")
    assert diff.deviation is None  # RabbitMQ redelivers at the head, as Artemis does


def test_compare_finds_a_batch_a_path_never_ran() -> None:
    ref = _obs([(1, 1), (1, 2), (2, 1)])
    short = Observation([], [(1, 1), (1, 2), (2, 1)], [], [])
    (diff,) = compare(SCENARIO, "artemis", ref, "A", "wrapper-activemq", short, "B")
    assert diff.kind == "batch-outcome" and diff.deviation is None
    assert diff.detail == "batch 0 (none): artemis ok, wrapper-activemq not run"


def test_every_documented_deviation_is_a_heading_of_artemis_compat() -> None:
    text = (ROOT / "docs" / "artemis-compat.md").read_text()
    headings = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert DEVIATIONS
    for heading in DEVIATIONS:
        assert heading in headings, heading


@pytest.mark.parametrize(("args", "message"), [
    (["--examples", "0"], "0 is not in the range 1<=x<=10000"),
    (["--paths", "artemis,sidecar-kafka"], "unknown path(s) sidecar-kafka; choose from artemis"),
    (["--paths", ","], "unknown path(s) (none)"),
])
def test_cli_refuses_bad_input_before_starting_anything(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["conformance", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "starting" not in result.output


def test_a_scenario_only_one_path_ran_is_not_compared() -> None:
    # Pure logic: paths that return a fixed observation stand for the real ones.
    bridged = Scenario(Settings(), (Batch((SendSpec(1, bridge_id="x"),)),))
    plain = Scenario(Settings(), (Batch((SendSpec(1),)),))
    seen = _obs([(1, 1)])
    artemis = ConformancePath("artemis", lambda scenario, address: seen,
                              refuses_text_bridge_ids=True)
    sidecar = ConformancePath("sidecar-activemq", lambda scenario, address: seen)
    alone, both = run_scenarios([bridged, plain], [artemis, sidecar])
    assert not alone.compared and alone.reference == "sidecar-activemq"
    assert alone.skipped == {"artemis": "Artemis refuses a text _AMQ_BRIDGE_DUP over STOMP"}
    assert alone.to_json()["compared"] is False
    assert both.compared and both.differences == []
