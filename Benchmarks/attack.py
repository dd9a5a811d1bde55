#!/usr/bin/env python3
"""FluxBus attack benchmark (issue 13): each attack of docs/limits.md against a release fluxd, with a well-behaved
client doing 100 settled round trips per second beside it. Writes Benchmarks/ATTACKS.md.

Run through scripts/attack-bench.sh (it builds fluxd, flux-bench-store and todo-store in release and raises the
open-file limit). Python 3 standard library only, raw sockets, Unix sockets only.

For each attack: a fresh fluxd on a socket in a temporary directory, flux-bench-store (store b0), and the
well-behaved client in its own process (so the attacker's Python threads do not share its interpreter lock). The
client dispatches b0/act with settle:true every 10 ms and records each round trip (send -> settled) with its
monotonic send time; the driver measures 5 s without the attack (baseline), then the attack (during: from its
start to its end, at least 5 s), reads fluxd's `info` (memory, load) on a connection opened before the attack and
/proc/PID/status (VmRSS before, VmHWM after), and stops everything by pid.

The attacks of issue 24 (6a-11: patches, path subscriptions, restarts, a large store registering again, canonically
equivalent keys) run against a durable fluxd (--data-dir in the temporary folder) whose socket other users may use,
and, when the driver runs as root, connect as other uids than the well-behaved client (see connect_as). They
tolerate whatever fluxd answers (an error, a closed connection, no answer: reported as frozen after
--freeze-timeout), and an attack that stops or restarts fluxd takes the after-attack figures just before.

    python3 Benchmarks/attack.py --fluxd F --bench-store B --todo-store T [--scale N] [--only 1,4a] [--out FILE]
        [--freeze-timeout S] [--attack-cap S] [--restart-timeout S] [--rss-cap-mib N] [--note TEXT]
"""
import argparse
import json
import math
import os
import platform
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.request
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PERIOD = 0.01  # the well-behaved client's interval: 100 round trips/s
OP_RE = re.compile(rb'"op":"([^"]*)"')
SEQ_RE = re.compile(rb'"seq":(\d+)')
CODE_RE = re.compile(rb'"code":"([^"]*)"')
KIND_RE = re.compile(rb'"kind":"([^"]*)"')
STORE_RE = re.compile(rb'"store":"([^"]*)"')


