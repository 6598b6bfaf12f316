#!/usr/bin/env bash
# Usage: stop.sh --state-dir DIR [--state-dir DIR...]
# Stops the server(s) recorded in DIR/handle.json (only the processes that start.sh started).
# Thin wrapper over `python -m mqguard.servers stop`; works from a plain checkout because the
# repository root is put on PYTHONPATH. Override the interpreter with PYTHON=...
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${repo_root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m mqguard.servers stop "$@"
