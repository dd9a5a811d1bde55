#!/usr/bin/env bash
# Callgrind of fluxd on workload 8 (large states, issue 16): fluxd's instructions per action, whole states (before
# SPEC §16) and deltas (after), one release fluxd, one run. Callgrind counts instructions, not time: the figures do
# not move with the machine's load (the wake-ups and kernel time that wall-clock CPU figures include are not
# instructions of fluxd's and are not counted).
#
#   Benchmarks/large-state-callgrind.sh FLUXD [ACTIONS_DELTAS] [ACTIONS_FULL] [WINDOW]
#
# Per mode: fluxd under callgrind (--instr-atstart=no), the Swift store `flux-large-state-bench store` (next to
# FLUXD, or $LARGE_BENCH) with TODOS (default 10,000) todos, SUBS (default 10) subscribers (`client`; `--full` in
# both for whole states), a driver (the Python library) that toggles 5 todos as warm-up, then
# `callgrind_control -i on`, ACTIONS toggles (default 300 deltas, 20 whole states) with WINDOW in flight (default
# 1: each settled before the next), waits for every subscriber to hold the last state, `callgrind_control -i off`.
# Prints Ir per action per mode.
set -euo pipefail
FLUXD=${1:?usage: large-state-callgrind.sh FLUXD [ACTIONS_DELTAS] [ACTIONS_FULL] [WINDOW]}
N_DELTAS=${2:-300}
N_FULL=${3:-20}
WINDOW=${4:-1}
TODOS=${TODOS:-10000}
SUBS=${SUBS:-10}
WARM=5
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
BENCH=${LARGE_BENCH:-$(dirname "$FLUXD")/flux-large-state-bench}
[ -x "$BENCH" ] || { echo "no $BENCH (set LARGE_BENCH)" >&2; exit 2; }
T=$(mktemp -d /tmp/fluxbus-cg8-XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] && cp "$T"/cg.* "$KEEP"/ 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
# valgrind 3.19 cannot read Swift's DWARF 5: profile a copy without debug info.
objcopy --strip-debug "$FLUXD" "$T/fluxd"

wait_line() { # file text [tenths]
    for _ in $(seq 1 "${3:-1200}"); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "timeout waiting for $2 in $1" >&2; return 1
}

# measure MODE ACTIONS: prints Ir per action
measure() {
    local mode=$1 n=$2 full=()
    [ "$mode" = full ] && full=(--full)
    local sock="$T/$mode.sock" total=$((WARM + n))
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$T/cg.$mode" \
        "$T/fluxd" --socket "$sock" --ephemeral --max-frame 16777216 --log-level warning \
        > "$T/$mode.fluxd.out" 2> "$T/$mode.fluxd.err" &
    local vpid=$!
    PIDS+=("$vpid")
    wait_line "$T/$mode.fluxd.out" "fluxd ready"
    # The Swift store reports and exits when its standard input ends: keep it open on a fifo until the end.
    mkfifo "$T/$mode.stdin"
    "$BENCH" store --socket "$sock" --todos "$TODOS" "${full[@]}" < "$T/$mode.stdin" > "$T/$mode.store" &
    local spid=$!
    PIDS+=("$spid")
    exec 9> "$T/$mode.stdin"
    wait_line "$T/$mode.store" '"ready"'
    local cpids=()
    for i in $(seq 1 "$SUBS"); do
        "$BENCH" client --socket "$sock" --todos "$TODOS" --actions "$total" "${full[@]}" > "$T/$mode.client$i" &
        cpids+=($!)
        PIDS+=($!)
    done
    for i in $(seq 1 "$SUBS"); do wait_line "$T/$mode.client$i" '"ready"'; done
    PYTHONPATH="$ROOT/examples/python" python3 - "$sock" "$WARM" "$n" "$WINDOW" "$vpid" <<'EOF'
import asyncio, subprocess, sys
from fluxbus import AsyncClient
sock, warm, n, window, vpid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

async def main():
    c = await AsyncClient.connect(sock, name="cg-driver", timeout=600, reconnect=False)
    for i in range(warm):
        await c.dispatch_and_settle("todo/toggle", {"id": i + 1})
    subprocess.run(["callgrind_control", "-i", "on", vpid], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    nxt = warm
    async def lane():
        nonlocal nxt
        while nxt < warm + n:
            k = nxt
            nxt += 1
            st = await c.dispatch_and_settle("todo/toggle", {"id": k + 1})
            assert all(r.status == "done" for r in st.results), st
    await asyncio.gather(*(lane() for _ in range(window)))
    await c.close()
asyncio.run(main())
EOF
    # every subscriber exits once it holds the last action's state
    for p in "${cpids[@]}"; do wait "$p"; done
    callgrind_control -i off "$vpid" > /dev/null
    exec 9>&-
    wait "$spid" || true
    kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
    PIDS=()
    local ir
    ir=$(callgrind_annotate "$T/cg.$mode" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    echo $(( ir / n ))
}

deltas=$(measure deltas "$N_DELTAS")
full=$(measure full "$N_FULL")
echo "fluxd Ir per action ($TODOS todos, $SUBS subscribers, window $WINDOW): whole states $full ($N_FULL actions)," \
     "deltas $deltas ($N_DELTAS actions), whole/deltas $(python3 -c "print(f'{$full/$deltas:.1f}')")"
# The same as one JSON line (report.py renders a list of these under the results document's "callgrind" key).
echo "{\"todos\": $TODOS, \"subscribers\": $SUBS, \"window\": $WINDOW, \"full_ir_per_action\": $full," \
     "\"full_actions\": $N_FULL, \"deltas_ir_per_action\": $deltas, \"deltas_actions\": $N_DELTAS}"
