#!/usr/bin/env python3
"""FluxBus benchmark driver: runs every workload against fluxd, the bare-relay floor and the peer brokers, in one
run, and writes Benchmarks/RESULTS.md (plus the raw figures in Benchmarks/results.json).

Run through scripts/bench.sh (it installs the peers, builds a release fluxd and raises the fd limit).
Every broker runs on a private Unix socket (NATS: 127.0.0.1) under a temporary directory, is started fresh for
each measurement (so no state carries over) and is stopped by its pid.
"""
import argparse
import asyncio
import json
import os
import platform
import re
import resource
import select
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOADGEN = os.path.join(HERE, "loadgen")


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Proc:
    """A child process whose stdout we read for a ready line; stopped by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, argv, ready=None, wait_path=None, wait_tcp=None, timeout=15, env=None):
        self.argv = argv
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                  start_new_session=True)
        self.lines = []
        deadline = time.time() + timeout
        if ready:
            buf = b""
            while ready.encode() not in buf:
                left = deadline - time.time()
                if left <= 0 or self.p.poll() is not None:
                    err = self.p.stderr.read() if self.p.poll() is not None else b""
                    self.stop()
                    raise RuntimeError(f"{argv[0]} not ready: {buf!r} {err[-300:]!r}")
                r, _, _ = select.select([self.p.stdout], [], [], left)
                if r:
                    chunk = os.read(self.p.stdout.fileno(), 4096)
                    if not chunk:
                        continue
                    buf += chunk
            self.lines = buf.decode(errors="replace").splitlines()
        # Keep draining both pipes: a broker that logs every connection (Mosquitto) blocks once a pipe is full.
        self.tail = []
        for f in (self.p.stdout, self.p.stderr):
            threading.Thread(target=self._drain, args=(f,), daemon=True).start()
        if wait_path or wait_tcp:
            while True:
                try:
                    if wait_path:
                        s = socket.socket(socket.AF_UNIX)
                        s.connect(wait_path)
                    else:
                        s = socket.create_connection(wait_tcp, timeout=1)
                    s.close()
                    break
                except OSError:
                    if time.time() > deadline or self.p.poll() is not None:
                        self.stop()
                        raise RuntimeError(f"{argv[0]} did not listen")
                    time.sleep(0.02)

    def _drain(self, f):
        try:
            for line in iter(f.readline, b""):
                self.tail = (self.tail + [line])[-20:]
        except (OSError, ValueError):
            pass

    @property
    def pid(self):
        return self.p.pid

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)


def records_end(path, size):
    """Where a journal segment's records end: the file's last non-zero byte (the zeros after it are reserved)."""
    try:
        with open(path, "rb") as f:
            end = size
            while end > 0:
                start = max(0, end - (1 << 20))
                f.seek(start)
                chunk = f.read(end - start).rstrip(b"\0")
                if chunk:
                    return start + len(chunk)
                end = start
            return 0
    except OSError:
        return size


def data_bytes(d):
    """What a broker keeps in data directory `d`: `journal` = the apparent size of fluxd's journal segments
    (journal-*.fjl) or of Redis's AOF files (appendonlydir/), `checkpoints` = fluxd's checkpoint-*.fjc, `allocated`
    = the blocks of every file (du: includes the space fluxd reserves ahead of its writes with fallocate)."""
    out = {"journal": 0, "checkpoints": 0, "allocated": 0, "segments": 0}
    for root, _, files in os.walk(d):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if name.endswith(".manifest"):  # Redis 7: "file appendonly.aof.N.base.rdb seq N type b": N-1 rewrites
                try:
                    for line in open(os.path.join(root, name)):
                        f = line.split()
                        if "type" in f and f[f.index("type") + 1] == "b":
                            out["aof_rewrites"] = int(f[f.index("seq") + 1]) - 1
                except (OSError, ValueError, IndexError):
                    pass
            out["allocated"] += st.st_blocks * 512
            if name.startswith("journal-") and name.endswith(".fjl"):
                # Records only: fluxd keeps zeros reserved past them (docs/journal.md), which are not journal.
                out["journal"] += records_end(os.path.join(root, name), st.st_size)
                out["segments"] += 1
            elif root.endswith("appendonlydir"):
                out["journal"] += st.st_size
                out["segments"] += 1
            elif name.startswith("checkpoint-") and name.endswith(".fjc"):
                out["checkpoints"] += st.st_size
    return out


def disk_info(path):
    """The file system the run's temporary directory is on (where the data directories of workload 9 live)."""
    try:
        out = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", path], capture_output=True,
                             text=True, timeout=5).stdout.split()
        info = {"source": out[0], "fstype": out[1], "options": out[2]}
    except Exception:
        return {}
    try:
        dev = os.path.basename(os.path.realpath(info["source"]))
        base = dev
        while base and not os.path.exists(f"/sys/block/{base}"):
            base = base[:-1]
        q = f"/sys/block/{base}/queue"
        info["rotational"] = open(f"{q}/rotational").read().strip()
        info["write_cache"] = open(f"{q}/write_cache").read().strip()
    except (OSError, IndexError):
        pass
    return info


