#!/usr/bin/env bash
# Regenerates Benchmarks/RESULTS.md: every workload of issue 6 against fluxd, the bare Unix-socket relay (the
# floor) and the peer brokers (Redis, Mosquitto, NATS, D-Bus), the large-state workload of issue 16 (8) and the
# durability workload of issue 15 (9), in one run (~20-30 minutes on 2 cores, ~5-10 of them workload 8, 2-6
# workload 9).
#
#   scripts/bench.sh                 full run
#   scripts/bench.sh --scale 0.1     quick run (every count x0.1)
#   scripts/bench.sh --only 1,2      some workloads only (their sections of RESULTS.md replaced, the rest kept)
#   scripts/bench.sh --only 8        large states (issue 16): 10,000 todos, one toggled per action, 10 subscribers,
#                                    Swift/Python/Node, whole states vs deltas (results-large-state.json)
#   scripts/bench.sh --only 9        durability (issue 15): fluxd ephemeral/none/batch/always beside Redis with an
#                                    AOF (everysec/always), the disk's fdatasync latency, restart with 1M actions
#   FLUXD=/path/to/fluxd scripts/bench.sh   use that fluxd instead of building one
#
# Installs the peers from Debian packages when missing (needs root and apt-get), builds a release fluxd, the
# Swift SDK benchmark store (flux-bench-store, workload 7) and the large-state roles (flux-large-state-bench,
# workload 8) with their own scratch folder (.build-bench), raises the open-file limit for workload 5. Workload 8
# also needs node (else it runs without Node). Never run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || need+=(mosquitto)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null || need+=(nats-server)
command -v dbus-daemon >/dev/null || need+=(dbus-daemon)
pkg-config --exists dbus-1 2>/dev/null || need+=(libdbus-1-dev)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bench: installing ${need[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
    else
        echo "bench: missing ${need[*]}; those baselines are skipped" >&2
    fi
fi
# Debian starts the services it installs where systemd runs; the benchmark runs its own on private sockets only.

SDK_STORE_ARGS=()
if [ -z "${FLUXD:-}" ]; then
    source scripts/ensure-deps.sh  # libuv1-dev and libjemalloc-dev, which the fluxd build needs
    swift build -c release --scratch-path .build-bench --product fluxd >&2
    swift build -c release --scratch-path .build-bench --product flux-bench-store >&2
    swift build -c release --scratch-path .build-bench --product flux-large-state-bench >&2
    FLUXD="$(swift build -c release --scratch-path .build-bench --show-bin-path)/fluxd"
    BIN="$(swift build -c release --scratch-path .build-bench --show-bin-path)"
    SDK_STORE_ARGS=(--sdk-store "$BIN/flux-bench-store" --large-bench "$BIN/flux-large-state-bench")
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec python3 Benchmarks/run.py --fluxd "$FLUXD" "${SDK_STORE_ARGS[@]}" --command "scripts/bench.sh $*" "$@"
