"""Every frame fluxd and the SDKs send validates against its schema (issue 5): a real fluxd behind
protocol/tools/schema_proxy.py, real traffic from every implementation through the proxy (the Swift example stores
and views and fluxctl, the Python client/asyncio client/Store, the Node client/Store, the polyglot demo scripts),
then the proxy's report must list zero violations and every (op, direction) of protocol/schemas/index.json.

fluxd is $FLUXD (else .build/debug/fluxd); the Swift executables are taken from fluxd's folder."""
import asyncio
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

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "examples", "python"))
from fluxbus import AsyncClient, Client, FluxError, Reject, Store, on  # noqa: E402

FLUXD = os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
BIN = os.path.dirname(os.path.abspath(FLUXD))
SWIFT = ["fluxd", "fluxctl", "todo-store", "stats-store", "comments-store", "todo-view", "comments-view"]

PING_INTERVAL = 500  # ms (fluxd --ping-interval)

# Ops of index.json this test does not produce, with the reason. Empty: the traffic below reaches every one.
NOT_EXERCISED = {
    (op, direction): "fluxd implements §8.12 in issue 15; then the traffic below should produce it"
    for op, direction in [("recover", "c2d"), ("recovered", "d2c"), ("history", "c2d"), ("history", "d2c"),
                          ("state-at", "c2d"), ("state-at", "d2c")]
}

NODE_PROGRAM = r"""
import { Client, Store, Reject, FluxError } from '%(module)s';
const socketPath = process.env.FLUXBUS_SOCKET;
const store = new Store({ name: 'nodestore', handles: ['node/*'], initialState: { items: [], queries: 0 } });
store.on('node/add', (state, payload) => ({ ...state, items: [...state.items, payload.item] }));
store.on('node/bad', () => { throw new Reject('node/refused', 'refused on purpose', { why: 'test' }); });
store.on('node/follow', (state, payload, ctx) => { ctx.dispatch('node/add', { item: 'follow-up' }); return state; });
store.onQueries = (queries) => store.publish({ ...store.state, queries: queries.length });
await store.start({ socketPath, clientName: 'node-store' });
const client = await Client.connect({ socketPath, name: 'node-client' });
const sub = await client.subscribe('nodestore');
const out = {};
out.add = (await client.dispatchAndSettle('node/add', { item: 'a' })).results.map((r) => r.status);
out.bad = (await client.dispatchAndSettle('node/bad', { x: 1 })).results.map((r) => r.status);
out.follow = (await client.dispatchAndSettle('node/follow', null)).results.map((r) => r.status);
const receipt = await client.query('nodestore', { page: 1 });
await sub.until((s) => s.state.queries === 1, 10000);
await receipt.close();
out.info = (await client.info()).stores.length;
out.get = (await client.get('nodestore')).version;
await client.ping();
try { await client.get('no-such-store'); out.unknown = 'no error'; } catch (e) { out.unknown = e.code; }
await sub.until((s) => s.state.items.includes('follow-up'), 10000);
await client.unsubscribe('nodestore');
await client.close();
await store.stop();
console.log('node ok ' + JSON.stringify(out));
"""


class Proc:
    """A child process whose stdout is read line by line; stderr goes to a log file."""

    def __init__(self, name, argv, work, env=None, stdout_file=False):
        self.name = name
        self.log = os.path.join(work, name + ".err")
        with open(self.log, "wb") as err, open(os.path.join(work, name + ".out"), "wb") as out:
            # a stream nobody reads while the test runs (monitor, watch) goes to a file, so it never blocks
            self.process = subprocess.Popen(argv, stdout=out if stdout_file else subprocess.PIPE, stderr=err,
                                            stdin=subprocess.DEVNULL, cwd=REPO, env={**os.environ, **(env or {})})
        self.out = b""

    def wait_for(self, text, timeout=20.0):
        """Reads stdout until a line contains text (fails after timeout or at exit)."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while text.encode() not in self.out:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                pytest.fail(f"{self.name}: no {text!r} in time; stdout {self.out!r}; stderr {self.stderr()}")
            chunk = os.read(fd, 65536)
            if not chunk:
                pytest.fail(f"{self.name} exited ({self.process.wait()}) before {text!r}; stderr {self.stderr()}")
            self.out += chunk

    def finish(self, timeout=20.0):
        """Waits for the exit and returns (code, all stdout)."""
        try:
            rest, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit; stdout {self.out!r}; stderr {self.stderr()}")
        self.out += rest or b""
        return self.process.returncode, self.out.decode(errors="replace")

    def signal(self, number):
        if self.process.poll() is None:
            self.process.send_signal(number)

    def stderr(self):
        with open(self.log, errors="replace") as f:
            return f.read()[-2000:]

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()


def run(argv, timeout=20, ok=(0,), env=None):
    """Runs a command to completion; returns its stdout; fails on an unexpected exit code."""
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    assert result.returncode in ok, f"{argv}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


class RawPeer:
    """A hand-written peer for the cases no SDK produces: deliberate bad input and a monitor that does not read."""

    def __init__(self, path, name, role, **hello):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = b""
        self.send({"op": "hello", "protocol": 1, "role": role, "name": name, **hello})
        assert self.until("welcome")["op"] == "welcome"

    def send_body(self, body):
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def send(self, message):
        self.send_body(json.dumps(message).encode())

    def until(self, op, timeout=15.0):
        """Reads frames until one with this op; returns it (the ones before are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            while len(self.buffer) >= 4:
                (n,) = struct.unpack(">I", self.buffer[:4])
                if len(self.buffer) < 4 + n:
                    break
                body, self.buffer = self.buffer[4:4 + n], self.buffer[4 + n:]
                message = json.loads(body)
                if message.get("op") == op:
                    return message
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {op} frame in time"
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 20)
            assert chunk, f"connection closed before a {op} frame"
            self.buffer += chunk

    def close(self):
        self.sock.close()


