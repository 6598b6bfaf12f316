#!/usr/bin/env bash
# The main job on embedded defaults: sets up a fresh machine, then runs `mqguard demo`
# (local Redis + ActiveMQ + Mosquitto started and stopped by it, the STOMP and MQTT sidecars,
# guarded traffic with duplicates, poison and short-lived messages, one failover, MQTT
# sessions dropped on poison, then the Spark audit).
# Extra arguments go to `mqguard demo` (e.g. --broker rabbitmq, -n 2000, --out DIR).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
MQGUARD_EXTRAS="${MQGUARD_EXTRAS:-test,spark}" bash deploy/local/setup.sh
exec "${PYTHON:-python3}" -m mqguard.cli demo "$@"
