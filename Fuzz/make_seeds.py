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


def write_corpus(name, inputs):
    out = os.path.join(HERE, "corpus", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
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


# --- router: bytes 0-1 = limits; then steps: [op, slot, args...]. op < 200 = message template (index below),
# op >= 200 = control. Mirrors RouterHarness (Sources/FuzzTargets/RouterTarget.swift); slots with no connection
# turn a message step into a connect (one byte: credentials).
T = {name: i for i, name in enumerate(
    ["hello", "register", "unregister", "dispatch", "done", "reject", "state", "subscribe", "unsubscribe", "query",
     "unquery", "get", "info", "ping", "bye", "host", "unknown", "garbage"])}
C = {name: 200 + i for i, name in enumerate(
    ["connect", "closed", "flushCloses", "tick", "drain", "shutdown", "emptyFrame", "oversized", "backlogged", "raw"])}
STORES = ["todos", "stats", "a", "b.c"]


def connect(slot, creds=1):
    return [C["connect"], slot, creds]


def hello(slot, role):  # role: 0 client, 1 store, 2 monitor
    return [T["hello"], slot, role, 0, 1, 1, 1]


def register(slot, store, handles_mask, waitfor=None, state=None):
    out = [T["register"], slot, 1, store, 2, handles_mask]
    out += [0] if waitfor is None else [3, waitfor]
    out += [0] if state is None else [3, state]
    return out


def dispatch(slot, type_index, settle=True, cause=False):
    return [T["dispatch"], slot, 0, type_index, 1, 1, 0 if settle else 5, 3, 0 if cause else 3]


def done(slot, state=None, wrong=False):
    return [T["done"], slot, 1, 0, 3 if wrong else 0] + ([0] if state is None else [4, state]) + [1]


def reject(slot):
    return [T["reject"], slot, 1, 0, 0, 0]


def subscribe(slot, store):
    return [T["subscribe"], slot, 1, store]


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
    configs = [(0x00, 0x00), (0x81, 0x05), (0x16, 0x09), (0x93, 0x04)]
    inputs = [("abandon", program((0x81, 0xF5), *basic)), ("abandon-down", program((0x12, 0xF1), *down))]
    for name, steps in [("basic", basic), ("waitfor", waitfor), ("down", down), ("timeout", timeout),
                        ("monitor", monitor), ("shutdown", shutdown), ("garbage", garbage),
                        ("handshake", handshake), ("shutdown-down", shutdown_down)]:
        for k, config in enumerate(configs):
            inputs.append((f"{name}{k}", program(config, *steps)))
    write_corpus("router", inputs)


if __name__ == "__main__":
    decoder_seeds()
    envelope_seeds()
    router_seeds()
