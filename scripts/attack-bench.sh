#!/usr/bin/env bash
# Regenerates Benchmarks/ATTACKS.md: every attack of issue 13 (docs/limits.md), of issue 24 (patches, path
# subscriptions, restarts, large stores: 6a-11) and of issue 25 (what all peers share: metrics 12a-12b, journal reads
# and reloads 13a-13b, the outcome window 14a-14b, the journal's disk 15) against a release fluxd, each with a
# well-behaved client doing 100 settled round trips per second beside it (~12 minutes on 2 cores).
#
#   scripts/attack-bench.sh                 full run
#   scripts/attack-bench.sh --scale 0.2     smaller attacks (every count x0.2)
#   scripts/attack-bench.sh --only 1,4a     some attacks only (0 1 1b 2a 2b 3 4a 4b 4c 5a 5b 6a 6b 6c 7a 7b 8a 8b
#                                           9 10 11 12a 12b 13a 13b 14a 14b 15; 6-8 and 12-14 name their group)
#   scripts/attack-bench.sh --only 6,7,8,9,10,11 --out Benchmarks/ATTACKS-issue24.md   issue 24's attacks alone
#   FLUXD_BIN=/path/to/bin scripts/attack-bench.sh   use fluxd, flux-bench-store and todo-store from that folder
#
# Attack 15 puts fluxd's data folder on a 256 MiB ext4 file system of its own (a loop device: mkfs.ext4 and mount,
# unmounted at its end), so it needs root.
# Run as root, the attacks of issue 24 connect as other uids (4242, 4343, 4444) than the well-behaved client; as
# another user they all share its uid. They stop waiting for a fluxd that does not answer after --freeze-timeout
# (20 s), stop repeating patches after --attack-cap (150 s), give a restarted fluxd --restart-timeout (30 s), and
# kill a fluxd whose RSS passes --rss-cap-mib (4096).
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
