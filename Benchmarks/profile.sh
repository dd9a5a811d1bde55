#!/usr/bin/env bash
# Profiles fluxd's hot path: callgrind instruction counts (repeatable on a noisy machine) and strace syscall
# counts per routed action, for workload 1 (round trip, 1 in flight) and workload 2 (8 clients x 64 in flight),
# and workload 1 with 10,000 idle connections. Writes Benchmarks/profile/*.txt; Benchmarks/PROFILE.md reads them.
#
#   Benchmarks/profile.sh /path/to/release/fluxd
set -eu
FLUXD=${1:?usage: profile.sh FLUXD}
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$HERE/profile"
mkdir -p "$OUT"
T=$(mktemp -d /tmp/fluxbus-prof-XXXXXX)
trap 'rm -rf "$T"' EXIT
gcc -O2 -o "$T/fluxbench" "$HERE/loadgen/fluxbench.c"
# valgrind 3.19 cannot read the DWARF 5 that Swift emits ("unhandled dwarf2 abbrev form"): profile a copy without
# debug info (the symbol table stays, so functions keep their names).
objcopy --strip-debug "$FLUXD" "$T/fluxd"
PLAIN_FLUXD=$FLUXD
FLUXD="$T/fluxd"
ulimit -n "$(ulimit -Hn)"

wait_line() { # file text
    for _ in $(seq 1 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "timeout waiting for $2 in $1" >&2; return 1
}

# profile NAME CLIENTS WINDOW COUNT IDLE
profile() {
    local name=$1 clients=$2 window=$3 count=$4 idle=$5 sock="$T/fluxd-$1.sock"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$T/cg.$name" \
        "$FLUXD" --socket "$sock" --ephemeral --log-level warning > "$T/fluxd.$name.out" 2> "$T/fluxd.$name.err" &
    local vpid=$! ipid=
    wait_line "$T/fluxd.$name.out" "fluxd ready"
    "$T/fluxbench" store --sys flux --addr "$sock" --topics "$clients" > "$T/store.$name.out" &
    local spid=$!
    wait_line "$T/store.$name.out" "store ready"
    if [ "$idle" -gt 0 ]; then
        # the idle connections are opened before collection starts: only the round trips are counted
        "$T/fluxbench" client --sys flux --addr "$sock" --idle "$idle" --hold > "$T/idle.$name.out" &
        ipid=$!
        wait_line "$T/idle.$name.out" "idle ready"
    fi
    # warm-up outside collection, then collect exactly COUNT rounds per client
    "$T/fluxbench" client --sys flux --addr "$sock" --clients "$clients" --window "$window" --count 200 --warmup 0 >/dev/null
    callgrind_control -i on "$vpid" > /dev/null
    "$T/fluxbench" client --sys flux --addr "$sock" --clients "$clients" --window "$window" --count "$count" \
        --warmup 0 --timeout 600 > "$OUT/$name.client.json" || true
    callgrind_control -i off "$vpid" > /dev/null
    kill "$spid"; wait "$spid" 2>/dev/null || true
    if [ -n "$ipid" ]; then kill "$ipid"; wait "$ipid" 2>/dev/null || true; fi
    kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
    callgrind_annotate --inclusive=no "$T/cg.$name" 2>/dev/null | head -70 > "$OUT/$name.self.txt"
    callgrind_annotate --inclusive=yes "$T/cg.$name" 2>/dev/null | head -90 > "$OUT/$name.inclusive.txt"
    echo "rounds $((clients * count))" > "$OUT/$name.rounds.txt"
}

# syscalls: strace -c over a plain (not valgrind) fluxd for COUNT rounds
syscalls() {
    local name=$1 clients=$2 window=$3 count=$4 sock="$T/fluxd-s$1.sock"
    "$FLUXD" --socket "$sock" --ephemeral --log-level warning > "$T/fluxd.s$name.out" 2>&1 &
    local fpid=$!
    wait_line "$T/fluxd.s$name.out" "fluxd ready"
    "$T/fluxbench" store --sys flux --addr "$sock" --topics "$clients" > "$T/store.s$name.out" &
    local spid=$!
    wait_line "$T/store.s$name.out" "store ready"
    strace -c -f -p "$fpid" -o "$OUT/$name.strace.txt" &
    local tpid=$!
    sleep 1
    "$T/fluxbench" client --sys flux --addr "$sock" --clients "$clients" --window "$window" --count "$count" \
        --warmup 0 > /dev/null
    kill -INT "$tpid"; wait "$tpid" 2>/dev/null || true
    kill "$spid" "$fpid"; wait "$spid" "$fpid" 2>/dev/null || true
    echo "rounds $((clients * count))" >> "$OUT/$name.strace.txt"
}

profile w1 1 1 3000 0
profile w2 8 64 1000 0
profile w1idle 1 1 1000 10000
syscalls w1 1 1 20000
syscalls w2 8 64 20000
echo "profile written to $OUT" >&2
