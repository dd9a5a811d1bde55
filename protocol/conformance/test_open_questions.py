"""Scenarios for what SPEC.md used to leave open (issue 26 item 12), each asserting what SPEC now says.

| test | SPEC |
|---|---|
| `test_a_durable_fluxd_stops_without_draining` | §8.8 "A durable fluxd does not drain" |
| `test_a_durable_fluxd_stops_its_workers_first` | §8.8, the same paragraph, with a supervised worker |
| `test_b_actions_restored_unanswered_come_redelivered` | §15.1 (R6), §8.3 `action.redelivered` |
| `test_c_history_orders_targets_by_name_and_results_as_they_became_final` | §8.12 `history` |
| `test_d_state_at_a_seq_above_the_last_is_the_newest_version` | §8.12 `state-at` |
| `test_e_connection_allowances_count_in_memory_per_user` | §12 "The allowances count in `memoryPerUser`" |
| `test_f_queries_changed_batching_envelope` | §8.6 `queries-changed`, "Batching is left to the implementation" |
| `test_g_monitor_sees_disconnect_then_store_down_by_name` | §8.10 "A peer leaving" |
| `test_g_no_store_down_events_when_fluxd_exits` | §8.10 "A peer leaving", §8.8 |

fluxd is `$FLUXD` (else `.build/debug/fluxd`), as for the other conformance tests. The scenarios that need a
durable fluxd (a, b, c, d) start it on a data directory of their own and restart it there; the others run it
`--ephemeral`. Every wait is for a frame (or fluxd's exit) with a deadline; the only polling is of `info`, for
fluxd to notice a connection that closed (e). Standard library only.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import pytest

import run

DEADLINE = 10.0


# ----------------------------------------------------------------------------------------------------------------
# A fluxd that can be restarted on its data directory, and raw connections with deadlines.

class Closed(AssertionError):
    """The connection ended."""


class Conn:
    """One connection: `send` a message, `recv` the next frame (None at the deadline, Closed at EOF), `expect` a
    frame matching a predicate (frames read on the way are kept, in order, for later reads)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = bytearray()
        self.kept: List[Dict[str, Any]] = []
        self.eof = False
        self.welcome: Dict[str, Any] = {}
        self.pings = 0

    def send(self, message: Dict[str, Any]) -> None:
        self.send_bytes(frame(message))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = DEADLINE) -> Optional[Dict[str, Any]]:
        if self.kept:
            return self.kept.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 4:
                n = struct.unpack(">I", bytes(self.buffer[:4]))[0]
                if len(self.buffer) >= 4 + n:
                    body = bytes(self.buffer[4:4 + n])
                    del self.buffer[:4 + n]
                    return json.loads(body)
            if self.eof:
                raise Closed("fluxd closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                return None
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                self.buffer += chunk
            else:
                self.eof = True

    def expect(self, predicate: Callable[[Dict[str, Any]], bool], what: str,
               timeout: float = DEADLINE) -> Dict[str, Any]:
        for i, f in enumerate(self.kept):
            if predicate(f):
                return self.kept.pop(i)
        deadline = time.monotonic() + timeout
        passed: List[Dict[str, Any]] = []
        kept, self.kept = self.kept, []
        try:
            while True:
                f = self.recv(max(0.0, deadline - time.monotonic()))
                if f is None:
                    raise AssertionError(f"no {what} within {timeout} s; got {passed[-6:]}")
                if predicate(f):
                    return f
                passed.append(f)
        finally:
            self.kept = kept + passed + self.kept

    def expect_op(self, op: str, **fields: Any) -> Dict[str, Any]:
        return self.expect(lambda f: f.get("op") == op and all(f.get(k) == v for k, v in fields.items()),
                           f"{op} {fields}")

    def barrier(self) -> List[Dict[str, Any]]:
        """Sends a ping and returns every frame before its pong (SPEC §8.7: the pong comes after the replies to
        every frame sent before the ping)."""
        self.pings += 1
        ident = f"barrier-{self.pings}"
        self.send({"op": "ping", "id": ident})
        frames = self.kept
        self.kept = []
        deadline = time.monotonic() + DEADLINE
        while True:
            f = self.recv(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise AssertionError(f"no pong {ident} within {DEADLINE} s; got {frames[-6:]}")
            if f.get("op") == "pong" and f.get("id") == ident:
                return frames
            frames.append(f)

    def until_closed(self, timeout: float = DEADLINE) -> List[Dict[str, Any]]:
        """Every frame up to the end of the connection."""
        frames = self.kept
        self.kept = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                f = self.recv(max(0.0, deadline - time.monotonic()))
            except Closed:
                return frames
            if f is None:
                raise AssertionError(f"the connection did not end within {timeout} s; got {frames[-6:]}")
            frames.append(f)

    def request(self, message: Dict[str, Any], reply: str) -> Dict[str, Any]:
        """Sends a request with a fresh id; returns its reply or the error about it."""
        self.pings += 1
        ident = f"req-{self.pings}"
        self.send(dict(message, id=ident))
        return self.expect(lambda f: (f.get("op") in (reply, "error") and f.get("id") == ident)
                           or (f.get("op") == "error" and f.get("ref") == ident), f"{reply} {ident}")

    def close(self) -> None:
        self.sock.close()


def frame(message: Dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


class Fluxd:
    """fluxd on a private socket: durable on `data_dir`, else `--ephemeral`; `start` again after `stop`/`kill`
    restarts it on the same data directory."""

    def __init__(self, work: str, durable: bool, args: Optional[List[str]] = None):
        self.work = work
        self.socket_path = os.path.join(work, "fluxd.sock")
        self.data_dir = os.path.join(work, "data") if durable else None
        self.args = list(args or [])
        self.process: Optional[subprocess.Popen] = None
        self.runs = 0
        self.conns: List[Conn] = []

    def command(self) -> List[str]:
        cmd = [executable(), "--socket", self.socket_path]
        cmd += ["--data-dir", self.data_dir, "--durability", "always"] if self.data_dir else ["--ephemeral"]
        return cmd + self.args

    def start(self) -> "Fluxd":
        assert self.process is None or self.process.poll() is not None
        if self.process is not None and self.process.stdout:
            self.process.stdout.close()  # the run before's
        self.runs += 1
        self.stderr_path = os.path.join(self.work, f"fluxd-{self.runs}.log")
        with open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=err,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + 30
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise AssertionError(f"fluxd printed no ready line:\n{self.stderr()}")
            chunk = os.read(fd, 1)
            if not chunk:
                raise AssertionError(f"fluxd exited before it was ready:\n{self.stderr()}")
            line += chunk
        assert line.startswith(b"fluxd ready on "), line
        return self

    def stderr(self) -> str:
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def connect(self, role: str, name: str, session: Optional[str] = None) -> Conn:
        conn = Conn(self.socket_path)
        self.conns.append(conn)
        hello: Dict[str, Any] = {"op": "hello", "protocol": 1, "role": role, "name": name}
        if session:
            hello["session"] = session
        conn.send(hello)
        conn.welcome = conn.expect(lambda f: f.get("op") in ("welcome", "error"), "welcome")
        assert conn.welcome["op"] == "welcome", conn.welcome
        return conn

    def raw(self) -> Conn:
        conn = Conn(self.socket_path)
        self.conns.append(conn)
        return conn

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fluxd did not exit within {timeout} s:\n{self.stderr()}") from None

    def stop(self) -> Optional[int]:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        if self.process.stdout:
            self.process.stdout.close()
            self.process.stdout = None
        return self.process.returncode

    def close_all(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []


def executable() -> str:
    """$FLUXD or .build/debug/fluxd; while it is missing (a rebuild replaces it) this waits for it, up to 120 s."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return run.fluxd_path()
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # a retry while the file is absent, not a synchronisation


@pytest.fixture
def work():
    directory = tempfile.mkdtemp(prefix="fluxopen-")
    daemons: List[Fluxd] = []
    yield directory, daemons
    for d in daemons:
        d.close_all()
        d.stop()
    shutil.rmtree(directory, ignore_errors=True)


def fluxd(work, durable: bool, args: Optional[List[str]] = None) -> Fluxd:
    directory, daemons = work
    d = Fluxd(directory, durable, args)
    daemons.append(d)
    return d.start()


def register(conn: Conn, store: str, handles: List[str], state: Any = None, **more: Any) -> Dict[str, Any]:
    message: Dict[str, Any] = {"op": "register", "store": store, "handles": handles, **more}
    if state is not None:
        message["state"] = state
    conn.send(message)
    registered = conn.expect_op("registered", store=store)
    conn.expect_op("queries", store=store)
    return registered


def ops(frames: List[Dict[str, Any]]) -> List[Any]:
    return [(f["op"], f.get("store"), f.get("reason")) for f in frames]


# ----------------------------------------------------------------------------------------------------------------
# (a) SPEC §8.8: a durable fluxd does not drain.

def test_a_durable_fluxd_stops_without_draining(work):
    fx = fluxd(work, durable=True)
    m = fx.connect("monitor", "M")
    s = fx.connect("store", "S")
    register(s, "todos", ["todo/*"], 0)
    s2 = fx.connect("store", "S2")
    register(s2, "other", ["other/*"], 0)
    s2.close()
    m.expect(lambda f: f.get("kind") == "store-down" and f.get("store") == "other", "other down")
    c = fx.connect("client", "C", session="a-session")
    c.send({"op": "subscribe", "store": "todos"})
    c.send({"op": "subscribe", "store": "other"})
    c.expect_op("subscribed", store="other", status="down")
    c.send({"op": "dispatch", "id": "d1", "type": "todo/add", "settle": True, "ack": True})
    c.send({"op": "dispatch", "id": "d2", "type": "other/add", "settle": True, "ack": True})
    seq1 = c.expect_op("accepted", id="d1")["seq"]
    seq2 = c.expect_op("accepted", id="d2")["seq"]
    assert s.expect_op("action", store="todos")["seq"] == seq1
    for conn in (s, c, m):
        conn.barrier()  # nothing is pending for anyone now

    fx.signal(signal.SIGTERM)
    # No drain: the actions not final are neither waited for nor settled shutting-down.
    assert ops(c.until_closed()) == [("store-down", "todos", "shutdown"), ("bye", None, "restart")]
    assert ops(s.until_closed()) == [("bye", None, "restart")]
    assert ops(m.until_closed()) == [("bye", None, "restart")], "a monitor is sent no event for the stop"
    assert fx.wait() == 0
    fx.close_all()

    # They stayed accepted: after the restart they are pending, and settle to the session that recovers them.
    fx.start()
    c = fx.connect("client", "C", session="a-session")
    outcomes = c.request({"op": "recover", "ids": ["d1", "d2"]}, "recovered")["outcomes"]
    assert outcomes == [{"id": "d1", "status": "pending", "seq": seq1}, {"id": "d2", "status": "pending", "seq": seq2}]
    s = fx.connect("store", "S")
    register(s, "todos", ["todo/*"])
    action = s.expect_op("action", store="todos")
    assert (action["seq"], action.get("redelivered")) == (seq1, True)
    s.send({"op": "done", "store": "todos", "seq": seq1, "state": 1})
    settled = c.expect_op("settled", id="d1")
    assert settled["results"] == [{"store": "todos", "status": "done", "version": 2}]


WORKER = r'''
import json, os, signal, socket, struct, sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["FLUXBUS_SOCKET"])
buffer = b""

def send(m):
    body = json.dumps(m).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)

def recv():
    global buffer
    while True:
        if len(buffer) >= 4:
            n = struct.unpack(">I", buffer[:4])[0]
            if len(buffer) >= 4 + n:
                body, buffer = buffer[4:4 + n], buffer[4 + n:]
                return json.loads(body)
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit(3)
        buffer += chunk

def on_term(signum, _frame):
    # fluxd stops its workers after the stop began: a dispatch now is refused shutting-down.
    send({"op": "dispatch", "id": "late", "type": "w/late", "ack": True})
    while True:
        f = recv()
        if f.get("id") == "late" or f.get("ref") == "late":
            break
    with open(sys.argv[1], "w") as out:
        json.dump(f, out)
    raise SystemExit(0)

signal.signal(signal.SIGTERM, on_term)
send({"op": "hello", "protocol": 1, "role": "store", "name": "worker"})
send({"op": "register", "store": "w", "handles": ["w/*"], "state": 0})
while True:
    signal.pause()
'''


def test_a_durable_fluxd_stops_its_workers_first(work):
    directory, _ = work
    script = os.path.join(directory, "worker.py")
    answer = os.path.join(directory, "late.json")
    with open(script, "w") as f:
        f.write(WORKER)
    config = os.path.join(directory, "fluxd.toml")
    with open(config, "w") as f:
        f.write(f"[workers.w]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(script)}, "
                f"{json.dumps(answer)}]\nstores = [\"w\"]\nsocket_arg = false\nrestart = \"never\"\n"
                f"stop_timeout = 10\n")
    fx = fluxd(work, durable=True, args=["--config", config])
    s = fx.connect("store", "S")
    register(s, "todos", ["todo/*"], 0)
    c = fx.connect("client", "C")
    c.send({"op": "subscribe", "store": "todos"})
    c.send({"op": "subscribe", "store": "w"})
    c.expect_op("subscribed", store="todos")
    if c.expect_op("subscribed", store="w")["status"] != "up":
        c.expect_op("store-up", store="w")
    for conn in (s, c):
        conn.barrier()

    fx.signal(signal.SIGTERM)
    # The worker's store goes down as its connection closes (disconnected), before the stop's store-down and bye.
    assert ops(c.until_closed()) == [("store-down", "w", "disconnected"), ("store-down", "todos", "shutdown"),
                                     ("bye", None, "restart")]
    assert ops(s.until_closed()) == [("bye", None, "restart")]
    assert fx.wait() == 0
    with open(answer) as f:
        late = json.load(f)
    assert (late["op"], late.get("code"), late.get("fatal")) == ("error", "shutting-down", False), late


# ----------------------------------------------------------------------------------------------------------------
# (b) SPEC §15.1 (R6): after a restart every action not answered comes redelivered, delivered before or not.

@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_b_actions_restored_unanswered_come_redelivered(work, stop):
    fx = fluxd(work, durable=True, args=["--store-window", "1"])
    s = fx.connect("store", "S")
    register(s, "todos", ["todo/*"], 0)
    s2 = fx.connect("store", "S2")
    register(s2, "down", ["down/*"], 0)
    s2.send({"op": "unregister", "store": "down"})
    s2.barrier()
    c = fx.connect("client", "C")

    # Within one run, an action queued while its store is down is not marked when the store comes back (§10).
    c.send({"op": "dispatch", "id": "d0", "type": "down/x", "ack": True})
    seq0 = c.expect_op("accepted", id="d0")["seq"]
    s2.send({"op": "register", "store": "down", "handles": ["down/*"]})
    action = s2.expect_op("action", store="down")
    assert action["seq"] == seq0 and "redelivered" not in action, action
    s2.send({"op": "done", "store": "down", "seq": seq0})
    s2.send({"op": "unregister", "store": "down"})
    s2.barrier()

    for i, kind in enumerate(["todo/a", "todo/b", "down/x"], 1):
        c.send({"op": "dispatch", "id": f"d{i}", "type": kind, "ack": True})
    seqs = [c.expect_op("accepted", id=f"d{i}")["seq"] for i in (1, 2, 3)]
    first = s.expect_op("action", store="todos")
    assert first["seq"] == seqs[0] and "redelivered" not in first
    # seqs[1] waits behind the window of 1, seqs[2] in the queue of a store that is down: neither was sent.
    assert [f for f in s.barrier() if f["op"] == "action"] == []

    fx.signal(getattr(signal, stop))
    fx.wait()
    fx.close_all()
    fx.start()
    s = fx.connect("store", "S")
    register(s, "todos", ["todo/*"])
    got = s.expect_op("action", store="todos")
    assert (got["seq"], got.get("redelivered")) == (seqs[0], True), "delivered before the restart"
    s.send({"op": "done", "store": "todos", "seq": seqs[0]})
    got = s.expect_op("action", store="todos")
    assert (got["seq"], got.get("redelivered")) == (seqs[1], True), "queued behind the window, never sent"
    s2 = fx.connect("store", "S2")
    register(s2, "down", ["down/*"])
    got = s2.expect_op("action", store="down")
    assert (got["seq"], got.get("redelivered")) == (seqs[2], True), "queued for a down store, never sent"


# ----------------------------------------------------------------------------------------------------------------
# (c) SPEC §8.12: history's targets are sorted by name, its results come in the order they became final.

def test_c_history_orders_targets_by_name_and_results_as_they_became_final(work):
    fx = fluxd(work, durable=True)
    stores = {}
    for name in ("b", "a", "Z"):  # "Z" sorts before "a" bytewise
        stores[name] = fx.connect("store", name)
        register(stores[name], name, ["x/*"], 0)
    c = fx.connect("client", "C", session="c-session")
    c.send({"op": "dispatch", "id": "d", "type": "x/1", "settle": True, "ack": True})
    seq = c.expect_op("accepted", id="d")["seq"]
    for name in ("b", "a", "Z"):
        assert stores[name].expect_op("action", store=name)["seq"] == seq

    def entry():
        entries = c.request({"op": "history", "from": seq, "limit": 1}, "history")["entries"]
        assert [e["seq"] for e in entries] == [seq], entries
        return entries[0]

    stores["b"].send({"op": "done", "store": "b", "seq": seq, "state": 1})
    stores["b"].barrier()
    assert entry()["targets"] == ["Z", "a", "b"]
    assert entry()["results"] == [{"store": "b", "status": "done", "version": 2}]
    stores["a"].send({"op": "reject", "store": "a", "seq": seq, "error": {"code": "x/no"}})
    stores["a"].barrier()
    assert [r["store"] for r in entry()["results"]] == ["b", "a"]

    # Across a restart too: Z answers last, after fluxd ran again.
    fx.signal(signal.SIGTERM)
    assert fx.wait() == 0
    fx.close_all()
    fx.start()
    c = fx.connect("client", "C", session="c-session")
    assert c.request({"op": "recover", "ids": ["d"]}, "recovered")["outcomes"][0]["status"] == "pending"
    z = fx.connect("store", "Z")
    register(z, "Z", ["x/*"])
    assert z.expect_op("action", store="Z")["seq"] == seq
    z.send({"op": "done", "store": "Z", "seq": seq})
    settled = c.expect_op("settled", id="d")
    assert [r["store"] for r in settled["results"]] == ["Z", "a", "b"], "settled: sorted by store name"
    e = entry()
    assert e["targets"] == ["Z", "a", "b"]
    assert e["results"] == [{"store": "b", "status": "done", "version": 2},
                            {"store": "a", "status": "rejected", "error": {"code": "x/no"}},
                            {"store": "Z", "status": "done", "version": 1}]


# ----------------------------------------------------------------------------------------------------------------
# (d) SPEC §8.12: state-at with a seq above the last answers the newest version, which is not final.

def test_d_state_at_a_seq_above_the_last_is_the_newest_version(work):
    fx = fluxd(work, durable=True)
    s = fx.connect("store", "S")
    register(s, "st", ["st/*"], {"n": 0})
    register(s, "empty", ["nothing/*"])
    c = fx.connect("client", "C")

    def answer(n):
        c.send({"op": "dispatch", "id": f"d{n}", "type": "st/inc", "settle": True})
        seq = s.expect_op("action", store="st")["seq"]
        s.send({"op": "done", "store": "st", "seq": seq, "state": {"n": n}})
        return seq, c.expect_op("settled", id=f"d{n}")["results"][0]["version"]

    seq1, v1 = answer(1)
    last = c.request({"op": "info"}, "info")["seq"]
    assert last == seq1
    for above in (last + 1, last + 1000, 2 ** 53 - 1):
        got = c.request({"op": "state-at", "store": "st", "seq": above}, "state-at")
        assert (got["op"], got["version"], got["seq"], got["state"]) == ("state-at", v1, seq1, {"n": 1}), got
    newest = c.request({"op": "get", "store": "st"}, "got")
    assert (newest["version"], newest["seq"], newest["state"]) == (v1, seq1, {"n": 1})

    # Not final: a later version is what the same request answers next.
    seq2, v2 = answer(2)
    assert seq2 < last + 1000
    got = c.request({"op": "state-at", "store": "st", "seq": last + 1000}, "state-at")
    assert (got["version"], got["seq"], got["state"]) == (v2, seq2, {"n": 2}), got
    got = c.request({"op": "state-at", "store": "st", "version": v1}, "state-at")
    assert (got["version"], got["state"]) == (v1, {"n": 1}), "by version: the same state for good"
    # A store with no state at all has none to give, above the last seq or not.
    got = c.request({"op": "state-at", "store": "empty", "seq": last + 1000}, "state-at")
    assert (got["op"], got.get("code")) == ("error", "not-retained"), got


# ----------------------------------------------------------------------------------------------------------------
# (e) SPEC §12: connection allowances count in memoryPerUser.

def test_e_connection_allowances_count_in_memory_per_user(work):
    fx = fluxd(work, durable=False,
               args=["--memory-per-user", "4096", "--connection-allowance", "1024", "--memory-budget", "1048576"])
    # Four silent connections hold four allowances: the uid's whole share, before any of them says hello.
    conns = [fx.raw() for _ in range(4)]
    fifth = fx.raw()
    refusal = fifth.recv()
    assert refusal is not None and (refusal["op"], refusal["code"], refusal["fatal"]) == \
        ("error", "too-many-connections", True) and "ref" not in refusal, refusal
    assert fifth.until_closed() == []
    for i, conn in enumerate(conns):
        conn.send({"op": "hello", "protocol": 1, "role": "client", "name": f"c{i}"})
        assert conn.expect(lambda f: f.get("op") in ("welcome", "error"), "welcome")["op"] == "welcome"
    info = conns[0].request({"op": "info"}, "info")
    mine = [u for u in info["memory"]["users"] if u["uid"] == os.geteuid()]
    assert mine and (mine[0]["connections"], mine[0]["bytes"]) == (4, 4096), info["memory"]

    # A connection that closes gives its allowance back: then one more fits.
    conns.pop().close()
    deadline = time.monotonic() + DEADLINE
    while True:
        info = conns[0].request({"op": "info"}, "info")
        mine = [u for u in info["memory"]["users"] if u["uid"] == os.geteuid()]
        if mine and mine[0]["connections"] == 3:
            break
        assert time.monotonic() < deadline, f"fluxd did not notice the closed connection: {info['memory']}"
        time.sleep(0.01)  # polling info for the close to be handled
    assert mine[0]["bytes"] == 3072, info["memory"]
    fx.connect("client", "again")


# ----------------------------------------------------------------------------------------------------------------
# (f) SPEC §8.6: queries-changed may batch; what a store sees either way.

def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class QueryView:
    """A store's view of its active queries, built from `queries` then `queries-changed`, checking each frame
    against SPEC §8.6 and the counts seen per query against the counts it really went through."""

    def __init__(self, initial: List[Dict[str, Any]]):
        self.counts = {canonical(q["query"]): q["count"] for q in initial}
        self.seen: Dict[bytes, List[int]] = {}

    def apply(self, f: Dict[str, Any]) -> None:
        assert f["op"] == "queries-changed" and f["store"] == "c", f
        keys = [canonical(ch["query"]) for ch in f["changes"]]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), f"sorted by bytes, each once: {f}"
        for key, ch in zip(keys, f["changes"]):
            assert isinstance(ch["count"], int) and ch["count"] >= 0, f
            self.seen.setdefault(key, []).append(ch["count"])
            if ch["count"] == 0:
                self.counts.pop(key, None)  # (a no-op for a query it does not hold)
            else:
                self.counts[key] = ch["count"]

    def check_history(self, truth: Dict[bytes, List[int]]) -> None:
        """Each query's counts as seen are a subsequence of those it went through (in order)."""
        for key, seen in self.seen.items():
            went = truth.get(key, [0])
            i = 0
            for count in seen:
                while i < len(went) and went[i] != count:
                    i += 1
                assert i < len(went), f"{key!r}: counts seen {seen} are not in the order it went through {went}"


def test_f_queries_changed_batching_envelope(work):
    fx = fluxd(work, durable=False)
    s = fx.connect("store", "S")
    registered = register(s, "c", [], queryDeltas=True)
    assert registered["resumed"] is False
    view = QueryView([])
    c = fx.connect("client", "C")
    other = fx.connect("client", "O")
    steps = [("query", "q1", {"site": 7}), ("query", "q2", {"site": 9}), ("query", "q3", {"site": 7}),
             ("unquery", "q2", None), ("query", "q5", {"site": 5}), ("unquery", "q5", None),
             ("query", "q4", {"site": 8})]
    live: Dict[str, bytes] = {}
    truth: Dict[bytes, List[int]] = {}
    now: Dict[bytes, int] = {}

    def went(key: bytes, delta: int) -> None:
        truth.setdefault(key, [now.get(key, 0)])
        now[key] = now.get(key, 0) + delta
        truth[key].append(now[key])

    burst = b""
    for op, ident, query in steps:  # one write: fluxd reads the burst in one batch, or a few
        if op == "query":
            burst += frame({"op": "query", "id": ident, "store": "c", "query": query})
            live[ident] = canonical(query)
            went(live[ident], +1)
        else:
            burst += frame({"op": "unquery", "id": ident})
            went(live.pop(ident), -1)
    c.send_bytes(burst)
    other.send({"op": "query", "id": "o", "store": "c", "query": {"site": 7}})
    went(canonical({"site": 7}), +1)
    expected = {k: v for k, v in now.items() if v > 0}

    def settle(expected: Dict[bytes, int]) -> None:
        deadline = time.monotonic() + DEADLINE
        while view.counts != expected:
            f = s.recv(max(0.0, deadline - time.monotonic()))
            assert f is not None, f"the store's view {view.counts} never became {expected}"
            view.apply(f)
        for f in s.barrier():  # anything more may only restate it
            view.apply(f)
        assert view.counts == expected
        view.check_history(truth)

    settle(expected)
    # A connection that closes withdraws its queries (in one frame per store in fluxd 0.4, or batched otherwise).
    c.close()
    for ident, key in live.items():
        went(key, -1)
    settle({k: v for k, v in now.items() if v > 0})
    assert view.counts == {canonical({"site": 7}): 1}
    # The fold is the set a `queries` would carry: registering again sends it whole.
    s.send({"op": "unregister", "store": "c"})
    s.send({"op": "register", "store": "c", "handles": [], "queryDeltas": True})
    s.expect_op("registered", store="c")
    queries = s.expect_op("queries", store="c")["queries"]
    assert {canonical(q["query"]): q["count"] for q in queries} == view.counts


# ----------------------------------------------------------------------------------------------------------------
# (g) SPEC §8.10: the owner's disconnect comes before its stores' store-down, in name order.

@pytest.mark.parametrize("leaving", ["close", "bye", "fatal"])
def test_g_monitor_sees_disconnect_then_store_down_by_name(work, leaving):
    fx = fluxd(work, durable=False, args=["--max-frame", "1024"])
    m = fx.connect("monitor", "M")
    s = fx.connect("store", "S")
    peer = s.welcome["peer"]
    for name in ("b", "a", "B"):
        register(s, name, [name + "/*"])
    s.barrier()
    m.barrier()  # the monitor has every event so far
    if leaving == "close":
        s.close()
    elif leaving == "bye":
        s.send({"op": "bye"})
    else:
        s.send_bytes(struct.pack(">I", 4096))  # too-large: fatal, fluxd closes the connection
    events = []
    while not (events and events[-1].get("kind") == "store-down" and events[-1].get("store") == "b"):
        f = m.recv()
        assert f is not None, f"no store-down of b; events: {events}"
        events.append(f)
    events += m.barrier()
    got = [(e["kind"], e.get("peer"), e.get("store"), e.get("reason")) for e in events]
    leave = [("disconnect", peer, None, None), ("store-down", None, "B", "disconnected"),
             ("store-down", None, "a", "disconnected"), ("store-down", None, "b", "disconnected")]
    if leaving == "fatal":
        leave = [("error", peer, None, None)] + leave
    assert got == leave, events


def test_g_no_store_down_events_when_fluxd_exits(work):
    """SPEC §8.10, §8.8: stores that go down because fluxd exits have no store-down event (here an ephemeral
    fluxd; the durable one is in test (a)); their subscribers get store-down shutdown."""
    fx = fluxd(work, durable=False)
    m = fx.connect("monitor", "M")
    s = fx.connect("store", "S")
    register(s, "a", ["a/*"], 0)
    m.send({"op": "subscribe", "store": "a"})
    m.expect_op("subscribed", store="a")
    for conn in (s, m):
        conn.barrier()
    fx.signal(signal.SIGTERM)
    frames = m.until_closed()
    assert [(f["op"], f.get("kind"), f.get("store"), f.get("reason")) for f in frames] == [
        ("store-down", None, "a", "shutdown"), ("bye", None, None, "shutdown")], frames
    assert fx.wait() == 0
