#!/usr/bin/env bash
# Regenerates Benchmarks/ATTACKS.md: every attack of issue 13 (docs/limits.md) against a release fluxd, each with
# a well-behaved client doing 100 settled round trips per second beside it (~5 minutes on 2 cores).
#
#   scripts/attack-bench.sh                 full run
#   scripts/attack-bench.sh --scale 0.2     smaller attacks (every count x0.2)
#   scripts/attack-bench.sh --only 1,4a     some attacks only (1 2a 2b 3 4a 4b 4c 5a 5b)
#   FLUXD_BIN=/path/to/bin scripts/attack-bench.sh   use fluxd, flux-bench-store and todo-store from that folder
#
# Builds fluxd, flux-bench-store and todo-store in release with their own scratch folder (.build-bench, shared
# with scripts/bench.sh; builds are serialized with a lock, since the machine may be shared), raises the open-file
# limit (attack 4c opens 3,000 connections). Loopback only: every fluxd runs on a socket in a temporary folder and
# is stopped by its pid. Never run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=/tmp/fluxbus-swift-build.lock
if [ -z "${FLUXD_BIN:-}" ]; then
    source scripts/ensure-deps.sh  # libuv1-dev and libjemalloc-dev, which the fluxd build needs
    for product in fluxd flux-bench-store todo-store; do
        flock "$LOCK" swift build -c release --scratch-path .build-bench --product "$product" >&2
    done
    FLUXD_BIN="$(flock "$LOCK" swift build -c release --scratch-path .build-bench --show-bin-path)"
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec python3 Benchmarks/attack.py --fluxd "$FLUXD_BIN/fluxd" --bench-store "$FLUXD_BIN/flux-bench-store" \
    --todo-store "$FLUXD_BIN/todo-store" --command "scripts/attack-bench.sh $*" "$@"
