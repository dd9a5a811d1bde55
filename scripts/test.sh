#!/usr/bin/env bash
# Runs every FluxBus test on this machine, installing what is missing first:
#   1. a clean `swift build` that must have no warnings in FluxBus's own sources;
#   2. `swift test`: unit tests of the core and router, SDK tests, and integration tests that start the real
#      fluxd and real store/client processes on temporary sockets;
#   3. the protocol checks: every JSON Schema and every example message in protocol/vectors.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

echo "==> swift build"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
swift build --build-tests >"$log" 2>&1 || status=$?
grep -vE '^\[[0-9]+/[0-9]+\]' "$log" || true
if [ "$status" != 0 ]; then echo "build failed" >&2; exit 1; fi
own_warnings=$(grep -E '^/.*: warning:' "$log" | grep -v '/.build' | sort -u || true)
if [ -n "$own_warnings" ]; then
    echo "FluxBus's own sources have warnings:" >&2
    echo "$own_warnings" >&2
    exit 1
fi

echo "==> swift test"
timeout 1200 swift test --skip-build   # a hung test fails the run instead of stalling CI

echo "==> protocol schemas and message vectors"
python3 protocol/tools/check_schemas.py
