#!/usr/bin/env bash
# Callgrind A/B of fluxd's hot path: instructions per round trip of two release fluxd binaries, measured in one
# run on the same workloads (workload 2: 1 client x 64 in flight, pipelined; workload 1: 1 in flight).
# Callgrind counts instructions, not time, so the figures repeat whatever else the machine is doing.
#
#   Benchmarks/callgrind-ab.sh BASE_FLUXD NEW_FLUXD [ROUNDS] [-- NEW_FLUXD_EXTRA_ARGS...]
#
# NEW_FLUXD runs --ephemeral unless extra arguments are given (e.g. -- --data-dir DATA --durability batch: DATA is
# made under the run's temp folder when it is the word DATA); BASE_ARGS (environment) are the base's arguments
# (none by default: a fluxd older than 0.3 has no --ephemeral).
# Prints one line per (binary, workload): Ir per round trip, and the ratio NEW/BASE.
# A fluxd that has --turn-micros runs with turns unbounded by time (--turn-micros 1000000000): under callgrind it
# runs ~50x slower, so 250 µs turns would cut reads that are never cut at native speed and the counts would
# measure the cutting.
set -euo pipefail
BASE=${1:?usage: callgrind-ab.sh BASE_FLUXD NEW_FLUXD [ROUNDS]}
NEW=${2:?usage: callgrind-ab.sh BASE_FLUXD NEW_FLUXD [ROUNDS]}
ROUNDS=${3:-20000}
shift $(( $# >= 3 ? 3 : $# ))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
[ ${#EXTRA[@]} -eq 0 ] && EXTRA=(--ephemeral)
read -r -a BASE_EXTRA <<< "${BASE_ARGS:-}"
HERE="$(cd "$(dirname "$0")" && pwd)"
T=$(mktemp -d /tmp/fluxbus-cgab-XXXXXX)
trap '[ -n "${KEEP:-}" ] && cp "$T"/cg.* "$KEEP"/ ; rm -rf "$T"' EXIT
gcc -O2 -o "$T/fluxbench" "$HERE/loadgen/fluxbench.c"
# valgrind 3.19 cannot read Swift's DWARF 5: profile copies without debug info.
objcopy --strip-debug "$BASE" "$T/fluxd-base"
objcopy --strip-debug "$NEW" "$T/fluxd-new"

wait_line() { # file text
    for _ in $(seq 1 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "timeout waiting for $2 in $1" >&2; return 1
}

# measure LABEL FLUXD WINDOW [ARGS...]: prints Ir per round trip
measure() {
    local label=$1 fluxd=$2 window=$3; shift 3
    local sock="$T/$label.sock"
    local turns=()
    if "$fluxd" --help > "$T/$label.help" 2>&1 && grep -q -- --turn-micros "$T/$label.help"; then
        turns=(--turn-micros 1000000000)
    fi
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$T/cg.$label" \
        "$fluxd" --socket "$sock" --log-level warning "${turns[@]}" "${@//DATA/$T/data-$label}" > "$T/$label.out" 2> "$T/$label.err" &
    local vpid=$!
    wait_line "$T/$label.out" "fluxd ready"
    "$T/fluxbench" store --sys flux --addr "$sock" --topics 1 > "$T/$label.store" &
    local spid=$!
    wait_line "$T/$label.store" "store ready"
    "$T/fluxbench" client --sys flux --addr "$sock" --clients 1 --window "$window" --count 500 --warmup 0 > /dev/null
    callgrind_control -i on "$vpid" > /dev/null
    "$T/fluxbench" client --sys flux --addr "$sock" --clients 1 --window "$window" --count "$ROUNDS" --warmup 0 \
        --timeout 600 > /dev/null
    callgrind_control -i off "$vpid" > /dev/null
    kill "$spid"; wait "$spid" 2>/dev/null || true
    kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
    local total
    total=$(callgrind_annotate "$T/cg.$label" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    echo $(( total / ROUNDS ))
}

for w in 64 1; do
    base=$(measure "base-w$w" "$T/fluxd-base" "$w" "${BASE_EXTRA[@]}")
    new=$(measure "new-w$w" "$T/fluxd-new" "$w" "${EXTRA[@]}")
    ratio=$(python3 -c "print(f'{$new/$base:.4f}')")
    echo "window $w: base $base Ir/round trip, new $new Ir/round trip, new/base $ratio"
done
