#!/usr/bin/env bash
# Runs the FluxBus todo demo: builds, starts `fluxd --config examples/fluxd.toml` on its default socket (fluxd starts
# and supervises the todo, stats and comments stores), waits until every worker runs, then runs todo-view in the
# foreground (interactive). fluxd (and with it every worker) is stopped when the demo exits or on Ctrl-C.
#
#   scripts/demo.sh           interactive: type add TEXT, toggle ID, edit ID TEXT, delete ID, clear, quit
#   scripts/demo.sh --smoke   unattended: pipes a scripted session into todo-view, prints its output and exits 0
#                             only if it shows the two todos, one of them done, and the todo/not-found error
#
# Environment:
#   FLUXBUS_SOCKET          the socket (default: $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else /tmp/fluxbus-$UID/fluxd.sock)
#   FLUXBUS_SCRATCH_PATH    build folder passed to `swift build --scratch-path` (default: .build)
#   DEMO_READY_TIMEOUT      seconds to wait for each process's ready line (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=interactive
case "${1:-}" in
    "") ;;
    --smoke) mode=smoke ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--smoke]" >&2; exit 2 ;;
esac

source scripts/ensure-deps.sh

build_args=()
if [ -n "${FLUXBUS_SCRATCH_PATH:-}" ]; then build_args=(--scratch-path "$FLUXBUS_SCRATCH_PATH"); fi
ready_timeout="${DEMO_READY_TIMEOUT:-30}"

echo "==> swift build ${build_args[*]}"
build_log=$(mktemp)
if ! swift build "${build_args[@]}" >"$build_log" 2>&1; then
    grep -vE '^\[[0-9]+/[0-9]+\]' "$build_log" >&2 || true
    rm -f "$build_log"
    echo "demo: build failed" >&2
    exit 1
fi
rm -f "$build_log"
bin=$(swift build "${build_args[@]}" --show-bin-path)

logs=$(mktemp -d "${TMPDIR:-/tmp}/fluxbus-demo.XXXXXX")
pids=() # started processes, in start order
names=()

stop_all() {
    local status=$?
    trap - EXIT INT TERM
    # Stop in reverse start order (stores before fluxd), politely first.
    local i pid
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        pid=${pids[i]}
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "demo: ${names[i]} (pid $pid) did not stop on SIGTERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    if [ "$mode" = interactive ]; then
        echo "demo: stopped everything it started; logs are in $logs"
    elif [ "$status" = 0 ]; then
        rm -rf "$logs"
    else
        echo "demo: logs kept in $logs" >&2
    fi
    exit "$status"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME READY-TEXT COMMAND...: starts COMMAND in the background (stdout and stderr to $logs/NAME.*) and waits
# for a stdout line containing READY-TEXT, at most $ready_timeout seconds. Prints the line and keeps it in
# $ready_line. (Not to be called in a subshell: the trap must know every pid.)
start() {
    local name=$1 ready=$2
    shift 2
    "$@" >"$logs/$name.out" 2>"$logs/$name.log" </dev/null &
    pids+=($!)
    names+=("$name")
    local pid=$! deadline=$((SECONDS + ready_timeout)) line
    while :; do
        line=$(grep -m1 -F "$ready" "$logs/$name.out" 2>/dev/null || true)
        if [ -n "$line" ]; then
            echo "$line"
            ready_line=$line
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "demo: $name exited before it was ready:" >&2
            cat "$logs/$name.log" >&2
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "demo: $name not ready after ${ready_timeout}s:" >&2
            cat "$logs/$name.log" >&2
            return 1
        fi
        sleep 0.1
    done
}

echo "==> starting fluxd with examples/fluxd.toml (it starts the todo, stats and comments stores)"
ready_line=
# Interactive: a durable fluxd, its journal in the default data directory (the todos survive a restart; see
# docs/journal.md). The unattended smoke run keeps its journal in its own temporary folder.
if [ "$mode" = interactive ]; then durability=(); else durability=(--data-dir "$logs/data"); fi
start fluxd "fluxd ready on " "$bin/fluxd" --config examples/fluxd.toml "${durability[@]}"
socket=${ready_line#*fluxd ready on }
deadline=$((SECONDS + ready_timeout))
until [ "$("$bin/fluxctl" workers --json --socket "$socket" 2>/dev/null | grep -c '"state":"running"')" = 3 ]; do
    if ! kill -0 "${pids[0]}" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "demo: the workers did not all start within ${ready_timeout}s:" >&2
        "$bin/fluxctl" workers --socket "$socket" >&2 || true
        cat "$logs/fluxd.log" >&2
        exit 1
    fi
    sleep 0.1
done
"$bin/fluxctl" workers --socket "$socket"

if [ "$mode" = interactive ]; then
    echo "==> todo-view (commands: add TEXT, edit ID TEXT, toggle ID, delete ID, clear, quit; Ctrl-C stops the demo)"
    echo "    in another terminal: $bin/comments-view --socket $socket --site 7"
    echo "                         $bin/fluxctl workers --socket $socket   (fluxd's log: $logs/fluxd.log)"
    "$bin/todo-view" --socket "$socket"
    exit 0
fi

echo "==> smoke: add milk, add eggs, toggle 1, delete 99, quit"
output=$(printf 'add milk\nadd eggs\ntoggle 1\ndelete 99\nquit\n' | "$bin/todo-view" --socket "$socket" 2>&1) || {
    echo "$output"
    echo "demo: todo-view failed" >&2
    exit 1
}
echo "$output"

# The last render (after the last "--- version N ---" line) must list exactly milk (done) and eggs (open).
last_render=$(printf '%s\n' "$output" | awk '/^--- version [0-9]+ ---$/ { block = "" ; next } { block = block $0 "\n" } END { printf "%s", block }')
todo_lines=$(printf '%s' "$last_render" | grep -E '^ +[0-9]+ \[[ x]\] ' || true)
failures=()
[ "$(printf '%s\n' "$todo_lines" | grep -c .)" = 2 ] || failures+=("expected 2 todos in the last render")
printf '%s\n' "$todo_lines" | grep -qE '^ +1 \[x\] milk$' || failures+=("expected '1 [x] milk'")
printf '%s\n' "$todo_lines" | grep -qE '^ +2 \[ \] eggs$' || failures+=("expected '2 [ ] eggs'")
printf '%s\n' "$last_render" | grep -q '2 total, 1 done, 1 open' || failures+=("expected the stats line '2 total, 1 done, 1 open'")
printf '%s\n' "$output" | grep -q '^error: todo/not-found: ' || failures+=("expected the error 'todo/not-found'")
if [ ${#failures[@]} -gt 0 ]; then
    printf 'smoke FAILED: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "==> smoke OK: two todos, one done, and the todo/not-found error"
