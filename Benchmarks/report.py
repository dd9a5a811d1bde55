"""Turns the figures of one benchmark run (results.json) into Benchmarks/RESULTS.md.

`python3 Benchmarks/report.py [results.json]` rewrites RESULTS.md from a saved run without measuring again;
`python3 Benchmarks/report.py --splice 8 results-large-state.json` rewrites only section 8 (a run with `--only 8`),
keeping the other sections as they are (`--splice 10 results-durable-speed.json`: only section 10)."""
import json
import os
import re
import statistics
import sys

NAMES = {"relay": "bare relay (floor)", "flux": "FluxBus (fluxd)", "redis": "Redis pub/sub", "mqtt": "Mosquitto QoS 0",
         "nats": "NATS", "dbus": "D-Bus method call"}
ORDER = ["flux", "relay", "redis", "mqtt", "nats", "dbus"]


def med(rows, key):
    vals = [r[key] for r in rows if key in r and r[key] is not None and r[key] >= 0]
    return statistics.median(vals) if vals else None


def pick(results, sysn, prefix):
    return [r for r in results if r.get("sys") == sysn and r.get("label", "").startswith(prefix) and "error" not in r]


def failed(results, sysn, prefix):
    return [r for r in results if r.get("sys") == sysn and r.get("label", "").startswith(prefix) and "error" in r]


def fmt(v, d=1):
    if v is None:
        return "—"
    if abs(v) >= 100000:
        return f"{v:,.0f}"
    return f"{v:,.{d}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}x"


