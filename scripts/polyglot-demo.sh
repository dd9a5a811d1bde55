#!/usr/bin/env bash
# One bus, four languages' worth of peers: fluxd with the Swift todo and stats stores, a Python store ("audit")
# and a Node store ("activity"); a Node client dispatches, a Python client watches the todos snapshots, and the
# Swift todo-view renders the same state. Prints what each saw and checks they agree (exit 1 if not).
#
#   scripts/polyglot-demo.sh                 # builds what it needs (swift build), then runs
#   FLUXBUS_BIN=.build/debug scripts/polyglot-demo.sh    # use already built executables
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${FLUXBUS_BIN:-}" ]; then
    for product in fluxd todo-store stats-store todo-view; do swift build --product "$product" >/dev/null; done
    FLUXBUS_BIN=$(swift build --show-bin-path)
fi
bin=$(cd "$FLUXBUS_BIN" && pwd)
work=$(mktemp -d /tmp/fluxpoly-XXXXXX)
export FLUXBUS_SOCKET=$work/fluxd.sock
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# start NAME READY-TEXT COMMAND...: runs COMMAND in the background, logging to $work/NAME.log, and waits
# (at most 30 s) until the log contains READY-TEXT.
start() {
    local name=$1 ready=$2; shift 2
    "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do
        grep -q "$ready" "$work/$name.log" 2>/dev/null && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "polyglot-demo: $name did not start:" >&2; cat "$work/$name.log" >&2; return 1
}

start fluxd "ready" "$bin/fluxd" --socket "$FLUXBUS_SOCKET" --data-dir "$work/data"
start todo-store "todo-store ready" "$bin/todo-store"
start stats-store "stats-store ready" "$bin/stats-store"
start audit-store "audit-store ready" python3 examples/python/demo/audit_store.py
start activity-store "activity-store ready" node examples/node/demo/activity-store.mjs
start python-watch "python-watch ready" python3 examples/python/demo/watch.py --count 3
echo "== bus up: fluxd + todo-store, stats-store (Swift) + audit (Python) + activity (Node); python-watch subscribed"

echo "== Node client dispatches"
node examples/node/demo/dispatch.mjs "buy milk" "write docs" "ship it"

echo "== Python client saw"
wait "${pids[-1]}"
grep '^python' "$work/python-watch.log"

echo "== Swift client (todo-view --once) sees"
"$bin/todo-view" --once | tee "$work/swift-view.txt"

echo "== each language's store state"
python3 - "$FLUXBUS_SOCKET" <<'PY'
import json, sys
sys.path.insert(0, "examples/python")
from fluxbus import Client
with Client.connect(sys.argv[1], name="py-check") as c:
    for store in ("todos", "stats", "audit", "activity"):
        snap = c.get(store)
        print(f"{store} v{snap.version}: {json.dumps(snap.state, sort_keys=True)}")
PY

final=$(grep '^python final ' "$work/python-watch.log" | sed 's/^python final //')
status=0
for title in "buy milk" "write docs" "ship it"; do
    grep -q "$title" "$work/swift-view.txt" || { echo "FAIL: the Swift view does not show \"$title\"" >&2; status=1; }
    echo "$final" | grep -q "$title" || { echo "FAIL: the Python client did not see \"$title\"" >&2; status=1; }
done
[ "$status" = 0 ] && echo "polyglot-demo: OK: Node dispatched, Python and Swift clients saw the same todos"
exit $status
