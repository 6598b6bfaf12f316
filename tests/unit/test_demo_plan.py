"""The demo's message mix: seeded, in the ratios asked for, disjoint kinds."""

from __future__ import annotations

from collections import Counter

import pytest

from mqguard.demo.plan import DemoPlan, Kind, expected_fates


def test_ratios_and_fates() -> None:
    planned = DemoPlan(1000).messages_for("orders")
    kinds = Counter(p.kind for p in planned)
    assert kinds == {Kind.NORMAL: 900, Kind.POISON: 50, Kind.SHORT_LIVED: 50}
    assert sum(p.resent for p in planned) == 100
    assert len({p.duplicate_id for p in planned}) == 1000
    assert expected_fates(planned) == {"handled": 900, "dead_lettered": 50, "expired": 50,
                                       "duplicate_rejected": 100}


def test_seeded_per_address() -> None:
    plan = DemoPlan(200)
    assert plan.messages_for("a") == plan.messages_for("a")
    assert plan.messages_for("a") != plan.messages_for("b")
    assert DemoPlan(200, seed=1).messages_for("a") != plan.messages_for("a")


@pytest.mark.parametrize("kwargs", [{"messages": 0}, {"messages": 10, "poison_ratio": 1.5},
                                    {"messages": 10, "poison_ratio": 0.6,
                                     "short_lived_ratio": 0.6}])
def test_bad_plans_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DemoPlan(**kwargs)