def log(msg):
    print(f"[attack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now():
    return time.monotonic()


def enc(obj):
    body = obj if isinstance(obj, (bytes, bytearray)) else json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


def op_of(body):
    m = OP_RE.search(body, 0, 200)
    return m.group(1).decode() if m else "?"


def code_of(body):
    m = CODE_RE.search(body)
    return m.group(1).decode() if m else "?"


def tally(d, key, n=1):
    d[key] = d.get(key, 0) + n


class Refused(Exception):
    def __init__(self, code, body=b""):
        super().__init__(code)
        self.code = code
        self.body = body


class Peer:
    """A raw FluxBus connection: frames out with sendall, frames in reassembled from recv."""

    def __init__(self, path, timeout=10.0, uid=None):
        if uid is None:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.settimeout(timeout)
            self.s.connect(path)
        else:
            self.s = connect_as(uid, path, timeout)
            self.s.settimeout(timeout)
        self.uid = uid
        self.buf = bytearray()
        self.pos = 0
        self.bytes_in = 0

    def fileno(self):
        return self.s.fileno()

    def send(self, data):
        self.s.sendall(data)

    def _take(self):
        avail = len(self.buf) - self.pos
        if avail >= 4:
            n = struct.unpack_from(">I", self.buf, self.pos)[0]
            if avail >= 4 + n:
                body = bytes(self.buf[self.pos + 4:self.pos + 4 + n])
                self.pos += 4 + n
                if self.pos > (1 << 20) and self.pos * 2 > len(self.buf):
                    del self.buf[:self.pos]
                    self.pos = 0
                return body
        return None

    def frame(self, timeout=10.0):
        """The next frame body; None at EOF (or reset); raises socket.timeout."""
        deadline = now() + timeout
        while True:
            body = self._take()
            if body is not None:
                return body
            left = deadline - now()
            if left <= 0:
                raise socket.timeout("no frame")
            self.s.settimeout(left)
            try:
                chunk = self.s.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not chunk:
                return None
            self.bytes_in += len(chunk)
            self.buf += chunk

    def until(self, pred, timeout=10.0, what="frame"):
        deadline = now() + timeout
        while True:
            body = self.frame(max(0.001, deadline - now()))
            if body is None:
                raise EOFError(f"EOF while waiting for {what}")
            if pred(body):
                return body

    def hello(self, role="client", name="peer", heartbeat=False, timeout=10.0, session=None):
        h = {"op": "hello", "protocol": 1, "role": role, "name": name}
        if heartbeat:
            h["heartbeat"] = True
        if session:
            h["session"] = session
        try:
            self.send(enc(h))
        except OSError:
            pass  # refused at connect: fluxd's error is still there to read
        body = self.frame(timeout)
        if body is None:
            raise Refused("eof")
        if op_of(body) != "welcome":
            raise Refused(code_of(body), body)
        return json.loads(body)

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def ready_peer(path, role="client", name="peer", uid=None, **kw):
    p = Peer(path, uid=uid)
    try:
        p.hello(role, name, **kw)
    except BaseException:
        p.close()
        raise
    return p


# The attacks of issue 24 run their attacker as another user than the well-behaved client (fluxd's own user), so
# that fluxd's per-uid limits (memoryPerUser, maxConnectionsPerUser) are what stands between them. As root the
# driver connects as these uids (SO_PEERCRED records the uid of the process that called connect: a forked child
# switches uid, connects, and hands the connected socket back); otherwise every peer is the driver's own uid.
UID_ATTACKER = 4242
UID_OTHER = 4343
UID_THIRD = 4444


def other_users():
    return os.geteuid() == 0


def as_user(uid):
    """The uid to connect as: `uid` when the driver runs as root, else None (its own)."""
    return uid if other_users() else None


def connect_as(uid, path, timeout=10.0):
    """A Unix socket connected to `path` by a child process running as `uid` (gid `uid`, no groups)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (the driver has threads)
        code = 1
        try:
            a.close()
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(timeout)
            c.connect(path)
            socket.send_fds(b, [b"k"], [c.fileno()])
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            try:
                b.sendall(b"E" + f"{type(e).__name__}: {e}".encode()[:500])
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)
    b.close()
    try:
        a.settimeout(timeout + 5)
        msg, fds, _, _ = socket.recv_fds(a, 1024, 1)
    finally:
        a.close()
        os.waitpid(pid, 0)
    if not fds:
        text = msg[1:].decode(errors="replace") if msg else "no socket"
        if "ConnectionRefused" in text:
            raise ConnectionRefusedError(text)
        if "FileNotFound" in text:
            raise FileNotFoundError(text)
        raise OSError(f"connect as uid {uid}: {text}")
    return socket.socket(fileno=fds[0])


def send_until(sock, data, deadline):
    """Writes data on a non-blocking socket until done or the deadline; returns (bytes sent, error or None)."""
    view = memoryview(data)
    sent = 0
    while sent < len(view):
        left = deadline - now()
        if left <= 0:
            return sent, None
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_WRITE)
        ready = sel.select(min(left, 0.5))
        sel.close()
        if not ready:
            continue
        try:
            sent += sock.send(view[sent:])
        except BlockingIOError:
            continue
        except OSError as e:
            return sent, e
    return sent, None


def drain_codes(sock, seconds):
    """Reads what fluxd sent a connection that never read (up to `seconds`): ops and error codes, and whether it
    ended (EOF/reset)."""
    sock.setblocking(False)
    buf = bytearray()
    pos = 0
    ops, codes = {}, {}
    ended = False
    deadline = now() + seconds
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while now() < deadline:
        if not sel.select(min(0.2, max(0.0, deadline - now()))):
            break  # nothing more for 200 ms
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            continue
        except OSError:
            ended = True
            break
        if not chunk:
            ended = True
            break
        buf += chunk
        while len(buf) - pos >= 4:
            n = struct.unpack_from(">I", buf, pos)[0]
            if len(buf) - pos < 4 + n:
                break
            head = bytes(buf[pos + 4:pos + 4 + min(n, 400)])
            op = op_of(head)
            tally(ops, op)
            if op == "error":
                tally(codes, code_of(head))
            pos += 4 + n
        if pos > (1 << 22):
            del buf[:pos]
            pos = 0
    sel.close()
    return ops, codes, ended


# --------------------------------------------------------------------------------------------------- processes

class Proc:
    """A child process whose stdout is read for a ready line; stderr to a file; stopped by pid."""

    def __init__(self, argv, ready, logfile, timeout=30, user=None):
        self.argv = argv
        self.err = open(logfile, "wb")
        extra = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err, start_new_session=True, **extra)
        self.started = now()
        if ready is None:  # not waited for (a fluxd whose start is timed by its socket)
            self.ready_output = b""
            threading.Thread(target=self._drain, daemon=True).start()
            return
        buf = b""
        deadline = now() + timeout
        while ready.encode() not in buf:
            left = deadline - now()
            if left <= 0 or self.p.poll() is not None:
                self.stop()
                raise RuntimeError(f"{argv[0]} not ready: {buf[-300:]!r} (log {logfile})")
            sel = selectors.DefaultSelector()
            sel.register(self.p.stdout, selectors.EVENT_READ)
            if sel.select(left):
                chunk = os.read(self.p.stdout.fileno(), 4096)
                buf += chunk
            sel.close()
        self.ready_output = buf
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        try:
            while os.read(self.p.stdout.fileno(), 65536):
                pass
        except (OSError, ValueError):
            pass

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def send_signal(self, sig):
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, sig)
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=5)
            except ProcessLookupError:
                pass
        self.err.close()


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "Threads", "FDSize"):
                    out[k] = int(v.split()[0]) if k.startswith("Vm") else int(v.split()[0])
    except OSError:
        pass
    return out


def proc_cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# --------------------------------------------------------------------------------------------- well-behaved

def well_behaved_main(path, outfile, period):
    """The well-behaved client (its own process): one settled dispatch of b0/act every `period` s, each line of
    `outfile` `send_time latency_s status` (status ok, or what went wrong)."""
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    out = open(outfile, "w", buffering=1 << 16)
    p = ready_peer(path, name="well-behaved")
    print("well-behaved ready", flush=True)
    n = 0
    next_t = now()
    last_flush = now()
    while not stop[0]:
        t = now()
        if t < next_t:
            time.sleep(next_t - t)
            continue
        next_t = max(next_t + period, now())  # no catching up in bursts after a slow round trip
        n += 1
        rid = f"wb{n}"
        t0 = now()
        status = "ok"
        try:
            p.send(enc(b'{"op":"dispatch","id":"%s","type":"b0/act","payload":{},"settle":true}' % rid.encode()))
            ref = rid.encode()
            while True:
                body = p.frame(10.0)
                if body is None:
                    status = "eof"
                    break
                op = op_of(body)
                if op == "settled" and (b'"id":"%s"' % ref) in body:
                    m = json.loads(body)
                    bad = [r for r in m.get("results", []) if r.get("status") != "done"]
                    if bad or not m.get("results"):
                        status = "settled-" + (bad[0].get("status", "?") if bad else "empty")
                    break
                if op == "error":
                    status = "error-" + code_of(body)
                    break
        except socket.timeout:
            status = "timeout"
        except OSError as e:
            status = "oserror-" + type(e).__name__
        lat = now() - t0
        out.write(f"{t0:.6f} {lat:.6f} {status}\n")
        if status in ("eof",) or status.startswith("oserror"):
            out.flush()
            try:
                p.close()
                p = ready_peer(path, name="well-behaved")
            except Exception as e:  # noqa: BLE001 - recorded, retried after a pause
                out.write(f"{now():.6f} 0 reconnect-failed-{type(e).__name__}\n")
                time.sleep(0.5)
        if now() - last_flush > 0.5:
            out.flush()
            last_flush = now()
    out.flush()
    out.close()


def query_store_main(path, deltas, outfile):
    """The store `qs` of attack 2 (its own process): registers, then reads everything, writing a summary (frames
    by op, bytes, largest frame, time of the last frame, whether fluxd closed it) to `outfile` every 0.2 s and at
    the end."""
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    p = ready_peer(path, role="store", name="query-store")
    p.send(enc({"op": "register", "store": "qs", "handles": [], "queryDeltas": deltas}))
    p.until(lambda b: op_of(b) == "registered", 10.0, "registered")
    p.until(lambda b: op_of(b) == "queries", 10.0, "queries")
    st = {"frames": {}, "bytes": 0, "largest": 0, "last": now(), "ended": False}

    def dump():
        with open(outfile + ".tmp", "w") as f:
            json.dump(st, f)
        os.replace(outfile + ".tmp", outfile)

    dump()
    print("query-store ready", flush=True)
    last_dump = now()
    while not stop[0]:
        try:
            body = p.frame(0.2)
        except socket.timeout:
            body = b""
        except OSError:
            body = None
        if body is None:
            st["ended"] = True
            break
        if body:
            op = op_of(body)
            tally(st["frames"], op if op != "error" else "error " + code_of(body))
            st["bytes"] += len(body) + 4
            st["largest"] = max(st["largest"], len(body))
            st["last"] = now()
        if now() - last_dump > 0.2:
            dump()
            last_dump = now()
    dump()
    while not stop[0]:
        time.sleep(0.05)


def read_samples(path):
    samples = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    samples.append((float(parts[0]), float(parts[1]), parts[2]))
    except OSError:
        pass
    return samples


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(q / 100.0 * len(v)) - 1))  # nearest rank
    return v[k]


def window_stats(samples, t0, t1):
    w = [s for s in samples if t0 <= s[0] < t1]
    lats = [s[1] for s in w if s[2] == "ok"]
    # The client waits for each round trip before the next, so a stall of T delays ~T/period round trips that are
    # never sent (coordinated omission). The corrected figures add them back, as HdrHistogram's
    # recordValueWithExpectedInterval does: a round trip of L adds L - period, L - 2 period, ... (> period).
    co = list(lats)
    for lat in lats:
        k = lat - PERIOD
        while k > PERIOD:
            co.append(k)
            k -= PERIOD
    errors = {}
    for s in w:
        if s[2] != "ok":
            tally(errors, s[2])
    return {
        "count": len(w),
        "p50_ms": round(pct(lats, 50) * 1000, 3) if lats else None,
        "p99_ms": round(pct(lats, 99) * 1000, 3) if lats else None,
        "p99_corrected_ms": round(pct(co, 99) * 1000, 3) if co else None,
        "max_ms": round(max(lats) * 1000, 3) if lats else None,
        "errors": errors,
        "rate": round(len(w) / (t1 - t0), 1) if t1 > t0 else None,
    }


# -------------------------------------------------------------------------------------------------- the bus

class Bus:
    """fluxd + flux-bench-store + the well-behaved client + an observer connection for `info`.

    fluxd_args may name `--data-dir {data}` (a durable fluxd: its journal in the bus's temporary folder; else it is
    `--ephemeral`) and `--socket-mode` (the folders are then opened to other users, for attackers of another uid)."""

    def __init__(self, bench, key, fluxd_args):
        self.bench = bench
        self.dir = tempfile.mkdtemp(prefix=f"fluxbus-attack-{key}-", dir=bench.tmp)
        self.sock = os.path.join(self.dir, "fluxd.sock")
        self.data = os.path.join(self.dir, "data")
        self.mounted = None
        if "--data-ext4-mib" in fluxd_args:  # (15) the data folder on an ext4 file system of its own (root only)
            i = fluxd_args.index("--data-ext4-mib")
            mib = int(fluxd_args[i + 1])
            fluxd_args = fluxd_args[:i] + fluxd_args[i + 2:]
            image = os.path.join(self.dir, "data.img")
            with open(image, "wb") as f:
                f.truncate(mib << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
            os.makedirs(self.data, mode=0o700)
            subprocess.run(["mount", "-o", "loop", image, self.data], check=True)
            os.chmod(self.data, 0o700)
            self.mounted = self.data
        self.config = os.path.join(self.dir, "fluxd.toml")
        if any("{config}" in a for a in fluxd_args):  # (13b) a config file of the most a config file may hold
            with open(self.config, "w") as f:
                f.write(max_size_config())
        args = [a.replace("{data}", self.data).replace("{config}", self.config) for a in fluxd_args]
        self.durable = "--data-dir" in args
        if "--socket-mode" in args:
            os.chmod(self.dir, 0o755)  # other users reach the socket (fluxd refuses a folder others may write)
        self.fluxd_argv = [bench.args.fluxd, "--socket", self.sock] + ([] if self.durable else ["--ephemeral"]) + args
        self.fluxd_runs = 0
        self.fluxd = self.start_fluxd()
        self.old_fluxds = []  # fluxds of this bus stopped by the attack (restarts): stopped again at the end
        self.procs = []
        self.observer = None
        self.final = None     # the after-attack measurement, when the attack took it itself (before a restart)
        self.frozen_s = None  # set by an attack that found fluxd not answering for this long
        try:
            self.store = self.start(bench.args.bench_store, ["--socket", self.sock], "store ready", "bench-store")
            self.observer = ready_peer(self.sock, name="observer")
            self.wb_file = os.path.join(self.dir, "well-behaved.txt")
            self.wb = Proc([sys.executable, os.path.abspath(__file__), "--well-behaved", self.sock, self.wb_file],
                           "well-behaved ready", os.path.join(self.dir, "well-behaved.log"))
            self.procs.append(self.wb)
        except Exception:
            self.stop()
            raise

    def start_fluxd(self, ready="fluxd ready on"):
        """Starts this bus's fluxd (again: same socket, same data folder); `ready=None` does not wait for it."""
        self.fluxd_runs += 1
        name = "fluxd.log" if self.fluxd_runs == 1 else f"fluxd-{self.fluxd_runs}.log"
        self.fluxd_log = os.path.join(self.dir, name)
        return Proc(self.fluxd_argv, ready, self.fluxd_log)

    def start(self, exe, args, ready, name, user=None):
        p = Proc([exe] + args, ready, os.path.join(self.dir, f"{name}.log"), user=user)
        self.procs.append(p)
        return p

    def info(self, timeout=20.0):
        rid = f"i{now():.6f}"
        self.observer.s.settimeout(timeout)
        self.observer.send(enc({"op": "info", "id": rid}))
        body = self.observer.until(lambda b: op_of(b) == "info" and f'"id":"{rid}"'.encode() in b[:300],
                                   timeout, "info")
        return json.loads(body)

    def stop_fluxd(self, sig, wait):
        """Signals fluxd and waits up to `wait` s for it to exit: (exit code or None, seconds); SIGKILL after that."""
        f = self.fluxd
        t0 = now()
        if f.p.poll() is None:
            try:
                os.kill(f.pid, sig)
            except ProcessLookupError:
                pass
            try:
                f.p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        code = f.p.poll()
        took = now() - t0
        if code is None:
            f.stop(signal.SIGKILL)
        else:
            f.stop()
        self.old_fluxds.append(f)
        return code, took

    def restart_timed(self, timeout):
        """Starts fluxd again and times it: (seconds from start to a `welcome` on its socket, or None after
        `timeout`, and why). The new fluxd is this bus's fluxd from then on (stopped at the end)."""
        self.fluxd = self.start_fluxd(ready=None)
        return time_to_welcome(self.fluxd, self.sock, timeout)

    def stop(self):
        if self.observer:
            self.observer.close()
        for p in reversed(self.procs):
            p.stop()
        self.fluxd.stop()
        for f in self.old_fluxds:
            f.stop(signal.SIGKILL)
        if self.mounted:
            subprocess.run(["umount", self.mounted], check=False)  # (detaches the loop device too)
            self.mounted = None


class RssWatchdog:
    """Kills a fluxd whose RSS passes the cap (an attack that makes fluxd allocate without bound must not take the
    machine down); samples every 0.1 s; records what it did."""

    def __init__(self, bus, cap_kib):
        self.bus = bus
        self.cap = cap_kib
        self.peak = 0
        self.killed = None
        self.stopping = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stopping:
            f = self.bus.fluxd
            rss = proc_status(f.pid).get("VmRSS") if f.alive() else None
            if rss:
                self.peak = max(self.peak, rss)
                if rss > self.cap and self.killed is None:
                    try:
                        os.kill(f.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.killed = {"rss_kib": rss, "at": now()}
                    log(f"watchdog: killed fluxd {f.pid} at RSS {rss // 1024} MiB (cap {self.cap // 1024} MiB)")
            time.sleep(0.1)

    def stop(self):
        self.stopping = True
        self.t.join(1.0)


def mem_of(info):
    m = info.get("memory", {})
    return {k: m.get(k) for k in ("used", "peak", "limit", "perUser", "refusals")}


def load_of(info):
    return dict(info.get("load", {}))


def errors_of(info):
    return dict(info.get("counters", {}).get("errors", {}))


def diff_counts(after, before):
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


# ------------------------------------------------------------------------------------- issue 24: helpers

def exchange(peer, data, timeout, rid):
    """Sends `data` (frames) and then a `ping` on one connection, and waits for its `pong`: fluxd answers a
    connection's frames in order, so the time is what fluxd took for `data`. Returns (seconds, outcome, error
    codes, other ops received): outcome `answered` (the pong came), `closed` (EOF or reset: fluxd closed the
    connection), `timeout` (no pong within `timeout` s: fluxd did not get to it)."""
    codes, ops = {}, {}
    ref = b'"id":"%s"' % rid.encode()
    t0 = now()
    try:
        peer.s.settimeout(timeout)
        peer.send(data + enc(b'{"op":"ping","id":"%s"}' % rid.encode()))
        while True:
            left = t0 + timeout - now()
            if left <= 0:
                return now() - t0, "timeout", codes, ops
            body = peer.frame(left)
            if body is None:
                return now() - t0, "closed", codes, ops
            op = op_of(body)
            if op == "pong" and ref in body:
                return now() - t0, "answered", codes, ops
            if op == "error":
                tally(codes, code_of(body))
            else:
                tally(ops, op)
    except socket.timeout:
        return now() - t0, "timeout", codes, ops
    except OSError:
        return now() - t0, "closed", codes, ops


def outcome_text(outcome, codes, secs=None):
    s = outcome if not codes else f"{outcome} after error {'/'.join(codes)}"
    if secs is None:
        return s
    took = f"{secs:.2f} s" if secs >= 1 else f"{secs * 1000:.1f} ms"
    return f"no answer in {took}" if outcome == "timeout" else f"{s} in {took}"


def register_store(peer, store, state_json=None, timeout=20.0):
    """register (with an initial state given as JSON text) and wait for `registered`: None, or the error code."""
    frame = b'{"op":"register","store":"%s","handles":[]' % store.encode()
    if state_json is not None:
        frame += b',"state":' + state_json
    try:
        peer.s.settimeout(timeout)
        peer.send(enc(frame + b"}"))
        body = peer.until(lambda b: op_of(b) in ("registered", "error"), timeout, f"registered {store}")
    except socket.timeout:
        return "no answer"
    except (EOFError, OSError) as e:
        return f"closed ({type(e).__name__})"
    return None if op_of(body) == "registered" else code_of(body)


def fill_reject_series(store, client, stores, codes, prefix="s"):
    """`client` dispatches `codes` actions to each of `stores` stores (`<prefix><i>/c<j>`, 512 in flight) and
    `store`, which registered them, rejects each with the code its type names: fluxd then counts stores x codes
    rejected-code series (attack 12a, Benchmarks/metrics-scale.py)."""
    total, sent, answered = stores * codes, 0, 0
    while answered < total:
        batch = b""
        while sent < total and sent - answered < 512:
            i, j = divmod(sent, codes)
            batch += enc({"op": "dispatch", "type": f"{prefix}{i}/c{j}"})
            sent += 1
        if batch:
            client.send(batch)
        body = store.frame(60)
        if body is None:
            raise EOFError("the store connection was closed")
        if op_of(body) != "action":
            continue
        a = json.loads(body)
        store.send(enc({"op": "reject", "store": a["store"], "seq": a["seq"],
                        "error": {"code": a["type"].split("/")[1], "message": "no"}}))
        answered += 1


def try_hello(path, uid, name, timeout, role="client"):
    """A new connection's hello: (`welcome` or the refusal, seconds, the peer or None)."""
    t0 = now()
    try:
        p = Peer(path, timeout=timeout, uid=uid)
    except OSError as e:
        return f"connect failed: {type(e).__name__}", now() - t0, None
    try:
        p.hello(role, name, timeout=timeout)
        return "welcome", now() - t0, p
    except Refused as e:
        p.close()
        return f"refused {e.code}", now() - t0, None
    except socket.timeout:
        p.close()
        return f"no welcome in {timeout:g} s", now() - t0, None
    except OSError as e:
        p.close()
        return f"closed ({type(e).__name__})", now() - t0, None


GOT_VERSION_RE = re.compile(rb'"version":(\d+)')


def get_state(path, uid, store, timeout, parse=True):
    """`get` on a new connection: {result, seconds, bytes, version, state (parsed, if asked and small)}."""
    out = {}
    t0 = now()
    res, _, p = try_hello(path, uid, "getter", timeout)
    if p is None:
        out.update(result=f"hello: {res}", seconds=round(now() - t0, 3))
        return out
    try:
        p.s.settimeout(timeout)
        p.send(enc({"op": "get", "id": "g1", "store": store}))
        left = max(0.5, t0 + timeout - now())
        body = p.until(lambda b: op_of(b) in ("got", "error"), left, "got")
        out["seconds"] = round(now() - t0, 3)
        if op_of(body) == "error":
            out["result"] = f"error {code_of(body)}"
        else:
            out["result"] = "got"
            out["bytes"] = len(body)
            m = GOT_VERSION_RE.search(body, 0, 400)
            out["version"] = int(m.group(1)) if m else None
            if parse and len(body) < (8 << 20):
                out["state"] = json.loads(body).get("state")
    except socket.timeout:
        out.update(result=f"no answer in {timeout:g} s", seconds=round(now() - t0, 3))
    except (EOFError, OSError) as e:
        out.update(result=f"closed ({type(e).__name__})", seconds=round(now() - t0, 3))
    finally:
        p.close()
    return out


def signal_name(code):
    if code is None:
        return None
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def log_lines(path, start=0, limit=400):
    """Lines of a log file from byte offset `start` (the last `limit`), decoded."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-limit:]


def fatal_lines(path):
    """What a crashed Swift program said (precondition, fatal error), from its stderr log."""
    return [ln.strip()[:300] for ln in log_lines(path, 0, 2000)
            if re.search(r"Fatal error|precondition|Precondition|fatalError|Assertion failed|crash", ln)][:4]


def time_to_welcome(proc, sock, timeout):
    """Polls fluxd's socket until it answers hello with welcome: (seconds from the process's start or None, why)."""
    t0 = proc.started
    last = "no answer"
    while now() - t0 < timeout:
        if not proc.alive():
            return None, f"fluxd exited ({signal_name(proc.p.poll())}) before answering"
        try:
            p = Peer(sock, timeout=max(0.5, timeout - (now() - t0)))
        except OSError as e:
            last = type(e).__name__
            time.sleep(0.02)
            continue
        try:
            p.hello(name="restart-probe", timeout=max(0.5, timeout - (now() - t0)))
            return now() - t0, "welcome"
        except Refused as e:
            last = f"refused {e.code}"
        except socket.timeout:
            last = "no welcome (timeout)"
        except OSError as e:
            last = type(e).__name__
        finally:
            p.close()
        time.sleep(0.02)
    return None, f"no welcome in {timeout:g} s (last: {last})"


def json_pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError("bad pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_patch(doc, ops):
    """RFC 6902 on a copy of `doc` (objects and arrays; keys compared as code points, never normalized). Raises
    ValueError when the patch does not apply."""
    import copy as _copy
    doc = _copy.deepcopy(doc)

    def parent(d, toks):
        for t in toks[:-1]:
            if isinstance(d, dict):
                if t not in d:
                    raise ValueError(f"no member {t!r}")
                d = d[t]
            elif isinstance(d, list):
                if not t.isdigit() or int(t) >= len(d):
                    raise ValueError(f"no element {t!r}")
                d = d[int(t)]
            else:
                raise ValueError("not a container")
        return d

    def get(d, path):
        toks = json_pointer(path)
        if not toks:
            return d
        c = parent(d, toks)
        t = toks[-1]
        if isinstance(c, dict):
            if t not in c:
                raise ValueError(f"no member {t!r}")
            return c[t]
        if isinstance(c, list) and t.isdigit() and int(t) < len(c):
            return c[int(t)]
        raise ValueError(f"no value at {path!r}")

    def add(d, path, v):
        toks = json_pointer(path)
        if not toks:
            return v
        c = parent(d, toks)
        t = toks[-1]
        if isinstance(c, dict):
            c[t] = v
        elif isinstance(c, list):
            i = len(c) if t == "-" else (int(t) if t.isdigit() else -1)
            if i < 0 or i > len(c):
                raise ValueError("index out of range")
            c.insert(i, v)
        else:
            raise ValueError("not a container")
        return d

    def remove(d, path):
        toks = json_pointer(path)
        c = parent(d, toks)
        t = toks[-1]
        if isinstance(c, dict):
            if t not in c:
                raise ValueError(f"no member {t!r}")
            del c[t]
        elif isinstance(c, list) and t.isdigit() and int(t) < len(c):
            del c[int(t)]
        else:
            raise ValueError(f"no value at {path!r}")
        return d

    for o in ops:
        kind = o["op"]
        if kind == "add":
            doc = add(doc, o["path"], _copy.deepcopy(o["value"]))
        elif kind == "remove":
            doc = remove(doc, o["path"])
        elif kind == "replace":
            get(doc, o["path"])
            doc = add(remove(doc, o["path"]) if o["path"] else doc, o["path"], _copy.deepcopy(o["value"]))
        elif kind == "move":
            if o["path"] != o["from"] and o["path"].startswith(o["from"] + "/"):
                raise ValueError("move into its own child")
            v = get(doc, o["from"])
            doc = add(remove(doc, o["from"]), o["path"], v)
        elif kind == "copy":
            doc = add(doc, o["path"], _copy.deepcopy(get(doc, o["from"])))
        elif kind == "test":
            if get(doc, o["path"]) != o["value"]:
                raise ValueError("test failed")
        else:
            raise ValueError(f"unknown op {kind}")
    return doc


# ---------------------------------------------------------------------------------------------------- attacks

DURABLE_SHARED = ["--data-dir", "{data}", "--socket-mode", "0666"]


class Bench:
    def __init__(self, args):
        self.args = args
        self.scale = args.scale
        self.tmp = tempfile.mkdtemp(prefix="fluxbus-attack-")
        os.chmod(self.tmp, 0o755)  # attackers of another uid reach the sockets of the buses that allow them
        self.results = []
        self.keep = False
        self.total_seconds = 0.0
        self.t_attack = now()

    def n(self, count):
        return max(1, int(round(count * self.scale)))

    def run_attack(self, key, title, fluxd_args, attack, min_during=5.0):
        log(f"{key}: {title} (fluxd {' '.join(fluxd_args) or 'defaults'})")
        res = {"key": key, "title": title, "fluxd_args": [a.replace("{data}", "(temporary folder)")
                                                          for a in fluxd_args]}
        try:
            bus = Bus(self, key, fluxd_args)
        except Exception as e:  # noqa: BLE001
            res["failure"] = f"setup: {type(e).__name__}: {e}"
            self.keep = True
            self.results.append(res)
            log(f"{key}: FAILED {res['failure']}")
            return res
        watchdog = RssWatchdog(bus, self.args.rss_cap_mib * 1024)
        try:
            time.sleep(1.0)  # warm-up, not measured
            t_base = now()
            time.sleep(self.args.baseline)
            i0 = bus.info()
            st0 = proc_status(bus.fluxd.pid)
            cpu0 = proc_cpu_seconds(bus.fluxd.pid)
            t_attack = now()
            self.t_attack = t_attack
            bus.t_attack, bus.min_during = t_attack, min_during
            res["loadavg_before"] = loadavg()
            res["baseline_window"] = (t_base, t_attack)
            res["memory_before"] = mem_of(i0)
            res["loop_hold_before_us"] = load_of(i0).get("longestLoopHoldMicros")
            res["rss_before_kib"] = st0.get("VmRSS")
            bus.before = {"info": i0, "cpu": cpu0}
            detail = attack(bus) or {}
            res["detail"] = detail
            res.update(bus.final or self.take_final(bus))
        except Exception as e:  # noqa: BLE001 - reported in the results, not hidden
            res["failure"] = f"{type(e).__name__}: {e}"
            res["fluxd_alive"] = bus.fluxd.alive()
            if bus.final:
                res.update({k: v for k, v in bus.final.items() if k not in res})
            self.keep = True
            log(f"{key}: FAILED {res['failure']} (logs in {bus.dir})")
        finally:
            watchdog.stop()
            if watchdog.killed:
                res["watchdog_killed_fluxd"] = {"rss_mib": watchdog.killed["rss_kib"] // 1024,
                                                "after_s": round(watchdog.killed["at"] - self.t_attack, 2),
                                                "cap_mib": self.args.rss_cap_mib}
            bus.wb.stop()
            samples = read_samples(bus.wb_file)
            if "baseline_window" in res:
                res["wb_baseline"] = window_stats(samples, *res["baseline_window"])
            if "during_window" in res:
                res["wb_during"] = window_stats(samples, *res["during_window"])
                t_a = res["during_window"][0]
                res["wb_slowest"] = [[round(t - t_a, 3), round(lat * 1000, 1), st]
                                     for t, lat, st in sorted(samples, key=lambda x: -x[1])[:5]]
            res["wb_total_errors"] = window_stats(samples, 0, float("inf"))["errors"]
            exit_code = bus.fluxd.p.poll()
            if exit_code is not None and "fluxd_exit" not in res:
                res["fluxd_exit"] = exit_code
            bus.stop()
            for k in ("baseline_window", "during_window"):
                res.pop(k, None)
        log(f"{key}: {json.dumps(res)}")
        self.results.append(res)
        return res

    def take_final(self, bus):
        """The after-attack measurement (info, /proc, the well-behaved client's window), taken once: by
        run_attack after the attack, or by an attack itself before it stops or restarts fluxd. An `info` that does
        not come (a frozen fluxd) leaves its figures unknown."""
        if bus.final is not None:
            return bus.final
        out = {}
        t_end = now()
        out["attack_seconds"] = round(t_end - bus.t_attack, 3)
        if t_end - bus.t_attack < bus.min_during:
            time.sleep(bus.min_during - (t_end - bus.t_attack))
            t_end = now()
        timeout = 3.0 if bus.frozen_s else 20.0
        i1 = i2 = None
        try:
            i1 = bus.info(timeout)
            # fluxd reads the loop-hold figure before it builds an info reply, so a second one shows the first's cost.
            i2 = bus.info(timeout)
        except (socket.timeout, EOFError, OSError) as e:
            out["info_after_failed"] = f"{type(e).__name__}: {e}"
        if bus.frozen_s:
            out["frozen_s"] = bus.frozen_s
        out["loadavg_after"] = loadavg()
        st1 = proc_status(bus.fluxd.pid)
        cpu1 = proc_cpu_seconds(bus.fluxd.pid)
        cpu0 = bus.before["cpu"]
        out["fluxd_alive"] = bus.fluxd.alive()
        out["rss_peak_kib"] = st1.get("VmHWM")
        out["rss_after_kib"] = st1.get("VmRSS")
        out["fluxd_cpu_seconds"] = round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None
        if i1 is not None:
            out["memory_after"] = mem_of(i1)
            out["loop_hold_after_us"] = load_of(i1).get("longestLoopHoldMicros")
            out["load_after"] = load_of(i1)
            out["errors_sent"] = diff_counts(errors_of(i1), errors_of(bus.before["info"]))
        if i2 is not None:
            out["loop_hold_after_info_us"] = load_of(i2).get("longestLoopHoldMicros")
        out["during_window"] = (bus.t_attack, t_end)
        bus.final = out
        bus.wb.stop()  # before anything stops fluxd: the client's window ends here
        return out

    # 1 ----------------------------------------------------------------------------------------------------
    def attack_waitfor(self, bus, rounds_max=1):
        layers = self.n(30)
        per_round = []
        codes = {}
        rounds = 0
        deadline = now() + 5.0
        peers = []
        while rounds < rounds_max and (rounds == 0 or now() < deadline):
            p = ready_peer(bus.sock, role="store", name=f"layers-{rounds}")
            peers.append(p)
            pre = f"r{rounds}-"
            t0 = now()
            expected = 0

            def reg(name, wait):
                nonlocal expected
                p.send(enc({"op": "register", "store": pre + name, "handles": [], "waitFor": [pre + w for w in wait]}))
                expected += 1

            # a0 and b0 (b0 is named b0 here too, under the round's prefix: the bench store owns plain "b0").
            reg("a0", [])
            reg("b0", [])
            for n in range(1, layers + 1):
                reg(f"a{n}", [f"a{n - 1}", f"b{n - 1}"])
                reg(f"b{n}", [f"a{n - 1}", f"b{n - 1}"])
            answered = 0
            while answered < expected:
                body = p.frame(60.0)
                if body is None:
                    raise EOFError("layers peer closed")
                op = op_of(body)
                if op == "registered":
                    answered += 1
                    tally(codes, "registered")
                elif op == "error":
                    answered += 1
                    tally(codes, code_of(body))
            per_round.append(now() - t0)
            if rounds == 0:
                wide = [f"w{i}" for i in range(100)]
                p.send(enc({"op": "register", "store": pre + "wide", "handles": [], "waitFor": wide}))
                body = p.until(lambda b: op_of(b) in ("registered", "error"), 10.0, "wide register reply")
                codes["wide (100 waitFor)"] = code_of(body) if op_of(body) == "error" else "registered"
            rounds += 1
        t_close = now()
        for p in peers:
            p.close()  # every store they own goes down
        return {"layers": layers, "rounds": rounds, "connections": len(peers),
                "stores_registered": codes.get("registered", 0),
                "replies": codes, "round_ms_max": round(max(per_round) * 1000, 2),
                "round_ms_median": round(sorted(per_round)[len(per_round) // 2] * 1000, 2),
                "left_at_s": round(t_close - self.t_attack, 3)}

    # 2 ----------------------------------------------------------------------------------------------------
    def attack_queries(self, bus, deltas):
        count = self.n(5000)
        # The store reads in its own process, so that the attacker's Python thread does not slow it down.
        summary = os.path.join(bus.dir, f"query-store-{int(deltas)}.json")
        store = bus.start(sys.executable, [os.path.abspath(__file__), "--query-store", bus.sock,
                                           "1" if deltas else "0", summary], "query-store ready", "query-store")

        def st():
            try:
                with open(summary) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {}

        attacker = ready_peer(bus.sock, name="query-attacker")
        pad = "p" * 268
        replies = {}
        batch = 500
        t0 = now()
        for start in range(0, count, batch):
            frames = b"".join(
                enc(b'{"op":"query","id":"q%d","store":"qs","query":{"i":%d,"pad":"%s"}}' % (i, i, pad.encode()))
                for i in range(start, min(start + batch, count)))
            attacker.send(frames)
            for _ in range(start, min(start + batch, count)):
                body = attacker.frame(120.0)
                if body is None:
                    raise EOFError("query attacker closed")
                op = op_of(body)
                tally(replies, op if op != "error" else code_of(body))
        sent_s = now() - t0
        query_bytes = len(enc(b'{"op":"query","id":"q1000","store":"qs","query":{"i":1000,"pad":"%s"}}' % pad.encode()))
        # Then it leaves: every query is withdrawn.
        attacker.close()
        t_leave = now()
        deadline = now() + 60.0
        while now() < deadline:
            x = st()
            if x.get("ended") or (x and now() - max(x.get("last", 0), t_leave) > 1.5):
                break
            time.sleep(0.1)
        info = bus.info()  # before the driver stops the store
        qs = next((s for s in info.get("stores", []) if s.get("name") == "qs"), {})
        store.stop()
        x = st()
        return {"queries_sent": count, "query_frame_bytes": query_bytes, "replies": replies,
                "send_seconds": round(sent_s, 2),
                "store_frames": x.get("frames", {}), "store_bytes": x.get("bytes"),
                "store_largest_frame": x.get("largest"), "store_cut": x.get("ended"),
                "store_up_after": qs.get("status") == "up",
                "settle_seconds_after_leave": round(max(x.get("last", t_leave), t_leave) - t_leave, 2)}

    # 0 ----------------------------------------------------------------------------------------------------
    def attack_none(self, bus):
        time.sleep(5.0)
        return {}

    # 3 ----------------------------------------------------------------------------------------------------
    def attack_subscribes(self, bus):
        total = self.n(200000)
        names0 = load_of(bus.info()).get("storeNames")
        attacker = ready_peer(bus.sock, name="subscriber-attacker")
        replies = {}
        batch = 2000
        t0 = now()
        for start in range(0, total, batch):
            end = min(start + batch, total)
            attacker.send(b"".join(enc(b'{"op":"subscribe","store":"ghost-%d"}' % i) for i in range(start, end)))
            got = 0
            while got < end - start:
                body = attacker.frame(120.0)
                if body is None:
                    raise EOFError("subscriber attacker closed")
                op = op_of(body)
                if op in ("subscribed", "error"):
                    got += 1
                    tally(replies, op if op == "subscribed" else code_of(body))
        sent_s = now() - t0
        during = bus.info()
        rss_during = proc_status(bus.fluxd.pid).get("VmRSS")
        attacker.close()
        t_leave = now()
        names_after = None
        while now() - t_leave < 5.0:
            names_after = load_of(bus.info()).get("storeNames")
            if names_after == names0:
                break
            time.sleep(0.1)
        return {"subscribes_sent": total, "replies": replies, "send_seconds": round(sent_s, 2),
                "storeNames_before": names0, "storeNames_during": load_of(during).get("storeNames"),
                "storeNames_after": names_after, "forgotten_after_s": round(now() - t_leave, 2),
                "memory_used_during": mem_of(during).get("used"), "rss_during_kib": rss_during,
                "rss_after_leave_kib": proc_status(bus.fluxd.pid).get("VmRSS")}

    # 4a ---------------------------------------------------------------------------------------------------
    def attack_unfinished_frames(self, bus):
        count = self.n(1000)
        held = 512 << 10
        peers = []
        refused = {}
        send_failed = 0
        t0 = now()
        header = struct.pack(">I", 1 << 20)
        chunk = b" " * held
        for i in range(count):
            try:
                p = Peer(bus.sock, timeout=5.0)
                p.hello(name=f"holder-{i}")
            except Refused as e:
                tally(refused, e.code)
                p.close()
                continue
            except OSError as e:
                tally(refused, "connect-" + type(e).__name__)
                continue
            try:
                p.s.settimeout(5.0)
                p.s.sendall(header + chunk)
            except OSError:
                send_failed += 1
            peers.append(p)
        open_s = now() - t0
        mid = bus.info()
        rss_mid = proc_status(bus.fluxd.pid).get("VmRSS")
        # A new connection from the same uid while the frames are held.
        try:
            probe = ready_peer(bus.sock, name="probe")
            probe_result = "welcome"
            probe.close()
        except Refused as e:
            probe_result = e.code
        time.sleep(3.0)  # the frames are held
        kept = 0
        cut = {}
        sel = selectors.DefaultSelector()
        for p in peers:
            sel.register(p.s, selectors.EVENT_READ)
        readable = {key.fileobj for key, _ in sel.select(0.5)}
        sel.close()
        for p in peers:
            if p.s not in readable:
                kept += 1
                continue
            ops, codes, ended = drain_codes(p.s, 1.0)
            if codes or ended:
                for c, k in codes.items():
                    tally(cut, c, k)
                if ended and not codes:
                    tally(cut, "closed without error")
            else:
                kept += 1
        for p in peers:
            p.close()
        return {"connections": count, "held_bytes_each": held, "welcomed": len(peers), "refused_at_connect": refused,
                "sends_failed": send_failed, "cut": cut, "still_holding": kept, "open_seconds": round(open_s, 2),
                "memory_with_frames_held": mem_of(mid), "rss_with_frames_held_kib": rss_mid,
                "new_connection_while_held": probe_result}

    # 4b ---------------------------------------------------------------------------------------------------
    def attack_never_reading(self, bus):
        clients = 8
        seconds = 10.0 * min(1.0, self.scale) if self.scale < 1 else 10.0
        payload = "x" * 1000
        stats = [{"dispatches_sent": 0, "bytes_sent": 0, "connections": 0, "cut": 0, "ops": {}, "codes": {}}
                 for _ in range(clients)]
        deadline = now() + seconds
        frames = [b"".join(enc(b'{"op":"dispatch","id":"f%d-%d","type":"b0/act","payload":"%s","settle":true}'
                               % (c, n, payload.encode())) for n in range(100)) for c in range(clients)]

        def flood(c):
            st = stats[c]
            while now() < deadline and st["connections"] < 200:
                try:
                    p = ready_peer(bus.sock, name=f"flooder-{c}")
                except (Refused, OSError) as e:
                    tally(st["codes"], "connect: " + getattr(e, "code", type(e).__name__))
                    time.sleep(0.1)
                    continue
                st["connections"] += 1
                p.s.setblocking(False)
                err = None
                while now() < deadline:
                    sent, err = send_until(p.s, frames[c], deadline)
                    st["bytes_sent"] += sent
                    st["dispatches_sent"] += sent // (len(frames[c]) // 100)
                    if err is not None:
                        break
                # What fluxd sent it (it never read until now).
                ops, codes, ended = drain_codes(p.s, 2.0)
                for k, v in ops.items():
                    tally(st["ops"], k, v)
                for k, v in codes.items():
                    tally(st["codes"], k, v)
                if err is not None or ended:
                    st["cut"] += 1
                p.close()

        ths = [threading.Thread(target=flood, args=(c,), daemon=True) for c in range(clients)]
        for t in ths:
            t.start()
        peak_used = 0
        while any(t.is_alive() for t in ths):
            try:
                peak_used = max(peak_used, mem_of(bus.info(5.0)).get("used") or 0)
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.5)
        agg = {"clients": clients, "seconds": seconds, "payload_bytes": len(payload),
               "dispatches_sent": sum(s["dispatches_sent"] for s in stats),
               "MiB_sent": round(sum(s["bytes_sent"] for s in stats) / 2 ** 20, 1),
               "connections": sum(s["connections"] for s in stats), "cut": sum(s["cut"] for s in stats),
               "memory_used_max_sampled": peak_used, "ops_received": {}, "codes_received": {}}
        for s in stats:
            for k, v in s["ops"].items():
                tally(agg["ops_received"], k, v)
            for k, v in s["codes"].items():
                tally(agg["codes_received"], k, v)
        return agg

    # 4c ---------------------------------------------------------------------------------------------------
    def attack_connection_flood(self, bus):
        count = self.n(3000)
        socks = []
        connect_errors = {}
        t0 = now()
        for _ in range(count):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5.0)
            try:
                s.connect(bus.sock)
                socks.append(s)
            except OSError as e:
                tally(connect_errors, type(e).__name__ + (f" errno {e.errno}" if e.errno else ""))
                s.close()
        open_s = now() - t0
        time.sleep(0.5)
        mid = bus.info()
        fds_mid = open_fds(bus.fluxd.pid)
        try:
            probe = ready_peer(bus.sock, name="probe")
            probe_mid = "welcome"
            probe.close()
        except (Refused, OSError) as e:
            probe_mid = getattr(e, "code", type(e).__name__)
        # Collect what each got: too-many-connections at once, or timeout after handshakeTimeout (5 s).
        codes = {}
        pending = {s.fileno(): s for s in socks}
        bufs = {fd: b"" for fd in pending}
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        deadline = now() + 8.0
        first_timeout_at = None
        while pending and now() < deadline:
            for key, _ in sel.select(0.2):
                s = key.fileobj
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    bufs[s.fileno()] += chunk
                    continue
                body = bufs[s.fileno()][4:]
                code = code_of(body) if body else "closed without error"
                if code == "timeout" and first_timeout_at is None:
                    first_timeout_at = now() - t0
                tally(codes, code)
                sel.unregister(s)
                del pending[s.fileno()]
        sel.close()
        tally(codes, "still open", len(pending))
        try:
            probe = ready_peer(bus.sock, name="probe")
            probe_after = "welcome"
            probe.close()
        except (Refused, OSError) as e:
            probe_after = getattr(e, "code", type(e).__name__)
        for s in socks:
            s.close()
        return {"connections": count, "connected": len(socks), "connect_errors": connect_errors,
                "open_seconds": round(open_s, 2), "handshakes_during": load_of(mid).get("handshakes"),
                "connections_during": load_of(mid).get("connections"), "fluxd_fds_during": fds_mid,
                "codes": codes, "first_timeout_s": round(first_timeout_at, 2) if first_timeout_at else None,
                "new_connection_during": probe_mid, "new_connection_after": probe_after,
                "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}

    # 5a ---------------------------------------------------------------------------------------------------
    def attack_silent_heartbeat(self, bus):
        p = Peer(bus.sock)
        welcome = p.hello(name="silent", heartbeat=True)
        t0 = now()
        got = []
        t_end = None
        while now() - t0 < 10.0:
            try:
                body = p.frame(10.0)
            except socket.timeout:
                break
            if body is None:
                t_end = now()
                break
            got.append(op_of(body) if op_of(body) != "error" else "error " + code_of(body))
        p.close()
        return {"pingInterval": welcome.get("limits", {}).get("pingInterval"),
                "maxPingsOut": welcome.get("limits", {}).get("maxPingsOut"), "received": got,
                "closed_after_ms": round((t_end - t0) * 1000, 1) if t_end else None}

    # 5b ---------------------------------------------------------------------------------------------------
    def attack_stopped_store(self, bus, closing):
        todo = bus.start(self.args.todo_store, ["--socket", bus.sock], " ready", "todo-store")
        mon = ready_peer(bus.sock, role="monitor", name="watch")
        events = {}
        stop = [False]

        def watch():
            while not stop[0]:
                try:
                    body = mon.frame(0.2)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if body is None:
                    return
                m = KIND_RE.search(body, 0, 200)
                kind = m.group(1).decode() if m else None
                s = STORE_RE.search(body, 0, 300)
                if kind in ("store-stalled", "store-down", "store-recovered") and s and s.group(1) == b"todos":
                    events.setdefault(kind, now())

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        disp = ready_peer(bus.sock, name="dispatcher")
        todo.send_signal(signal.SIGSTOP)
        t_stop = now()
        state = proc_state(todo.pid)
        while state != "T" and now() - t_stop < 2.0:  # stopped before anything is sent to it
            time.sleep(0.001)
            state = proc_state(todo.pid)
        t0 = now()
        disp.send(enc({"op": "dispatch", "id": "t1", "type": "todo/create", "payload": {"title": "stuck"},
                       "settle": True}))
        info_stalled_at = None
        stalled_for = None
        while now() - t0 < 15.0:
            if info_stalled_at is None:
                st = next((s for s in bus.info().get("stores", []) if s.get("name") == "todos"), {})
                if st.get("stalled"):
                    info_stalled_at = now()
                    stalled_for = st.get("stalledFor")
            if "store-stalled" in events and (info_stalled_at if not closing else "store-down" in events):
                break
            time.sleep(0.05)
        t_kill = now()
        todo.send_signal(signal.SIGKILL)
        # What the dispatcher of the stuck action was told (the store is gone: its queue times out).
        try:
            settled = disp.until(lambda b: op_of(b) in ("settled", "error"), 8.0, "settlement of t1")
            outcome = json.loads(settled)
            outcome = [f"{r.get('store')}: {r.get('status')} {r.get('error', {}).get('code', '')}".strip()
                       for r in outcome.get("results", [])] if outcome.get("op") == "settled" else outcome.get("code")
        except (socket.timeout, EOFError) as e:
            outcome = f"none ({type(e).__name__})"
        stop[0] = True
        th.join(1.0)
        mon.close()
        disp.close()

        def ms(t):
            return round((t - t0) * 1000) if t else None

        return {"storeTimeout": 1000, "closeStalledStores": closing,
                "stalled_event_ms": ms(events.get("store-stalled")), "info_stalled_ms": ms(info_stalled_at),
                "info_stalledFor": stalled_for,
                "store_down_ms": ms(events.get("store-down")) if events.get("store-down", t_kill + 1) < t_kill else None,
                "killed_ms": ms(t_kill), "state_after_sigstop": state,
                "stop_seen_after_ms": round((t0 - t_stop) * 1000, 1),
                "dispatcher_got": outcome}

    # ================================================================================================ issue 24
    # Every attack below runs against a durable fluxd (--data-dir in the bus's folder, --socket-mode 0666) and, when
    # the driver runs as root, from other uids than the well-behaved client's (UID_ATTACKER for the attacking
    # store or client, UID_OTHER and UID_THIRD for the other peers). fluxd may answer with an error, close the
    # attacker's connection, freeze or crash: each step records what happened and the attack goes on.

    def users(self):
        return {"attacker": as_user(UID_ATTACKER), "other": as_user(UID_OTHER), "third": as_user(UID_THIRD),
                "well_behaved": os.geteuid()}

    def restart_after(self, bus, sig, stop_wait, restart_timeout, store=None):
        """Stops fluxd with `sig` (waits `stop_wait` s, SIGKILL after), starts it again on the same data folder and
        times it to its first welcome; then reads `store` back. The after-attack measurement is taken first."""
        self.take_final(bus)
        out = {}
        code, took = bus.stop_fluxd(sig, stop_wait)
        out["stop_signal"] = signal.Signals(sig).name
        out["stop_result"] = (signal_name(code) if code is not None
                              else f"still running after {stop_wait:g} s: SIGKILLed")
        out["stop_seconds"] = round(took, 3)
        out["stop_log"] = fatal_lines(bus.fluxd_log)
        secs, why = bus.restart_timed(restart_timeout)
        out["restart_seconds"] = round(secs, 3) if secs is not None else None
        out["restart_result"] = why
        if secs is not None and store:
            out["after_restart_get"] = {k: v for k, v in get_state(bus.sock, None, store, restart_timeout,
                                                                    parse=False).items()}
        if secs is None:
            out["restart_log"] = [ln[:200] for ln in log_lines(bus.fluxd_log, 0, 4)]
        return out

    # 6 ----------------------------------------------------------------------------------------------------
    def attack_copy_bomb(self, bus, ops):
        """A store with a small state sends one patch of `ops` copies of the whole state into a new member of it
        (each doubles it). Not scaled: the number of operations is the attack."""
        T = self.args.freeze_timeout
        u = self.users()
        d = {"ops": ops, "users": u}
        store = ready_peer(bus.sock, role="store", name="copy-bomber", uid=u["attacker"])
        d["register"] = register_store(store, "bombs", b'{"a":1}') or "registered"
        patch = [{"op": "copy", "from": "", "path": f"/k{i}"} for i in range(1, ops + 1)]
        frame = enc({"op": "patch", "store": "bombs", "patch": patch})
        d["frame_bytes"] = len(frame) - 4
        secs, outcome, codes, _ = exchange(store, frame, T, "bomb")
        d["patch"] = {"outcome": outcome, "codes": codes, "seconds": round(secs, 3)}
        frozen = outcome == "timeout"
        if frozen:
            bus.frozen_s = T
        t2 = 3.0 if frozen else T
        # Another user reads the store.
        d["get"] = {k: v for k, v in get_state(bus.sock, u["other"], "bombs", t2, parse=False).items()}
        # A new connection of a third user.
        res, secs3, p3 = try_hello(bus.sock, u["third"], "third-peer", t2)
        d["third_peer"] = {"result": res, "seconds": round(secs3, 3)}
        if p3:
            p3.close()
        try:
            i = bus.info(t2)
            d["store_after"] = next((f"{s.get('status')}, version {s.get('version')}" for s in i.get("stores", [])
                                     if s.get("name") == "bombs"), "unknown to it")
        except (socket.timeout, EOFError, OSError) as e:
            d["store_after"] = f"no info ({type(e).__name__})"
        store.close()
        d.update(self.restart_after(bus, signal.SIGTERM, 10.0, T, store="bombs"))
        return d

    # 7 ----------------------------------------------------------------------------------------------------
    def attack_quadratic_patches(self, bus, kind):
        """Patches just under maxFrame, repeated into one value: `keys` adds 22,000 new members to one object per
        patch; `inserts` inserts 26,000 elements at /a/0 per patch. Each patch is timed from sending it to fluxd's
        answer (a ping after it on the same connection)."""
        reps = max(2, self.n(8))
        per = 22000 if kind == "keys" else 26000
        cap = self.args.attack_cap
        T = max(self.args.freeze_timeout, 45.0)
        u = self.users()
        store = ready_peer(bus.sock, role="store", name=f"{kind}-patcher", uid=u["attacker"])
        name = "wides" if kind == "keys" else "lists"
        d = {"kind": kind, "ops_per_patch": per, "patches_planned": reps, "users": u}
        d["register"] = register_store(store, name, b'{"o":{}}' if kind == "keys" else b'{"a":[]}') or "registered"
        times, outcomes = [], []
        t0 = now()
        d["stopped"] = None
        for r in range(reps):
            if kind == "keys":
                body = b",".join(b'{"op":"add","path":"/o/k%06d","value":1}' % (r * per + i) for i in range(per))
            else:
                body = b",".join([b'{"op":"add","path":"/a/0","value":1}'] * per)
            frame = enc(b'{"op":"patch","store":"%s","patch":[' % name.encode() + body + b"]}")
            d["frame_bytes"] = len(frame) - 4
            secs, outcome, codes, _ = exchange(store, frame, T, f"p{r}")
            times.append(round(secs, 3))
            outcomes.append(outcome_text(outcome, codes))
            log(f"  patch {r + 1}/{reps}: {outcome_text(outcome, codes, secs)}")
            if outcome != "answered" or codes:
                d["stopped"] = f"patch {r + 1}: {outcome_text(outcome, codes)}"
                if outcome == "timeout":
                    bus.frozen_s = T
                break
            if now() - t0 > cap and r + 1 < reps:
                d["stopped"] = f"time cap ({cap:g} s) after {r + 1} patches"
                break
        d["patch_seconds"] = times
        d["outcomes"] = outcomes
        d["patches_answered"] = sum(1 for o in outcomes if o == "answered")
        d["elements_after"] = d["patches_answered"] * per
        store.close()
        return d

    # 8a ---------------------------------------------------------------------------------------------------
    @staticmethod
    def big_state(n, items):
        return (b'{"n":%d,"k":[' % n + b",".join(b'{"v":%d,"s":"%s"}' % (i, b"x" * 20) for i in range(items))
                + b"]}")

    def attack_path_subscribe_repeat(self, bus):
        """A store publishes whole states of ~1 MB (`state`, not patches) every 0.5 s; another user pipelines one
        54-byte path `subscribe` repeated 2,000 times."""
        count = self.n(2000)
        u = self.users()
        d = {"subscribes": count, "users": u}
        store = ready_peer(bus.sock, role="store", name="big-publisher", uid=u["attacker"])
        d["register"] = register_store(store, "bigstat") or "registered"
        items = 26000
        state0 = self.big_state(0, items)
        d["state_bytes"] = len(state0)
        store.send(enc(b'{"op":"state","store":"bigstat","state":' + state0 + b"}"))
        secs, outcome, codes, _ = exchange(store, b"", 20.0, "s0")
        d["first_state"] = outcome_text(outcome, codes, secs)
        stop = [False]
        pub = {"states": 1, "outcome": None}

        def publish():
            n = 1
            while not stop[0]:
                try:
                    store.s.settimeout(30.0)
                    store.send(enc(b'{"op":"state","store":"bigstat","state":' + self.big_state(n, items) + b"}"))
                    pub["states"] += 1
                    n += 1
                    # what fluxd sends the store (nothing but errors, if any) is read as it comes
                    deadline = now() + 0.5
                    while now() < deadline:
                        try:
                            body = store.frame(max(0.01, deadline - now()))
                        except socket.timeout:
                            break
                        if body is None:
                            pub["outcome"] = "closed"
                            return
                        if op_of(body) == "error":
                            pub["outcome"] = f"error {code_of(body)}"
                except OSError as e:
                    pub["outcome"] = f"closed ({type(e).__name__})"
                    return

        th = threading.Thread(target=publish, daemon=True)
        th.start()
        sub = ready_peer(bus.sock, name="path-subscriber", uid=u["other"])
        one = b'{"op":"subscribe","store":"bigstat","path":"/k/170/v"}'  # 54 bytes
        d["subscribe_frame_bytes"] = len(one)
        replies = {}
        cpu0 = proc_cpu_seconds(bus.fluxd.pid)
        t0 = now()
        sub.s.settimeout(60.0)
        try:
            sub.send(enc(one) * count)
            got = 0
            deadline = now() + 120.0
            while got < count and now() < deadline:
                body = sub.frame(max(0.01, deadline - now()))
                if body is None:
                    tally(replies, "closed")
                    break
                op = op_of(body)
                tally(replies, op if op != "error" else "error " + code_of(body))
                if op in ("subscribed", "error"):
                    got += 1
            d["answered_seconds"] = round(now() - t0, 3) if got >= count else None
            try:
                while True:  # the subtree that follows the last subscribed (coalesced ones never come)
                    body = sub.frame(0.5)
                    if body is None:
                        break
                    tally(replies, op_of(body))
            except socket.timeout:
                pass
        except socket.timeout:
            tally(replies, "timeout")
            d["answered_seconds"] = None
            bus.frozen_s = 120.0
        except OSError as e:
            tally(replies, f"closed ({type(e).__name__})")
        cpu1 = proc_cpu_seconds(bus.fluxd.pid)
        d["fluxd_cpu_during_subscribes_s"] = round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None
        d["replies"] = replies
        time.sleep(1.0)
        stop[0] = True
        th.join(35.0)
        d["states_published"] = pub["states"]
        d["publisher"] = pub["outcome"] or "up"
        sub.close()
        store.close()
        return d

    # 8b ---------------------------------------------------------------------------------------------------
    @staticmethod
    def subscribe_paths(p, first, end, replies):
        """Path subscriptions /s/p<first>../s/p<end-1> on one connection, 1,000 per pipelined batch; returns when
        the last was answered."""
        for start in range(first, end, 1000):
            stop = min(start + 1000, end)
            p.send(b"".join(enc(b'{"op":"subscribe","store":"paths","path":"/s/p%d"}' % i) for i in range(start, stop)))
            got = 0
            while got < stop - start:
                body = p.frame(60.0)
                if body is None:
                    tally(replies, "closed")
                    return now()
                op = op_of(body)
                tally(replies, op if op != "error" else "error " + code_of(body))
                if op in ("subscribed", "error"):
                    got += 1
        answered = now()
        try:
            while True:  # the subtree that follows the last subscribed
                body = p.frame(0.2)
                if body is None:
                    break
                tally(replies, op_of(body))
        except socket.timeout:
            pass
        return answered

    def attack_many_path_subscriptions(self, bus):
        """10,000 path subscriptions (3 connections: maxSubscriptions is 4,096 per connection) on a patching store;
        a small patch and a 2,000-op patch touching none of their paths, timed without and with them."""
        subs_total = self.n(10000)
        u = self.users()
        d = {"subscriptions": subs_total, "users": u}
        store = ready_peer(bus.sock, role="store", name="patcher", uid=u["attacker"])
        state = (b'{"s":{' + b",".join(b'"p%d":0' % i for i in range(subs_total)) + b'},"x":{"n":0,"a":['
                 + b",".join([b"0"] * 2000) + b"]}}")
        d["state_bytes"] = len(state)
        d["register"] = register_store(store, "paths", state) or "registered"
        seq = [0]

        def small(i):
            seq[0] += 1
            return enc(b'{"op":"patch","store":"paths","patch":[{"op":"replace","path":"/x/n","value":%d}]}' % seq[0])

        def big(i):
            seq[0] += 1
            return enc(b'{"op":"patch","store":"paths","patch":[' + b",".join(
                b'{"op":"replace","path":"/x/a/%d","value":%d}' % (j, seq[0]) for j in range(2000)) + b"]}")

        def per_patch(make, k, runs):
            """Median over `runs` of (k pipelined patches + a ping - one lone ping) / k, in ms."""
            rtts = []
            for r in range(5):
                secs, outcome, _, _ = exchange(store, b"", 10.0, f"rtt{r}")
                rtts.append(secs)
            rtt = sorted(rtts)[2]
            vals = []
            for r in range(runs):
                data = b"".join(make(i) for i in range(k))
                secs, outcome, codes, _ = exchange(store, data, 60.0, f"t{r}")
                if outcome != "answered" or codes:
                    return None, outcome_text(outcome, codes)
                vals.append(max(0.0, secs - rtt) / k * 1000)
            return round(sorted(vals)[len(vals) // 2], 6), "answered"

        # a first patch, so that fluxd keeps the state as a tree (as for a store that publishes patches)
        exchange(store, small(0), 10.0, "first")
        d["small_before_ms"], d["small_before"] = per_patch(small, 500, 5)
        d["big_before_ms"], d["big_before"] = per_patch(big, 10, 3)
        # the subscriptions
        conns = []
        replies = {}
        per_conn = 4000
        spent = 0.0  # seconds spent subscribing, up to each connection's last answer (not the quiet after it)
        cpu0 = proc_cpu_seconds(bus.fluxd.pid)
        for c in range(0, subs_total, per_conn):
            t_conn = now()
            try:
                p = ready_peer(bus.sock, name=f"path-subscriber-{len(conns)}", uid=u["other"])
            except Refused as e:
                tally(replies, f"connection refused {e.code}")
                continue
            except OSError as e:
                tally(replies, f"connect failed {type(e).__name__}")
                continue
            conns.append(p)
            p.s.settimeout(60.0)
            try:
                spent += self.subscribe_paths(p, c, min(c + per_conn, subs_total), replies) - t_conn
            except socket.timeout:
                tally(replies, "no answer")
                spent += now() - t_conn
            except (EOFError, OSError) as e:
                tally(replies, f"closed ({type(e).__name__})")
                spent += now() - t_conn
        cpu1 = proc_cpu_seconds(bus.fluxd.pid)
        d["subscribe_seconds"] = round(spent, 3)
        d["subscribe_fluxd_cpu_s"] = round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None
        d["connections"] = len(conns)
        d["replies"] = replies
        d["small_with_ms"], d["small_with"] = per_patch(small, 500, 5)
        d["big_with_ms"], d["big_with"] = per_patch(big, 10, 3)
        for x in ("small", "big"):
            b, w = d[f"{x}_before_ms"], d[f"{x}_with_ms"]
            d[f"{x}_ratio"] = round(w / b, 1) if b and w is not None else None
        # what the subscribers were sent for patches that touched none of their paths (should be nothing)
        sent = {}
        for p in conns:
            while True:
                try:
                    body = p.frame(0.2)
                except socket.timeout:
                    break
                if body is None:
                    tally(sent, "closed")
                    break
                tally(sent, op_of(body))
            p.close()
        d["subscribers_sent_during_patches"] = sent
        store.close()
        return d

    # 9 ----------------------------------------------------------------------------------------------------
    def journal_patches(self, sock, n, uid):
        """A store registers `jrnl` (a small state) and sends `n` small patches, 1,000 per pipelined batch with a
        ping after each: (seconds, outcome)."""
        try:
            p = ready_peer(sock, role="store", name="journaler", uid=uid)
        except Refused as e:
            return None, f"refused {e.code}"
        except OSError as e:
            return None, f"connect failed ({type(e).__name__})"
        try:
            err = register_store(p, "jrnl", b'{"n":0,"name":"journal me"}')
            if err:
                return None, f"register: {err}"
            t0 = now()
            for start in range(0, n, 1000):
                data = b"".join(enc(b'{"op":"patch","store":"jrnl","patch":[{"op":"replace","path":"/n","value":%d}]}'
                                    % i) for i in range(start, min(start + 1000, n)))
                secs, outcome, codes, _ = exchange(p, data, 60.0, f"b{start}")
                if outcome != "answered" or codes:
                    return now() - t0, f"after {start} patches: {outcome_text(outcome, codes)}"
            return now() - t0, "answered"
        finally:
            p.close()

    def attack_restart_journal(self, bus):
        """Small patches journaled since the last checkpoint, then fluxd SIGKILLed (a clean stop would write a
        checkpoint) and started again: the time from its start to a welcome on its socket. The largest count runs
        on the bus's fluxd (the well-behaved client beside it while the patches are journaled), the others each on
        a fluxd of their own (fresh data folder)."""
        counts = sorted({self.n(c) for c in (10000, 20000, 40000, 80000, 100000)})
        R = self.args.restart_timeout
        u = self.users()
        d = {"counts": counts, "restart_timeout": R, "users": u, "runs": {}}
        biggest = counts[-1]
        secs, outcome = self.journal_patches(bus.sock, biggest, u["attacker"])
        d["journal_seconds_on_bus"] = round(secs, 2) if secs is not None else None
        d["journal_outcome_on_bus"] = outcome
        time.sleep(0.3)  # batch durability: written records reach the file within the loop iteration; be generous
        self.take_final(bus)
        run = {"journal_seconds": d["journal_seconds_on_bus"], "journal": outcome}
        run.update(self.restart_after(bus, signal.SIGKILL, 5.0, R, store="jrnl"))
        bus.stop_fluxd(signal.SIGKILL, 5.0)  # still replaying, or done: not needed any more
        d["runs"][str(biggest)] = run
        log(f"  {biggest} patches: restart {run.get('restart_seconds')} s ({run.get('restart_result')})")
        for c in counts[:-1]:
            folder = tempfile.mkdtemp(prefix=f"restart-{c}-", dir=bus.dir)
            os.chmod(folder, 0o755)
            sock = os.path.join(folder, "fluxd.sock")
            argv = [self.args.fluxd, "--socket", sock, "--data-dir", os.path.join(folder, "data"),
                    "--socket-mode", "0666"]
            run = {}
            try:
                f = Proc(argv, "fluxd ready on", os.path.join(folder, "fluxd.log"))
            except RuntimeError as e:
                d["runs"][str(c)] = {"restart_result": f"fluxd did not start: {e}"}
                continue
            try:
                secs, outcome = self.journal_patches(sock, c, u["attacker"])
                run["journal_seconds"] = round(secs, 2) if secs is not None else None
                run["journal"] = outcome
                time.sleep(0.3)
                os.kill(f.pid, signal.SIGKILL)
                f.p.wait(5)
                f.stop()
                f = Proc(argv, None, os.path.join(folder, "fluxd-2.log"))
                secs, why = time_to_welcome(f, sock, R)
                run["restart_seconds"] = round(secs, 3) if secs is not None else None
                run["restart_result"] = why
                if secs is not None:
                    run["after_restart_get"] = get_state(sock, None, "jrnl", R, parse=False)
            finally:
                f.stop(signal.SIGKILL)
            d["runs"][str(c)] = run
            log(f"  {c} patches: restart {run.get('restart_seconds')} s ({run.get('restart_result')})")
        return d

    # 10 ---------------------------------------------------------------------------------------------------
    def attack_todo_reregister(self, bus):
        """The real todo-store (another user) gets 20,000 todos, then loses its connection (stopped past
        --store-timeout with an action in flight, fluxd closes it; then continued): its SDK reconnects and registers
        again with its whole state. Watched for 10 s."""
        count = self.n(20000)
        u = self.users()
        d = {"todos": count, "users": u}
        todo = bus.start(self.args.todo_store, ["--socket", bus.sock], " ready", "todo-store", user=u["attacker"])
        disp = ready_peer(bus.sock, name="todo-maker", uid=u["attacker"])
        title = "one of many todos!"
        window = 256
        sent = answered = 0
        statuses = {}
        t0 = now()
        disp.s.settimeout(60.0)
        deadline = now() + 180.0
        try:
            while answered < count and now() < deadline:
                while sent < count and sent - answered < window:
                    sent += 1
                    disp.send(enc(b'{"op":"dispatch","id":"c%d","type":"todo/create","payload":{"title":"%s"},'
                                  b'"settle":true}' % (sent, title.encode())))
                body = disp.frame(max(0.01, deadline - now()))
                if body is None:
                    tally(statuses, "closed")
                    break
                op = op_of(body)
                if op == "settled":
                    answered += 1
                    st = re.search(rb'"status":"([^"]*)"', body)
                    tally(statuses, st.group(1).decode() if st else "?")
                elif op == "error":
                    answered += 1
                    tally(statuses, "error " + code_of(body))
        except socket.timeout:
            tally(statuses, "timeout")
        d["create_seconds"] = round(now() - t0, 2)
        d["create_results"] = statuses
        owner = next((s.get("owner", {}) for s in bus.info().get("stores", []) if s.get("name") == "todos"), {})
        d["store_owner_uid"] = owner.get("uid")
        g = get_state(bus.sock, None, "todos", 20.0, parse=False)
        d["state_bytes"] = g.get("bytes")
        d["state_get"] = g.get("result")
        d["state_version"] = g.get("version")
        # The store's connection goes: stopped, with an action delivered, it stalls and fluxd closes it.
        todo.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        disp.send(enc({"op": "dispatch", "id": "stuck", "type": "todo/create", "payload": {"title": "stuck"}}))
        t_stop = now()
        down_at = None
        while now() - t_stop < 15.0:
            st = next((s for s in bus.info().get("stores", []) if s.get("name") == "todos"), {})
            if st.get("status") != "up":
                down_at = now()
                break
            time.sleep(0.05)
        d["connection_closed_after_s"] = round(down_at - t_stop, 2) if down_at else None
        log_start = os.path.getsize(bus.fluxd_log)
        i0 = bus.info()
        conns0 = i0.get("counters", {}).get("connections", 0)
        err0 = errors_of(i0)
        todo.send_signal(signal.SIGCONT)
        cpu0 = proc_cpu_seconds(todo.pid)
        t_cont = now()
        samples = []
        up_at = None
        window_s = 10.0
        while now() - t_cont < window_s:
            i = bus.info()
            st = next((s for s in i.get("stores", []) if s.get("name") == "todos"), {})
            samples.append((round(now() - t_cont, 2), st.get("status"), i.get("counters", {}).get("connections")))
            if st.get("status") == "up" and up_at is None:
                up_at = now() - t_cont
            time.sleep(0.5)
        cpu1 = proc_cpu_seconds(todo.pid)
        i1 = bus.info()
        d["registered_again_after_s"] = round(up_at, 2) if up_at is not None else None
        d["status_at_end"] = next((s.get("status") for s in i1.get("stores", []) if s.get("name") == "todos"), None)
        d["connections_accepted"] = i1.get("counters", {}).get("connections", 0) - conns0
        d["connections_per_s"] = round(d["connections_accepted"] / window_s, 1)
        d["errors_sent_in_window"] = diff_counts(errors_of(i1), err0)
        d["store_cpu_percent"] = (round((cpu1 - cpu0) / window_s * 100, 1)
                                  if cpu0 is not None and cpu1 is not None else None)
        d["store_alive"] = todo.alive()
        lines = log_lines(bus.fluxd_log, log_start, 100000)
        d["fluxd_log_lines_in_window"] = len(lines)
        d["fluxd_log_mentions"] = {k: sum(1 for ln in lines if k in ln) for k in ("too-large", "todos", "register")}
        d["fluxd_log_sample"] = [ln[:240] for ln in lines[:3]]
        d["store_log_sample"] = [ln[:240] for ln in log_lines(os.path.join(bus.dir, "todo-store.log"), 0, 4)]
        d["samples"] = samples[::4]
        todo.stop(signal.SIGKILL)
        disp.close()
        return d

    # 11 ---------------------------------------------------------------------------------------------------
    CEQ_CASES = [
        ("move", '[{"op":"move","from":"/%s","path":"/%s"}]', "NFC", "NFD"),
        ("copy", '[{"op":"copy","from":"/%s","path":"/%s"}]', "NFC", "NFD"),
        ("test", '[{"op":"test","path":"/%s","value":1}]', "NFD", None),
        ("add", '[{"op":"add","path":"/%s","value":2}]', "NFD", None),
        ("remove", '[{"op":"remove","path":"/%s"}]', "NFD", None),
    ]

    def attack_equivalent_keys(self, bus):
        """A state {"\\u00e9":1} (é, one code point) and patches naming "e\\u0301" (e + combining acute: the
        canonically equivalent, decomposed spelling): a distinct key for JSON and JSON Pointer. fluxd's retained
        state against the state the patch should make, computed here with keys compared as code points."""
        u = self.users()
        d = {"users": u, "cases": []}
        keys = {"NFC": "\u00e9", "NFD": "e\u0301"}
        for enc_name in ("escaped", "utf8"):
            def text(k):
                return json.dumps(k, ensure_ascii=(enc_name == "escaped"))[1:-1]
            for case, tmpl, a, b in self.CEQ_CASES:
                name = f"ceq-{case}-{enc_name}"
                state_text = "{%s:1}" % json.dumps(keys["NFC"], ensure_ascii=(enc_name == "escaped"))
                patch_text = tmpl % ((text(keys[a]), text(keys[b])) if b else (text(keys[a]),))
                state = json.loads(state_text)
                patch = json.loads(patch_text)
                try:
                    expected = apply_patch(state, patch)
                    expect = "applies"
                except ValueError as e:
                    expected = state
                    expect = f"fails ({e})"
                c = {"case": case, "encoding": enc_name, "patch": patch_text, "expected": expect,
                     "expected_state": expected}
                p = ready_peer(bus.sock, role="store", name=name, uid=u["attacker"])
                c["register"] = register_store(p, name, state_text.encode()) or "registered"
                secs, outcome, codes, _ = exchange(
                    p, enc(b'{"op":"patch","store":"%s","patch":' % name.encode() + patch_text.encode() + b"}"),
                    10.0, "ceq")
                c["fluxd"] = outcome_text(outcome, codes)
                c["cut_patch_failed"] = "patch-failed" in codes and outcome == "closed"
                p.close()
                g = get_state(bus.sock, u["other"], name, 10.0)
                c["retained"] = g.get("state") if g.get("result") == "got" else g.get("result")
                c["retained_version"] = g.get("version")
                applied_ok = outcome == "answered" and not codes
                if expect == "applies":
                    c["agree"] = applied_ok and c["retained"] == expected
                else:
                    c["agree"] = (not applied_ok) and c["retained"] == state
                d["cases"].append(c)
        d["agree"] = sum(1 for c in d["cases"] if c["agree"])
        d["disagree"] = len(d["cases"]) - d["agree"]
        return d

    # --------------------------------------------------------------------------------------------------
    ATTACKS = [
        ("0", "no attack (noise floor)", []),
        ("1", "layered waitFor registrations", []),
        ("1b", "layered registrations from 200 connections, which then leave", []),
        ("2a", "queries, store with queryDeltas", []),
        ("2b", "queries, store without queryDeltas (whole sets)", []),
        ("3", "subscribes to made-up names", []),
        ("4a", "connections holding unfinished 1 MiB frames", []),
        ("4b", "dispatchers that never read", []),
        ("4c", "silent connection flood", []),
        ("5a", "heartbeat peer that never answers", ["--ping-interval", "200"]),
        ("5b", "stopped store, reported", ["--store-timeout", "1000"]),
        ("5b'", "stopped store, closed", ["--store-timeout", "1000", "--close-stalled-stores"]),
        # issue 24: a durable fluxd whose socket other users may use (their attackers run as another uid)
        ("6a", "patch copy bomb, 16 ops", DURABLE_SHARED),
        ("6b", "patch copy bomb, 24 ops", DURABLE_SHARED),
        ("6c", "patch copy bomb, 40 ops", DURABLE_SHARED),
        ("7a", "patches of 22,000 new keys into one object, repeated", DURABLE_SHARED),
        ("7b", "patches of 26,000 inserts at /a/0, repeated", DURABLE_SHARED),
        ("8a", "one path subscribe repeated 2,000 times on a 1 MB whole-state store", DURABLE_SHARED),
        ("8b", "10,000 path subscriptions on a patching store", DURABLE_SHARED),
        ("9", "restart after 10k-100k journaled patches", DURABLE_SHARED),
        ("10", "todo-store with 20,000 todos registering again", DURABLE_SHARED + ["--store-timeout", "2000",
                                                                                 "--close-stalled-stores"]),
        ("11", "canonically equivalent keys in patches", DURABLE_SHARED),
        # issue 25: what all peers share (the metrics endpoint first)
        ("12a", "1,000 stores x 64 reject codes, then metrics scrapes", DURABLE_SHARED + ["--metrics", "127.0.0.1:0"]),
        ("12b", "80 slow clients on the metrics endpoint (slowloris)", DURABLE_SHARED + ["--metrics", "127.0.0.1:0"]),
        ("13a", "history from the oldest seq and 10 state-at in a row on a journal of 1M actions", DURABLE_SHARED),
        ("13b", "reload of a config file of the maximum size (1 MiB), 10 in a row and a SIGHUP",
         DURABLE_SHARED + ["--config", "{config}"]),
        ("14a", "120,000 settled session dispatches from another user against a down store", DURABLE_SHARED),
        ("14b", "recover of 4,096 ids with 102,400 actions unsettled", DURABLE_SHARED),
        ("15", "another user's 900 KB actions and states on a 256 MiB journal disk", DURABLE_SHARED + ["--data-ext4-mib", "256"]),
    ]

    # 13a, 13b ------------------------------------------------------------------------------------------------
    def fill_journal(self, sock, n):
        """A store registers `h` and answers `done` to each of `n` actions that a client dispatches (1,000 in flight,
        pipelined: below the store's queueLimit, so none is refused): (seconds, actions answered)."""
        store = ready_peer(sock, role="store", name="journal-filler")
        store.send(enc({"op": "register", "store": "h", "handles": ["h/*"], "state": {"n": 0}}))
        store.until(lambda b: op_of(b) == "registered", 30, "registered h")
        client = ready_peer(sock, name="journal-dispatcher")
        t0 = now()
        sent = answered = 0
        one = enc(b'{"op":"dispatch","type":"h/a","payload":{"k":"some payload of a typical size"}}')
        while answered < n:
            k = min(n - sent, 1000 - (sent - answered))
            if k > 0:
                client.send(one * k)
                sent += k
            body = store.frame(60)
            if body is None:
                raise EOFError("the filling store's connection was closed")
            answers = []
            while body is not None:
                if op_of(body) == "action":
                    seq = SEQ_RE.search(body).group(1)
                    answers.append(enc(b'{"op":"done","store":"h","seq":%s}' % seq))
                body = store._take()
            if answers:
                store.send(b"".join(answers))
                answered += len(answers)
        secs = now() - t0
        store.close()
        client.close()
        return secs, answered

    @staticmethod
    def timed_request(peer, frame, rid, reply_op, timeout=120.0):
        """Sends one request and waits for its reply or error (by id): (seconds, op or error code, body)."""
        t0 = now()
        peer.s.settimeout(timeout)
        peer.send(enc(frame))
        ref = b'"%s"' % rid.encode()
        body = peer.until(lambda b: op_of(b) in (reply_op, "error") and ref in b[:400], timeout, reply_op)
        return round(now() - t0, 3), (reply_op if op_of(body) == reply_op else code_of(body)), body

    def attack_journal_reads(self, bus):
        """A journal of 1M actions (a store answers each), then a privileged reader (fluxd's own uid) asks `history`
        from the oldest seq, then 10 `state-at` in a row (each waits for the one before), then 10 pipelined at once
        (the per-connection limit refuses what passes it); an `info` from another connection is timed during each
        read."""
        n = self.n(1_000_000)
        d = {"actions": n}
        secs, answered = self.fill_journal(bus.sock, n)
        d["fill_seconds"], d["answered"] = round(secs, 1), answered
        reader = ready_peer(bus.sock, name="journal-reader")  # fluxd's own uid: privileged (SPEC 8.11)
        i0 = bus.info()
        d["loop_hold_before_reads_us"] = load_of(i0).get("longestLoopHoldMicros")
        d["rss_before_reads_kib"] = proc_status(bus.fluxd.pid).get("VmRSS")

        def during(frame, rid, reply_op):
            box = {}
            t = threading.Thread(target=lambda: box.update(r=self.timed_request(reader, frame, rid, reply_op)))
            t.start()
            i_t0 = now()
            bus.info()
            info_s = round(now() - i_t0, 3)
            t.join()
            return box.get("r", (None, "no answer", b"")), info_s

        (secs, outcome, body), info_s = during({"op": "history", "id": "h0", "limit": 1000}, "h0", "history")
        d["history"] = {"seconds": secs, "outcome": outcome, "bytes": len(body), "info_during_s": info_s,
                        "entries": body.count(b'"seq":')}
        d["state_at"] = []
        for i in range(10):
            rid = f"s{i}"
            (secs, outcome, body), info_s = during({"op": "state-at", "id": rid, "store": "h", "seq": n // 2 + i},
                                                   rid, "state-at")
            d["state_at"].append({"seconds": secs, "outcome": outcome, "info_during_s": info_s})
        reader.s.settimeout(300)
        t0 = now()
        reader.send(b"".join(enc({"op": "state-at", "id": f"p{i}", "store": "h", "seq": i + 1}) for i in range(10)))
        got = {}
        while len(got) < 10:
            body = reader.until(lambda b: op_of(b) in ("state-at", "error"), 300, "pipelined state-at")
            m = re.search(rb'"(?:id|ref)":"(p\d+)"', body)
            if m:
                got[m.group(1).decode()] = "state-at" if op_of(body) == "state-at" else code_of(body)
        d["pipelined"] = {"seconds": round(now() - t0, 3), "outcomes": fmt_counts_plain(got)}
        d["rss_after_reads_kib"] = proc_status(bus.fluxd.pid).get("VmRSS")
        reader.close()
        return d

    def attack_big_reload(self, bus):
        """fluxd runs with a config file of the most a config file may hold (1 MiB: one worker with a large env
        table, the rest comment lines); a privileged client (fluxd's own uid) sends `reload` 10 times in a row
        (each waits for the one before), then 4 at once, and fluxd gets a SIGHUP; an `info` from another connection
        is timed during each reload."""
        d = {"config_bytes": os.path.getsize(bus.config)}
        admin = ready_peer(bus.sock, name="reloader")
        d["reloads"] = []
        for i in range(10):
            box = {}
            rid = f"r{i}"
            t = threading.Thread(target=lambda: box.update(r=self.timed_request(admin, {"op": "reload", "id": rid},
                                                                                rid, "reloaded")))
            t.start()
            i_t0 = now()
            bus.info()
            info_s = round(now() - i_t0, 3)
            t.join()
            secs, outcome, _ = box.get("r", (None, "no answer", b""))
            d["reloads"].append({"seconds": secs, "outcome": outcome, "info_during_s": info_s})
        t0 = now()
        admin.send(b"".join(enc({"op": "reload", "id": f"q{i}"}) for i in range(4)))
        outcomes = []
        for _ in range(4):
            body = admin.until(lambda b: op_of(b) in ("reloaded", "error"), 60, "pipelined reload")
            outcomes.append(op_of(body) if op_of(body) == "reloaded" else code_of(body))
        d["pipelined"] = {"seconds": round(now() - t0, 3), "outcomes": outcomes}
        os.kill(bus.fluxd.pid, signal.SIGHUP)
        bus.info()
        admin.close()
        return d

    # 12a, 12b ------------------------------------------------------------------------------------------------
    def metrics_url(self, bus, timeout=20.0):
        deadline = now() + timeout
        while now() < deadline:
            with open(bus.fluxd_log, "rb") as f:
                m = re.search(rb"metrics on (http://[^\s]+/metrics)", f.read())
            if m:
                return m.group(1).decode()
            time.sleep(0.05)
        raise RuntimeError("fluxd did not say where its metrics are")

    @staticmethod
    def scrape(url, timeout=60.0):
        t0 = now()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                body = r.read()
            return round(now() - t0, 3), len(body), body
        except Exception as e:  # noqa: BLE001 (the outcome is the answer)
            return round(now() - t0, 3), None, repr(e).encode()

    def attack_metrics_series(self, bus):
        """Another user registers 1,000 stores and rejects one action per code, 64 codes per store (64,000 labelled
        series); then three scrapes, each followed by an `info` round trip (which waits for whatever holds the
        loop)."""
        stores, codes = self.n(1000), 64
        u = self.users()
        d = {"stores": stores, "codes": codes, "users": u}
        url = self.metrics_url(bus)
        store = ready_peer(bus.sock, role="store", name="many-stores", uid=u["attacker"])
        for i in range(stores):
            store.send(enc({"op": "register", "store": f"m{i}", "handles": [f"m{i}/*"]}))
            body = store.until(lambda b: op_of(b) in ("registered", "error"), 30, f"registered m{i}")
            if op_of(body) != "registered":
                d["register"] = f"m{i}: {code_of(body)}"
                break
        client = ready_peer(bus.sock, name="many-codes", uid=u["attacker"])
        t0 = now()
        fill_reject_series(store, client, stores, codes, prefix="m")
        d["fill_seconds"] = round(now() - t0, 1)
        d["scrapes"] = []
        for _ in range(3):
            secs, nbytes, body = self.scrape(url)
            i0 = now()
            bus.info()
            d["scrapes"].append({"seconds": secs, "bytes": nbytes, "info_after_s": round(now() - i0, 3),
                                 "rejected_series": body.count(b"\nfluxbus_actions_rejected_total{")})
        store.close()
        client.close()
        return d

    def attack_metrics_slowloris(self, bus):
        """80 connections to the metrics endpoint that each send half a request head and never the rest; meanwhile
        three real scrapes, one after the other."""
        url = self.metrics_url(bus)
        host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
        d = {"slow": 80}
        slow = []
        for _ in range(d["slow"]):
            c = socket.create_connection((host, int(port)), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(c)
        d["scrapes"] = []
        for _ in range(3):
            secs, nbytes, _ = self.scrape(url, timeout=30.0)
            d["scrapes"].append({"seconds": secs, "answered": nbytes is not None})
        ended = 0
        for c in slow:
            c.settimeout(10)
            try:
                while c.recv(4096):
                    pass
                ended += 1
            except OSError:
                ended += 1  # reset: closed with its half head unread
            c.close()
        d["slow_ended_by_fluxd"] = ended
        return d

    # 14a, 14b, 15 ------------------------------------------------------------------------------------------
    def own_session_dispatch(self, bus, session, rid):
        """The well-behaved user's settled dispatch under `session` to the bench store; returns its connection."""
        mine = ready_peer(bus.sock, name="mine", session=session)
        mine.send(enc({"op": "dispatch", "id": rid, "type": "b0/act", "settle": True}))
        mine.until(lambda b: op_of(b) in ("settled", "error") and rid.encode() in b, 20, f"settled {rid}")
        return mine

    def recover_status(self, peer, ids, timeout=60.0):
        t0 = now()
        peer.send(enc({"op": "recover", "id": "rc", "ids": ids}))
        body = peer.until(lambda b: op_of(b) in ("recovered", "error"), timeout, "recovered")
        took = round(now() - t0, 3)
        if op_of(body) != "recovered":
            return took, {"error": code_of(body)}
        counts = {}
        for o in json.loads(body)["outcomes"]:
            tally(counts, o["status"])
        return took, counts

    def down_store(self, bus, name, uid):
        """A store of `uid` registered and gone: actions for it queue (queueLimit), then settle unavailable."""
        s = ready_peer(bus.sock, role="store", name=name, uid=uid)
        s.send(enc({"op": "register", "store": name, "handles": [f"{name}/*"]}))
        s.until(lambda b: op_of(b) in ("registered", "error"), 20, f"registered {name}")
        s.close()

    def pipelined(self, peer, frames, window=512, timeout=120.0, answer=("settled", "error"), expect=None):
        """Sends `frames` keeping up to `window` unanswered until `expect` (all) are answered; returns {op or error
        code: count}."""
        counts, sent, got, deadline = {}, 0, 0, now() + timeout
        frames = list(frames)
        expect = len(frames) if expect is None else expect
        while got < expect and now() < deadline:
            batch = []
            while sent < len(frames) and sent - got < window:
                batch.append(frames[sent])
                sent += 1
            if batch:
                peer.send(b"".join(batch))
            body = peer.frame(max(0.001, deadline - now()))
            if body is None:
                tally(counts, "eof")
                break
            op = op_of(body)
            if op in answer:
                got += 1
                tally(counts, code_of(body) if op == "error" else op)
        return counts

    def attack_outcome_flood(self, bus):
        """The well-behaved user settles one dispatch under its session; another user then makes 120,000 settled
        dispatches under a session against its own store that is down (the first 1,024 queue, the rest settle at
        once as unavailable); then the well-behaved user recovers its dispatch."""
        u = self.users()
        n = self.n(120_000)
        d = {"dispatches": n, "users": u}
        mine = self.own_session_dispatch(bus, "well-behaved-session", "mine-1")
        self.down_store(bus, "down14", u["attacker"])
        flooder = ready_peer(bus.sock, name="outcome-flooder", uid=u["attacker"], session="flood")
        t0 = now()
        frames = (enc(b'{"op":"dispatch","id":"f-%d","type":"down14/x","settle":true}' % i) for i in range(n))
        # (A window above queueLimit: the first 1,024 stay queued, unanswered, for the store that is down.)
        d["attacker_answers"] = self.pipelined(flooder, frames, window=4096, timeout=300.0, expect=n - 1024)
        d["flood_seconds"] = round(now() - t0, 2)
        took, d["recover_mine"] = self.recover_status(mine, ["mine-1"])
        d["recover_mine_seconds"] = took
        flooder.close()
        mine.close()
        return d

    def attack_recover_unsettled(self, bus):
        """Another user leaves 102,400 actions unsettled (100 stores of its own, down, their queues full); the
        well-behaved user then sends one `recover` naming 4,096 ids, three times."""
        u = self.users()
        stores = self.n(100)
        d = {"stores": stores, "users": u}
        for i in range(stores):
            self.down_store(bus, f"q{i}", u["attacker"])
        conns = [ready_peer(bus.sock, name=f"filler{c}", uid=u["attacker"]) for c in range(2)]
        t0 = now()
        for i in range(stores):
            c = conns[i % 2]
            c.send(b"".join(enc(b'{"op":"dispatch","type":"q%d/x"}' % i) for _ in range(1024)))
        for c in conns:  # every dispatch read (and queued) before the recovers
            c.send(enc({"op": "ping", "id": "filled"}))
            c.until(lambda b: op_of(b) == "pong", 120, "pong filled")
        info = bus.info(60)
        d["unsettled"] = sum(st.get("queued", 0) + st.get("inflight", 0) for st in info.get("stores", []))
        d["fill_seconds"] = round(now() - t0, 2)
        mine = self.own_session_dispatch(bus, "well-behaved-session", "mine-1")
        d["recovers"] = []
        for _ in range(3):
            took, counts = self.recover_status(mine, ["mine-1"] + [f"x-{i}" for i in range(4095)])
            d["recovers"].append({"seconds": took, "outcomes": counts})
        for c in conns:
            c.close()
        mine.close()
        return d

    def attack_disk_flood(self, bus):
        """On a 256 MiB file system for the journal, another user's store answers each of that user's 900 KB
        actions with a new 900 KB state, as fast as they go, for 20 s (4 in flight); then fluxd is restarted and
        the well-behaved user dispatches again."""
        u = self.users()
        seconds = max(5.0, 20.0 * self.scale)
        d = {"seconds": seconds, "users": u}
        filler = b"x" * (900 * 1024)
        store = ready_peer(bus.sock, role="store", name="disk-flood-store", uid=u["attacker"])
        store.send(enc({"op": "register", "store": "flood15", "handles": ["flood15/*"]}))
        store.until(lambda b: op_of(b) in ("registered", "error"), 20, "registered flood15")
        store_counts = {}
        stop = threading.Event()

        def answer():
            while not stop.is_set():
                try:
                    body = store.frame(0.5)
                except socket.timeout:
                    continue
                except OSError:
                    break
                if body is None:
                    tally(store_counts, "closed")
                    break
                op = op_of(body)
                if op == "action":
                    seq = json.loads(body)["seq"]
                    store.send(enc(b'{"op":"done","store":"flood15","seq":%d,"state":"%d%s"}' % (seq, seq, filler)))
                    tally(store_counts, "answered")
                elif op == "error":
                    tally(store_counts, code_of(body))
        t = threading.Thread(target=answer, daemon=True)
        t.start()
        client = ready_peer(bus.sock, name="disk-flooder", uid=u["attacker"])
        counts, sent, got, i = {}, 0, 0, 0
        t0 = now()
        used_max = 0
        while now() - t0 < seconds:
            while sent - got < 4:
                client.send(enc(b'{"op":"dispatch","id":"d%d","type":"flood15/x","settle":true,"payload":"%s"}' % (i, filler)))
                sent += 1
                i += 1
            try:
                body = client.frame(2.0)
            except socket.timeout:
                tally(counts, "no answer in 2 s")
                got = sent  # the store was closed: its actions wait for it
                continue
            if body is None:
                tally(counts, "eof")
                break
            op = op_of(body)
            if op in ("settled", "error"):
                got += 1
                tally(counts, code_of(body) if op == "error" else op)
            st = os.statvfs(bus.data)
            used_max = max(used_max, (st.f_blocks - st.f_bfree) * st.f_frsize)
        stop.set()
        t.join(3)
        d["flood_seconds"] = round(now() - t0, 1)
        d["disk_after_flood"] = bus.info().get("disk")
        d["attacker_answers"] = counts
        d["attacker_store"] = store_counts
        d["disk_used_max_mib"] = round(used_max / 1048576, 1)
        with open(bus.fluxd_log, "rb") as f:
            text = f.read()
        d["log_disk_full"] = text.count(b"the disk is full")
        d["log_segments_reclaimed"] = text.count(b"deleted history segment")
        d["log_shares"] = (re.search(rb"keeping at most [^\n]*", text) or re.search(rb"$", text)).group(0).decode()[:160]
        client.close()
        store.close()
        d["restart"] = self.restart_after(bus, signal.SIGTERM, 20, 60)
        after = ready_peer(bus.sock, name="after-restart")
        after.send(enc({"op": "dispatch", "id": "after", "type": "b0/act", "settle": True}))
        body = after.until(lambda b: op_of(b) in ("settled", "error"), 30, "settled after")
        d["after_restart_dispatch"] = op_of(body) if op_of(body) == "settled" else code_of(body)
        after.close()
        return d

    def run(self):
        fns = {"0": self.attack_none, "1": self.attack_waitfor, "1b": lambda b: self.attack_waitfor(b, self.n(200)), "2a": lambda b: self.attack_queries(b, True),
               "2b": lambda b: self.attack_queries(b, False), "3": self.attack_subscribes,
               "4a": self.attack_unfinished_frames, "4b": self.attack_never_reading,
               "4c": self.attack_connection_flood, "5a": self.attack_silent_heartbeat,
               "5b": lambda b: self.attack_stopped_store(b, False), "5b'": lambda b: self.attack_stopped_store(b, True),
               "6a": lambda b: self.attack_copy_bomb(b, 16), "6b": lambda b: self.attack_copy_bomb(b, 24),
               "6c": lambda b: self.attack_copy_bomb(b, 40),
               "7a": lambda b: self.attack_quadratic_patches(b, "keys"),
               "7b": lambda b: self.attack_quadratic_patches(b, "inserts"),
               "8a": self.attack_path_subscribe_repeat, "8b": self.attack_many_path_subscriptions,
               "9": self.attack_restart_journal, "10": self.attack_todo_reregister,
               "11": self.attack_equivalent_keys,
               "12a": self.attack_metrics_series, "12b": self.attack_metrics_slowloris,
               "13a": self.attack_journal_reads, "13b": self.attack_big_reload,
               "14a": self.attack_outcome_flood, "14b": self.attack_recover_unsettled, "15": self.attack_disk_flood}
        only = set(self.args.only.split(",")) if self.args.only else None
        t0 = now()
        for key, title, fargs in self.ATTACKS:
            group = re.match(r"\d+", key).group()
            if only and key not in only and key.rstrip("'") not in only and not (int(group) >= 6 and group in only):
                continue
            self.run_attack(key, title, fargs, fns[key])
        self.total_seconds = now() - t0


# ------------------------------------------------------------------------------------------------------ report

def mib(kib):
    return f"{kib / 1024:.0f}" if kib is not None else "?"


def mb(b):
    if b is None:
        return "?"
    return f"{b / 2 ** 20:.1f}" if b < 10 * 2 ** 20 else f"{b / 2 ** 20:.0f}"


def size(b):
    if b is None:
        return "?"
    return f"{b / 2 ** 20:.1f} MiB" if b >= 2 ** 20 else f"{b / 1024:.0f} KiB" if b >= 1024 else f"{b} B"


def ms_us(us):
    return f"{us / 1000:.2f}" if us is not None else "?"


def fmt_ms(v):
    return "?" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.0f}")


def fmt_counts(d):
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) if d else "none"


def g4(v):
    return "?" if v is None else f"{v:.4g}"


def hold_ms(r):
    """The attack's longest loop hold in ms: fluxd's figure, else the time it was seen frozen (a lower bound)."""
    hold = r.get("loop_hold_after_us")
    if hold is not None:
        return hold / 1000
    if r.get("frozen_s"):
        return r["frozen_s"] * 1000
    return None


def hold_text(r):
    hold = r.get("loop_hold_after_us")
    if hold is not None:
        return ms_us(hold)
    if r.get("frozen_s"):
        return f"frozen > {r['frozen_s']:g} s"
    if r.get("watchdog_killed_fluxd"):
        return "? (fluxd killed at the RSS cap)"
    return "?"


def targets(r):
    """(loop hold <= 10 ms, accounted memory within the budget, p99 <= max(2x baseline, baseline + the attack's
    longest hold), no well-behaved errors or refusals), each as (bool|None, text)."""
    out = []
    hold = r.get("loop_hold_after_us")
    if hold is not None:
        out.append((hold <= 10000, f"{hold / 1000:.2f} ms"))
    elif r.get("frozen_s") or r.get("watchdog_killed_fluxd"):
        out.append((False, hold_text(r)))
    else:
        out.append((None, "?"))
    mem = r.get("memory_after") or {}
    if mem.get("peak") is not None and mem.get("limit"):
        out.append((mem["peak"] <= mem["limit"], f"peak {mb(mem['peak'])} / {mb(mem['limit'])} MiB"))
    else:
        out.append((None, "no info after the attack"))
    b, d = r.get("wb_baseline", {}), r.get("wb_during", {})
    h = hold_ms(r)
    failed = sum(d.get("errors", {}).values())
    if failed and failed > 0.01 * d.get("count", 0):
        # a round trip that never settled is slower than any limit: with more than 1% of them, p99 is one of them
        out.append((False, f"{failed} of {d.get('count')} round trips failed ({fmt_counts(d['errors'])})"))
    elif b.get("p99_ms") and d.get("p99_ms"):
        def limit(base):
            return max(2 * base, base + h) if h is not None else 2 * base
        lim, clim = limit(b["p99_ms"]), limit(b["p99_corrected_ms"])
        ok = d["p99_ms"] <= lim
        cok = d["p99_corrected_ms"] <= clim
        text = f"{fmt_ms(d['p99_ms'])} ms, limit {fmt_ms(lim)} ms"
        if h is None:
            text += " (hold unknown: 2x)"
        if cok != ok:
            text += (f"; corrected for omitted round trips {fmt_ms(d['p99_corrected_ms'])} ms, limit "
                     f"{fmt_ms(clim)} ms: {'met' if cok else 'not met'}")
        out.append((ok and cok, text))
    elif b.get("p99_ms") and not d.get("count"):
        out.append((None, "no round trips during the attack"))
    elif b.get("p99_ms"):
        out.append((False, "no round trip answered during the attack"))
    else:
        out.append((None, "?"))
    errs = r.get("wb_total_errors", {})
    n = sum(errs.values())
    out.append((n == 0, "0" if n == 0 else fmt_counts(errs)))
    return out


def attacker_summary(r):
    d = r.get("detail", {})
    k = r["key"]
    if "failure" in r:
        return f"run failed: {r['failure']}"
    if k == "0":
        return "(nothing: a second 5 s window)"
    if k in ("1", "1b"):
        la = r.get("load_after", {})
        return (f"{d['rounds']} x {2 * (d['layers'] + 1)} registers ({d['layers']} layers, {d['connections']} "
                f"connection(s)): {fmt_counts({x: y for x, y in d['replies'].items() if not x.startswith('wide')})}; "
                f"100-entry waitFor: {d['replies'].get('wide (100 waitFor)')}; slowest round {d['round_ms_max']} ms; "
                f"maxCycleCheckSteps {la.get('maxCycleCheckSteps')}")
    if k in ("2a", "2b"):
        return (f"{d['queries_sent']} queries: {fmt_counts(d['replies'])}; store received "
                f"{size(d['store_bytes'])} in {sum(d['store_frames'].values())} frames "
                f"({fmt_counts(d['store_frames'])}), largest {size(d['store_largest_frame'])}"
                + ("; store CUT" if d["store_cut"] else ""))
    if k == "3":
        return (f"{d['subscribes_sent']} subscribes: {fmt_counts(d['replies'])}; storeNames "
                f"{d['storeNames_before']} -> {d['storeNames_during']} -> {d['storeNames_after']} after it left")
    if k == "4a":
        return (f"{d['connections']} x 512 KiB held: refused at connect {fmt_counts(d['refused_at_connect'])}; "
                f"cut {fmt_counts(d['cut'])}; {d['still_holding']} still holding; new connection while held: "
                f"{d['new_connection_while_held']}")
    if k == "4b":
        return (f"{d['clients']} clients, {d['dispatches_sent']} dispatches ({d['MiB_sent']} MiB) in "
                f"{d['seconds']:.0f} s, {d['connections']} connections, {d['cut']} cut; codes "
                f"{fmt_counts(d['codes_received'])}")
    if k == "4c":
        return (f"{d['connected']} silent connections: {fmt_counts(d['codes'])}; new client during: "
                f"{d['new_connection_during']}, after: {d['new_connection_after']}")
    if k == "5a":
        return f"received {', '.join(d['received'])}; closed {d['closed_after_ms']} ms after its hello"
    if k.startswith("5b"):
        s = f"store-stalled event after {d['stalled_event_ms']} ms"
        if d.get("info_stalled_ms") is not None:
            s += f" (info: {d['info_stalled_ms']} ms)"
        if d["closeStalledStores"]:
            s += f"; cut (store-down) after {d['store_down_ms']} ms"
        return s + f"; dispatcher: {d['dispatcher_got']}"
    if k.startswith("6"):
        pt = d["patch"]
        g, third = d.get("get", {}), d.get("third_peer", {})
        return (f"{d['ops']} copies in one {d['frame_bytes']}-byte patch: "
                f"{outcome_text(pt['outcome'], pt['codes'], pt['seconds'])}; another user's `get`: "
                f"{g.get('result')}{' (' + size(g['bytes']) + ')' if g.get('bytes') else ''}; a third user's new "
                f"connection: {third.get('result')}; SIGTERM: {d.get('stop_result')}; restart: "
                + (f"welcome after {d['restart_seconds']:.2f} s" if d.get("restart_seconds") is not None
                   else d.get("restart_result", "?")))
    if k.startswith("7"):
        ts = d.get("patch_seconds", [])
        s = (f"{len(ts)} patches of {d['ops_per_patch']:,} ops ({size(d.get('frame_bytes'))}): first "
             f"{ts[0] if ts else '?'} s, last {ts[-1] if ts else '?'} s "
             f"({d['elements_after']:,} {'keys' if d['kind'] == 'keys' else 'elements'} after)")
        return s + (f"; stopped: {d['stopped']}" if d.get("stopped") else "")
    if k == "8a":
        return (f"{d['subscribes']:,} x the same {d['subscribe_frame_bytes']}-byte path subscribe on a "
                f"{size(d['state_bytes'])} state: answered in "
                f"{d['answered_seconds'] if d.get('answered_seconds') is not None else '?'} s "
                f"({fmt_counts(d['replies'])}); fluxd CPU {d['fluxd_cpu_during_subscribes_s']} s")
    if k == "8b":
        return (f"{d['subscriptions']:,} path subscriptions ({d['connections']} connection"
                f"{'s' if d['connections'] != 1 else ''}; "
                f"{fmt_counts(d['replies'])}): small patch {g4(d['small_before_ms'])} -> {g4(d['small_with_ms'])} ms "
                f"({g4(d['small_ratio'])}x), 2,000-op patch {g4(d['big_before_ms'])} -> {g4(d['big_with_ms'])} ms "
                f"({g4(d['big_ratio'])}x)")
    if k == "9":
        parts = []
        for c in d["counts"]:
            run = d["runs"].get(str(c), {})
            t = run.get("restart_seconds")
            parts.append(f"{c // 1000 if c >= 1000 else c}{'k' if c >= 1000 else ''}: "
                         + (f"{t:.2f} s" if t is not None else
                            (f"> {d['restart_timeout']:g} s" if "no welcome" in str(run.get("restart_result"))
                             else str(run.get("restart_result")))))
        return "restart to welcome after N journaled patches (SIGKILL): " + ", ".join(parts)
    if k == "10":
        again = d.get("registered_again_after_s")
        return (f"{d['todos']:,} todos ({size(d.get('state_bytes'))}); store's connection closed, then for 10 s: "
                + (f"registered again after {again} s" if again is not None else "never registered again")
                + f"; {d['connections_accepted']} connections ({d['connections_per_s']}/s); store CPU "
                  f"{d['store_cpu_percent']}%; errors sent {fmt_counts(d['errors_sent_in_window'])}; fluxd log "
                  f"lines {d['fluxd_log_lines_in_window']} (mentioning too-large "
                  f"{d['fluxd_log_mentions'].get('too-large')})")
    if k == "12a":
        sc = d.get("scrapes", [])
        return (f"{d['stores']:,} stores x {d['codes']} reject codes ({d.get('fill_seconds')} s to make): scrapes "
                + ", ".join(f"{x['seconds']} s ({size(x['bytes'])}, {x['rejected_series']:,} series; info after "
                            f"{x['info_after_s']} s)" for x in sc))
    if k == "14a":
        return (f"{d['dispatches']:,} session dispatches of another user ({d.get('flood_seconds')} s): its answers "
                f"{fmt_counts(d.get('attacker_answers', {}))}; the well-behaved user's earlier outcome on recover: "
                f"{fmt_counts(d.get('recover_mine', {}))}")
    if k == "14b":
        rc = d.get("recovers", [])
        return (f"{d.get('unsettled')} actions unsettled ({d['stores']} down stores of another user); recover of 4,096 "
                "ids: " + ", ".join(f"{x['seconds']} s ({fmt_counts(x['outcomes'])})" for x in rc))
    if k == "15":
        r = d.get("restart", {})
        return (f"{d.get('flood_seconds')} s of 900 KB actions and states from another user: its answers "
                f"{fmt_counts(d.get('attacker_answers', {}))}, its store {fmt_counts(d.get('attacker_store', {}))}; "
                f"disk used at most {d.get('disk_used_max_mib')} of 256 MiB; 'disk is full' log lines "
                f"{d.get('log_disk_full')}, history segments deleted early {d.get('log_segments_reclaimed')}; restart "
                f"{r.get('restart_seconds')} s, then the well-behaved user's dispatch: {d.get('after_restart_dispatch')}")
    if k == "12b":
        sc = d.get("scrapes", [])
        return (f"{d['slow']} slow clients (half a request head each): real scrapes "
                + ", ".join(f"{x['seconds']} s" + ("" if x["answered"] else " (no answer)") for x in sc)
                + f"; {d.get('slow_ended_by_fluxd')} of {d['slow']} slow connections ended by fluxd")
    if k == "13a":
        h, sa = d.get("history", {}), d.get("state_at", [])
        return (f"{d['actions']:,} actions ({d.get('fill_seconds')} s to journal); history from the oldest seq "
                f"{h.get('seconds')} s ({h.get('outcome')}, {h.get('entries')} entries; info during it "
                f"{h.get('info_during_s')} s); 10 state-at in a row "
                + ", ".join(f"{x['seconds']}" for x in sa) + " s (info during them at most "
                + f"{max((x['info_during_s'] for x in sa), default=None)} s); 10 pipelined: "
                + f"{d.get('pipelined', {}).get('outcomes')}")
    if k == "13b":
        rl = d.get("reloads", [])
        return (f"a {size(d['config_bytes'])} config file: 10 reloads in a row "
                + ", ".join(f"{x['seconds']}" for x in rl) + " s ("
                + ", ".join(sorted({str(x['outcome']) for x in rl})) + "; info during them at most "
                + f"{max((x['info_during_s'] for x in rl), default=None)} s); 4 at once: "
                + f"{d.get('pipelined', {}).get('outcomes')}")
    if k == "11":
        bad = [f"{c['case']} ({c['encoding']})" for c in d["cases"] if not c["agree"]]
        return (f"{len(d['cases'])} patches naming e\\u0301 against a state keyed \\u00e9: {d['agree']} agree, "
                f"{d['disagree']} disagree" + (f" ({', '.join(bad)})" if bad else ""))
    return ""


PARAGRAPHS = {
    "0": lambda r, d: (
        "No attack: the same measurement with nothing happening during the second window. It shows how much the "
        "well-behaved client's p99 moves by itself on this shared machine, against which the 2x target is read."),
    "1": lambda r, d: (
        f"One store-role connection registers `a0`, `b0`, then {d['layers']} layers `aN`, `bN` each waiting for "
        f"`a(N-1)` and `b(N-1)` ({d['stores_registered']} registers, pipelined; the names carry a prefix since the "
        f"bench store owns plain `b0`), then a `register` with 100 `waitFor` entries, which got "
        f"`{d['replies'].get('wide (100 waitFor)')}`; then it leaves. The whole layered registration took "
        f"{d['round_ms_max']} ms where the old path walk needed minutes; the longest cycle check visited "
        f"{r.get('load_after', {}).get('maxCycleCheckSteps')} stores and edges."),
    "1b": lambda r, d: (
        f"Attack 1 repeated from {d['connections']} store-role connections (fresh names each, {d['rounds']} rounds "
        f"in {d['left_at_s']} s, {d['stores_registered']:,} stores registered; `maxStoresPerConnection` (1024) bounds one "
        f"connection, and every registered name stays charged to its user's memory share), which then all close at once ({d['left_at_s']} s into the attack), taking "
        f"every store down. One round took {d['round_ms_median']} ms (median; slowest {d['round_ms_max']} ms). fluxd "
        f"remembers the {r.get('load_after', {}).get('storeNames'):,} names after their owners left; they stay "
        f"charged to the memory budget (used {mb(r.get('memory_after', {}).get('used'))} MiB after). An `info` reply "
        f"listing them held the loop {ms_us(r.get('loop_hold_after_info_us'))} ms (the loop-hold figure after the "
        f"driver's own `info` calls). The disconnects (store-down of every store, one summary log line per "
        f"connection) are counted in `longestLoopHoldMicros` like reads, accepts and timers."),
    "2a": lambda r, d: (
        f"The store `qs` registered with `queryDeltas: true` and read everything. The attacker pipelined "
        f"{d['queries_sent']} queries of {d['query_frame_bytes']} bytes (500 per batch) and got "
        f"{fmt_counts(d['replies'])}; then it closed. The store received {d['store_bytes']:,} bytes in total "
        f"({fmt_counts(d['store_frames'])}): one small delta per accepted query and one frame withdrawing them all "
        f"(largest frame {d['store_largest_frame']:,} bytes). Store still up afterwards: {d['store_up_after']}."),
    "2b": lambda r, d: (
        f"The same flood against a store that did not opt in, so fluxd sends it whole `queries` sets, one per "
        f"batch of reads (the changes of up to 64 KiB of frames coalesced): the store received {d['store_bytes']:,} bytes ({fmt_counts(d['store_frames'])}, largest frame "
        f"{d['store_largest_frame']:,} bytes), and the attacker got {fmt_counts(d['replies'])}. The volume grows "
        f"with the accepted queries times the batches; `maxQueries`/`maxQueryBytes` bound it per connection. The store "
        f"(reading in its own process) was " + (
            ("closed by fluxd" + ("" if any(k.startswith("error") for k in d["store_frames"]) else
                                  " without receiving any `error` frame first") + f" after {d['store_bytes']:,} bytes"
             if d["store_cut"] else "not closed") + f"; still up afterwards: {d['store_up_after']}.")),
    "3": lambda r, d: (
        f"{d['subscribes_sent']:,} `subscribe`s to distinct made-up names, 2,000 per pipelined batch: "
        f"{fmt_counts(d['replies'])}. While it held them fluxd knew {d['storeNames_during']} store names (accounted "
        f"{mb(d['memory_used_during'])} MiB, RSS {mib(d['rss_during_kib'])} MiB); {d['forgotten_after_s']} s after "
        f"the attacker closed it knew {d['storeNames_after']} (before: {d['storeNames_before']}); RSS then "
        f"{mib(d['rss_after_leave_kib'])} MiB (jemalloc keeps freed pages)."),
    "4a": lambda r, d: (
        f"{d['connections']} client connections each said hello, announced a 1 MiB frame and sent 512 KiB of it, "
        f"with the default budget (1 GiB total, 256 MiB per uid; all connections here share one uid, the "
        f"well-behaved client's included). Refused at connect: {fmt_counts(d['refused_at_connect'])}; cut while "
        f"sending: {fmt_counts(d['cut'])}; {d['still_holding']} held their frames to the end. With the frames held "
        f"fluxd accounted {mb(d['memory_with_frames_held']['used'])} MiB (limit "
        f"{mb(d['memory_with_frames_held']['limit'])} MiB), RSS {mib(d['rss_with_frames_held_kib'])} MiB; a new "
        f"connection from the same uid then got `{d['new_connection_while_held']}`. The well-behaved client, "
        f"connected before, kept working within its allowance."),
    "4b": lambda r, d: (
        f"{d['clients']} clients pipelined settled `b0/act` dispatches with {d['payload_bytes']}-byte payloads "
        f"without ever reading, reconnecting when cut, for {d['seconds']:.0f} s: {d['dispatches_sent']:,} "
        f"dispatches ({d['MiB_sent']} MiB) over {d['connections']} connections, {d['cut']} of them cut. What they "
        f"were sent (read after the fact): {fmt_counts(d['ops_received'])}; error codes "
        f"{fmt_counts(d['codes_received'])}. Accounted memory sampled every 0.5 s peaked at "
        f"{mb(d['memory_used_max_sampled'])} MiB. The well-behaved client dispatches to the same store `b0`, so "
        f"its actions wait behind the flood's in `b0`'s queue (`fairPending` keeps it from being refused)."),
    "4c": lambda r, d: (
        f"{d['connections']} connections opened in {d['open_seconds']} s and kept silent (fd limit "
        f"{d['fd_limit']}; connect errors: {fmt_counts(d['connect_errors'])}): fluxd had "
        f"{d['handshakes_during']} in the handshake ({d['fluxd_fds_during']} fds open). They got "
        f"{fmt_counts(d['codes'])} (first `timeout` {d['first_timeout_s']} s after the flood began). A new client "
        f"during the flood got `{d['new_connection_during']}`, after it `{d['new_connection_after']}`."),
    "5a": lambda r, d: (
        f"A client that asked for heartbeats (`pingInterval` {d['pingInterval']} ms, `maxPingsOut` "
        f"{d['maxPingsOut']}) and never answers received {', '.join(d['received'])} and was closed "
        f"{d['closed_after_ms']} ms after its hello (expected about pingInterval x (maxPingsOut + 1))."),
    "5b": lambda r, d: (
        f"todo-store was sent SIGSTOP, then a client dispatched `todo/create` to it (`--store-timeout 1000`): "
        f"the `store-stalled` monitor event came {d['stalled_event_ms']} ms after the dispatch, `info` showed "
        f"`stalled` at {d['info_stalled_ms']} ms (`stalledFor` {d['info_stalledFor']}; polled every 50 ms). The store "
        f"stays up while stalled; the driver killed it at {d['killed_ms']} ms, and the dispatcher got: "
        f"{d['dispatcher_got']} (after `queueTimeout`)."),
    "5b'": lambda r, d: (
        f"The same with `--close-stalled-stores`: `store-stalled` after {d['stalled_event_ms']} ms and the store "
        f"cut (`store-down` event) after {d['store_down_ms']} ms; its action went back to the queue and, with no "
        f"new owner, the dispatcher got: {d['dispatcher_got']}."),
}


def users_text(d):
    u = d.get("users", {})
    if u.get("attacker") is None:
        return ("The attacker ran as the well-behaved client's uid (the driver was not root, so it could not connect "
                "as another user). ")
    return (f"The attacker ran as uid {u['attacker']} (the other peers as uids {u['other']} and {u['third']}), the "
            f"well-behaved client and the bench store as uid {u['well_behaved']}, fluxd's own. ")


def restart_text(d, what="fluxd"):
    s = (f"Then {what} was sent {d.get('stop_signal')}: {d.get('stop_result')}"
         + (f" after {d['stop_seconds']} s" if d.get("stop_seconds") is not None else ""))
    if d.get("stop_log"):
        s += f" (its log: `{' / '.join(d['stop_log'])[:400]}`)"
    s += "; started again on the same data folder, it "
    if d.get("restart_seconds") is not None:
        s += f"answered hello with welcome after {d['restart_seconds']:.2f} s"
        g = d.get("after_restart_get")
        if g:
            s += (", and a `get` of the store then " + ("returned the state" if g.get("result") == "got" else
                                                      f"got {g.get('result')}")
                  + (f" (version {g.get('version')}, {size(g.get('bytes'))})" if g.get("bytes") else ""))
    else:
        s += f"gave {d.get('restart_result')}"
    return s + "."


def par_copy_bomb(r, d):
    pt = d["patch"]
    g, third = d.get("get", {}), d.get("third_peer", {})
    ops = d["ops"]
    return (users_text(d) + f"A store registered `bombs` with the state `{{\"a\":1}}`, then sent one unsolicited "
            f"`patch` of {ops} operations `{{\"op\":\"copy\",\"from\":\"\",\"path\":\"/kN\"}}` (N = 1..{ops}; a "
            f"{d['frame_bytes']}-byte frame), each copying the whole state into a new member of it, so that the state "
            f"doubles with every operation (2^{ops} copies of the first member at the end). A `ping` after it on the "
            f"same connection: {outcome_text(pt['outcome'], pt['codes'], pt['seconds'])}"
            + (f" (fluxd did not answer within {r.get('frozen_s'):g} s: frozen)" if pt["outcome"] == "timeout" else "")
            + f". Another user's `get` of the store: {g.get('result')}"
            + (f" ({size(g['bytes'])}, version {g.get('version')})" if g.get("bytes") else "")
            + f" after {g.get('seconds')} s; a new connection of a third user: {third.get('result')} after "
              f"{third.get('seconds')} s; fluxd's `info` then showed the store as {d.get('store_after')}. "
            + restart_text(d))


def par_quadratic(r, d):
    ts = d.get("patch_seconds", [])
    kind = d["kind"]
    what = ("`add` operations of new members `/o/kNNNNNN` to one object (`{\"o\":{}}` at first)" if kind == "keys"
            else "`add` operations at `/a/0` (each inserts before the first element of the array `a`)")
    s = (users_text(d) + f"A store sent patches of {d['ops_per_patch']:,} {what}, {size(d.get('frame_bytes'))} each "
         f"(under maxFrame), one after another ({d['patches_planned']} planned; "
         + (f"none sent after {d['stopped']}" if d.get("stopped") else "all sent")
         + "). Each was timed from sending it to fluxd's `pong` for "
         f"a `ping` sent after it on the same connection: "
         f"{', '.join(f'{t:g}' for t in ts)} s (first {ts[0] if ts else '?'} s, last {ts[-1] if ts else '?'} s, "
         f"{d['elements_after']:,} {'keys' if kind == 'keys' else 'elements'} then). ")
    if any(o != "answered" for o in d.get("outcomes", [])):
        s += f"What fluxd answered: {', '.join(d['outcomes'])}. "
    return s


def par_path_repeat(r, d):
    return (users_text(d) + f"A store published whole states of {size(d['state_bytes'])} (`state`, not patches) of "
            f"`bigstat`, a new one every 0.5 s ({d['states_published']} in all; publisher: {d['publisher']}). Another "
            f"user pipelined the same {d['subscribe_frame_bytes']}-byte `subscribe` with `path` `/k/170/v` "
            f"{d['subscribes']:,} times in one write: fluxd answered them all in "
            f"{d['answered_seconds'] if d.get('answered_seconds') is not None else '?'} s "
            f"({fmt_counts(d['replies'])}) and used {d['fluxd_cpu_during_subscribes_s']} s of CPU meanwhile. The first "
            f"state: {d['first_state']}.")


def par_many_paths(r, d):
    return (users_text(d) + f"A store registered `paths` with a {size(d['state_bytes'])} state (`/s` with "
            f"{d['subscriptions']:,} members, `/x` with a number and a 2,000-element array) and patched it. Timed "
            f"per patch (a batch of pipelined patches and a ping, minus a lone ping's round trip, median of several "
            f"batches): a one-op patch of `/x/n` and a 2,000-op patch of `/x/a/*`, none touching a subscribed path. "
            f"Then another user made {d['subscriptions']:,} path subscriptions to `/s/pN` over {d['connections']} "
            f"connection{'s' if d['connections'] != 1 else ''} (at most 4,000 each; maxSubscriptions is 4,096) in "
            f"{d['subscribe_seconds']} s "
            f"({fmt_counts(d['replies'])}; fluxd CPU {d['subscribe_fluxd_cpu_s']} s), and the same patches were "
            f"timed again: the small patch {g4(d['small_before_ms'])} ms without path subscriptions, "
            f"{g4(d['small_with_ms'])} ms with them ({g4(d['small_ratio'])}x); the 2,000-op patch "
            f"{g4(d['big_before_ms'])} ms, "
            f"then {g4(d['big_with_ms'])} ms ({g4(d['big_ratio'])}x). Target: within 2x. "
            + "".join(f"The {x.replace('_', ' ')} timing stopped: {d[x]}. " for x in
                      ("small_before", "big_before", "small_with", "big_with") if d.get(x) != "answered")
            + f"The subscribers were sent "
            f"{fmt_counts(d['subscribers_sent_during_patches'])} for these patches.")


def par_restart(r, d):
    rows = []
    for c in d["counts"]:
        run = d["runs"].get(str(c), {})
        t = run.get("restart_seconds")
        g = run.get("after_restart_get") or {}
        rows.append(f"{c:,} patches (journaled in {run.get('journal_seconds')} s: {run.get('journal')}): "
                    + (f"welcome after {t:.2f} s" + (f", the store then at version {g.get('version')}"
                                                     if g.get("version") else "")
                       if t is not None else str(run.get("restart_result"))))
    return (users_text(d) + f"A store registered `jrnl` (a small state) and sent small patches (one `replace` each), "
            f"1,000 per pipelined batch; then fluxd was SIGKILLed (a clean stop writes a checkpoint; a kill leaves "
            f"the patches in the journal) and started again on its data folder, timed from its start to a welcome "
            f"on its socket (at most {d['restart_timeout']:g} s). The largest count ran on the attack's fluxd with "
            f"the well-behaved client beside it (the figures in the table are for that part: they end before the "
            f"kill); the others each on a fluxd of their own. " + "; ".join(rows) + ". Target: 100,000 in under 1 s.")


def par_todo(r, d):
    again = d.get("registered_again_after_s")
    return (users_text(d) + f"The real `todo-store` (release build; fluxd saw its owner as uid "
            f"{d.get('store_owner_uid')}) got {d['todos']:,} todos "
            f"(`todo/create`, 256 in flight; {fmt_counts(d['create_results'])} in {d['create_seconds']} s; the "
            f"retained state then {size(d.get('state_bytes'))}, version {d.get('state_version')}). Then it was "
            f"stopped (SIGSTOP) with an action delivered, so that fluxd closed its connection as stalled "
            f"(`--close-stalled-stores`, after {d.get('connection_closed_after_s')} s), and continued (SIGCONT): "
            f"its SDK reconnects and registers again, with its whole state in `register`. Over the next 10 s: "
            + (f"it registered again after {again} s" if again is not None else "it never registered again")
            + f" (status at the end: {d.get('status_at_end')}); fluxd accepted {d['connections_accepted']} "
              f"connections ({d['connections_per_s']}/s), sent errors {fmt_counts(d['errors_sent_in_window'])}; "
              f"the store used {d['store_cpu_percent']}% of a core; fluxd wrote {d['fluxd_log_lines_in_window']} log "
              f"lines ({d['fluxd_log_mentions'].get('too-large')} mentioning too-large, "
              f"{d['fluxd_log_mentions'].get('todos')} the store)"
            + (f", e.g. `{d['fluxd_log_sample'][0]}`" if d.get("fluxd_log_sample") else "") + ".")


def par_equivalent(r, d):
    rows = []
    for c in d["cases"]:
        rows.append(f"`{c['case']}` ({c['encoding']}): expected {c['expected'].split(' (')[0]}"
                    + (f" -> `{json.dumps(c['expected_state'])}`" if c["expected"] == "applies" else "")
                    + f"; fluxd {c['fluxd']}{' (cut with patch-failed)' if c['cut_patch_failed'] else ''}, retained "
                      f"`{json.dumps(c['retained']) if not isinstance(c['retained'], str) else c['retained']}`: "
                      f"**{'agree' if c['agree'] else 'disagree'}**")
    return (users_text(d) + "For each case a store registered its own store with the state "
            "`{\"\\u00e9\":1}` (é as one "
            "code point) and sent one patch naming `/e\\u0301` (e and a combining acute accent: canonically "
            "equivalent, but another key for JSON and JSON Pointer), with the JSON text escaped (`\\u00e9`) or as "
            "raw UTF-8. Expected: the state the patch makes, computed here with keys compared as code points (never "
            "normalized); a patch that cannot apply must be `patch-failed` with the state unchanged. Another user "
            "then `get`s the store. " + "; ".join(rows) + f". {d['agree']} agree, {d['disagree']} disagree.")


PARAGRAPHS.update({
    "14a": lambda r, d: (
        users_text(d) + "The well-behaved user settles one dispatch under its session; another user then makes "
        f"{d['dispatches']:,} dispatches with `settle` under its own session to a store of its own that is down (the "
        "first 1,024 queue, the rest settle at once as unavailable), pipelined 512 at a time; then the well-behaved "
        "user `recover`s its dispatch. Before issue 25 one ring of 100,000 outcomes served every user: the flood "
        "pushed the well-behaved user's outcome out in 1.4 s and `recover` answered `unknown` (its library then "
        "reports the dispatch as not sent). Now each user holds at most `--max-outcomes` (100,000), the flood's "
        "excess is refused `outcome-quota`, and no other user's outcome goes before the window ends."),
    "14b": lambda r, d: (
        users_text(d) + f"Another user registers {d['stores']} stores and leaves them down, then fills their queues "
        "(1,024 actions each, no settlement asked) from two connections; the well-behaved user then sends `recover` "
        "with 4,096 ids (one of them its own settled dispatch), three times. Before issue 25 `recover` scanned every "
        "unsettled action on the bus (138-206 ms of loop per call at this size); now each id is one look-up."),
    "15": lambda r, d: (
        users_text(d) + "fluxd's data folder is a 256 MiB ext4 file system of its own (a loop device) and fluxd runs with the "
        "default retention and disk share (" + d.get("log_shares", "") + "). Another user's store answers each of "
        f"that user's 900 KB actions with a new 900 KB state, 4 in flight, for {d['seconds']:g} s; then fluxd is "
        "stopped (SIGTERM) and started again, and the well-behaved user dispatches. Before issue 25 the disk was full "
        "in 2 s, every peer got `disk-full`, then every frame to every peer was held (an `info` timed out at 60 s), "
        "nothing was reclaimed, and after the restart dispatches got `disk-full` at once."),
    "6a": par_copy_bomb, "6b": par_copy_bomb, "6c": par_copy_bomb,
    "7a": par_quadratic, "7b": par_quadratic,
    "8a": par_path_repeat, "8b": par_many_paths,
    "9": par_restart, "10": par_todo, "11": par_equivalent,
    "12a": lambda r, d: (
        users_text(d) + f"Another user registers {d['stores']:,} stores on one connection and rejects one action per "
        f"code, {d['codes']} codes per store, so fluxd's metrics hold {d['stores'] * d['codes']:,} labelled series of "
        "`fluxbus_actions_rejected_total`; then the driver scrapes `/metrics` three times, each followed by an `info` "
        "round trip (it waits for whatever holds fluxd's loop). Before issue 25 the first scrape's refresh ran on the "
        "loop and was quadratic in new series (94 s at this size; the scrape gave up after 1 s and served stale "
        "values)."),
    "12b": lambda r, d: (
        f"{d['slow']} TCP connections to the metrics endpoint each send half a request head and never the rest "
        "(slowloris); meanwhile the driver scrapes three times, one after the other. Before issue 25 the endpoint "
        "served one connection at a time with 2 s for its head, so a real scrape waited behind every slow one."),
    "13a": lambda r, d: (
        f"A store answers {d['actions']:,} dispatched actions (journaled: about that many action and result records), "
        "then a reader with fluxd's own uid (history needs privilege, SPEC 8.11) asks `history` from the oldest seq "
        "(limit 1000), then 10 `state-at` of that store one after the other (each reads every segment), then 10 at "
        "once on one connection (4 outstanding per connection are taken, the rest refused `overloaded`); during "
        "each read the driver times an `info` from another connection. Before issue 25 the reads ran on fluxd's "
        "loop: the history page held it 1.07 s (RSS +76 MB: whole segments read), each state-at 0.63 s. "
        + attacker_summary(r) + "."),
    "13b": lambda r, d: (
        f"fluxd runs with a config file of {size(d['config_bytes'])} (the most one may hold: a worker with a "
        "2,000-key env table, the rest comment lines); a client with fluxd's own uid sends `reload` 10 times, one "
        "after the other, then 4 at once (answered in order, one reload at a time), then fluxd gets a SIGHUP; an "
        "`info` from another connection is timed during each reload. Before issue 25 the file was read and parsed "
        "on fluxd's loop. " + attacker_summary(r) + "."),
})


def max_size_config():
    """(13b) A config file of the most fluxd reads (SupervisorConfig.maxBytes, 1 MiB): one worker whose env table
    holds 2,000 keys, padded with comment lines."""
    lines = ["[fluxd]", 'log_level = "info"', "", "[workers.pad]", 'command = "true"', 'restart = "never"', "",
             "[workers.pad.env]"]
    lines += [f'KEY_{i:05d} = "value number {i} of the largest config file fluxd accepts"' for i in range(2000)]
    text = "\n".join(lines) + "\n"
    pad = "# padding: a config file of the most fluxd reads (1 MiB) .....................................\n"
    limit = (1 << 20) - 64
    while len(text) + len(pad) <= limit:
        text += pad
    return text


def fmt_counts_plain(got):
    out = {}
    for v in got.values():
        out[v] = out.get(v, 0) + 1
    return out


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) // 1024} MiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu, "memory": mem,
            "python": platform.python_version(), "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}


# The p99 target of these attacks is bounded by a rule of SPEC §2, not by fluxd's work (stated in the report).
RULE_LIMITS = {
    "4b": ("the well-behaved client dispatches to the same store (`b0`) as the flood. R1 delivers a store's actions "
           "in seq order, so its action waits behind the flood's actions accepted before it (at most `queueLimit`, "
           "1,024, while the store is up; `fairPending` keeps it from being refused): its latency is that queue's "
           "length times the store's time per action, whatever fluxd does. The loop-hold target, fluxd's own "
           "part, is met."),
    "15": ("the well-behaved client's round trip crosses fluxd's loop twice (its dispatch, then its store's `done`), "
           "and each crossing can wait behind one of the flood's 900 KB frames: R1 accepts everything in one global "
           "order, and SPEC §15.2 journals every record in that order before any frame reveals it, so the client's "
           "action and result are written after the 900 KB states staged before them, in the same write. Its p99 is "
           "bounded by its baseline plus two of the attack's longest holds, not one (met against that bound). The "
           "loop-hold target, fluxd's own part, is met."),
}


def write_report(bench, path, command):
    m = machine()
    rs = bench.results
    lines = []
    a = lines.append
    a("# FluxBus attack benchmark (issues 13, 24 and 25)")
    a("")
    a("Generated by `Benchmarks/attack.py` through `scripts/attack-bench.sh`; do not edit by hand. What each limit is "
      "for: [docs/limits.md](../docs/limits.md).")
    a("")
    a(f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    a(f"- Machine: {m['nproc']} cores ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, Python {m['python']}, "
      f"open-file limit {m['fd_limit']}. The cores are shared with other work, so figures vary between runs.")
    a(f"- Command: `{command.strip()}` (scale {bench.scale:g}; total run {bench.total_seconds / 60:.1f} min)")
    if bench.args.note:
        a(f"- {bench.args.note}")
    a("- fluxd: release build, default limits unless the attack names options; a fresh fluxd per attack, with "
      "flux-bench-store serving `b0`.")
    a("- Well-behaved client: its own process, one `dispatch` of `b0/act` with `settle:true` every 10 ms (100 round "
      "trips/s); latency = send to `settled`. Baseline: 5 s before the attack; during: from the attack's start to "
      "its end (at least 5 s). Errors: any round trip not settled `done` within 10 s, over the whole run. Since "
      "the client waits for each round trip, a stall delays round trips it never sends; *corrected* p99 adds them "
      "back (HdrHistogram's expected-interval correction) and the p99 target must hold for both.")
    a("- RSS from /proc: VmRSS just before the attack -> VmHWM (peak) after it. Accounted memory: `info.memory` "
      "peak since start / limit. Loop hold: `info.load.longestLoopHoldMicros` (a maximum since fluxd started) just "
      "before -> just after the attack (read before fluxd builds that `info` reply; what a big reply itself cost is "
      "in the per-attack text). fluxd counts a read callback (up to 64 KiB of frames), an accept, a "
      "connection's close, a timer, a flush of the connections' writes (the journal's writes first) or a wake-up "
      "(the results of work done off the loop) as one hold. The attacker runs in the driver's process, on the same "
      "2 cores as "
      "fluxd, the store and the well-behaved client; the 1-minute load average is in the raw results.")
    a("- Attacks 1-5 connect as the driver's uid, the well-behaved client's. Attacks 6a-15 (issues 24 and 25) run against a "
      "durable fluxd (`--data-dir` in a temporary folder, `--socket-mode 0666`) and, when the driver runs as root, "
      f"connect as other users: the attacker as uid {UID_ATTACKER}, the other peers as uids {UID_OTHER} and "
      f"{UID_THIRD} (a forked child of that uid connects and hands the socket over; todo-store runs as uid "
      f"{UID_ATTACKER}), while the well-behaved client and the bench store are fluxd's own uid. An attack that finds "
      f"fluxd not answering stops waiting after `--freeze-timeout` ({bench.args.freeze_timeout:g} s: *frozen*); "
      f"fluxd is killed if its RSS passes {bench.args.rss_cap_mib} MiB. Where an attack stops or restarts fluxd, "
      "the figures of the table (and the well-behaved client's window) end just before it.")
    a("")
    a("| attack | RSS MiB before -> peak | accounted peak / limit MiB | loop hold ms before -> after | "
      "well-behaved p50 / p99 ms, baseline | during (corrected p99; max) | well-behaved errors | the attacker got |")
    a("|---|---|---|---|---|---|---|---|")
    for r in rs:
        b, d = r.get("wb_baseline", {}), r.get("wb_during", {})
        mem = r.get("memory_after", {})
        a(f"| {r['key']}. {r['title']} | {mib(r.get('rss_before_kib'))} -> {mib(r.get('rss_peak_kib'))} | "
          f"{mb(mem.get('peak'))} / {mb(mem.get('limit'))} | {ms_us(r.get('loop_hold_before_us'))} -> "
          f"{hold_text(r)} | {fmt_ms(b.get('p50_ms'))} / {fmt_ms(b.get('p99_ms'))} | "
          f"{fmt_ms(d.get('p50_ms'))} / {fmt_ms(d.get('p99_ms'))} ({fmt_ms(d.get('p99_corrected_ms'))}; "
          f"{fmt_ms(d.get('max_ms'))}) | "
          f"{sum(r.get('wb_total_errors', {}).values())} | {attacker_summary(r)} |")
    a("")
    a("## Targets")
    a("")
    a("No loop hold over 10 ms; fluxd's accounted memory never above its budget (`info.memory` peak <= limit); the "
      "well-behaved client's p99 during the attack at most max(2x its baseline p99, its baseline p99 + the attack's "
      "longest loop hold), for the raw and the corrected figures alike (round trips that failed count as slower "
      "than any limit: with more than 1% of them failed the p99 target is not met); no error or refusal for the "
      "well-behaved client.")
    a("")
    a("| attack | loop hold <= 10 ms | accounted memory <= budget | p99 <= max(2x baseline, baseline + hold) | "
      "no well-behaved errors or refusals |")
    a("|---|---|---|---|---|")

    def met(ok):
        return "met" if ok else "NOT met" if ok is not None else "unknown"

    def mark(t):
        ok, text = t
        return f"{'met' if ok else 'not met' if ok is not None else '?'} ({text})"

    for r in rs:
        t = targets(r)
        a(f"| {r['key']} | {mark(t[0])} | {mark(t[1])} | {mark(t[2])} | {mark(t[3])} |")
    a("")
    ruled = [r for r in rs if r["key"] in RULE_LIMITS and targets(r)[2][0] is False]
    if ruled:
        a("Targets that a rule of SPEC §2 keeps from being met, with the rule:")
        a("")
        for r in ruled:
            a(f"- {r['key']}: {RULE_LIMITS[r['key']]}")
        a("")
    a("## Per attack")
    a("")
    for r in rs:
        a(f"### {r['key']}. {r['title']}")
        a("")
        fa = " ".join(r["fluxd_args"]) or "(defaults)"
        if "failure" in r:
            a(f"fluxd {fa}. **The run failed**: {r['failure']} (fluxd alive: {r.get('fluxd_alive')}).")
        else:
            d = r.get("detail", {})
            text = PARAGRAPHS[r["key"]](r, d)
            t = targets(r)
            b, du = r.get("wb_baseline", {}), r.get("wb_during", {})
            a(f"fluxd {fa}. {text}")
            a("")
            rss_pk, acc_pk = r.get("rss_peak_kib"), r.get("memory_after", {}).get("peak")
            a(f"fluxd used {r.get('fluxd_cpu_seconds')} s of CPU during the {r.get('attack_seconds')} s attack; its RSS "
              f"peaked at {mib(rss_pk)} MiB against {mb(acc_pk)} MiB accounted at the peak; "
              f"errors it sent (all connections): {fmt_counts(r.get('errors_sent', {}))}. Well-behaved client: "
              f"p50 {fmt_ms(b.get('p50_ms'))} -> {fmt_ms(du.get('p50_ms'))} ms, p99 {fmt_ms(b.get('p99_ms'))} -> "
              f"{fmt_ms(du.get('p99_ms'))} ms (corrected {fmt_ms(b.get('p99_corrected_ms'))} -> "
              f"{fmt_ms(du.get('p99_corrected_ms'))} ms; max {fmt_ms(du.get('max_ms'))} ms; {du.get('count')} round "
              f"trips at {du.get('rate')}/s; slowest at "
              f"{', '.join(f'{x[0]:+.2f} s: {x[1]:g} ms' for x in r.get('wb_slowest', [])[:3])} from the attack's "
              f"start), errors: {fmt_counts(r.get('wb_total_errors', {}))}. Loop hold after the driver's `info` "
              f"replies: {ms_us(r.get('loop_hold_after_info_us'))} ms. Targets: loop hold "
              f"{met(t[0][0])} ({t[0][1]}), accounted memory {met(t[1][0])} ({t[1][1]}), p99 "
              f"{met(t[2][0])} ({t[2][1]}), errors {met(t[3][0])}.")
            if r.get("watchdog_killed_fluxd"):
                w = r["watchdog_killed_fluxd"]
                a("")
                a(f"**The driver killed fluxd** {w['after_s']} s into the attack: its RSS was {w['rss_mib']} MiB "
                  f"(cap {w['cap_mib']} MiB).")
            if not r.get("fluxd_alive", True):
                a("")
                a(f"**fluxd was not running at the end of this attack** (exit {r.get('fluxd_exit')}).")
        a("")
    a("## Raw results")
    a("")
    a("```json")
    a(json.dumps({"machine": m, "scale": bench.scale, "total_seconds": bench.total_seconds, "results": rs},
                 indent=1, sort_keys=True))
    a("```")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--well-behaved":
        well_behaved_main(sys.argv[2], sys.argv[3], PERIOD)
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--query-store":
        query_store_main(sys.argv[2], sys.argv[3] == "1", sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxd", required=True)
    ap.add_argument("--bench-store", required=True)
    ap.add_argument("--todo-store", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", help="comma-separated attack keys (0,1,1b,2a,2b,3,4a,4b,4c,5a,5b,6a,6b,6c,7a,7b,8a,8b,"
                                   "9,10,11,12a,12b,13a,13b; 6 and up select their group, e.g. 12)")
    ap.add_argument("--freeze-timeout", type=float, default=20.0,
                    help="seconds an attack of issue 24 waits for fluxd's answer before reporting it frozen")
    ap.add_argument("--attack-cap", type=float, default=150.0,
                    help="seconds of repeated patches (7a, 7b) after which no further patch is sent")
    ap.add_argument("--restart-timeout", type=float, default=30.0,
                    help="seconds a restarted fluxd has to answer hello (9), else it is reported as slower")
    ap.add_argument("--rss-cap-mib", type=int, default=4096,
                    help="fluxd is killed (and the attack says so) if its RSS passes this")
    ap.add_argument("--note", help="a line for the report's header (e.g. which fluxd was measured)")
    ap.add_argument("--baseline", type=float, default=5.0, help="seconds of baseline per attack")
    ap.add_argument("--out", default=os.path.join(HERE, "ATTACKS.md"))
    ap.add_argument("--command", default="scripts/attack-bench.sh")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (fluxd's logs)")
    args = ap.parse_args()
    bench = Bench(args)
    try:
        bench.run()
    finally:
        if bench.keep or args.keep:
            log(f"kept the logs of failed runs in {bench.tmp}")
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    write_report(bench, args.out, args.command)
    log(f"wrote {args.out} ({bench.total_seconds / 60:.1f} min)")


if __name__ == "__main__":
    main()
