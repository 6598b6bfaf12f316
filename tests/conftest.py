"""Configuration shared by the whole suite.

The server fixtures (``mqguard_redis_url``, ``mqguard_activemq_server``, ...) come from the
plugin below, as in any project that tests against real servers with mqguard.
"""

from __future__ import annotations

import sys
from pathlib import Path

pytest_plugins = ["mqguard.testing.pytest_plugin"]

# `python -m pytest` puts the working directory first on sys.path. At the repository root
# that would make the source folders plugins/ and adapters/ importable as top-level
# `plugins` and `adapters`: a second copy of every module, with classes of its own. They
# are mqguard.plugins and mqguard.adapters; pytest itself keeps the root off sys.path
# (--import-mode=importlib), so drop what the interpreter put there.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _ROOT]
