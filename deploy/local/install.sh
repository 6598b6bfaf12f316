#!/usr/bin/env bash
# Usage: install.sh [KIND...]   # KIND: redis redis-cluster activemq rabbitmq mosquitto artemis (default: all)
# Installs the Debian packages (root), the ActiveMQ MQTT codec jars and Artemis (Maven, cached
# once under ~/.cache/mqguard/artemis), then the Debian packages of the tools the test suite
# runs (shellcheck). Idempotent: what is there is kept.
# The servers go through `python -m mqguard.servers install`, which works from a plain checkout
# because the repository root is put on PYTHONPATH. Override the interpreter with PYTHON=...
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${repo_root}${PYTHONPATH:+:${PYTHONPATH}}"
"${PYTHON:-python3}" -m mqguard.servers install "$@"

# Test tools: Debian package per command. The suite fails (under CI) or skips (locally)
# a test whose tool is missing, so a root install puts them all in place.
declare -A tools=([shellcheck]=shellcheck [mosquitto_pub]=mosquitto-clients [node]=nodejs [npm]=npm)
missing=()
for tool in "${!tools[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${tools[$tool]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install.sh: not root, so not installing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2
    else
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}" \
            || { apt-get -o DPkg::Lock::Timeout=600 update -q \
                 && apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}"; }
        echo "installed: ${missing[*]}"
    fi
fi

# The npm `mqtt` client of the MQTT sidecar tests, from its lock file (again only when the
# lock is newer than what is installed).
mqtt_node="${repo_root}/tests/support/mqtt-node"
if command -v npm >/dev/null 2>&1 \
        && { [ ! -f "${mqtt_node}/node_modules/.package-lock.json" ] \
             || [ "${mqtt_node}/package-lock.json" -nt "${mqtt_node}/node_modules/.package-lock.json" ]; }; then
    npm ci --prefix "$mqtt_node" --no-audit --no-fund --loglevel=error
fi
