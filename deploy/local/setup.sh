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
# depends on it, and pip must find it installed rather than look for it on PyPI. It is
# built again only when its sources changed since this interpreter last installed them
# (a stamp holds their hash), so a second run installs nothing.
native="${repo_root}/native"
native_state="$(cd "$native" && find Cargo.toml Cargo.lock pyproject.toml mqguard_native.pyi src \
    -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1) \
$("$python" -c 'import sys; print(sys.executable)')"
native_stamp="${native}/target/.installed-sources"
if [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_state" ] \
        || ! "$python" -c 'import mqguard_native' 2>/dev/null; then
    "$python" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps "$native"
    mkdir -p "${native}/target"
    printf '%s' "$native_state" > "$native_stamp"
fi
"$python" -m pip install --disable-pip-version-check -q -e "${repo_root}[${extras}]"
bash "${repo_root}/deploy/local/install.sh"
bash "${repo_root}/deploy/local/node-setup.sh"
