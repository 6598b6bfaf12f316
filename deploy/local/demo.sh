#!/usr/bin/env bash
# The main job on embedded defaults: sets up a fresh machine, then runs a guarded
# round trip (MemoryStore) through a local ActiveMQ that it starts and stops.
# Extra arguments go to `mqguard demo` (e.g. --broker rabbitmq, -n 10000).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
MQGUARD_EXTRAS="${MQGUARD_EXTRAS:-test}" bash deploy/local/setup.sh
exec "${PYTHON:-python3}" -m mqguard.cli demo "$@"
