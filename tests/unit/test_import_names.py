"""The tests import plugins and adapters as the distribution names them: the source folders
plugins/ and adapters/ are not top-level packages, so no module of theirs is loaded twice."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import mqguard.plugins.duplicate_detection
from mqguard.config import parse_config
from mqguard.pipeline import Guard


@pytest.mark.parametrize("name", ["plugins", "adapters", "plugins.duplicate_detection",
                                  "adapters.stomp"])
def test_source_folders_are_not_importable_by_their_own_names(name: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_the_repository_root_is_not_on_sys_path() -> None:
    root = Path(__file__).resolve().parents[2]
    assert root not in {Path(entry or ".").resolve() for entry in sys.path}


def test_one_module_object_per_plugin(tmp_path: Path) -> None:
    module = mqguard.plugins.duplicate_detection
    source = Path(module.__file__).resolve()
    loaded = sorted(name for name, other in list(sys.modules.items())
                    if getattr(other, "__file__", None)
                    and Path(other.__file__).resolve() == source)
    assert loaded == ["mqguard.plugins.duplicate_detection"]
    config = parse_config({"mqguard": {"event-log": {"directory": str(tmp_path / "events")}}})
    with Guard(config) as guard:
        plugin = guard.plugins.get_plugin("duplicate_detection")
    assert sys.modules[type(plugin).__module__] is module
