#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine for mqguard: the Python package with its
# test extras (editable, from this checkout) and the servers' Debian packages
# (Redis, ActiveMQ 5.17 with its MQTT codec jars, RabbitMQ 3.10, Mosquitto 2.0), and
# Artemis 2.40 from Maven Central.
# Idempotent: a second run installs nothing. Override the interpreter with PYTHON=...
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"
extras="${MQGUARD_EXTRAS:-test,spark}"
# The native data plane (native/: Rust, built by maturin with cargo) first: mqguard
# depends on it, and pip must find it installed rather than look for it on PyPI.
"$python" -m pip install --disable-pip-version-check -q "${repo_root}/native"
"$python" -m pip install --disable-pip-version-check -q -e "${repo_root}[${extras}]"
bash "${repo_root}/deploy/local/install.sh"
bash "${repo_root}/deploy/local/node-setup.sh"