class PyStore(Store):
    """A Python store covering done (with and without state), reject, follow-ups and state publishing."""
    name = "pystore"
    handles = ["py/*"]
    unhandled = "ignore"  # py/big and py/marker only carry traffic: answered done without a handler
    initial_state = {"items": [], "queries": 0}

    @on("py/add")
    def add(self, state, payload, ctx):
        state["items"].append(payload["item"])
        return state

    @on("py/bad")
    def bad(self, state, payload, ctx):
        raise Reject("py/refused", "refused on purpose", why="test")

    @on("py/follow")
    def follow(self, state, payload, ctx):
        ctx.dispatch("py/add", {"item": "follow-up"})

    def on_queries(self, queries):
        if self.client is not None and self.state is not None:
            self.publish({**self.state, "queries": len(queries)})


def wait_until(what, predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling a condition with a deadline, not synchronizing by sleeping


@pytest.fixture
def bus():
    missing = [p for p in SWIFT if not os.access(os.path.join(BIN, p), os.X_OK)]
    if missing:
        pytest.fail(f"not built in {BIN}: {missing} (swift build, or set FLUXD)")
    if shutil.which("node") is None:
        pytest.fail("node is not installed")
    work = tempfile.mkdtemp(prefix="fluxschema-")
    procs = []
    worker_pids = set()
    yield work, procs, worker_pids
    for p in reversed(procs):
        p.kill()
    for pid in worker_pids:  # fluxd stops its workers; should one outlive it, end it here
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", b"300"]:
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(work, ignore_errors=True)


def test_every_frame_validates_against_its_schema(bus):
    work, procs, worker_pids = bus

    def start(name, argv, ready=None, env=None, stdout_file=False):
        p = Proc(name, argv, work, env, stdout_file)
        procs.append(p)
        if ready:
            p.wait_for(ready)
        return p

    config = os.path.join(work, "fluxd.toml")
    with open(config, "w") as f:  # one worker, so that the host ops (workers, stop-, restart-worker) answer
        f.write('[workers.sleeper]\ncommand = "sleep"\nargs = ["300"]\nsocket_arg = false\nrestart = "never"\n')
    real, proxy_path, report_path = (os.path.join(work, n) for n in ("fluxd.sock", "proxy.sock", "report.json"))
    # A short heartbeat interval, so that fluxd's ping (D->C) and the peers' pong (C->D) are seen: every peer that
    # asks for heartbeats (the Swift SDK does) is pinged after PING_INTERVAL ms of silence.
    fluxd = start("fluxd", [FLUXD, "--socket", real, "--ephemeral", "--config", config, "--ping-interval", str(PING_INTERVAL)],
                  "ready")
    proxy = start("proxy", [sys.executable, os.path.join(HERE, "schema_proxy.py"), "--listen", proxy_path,
                            "--upstream", real, "--report", report_path, "--bad-input-peer", "bad-input*"],
                  "schema-proxy ready")
    S = ["--socket", proxy_path]
    env = {"FLUXBUS_SOCKET": proxy_path}
    ctl = os.path.join(BIN, "fluxctl")

    client = Client.connect(proxy_path, name="py-client", timeout=20)
    # fluxctl monitor (events) and fluxctl watch (snapshots) stay connected until fluxd says bye (--no-reconnect:
    # by default they would wait for fluxd to come back).
    monitor = start("fluxctl-monitor", [ctl, "monitor", "--json", "--no-reconnect", *S], stdout_file=True)
    wait_until("the monitor", lambda: client.info()["peers"].get("monitor", 0) >= 1)

    # Stores of every implementation.
    start("todo-store", [os.path.join(BIN, "todo-store"), *S], "todo-store ready")
    stats = start("stats-store", [os.path.join(BIN, "stats-store"), *S], "stats-store ready")
    comments = start("comments-store", [os.path.join(BIN, "comments-store"), *S, "--latency-ms", "20",
                                        "--fail-sites", "3"], "comments-store ready")
    start("audit-store", [sys.executable, "examples/python/demo/audit_store.py"], "audit-store ready", env)
    activity = start("activity-store", ["node", "examples/node/demo/activity-store.mjs"], "activity-store ready", env)
    pystore = PyStore(socket_path=proxy_path, client_name="py-store")
    pystore_thread = pystore.start()
    watch = start("fluxctl-watch", [ctl, "watch", "todos", "--json", "--no-reconnect", *S], stdout_file=True)

    # The polyglot demo's clients: Python watches, Node dispatches.
    py_watch = start("python-watch", [sys.executable, "examples/python/demo/watch.py", "--count", "3"],
                     "python-watch ready", env)
    run(["node", "examples/node/demo/dispatch.mjs", "buy milk", "write docs", "ship it"], env=env)
    code, out = py_watch.finish()
    assert code == 0 and "python final" in out, out

    # fluxctl: dispatch with settlement (done and rejected), state, stores, stats, ping, watch, query, host ops.
    assert "todos" in run([ctl, "dispatch", "todo/create", '{"title":"from fluxctl"}', "--wait", *S])
    run([ctl, "dispatch", "todo/toggle", '{"id":9999}', "--wait", *S], ok=(1,))
    assert "from fluxctl" in run([ctl, "state", "todos", *S])
    run([ctl, "state", "no-such-store", *S], ok=(5,))
    assert "pystore" in run([ctl, "stores", *S])
    run([ctl, "stats", *S])
    run([ctl, "ping", "--count", "3", *S])
    run([ctl, "watch", "stats", "--count", "1", *S])
    run([ctl, "query", "comments", '{"site":2}', "--count", "1", *S])
    def host_op(*argv):
        for line in run([ctl, *argv, "--json", *S]).splitlines():
            worker = json.loads(line)
            assert worker["name"] == "sleeper"
            if worker.get("pid"):
                worker_pids.add(worker["pid"])
    host_op("workers")
    host_op("stop", "sleeper")
    host_op("restart", "sleeper")
    assert json.loads(run([ctl, "reload", "--json", *S])) == {"added": [], "removed": [], "changed": [], "settings": []}
    # A benchmark's throwaway store, forgotten at its end (forget / forgotten, SPEC §10).
    assert json.loads(run([ctl, "bench", "--actions", "20", "--warmup", "2", "--json", *S]))["store"].startswith("bench.")

    # Swift views.
    assert "from fluxctl" in run([os.path.join(BIN, "todo-view"), "--once", *S])
    run([os.path.join(BIN, "comments-view"), "--site", "1", "--once-loaded", "--timeout", "15", *S])
    run([os.path.join(BIN, "comments-view"), "--site", "3", "--once-loaded", "--timeout", "15", *S], ok=(1,))

    # Python client: subscribe/unsubscribe, dispatch with settle (done, rejected, follow-up), query/unquery,
    # info/get/ping, refusals.
    with client.subscribe("pystore") as sub:
        assert client.dispatch_and_settle("py/add", {"item": "a"})["pystore"].status == "done"
        assert client.dispatch_and_settle("py/bad", {"x": 1})["pystore"].status == "rejected"
        client.dispatch_and_settle("py/follow")
        with client.query("pystore", {"page": 1}):
            sub.until(lambda s: s.state["queries"] == 1, timeout=10)
        sub.until(lambda s: "follow-up" in s.state["items"] and s.state["queries"] == 0, timeout=10)
    assert client.get("pystore").version >= 3
    assert any(s["name"] == "pystore" for s in client.info()["stores"])
    client.ping()
    with pytest.raises(FluxError):
        client.dispatch_and_settle("nobody/handles-this")

    async def asyncio_client():
        async with await AsyncClient.connect(proxy_path, name="py-async") as aclient:
            async with await aclient.subscribe("todos") as asub:
                await asub.next(timeout=10)
                settlement = await aclient.dispatch_and_settle("todo/create", {"title": "from asyncio"})
                assert settlement.ok
            await aclient.info()
            await aclient.get("todos")
            await aclient.ping()
    asyncio.run(asyncio_client())

    # Node client and Node Store.
    program = os.path.join(work, "node-traffic.mjs")
    with open(program, "w") as f:
        f.write(NODE_PROGRAM % {"module": os.path.join(REPO, "examples", "node", "fluxbus.mjs")})
    out = run(["node", program], timeout=30, env=env)
    assert 'node ok {"add":["done"],"bad":["rejected"],"follow":["done"]' in out, out
    assert '"unknown":"unknown-store"' in out, out

    # A store goes down (killed) and comes back up, seen by a subscriber.
    with client.subscribe("stats"):
        stats.process.kill()
        stats.process.wait()
        wait_until("stats down", lambda: any(s["name"] == "stats" and s["status"] == "down"
                                             for s in client.info()["stores"]))
        stats = start("stats-store-2", [os.path.join(BIN, "stats-store"), *S], "stats-store ready")
        client.ping()

    # A monitor that does not read: once more than 1 MiB is queued for it fluxd drops events, then says missed.
    slow = RawPeer(proxy_path, "slow-monitor", "monitor")
    big = "x" * 65536
    for _ in range(60):
        client.dispatch_and_settle("py/big", {"blob": big})
    slow.send({"op": "ping", "id": "drain"})  # replies are never dropped: the pong comes after the backlog
    slow.until("pong")
    client.dispatch_and_settle("py/marker")  # the next event delivered is preceded by missed
    assert slow.until("missed")["count"] > 0
    slow.close()

    # Since fluxd 0.2.0: a peer that asked for heartbeats is pinged when silent and answers pong; a store that
    # registered with queryDeltas is told its query changes (queries-changed) instead of whole sets.
    heartbeat = RawPeer(proxy_path, "raw-heartbeat", "client", heartbeat=True)
    ping = heartbeat.until("ping", timeout=PING_INTERVAL / 1000 * 10)
    heartbeat.send({"op": "pong", "id": ping["id"]})
    heartbeat.send({"op": "bye"})
    heartbeat.close()
    deltas = RawPeer(proxy_path, "raw-deltas", "store")
    deltas.send({"op": "register", "store": "raw-deltas", "handles": [], "queryDeltas": True})
    assert deltas.until("queries")["queries"] == []
    with client.query("raw-deltas", {"page": 1}):
        assert deltas.until("queries-changed")["changes"] == [{"query": {"page": 1}, "count": 1}]
    assert deltas.until("queries-changed")["changes"] == [{"query": {"page": 1}, "count": 0}]
    deltas.send({"op": "bye"})
    deltas.close()

    # Since fluxd 0.4.0 (SPEC §16): a store publishes a change as a patch; a delta subscriber is sent it as delta,
    # a path subscriber as subtree.
    patcher = RawPeer(proxy_path, "raw-patcher", "store")
    patcher.send({"op": "register", "store": "raw-patched", "handles": [], "state": {"items": [], "n": 0}})
    first = patcher.until("registered")["version"]  # (1, or above the versions of a store forgotten before, §10)
    patcher.until("queries")
    delta_watcher = RawPeer(proxy_path, "raw-delta-watcher", "client")
    delta_watcher.send({"op": "subscribe", "store": "raw-patched", "deltas": True})
    delta_watcher.until("snapshot")
    path_watcher = RawPeer(proxy_path, "raw-path-watcher", "client")
    path_watcher.send({"op": "subscribe", "store": "raw-patched", "path": "/n"})
    assert path_watcher.until("subtree")["value"] == 0
    patcher.send({"op": "patch", "store": "raw-patched", "patch": [{"op": "replace", "path": "/n", "value": 1}], "base": first})
    assert delta_watcher.until("delta")["version"] == first + 1
    assert path_watcher.until("subtree")["value"] == 1
    # A whole state outside an action (the libraries send patches since 0.4.0; the op stays in protocol 1).
    patcher.send({"op": "state", "store": "raw-patched", "state": {"items": ["x"], "n": 2}})
    assert delta_watcher.until("snapshot")["version"] == first + 2
    for p in (patcher, delta_watcher, path_watcher):
        p.send({"op": "bye"})
        p.close()

    # Bad input on purpose (recorded apart, as bad_input): fluxd's answers must still validate.
    bad = RawPeer(proxy_path, "bad-input", "client")
    bad.send({"op": "no-such-op"})
    bad.send({"op": "welcome"})
    bad.send({"op": "dispatch", "id": "d"})
    bad.send_body(b'{"op":"ping","id":1,"id":2}')
    bad.send_body(b"not json")
    bad.send({"op": "ping", "id": "last"})
    assert bad.until("pong")["id"] == "last"
    bad.send({"op": "bye"})
    bad.close()

    # Stores leave: Swift stores unregister on SIGTERM, the Python and Node stores say bye.
    pystore.stop()
    pystore_thread.join(timeout=10)
    assert not pystore_thread.is_alive()
    for p in (stats, activity):
        p.signal(signal.SIGTERM)
        assert p.finish()[0] == 0
    # fluxd exits with comments up and subscribed to: store-down (shutdown), then bye to every peer.
    client.subscribe("comments")
    host_op("workers")
    fluxd.signal(signal.SIGTERM)
    assert fluxd.finish()[0] == 0
    for p in (monitor, watch):
        p.finish()
    # The Swift store waits for fluxd to come back (it reconnects, SPEC §15.5): it leaves on SIGTERM.
    comments.signal(signal.SIGTERM)
    comments.finish()
    client.close()
    proxy.signal(signal.SIGTERM)
    proxy.finish()
    with open(report_path) as f:
        report = json.load(f)

    assert report["violations"] == [], "frames that do not validate:\n" + json.dumps(report["violations"], indent=1)
    bad_ops = {v["op"] for v in report["bad_input"]}
    assert {"no-such-op", "welcome", "dispatch", None} <= bad_ops, report["bad_input"]
    assert all(v["peer"] == "bad-input" for v in report["bad_input"])

    with open(os.path.join(REPO, "protocol", "schemas", "index.json")) as f:
        every = {(e["op"], e["direction"]) for e in json.load(f)["schemas"]}
    seen = {(op, d) for d, counts in report["frames"].items() for op in counts}
    unseen = every - seen - set(NOT_EXERCISED)
    assert not unseen, f"never seen: {sorted(unseen)}"

    # Every implementation's own frames went through the check.
    peers = report["peers"]
    def sent(peer, direction):
        return set(peers.get(peer, {}).get(direction, {}))
    for swift_store in ("todo-store", "stats-store", "comments-store"):
        assert {"hello", "register", "done"} <= sent(swift_store, "c2d") | sent(swift_store, "s2d"), swift_store
    assert "reject" in sent("todo-store", "s2d") and "unregister" in sent("stats-store", "s2d")
    assert "state" in sent("raw-patcher", "s2d") and sent("comments-store", "s2d") & {"state", "patch"}
    for store in ("py-store", "node-store"):
        # (since 0.4.0 the libraries publish a change as the patch op, SPEC §16.2; the state op is the comments
        # store's, above)
        assert {"register", "done", "reject"} <= sent(store, "s2d") and sent(store, "s2d") & {"state", "patch"}, store
        assert {"hello", "dispatch", "bye"} <= sent(store, "c2d"), store
    for name in ("py-client", "node-client"):  # (py-client stays until fluxd's bye; node-client says bye itself)
        assert {"hello", "dispatch", "subscribe", "unsubscribe", "query", "unquery", "info", "get",
                "ping"} <= sent(name, "c2d"), name
        assert {"welcome", "settled", "subscribed", "snapshot", "unsubscribed", "query-ok", "unquery-ok", "info",
                "got", "pong", "error"} <= sent(name, "d2c"), name
    assert "bye" in sent("node-client", "c2d") and {"store-down", "store-up", "bye"} <= sent("py-client", "d2c")
    assert {"hello", "dispatch", "subscribe", "unsubscribe", "info", "get", "ping", "bye"} <= sent("py-async", "c2d")
    assert {"hello", "dispatch", "subscribe", "query", "get", "info", "ping", "workers", "stop-worker",
            "restart-worker", "reload", "forget"} <= sent("fluxctl", "c2d")
    assert "event" in sent("fluxctl", "d2c") and "bye" in sent("fluxctl", "d2c")
    assert {"audit-py", "activity-node", "py-watch", "node-dispatch"} <= set(peers), sorted(peers)
    assert "pong" in sent("raw-heartbeat", "c2d") and "ping" in sent("raw-heartbeat", "d2c")
    assert "register" in sent("raw-deltas", "s2d") and "queries-changed" in sent("raw-deltas", "d2c")
    assert "patch" in sent("raw-patcher", "s2d") and "delta" in sent("raw-delta-watcher", "d2c")
    assert "subtree" in sent("raw-path-watcher", "d2c")
