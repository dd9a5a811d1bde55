#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into Fuzz/corpus/<target>/ (committed; rerun after changing a
target's input layout). Any bytes are a valid input for every target: the seeds only give the fuzzer a head start
with well-formed streams, messages and event programs.

  python3 Fuzz/make_seeds.py
"""
import hashlib
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VECTORS = os.path.join(ROOT, "protocol", "vectors")


KEEP = ("regression-", "bad-hello-")


def write_corpus(name, inputs):
    out = os.path.join(HERE, "corpus", name)
    # Seeds kept by hand (inputs that showed a finding) stay; everything this script wrote is rewritten.
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if not f.startswith(KEEP):
            os.remove(os.path.join(out, f))
    seen = set()
    for label, data in inputs:
        digest = hashlib.sha1(data).hexdigest()[:12]
        if digest in seen:
            continue
        seen.add(digest)
        with open(os.path.join(out, f"{label}-{digest}"), "wb") as f:
            f.write(data)
    print(f"{name}: {len(seen)} seeds")


def frame(body):
    return struct.pack(">I", len(body)) + body


# --- frame-decoder: byte 0 = maxFrame index (low 3 bits) | repeat (high 5 bits), byte 1 = number of split bytes,
# then the split bytes (chunk length in the low 6 bits, entry point in the high 2), then the stream.
MAX_FRAMES = [1, 3, 4, 16, 255, 1024, 65536, 1048576]


def decoder_seeds():
    cases = json.load(open(os.path.join(VECTORS, "framing.json")))["cases"]
    split_sets = [
        [],                                   # the whole stream through next(from:at:)
        [0x01],                               # byte by byte, append + next
        [0x43, 0x85, 0xC7],                   # 3, 5, 7 bytes through each entry point in turn
        [0x82, 0xC0, 0xC1, 0x3F],             # append without draining, empty chunk, in place, 4063 bytes
    ]
    inputs = []
    for i, case in enumerate(cases):
        stream = bytes.fromhex(case["input_hex"])
        mf = case["maxFrame"]
        index = min(range(len(MAX_FRAMES)), key=lambda k: (MAX_FRAMES[k] < mf, abs(MAX_FRAMES[k] - mf)))
        splits = split_sets[i % len(split_sets)]
        inputs.append((f"vector{i}", bytes([index, len(splits)] + splits) + stream))
    msgs = [b'{"op":"ping","id":"p-1"}', b'{}', b'{"op":"dispatch","type":"a"}']
    long_stream = b"".join(frame(m) for m in msgs) + b"\x00\x00\x00\x00" + frame(b"x" * 300)[:150]
    inputs.append(("repeated", bytes([5 | (31 << 3), 2, 0xC5, 0x3F]) + long_stream))
    inputs.append(("toolarge", bytes([3, 1, 0x02]) + frame(b'{"a":1}') + struct.pack(">I", 17) + b"x" * 17))
    inputs.append(("partial", bytes([5, 2, 0x81, 0x42]) + frame(b'{"op":"bye"}') + frame(b'{"op":"hello"}')[:9]))
    write_corpus("frame-decoder", inputs)


# --- envelope: the raw body.
def envelope_seeds():
    inputs = []
    for i, case in enumerate(json.load(open(os.path.join(VECTORS, "envelope.json")))["cases"][::4]):
        body = case.get("body")
        if body is None and "body_hex" in case:
            body = bytes.fromhex(case["body_hex"])
        elif body is not None:
            body = body.encode("utf-8", "surrogatepass")
        if body is not None:
            inputs.append((f"vector{i}", body))
    for name in sorted(os.listdir(os.path.join(VECTORS, "messages")))[::5]:
        doc = json.load(open(os.path.join(VECTORS, "messages", name)))
        for j, msg in enumerate(doc.get("valid", [])[:1] + doc.get("invalid", [])[:1]):
            inputs.append((f"msg-{name.split('.')[0]}{j}", json.dumps(msg, separators=(",", ":")).encode()))
    inputs += [
        ("escapes", rb'{"a":"\\\/\b\f\r\t\u00e9\ud83d\ude00","b":-0,"c":1E+2,"d":false}'),
        ("dupkey", b'{"op":"ping","op":"pong","id":"x"}'),
        ("dupkey-escaped", rb'{"k":1,"\u006b":2}'),
        ("deep", b'{"a":' + b"[" * 63 + b"]" * 63 + b"}"),
        ("utf8", '{"é":"€😀","z":"\u07ff"}'.encode()),
        ("ws", b' \t\r\n{ "op" : "ping" ,\n "id" : "p" } \n'),
        ("fragment", b'"just a string"'),
        ("array", b'[1,"two",{"three":3.0e-1}]'),
    ]
    write_corpus("envelope", inputs)


# --- router: bytes 0-1 = limits (as before 0.2.0), bytes 2-5 = the 0.2.0 limits (0: fluxd's defaults, liveness
# off); then steps: [op, slot, args...]. op < 200 = message template (index below), op >= 200 = control. Mirrors
# RouterHarness (Sources/FuzzTargets/RouterTarget.swift); slots with no connection turn a message step into a
# connect (one byte: credentials, bit 0 = pid and uid, bit 1 = uid 1001 instead of 1000).
T = {name: i for i, name in enumerate(
    ["hello", "register", "unregister", "dispatch", "done", "reject", "state", "subscribe", "unsubscribe", "query",
     "unquery", "get", "info", "ping", "bye", "host", "unknown", "garbage", "pong",
     # since 0.4.0 (SPEC §16; RouterDeltas.swift)
     "done+patch", "patch", "subscribe16", "unsubscribe16"])}
C = {name: 200 + i for i, name in enumerate(
    ["connect", "closed", "flushCloses", "tick", "drain", "shutdown", "emptyFrame", "oversized", "backlogged", "raw",
     "endOfBatch", "transport", "overBudget", "sweepTick", "writes"])}
STORES = ["todos", "stats", "a", "b.c"]
NEW_DEFAULTS = (0, 0, 0, 0)


def v2(ping=0, store_timeout=0, close_stalled=False, budget=0, queries=0, query_bytes=0, subs=0, waitfor=0,
       stores=0, conns=0, conns_user=0, handshakes=0, pings_out=0, fair=0, batching=False):
    """Bytes 2-5 from table indices (RouterHarness: pingIntervals [0,10,100,1000], storeTimeouts [0,10,100,2000],
    budgets (8), maxQueries [4096,1,2,3], maxQueryBytes [1M,4,16,64], maxSubscriptions [4096,1,2,3], maxWaitFor
    [64,0,1,2], maxStoresPerConnection [1024,1,2,3], maxConnections [8192,2,3,4], maxConnectionsPerUser [4096,1,2,3],
    handshakes [(1024,256),(1,1),(2,1),(3,2)], maxPingsOut [2,0,1,3], fairPending [8,0,1,2])."""
    return (ping | store_timeout << 2 | (0x10 if close_stalled else 0) | budget << 5,
            queries | query_bytes << 2 | subs << 4 | waitfor << 6,
            stores | conns << 2 | conns_user << 4 | handshakes << 6,
            pings_out | fair << 2 | (0x10 if batching else 0))


def connect(slot, creds=1):
    return [C["connect"], slot, creds]


def hello(slot, role, heartbeat=False):  # role: 0 client, 1 store, 2 monitor
    return [T["hello"], slot, role, 0, 1, 1, 1, 1 if heartbeat else 0]


def register(slot, store, handles_mask, waitfor=None, state=None, deltas=False):
    out = [T["register"], slot, 1, store, 2, handles_mask]
    out += [0] if waitfor is None else [3, waitfor]
    out += [2] if deltas else [0]
    out += [0] if state is None else [3, state]
    return out


def query(slot, q, store, reuse=None):  # q: index in RouterHarness.queries; reuse: only when the slot has ids
    return [T["query"], slot] + ([] if reuse is None else [reuse]) + [1, q, 1, store]


def pong(slot):
    return [T["pong"], slot, 2]


def dispatch(slot, type_index, settle=True, cause=False):
    return [T["dispatch"], slot, 0, type_index, 1, 1, 0 if settle else 5, 3, 0 if cause else 3]


def done(slot, state=None, wrong=False):
    return [T["done"], slot, 1, 0, 3 if wrong else 0] + ([0] if state is None else [4, state]) + [1]


def reject(slot):
    return [T["reject"], slot, 1, 0, 0, 0]


def subscribe(slot, store):
    return [T["subscribe"], slot, 1, store]


# --- SPEC §16 (RouterHarness.templates16). A patch is [count, ops..., format, base]; each op [kind, args...].
PATHS = {p: i for i, p in enumerate(["", "/n", "/t", "/todos", "/todos/0", "/todos/1", "/todos/2", "/todos/-",
                                     "/todos/0/done", "/todos/1/done", "/0", "/1", "/2", "/-", "/x", "/a~1b", "/n/x",
                                     "/todos/01"])}
VALUES = {v: i for i, v in enumerate(["1", "2", "true", '"s"', "null", "done", "[]", "[1,2]", "todos"])}
SUB_PATHS = {p: i for i, p in enumerate(["", "/n", "/t", "/todos", "/todos/0", "/todos/1", "/todos/2",
                                         "/todos/1/done", "/0", "/1", "/2", "/-", "/a~1b", "/x"])}


def op_add(path, value): return [0, PATHS[path], VALUES[value]]
def op_remove(path): return [2, PATHS[path]]
def op_replace(path, value): return [3, PATHS[path], VALUES[value]]
def op_move(frm, path): return [5, PATHS[frm], PATHS[path]]
def op_copy(frm, path): return [6, PATHS[frm], PATHS[path]]
def op_test(path, value): return [7, PATHS[path], VALUES[value]]
def op_append(id_, done): return [8, id_, 1 if done else 0]
def op_toggle(i, done): return [9, i, 1 if done else 0]
def op_root(value): return [10, VALUES[value]]
def op_invalid(k): return [11, k]


def patch(*ops, spaces=False, base=None):  # base: None, "right", "next", "previous"
    out = [len(ops)]
    for o in ops:
        out += o
    out.append(0 if spaces else 1)
    out.append({None: 4, "right": 0, "next": 2, "previous": 3}[base])
    return out


def done_patch(slot, p, mode=0, state=None):
    """mode 0: patch only; 4: with the consistent state; 6: with states[state]; 7: malformed (p: table index)."""
    if mode == 7:
        return [T["done+patch"], slot, 1, 0, 0, 7, p]
    return [T["done+patch"], slot, 1, 0, 0, mode] + p + ([state] if mode == 6 else [])


def patch_op(slot, p):
    return [T["patch"], slot, 1, 0, 1] + p


def subscribe16(slot, store, deltas=False, from_=None, path=None):
    """from_: None, "current", "previous", ("back", n), ("ahead", n); path: a SUB_PATHS key."""
    out = [T["subscribe16"], slot, 1, store, 1 if deltas else 0]
    if from_ is None: out.append(0)
    elif from_ == "current": out.append(3)
    elif from_ == "previous": out.append(4)
    elif from_[0] == "back": out += [5, from_[1]]
    else: out += [6, from_[1]]
    out += [0] if path is None else [1, SUB_PATHS[path]]
    return out


def unsubscribe_path(slot, index=0):  # the index-th path the slot holds (sorted by store, path)
    return [T["unsubscribe16"], slot, index, 1]


def writes(slot, how):  # 0 resume, 1 held, 2 held and behind, 3 not behind
    return [C["writes"], slot, how]


def tick(step):  # 0, 1, 50, 99, 100, 101, 4999, 5000, 5001 ms
    return [C["tick"], 0, step]


def program(config, *steps):
    out = list(config)
    for s in steps:
        out += s
    return bytes(out)


def router_seeds():
    basic = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b11, state=1),
             subscribe(0, 0), dispatch(0, 0), done(1, state=2), dispatch(0, 1), reject(1))
    waitfor = (connect(0), hello(0, 0), connect(1), hello(1, 1), connect(2), hello(2, 1),
               register(1, 0, 0b1), register(2, 1, 0b1, waitfor=0), subscribe(0, 1), subscribe(0, 0),
               dispatch(0, 0), done(2), done(1, state=3), done(2, state=4))
    down = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b1), dispatch(0, 0), dispatch(0, 1),
            [C["closed"], 1], dispatch(0, 0), connect(3), hello(3, 1), register(3, 0, 0b1), done(3), done(3, state=1),
            tick(7), dispatch(0, 0))
    timeout = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 2, 0b10000), dispatch(0, 3),
               [T["unregister"], 1, 1, 1, 0], tick(3), tick(7), tick(8), dispatch(0, 3))
    monitor = (connect(4), hello(4, 2), connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b1001),
               dispatch(0, 0), dispatch(0, 4), done(1, state=1, wrong=True), done(1), [T["info"], 0],
               [T["query"], 0, 1, 0, 1, 0], [T["get"], 0, 1, 0], [T["ping"], 0, 1])
    shutdown = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b1), dispatch(0, 0),
                dispatch(0, 0), [C["drain"], 0], dispatch(0, 0), done(1), [C["shutdown"], 0, 0], connect(2),
                dispatch(0, 0))
    garbage = (connect(0), [T["garbage"], 0, 1, 5], hello(0, 0), [T["garbage"], 0, 1, 1], [C["emptyFrame"], 0],
               [T["unknown"], 0, 0], [T["host"], 0], [C["oversized"], 0], [C["flushCloses"], 0], connect(0),
               [C["raw"], 0, 8] + list(b'{"op":1}'), connect(2), tick(3), tick(6), [C["backlogged"], 2])
    handshake = (connect(0), connect(1), [T["hello"], 1, 0, 3, 1, 1, 0], tick(5), tick(5), [T["bye"], 0])
    # A store goes down holding an action, then shutdown, then time passes (settled once, not again).
    shutdown_down = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 2, 0b10000), dispatch(0, 3),
                     [C["closed"], 1], [C["shutdown"], 0, 0], tick(7), tick(8))
    configs = [(0x00, 0x00) + NEW_DEFAULTS, (0x81, 0x05) + NEW_DEFAULTS, (0x16, 0x09) + NEW_DEFAULTS,
               (0x93, 0x04) + NEW_DEFAULTS]
    inputs = [("abandon", program((0x81, 0xF5) + NEW_DEFAULTS, *basic)),
              ("abandon-down", program((0x12, 0xF1) + NEW_DEFAULTS, *down))]
    for name, steps in [("basic", basic), ("waitfor", waitfor), ("down", down), ("timeout", timeout),
                        ("monitor", monitor), ("shutdown", shutdown), ("garbage", garbage),
                        ("handshake", handshake), ("shutdown-down", shutdown_down)]:
        for k, config in enumerate(configs):
            inputs.append((f"{name}{k}", program(config, *steps)))

    # --- since 0.2.0
    # Heartbeats: two peers ask, one answers its pings (pong) and one stays silent until it is unresponsive; a
    # third does not ask and is never pinged.
    heartbeat = (connect(0), hello(0, 0, heartbeat=True), connect(1), hello(1, 1, heartbeat=True), connect(2),
                 hello(2, 0), tick(2), tick(2), pong(1), [C["sweepTick"], 0, 1], tick(2), pong(1), tick(3),
                 [C["sweepTick"], 0, 3], tick(5), [T["ping"], 1, 1], tick(6))
    for k, cfg in enumerate([v2(ping=1, pings_out=2), v2(ping=2, pings_out=1), v2(ping=1, pings_out=1, store_timeout=1)]):
        inputs.append((f"heartbeat{k}", program((0x00, 0x00) + cfg, *heartbeat)))
    # Query deltas: a store asks for them, clients query and unquery (the same query twice, another spelling of
    # it), one closes holding queries.
    deltas = (connect(1), hello(1, 1), register(1, 0, 0b1, deltas=True), connect(0), hello(0, 0), connect(2),
              hello(2, 0), query(0, 0, 0), query(2, 0, 0), query(0, 5, 0, reuse=1), query(2, 6, 0, reuse=1),
              [T["unquery"], 0, 1, 0], [C["closed"], 2], query(0, 1, 0, reuse=1), [T["unregister"], 1, 1, 1, 0],
              query(0, 2, 0, reuse=1), register(1, 0, 0b1, deltas=True), [T["bye"], 0])
    # Whole sets, deferred to the end of the batch (batching: several queries in one batch, then .endOfBatch).
    whole = (connect(1), hello(1, 1), register(1, 0, 0b1), connect(0), hello(0, 0), query(0, 0, 0), query(0, 1, 0, reuse=1),
             query(0, 0, 0, reuse=1), [C["endOfBatch"], 0], [T["unquery"], 0, 1, 0], [C["closed"], 0], [C["endOfBatch"], 0])
    for k, cfg in enumerate([NEW_DEFAULTS, v2(batching=True), v2(queries=2, query_bytes=3, batching=True)]):
        inputs.append((f"deltas{k}", program((0x00, 0x00) + cfg, *deltas)))
        inputs.append((f"whole{k}", program((0x00, 0x00) + cfg, *whole)))
    # Stalled stores: an action left unanswered for storeTimeout (closed when closeStalledStores), then answered.
    stalled = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b1), dispatch(0, 0), tick(2),
               [C["sweepTick"], 0, 2], tick(3), done(1, state=1), dispatch(0, 0), tick(5), [C["flushCloses"], 0],
               connect(3), hello(3, 1), register(3, 0, 0b1), tick(5), done(3))
    for k, cfg in enumerate([v2(store_timeout=1), v2(store_timeout=2, close_stalled=True),
                             v2(store_timeout=1, close_stalled=True, ping=1)]):
        inputs.append((f"stalled{k}", program((0x00, 0x00) + cfg, *stalled)))
    # Limits: tiny per-connection limits and connection limits (a third connection of one user refused).
    limits = (connect(0), hello(0, 0), connect(1), hello(1, 1), subscribe(0, 0), subscribe(0, 1), subscribe(0, 0),
              query(0, 0, 0), query(0, 6, 1, reuse=1), register(1, 0, 0b1, waitfor=1), register(1, 0, 0b1),
              register(1, 1, 0b10), connect(2), connect(3, 3), [T["hello"], 3, 0, 0, 1, 1, 1, 0], connect(4))
    for k, cfg in enumerate([v2(queries=1, subs=1, waitfor=1, stores=1, conns=2),
                             v2(query_bytes=2, subs=2, stores=2, conns_user=2, handshakes=1),
                             v2(queries=2, waitfor=2, conns=3, handshakes=2, budget=5)]):
        inputs.append((f"limits{k}", program((0x00, 0x00) + cfg, *limits)))
    # The memory budget: a small budget, dispatches and states that fill it, the transport's bytes (refused:
    # .overBudget), registrations and retained snapshots that stay charged after every connection closed.
    memory = (connect(0), hello(0, 0), connect(1), hello(1, 1), register(1, 0, 0b1, state=1), subscribe(0, 0),
              dispatch(0, 0), dispatch(0, 0), [C["transport"], 0, 5], [C["transport"], 0, 7], done(1, state=6),
              done(1, state=2), [C["transport"], 1, 3], [C["overBudget"], 1], [C["flushCloses"], 0], connect(2, 3),
              hello(2, 1), register(2, 0, 0b1), [T["state"], 2, 1, 0, 1, 3], [C["transport"], 2, 0])
    for k, cfg in enumerate([v2(budget=1), v2(budget=3), v2(budget=6, fair=1), v2(budget=2)]):
        inputs.append((f"memory{k}", program((0x00, 0x00) + cfg, *memory)))

    # --- since 0.4.0 (SPEC §16): patches, delta and path subscribers, resume, held writes and peers behind.
    # A store with a todo list; a full, a delta and two path subscribers; changes as patches (one appending, one
    # shifting indices), a state with a patch, the patch op, an empty patch, then a patch that fails (the store is
    # closed and registers again: the action comes back).
    todo = (connect(1), hello(1, 1), register(1, 0, 0b1, state=1), connect(0), hello(0, 0), subscribe(0, 0),
            connect(2), hello(2, 0), subscribe16(2, 0, deltas=True), connect(3), hello(3, 0),
            subscribe16(3, 0, path="/todos/1"), subscribe16(3, 0, path="/n"),
            dispatch(0, 0), done_patch(1, patch(op_root("todos"), base="right")),
            dispatch(0, 0), done_patch(1, patch(op_append(3, False), op_replace("/n", "2"), spaces=True)),
            dispatch(0, 1), done_patch(1, patch(op_remove("/todos/0")), mode=4),
            patch_op(1, patch(op_toggle(1, True), op_test("/n", "2"))),
            dispatch(0, 0), done_patch(1, patch()),
            dispatch(0, 0), done_patch(1, patch(op_move("/todos/0", "/todos/-"), op_copy("/n", "/x")), mode=6, state=2),
            dispatch(0, 0), done_patch(1, patch(op_remove("/x"), op_remove("/x"))),
            [C["flushCloses"], 0], connect(4), hello(4, 1), register(4, 0, 0b1), done_patch(4, patch(op_replace("/n", "1"), base="next")),
            register(4, 0, 0b1), done(4, state=3), [T["get"], 0, 1, 0], unsubscribe_path(3))
    # Malformed: a patch that is not an array, deltas with a path, a bad path, a patch for a store with no state.
    malformed = (connect(1), hello(1, 1), register(1, 0, 0b1), connect(0), hello(0, 0),
                 [T["subscribe16"], 0, 1, 0, 1, 0, 1, 1], [T["subscribe16"], 0, 1, 0, 0, 0, 3, 1],
                 dispatch(0, 0), done_patch(1, 0, mode=7), done_patch(1, patch(op_invalid(0))),
                 connect(2), hello(2, 1), register(2, 1, 0b100), patch_op(2, patch(op_add("/n", "1"))))
    # Resume: a delta subscriber comes back with the version it holds, an older one, one ahead.
    resume = (connect(1), hello(1, 1), register(1, 0, 0b1, state=1), connect(0), hello(0, 0),
              patch_op(1, patch(op_replace("/n", "2"))), patch_op(1, patch(op_add("/x", "1"))),
              patch_op(1, patch(op_remove("/n"))),
              subscribe16(0, 0, deltas=True, from_="current"), subscribe16(0, 0, deltas=True, from_=("back", 1)),
              subscribe16(0, 0, deltas=True, from_=("ahead", 1)), subscribe16(0, 0, from_="previous"),
              patch_op(1, patch(op_add("/n", "true"))), [C["closed"], 0], connect(0), hello(0, 0),
              subscribe16(0, 0, deltas=True, from_=("back", 2)), patch_op(1, patch(op_replace("/n", "1"))))
    # Held writes and peers behind: a delta subscriber falls behind (snapshots, coalesced), catches up (deltas).
    behind = (connect(1), hello(1, 1), register(1, 0, 0b1, state=1), connect(0), hello(0, 0),
              subscribe16(0, 0, deltas=True), subscribe16(0, 0, path="/n"), writes(0, 2),
              patch_op(1, patch(op_replace("/n", "2"))), patch_op(1, patch(op_replace("/n", "1"))),
              writes(0, 3), patch_op(1, patch(op_replace("/n", "2"))), writes(0, 0),
              patch_op(1, patch(op_replace("/n", "true"))), dispatch(0, 0), done_patch(1, patch(op_remove("/n"))))
    for k, (b0, cfg) in enumerate([(0x80, NEW_DEFAULTS), (0x00, NEW_DEFAULTS), (0x80, v2(subs=2, budget=4)),
                                   (0x80, v2(budget=1, batching=True))]):
        for name, steps in [("todo", todo), ("malformed", malformed), ("resume", resume), ("behind", behind)]:
            inputs.append((f"{name}{k}", program((b0, 0x00) + cfg, *steps)))
    write_corpus("router", inputs)


if __name__ == "__main__":
    decoder_seeds()
    envelope_seeds()
    router_seeds()
