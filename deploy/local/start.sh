#!/usr/bin/env bash
# Usage: start.sh KIND [--state-dir DIR] [--appendonly] [--port N]
# Starts KIND on free 127.0.0.1 ports, detached; prints the handle JSON (urls, pid, state_dir, log_path).
# Thin wrapper over `python -m mqguard.servers start`; works from a plain checkout because the
# repository root is put on PYTHONPATH. Override the interpreter with PYTHON=...
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${repo_root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m mqguard.servers start "$@"
