#!/usr/bin/env bash
# The test command: sets up a fresh machine, then lints, type-checks and runs the whole suite
# against real servers that the pytest fixtures start on free loopback ports.
# Extra arguments go to pytest (e.g. -k redis, -m "not rabbitmq").
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
python="${PYTHON:-python3}"
bash deploy/local/setup.sh
"$python" -m ruff check .
# Type checks: pyproject's [tool.mypy] names the packages and the modules checked strictly.
"$python" -m mypy
# The native crate: its unit tests and proptest properties (the codec's fuzzing that always
# runs, bounded), then its lints; 30-second fuzz runs of the STOMP decoder and of a session
# fed arbitrary bytes too where the nightly toolchain and cargo-fuzz are installed.
(cd native && cargo test --release --quiet && cargo clippy --all-targets --quiet -- -D warnings)
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    (cd native && cargo +nightly fuzz run decode -- -max_total_time=30 -rss_limit_mb=2048)
    (cd native && cargo +nightly fuzz run session -- -max_total_time=30 -rss_limit_mb=2048)
fi
status=0
"$python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi
exit "$status"