def fdatasync_probe(d, n):
    """The disk's own sync latency: n times a 1-byte append + fdatasync (as Benchmarks/storage measures it), in µs."""
    path = os.path.join(d, "sync-probe")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter_ns()
            os.write(fd, b"x")
            os.fdatasync(fd)
            lat.append((time.perf_counter_ns() - t) / 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return {"samples": n, "p50_us": round(lat[len(lat) // 2], 1), "p99_us": round(lat[int((n - 1) * 0.99)], 1),
            "mean_us": round(sum(lat) / n, 1), "max_us": round(lat[-1], 1)}


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="fluxbus-bench-")
        self.bin = os.path.join(self.tmp, "bin")
        os.makedirs(self.bin)
        self.results = []
        self.fluxd = args.fluxd
        self.sdk_store = args.sdk_store or os.path.join(os.path.dirname(os.path.abspath(args.fluxd)), "flux-bench-store")
        self.large_bench = args.large_bench or os.path.join(os.path.dirname(os.path.abspath(args.fluxd)),
                                                            "flux-large-state-bench")
        self.nats_port = 14222 + os.getpid() % 1000
        self.dirs = 0  # data directories made (workload 9), each fresh
        # Workload 10's "before" fluxd (bb8fa48: no journal, no --ephemeral) and its arguments (none by default).
        self.base_fluxd = os.path.abspath(args.base_fluxd) if args.base_fluxd else None
        self.base_args = shlex.split(args.base_args)
        self.disk = disk_info(self.tmp)

    # ---------------------------------------------------------------- build
    def build(self):
        cc = ["gcc", "-O2", "-Wall"]
        subprocess.check_call(cc + ["-o", f"{self.bin}/relay", f"{LOADGEN}/relay.c"])
        subprocess.check_call(cc + ["-o", f"{self.bin}/fluxbench", f"{LOADGEN}/fluxbench.c"])
        dbus = subprocess.run(["pkg-config", "--cflags", "--libs", "dbus-1"], capture_output=True, text=True)
        if dbus.returncode == 0:
            subprocess.check_call(cc + ["-o", f"{self.bin}/dbusbench", f"{LOADGEN}/dbusbench.c"] + dbus.stdout.split())

    def have(self, system):
        need = {"relay": None, "flux": None, "redis": "redis-server", "mqtt": "mosquitto", "nats": "nats-server",
                "dbus": "dbus-daemon"}[system]
        if system == "dbus" and not os.path.exists(f"{self.bin}/dbusbench"):
            return False
        return need is None or shutil.which(need) is not None or os.path.exists(f"/usr/sbin/{need}")

    # ---------------------------------------------------------------- brokers
    def fresh_dir(self, name):
        """A new, empty directory under the run's temporary directory (same disk as /tmp), mode 0700."""
        self.dirs += 1
        d = f"{self.tmp}/{name}-{self.dirs}"
        os.makedirs(d, mode=0o700)
        return d

    def start_broker(self, system, durability=None):
        """Starts `system` on a private socket. `durability` (workload 9): for fluxd `ephemeral` (the default) or
        `none`/`batch`/`always` on a fresh --data-dir; for Redis `everysec`/`always` (appendonly yes, the AOF in a
        fresh directory). For fluxd, `base` (workload 10) starts the --base-fluxd executable with --base-args only
        (bb8fa48 has no journal; XDG_STATE_HOME points at a fresh directory, so a newer fluxd given as the base
        journals there, not in the home directory). The broker's data directory, if any, is `proc.data_dir`."""
        t = self.tmp
        if system == "relay":
            path = f"{t}/relay.sock"
            return Proc([f"{self.bin}/relay", path], ready="relay ready"), path
        if system == "flux" and durability == "base":
            path = f"{t}/fluxd-base.sock"
            state = self.fresh_dir("fluxd-base-state")
            p = Proc([self.base_fluxd, "--socket", path] + self.base_args + ["--log-level", "warning"],
                     ready="fluxd ready", env=dict(os.environ, XDG_STATE_HOME=state))
            p.data_dir = state
            return p, path
        if system == "flux":
            path = f"{t}/fluxd.sock"
            data = None
            if durability in (None, "ephemeral"):
                mode = ["--ephemeral"]
            else:
                data = self.fresh_dir(f"fluxd-{durability}")
                mode = ["--data-dir", data, "--durability", durability]
            p = Proc([self.fluxd, "--socket", path] + mode + ["--log-level", "warning"], ready="fluxd ready")
            p.data_dir = data
            return p, path
        if system == "redis":
            path = f"{t}/redis.sock"
            exe = shutil.which("redis-server")
            d, aof = t, ["--appendonly", "no"]
            if durability:
                d = self.fresh_dir(f"redis-{durability}")
                aof = ["--appendonly", "yes", "--appendfsync", durability]
            p = Proc([exe, "--port", "0", "--unixsocket", path, "--unixsocketperm", "700", "--save", ""] + aof +
                     ["--maxclients", "20000", "--loglevel", "warning", "--dir", d], wait_path=path)
            p.data_dir = d if durability else None
            return p, path
        if system == "mqtt":
            path = f"{t}/mqtt.sock"
            conf = f"{t}/mosquitto.conf"
            with open(conf, "w") as f:
                # `user`: stay the invoking user (as root Mosquitto would switch to `mosquitto` and could not
                # create its socket in our private directory).
                import pwd
                me = pwd.getpwuid(os.getuid()).pw_name
                f.write(f"listener 0 {path}\nallow_anonymous true\nmax_connections -1\nuser {me}\n")
            exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
            return Proc([exe, "-c", conf], wait_path=path), path
        if system == "nats":
            exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
            port = self.nats_port
            return Proc([exe, "-a", "127.0.0.1", "-p", str(port)], wait_tcp=("127.0.0.1", port)), \
                f"tcp:127.0.0.1:{port}"
        if system == "dbus":
            path = f"{t}/dbus.sock"
            conf = f"{t}/dbus.conf"
            with open(conf, "w") as f:
                f.write(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:path={path}</listen><auth>EXTERNAL</auth>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
<allow own="*"/></policy></busconfig>
""")
            return Proc(["dbus-daemon", "--config-file", conf, "--nofork", "--print-address"],
                        ready="unix:"), f"unix:path={path}"
        raise ValueError(system)

    def run(self, system, label, clients=1, subs=0, window=1, count=10000, warmup=1000, state=200, idle=0,
            slow=False, extra_store=None, sdk_store=False, cpu_of_store=False, durability=None, sched=False):
        """Starts the broker and the store fresh, runs the client, stops both. Returns the figures.

        `sdk_store`: FluxBus with the Swift SDK store instead of the C one. `cpu_of_store`: the CPU and memory
        figures (`broker_*` in the client's output) are the store process's instead of the broker's.
        `durability` (workload 9): see `start_broker`; Redis then also writes (`fluxbench --redis-write`), and the
        bytes the broker wrote to its data directory are recorded (`journal_bytes`, per action). `sched` (workload
        10): also the broker's CPU from schedstat (ns, every thread) over the whole client run, warm-up included,
        per round trip (`broker_sched_us_per_round`): the 10 ms ticks of `broker_cpu_us_per_round` are a few dozen
        per pipelined run."""
        broker = store = None
        write = ["--redis-write"] if system == "redis" and durability else []
        try:
            broker, addr = self.start_broker(system, durability)
            topics = max(clients, 1)
            if system == "dbus":
                store = Proc([f"{self.bin}/dbusbench", "service", "--addr", addr], ready="service ready")
                cmd = [f"{self.bin}/dbusbench", "client", "--addr", addr, "--clients", str(clients),
                       "--window", str(window), "--count", str(count), "--warmup", str(warmup), "--label", label]
            else:
                if sdk_store:
                    store = Proc([self.sdk_store, "--socket", addr, "--topics", str(topics), "--state", str(state)],
                                 ready="store ready")
                else:
                    store = Proc([f"{self.bin}/fluxbench", "store", "--sys", system, "--addr", addr, "--topics",
                                  str(topics), "--state", str(state)] + write, ready="store ready")
                cmd = [f"{self.bin}/fluxbench", "client", "--sys", system, "--addr", addr,
                       "--clients", str(clients), "--subs", str(subs), "--window", str(window),
                       "--count", str(count), "--warmup", str(warmup), "--state", str(state),
                       "--idle", str(idle), "--rss-pid", str(store.pid if cpu_of_store else broker.pid),
                       "--store-pid", str(store.pid),
                       "--label", label,
                       "--timeout", str(self.args.run_timeout)] + write
                if slow:
                    cmd.append("--slow")
            t0 = time.time()
            ns0 = proc_cpu_ns(broker.pid) if sched else None
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.run_timeout + 30)
            ns1 = proc_cpu_ns(broker.pid) if sched else None
            line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
            r = json.loads(line)
            if out.returncode != 0 or "error" in r:
                log(f"{system} {label}: FAILED rc={out.returncode} {out.stderr.strip()[:300]}")
                r = {"error": r.get("error", f"rc {out.returncode}")}
            elif ns0 is not None and ns1 is not None:
                r["broker_sched_us_per_round"] = round((ns1 - ns0) / 1000 / (max(clients, 1) * (count + warmup)), 3)
            r.update({"sys": system, "label": label, "wall": round(time.time() - t0, 2)})
            if durability:
                r["durability"] = durability
            if getattr(broker, "data_dir", None) and "error" not in r:
                # Measured before the broker stops (a clean fluxd stop adds a checkpoint): what the run wrote.
                b = data_bytes(broker.data_dir)
                r["actions"] = clients * (count + warmup)
                r["journal_bytes"] = b["journal"]
                r["data_bytes_allocated"] = b["allocated"]
                r["journal_bytes_per_action"] = round(b["journal"] / r["actions"], 1)
                if "aof_rewrites" in b:
                    r["aof_rewrites"] = b["aof_rewrites"]
            if "p50_us" in r:
                log(f"{system:6} {label:28} p50 {r['p50_us']:9.1f} us  p99 {r['p99_us']:9.1f} us  "
                    f"{r['rounds_per_s']:11.0f} rt/s  {r['deliveries_per_s']:11.0f} deliv/s")
            self.results.append(r)
            return r
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            log(f"{system} {label}: FAILED {e}")
            r = {"sys": system, "label": label, "error": str(e)[:200]}
            self.results.append(r)
            return r
        finally:
            if store:
                store.stop()
            if broker:
                broker.stop()
                if getattr(broker, "data_dir", None):
                    shutil.rmtree(broker.data_dir, ignore_errors=True)

    # ---------------------------------------------------------------- workloads
    def workloads(self):
        a = self.args
        s = a.scale
        systems = [x for x in ["relay", "flux", "redis", "mqtt", "nats", "dbus"] if self.have(x)]
        skipped = [x for x in ["redis", "mqtt", "nats", "dbus"] if x not in systems]
        if skipped:
            log(f"not installed, skipped: {skipped}")
        only = set(a.only.split(",")) if a.only else None

        def want(w):
            return only is None or w in only

        n1 = max(1000, int(100_000 * s))
        # 1. round trip, repeated and interleaved across systems (medians over repetitions)
        if want("1"):
            for rep in range(a.reps):
                for sysn in systems:
                    self.run(sysn, f"w1-rtt-rep{rep}", count=n1, warmup=max(200, n1 // 20))
        # 2. pipelined, 64 in flight, 1 and 8 clients
        if want("2"):
            for rep in range(a.reps):
                for sysn in systems:
                    c1 = max(2000, int(200_000 * s)) if sysn != "dbus" else max(2000, int(50_000 * s))
                    self.run(sysn, f"w2-pipe-c1-rep{rep}", clients=1, window=64, count=c1, warmup=c1 // 10)
                    c8 = max(500, int(50_000 * s)) if sysn != "dbus" else max(500, int(10_000 * s))
                    self.run(sysn, f"w2-pipe-c8-rep{rep}", clients=8, window=64, count=c8, warmup=c8 // 10)
        # 3. fan-out 1 KB to N subscribers: latency to the last one (window 1), sustained deliveries (window 16)
        if want("3"):
            fan = [x for x in systems if x != "dbus"]
            for n, cnt in ((1, 20000), (10, 10000), (100, 2000), (1000, 300)):
                cnt = max(50, int(cnt * s))
                for sysn in fan:
                    self.run(sysn, f"w3-fan{n}-lat", subs=n, window=1, count=cnt, warmup=max(10, cnt // 10),
                             state=1024)
                    self.run(sysn, f"w3-fan{n}-thr", subs=n, window=16, count=cnt * 2, warmup=max(10, cnt // 10),
                             state=1024)
        # 4. 1 MB state to 10 subscribers
        if want("4"):
            for sysn in [x for x in systems if x != "dbus"]:
                self.run(sysn, "w4-1mb-10subs", subs=10, window=4, count=max(20, int(300 * s)), warmup=10,
                         state=1_000_000)
        # 5. 10,000 idle connections: memory per connection, and workload 1 meanwhile
        if want("5"):
            for sysn in [x for x in ["relay", "flux", "redis", "nats"] if x in systems]:
                n5 = max(1000, int(20_000 * s))
                self.run(sysn, "w5-idle10k-rtt", idle=a.idle, count=n5, warmup=n5 // 10)
                self.run(sysn, "w5-noidle-rtt", idle=0, count=n5, warmup=n5 // 10)
        # 6. slow subscriber during workload 2 (8 clients): fluxd only (the property is fluxd's)
        if want("6"):
            c8 = max(500, int(50_000 * s))
            for rep in range(a.reps):
                self.run("flux", f"w6-base-rep{rep}", clients=8, window=64, count=c8, warmup=c8 // 10)
                self.run("flux", f"w6-slow-rep{rep}", clients=8, window=64, count=c8, warmup=c8 // 10, slow=True)

        # 7. the Swift SDK store's cost: workloads 1 and 2 (1 client) through fluxd with the C store and with the
        # Swift SDK store, the store process's CPU measured (repeated and interleaved)
        if want("7"):
            if not os.path.exists(self.sdk_store):
                log(f"no {self.sdk_store}: workload 7 skipped")
            else:
                n7, p7 = max(1000, int(20_000 * s)), max(2000, int(100_000 * s))
                for rep in range(a.reps):
                    for kind in ("c", "sdk"):
                        self.run("flux", f"w7-{kind}-rtt-rep{rep}", count=n7, warmup=max(200, n7 // 10),
                                 sdk_store=kind == "sdk", cpu_of_store=True)
                        self.run("flux", f"w7-{kind}-pipe-rep{rep}", window=64, count=p7, warmup=p7 // 10,
                                 sdk_store=kind == "sdk", cpu_of_store=True)

        # 8. large states (issue 16): a store holding 10,000 todos, each action toggles one, 10 subscribers, in
        # Swift, Python and Node, whole states (before SPEC §16) vs patches and deltas (after)
        if want("8"):
            self.large_state()

        # 9. durability (issue 15): workloads 1 and 2 through fluxd ephemeral / none / batch / always and Redis
        # with a durable write per message (AOF everysec / always), the disk's own fdatasync latency in the same
        # run, then restart time and journal bytes with 1,000,000 journaled actions over 100 stores
        if want("9"):
            self.durability()

        # 10. the durable default against the dispatcher before durability (issue 27): workloads 1 and 2 through
        # fluxd built from bb8fa48, fluxd --ephemeral / none / batch / always, Redis pub/sub and NATS; callgrind Ir
        # per round trip; the longest loop hold over 1,000,000 actions
        if want("10"):
            self.durable_speed()

    # ---------------------------------------------------------------- workload 8: large states (issue 16)
    def large_langs(self):
        """The store and client command lines of workload 8 per language, and how its driver addresses the store:
        (action type, first todo id). Swift: `flux-large-state-bench` (next to fluxd, or --large-bench); Python:
        examples/python/bench_large_state.py; Node: examples/node/bench-large-state.mjs."""
        a = self.args
        py = os.path.join(ROOT, "examples", "python", "bench_large_state.py")
        js = os.path.join(ROOT, "examples", "node", "bench-large-state.mjs")
        node = shutil.which("node")
        langs = {}
        if os.path.exists(self.large_bench):
            def swift(role, sock, mode, actions):
                argv = [self.large_bench, role, "--socket", sock, "--todos", str(a.large_todos)]
                if role == "client":
                    argv += ["--actions", str(actions)]
                return argv + (["--full"] if mode == "full" else [])
            langs["swift"] = (swift, lambda mode: "todo/toggle", 1)
        else:
            log(f"no {self.large_bench}: workload 8 without Swift")

        def python(role, sock, mode, actions):
            return [sys.executable, py, "--socket", sock, "--role", role, "--mode", "full" if mode == "full" else "patch",
                    "--todos", str(a.large_todos), "--actions", str(actions)]
        langs["python"] = (python, lambda mode: f"bigtodos-{'full' if mode == 'full' else 'patch'}/toggle", 1)
        if node:
            def nodejs(role, sock, mode, actions):
                argv = [node, js, "--role", role, "--socket", sock, "--todos", str(a.large_todos)]
                if role == "store":
                    return argv + ["--mode", "full" if mode == "full" else "patch", "--actions", str(actions)]
                return argv + ["--deltas", "false" if mode == "full" else "true", "--changes", str(actions)]
            langs["node"] = (nodejs, lambda mode: "todo/toggle", 0)
        else:
            log("no node: workload 8 without Node")
        return langs

    def large_state(self):
        """Workload 8 (issue 16): per language and mode (`full`: whole states and whole snapshots, as before SPEC §16;
        `deltas`: patches and delta subscriptions), a fresh fluxd, the store seeded with --large-todos todos, 10
        subscribers of the same language reading the toggled todo after each change, and a driver (this process,
        the Python library) dispatching toggles one at a time, each settled before the next. Repeated (--reps),
        the modes interleaved."""
        a, s = self.args, self.args.scale
        langs = self.large_langs()
        if a.large_langs:
            langs = {k: v for k, v in langs.items() if k in a.large_langs.split(",")}
        counts = {"full": max(10, int(a.large_actions_full * s)), "deltas": max(50, int(a.large_actions * s))}
        log(f"workload 8: {a.large_todos:,} todos, {a.large_subscribers} subscribers, {counts['full']} actions "
            f"(full) / {counts['deltas']} (deltas), languages {list(langs)}")
        # Window 1 (one action in flight, each settled before the next: before and after under the same load) and,
        # deltas only, --large-window actions in flight (fluxd and the processes share wake-ups between actions).
        windows = [w for w in (1, a.large_window) if w >= 1]
        windows = sorted(set(windows))
        for rep in range(a.reps):
            for lang, spec in langs.items():
                for mode in (("full", "deltas") if rep % 2 == 0 else ("deltas", "full")):
                    self.large_run(lang, spec, mode, counts[mode], f"w8-{lang}-{mode}-rep{rep}")
                    if mode == "deltas" and lang in a.large_window_langs.split(","):
                        for w in windows:
                            if w > 1:
                                self.large_run(lang, spec, mode, counts[mode], f"w8-{lang}-{mode}-w{w}-rep{rep}",
                                               window=w)

    def large_run(self, lang, spec, mode, actions, label, window=1):
        a = self.args
        argv_of, type_of, first_id = spec
        rec = {"sys": "large", "lang": lang, "mode": mode, "label": label, "todos": a.large_todos,
               "subscribers": a.large_subscribers, "actions": actions, "window": window}
        broker = store = None
        clients = []
        sock = f"{self.tmp}/fluxd-large.sock"
        deadline = a.run_timeout * 3
        try:
            broker = Proc([self.fluxd, "--socket", sock, "--ephemeral", "--max-frame", str(16 << 20),
                           "--log-level", "warning"], ready="fluxd ready")
            store = JsonProc(argv_of("store", sock, mode, actions), f"{lang} store")
            store.expect(lambda m: m.get("ready"), 120)
            clients = [JsonProc(argv_of("client", sock, mode, actions), f"{lang} client")
                       for _ in range(a.large_subscribers)]
            ready = [c.expect(lambda m: m.get("ready"), 120) for c in clients]
            rec["first_state_ms_start"] = statistics.median(first_state_ms(m) for m in ready)
            rec["store_registered_bytes"] = store.first.get("registered_bytes_sent")

            sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
            from fluxbus import Client
            kind = type_of(mode)
            if window == 1:
                driver = Client.connect(sock, name="bench-driver", timeout=60, reconnect=False)
                cpu0, ns0, t0 = proc_cpu_split(broker.pid), proc_cpu_ns(broker.pid), time.perf_counter()
                rejected = 0
                try:
                    for n in range(actions):
                        st = driver.dispatch_and_settle(kind, {"id": n % a.large_todos + first_id}, timeout=120)
                        rejected += sum(1 for r in st.results if r.status != "done")
                finally:
                    t1 = time.perf_counter()
                    driver.close()
            else:
                cpu0, ns0, t0, t1, rejected = asyncio.run(
                    large_pipelined(sock, broker.pid, kind, actions, window, a.large_todos, first_id))
            rec["actions_per_s"] = round(actions / (t1 - t0), 1)
            rec["rejected"] = rejected
            if lang == "swift":
                store.p.stdin.close()  # the Swift store reports when its standard input ends
            sr = store.expect(lambda m: "ready" not in m, deadline)
            crs = [c.expect(lambda m: "ready" not in m, deadline) for c in clients]
            cpu1, ns1 = proc_cpu_split(broker.pid), proc_cpu_ns(broker.pid)
            tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
            rec["fluxd_cpu_us_per_action"] = round((sum(cpu1) - sum(cpu0)) * tick_us / actions, 1)
            rec["fluxd_user_us_per_action"] = round((cpu1[0] - cpu0[0]) * tick_us / actions, 1)
            rec["fluxd_system_us_per_action"] = round((cpu1[1] - cpu0[1]) * tick_us / actions, 1)
            if ns0 is not None and ns1 is not None:
                rec["fluxd_schedstat_us_per_action"] = round((ns1 - ns0) / 1000 / actions, 1)
            rec["seconds_until_subscribers_done"] = round(time.perf_counter() - t0, 3)
            rec["fluxd_hwm_kb"] = hwm_kb(broker.pid)
            rec["store"] = sr
            rec["clients"] = crs
            rec["store_cpu_us_per_action"] = pick_num(sr, "cpu_us_per_action", "store_cpu_us_per_action",
                                                      "cpuUsPerAction")
            per = [client_figures(m) for m in crs]
            for k in ("cpu_us_per_change", "cpu_us_per_version", "bytes_per_version", "bytes_per_change", "changes", "versions"):
                vals = [p[k] for p in per if p.get(k) is not None]
                rec[f"sub_{k}"] = round(statistics.mean(vals), 1) if vals else None
            rec["sub_consistent"] = all(m.get("consistent", True) for m in crs)
            # A new subscriber after the changes: the time from its subscribe to the whole state decoded.
            late = JsonProc(argv_of("client", sock, mode, 0), f"{lang} late client")
            clients.append(late)
            rec["first_state_ms_after"] = first_state_ms(late.expect(lambda m: m.get("ready"), 120))
            late.expect(lambda m: "ready" not in m, 60)
            log(f"{lang:6} {mode:6} w{window:<2} {actions:5} actions {rec['actions_per_s']:8.1f}/s  store "
                f"{fmt_num(rec['store_cpu_us_per_action'])} us/action  subscriber {fmt_num(rec['sub_cpu_us_per_change'])}"
                f" us/change {fmt_num(rec['sub_bytes_per_version'])} B/change  fluxd "
                f"{rec['fluxd_cpu_us_per_action']} us/action (user {rec['fluxd_user_us_per_action']}, system "
                f"{rec['fluxd_system_us_per_action']})  new subscriber {rec['first_state_ms_after']} ms")
        except (RuntimeError, OSError, ValueError, KeyError, TimeoutError) as e:
            log(f"{lang} {label}: FAILED {e}")
            rec["error"] = str(e)[:300]
        except Exception as e:  # the Python library's own errors (fluxbus.FluxError ...)
            log(f"{lang} {label}: FAILED {type(e).__name__}: {e}")
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            for c in clients:
                c.stop()
            if store:
                store.stop()
            if broker:
                broker.stop()
        self.results.append(rec)
        return rec

    def durability(self):
        a, s = self.args, self.args.scale
        # The two that sync every commit run next to each other, in alternating order (and, for workload 1,
        # between two disk probes): a shared disk's sync latency can drift several times within minutes.
        combos = [("flux", m) for m in ("ephemeral", "none", "batch")]
        synced = [("flux", "always")]
        if self.have("redis"):
            combos += [("redis", "everysec")]
            synced += [("redis", "always")]
        # Workload 1 with two syncs per round trip (always) takes 2-3x the disk's sync latency per round trip:
        # 10,000 of them stay within a minute up to ~2.5 ms per sync.
        n1 = max(1000, int(10_000 * s))
        c1, c8 = max(2000, int(200_000 * s)), max(500, int(50_000 * s))
        probes = max(250, int(3000 * s) // max(1, 2 * a.reps))
        log(f"workload 9 on {self.disk.get('source', '?')} ({self.disk.get('fstype', '?')}) under {self.tmp}")

        def probe(rep, when):
            r = fdatasync_probe(self.tmp, probes)
            r.update({"sys": "disk", "label": f"w9-fdatasync-rep{rep}-{when}"})
            log(f"disk   fdatasync of 1 byte ({when:6}) p50 {r['p50_us']:9.1f} us  p99 {r['p99_us']:9.1f} us")
            self.results.append(r)

        for rep in range(a.reps):
            pair = synced if rep % 2 == 0 else synced[::-1]
            for sysn, mode in combos:
                self.run(sysn, f"w9-{mode}-rtt-rep{rep}", count=n1, warmup=max(200, n1 // 20), durability=mode)
            probe(rep, "before")
            for sysn, mode in pair:
                self.run(sysn, f"w9-{mode}-rtt-rep{rep}", count=n1, warmup=max(200, n1 // 20), durability=mode)
            probe(rep, "after")
            for sysn, mode in combos + pair:
                self.run(sysn, f"w9-{mode}-pipe-c1-rep{rep}", window=64, count=c1, warmup=c1 // 10,
                         durability=mode)
            for sysn, mode in combos + pair:
                self.run(sysn, f"w9-{mode}-pipe-c8-rep{rep}", clients=8, window=64, count=c8, warmup=c8 // 10,
                         durability=mode)
        self.restart()

    def feed(self, sock, clients, per, broker, store, label):
        """Feeds a running fluxd `clients` x `per` actions (64 in flight per client, no warm-up) through the
        fluxbench store `store`; returns fluxbench's figures, raises RuntimeError when the feed failed."""
        timeout = max(self.args.run_timeout, 600)
        cmd = [f"{self.bin}/fluxbench", "client", "--sys", "flux", "--addr", sock, "--clients", str(clients),
               "--window", "64", "--count", str(per), "--warmup", "0", "--rss-pid", str(broker.pid),
               "--store-pid", str(store.pid), "--label", label, "--timeout", str(timeout)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
        feed = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {"error": out.stderr[-200:]}
        if out.returncode != 0 or "error" in feed:
            raise RuntimeError(f"feed failed: rc {out.returncode} {out.stderr.strip()[-200:]}")
        return feed

    def restart(self):
        """A durable fluxd (batch) fed `--restart-actions` actions over 100 stores (100 clients, one store process
        owning the 100 stores, 64 in flight per client), then restarted on the same data directory after SIGKILL
        (the last checkpoint + the segments after it are read) and after SIGTERM (a clean stop writes a checkpoint
        of everything): the time from exec to "fluxd ready on", the journal's own log lines, and the journal's
        bytes per action."""
        a = self.args
        stores = 100
        per = max(1, int(a.restart_actions * a.scale) // stores)
        actions = per * stores
        data = self.fresh_dir("fluxd-restart")
        sock = f"{self.tmp}/fluxd-restart.sock"
        argv = [self.fluxd, "--socket", sock, "--data-dir", data, "--durability", "batch", "--log-level", "notice"]
        rec = {"sys": "flux", "label": "w9-restart", "actions": actions, "stores": stores, "restarts": []}

        def start(kind):
            t0 = time.perf_counter()
            p = Proc(argv, ready="fluxd ready", timeout=120)
            ms = (time.perf_counter() - t0) * 1000
            notes = []
            deadline = time.time() + 2
            while time.time() < deadline:  # the journal's notes are logged to stderr before the ready line
                notes = [x.decode(errors="replace").strip() for x in p.tail if b"journal:" in x]
                if any("journal: read" in x for x in notes):
                    break
                time.sleep(0.02)
            notes = [x.split("journal: ", 1)[1] for x in notes]
            row = {"kind": kind, "ready_ms": round(ms, 1), "notes": notes, "rss_kb": rss_kb(p.pid)}
            rec["restarts"].append(row)
            log(f"fluxd  restart {kind:22} ready in {ms:8.1f} ms  {' / '.join(notes)[:160]}")
            return p

        broker = store = None
        try:
            broker = start("empty data directory")
            before = data_bytes(data)
            store = Proc([f"{self.bin}/fluxbench", "store", "--sys", "flux", "--addr", sock, "--topics", str(stores)],
                         ready="store ready")
            log(f"feeding {actions:,} actions over {stores} stores")
            feed = self.feed(sock, stores, per, broker, store, "w9-feed")
            rec["feed_rounds_per_s"] = feed["rounds_per_s"]
            rec["feed_secs"] = feed["secs"]
            after = data_bytes(data)
            rec["journal_bytes"] = after["journal"] - before["journal"]
            rec["segments"] = after["segments"]
            rec["checkpoint_bytes"] = after["checkpoints"]
            rec["data_bytes_allocated"] = after["allocated"]
            rec["journal_bytes_per_action"] = round(rec["journal_bytes"] / actions, 1)
            log(f"fed {actions:,} actions at {feed['rounds_per_s']:,.0f}/s: journal {rec['journal_bytes']:,} bytes "
                f"in {after['segments']} segment(s), {rec['journal_bytes_per_action']} bytes per action")
            store.stop()
            store = None
            for _ in range(a.reps):
                broker.p.kill()  # SIGKILL: no checkpoint on the way out
                broker.p.wait()
                broker = start("after SIGKILL")
            for _ in range(a.reps):
                t0 = time.perf_counter()
                broker.stop()  # SIGTERM: a clean stop syncs and writes a checkpoint of everything
                rec.setdefault("stop_ms", []).append(round((time.perf_counter() - t0) * 1000, 1))
                broker = start("after SIGTERM")
            rec["after_checkpoint"] = data_bytes(data)
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
            log(f"restart: FAILED {e}")
            rec["error"] = str(e)[:200]
        finally:
            if store:
                store.stop()
            if broker:
                broker.stop()
            shutil.rmtree(data, ignore_errors=True)
        self.results.append(rec)

    # ---------------------------------------------------------------- workload 10: the durable default (issue 27)
    W10_ROWS = [("bb8fa48", "flux", "base"), ("ephemeral", "flux", "ephemeral"), ("none", "flux", "none"),
                ("batch", "flux", "batch"), ("always", "flux", "always"), ("redis", "redis", None),
                ("nats", "nats", None)]

    def durable_speed(self):
        """Workload 10 (issue 27): workloads 1 (1 in flight) and 2 (64 in flight x 1 and x 8 clients) through every
        row of W10_ROWS, in one run: per repetition each shape through every row in turn (the order reversed every
        other repetition), so drift hits all rows alike; then the longest loop hold over --hold-actions actions
        (batch and --ephemeral) and callgrind's Ir per round trip (bb8fa48, --ephemeral, batch)."""
        a, s = self.args, self.args.scale
        rows = []
        for key, sysn, mode in self.W10_ROWS:
            if mode == "base" and not (self.base_fluxd and os.path.exists(self.base_fluxd)):
                log(f"workload 10: no base fluxd ({self.base_fluxd or 'give --base-fluxd'}): the bb8fa48 row is skipped")
                continue
            if not self.have(sysn):
                log(f"workload 10: {sysn} not installed, its row is skipped")
                continue
            rows.append((key, sysn, mode))
        if self.base_fluxd and os.path.exists(self.base_fluxd):
            self.base_facts()
        n1 = max(1000, int(100_000 * s))
        n1_always = max(1000, int(10_000 * s))  # two syncs per round trip: as workload 9
        c1, c8 = max(2000, int(200_000 * s)), max(500, int(50_000 * s))
        log(f"workload 10: rows {[k for k, _, _ in rows]}, {a.reps} repetitions, data directories on "
            f"{self.disk.get('source', '?')} ({self.disk.get('fstype', '?')})")
        for rep in range(a.reps):
            order = rows if rep % 2 == 0 else rows[::-1]
            for key, sysn, mode in order:
                n = n1_always if key == "always" else n1
                self.run(sysn, f"w10-{key}-rtt-rep{rep}", count=n, warmup=max(200, n // 20), durability=mode,
                         sched=True)
            for key, sysn, mode in order:
                self.run(sysn, f"w10-{key}-pipe-c1-rep{rep}", window=64, count=c1, warmup=c1 // 10, durability=mode,
                         sched=True)
            for key, sysn, mode in order:
                self.run(sysn, f"w10-{key}-pipe-c8-rep{rep}", clients=8, window=64, count=c8, warmup=c8 // 10,
                         durability=mode, sched=True)
        for mode in ("batch", "ephemeral"):
            self.loop_hold(mode)
        # The same feeds with fluxd at real-time priority (SCHED_FIFO, every thread): the 10 other processes on
        # the 2 cores (clients, store, spinner) cannot preempt it inside a callback, so the hold is fluxd's own work.
        if os.geteuid() == 0 and shutil.which("chrt"):
            for mode in ("batch", "ephemeral"):
                self.loop_hold(mode, realtime=True)
        else:
            log("workload 10: not root or no chrt: the loop holds at real-time priority are skipped")
        self.callgrind_w10()

    def base_facts(self):
        """What the base fluxd is: whether its --help has --ephemeral (bb8fa48's has not) and its size."""
        rec = {"sys": "meta", "label": "w10-base", "base_fluxd": self.base_fluxd, "base_args": self.base_args}
        try:
            out = subprocess.run([self.base_fluxd, "--help"], capture_output=True, text=True, timeout=10)
            rec["has_ephemeral"] = "--ephemeral" in out.stdout + out.stderr
            rec["has_data_dir"] = "--data-dir" in out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            rec["error"] = str(e)[:200]
        if rec.get("has_ephemeral"):
            log(f"workload 10: {self.base_fluxd} has --ephemeral, so it is newer than bb8fa48 (started with "
                f"{self.base_args or 'no durability arguments'}: its default)")
        self.results.append(rec)

    def loop_hold(self, mode, realtime=False):
        """A fresh fluxd (`batch` on a fresh data directory, or `ephemeral`) fed --hold-actions x --scale actions
        (8 clients x 64 in flight, one fluxbench store owning the 8 stores), then asked for `info`:
        `load.longestLoopHoldMicros` (the longest one callback held the event loop since fluxd started) and
        `load.longestLoopHoldAt`, before the feed and after it. `realtime`: fluxd (every thread) runs SCHED_FIFO
        priority 1 (`chrt -a -f -p 1`), so no other process preempts it inside a callback."""
        a = self.args
        clients = 8
        per = max(1, int(a.hold_actions * a.scale) // clients)
        actions = per * clients
        rec = {"sys": "flux", "label": f"w10-hold{'-rt' if realtime else ''}-{mode}", "durability": mode,
               "actions": actions, "clients": clients, "window": 64, "realtime": realtime}
        broker = store = None
        try:
            broker, sock = self.start_broker("flux", mode)
            if realtime:
                subprocess.run(["chrt", "-a", "-f", "-p", "1", str(broker.pid)], check=True, capture_output=True)
            before = flux_info(sock)
            rec["hold_before_us"] = before.get("load", {}).get("longestLoopHoldMicros")
            rec["hold_before_at"] = before.get("load", {}).get("longestLoopHoldAt")
            store = Proc([f"{self.bin}/fluxbench", "store", "--sys", "flux", "--addr", sock, "--topics",
                          str(clients)], ready="store ready")
            log(f"workload 10: feeding {actions:,} actions to a {mode} fluxd for its longest loop hold")
            feed = self.feed(sock, clients, per, broker, store, rec["label"])
            after = flux_info(sock)
            load = after.get("load", {})
            if "longestLoopHoldMicros" not in load:
                raise RuntimeError(f"no load.longestLoopHoldMicros in fluxd's info reply ({sorted(load)})")
            rec.update({"feed_rounds_per_s": feed["rounds_per_s"], "feed_secs": feed["secs"],
                        "feed_p99_us": feed.get("p99_us"), "longest_hold_us": load["longestLoopHoldMicros"],
                        "longest_hold_at": load.get("longestLoopHoldAt"), "load": load})
            log(f"fluxd  {mode + (' (SCHED_FIFO)' if realtime else ''):9} {actions:,} actions at {feed['rounds_per_s']:,.0f}/s: longest loop hold "
                f"{rec['longest_hold_us']} us at {rec['longest_hold_at']} (before the feed {rec['hold_before_us']} us)")
        except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
            log(f"workload 10 loop hold {mode}: FAILED {e}")
            rec["error"] = str(e)[:200]
        finally:
            if store:
                store.stop()
            if broker:
                broker.stop()
                if getattr(broker, "data_dir", None):
                    shutil.rmtree(broker.data_dir, ignore_errors=True)
        self.results.append(rec)

    CG_LINE = re.compile(r"window (\d+): base (\d+) Ir/round trip, new (\d+) Ir/round trip")

    def callgrind_w10(self):
        """fluxd's instructions per round trip (Benchmarks/callgrind-ab.sh, workload 2's pipelined 64 in flight and
        workload 1's one in flight, 1 client): two runs, bb8fa48 against --ephemeral, then --ephemeral
        (BASE_ARGS) against batch on a fresh data directory: every figure of the table in 8 measurements, and
        each comparison the targets make within one run."""
        a = self.args
        rounds = max(2000, int(a.cg_rounds * a.scale))
        script = os.path.join(HERE, "callgrind-ab.sh")
        missing = [x for x in ("valgrind", "callgrind_control", "callgrind_annotate", "objcopy") if not shutil.which(x)]
        if missing:
            log(f"workload 10: {', '.join(missing)} not installed: callgrind figures skipped")
            self.results.append({"sys": "callgrind", "label": "w10-callgrind", "skipped": f"no {', '.join(missing)}"})
            return
        runs = []
        if self.base_fluxd and os.path.exists(self.base_fluxd):
            runs.append(("bb8fa48", "ephemeral", self.base_fluxd, " ".join(shlex.quote(x) for x in self.base_args), []))
        else:
            log("workload 10: no base fluxd: callgrind runs --ephemeral against batch only")
        runs.append(("ephemeral", "batch", self.fluxd, "--ephemeral",
                     ["--", "--data-dir", "DATA", "--durability", "batch"]))
        for base_key, new_key, base, base_args, extra in runs:
            argv = [script, base, self.fluxd, str(rounds)] + extra
            shown = (f"BASE_ARGS={shlex.quote(base_args)} " if base_args else "") + \
                "Benchmarks/callgrind-ab.sh " + " ".join(shlex.quote(x) for x in [base, self.fluxd, str(rounds)] + extra)
            rec = {"sys": "callgrind", "label": f"w10-callgrind-{base_key}-{new_key}", "base": base_key,
                   "new": new_key, "rounds": rounds, "command": shown, "windows": {}}
            log(f"workload 10: callgrind {base_key} against {new_key}, {rounds:,} round trips per measurement")
            t0 = time.time()
            try:
                # XDG_STATE_HOME: a base newer than bb8fa48 (durable by default) journals in the run's directory.
                out = subprocess.run(argv, capture_output=True, text=True, timeout=3600, start_new_session=True,
                                     env=dict(os.environ, BASE_ARGS=base_args,
                                              XDG_STATE_HOME=self.fresh_dir("callgrind-state")))
                for line in out.stdout.splitlines():
                    hit = self.CG_LINE.search(line)
                    if hit:
                        rec["windows"][hit.group(1)] = {"base": int(hit.group(2)), "new": int(hit.group(3))}
                        log(f"callgrind {line.strip()}")
                if out.returncode != 0 or len(rec["windows"]) < 2:
                    raise RuntimeError(f"rc {out.returncode}: {(out.stderr.strip() or out.stdout.strip())[-300:]}")
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                log(f"workload 10 callgrind {base_key} against {new_key}: FAILED {e}")
                rec["error"] = str(e)[:300]
            rec["wall"] = round(time.time() - t0, 1)
            self.results.append(rec)

    def cleanup(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class JsonProc:
    """A benchmark role printing one JSON object per line on stdout; `expect` waits (with a deadline) for a line
    matching a predicate. stderr is kept (last lines) for error messages. Stopped by pid."""

    def __init__(self, argv, name):
        import queue
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        self.lines = queue.Queue()
        self.err = []
        self.first = {}
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self):
        for line in iter(self.p.stdout.readline, b""):
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                pass
        self.lines.put(None)

    def _drain(self):
        for line in iter(self.p.stderr.readline, b""):
            self.err = (self.err + [line.decode(errors="replace").rstrip()])[-5:]

    def expect(self, pred, timeout):
        import queue
        end = time.time() + timeout
        while True:
            try:
                m = self.lines.get(timeout=max(0.01, end - time.time()))
            except queue.Empty:
                raise TimeoutError(f"{self.name}: nothing after {timeout} s ({' / '.join(self.err)})")
            if m is None:
                self.lines.put(None)
                raise RuntimeError(f"{self.name} ended (exit {self.p.poll()}): {' / '.join(self.err)}")
            if m.get("ready") and not self.first:
                self.first = m
            if pred(m):
                return m

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def pick_num(m, *keys):
    for k in keys:
        if m.get(k) is not None:
            return m[k]
    return None


def first_state_ms(m):
    return pick_num(m, "first_state_ms", "firstStateMs")


def client_figures(m):
    """One subscriber's figures whatever its language named them: CPU per change received, bytes received per
    version the store made (per action) and per change received, changes received, versions advanced."""
    changes = pick_num(m, "changes") or 0
    versions = pick_num(m, "versions") or 0
    total = pick_num(m, "bytes_received", "bytesReceived")
    if total is None and pick_num(m, "bytes_per_change") is not None:
        total = m["bytes_per_change"] * max(changes, 1)
    cpu = pick_num(m, "cpu_us_per_change", "subscriber_cpu_us_per_change", "cpuUsPerChange")
    return {"cpu_us_per_change": cpu,
            # its CPU over the span per version the store made (per action), however many states it was handed
            "cpu_us_per_version": cpu * max(changes, 1) / versions if cpu is not None and versions else None,
            "bytes_per_version": total / versions if total is not None and versions else None,
            "bytes_per_change": total / changes if total is not None and changes else None,
            "changes": changes, "versions": versions}


def fmt_num(v):
    return "—" if v is None else f"{v:,.1f}"


def flux_info(path, timeout=30):
    """fluxd's `info` reply (protocol/SPEC.md §8.7) over a new client connection on socket `path`: 4-byte
    big-endian length + JSON per frame, `hello` first."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    buf = b""

    def send(m):
        body = json.dumps(m).encode()
        s.sendall(struct.pack(">I", len(body)) + body)

    def recv():
        nonlocal buf
        while True:
            if len(buf) >= 4:
                n = struct.unpack(">I", buf[:4])[0]
                if len(buf) >= 4 + n:
                    m, buf = json.loads(buf[4:4 + n]), buf[4 + n:]
                    return m
            chunk = s.recv(1 << 16)
            if not chunk:
                raise RuntimeError("fluxd closed the info connection")
            buf += chunk
    try:
        s.connect(path)
        send({"op": "hello", "protocol": 1, "role": "client", "name": "bench-info"})
        w = recv()
        if w.get("op") != "welcome":
            raise RuntimeError(f"no welcome: {str(w)[:200]}")
        send({"op": "info", "id": "bench-info"})
        while True:
            m = recv()
            if m.get("op") == "info":
                return m
            if m.get("op") == "error":
                raise RuntimeError(f"info: {str(m)[:200]}")
    finally:
        s.close()


def proc_cpu_ticks(pid):
    """utime + stime of a process (all its threads), in clock ticks, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_cpu_split(pid):
    """(utime, stime) of a process (all its threads), in clock ticks, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


async def large_pipelined(sock, broker_pid, kind, actions, window, todos, first_id):
    """Workload 8's driver with `window` actions in flight (asyncio client of the Python library): dispatches and
    settles `actions` toggles, starting the next as soon as one settles. Returns (fluxd (utime, stime) at the
    start, fluxd schedstat ns at the start, t0, t1, rejected)."""
    from fluxbus import AsyncClient
    driver = await AsyncClient.connect(sock, name="bench-driver", timeout=60, reconnect=False)
    rejected = 0
    nxt = 0

    async def lane():
        nonlocal rejected, nxt
        while nxt < actions:
            n = nxt
            nxt += 1
            st = await driver.dispatch_and_settle(kind, {"id": n % todos + first_id}, timeout=120)
            rejected += sum(1 for r in st.results if r.status != "done")

    cpu0, ns0, t0 = proc_cpu_split(broker_pid), proc_cpu_ns(broker_pid), time.perf_counter()
    try:
        await asyncio.gather(*(lane() for _ in range(window)))
    finally:
        t1 = time.perf_counter()
        await driver.close()
    return cpu0, ns0, t0, t1, rejected


def proc_cpu_ns(pid):
    """The CPU time of every thread of a process in ns (/proc/PID/task/*/schedstat, first field), or None."""
    try:
        total = 0
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        return total
    except (OSError, ValueError, IndexError):
        return None


def hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def machine_info():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cores"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            info["mem"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    info["kernel"] = platform.release()
    try:
        info["load"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass

    def ver(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except Exception:
            return "not installed"
    info["versions"] = {
        "redis": ver(["redis-server", "--version"]),
        "mosquitto": ver(["/usr/sbin/mosquitto", "-h"]),
        "nats": ver(["/usr/sbin/nats-server", "--version"]),
        "dbus": ver(["dbus-daemon", "--version"]),
        "gcc": ver(["gcc", "--version"]),
    }
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fluxd", required=True, help="release fluxd executable")
    ap.add_argument("--sdk-store", default=None,
                    help="release flux-bench-store executable (the Swift SDK store of workload 7; default: next to "
                         "fluxd; workload 7 is skipped when there is none)")
    ap.add_argument("--large-bench", default=None,
                    help="release flux-large-state-bench executable (the Swift roles of workload 8; default: next to "
                         "fluxd; workload 8 runs without Swift when there is none)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every count (0.1 for a quick run)")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions of workloads 1, 2, 6, 7, 8, 9 and 10 (medians reported)")
    ap.add_argument("--idle", type=int, default=10000, help="idle connections in workload 5")
    ap.add_argument("--spin", type=int, default=1, help="busy loops at nice 19 keeping cores awake (0 = quiet)")
    ap.add_argument("--only", default="",
                    help="comma-separated workload numbers to run (default all): 1 round trip, 2 pipelined, 3 fan-out, "
                         "4 a 1 MB state, 5 idle connections, 6 slow subscriber, 7 the Swift SDK store, 8 large states "
                         "(issue 16), 9 durability (issue 15), 10 the durable default against bb8fa48, the dispatcher "
                         "before durability (issue 27: needs --base-fluxd)")
    ap.add_argument("--base-fluxd", default=None,
                    help="workload 10: a release fluxd built from commit bb8fa48 (scripts/bench.sh builds it into "
                         ".build-bench-base; BASE_FLUXD=PATH there); without it the bb8fa48 row is skipped")
    ap.add_argument("--base-args", default="",
                    help="workload 10: the base fluxd's arguments besides --socket and --log-level (default none: "
                         "bb8fa48 has no --ephemeral and no journal)")
    ap.add_argument("--cg-rounds", type=int, default=20000,
                    help="workload 10: round trips per callgrind measurement (times --scale, at least 2000)")
    ap.add_argument("--hold-actions", type=int, default=1_000_000,
                    help="workload 10: actions fed (8 clients x 64 in flight) before reading fluxd's longest loop "
                         "hold (times --scale)")
    ap.add_argument("--restart-actions", type=int, default=1_000_000,
                    help="workload 9: actions journaled (over 100 stores) before the restarts (times --scale)")
    ap.add_argument("--large-window", type=int, default=16,
                    help="workload 8: also run deltas with this many actions in flight (1: only one at a time)")
    ap.add_argument("--large-window-langs", default="swift",
                    help="workload 8: comma-separated languages that also run the pipelined variant (default swift)")
    ap.add_argument("--large-todos", type=int, default=10_000, help="workload 8: todos in the store's state")
    ap.add_argument("--large-subscribers", type=int, default=10, help="workload 8: subscribers")
    ap.add_argument("--large-langs", default="", help="workload 8: comma-separated languages (default swift,python,node)")
    ap.add_argument("--large-actions", type=int, default=2000,
                    help="workload 8: toggles dispatched with deltas (times --scale)")
    ap.add_argument("--large-actions-full", type=int, default=100,
                    help="workload 8: toggles dispatched with whole states (times --scale)")
    ap.add_argument("--run-timeout", type=float, default=120)
    ap.add_argument("--out", default=None,
                    help="raw figures (default results.json; with --only 8 results-large-state.json, with --only 9 "
                         "results-durability.json, with --only 10 results-durable-speed.json, with another --only "
                         "results-partial.json)")
    ap.add_argument("--command", default="scripts/bench.sh")
    args = ap.parse_args()
    if args.out is None:
        name = {"": "results.json", "8": "results-large-state.json", "9": "results-durability.json",
                "10": "results-durable-speed.json"}.get(args.only, "results-partial.json")
        args.out = os.path.join(HERE, name)

    # SIGTERM ends the run through the `finally` blocks: brokers, stores and busy loops are stopped by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.idle + 2000:
        log(f"fd limit {hard} is too low for {args.idle} idle connections; using {max(0, hard - 2000)}")
        args.idle = max(0, hard - 2000)

    b = Bench(args)
    started = time.time()
    # Idle cores wake slowly (tens of µs), which makes round-trip latency on a quiet machine mostly wake-up time
    # and very noisy. --spin N runs N busy loops at nice 19: the cores stay awake, and the benchmark processes
    # (nice 0) preempt them at once. The reference figures were taken with another job on one core.
    spinners = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"],
                                 start_new_session=True) for _ in range(args.spin)]
    try:
        b.build()
        b.workloads()
    finally:
        for sp in spinners:
            sp.kill()
            sp.wait()
        b.cleanup()
    doc = {"machine": machine_info(), "disk": b.disk, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(args),
           "command": args.command, "duration_s": round(time.time() - started, 1), "results": b.results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    log(f"wrote {args.out} in {doc['duration_s']} s")
    import report
    if args.only:
        # Some workloads only: their sections replace the same sections of RESULTS.md, the others stay.
        report.splice(doc, os.path.join(HERE, "RESULTS.md"), [int(x) for x in args.only.split(",")],
                      os.path.basename(args.out))
    else:
        report.write(doc, os.path.join(HERE, "RESULTS.md"))


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
