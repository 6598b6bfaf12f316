"""Configuration shared by the whole suite.

The server fixtures (``mqguard_redis_url``, ``mqguard_activemq_server``, ...) come from the
plugin below, as in any project that tests against real servers with mqguard.
"""

from __future__ import annotations

import sys
from pathlib import Path

pytest_plugins = ["mqguard.testing.pytest_plugin", "mqguard.testing.artemis",
                  "mqguard.testing.spark_cluster"]

# `python -m pytest` puts the working directory first on sys.path. At the repository root
# that would make the source folders plugins/ and adapters/ importable as top-level
# `plugins` and `adapters` (and in tests/, tests/adapters would pass for `adapters`): a
# second copy of every module, with classes of its own. mqguard ships them as
# mqguard.plugins and mqguard.adapters, and pytest itself keeps the repository off sys.path
# (--import-mode=importlib), so drop such a folder if the interpreter put it there.
_ROOT = Path(__file__).resolve().parent.parent


def _shadows_the_package(entry: str) -> bool:
    path = Path(entry or ".").resolve()
    inside = path == _ROOT or _ROOT in path.parents
    return inside and any((path / name).is_dir() for name in ("plugins", "adapters"))


sys.path[:] = [entry for entry in sys.path if not _shadows_the_package(entry)]
