#!/usr/bin/env bash
# Regenerates Benchmarks/RESULTS.md: every workload of issue 6 against fluxd, the bare Unix-socket relay (the
# floor) and the peer brokers (Redis, Mosquitto, NATS, D-Bus), the large-state workload of issue 16 (8), the
# durability workload of issue 15 (9) and the durable default against the dispatcher before durability (10, issue
# 27), in one run (~25-40 minutes on 2 cores, ~5-10 of them workload 8, 2-6 workload 9, 3-6 workload 10).
#
#   scripts/bench.sh                 full run
#   scripts/bench.sh --scale 0.1     quick run (every count x0.1)
#   scripts/bench.sh --only 1,2      some workloads only (their sections of RESULTS.md replaced, the rest kept)
#   scripts/bench.sh --only 8        large states (issue 16): 10,000 todos, one toggled per action, 10 subscribers,
#                                    Swift/Python/Node, whole states vs deltas (results-large-state.json)
#   scripts/bench.sh --only 9        durability (issue 15): fluxd ephemeral/none/batch/always beside Redis with an
#                                    AOF (everysec/always), the disk's fdatasync latency, restart with 1M actions
#   scripts/bench.sh --only 10       the durable default (issue 27): fluxd built from bb8fa48 (before durability and
#                                    hardening), fluxd --ephemeral / none / batch / always, Redis pub/sub and NATS in
#                                    workloads 1 and 2 (throughput, fluxd CPU, p99), callgrind Ir per round trip
#                                    (Benchmarks/callgrind-ab.sh), the longest loop hold over 1M actions
#                                    (results-durable-speed.json)
#   FLUXD=/path/to/fluxd scripts/bench.sh   use that fluxd instead of building one
#   BASE_FLUXD=/path/to/fluxd scripts/bench.sh --only 10   workload 10's "before" fluxd instead of building bb8fa48
#
# Installs the peers (and valgrind, for workload 10's callgrind figures) from Debian packages when missing (needs
# root and apt-get), builds a release fluxd, the Swift SDK benchmark store (flux-bench-store, workload 7) and the
# large-state roles (flux-large-state-bench, workload 8) with their own scratch folder (.build-bench), raises the
# open-file limit for workload 5. Workload 8 also needs node (else it runs without Node). Workload 10 builds a
# release fluxd from commit bb8fa48 once (git archive into .build-bench-base/src, scratch .build-bench-base/build;
# reused while its binary exists). Every swift build runs under flock(1) on $FLUXBUS_BUILD_LOCK (default
# /tmp/fluxbus-swift-build.lock): no two Swift builds at once. Never run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || need+=(mosquitto)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null || need+=(nats-server)
command -v dbus-daemon >/dev/null || need+=(dbus-daemon)
pkg-config --exists dbus-1 2>/dev/null || need+=(libdbus-1-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v valgrind >/dev/null || need+=(valgrind)
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

# Does this run include workload 10 (no --only, or an --only listing 10)?
only=""
prev=""
for arg in "$@"; do
    [ "$prev" = "--only" ] && only=$arg
    case $arg in --only=*) only=${arg#--only=} ;; esac
    prev=$arg
done
want10=0
if [ -z "$only" ] || [[ ",$only," == *",10,"* ]]; then want10=1; fi

# Every swift command under flock(1) on $FLUXBUS_BUILD_LOCK, else on /tmp/fluxbus-swift-build.lock (ensure-deps.sh's
# swift_locked locks only when FLUXBUS_BUILD_LOCK is set).
BUILD_LOCK=${FLUXBUS_BUILD_LOCK:-/tmp/fluxbus-swift-build.lock}
bench_swift() { flock "$BUILD_LOCK" swift "$@"; }
deps_checked=0
ensure_deps() {  # libuv1-dev and libjemalloc-dev, which a fluxd build needs (and swift on PATH)
    [ $deps_checked = 1 ] || source scripts/ensure-deps.sh >&2
    deps_checked=1
}

SDK_STORE_ARGS=()
if [ -z "${FLUXD:-}" ]; then
    ensure_deps
    bench_swift build -c release --scratch-path .build-bench --product fluxd >&2
    bench_swift build -c release --scratch-path .build-bench --product flux-bench-store >&2
    bench_swift build -c release --scratch-path .build-bench --product flux-large-state-bench >&2
    BIN="$(bench_swift build -c release --scratch-path .build-bench --show-bin-path)"
    FLUXD="$BIN/fluxd"
    SDK_STORE_ARGS=(--sdk-store "$BIN/flux-bench-store" --large-bench "$BIN/flux-large-state-bench")
fi

# Workload 10's "before": a release fluxd from commit bb8fa48, built from `git archive` (not a worktree) with its
# own scratch folder, once; Package.resolved (git-ignored) is copied from this tree when there is one, so the
# dependencies resolve to the versions already fetched (no network needed when they are in SwiftPM's cache).
BASE_COMMIT=bb8fa48
BASE_ARGS_RUN=()
if [ $want10 = 1 ]; then
    if [ -z "${BASE_FLUXD:-}" ]; then
        BASE_FLUXD=.build-bench-base/build/release/fluxd
        if [ ! -x "$BASE_FLUXD" ]; then
            ensure_deps
            src=.build-bench-base/src/$BASE_COMMIT
            echo "bench: building fluxd from $BASE_COMMIT in $src (workload 10)" >&2
            rm -rf "$src"
            mkdir -p "$src"
            git archive "$BASE_COMMIT" | tar -x -C "$src"
            [ -f Package.resolved ] && cp Package.resolved "$src/"
            bench_swift build -c release --product fluxd --package-path "$src" \
                --scratch-path .build-bench-base/build >&2
        fi
    fi
    BASE_ARGS_RUN=(--base-fluxd "$BASE_FLUXD")
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec python3 Benchmarks/run.py --fluxd "$FLUXD" "${SDK_STORE_ARGS[@]}" "${BASE_ARGS_RUN[@]}" --command "scripts/bench.sh $*" "$@"