def split_table(L, present, c1, c8):
    """Workload 2's CPU per round trip by process, and what it says about the pipelined target."""
    def total(rows):
        parts = [med(rows, k) for k in ("broker_cpu_us_per_round", "store_cpu_us_per_round", "client_cpu_us_per_round")]
        return None if None in parts else sum(parts)

    def busy(rows):
        t, r = total(rows), med(rows, "rounds_per_s")
        return None if t is None or r is None else t * r / 1e6

    shown = [s for s in present if s != "dbus" and (c1[s] or c8[s])]
    if not any(med(c1[s], "store_cpu_us_per_round") is not None for s in shown):
        return  # a results.json from before the store's and client's CPU were recorded
    L.append("Where a pipelined round trip's CPU goes: each process's user+system CPU during the measured part per "
             "round trip, and how many of the 2 cores the three processes kept busy together (round trips/s x "
             "total).")
    L.append("")
    L.append("| system | 1 client: broker µs | store µs | client µs | total µs | cores busy | "
             "8 clients: broker µs | store µs | client µs | total µs | cores busy |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in shown:
        a, b = c1[s], c8[s]
        L.append(f"| {NAMES[s]} | {fmt(med(a, 'broker_cpu_us_per_round'), 2)} | {fmt(med(a, 'store_cpu_us_per_round'), 2)} | "
                 f"{fmt(med(a, 'client_cpu_us_per_round'), 2)} | {fmt(total(a), 2)} | {fmt(busy(a), 2)} | "
                 f"{fmt(med(b, 'broker_cpu_us_per_round'), 2)} | {fmt(med(b, 'store_cpu_us_per_round'), 2)} | "
                 f"{fmt(med(b, 'client_cpu_us_per_round'), 2)} | {fmt(total(b), 2)} | {fmt(busy(b), 2)} |")
    L.append("")
    f, r, x = c1.get("flux", []), c1.get("redis", []), c1.get("relay", [])
    fb, rr = busy(f), med(r, "rounds_per_s")
    parts = [med(f, k) for k in ("store_cpu_us_per_round", "client_cpu_us_per_round")]
    if fb is not None and rr and None not in parts:
        budget = fb * 1e6 / (2 * rr) - sum(parts)
        L.append(f"With 64 in flight the three processes take turns more than they overlap: together they keep about "
                 f"one core busy, so round trips/s is about (cores busy) / (total CPU per round trip), and the broker's "
                 f"CPU is only part of the total. Twice Redis's 1-client rate ({fmt(2 * rr, 0)} round trips/s) at "
                 f"FluxBus's {fmt(fb, 2)} cores busy leaves {fmt(fb * 1e6 / (2 * rr), 2)} µs per round trip for all "
                 f"three processes; FluxBus's store and client take {fmt(sum(parts), 2)} µs of it, which leaves fluxd "
                 f"{fmt(budget, 2)} µs. The bare relay, which only frames and looks up a topic, spends "
                 f"{fmt(med(x, 'broker_cpu_us_per_round'), 2)} µs.")
        L.append("")


LANGS = [("swift", "Swift SDK (FluxStore, FluxClient typed)"), ("python", "Python library"), ("node", "Node library")]
LARGE_ROWS = [
    ("actions/s (one in flight, each settled before the next)", "actions_per_s", 1, True),
    ("store CPU µs per action", "store_cpu_us_per_action", 1, False),
    ("bytes received per subscriber per change (per version the store made)", "sub_bytes_per_version", 0, False),
    ("subscriber CPU µs per change (per state it was handed)", "sub_cpu_us_per_change", 1, False),
    ("states handed to each subscriber / versions made", None, 0, None),
    ("fluxd CPU µs per action (/proc/PID/stat, 10 ms ticks)", "fluxd_cpu_us_per_action", 1, False),
    ("fluxd CPU µs per action (schedstat, ns)", "fluxd_schedstat_us_per_action", 1, False),
    ("fluxd user-space CPU µs per action (utime)", "fluxd_user_us_per_action", 1, False),
    ("fluxd kernel CPU µs per action (stime)", "fluxd_system_us_per_action", 1, False),
    ("new subscriber: ms from subscribe to the whole state (after the changes)", "first_state_ms_after", 1, False),
    ("fluxd peak RSS MiB", "fluxd_hwm_mib", 1, False),
]
LARGE_TARGETS = [("store CPU per action", "store_cpu_us_per_action", 100, "µs"),
                 ("bytes per subscriber per change", "sub_bytes_per_version", 1024, "B"),
                 ("subscriber CPU per change", "sub_cpu_us_per_change", 100, "µs"),
                 ("fluxd CPU per action", "fluxd_cpu_us_per_action", 20, "µs")]


LARGE_WINDOW_ROWS = [
    ("actions/s", "actions_per_s", 1),
    ("fluxd user-space CPU µs per action (utime)", "fluxd_user_us_per_action", 1),
    ("fluxd kernel CPU µs per action (stime)", "fluxd_system_us_per_action", 1),
    ("fluxd CPU µs per action (utime+stime)", "fluxd_cpu_us_per_action", 1),
    ("fluxd CPU µs per action (schedstat, ns)", "fluxd_schedstat_us_per_action", 1),
    ("store CPU µs per action", "store_cpu_us_per_action", 1),
    ("subscriber CPU µs per change (per state it was handed)", "sub_cpu_us_per_change", 1),
    ("subscriber CPU µs per action (per version the store made)", "sub_cpu_us_per_version", 1),
]


def targets_table(L, issue, checks, marks):
    """An issue's targets checked against this run: (target, measured, met) rows, `met` True / False (marked
    `marks`) or None (informative, no target: "—")."""
    L.append(f"### Targets (issue {issue}), checked against this run")
    L.append("")
    L.append("| target | measured | met |")
    L.append("|---|---:|:---:|")
    for name, val, ok in checks:
        L.append(f"| {name} | {val} | {marks[0] if ok else (marks[1] if ok is not None else '—')} |")
    L.append("")


def large_rows(res, lang, mode, window=1):
    rows = [r for r in res if r.get("sys") == "large" and r.get("lang") == lang and r.get("mode") == mode
            and r.get("window", 1) == window and "error" not in r]
    for r in rows:
        if r.get("fluxd_hwm_kb"):
            r["fluxd_hwm_mib"] = r["fluxd_hwm_kb"] / 1024
    return rows


def cg_change(doc):
    """' (Ir per action, window 1 -> W: -N%)' from the results document's callgrind list, or ''."""
    cg = sorted(doc.get("callgrind") or [], key=lambda c: c["window"])
    if len(cg) < 2 or cg[0]["window"] != 1:
        return ""
    a, b = cg[0]["deltas_ir_per_action"], cg[-1]["deltas_ir_per_action"]
    return f" (deltas, Ir per action, window 1 -> {cg[-1]['window']}: {(b - a) * 100 / a:+.0f}%)"


def large_state_section(L, res, doc):
    """Workload 8 (issue 16): a store holding 10,000 todos, one toggled per action, 10 subscribers; whole states
    (before SPEC §16) vs patches and deltas (after), per language; the Swift targets."""
    runs = [r for r in res if r.get("sys") == "large"]
    if not runs:
        return []
    m = doc["machine"]
    any_run = next((r for r in runs if "error" not in r), runs[0])
    full_n = next((r["actions"] for r in runs if r.get("mode") == "full"), "?")
    delta_n = next((r["actions"] for r in runs if r.get("mode") == "deltas"), "?")
    size = next((r.get("store_registered_bytes") for r in runs if r.get("store_registered_bytes")), None)
    L.append("## 8. Large states (issue 16)")
    L.append("")
    L.append(f"Same machine ({m.get('cpu', '?')}, {m.get('cores')} cores, Linux {m.get('kernel')}). Command: `"
             + doc["command"] + "`.")
    L.append("")
    L.append(f"- Workload: one store holding {any_run.get('todos', 0):,} todos (the example todo model: "
             "`{\"todos\":[{\"id\":1,\"title\":\"todo number 1: buy milk and eggs\",\"done\":false,\"createdSeq\":1},"
             f"...],\"nextID\":...}}`"
             + (f", {size / 1000:,.0f} KB as the Swift store registers it" if size else "")
             + f"); each action toggles one todo (ids in turn: action n toggles the n-th todo); "
             f"{any_run.get('subscribers', '?')} subscribers of the store's language, each reading the toggled todo "
             "through its state after every change. The driver (the benchmark process, with the Python library) "
             "dispatches the toggles one at a time, each settled before the next (so actions/s is the rate of one "
             f"store answering in turn while the subscribers compete for the 2 cores); {full_n} actions with whole "
             f"states, {delta_n} with deltas; a fresh release fluxd (`--ephemeral --max-frame 16777216`) per run; "
             f"{doc['args']['reps']} repetitions, the two modes interleaved, medians.")
    L.append("- **before** (whole states, as before SPEC §16): the store sends every new state whole "
             "(`done.state`), subscribers subscribe without deltas and get every change as a whole snapshot. "
             "Swift: `flux-large-state-bench --full` hides §16 from the SDK (its transport drops "
             "`welcome.limits.deltaHistory`, so FluxStore and FluxClient behave as with a fluxd before 0.4.0: "
             "FluxJSON.encode of the whole `TodoState`; snapshots parsed and decoded whole); Python "
             "`bench_large_state.py --mode full` (patches off, copy handler); Node `bench-large-state.mjs --mode full` "
             "(deep copy, whole state) and `--deltas false`.")
    L.append("- **after** (SPEC §16): the store publishes a patch (`done.patch` + `base`), subscribers ask for "
             "deltas and apply them. Swift: the example `TodoState` (its todos a `TrackedArray`): the patch comes from "
             "the array's change log, the typed subscription decodes only the touched todo; Python `--mode patch` "
             "(draft handler); Node `--mode patch` (draft handler).")
    L.append("- Store CPU: the store process's user+system CPU (getrusage / process.cpuUsage) from its first action "
             "to its last answer, per action. Subscriber CPU: each subscriber's from holding its first state to "
             "holding the last action's, per state handed to it (mean of the subscribers). Bytes: every frame byte a "
             "subscriber received in that span / versions the store made (= per action). fluxd CPU: utime+stime "
             "from /proc/PID/stat from the first dispatch until every subscriber held the last state, per action "
             "(schedstat's ns figure beside it), and utime (fluxd's own code) and stime (the kernel's work for it: "
             "syscalls, wake-ups, socket copies) apart; the 10 ms ticks make the whole-state split coarse (a few "
             "ticks per run). New subscriber: one more subscriber of the language started after "
             "the changes: ms from its `subscribe` to the decoded whole state (fluxd renders the patched state).")
    L.append("")
    for lang, name in LANGS:
        full, delta = large_rows(res, lang, "full"), large_rows(res, lang, "deltas")
        if not full and not delta:
            if any(r.get("lang") == lang for r in runs):
                L.append(f"**{name}**: failed ({'; '.join(r.get('error', '') for r in runs if r.get('lang') == lang)[:300]})")
                L.append("")
            continue
        L.append(f"**{name}**")
        L.append("")
        L.append("| | before (whole states) | after (deltas) | after / before |")
        L.append("|---|---:|---:|---:|")
        for title, key, d, higher in LARGE_ROWS:
            if key is None:
                def seen(rows):
                    c, v = med(rows, "sub_changes"), med(rows, "sub_versions")
                    return "—" if c is None or not v else f"{c:,.0f} / {v:,.0f}"
                L.append(f"| {title} | {seen(full)} | {seen(delta)} | |")
                continue
            a, b = med(full, key), med(delta, key)
            r = "—" if a is None or b is None or not a or not b else (
                f"{b / a:.2f}x" if b / a >= 0.01 else f"1/{a / b:,.0f}")
            L.append(f"| {title} | {fmt(a, d)} | {fmt(b, d)} | {r} |")
        bad = [r["label"] for r in full + delta if not r.get("sub_consistent", True) or r.get("rejected")]
        if bad:
            L.append("")
            L.append(f"Inconsistent or rejected in: {', '.join(bad)}.")
        L.append("")
    # Deltas with more than one action in flight (run.py --large-window): what fluxd costs when wake-ups are shared.
    for lang, name in LANGS:
        one = large_rows(res, lang, "deltas")
        wins = sorted({r.get("window", 1) for r in runs if r.get("lang") == lang and r.get("mode") == "deltas"
                       and r.get("window", 1) > 1 and "error" not in r})
        if not one or not wins:
            continue
        cols = [(1, one)] + [(w, large_rows(res, lang, "deltas", w)) for w in wins]
        L.append(f"**{name}, deltas: one action in flight vs {', '.join(str(w) for w in wins)} in flight** "
                 "(the driver starts the next toggle as soon as one settles; same fluxd, store and subscribers)")
        L.append("")
        L.append("| | " + " | ".join(f"window {w}" for w, _ in cols) + " |")
        L.append("|---|" + "---:|" * len(cols))
        for title, key, d in LARGE_WINDOW_ROWS:
            L.append(f"| {title} | " + " | ".join(fmt(med(rows, key), d) for _, rows in cols) + " |")
        seen = []
        for _, rows in cols:
            c, v = med(rows, "sub_changes"), med(rows, "sub_versions")
            seen.append("—" if c is None or not v else f"{c:,.0f} / {v:,.0f}")
        L.append("| states handed to each subscriber / versions made | " + " | ".join(seen) + " |")
        bad = [r["label"] for _, rows in cols[1:] for r in rows
               if not r.get("sub_consistent", True) or r.get("rejected")]
        if bad:
            L.append("")
            L.append(f"Inconsistent or rejected in: {', '.join(bad)}.")
        L.append("")
    # fluxd's instructions per action (Benchmarks/large-state-callgrind.sh, Swift store and subscribers), beside
    # the same window's user-space CPU from this run.
    cg = doc.get("callgrind") or []
    if cg:
        L.append("**fluxd's own instructions per action** (callgrind, user space only: "
                 f"`{doc.get('callgrind_command', 'Benchmarks/large-state-callgrind.sh FLUXD')}`; Swift store and "
                 "subscribers, the same workload; Ir per action, exact and independent of the machine's load; "
                 "beside it fluxd's utime per action in this run's table above, same mode and window)")
        L.append("")
        L.append("| window | whole states Ir/action | deltas Ir/action | whole / deltas | deltas: fluxd utime µs/action "
                 "(this run) | Ir per utime µs |")
        L.append("|---:|---:|---:|---:|---:|---:|")
        for c in cg:
            rows = large_rows(res, "swift", "deltas", c["window"])
            ut = med(rows, "fluxd_user_us_per_action")
            L.append(f"| {c['window']} | {c['full_ir_per_action']:,} | {c['deltas_ir_per_action']:,} | "
                     f"{c['full_ir_per_action'] / c['deltas_ir_per_action']:,.0f}x | {fmt(ut, 1)} | "
                     + ("—" if not ut else f"{c['deltas_ir_per_action'] / ut:,.0f}") + " |")
        L.append("")
    fails = [r for r in runs if "error" in r]
    if fails:
        L.append("Failed runs: " + "; ".join(f"{r['label']}: {r['error'][:160]}" for r in fails))
        L.append("")

    checks = []
    delta = large_rows(res, "swift", "deltas")
    if delta:
        for name, key, limit, unit in LARGE_TARGETS:
            v = med(delta, key)
            if v is None:
                continue
            over = "" if v <= limit else f" ({v / limit:.1f}x the target)"
            checks.append((f"Swift SDK: {name} ≤ {limit:,} {unit}", f"{fmt(v, 1)} {unit}{over}", v <= limit))
        late = med(delta, "first_state_ms_after")
        whole = all(r.get("first_state_ms_after") is not None for r in delta)
        if late is not None:
            checks.append(("Swift SDK: a new subscriber still gets the whole state at once",
                           f"{fmt(late, 1)} ms to the decoded whole state", whole))
    if checks:
        targets_table(L, 16, checks, ("✓", "✗"))
        L.append("What bounds the missed ones (one action in flight: every frame wakes fluxd, the store and each "
                 "subscriber on 2 shared cores), with the measurements behind it: `Benchmarks/large-state.md`. "
                 "The fluxd figure checked here is window 1, utime+stime; what fluxd itself costs per action is "
                 "its utime and, exactly, its instructions (the window and callgrind tables above): with "
                 "more than one action in flight the kernel's share per action falls several times, the "
                 "user-space instructions change little" + cg_change(doc) + ".")
        L.append("")
    return checks


def legacy_labels(res):
    """results files from before workload 8 was large states name the durability runs w8-: they are w9- now."""
    for r in res:
        label = r.get("label", "")
        if label.startswith("w8-") and r.get("sys") in ("flux", "redis", "disk"):
            r["label"] = "w9-" + label[3:]
    return res


FLUX_MODES = [("ephemeral", "FluxBus, --ephemeral (memory only)"), ("none", "FluxBus, --durability none"),
              ("batch", "FluxBus, --durability batch (default)"), ("always", "FluxBus, --durability always")]
REDIS_MODES = [("everysec", "Redis, appendfsync everysec"), ("always", "Redis, appendfsync always")]


def durability_section(L, res, doc):
    """Workload 9 (issue 15): what durability costs, beside Redis with an AOF; the disk's sync latency; restart."""
    disk = [r for r in res if r.get("sys") == "disk" and r.get("label", "").startswith("w9-fdatasync")]
    rows = {(s, m): (pick(res, s, f"w9-{m}-rtt"), pick(res, s, f"w9-{m}-pipe-c1"), pick(res, s, f"w9-{m}-pipe-c8"))
            for s, modes in (("flux", FLUX_MODES), ("redis", REDIS_MODES)) for m, _ in modes}
    restart = next((r for r in res if r.get("label") == "w9-restart"), None)
    if not disk and not any(any(v) for v in rows.values()) and not restart:
        return []
    sync50, sync99 = med(disk, "p50_us"), med(disk, "p99_us")

    def per_sync(s, m):
        """Workload 1's p50 as a multiple of the disk's fdatasync p50 probed around it (same repetition: the probes
        just before and after the two `always` runs), median over the repetitions."""
        out = []
        for r in pick(res, s, f"w9-{m}-rtt"):
            rep = r["label"].rsplit("-", 1)[1]
            near = [d["p50_us"] for d in disk if d["label"].startswith(f"w9-fdatasync-{rep}-")]
            if near and r.get("p50_us"):
                out.append(r["p50_us"] / statistics.mean(near))
        return statistics.median(out) if out else None
    d = doc.get("disk", {})
    m = doc["machine"]
    L.append("## 9. Durability (issue 15)")
    L.append("")
    L.append(f"Same run, same machine ({m.get('cpu', '?')}, {m.get('cores')} cores, Linux {m.get('kernel')}). "
             f"Data directories in the run's temporary directory, on {d.get('source', '?')} ({d.get('fstype', '?')}, "
             f"{d.get('options', '?')}; rotational {d.get('rotational', '?')}, write cache {d.get('write_cache', '?')}), "
             "a fresh one for every measurement, and the broker started fresh on it. Command: `" + doc["command"] + "`.")
    L.append("")
    if disk:
        L.append(f"**The disk's own sync latency** (a 1-byte append + `fdatasync`, {sum(r['samples'] for r in disk):,} "
                 f"samples over {len(disk)} probes, one just before and one just after the two `always` round-trip "
                 f"runs of each repetition): p50 **{fmt(sync50)} µs**, p99 {fmt(sync99)} µs (medians of the probes; "
                 f"per probe p50 {', '.join(fmt(r['p50_us']) for r in disk)} µs). Every durable commit costs at "
                 "least this. The column \"p50 / disk fdatasync p50\" divides each repetition's round-trip p50 by "
                 "the mean of its two probes (median over repetitions).")
        L.append("")
    L.append("- FluxBus: the pattern of workloads 1 and 2 unchanged (`dispatch` -> `action` -> `done` with state -> "
             "`snapshot`). A durable fluxd journals the action (before the store sees it) and the result with the "
             "state (before a subscriber sees it). `none`: written to the OS each loop iteration, never synced by "
             "fluxd; `batch`: also synced every 100 ms (`--sync-interval`); `always`: one `fdatasync` per loop "
             "iteration before the frames that reveal the records leave (group commit).")
    L.append("- Redis (`fluxbench --redis-write`): the same pub/sub pattern **plus a write**, so that the AOF holds "
             "what fluxd's journal holds: the client sends `XADD a.<t> * p <action>` then `PUBLISH a.<t> <action>` "
             "(one write), the store answers `SET s.<t> <state>` then `PUBLISH s.<t> <state>`. Why a write beside "
             "the pub/sub rather than Redis Streams alone (XADD + XREAD BLOCK): the delivery path stays the one of "
             "workloads 1 and 2, so the only change against the Redis rows there is the durable write. Why XADD for "
             "the action: a stream is Redis's append-only log with an id per entry, the nearest thing to fluxd's "
             "journal of every action (a SET would keep only the last); SET for the state matches fluxd's retained "
             "snapshot. Redis writes the AOF in `beforeSleep`, before it writes any reply or pushed message of that "
             "event-loop iteration; with `appendfsync always` it also `fdatasync`s there, so, as in fluxd's "
             "`always`, nothing reveals a write before it is on disk (two syncs per round trip for both). "
             "`everysec` syncs in a background thread once a second. Redis's defaults otherwise (AOF rewrite at "
             "64 MB and 100% growth, in a forked child).")
    L.append("")
    L.append("| system | round trip p50 µs | p99 µs | p50 / disk fdatasync p50 | pipelined 1 client round trips/s | "
             "p99 µs | 8 clients round trips/s | p99 µs | broker CPU µs per round trip (1 client) | "
             "bytes written per action |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rewrites = []
    for s, modes in (("flux", FLUX_MODES), ("redis", REDIS_MODES)):
        for mode, name in modes:
            a, b, c = rows[(s, mode)]
            if not (a or b or c):
                fail = failed(res, s, f"w9-{mode}-")
                L.append(f"| {name} | not measured{' (failed)' if fail else ''} | | | | | | | | |")
                continue
            p50 = med(a, "p50_us")
            per = med(a, "journal_bytes_per_action")
            rw = max([r.get("aof_rewrites", 0) for r in b + c] or [0])
            if rw:
                rewrites.append(f"{name}: up to {rw} per pipelined run")
            L.append(f"| {name} | {fmt(p50)} | {fmt(med(a, 'p99_us'))} | "
                     f"{ratio(per_sync(s, mode), 1) if mode == 'always' else '—'} | {fmt(med(b, 'rounds_per_s'), 0)} | "
                     f"{fmt(med(b, 'p99_us'))} | {fmt(med(c, 'rounds_per_s'), 0)} | {fmt(med(c, 'p99_us'))} | "
                     f"{fmt(med(b, 'broker_cpu_us_per_round'), 2)} | {fmt(per, 0) if per is not None else '—'} |")
    L.append("")
    a1 = next((r for r in res if r.get("label", "").startswith("w9-") and "-rtt-" in r.get("label", "")
               and "rounds" in r), None)
    p1 = next((r for r in res if "-pipe-c1-" in r.get("label", "") and r.get("label", "").startswith("w9-")
               and "rounds" in r), None)
    p8 = next((r for r in res if "-pipe-c8-" in r.get("label", "") and r.get("label", "").startswith("w9-")
               and "rounds" in r), None)
    L.append(f"Round trip: {a1['rounds'] if a1 else '?'} round trips per repetition after a warm-up; pipelined: "
             f"64 in flight per client, {p1['rounds'] if p1 else '?'} round trips (1 client) and "
             f"{p8['rounds'] if p8 else '?'} (8 clients); {doc['args']['reps']} repetitions interleaved, medians. "
             "Bytes written per action: what the round-trip run left in the broker's data directory "
             "(fluxd: the journal segments, action + result + state records; Redis: the AOF files) / actions sent; "
             "that run is too short for an AOF rewrite or a segment roll-over, which the pipelined runs may have "
             "(a Redis AOF rewrite forks a child that compacts the AOF, competing for the 2 cores). Broker CPU: from /proc (10 ms ticks); on this VM each sync also costs the "
             "broker CPU time (the virtio notification), so the durable modes' figure includes the disk's share. "
             "`Benchmarks/durability.md` says where a durable fluxd's time goes."
             + (f" AOF rewrites (Redis's defaults) during the measurements: {'; '.join(rewrites)}." if rewrites else ""))
    L.append("")
    if restart:
        L.append("### Restart with a journal of "
                 f"{restart.get('actions', 0):,} actions over {restart.get('stores', '?')} stores")
        L.append("")
        if "error" in restart:
            L.append(f"Failed: {restart['error']}")
            L.append("")
        L.append(f"A `--durability batch` fluxd was fed {restart.get('actions', 0):,} actions by 100 clients (64 in "
                 f"flight each, one store process owning the 100 stores; "
                 f"{fmt(restart.get('feed_rounds_per_s'), 0)} actions/s), then restarted on the same data directory: "
                 "killed with SIGKILL (no checkpoint on the way out: the newest checkpoint, written when a 64 MiB "
                 "segment filled, plus the segments after it are read), and stopped with SIGTERM (a clean stop "
                 "syncs and writes a checkpoint of everything). Time = from exec to the `fluxd ready on` line. The "
                 "journal files were in the page cache (a crash of the process, not of the machine).")
        L.append("")
        L.append("| start | ready in ms (median) | each | fluxd RSS after MiB | fluxd's journal log lines |")
        L.append("|---|---:|---|---:|---|")
        kinds = []
        for r in restart.get("restarts", []):
            if r["kind"] not in kinds:
                kinds.append(r["kind"])
        for k in kinds:
            rs = [r for r in restart["restarts"] if r["kind"] == k]
            rss = med(rs, "rss_kb")
            notes = "; ".join(re.sub(r"/\S*/(checkpoint-|journal-)", r"\1", n) for n in rs[-1]["notes"])
            L.append(f"| {k} | {fmt(med(rs, 'ready_ms'))} | {', '.join(fmt(r['ready_ms']) for r in rs)} | "
                     f"{fmt(rss / 1024 if rss else None)} | {notes.replace('|', '/')} |")
        L.append("")
        if "journal_bytes" in restart:
            L.append(f"Journal: {restart['journal_bytes']:,} bytes in {restart['segments']} segment(s) for "
                     f"{restart['actions']:,} actions = **{restart['journal_bytes_per_action']} bytes per action** "
                     f"(action 100-byte payload and 200-byte state; the records: action, result, snapshot); "
                     f"checkpoints {restart.get('checkpoint_bytes', 0):,} bytes; allocated on disk (du, with the "
                     f"space reserved ahead) {restart.get('data_bytes_allocated', 0):,} bytes. A clean stop (SIGTERM "
                     f"to exit) took {', '.join(fmt(x) for x in restart.get('stop_ms', []))} ms.")
            L.append("")

    # ---- targets
    checks = []

    def rr(s, m, i, key):
        return med(rows[(s, m)][i], key)

    n1, b1 = rr("flux", "none", 1, "rounds_per_s"), rr("flux", "batch", 1, "rounds_per_s")
    n8, b8 = rr("flux", "none", 2, "rounds_per_s"), rr("flux", "batch", 2, "rounds_per_s")
    np50, bp50 = rr("flux", "none", 0, "p50_us"), rr("flux", "batch", 0, "p50_us")
    if n1 and b1:
        checks.append(("batch within 10% of none: pipelined throughput, 1 client", f"{b1 / n1:.3f}x", b1 >= 0.9 * n1))
    if n8 and b8:
        checks.append(("batch within 10% of none: pipelined throughput, 8 clients", f"{b8 / n8:.3f}x", b8 >= 0.9 * n8))
    if np50 and bp50:
        checks.append(("batch within 10% of none: round trip p50", f"{bp50 / np50:.3f}x", bp50 <= 1.1 * np50))
    e1, e8 = rr("flux", "ephemeral", 1, "rounds_per_s"), rr("flux", "ephemeral", 2, "rounds_per_s")
    if e1 and b1:
        checks.append(("(no target) batch / ephemeral pipelined throughput, 1 / 8 clients",
                       f"{b1 / e1:.2f}x / {(b8 / e8) if b8 and e8 else 0:.2f}x", None))
    a1_, r1 = rr("flux", "always", 1, "rounds_per_s"), rr("redis", "always", 1, "rounds_per_s")
    a8_, r8 = rr("flux", "always", 2, "rounds_per_s"), rr("redis", "always", 2, "rounds_per_s")
    if a1_ and r1:
        checks.append(("always ≥ 1.5x Redis appendfsync always, pipelined, 1 client", f"{a1_ / r1:.2f}x",
                       a1_ >= 1.5 * r1))
    if a8_ and r8:
        checks.append(("always ≥ 1.5x Redis appendfsync always, pipelined, 8 clients", f"{a8_ / r8:.2f}x",
                       a8_ >= 1.5 * r8))
    ap, rp = per_sync("flux", "always"), per_sync("redis", "always")
    if ap:
        checks.append(("(report) always round trip p50 / disk fdatasync p50 (2 syncs per round trip)",
                       f"{ap:.2f}x" + (f" (Redis always: {rp:.2f}x)" if rp else ""), None))
    if restart and restart.get("restarts"):
        for kind in ("after SIGKILL", "after SIGTERM"):
            rs = [r for r in restart["restarts"] if r["kind"] == kind]
            if rs:
                v = med(rs, "ready_ms")
                checks.append((f"restart {kind} with {restart['actions']:,} actions under 1 s", f"{v:,.0f} ms",
                               v < 1000 if restart["actions"] >= 1_000_000 else None))
        if "journal_bytes_per_action" in restart:
            checks.append(("(report) journal bytes per action", f"{restart['journal_bytes_per_action']}", None))
    if checks:
        targets_table(L, 15, checks, ("yes", "no"))
        if restart and restart.get("actions", 0) < 1_000_000:
            L.append(f"The restart ran with {restart['actions']:,} actions (a scaled run), so the 1 s target for "
                     "1,000,000 is not judged here.")
            L.append("")
    return checks


W10_ROWS = [("bb8fa48", "flux", "bb8fa48 (before hardening)"), ("ephemeral", "flux", "main `--ephemeral`"),
            ("none", "flux", "main `--durability none`"), ("batch", "flux", "main `--durability batch` (default)"),
            ("always", "flux", "main `--durability always`"), ("redis", "redis", "Redis pub/sub (no persistence)"),
            ("nats", "nats", "NATS")]
W10_SHAPES = [("rtt", "1 in flight"), ("pipe-c1", "64 in flight x 1 client"), ("pipe-c8", "64 in flight x 8 clients")]


def durable_speed_section(L, res, doc):
    """Workload 10 (issue 27): the durable default (batch) against --ephemeral, the other modes, fluxd built from
    bb8fa48 (before durability and the hardening) and the peers, in one run; callgrind; the longest loop hold."""
    rows = {key: {shape: pick(res, sysn, f"w10-{key}-{shape}-") for shape, _ in W10_SHAPES} for key, sysn, _ in W10_ROWS}
    holds = {r["durability"]: r for r in res if r.get("label", "").startswith("w10-hold-")
             and not r.get("label", "").startswith("w10-hold-rt-")}
    rt_holds = {r["durability"]: r for r in res if r.get("label", "").startswith("w10-hold-rt-")}
    cgs = [r for r in res if r.get("sys") == "callgrind" and r.get("label", "").startswith("w10-callgrind")]
    meta = next((r for r in res if r.get("label") == "w10-base"), {})
    if not any(v for shapes in rows.values() for v in shapes.values()) and not holds and not cgs:
        return []
    m, d, args = doc["machine"], doc.get("disk", {}), doc["args"]

    def val(key, shape, field):
        return med(rows[key][shape], field)

    def rounds(key, shape):
        return next((r["rounds"] for r in rows[key][shape] if "rounds" in r), None)

    # callgrind: Ir per round trip by row and window ("64", "1"); the journal's extra comes from the run that
    # measured --ephemeral and batch together, --ephemeral against bb8fa48 from the run that measured those two.
    ir, runs = {}, {}
    for r in cgs:
        if "error" in r or not r.get("windows"):
            continue
        runs[(r["base"], r["new"])] = r
        for w, v in r["windows"].items():
            ir.setdefault(r["new"], {})[w] = v["new"]
            ir.setdefault(r["base"], {}).setdefault(w, v["base"])
    eb, be = runs.get(("bb8fa48", "ephemeral")), runs.get(("ephemeral", "batch"))

    L.append("## 10. The durable default against the dispatcher before durability (issue 27)")
    L.append("")
    L.append(f"Same run, same machine ({m.get('cpu', '?')}, {m.get('cores')} cores, Linux {m.get('kernel')}, load "
             f"average at the end {' '.join(m.get('load', [])) or '?'}). Data "
             f"directories in the run's temporary directory, on {d.get('source', '?')} ({d.get('fstype', '?')}, "
             f"{d.get('options', '?')}), a fresh one for every measurement. Command: `" + doc["command"] + "`.")
    L.append("")
    base_path = args.get("base_fluxd") or "—"
    base_args = args.get("base_args") or ""
    L.append("- **bb8fa48 (before hardening)**: a release fluxd built from commit bb8fa48, the last before the journal "
             "and the hardening (`run.py --base-fluxd`; `scripts/bench.sh` builds it from `git archive bb8fa48` into "
             "`.build-bench-base`), started with " + (f"`{base_args}` and " if base_args else "no durability "
             "arguments (it has neither `--ephemeral` nor a journal), only ") + "`--socket` and `--log-level warning`."
             + (f" **The base fluxd of this run (`{base_path}`) has `--ephemeral`: it is not bb8fa48 (it ran with its "
                "default).**" if meta.get("has_ephemeral") else ""))
    L.append("- **main**: the fluxd under test, `--ephemeral`, or `--data-dir <fresh dir> --durability none|batch|always` "
             "(`batch`, synced every 100 ms, is the default). Redis pub/sub (`--appendonly no --save \"\"`) and NATS "
             "(127.0.0.1 TCP) as in workloads 1 and 2.")
    n1, na = rounds("ephemeral", "rtt") or rounds("bb8fa48", "rtt"), rounds("always", "rtt")
    c1, c8 = rounds("ephemeral", "pipe-c1") or rounds("bb8fa48", "pipe-c1"), \
        rounds("ephemeral", "pipe-c8") or rounds("bb8fa48", "pipe-c8")
    L.append(f"- The pattern of workloads 1 and 2: 1 in flight ({n1 or '?'} round trips; `always`, two syncs per round "
             f"trip, {na or '?'}), 64 in flight x 1 client ({c1 or '?'} round trips) and x 8 clients ({c8 or '?'} "
             f"in all), each after a warm-up, a fresh broker and store per measurement; {args['reps']} repetitions, "
             "in each every shape through every row in turn (the order reversed every other repetition) so drift "
             "hits all rows alike; medians. Broker CPU: the broker process's user+system CPU over the measured part "
             "per round trip (fluxbench's `broker_cpu_us_per_round`: /proc, 10 ms ticks, so a pipelined run counts "
             "a few dozen of them; every thread, e.g. NATS's), and, in the second table, the same process's CPU "
             "from schedstat (ns, every thread) over the whole client run, warm-up included, per round trip. p99: "
             "of every round trip's latency.")
    rounds_cg = next((r.get("rounds") for r in cgs if r.get("rounds")), None)
    if ir:
        L.append(f"- Callgrind: fluxd's user-space instructions (Ir) per round trip, 1 client, pipelined (64 in flight) "
                 f"and one in flight, {rounds_cg:,} round trips per measurement, fluxd under valgrind with turns "
                 "unbounded by time where it has `--turn-micros`: "
                 + "; ".join(f"`{r['command']}`" for r in runs.values()) + ". Instructions do not depend on the "
                 "machine's load.")
    else:
        why = "; ".join(r.get("skipped") or r.get("error", "") for r in cgs) or "not run"
        L.append(f"- Callgrind: not measured ({why[:200]}).")
    L.append("")
    L.append("| row | round trips/s: 1 in flight | 64 x 1 client | 64 x 8 clients | broker CPU µs per round trip: "
             "1 in flight | 64 x 1 | 64 x 8 | p99 µs: 1 in flight | 64 x 1 | 64 x 8 | Ir per round trip: 64 in "
             "flight | 1 in flight |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, sysn, name in W10_ROWS:
        shapes = rows[key]
        if not any(shapes.values()):
            fail = failed(res, sysn, f"w10-{key}-")
            L.append(f"| {name} | not measured{' (failed)' if fail else ''} | | | | | | | | | | |")
            continue
        cells = [fmt(val(key, sh, "rounds_per_s"), 0) for sh, _ in W10_SHAPES]
        cells += [fmt(val(key, sh, "broker_cpu_us_per_round"), 2) for sh, _ in W10_SHAPES]
        cells += [fmt(val(key, sh, "p99_us")) for sh, _ in W10_SHAPES]
        cells += [f"{ir[key][w]:,}" if key in ir and w in ir[key] else ("—" if key in ("bb8fa48", "ephemeral", "batch")
                  else "") for w in ("64", "1")]
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    L.append("")
    sched = [(key, name) for key, _, name in W10_ROWS
             if any(val(key, sh, "broker_sched_us_per_round") is not None for sh, _ in W10_SHAPES)]
    if sched:
        L.append("| row | broker CPU µs per round trip (schedstat, ns): 1 in flight | 64 x 1 client | 64 x 8 clients |")
        L.append("|---|---:|---:|---:|")
        for key, name in sched:
            L.append(f"| {name} | " + " | ".join(fmt(val(key, sh, "broker_sched_us_per_round"), 3)
                                                 for sh, _ in W10_SHAPES) + " |")
        L.append("")

    def cpu(key, shape):
        """(schedstat figure, tick figure) of the broker's CPU per round trip."""
        return val(key, shape, "broker_sched_us_per_round"), val(key, shape, "broker_cpu_us_per_round")

    def ratios(a, b):
        out = []
        for field, what, dd in (("rounds_per_s", "round trips/s", 2), ("broker_cpu_us_per_round", "CPU (ticks)", 2),
                                ("broker_sched_us_per_round", "CPU (schedstat)", 2), ("p99_us", "p99", 2)):
            if val(a, "rtt", field) is None and val(a, "pipe-c1", field) is None:
                continue
            vals = [ratio(val(a, sh, field), val(b, sh, field)) for sh, _ in W10_SHAPES]
            out.append(f"{what} {' / '.join(vals)}")
        if a in ir and b in ir:
            irs = [ratio(ir[a].get(w), ir[b].get(w)) for w in ("64", "1")]
            out.append(f"Ir per round trip {' / '.join(irs)} (64 / 1 in flight)")
        return "; ".join(out)

    L.append("Ratios (each figure: 1 in flight / 64 x 1 client / 64 x 8 clients):")
    L.append("")
    for a, b in (("batch", "ephemeral"), ("none", "ephemeral"), ("always", "ephemeral"), ("ephemeral", "bb8fa48"),
                 ("batch", "bb8fa48")):
        if any(rows[a].values()) and any(rows[b].values()):
            L.append(f"- `{a}` / `{b}`: {ratios(a, b)}")
    peers = []
    for a in ("batch", "ephemeral"):
        for b, bn in (("redis", "Redis"), ("nats", "NATS")):
            if any(rows[a].values()) and any(rows[b].values()):
                (x1, t1), (y1, u1) = cpu(a, "pipe-c1"), cpu(b, "pipe-c1")
                (x8, t8), (y8, u8) = cpu(a, "pipe-c8"), cpu(b, "pipe-c8")
                peers.append(f"`{a}` / {bn} {ratio(x1, y1)} / {ratio(x8, y8)} (ticks {ratio(t1, u1)} / {ratio(t8, u8)})")
    if peers:
        L.append("- Broker CPU per pipelined round trip against the peers (schedstat, 1 client / 8 clients; "
                 "informative, no target): " + "; ".join(peers) + ".")
    if be:
        extra = {w: be["windows"][w]["new"] - be["windows"][w]["base"] for w in be["windows"]}
        L.append(f"- Callgrind, the journal's extra instructions (`batch` − `--ephemeral`, measured in the same run): "
                 f"{extra.get('64', 0):+,} Ir per pipelined round trip, {extra.get('1', 0):+,} per round trip one in "
                 "flight." + (f" (`--ephemeral` measured {be['windows']['64']['base']:,} / {be['windows']['1']['base']:,} "
                              f"Ir there, {eb['windows']['64']['new']:,} / {eb['windows']['1']['new']:,} beside bb8fa48.)"
                              if eb else ""))
    L.append("")

    if holds:
        L.append("**Longest loop hold**: a fresh fluxd fed actions by 8 clients x 64 in flight (one fluxbench store "
                 "owning the 8 stores), then asked for `info`: `load.longestLoopHoldMicros`, the longest one callback "
                 "(a read of up to 64 KiB of frames, an accept, a timer, a flush of the journal's and the "
                 "connections' writes, a wake-up) held fluxd's event loop since it started, and where it was measured "
                 "(`load.longestLoopHoldAt`).")
        L.append("")
        L.append("The rows at real-time priority run the same feed with fluxd's threads SCHED_FIFO (`chrt -a -f -p 1`): "
                 "the 10 other processes sharing the 2 cores (8 clients' load generator, the store, the spinner) "
                 "cannot preempt fluxd inside a callback, so the figure is fluxd's own work; without it, a callback "
                 "that is descheduled counts the time another process ran. The target is checked on that row.")
        L.append("")
        L.append("| fluxd | actions | actions/s | longest loop hold µs | measured at | before the feed µs |")
        L.append("|---|---:|---:|---:|---|---:|")
        for mode, h in [("batch", holds.get("batch")), ("ephemeral", holds.get("ephemeral")),
                        ("batch", rt_holds.get("batch")), ("ephemeral", rt_holds.get("ephemeral"))]:
            if not h:
                continue
            name = "main `--durability batch` (default)" if mode == "batch" else "main `--ephemeral`"
            if h.get("realtime"):
                name += ", real-time priority"
            if "error" in h:
                L.append(f"| {name} | {h.get('actions', 0):,} | failed: {h['error'][:120].replace('|', '/')} | | | |")
                continue
            L.append(f"| {name} | {h['actions']:,} | {fmt(h.get('feed_rounds_per_s'), 0)} | "
                     f"{h.get('longest_hold_us', 0):,} | `{h.get('longest_hold_at') or '—'}` | "
                     f"{fmt(h.get('hold_before_us'), 0) if h.get('hold_before_us') is not None else '—'} |")
        L.append("")

    # ---- targets
    checks = []
    scaled = args.get("scale", 1) != 1
    for sh, shn in (("pipe-c1", "1 client"), ("pipe-c8", "8 clients")):
        b, e = val("batch", sh, "rounds_per_s"), val("ephemeral", sh, "rounds_per_s")
        if b and e:
            checks.append((f"`batch` pipelined throughput ≥ 0.90x `--ephemeral` ({shn})",
                           f"{b / e:.3f}x ({b:,.0f} vs {e:,.0f} round trips/s)", b >= 0.9 * e))
    for sh, shn in (("pipe-c1", "1 client"), ("pipe-c8", "8 clients")):
        # Judged on schedstat (ns) when the run has it: a pipelined run is a few dozen 10 ms ticks.
        (bs, bt), (es, et) = cpu("batch", sh), cpu("ephemeral", sh)
        ticks = f"ticks {bt / et:.3f}x ({bt:.2f} vs {et:.2f} µs)" if bt and et else "ticks —"
        if bs and es:
            checks.append((f"`batch` fluxd CPU per pipelined round trip ≤ 1.10x `--ephemeral` ({shn})",
                           f"schedstat {bs / es:.3f}x ({bs:.3f} vs {es:.3f} µs); {ticks}", bs <= 1.1 * es))
        elif bt and et:
            checks.append((f"`batch` fluxd CPU per pipelined round trip ≤ 1.10x `--ephemeral` ({shn})",
                           ticks, bt <= 1.1 * et))
    if be:
        for w, limit, shn in (("64", 1000, "pipelined round trip"), ("1", 1500, "round trip one in flight")):
            bw = be["windows"].get(w)
            if bw:
                x = bw["new"] - bw["base"]
                checks.append((f"journal's extra instructions (`batch` − `--ephemeral`) per {shn} ≤ {limit:,}",
                               f"{x:+,} Ir ({bw['new']:,} vs {bw['base']:,})", x <= limit))
    if eb:
        for w, shn in (("64", "pipelined"), ("1", "one in flight")):
            bw = eb["windows"].get(w)
            if bw:
                checks.append((f"`--ephemeral` Ir per round trip ≤ bb8fa48's ({shn})",
                               f"{bw['new']:,} vs {bw['base']:,} Ir ({bw['new'] / bw['base']:.3f}x)",
                               bw["new"] <= bw["base"]))
    for mode in ("batch", "none"):
        for sh, shn in (("pipe-c1", "1 client"), ("pipe-c8", "8 clients")):
            b, e = val(mode, sh, "p99_us"), val("ephemeral", sh, "p99_us")
            if b and e:
                checks.append((f"`{mode}` p99 of pipelined work ≤ 1.2x `--ephemeral`'s ({shn})",
                               f"{b / e:.3f}x ({b:,.1f} vs {e:,.1f} µs)", b <= 1.2 * e))
    h = rt_holds.get("batch") or holds.get("batch")
    if h and "longest_hold_us" in h:
        us = h["longest_hold_us"]
        note = "" if h["actions"] >= 1_000_000 else f"; {h['actions']:,} actions, a scaled run"
        if h.get("realtime"):
            w = holds.get("batch", {}).get("longest_hold_us")
            note += f" (fluxd at real-time priority; {w / 1000:.2f} ms without it)" if w else " (fluxd at real-time priority)"
        checks.append(("`batch`: longest loop hold over a 1,000,000-action run ≤ 2 ms",
                       f"{us / 1000:.2f} ms at `{h.get('longest_hold_at') or '?'}`{note}", us <= 2000))
    for a in ("batch", "ephemeral"):
        for b, bn in (("redis", "Redis"), ("nats", "NATS")):
            (x1, t1), (y1, u1) = cpu(a, "pipe-c1"), cpu(b, "pipe-c1")
            (x8, t8), (y8, u8) = cpu(a, "pipe-c8"), cpu(b, "pipe-c8")
            if (x1 and y1) or (t1 and u1):
                checks.append((f"(informative) `{a}` CPU per pipelined round trip / {bn}'s, 1 / 8 clients",
                               f"schedstat {ratio(x1, y1)} / {ratio(x8, y8)}; ticks {ratio(t1, u1)} / {ratio(t8, u8)}",
                               None))
    if checks:
        targets_table(L, 27, checks, ("PASS", "MISS"))
        met = [ok for _, _, ok in checks if ok is not None]
        L.append(f"{sum(met)} of {len(met)} targets met."
                 + (f" A scaled run (`--scale {args.get('scale')}`): fewer round trips per measurement and fewer "
                    "actions before the loop hold is read than the targets are stated for." if scaled else ""))
        L.append("")
    fails = [r for r in res if r.get("label", "").startswith("w10-") and "error" in r]
    if fails:
        L.append("Failed: " + "; ".join(f"{r['label']}: {r['error'][:160]}" for r in fails))
        L.append("")
    return checks


def write(doc, path):
    with open(path, "w") as f:
        f.write(render(doc, os.path.join(os.path.dirname(path), "NOTES.md")))


SECTION = re.compile(r"^## (\d+)\. ")


def sections(text):
    """The numbered `## N. ...` sections of a RESULTS.md: {N: (start line, end line)} (end: the next `## `)."""
    lines = text.split("\n")
    out, current = {}, None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            if current is not None:
                out[current[0]] = (current[1], i)
                current = None
            hit = SECTION.match(line)
            if hit:
                current = (int(hit.group(1)), i)
    if current is not None:
        out[current[0]] = (current[1], len(lines))
    return lines, out


def splice(doc, path, numbers, raw_name):
    """Replaces sections `numbers` of the RESULTS.md at `path` with those of this (partial) run, keeping the others
    as they are; a section not there yet goes before the next higher one (or before the first unnumbered `## `)."""
    new_lines, new = sections(render(doc, None))
    lines, old = sections(open(path).read()) if os.path.exists(path) else ([], {})
    for n in sorted(numbers, reverse=True):
        if n not in new:
            continue
        a, b = new[n]
        body = new_lines[a:b]
        while body and body[-1] == "":
            body.pop()
        note = (f"Generated by `{doc['command']}` (Benchmarks/run.py + report.py) on {doc['date'][:10]} and spliced "
                f"here (the other sections are from their own runs); raw figures in `Benchmarks/{raw_name}`.")
        body = body[:2] + [note, ""] + body[2:] + [""]
        if n in old:
            a, b = old[n]
            lines[a:b] = body
        else:
            later = [old[k][0] for k in old if k > n]
            at = min(later) if later else next((i for i, x in enumerate(lines) if x.startswith("## ")
                                               and not SECTION.match(x) and i > 0), len(lines))
            lines[at:at] = body
        lines, old = sections("\n".join(lines))
    with open(path, "w") as f:
        f.write("\n".join(lines))


def render(doc, notes_path):
    res = legacy_labels(doc["results"])
    m = doc["machine"]
    present = [s for s in ORDER if any(r.get("sys") == s for r in res)]
    L = []
    L.append("# FluxBus benchmark results")
    L.append("")
    L.append("Generated by `" + doc["command"] + "` (Benchmarks/run.py + Benchmarks/report.py); raw figures in "
             "`Benchmarks/results.json`. Do not edit by hand: rerun the command.")
    L.append("")
    L.append(f"- Date: {doc['date']}; whole run {doc['duration_s']} s; scale {doc['args']['scale']} "
             f"(1.0 = the counts below), {doc['args']['reps']} repetitions of workloads 1, 2, 6, 7, 8, 9 and 10 (median shown); "
             f"{doc['args'].get('spin', 0)} busy loop(s) at nice 19 kept the cores awake (`--spin`).")
    L.append(f"- Machine: {m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('mem')}, Linux {m.get('kernel')}, "
             f"load average at the end {' '.join(m.get('load', []))}.")
    v = m.get("versions", {})
    L.append(f"- Peers: {v.get('redis')}; {v.get('mosquitto')}; nats-server {v.get('nats')}; {v.get('dbus')}. "
             f"Load generator and stores: {v.get('gcc')}, -O2.")
    L.append("- Method: one C load generator and one C store program for every system (`Benchmarks/loadgen/`), "
             "pre-encoded frames (the store patches a counter into a template), single-threaded, one write per "
             "connection per loop iteration. Every broker and store is started fresh for each measurement on a "
             "private Unix socket (NATS: 127.0.0.1 TCP, it has no Unix listener) and stopped by pid. Latencies are "
             "exact percentiles of every sample (all samples kept and sorted). The machine has 2 cores shared by "
             "broker, store and generator, and other jobs: compare within one run only; absolute figures move "
             "2-3x between quiet and busy runs.")
    L.append("- Pattern: client -> broker -> store -> broker -> client. The client sends a 100-byte action to "
             "its topic; the store counts it and publishes a 200-byte state on that topic; the round trip ends "
             "when the subscriber has a state whose counter reaches the action. FluxBus: `dispatch` (no settle) "
             "-> `action` -> `done` with state -> `snapshot`. Redis: RESP3 PUBLISH/SUBSCRIBE on one connection. "
             "Mosquitto: QoS 0 PUBLISH/SUBSCRIBE. NATS: PUB/SUB. D-Bus: method call with a byte array, reply "
             "with a byte array (private bus). Floor: `relay.c`, an epoll relay doing only framing and topic "
             "lookup.")
    L.append("- Ratios are FluxBus / other: for latency below 1 is better for FluxBus, for throughput above 1 is.")
    L.append("")

    def rows_for(prefix):
        return {s: pick(res, s, prefix) for s in present}

    # ---- workload 1
    L.append("## 1. Round trip (1 in flight)")
    L.append("")
    L.append("| system | p50 µs | p99 µs | p99.9 µs | round trips/s | broker CPU µs per round trip | FluxBus/this p50 | FluxBus/this p99 |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    w1 = rows_for("w1-rtt")
    fp50, fp99 = med(w1.get("flux", []), "p50_us"), med(w1.get("flux", []), "p99_us")
    n1 = next((r["rounds"] for r in res if r.get("label", "").startswith("w1-") and "rounds" in r), None)
    for s in present:
        rs = w1[s]
        if not rs:
            L.append(f"| {NAMES[s]} | not measured{' (failed)' if failed(res, s, 'w1-') else ''} | | | | | | |")
            continue
        L.append(f"| {NAMES[s]} | {fmt(med(rs, 'p50_us'))} | {fmt(med(rs, 'p99_us'))} | {fmt(med(rs, 'p999_us'))} | "
                 f"{fmt(med(rs, 'rounds_per_s'), 0)} | {fmt(med(rs, 'broker_cpu_us_per_round'), 2)} | "
                 f"{ratio(fp50, med(rs, 'p50_us'))} | {ratio(fp99, med(rs, 'p99_us'))} |")
    L.append("")
    L.append(f"{n1} round trips per repetition after a warm-up.")
    L.append("")

    # ---- workload 2
    L.append("## 2. Pipelined: 64 in flight per client")
    L.append("")
    L.append("| system | 1 client: round trips/s | p99 µs | broker CPU µs per round trip | 8 clients: round trips/s | "
             "snapshots delivered/s | p99 µs | broker CPU µs per round trip | FluxBus/this (1 client) | FluxBus/this (8 clients) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    c1, c8 = rows_for("w2-pipe-c1"), rows_for("w2-pipe-c8")
    f1, f8 = med(c1.get("flux", []), "rounds_per_s"), med(c8.get("flux", []), "rounds_per_s")
    for s in present:
        a, b = c1[s], c8[s]
        if not a and not b:
            L.append(f"| {NAMES[s]} | not measured | | | | | | | | |")
            continue
        L.append(f"| {NAMES[s]} | {fmt(med(a, 'rounds_per_s'), 0)} | {fmt(med(a, 'p99_us'))} | "
                 f"{fmt(med(a, 'broker_cpu_us_per_round'), 2)} | "
                 f"{fmt(med(b, 'rounds_per_s'), 0)} | {fmt(med(b, 'deliveries_per_s'), 0)} | {fmt(med(b, 'p99_us'))} | "
                 f"{fmt(med(b, 'broker_cpu_us_per_round'), 2)} | "
                 f"{ratio(f1, med(a, 'rounds_per_s'))} | {ratio(f8, med(b, 'rounds_per_s'))} |")
    L.append("")
    L.append("Broker CPU = the broker process's user+system CPU time during the measured part / round trips "
             "(from /proc, 10 ms ticks; all threads of the broker, so NATS's several threads count; not measured "
             "for D-Bus). It is the efficiency figure that does not depend on how busy the machine is.")
    L.append("")
    L.append("8 clients: each client has its own topic (FluxBus: its own store; one store process owns all 8). "
             "Latency here includes queueing behind the 63 others in flight.")
    L.append("")
    split_table(L, present, c1, c8)

    # ---- workload 3
    L.append("## 3. Fan-out: a 1 KB state to N subscribers")
    L.append("")
    L.append("Latency = from sending the action until the last subscriber has the state (1 in flight); "
             "deliveries/s = states received by all subscribers with 16 actions in flight.")
    L.append("")
    L.append("| N | system | last subscriber p50 µs | p99 µs | deliveries/s | FluxBus/this p50 | FluxBus/this deliveries |")
    L.append("|---:|---|---:|---:|---:|---:|---:|")
    for n in (1, 10, 100, 1000):
        lat, thr = rows_for(f"w3-fan{n}-lat"), rows_for(f"w3-fan{n}-thr")
        fl, ft = med(lat.get("flux", []), "p50_us"), med(thr.get("flux", []), "deliveries_per_s")
        for s in present:
            if s == "dbus":
                continue
            if not lat[s] and not thr[s]:
                L.append(f"| {n} | {NAMES[s]} | not measured | | | | |")
                continue
            L.append(f"| {n} | {NAMES[s]} | {fmt(med(lat[s], 'p50_us'))} | {fmt(med(lat[s], 'p99_us'))} | "
                     f"{fmt(med(thr[s], 'deliveries_per_s'), 0)} | {ratio(fl, med(lat[s], 'p50_us'))} | "
                     f"{ratio(ft, med(thr[s], 'deliveries_per_s'))} |")
    L.append("")

    # ---- workload 4
    L.append("## 4. Large state: 1 MB (1,000,000 bytes) to 10 subscribers")
    L.append("")
    L.append("| system | delivered MB/s | round p50 ms | broker peak RSS MiB | FluxBus/this MB/s |")
    L.append("|---|---:|---:|---:|---:|")
    w4 = rows_for("w4-1mb")
    fm = med(w4.get("flux", []), "state_mb_per_s")
    for s in present:
        if s == "dbus":
            continue
        rs = w4[s]
        if not rs:
            L.append(f"| {NAMES[s]} | not measured | | | |")
            continue
        hwm = med(rs, "broker_hwm_kb")
        L.append(f"| {NAMES[s]} | {fmt(med(rs, 'state_mb_per_s'))} | {fmt((med(rs, 'p50_us') or 0) / 1000, 2)} | "
                 f"{fmt(hwm / 1024 if hwm else None)} | {ratio(fm, med(rs, 'state_mb_per_s'))} |")
    L.append("")
    L.append("4 rounds in flight; MB/s counts every subscriber's copy. Peak RSS is the broker's VmHWM at the end.")
    L.append("")

    # ---- workload 5
    L.append(f"## 5. {doc['args']['idle']:,} idle connections")
    L.append("")
    L.append("| system | RSS before MiB | RSS with idle MiB | KiB per idle connection | round trip p50 / p99 µs with them | "
             "without them |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for s in present:
        a, b = pick(res, s, "w5-idle"), pick(res, s, "w5-noidle")
        if not a:
            if s in ("relay", "flux", "redis", "nats"):
                L.append(f"| {NAMES[s]} | not measured{' (failed)' if failed(res, s, 'w5') else ''} | | | | |")
            continue
        r = a[0]
        per = (r["broker_rss_idle_kb"] - r["broker_rss_start_kb"]) / max(1, r["idle"]) if r["idle"] else None
        nb = b[0] if b else {}
        L.append(f"| {NAMES[s]} | {fmt(r['broker_rss_start_kb'] / 1024)} | {fmt(r['broker_rss_idle_kb'] / 1024)} | "
                 f"{fmt(per, 2)} | {fmt(r['p50_us'])} / {fmt(r['p99_us'])} | {fmt(nb.get('p50_us'))} / {fmt(nb.get('p99_us'))} |")
    L.append("")
    L.append("Each idle connection completed its handshake (FluxBus: hello/welcome as a client) and stays open "
             "during the round-trip run. Per-connection memory = RSS growth / connections (includes kernel-"
             "invisible allocator slack, excludes socket buffers, which are kernel memory).")
    L.append("")

    # ---- workload 6
    L.append("## 6. Slow subscriber (FluxBus)")
    L.append("")
    base, slow = pick(res, "flux", "w6-base"), pick(res, "flux", "w6-slow")
    L.append("One extra connection subscribes to all 8 stores of workload 2 (8 clients, 64 in flight) and never "
             "reads.")
    L.append("")
    L.append("| run | round trips/s | p99 µs | fluxd RSS at end MiB | fluxd peak RSS MiB |")
    L.append("|---|---:|---:|---:|---:|")
    for name, rs in (("without the slow subscriber", base), ("with the slow subscriber", slow)):
        if not rs:
            L.append(f"| {name} | not measured | | | |")
            continue
        L.append(f"| {name} | {fmt(med(rs, 'rounds_per_s'), 0)} | {fmt(med(rs, 'p99_us'))} | "
                 f"{fmt((med(rs, 'broker_rss_end_kb') or 0) / 1024)} | {fmt((med(rs, 'broker_hwm_kb') or 0) / 1024)} |")
    if base and slow:
        L.append("")
        L.append(f"Slow/base: throughput {ratio(med(slow, 'rounds_per_s'), med(base, 'rounds_per_s'))}, "
                 f"p99 {ratio(med(slow, 'p99_us'), med(base, 'p99_us'))} (target: within 10%).")
    L.append("")

    # ---- workload 7
    c_rtt, sdk_rtt = pick(res, "flux", "w7-c-rtt"), pick(res, "flux", "w7-sdk-rtt")
    c_pipe, sdk_pipe = pick(res, "flux", "w7-c-pipe"), pick(res, "flux", "w7-sdk-pipe")
    if c_rtt or sdk_rtt:
        L.append("## 7. The Swift SDK store's cost (FluxBus)")
        L.append("")
        L.append("Workloads 1 and 2 (1 client) through fluxd, once with the C store of every other row (pre-encoded "
                 "frames) and once with `flux-bench-store`, the same store written with the Swift SDK (`FluxStore`, "
                 "a Codable state, Foundation's JSON). CPU and memory here are the store process's.")
        L.append("")
        L.append("| store | round trip p50 µs | p99 µs | store CPU µs per round trip | pipelined round trips/s | "
                 "store CPU µs per round trip | store peak RSS MiB |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for name, a, b in (("C store (pre-encoded frames)", c_rtt, c_pipe),
                           ("Swift SDK store (FluxStore)", sdk_rtt, sdk_pipe)):
            L.append(f"| {name} | {fmt(med(a, 'p50_us'))} | {fmt(med(a, 'p99_us'))} | "
                     f"{fmt(med(a, 'broker_cpu_us_per_round'), 2)} | {fmt(med(b, 'rounds_per_s'), 0)} | "
                     f"{fmt(med(b, 'broker_cpu_us_per_round'), 2)} | {fmt((med(b, 'broker_hwm_kb') or 0) / 1024)} |")
        L.append("")
        L.append(f"SDK/C: round trip p50 {ratio(med(sdk_rtt, 'p50_us'), med(c_rtt, 'p50_us'))}, pipelined "
                 f"throughput {ratio(med(sdk_pipe, 'rounds_per_s'), med(c_pipe, 'rounds_per_s'))}.")
        L.append("")

    large_state_section(L, res, doc)
    durability_section(L, res, doc)
    durable_speed_section(L, res, doc)

    # ---- targets
    L.append("## Targets (issue 6), checked against this run")
    L.append("")
    relay1 = med(w1.get("relay", []), "p50_us")
    redis1 = med(w1.get("redis", []), "p50_us")
    checks = []
    if fp50 and relay1:
        checks.append(("Round trip p50 ≤ 1.2x the floor", f"{fp50 / relay1:.2f}x", fp50 <= 1.2 * relay1))
    if fp50 and redis1:
        checks.append(("Round trip p50 below Redis pub/sub", f"{fp50:.1f} vs {redis1:.1f} µs", fp50 < redis1))
    r1, n1r = med(c1.get("redis", []), "rounds_per_s"), med(c1.get("nats", []), "rounds_per_s")
    if f1 and r1:
        checks.append(("Pipelined ≥ 2x Redis (1 client)", f"{f1 / r1:.2f}x", f1 >= 2 * r1))
    if f1 and n1r:
        checks.append(("Pipelined ≥ 1.5x NATS (1 client)", f"{f1 / n1r:.2f}x", f1 >= 1.5 * n1r))
    lat1000 = rows_for("w3-fan1000-lat")
    ff, rf = med(lat1000.get("flux", []), "p50_us"), med(lat1000.get("relay", []), "p50_us")
    if ff and rf:
        checks.append(("Fan-out to 1000: last one within 1.5x the floor", f"{ff / rf:.2f}x", ff <= 1.5 * rf))
    fi = pick(res, "flux", "w5-idle")
    if fi and fi[0].get("idle"):
        per = (fi[0]["broker_rss_idle_kb"] - fi[0]["broker_rss_start_kb"]) / fi[0]["idle"]
        checks.append(("fluxd memory per idle connection < 16 KiB", f"{per:.2f} KiB", per < 16))
    if base and slow:
        tr = med(slow, "rounds_per_s") / med(base, "rounds_per_s")
        pr = med(slow, "p99_us") / med(base, "p99_us")
        checks.append(("Slow subscriber: throughput and p99 within 10%", f"{tr:.2f}x / {pr:.2f}x",
                       tr >= 0.9 and pr <= 1.1))
        checks.append(("Slow subscriber: fluxd peak RSS bounded", f"{(med(slow, 'broker_hwm_kb') or 0) / 1024:.1f} MiB "
                       f"vs {(med(base, 'broker_hwm_kb') or 0) / 1024:.1f} MiB", None))
    L.append("| target | measured | met |")
    L.append("|---|---:|:---:|")
    for name, val, ok in checks:
        L.append(f"| {name} | {val} | {'yes' if ok else ('no' if ok is not None else 'see text')} |")
    L.append("")
    errs = [r for r in res if "error" in r]
    if errs:
        L.append("## Runs that failed")
        L.append("")
        for r in errs:
            L.append(f"- {r.get('sys')} {r.get('label')}: {r.get('error')}")
        L.append("")
    if notes_path and os.path.exists(notes_path):
        L.append(open(notes_path).read().rstrip())
        L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    argv = sys.argv[1:]
    if argv[:1] == ["--splice"]:
        # report.py --splice N[,N] FILE: rewrites only sections N of RESULTS.md from FILE (a run with --only N)
        src = argv[2]
        splice(json.load(open(src)), os.path.join(here, "RESULTS.md"), [int(x) for x in argv[1].split(",")],
               os.path.basename(src))
    else:
        src = argv[0] if argv else os.path.join(here, "results.json")
        write(json.load(open(src)), os.path.join(here, "RESULTS.md"))
