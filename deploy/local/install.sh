#!/usr/bin/env bash
# Usage: install.sh [KIND...]   # KIND: redis redis-cluster activemq rabbitmq mosquitto (default: all)
# Installs the Debian packages (root) and the ActiveMQ MQTT codec jars.
# Thin wrapper over `python -m mqguard.servers install`; works from a plain checkout because the
# repository root is put on PYTHONPATH. Override the interpreter with PYTHON=...
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${repo_root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m mqguard.servers install "$@"
