#!/usr/bin/env bash
# Prepares the Node.js STOMP client of the test suite (tests/node, see roundtrip.js there):
# installs Debian's nodejs/npm when `node` or `npm` is missing, then `npm ci` from
# tests/node/package-lock.json when tests/node/node_modules is missing or older than the lock.
# Idempotent and quiet on success: a second run installs nothing and prints nothing.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
node_dir="${repo_root}/tests/node"

quietly() {
    # Runs "$@" with its output kept aside; shows it only if the command fails.
    local log status=0
    log="$(mktemp)"
    "$@" >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        echo "node-setup: failed ($status): $*" >&2
        cat "$log" >&2
    fi
    rm -f "$log"
    return "$status"
}

missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    # `apt-get update` only when the package lists do not know the packages yet.
    if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
        quietly "${sudo[@]}" apt-get update -q
    fi
    quietly "${sudo[@]}" apt-get install -y -q "${missing[@]}"
fi

lock="${node_dir}/package-lock.json"
stamp="${node_dir}/node_modules/.package-lock.json"  # written by npm on every install
if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
    quietly npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error
fi
