"""descriptor_budget: it raises the soft limit on open files and counts the sessions the
limit leaves room for (each session holds FDS_PER_SESSION descriptors)."""

from __future__ import annotations

import resource

from mqguard.sidecar.fdlimit import FDS_PER_SESSION, RESERVED_FDS, descriptor_budget


def test_descriptor_budget_raises_the_soft_limit_and_counts_sessions() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    if hard != resource.RLIM_INFINITY:
        assert hard > low, "this test needs a hard limit above 256"
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        budget = descriptor_budget(100_000)
        assert budget.raised_from == low
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == budget.soft > low
        assert budget.soft is not None
        room = (budget.soft - budget.in_use - RESERVED_FDS) // FDS_PER_SESSION
        assert budget.max_sessions == min(100_000, room)
        assert budget.shortfall(100_000) == (room < 100_000)
        assert descriptor_budget(10).max_sessions == 10
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
