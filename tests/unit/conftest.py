from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqguard.config import parse_config
from mqguard.pipeline import Guard
from mqguard.testing.loopback import LoopbackAdapter


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[Guard]:
    config = parse_config({"mqguard": {"event-log": {"directory": str(tmp_path / "events")}},
                           "address-settings": {"moved.#": {"dead-letter-address": "DLA"}}})
    with Guard(config) as g:
        yield g


@pytest.fixture
def adapter() -> LoopbackAdapter:
    return LoopbackAdapter()
