#!/usr/bin/env bash
# A/B of the Swift store SDK's own CPU per action (workload 7's method, both stores in one run): two release
# `flux-bench-store` binaries, BASE and NEW, each serving store b0 through the same release fluxd, driven by the C
# load generator (`loadgen/fluxbench.c`, workload 2's shape: 1 client, 64 actions in flight, pipelined; and
# optionally 1 in flight). The store process's CPU (user + system, /proc/PID/stat) over the measured part, divided
# by the actions, is the figure; the C store (pre-encoded frames) is measured beside them as the floor.
#
#   Benchmarks/sdk-ab.sh BASE_STORE NEW_STORE [REPS]
#
# Environment:
#   FLUXD    the release fluxd both run against (default: fluxd next to NEW_STORE)
#   COUNT    measured actions per run (default 100000; a tenth more are sent first as warm-up)
#   WINDOW   actions in flight (default 64)
#   STATE    the state's size in bytes (default 200, as workload 7)
#   C_STORE  1 (default) also measures the C store; 0 skips it
#
# Each repetition starts a fresh fluxd (--ephemeral) and store for every binary, in alternating order (BASE first
# in even repetitions, NEW first in odd ones), so drift in the machine's load hits both alike. Prints one line per
# run and then, per store: min and median over REPS (default 5) of store CPU µs per action, round trips/s and
# p50 latency, and the ratios NEW/BASE. Stores and fluxds are stopped by pid; the temp folder is removed.
# Store CPU is counted in clock ticks (10 ms): keep COUNT x CPU per action well above that (100000 x 2 µs = 0.2 s).
set -euo pipefail
BASE=${1:?usage: sdk-ab.sh BASE_STORE NEW_STORE [REPS]}
NEW=${2:?usage: sdk-ab.sh BASE_STORE NEW_STORE [REPS]}
REPS=${3:-5}
FLUXD=${FLUXD:-$(dirname "$NEW")/fluxd}
HERE="$(cd "$(dirname "$0")" && pwd)"
for f in "$BASE" "$NEW" "$FLUXD"; do [ -x "$f" ] || { echo "sdk-ab: not an executable: $f" >&2; exit 2; }; done
T=$(mktemp -d /tmp/fluxbus-sdkab-XXXXXX)
trap 'rm -rf "$T"' EXIT
gcc -O2 -o "$T/fluxbench" "$HERE/loadgen/fluxbench.c"
export T BASE NEW REPS FLUXD
exec python3 - <<'EOF'
import json, os, select, signal, statistics, subprocess, sys, time

T, FLUXD, REPS = os.environ["T"], os.environ["FLUXD"], int(os.environ["REPS"])
COUNT = int(os.environ.get("COUNT", "100000"))
WINDOW = int(os.environ.get("WINDOW", "64"))
STATE = int(os.environ.get("STATE", "200"))
stores = [("base", [os.environ["BASE"]]), ("new", [os.environ["NEW"]])]
if os.environ.get("C_STORE", "1") != "0":
    stores.append(("c", [f"{T}/fluxbench", "store", "--sys", "flux", "--topics", "1"]))


def start(argv, ready, timeout=20):
    """Starts argv and waits (with a deadline) for `ready` on its stdout; then drains nothing more (quiet)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    buf, deadline = b"", time.time() + timeout
    while ready.encode() not in buf:
        left = deadline - time.time()
        if left <= 0 or p.poll() is not None:
            stop(p)
            raise RuntimeError(f"{argv[0]} not ready: {buf[-300:]!r}")
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            chunk = os.read(p.stdout.fileno(), 4096)
            if chunk:
                buf += chunk
    return p


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def measure(name, argv, rep):
    sock = f"{T}/{name}-{rep}.sock"
    fluxd = start([FLUXD, "--socket", sock, "--ephemeral", "--log-level", "warning"], "fluxd ready")
    store = None
    try:
        if name == "c":
            store = start(argv + ["--addr", sock, "--state", str(STATE)], "store ready")
        else:
            store = start(argv + ["--socket", sock, "--state", str(STATE)], "store ready")
        out = subprocess.run([f"{T}/fluxbench", "client", "--sys", "flux", "--addr", sock, "--clients", "1",
                              "--window", str(WINDOW), "--count", str(COUNT), "--warmup", str(COUNT // 10),
                              "--state", str(STATE), "--rss-pid", str(store.pid), "--store-pid", str(store.pid),
                              "--label", name, "--timeout", "300"],
                             capture_output=True, text=True, timeout=330)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if out.returncode != 0 or "error" in r:
            raise RuntimeError(f"{name}: {r} {out.stderr[-300:]}")
        return {"cpu": r["store_cpu_us_per_round"], "rate": r["rounds_per_s"], "p50": r["p50_us"],
                "rss": r["broker_hwm_kb"]}
    finally:
        if store:
            stop(store)
        stop(fluxd)


results = {name: [] for name, _ in stores}
with open("/proc/cpuinfo") as f:
    model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
print(f"sdk-ab: {model}, {os.cpu_count()} cores; fluxd {FLUXD}; {REPS} reps x {COUNT} actions, window {WINDOW}, "
      f"state {STATE} B; load {open('/proc/loadavg').read().split()[:3]}", flush=True)
for rep in range(REPS):
    order = stores if rep % 2 == 0 else [stores[1], stores[0]] + stores[2:]
    for name, argv in order:
        r = measure(name, argv, rep)
        results[name].append(r)
        print(f"  rep {rep} {name:4}  store CPU {r['cpu']:6.2f} us/action  {r['rate']:9.0f} actions/s  "
              f"p50 {r['p50']:7.1f} us  store peak RSS {r['rss'] / 1024:5.1f} MiB", flush=True)


def stat(name, key):
    v = [r[key] for r in results[name]]
    return min(v), statistics.median(v), max(v)


print("store  CPU us/action min / median / max     actions/s min / median / max      p50 us median")
for name, _ in stores:
    c, r, p = stat(name, "cpu"), stat(name, "rate"), stat(name, "p50")
    print(f"{name:5}  {c[0]:6.2f} / {c[1]:6.2f} / {c[2]:6.2f}          {r[0]:9.0f} / {r[1]:9.0f} / {r[2]:9.0f}   "
          f"{p[1]:7.1f}")
cb, cn = stat("base", "cpu"), stat("new", "cpu")
rb, rn = stat("base", "rate"), stat("new", "rate")
print(f"NEW/BASE store CPU per action: min {cn[0] / cb[0]:.3f}, median {cn[1] / cb[1]:.3f}; "
      f"actions/s median {rn[1] / rb[1]:.3f}")
if "c" in results:
    rc = stat("c", "rate")
    print(f"SDK/C actions/s (median): base {rb[1] / rc[1]:.2f}x, new {rn[1] / rc[1]:.2f}x")
EOF
