#!/usr/bin/env python3
"""A validating Unix-socket proxy for FluxBus: every frame fluxd and its peers exchange is checked against the
protocol schemas (protocol/schemas, the single source of truth), while the bytes pass through unchanged.

    python3 protocol/tools/schema_proxy.py --listen /tmp/p.sock --upstream /tmp/fluxd.sock --report report.json

Peers connect to --listen instead of fluxd's socket; the proxy opens one connection to --upstream per accepted
peer and copies bytes both ways as they arrive (nothing is reframed, delayed for validation or altered). Beside
the copy, it reassembles the 4-byte-length frames of each direction (SPEC §3.1) and validates each body:

- peer -> fluxd: against <op>.s2d.schema.json when the op has one (register, done, reject, state, patch, unregister),
  else <op>.c2d.schema.json;
- fluxd -> peer: against <op>.d2c.schema.json.

An op is looked up by (op, direction) in index.json, so an op that exists in both directions is checked against the
schema of the direction it travels: a peer's ping against ping.c2d, fluxd's heartbeat ping (since fluxd 0.2.0)
against ping.d2c, and pong likewise.

A frame that is not a JSON object with a string op (RFC 8259 JSON: NaN/Infinity and duplicate top-level keys are
refused too), or whose op has no schema in its direction, is a violation as well. A test that sends bad input on
purpose names those peers with --bad-input-peer NAME (the `name` of their hello, fnmatch patterns, repeatable):
their peer -> fluxd violations are recorded under "bad_input" instead of "violations" (fluxd's answers to them are
still checked).

It prints "schema-proxy ready on PATH" once listening. On SIGTERM or SIGINT it lets the frames fluxd sent last
pass through (at most 2 s; at once when fluxd has exited), writes the JSON report (--report, default stdout) and
exits: 0, or 1 if there were violations (unless --report-only, which always exits 0). SIGUSR1
writes the report without exiting. The report:

    {"connections": N, "frames": {"c2d": {"hello": 3, ...}, "s2d": {...}, "d2c": {...}},
     "violations": [{"conn": 2, "peer": "todo-view", "role": "client", "direction": "d2c", "op": "snapshot",
                     "frame": "<the body, truncated>", "error": "...", "path": "/version"}, ...],
     "bad_input": [...same shape...]}

Needs Python 3.9+ and the jsonschema package (pip install jsonschema).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Dict, List, Optional

try:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match
except ImportError:
    print("schema_proxy.py needs the 'jsonschema' package: pip install jsonschema", file=sys.stderr)
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.normpath(os.path.join(HERE, "..", "schemas"))
DRAIN_SECONDS = 2.0  # how long a stop waits for the frames fluxd sent last to pass through
FRAME_EXCERPT = 4000  # characters of a violating frame kept in the report
CHUNK = 256 * 1024


def load_validators(directory: str = SCHEMAS) -> Dict[tuple, Draft202012Validator]:
    """{(op, direction): validator} for every schema listed in index.json."""
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    validators = {}
    for entry in index["schemas"]:
        with open(os.path.join(directory, entry["file"]), encoding="utf-8") as f:
            validators[(entry["op"], entry["direction"])] = Draft202012Validator(json.load(f))
    return validators


class BadBody(ValueError):
    """A frame body that is not a JSON object with a string op."""


def _no_duplicates(pairs: List[tuple]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BadBody(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise BadBody(f"{name} is not JSON")


def parse_body(body: bytes) -> Dict[str, Any]:
    """The top-level object of a frame body; raises BadBody. Duplicate keys are refused at every level (SPEC §3.2
    only requires it at the top level of what fluxd receives, and forbids senders from producing any)."""
    if not body:
        raise BadBody("empty frame")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadBody(f"not UTF-8: {e}") from None
    if text.startswith("\ufeff"):
        raise BadBody("byte order mark")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise BadBody(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadBody(f"not a JSON object ({type(value).__name__})")
    if not isinstance(value.get("op"), str):
        raise BadBody("no string op")
    return value


class Recorder:
    """Counts frames and collects violations, shared by every connection's threads."""

    def __init__(self, validators: Dict[tuple, Draft202012Validator], bad_input_peers: List[str]):
        self.validators = validators
        self.s2d_ops = {op for (op, direction) in validators if direction == "s2d"}
        self.bad_input_peers = bad_input_peers
        self.lock = threading.Lock()
        self.connections = 0
        self.frames: Dict[str, Dict[str, int]] = {"c2d": {}, "s2d": {}, "d2c": {}}
        self.peers: Dict[str, Dict[str, Dict[str, int]]] = {}
        self.violations: List[Dict[str, Any]] = []
        self.bad_input: List[Dict[str, Any]] = []

    def new_connection(self) -> int:
        with self.lock:
            self.connections += 1
            return self.connections

    def check(self, conn: "ProxiedConnection", to_fluxd: bool, body: bytes) -> None:
        """Validates one frame body and records the outcome."""
        op: Optional[str] = None
        direction = "c2d" if to_fluxd else "d2c"
        error: Optional[str] = None
        path = ""
        try:
            message = parse_body(body)
            op = message["op"]
            if to_fluxd:
                direction = "s2d" if op in self.s2d_ops else "c2d"
            validator = self.validators.get((op, direction))
            if validator is None:
                error = f"no schema for op {op!r} in direction {direction}"
            else:
                found = best_match(validator.iter_errors(message))
                if found is not None:
                    error = f"{found.message} (schema {'/'.join(str(p) for p in found.absolute_schema_path)})"
                    path = "/" + "/".join(str(p) for p in found.absolute_path)
        except BadBody as e:
            error = str(e)
        with self.lock:
            counts = self.frames[direction]
            key = op if op is not None else "(no op)"
            counts[key] = counts.get(key, 0) + 1
            per_peer = self.peers.setdefault(conn.peer or "(unnamed)", {"c2d": {}, "s2d": {}, "d2c": {}})[direction]
            per_peer[key] = per_peer.get(key, 0) + 1
            if error is None:
                return
            text = body.decode("utf-8", errors="replace")
            record = {"conn": conn.number, "peer": conn.peer, "role": conn.role, "direction": direction, "op": op,
                      "frame": text if len(text) <= FRAME_EXCERPT else text[:FRAME_EXCERPT] + "…",
                      "error": error, "path": path}
            if to_fluxd and conn.peer is not None and any(fnmatch.fnmatchcase(conn.peer, p)
                                                          for p in self.bad_input_peers):
                self.bad_input.append(record)
            else:
                self.violations.append(record)

    def report(self) -> Dict[str, Any]:
        with self.lock:
            return {"connections": self.connections,
                    "frames": {d: dict(sorted(c.items())) for d, c in self.frames.items()},
                    "peers": {p: {d: dict(sorted(c.items())) for d, c in v.items()} for p, v in sorted(self.peers.items())},
                    "violations": list(self.violations), "bad_input": list(self.bad_input)}


class FrameSplitter:
    """Reassembles length-prefixed frames from a byte stream (SPEC §3.1)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        self.buffer += data
        frames = []
        start = 0
        while len(self.buffer) - start >= 4:
            (length,) = struct.unpack_from(">I", self.buffer, start)
            if len(self.buffer) - start - 4 < length:
                break
            frames.append(bytes(self.buffer[start + 4:start + 4 + length]))
            start += 4 + length
        if start:
            del self.buffer[:start]
        return frames


class ProxiedConnection:
    """One peer and its own connection to fluxd, copied both ways by two threads."""

    def __init__(self, recorder: Recorder, peer_sock: socket.socket, upstream: str):
        self.recorder = recorder
        self.number = recorder.new_connection()
        self.peer: Optional[str] = None
        self.role: Optional[str] = None
        self.peer_sock = peer_sock
        self.fluxd_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fluxd_sock.connect(upstream)
        self.open_halves = 2
        self.lock = threading.Lock()

    def identify(self, first: bytes) -> None:
        """Takes the peer's name and role from its hello (the first frame it sends)."""
        try:
            hello = parse_body(first)
        except BadBody:
            self.peer = ""
            return
        self.peer = hello.get("name") if isinstance(hello.get("name"), str) else ""
        self.role = hello.get("role") if isinstance(hello.get("role"), str) else None

    def start(self) -> None:
        for source, sink, to_fluxd in ((self.peer_sock, self.fluxd_sock, True),
                                       (self.fluxd_sock, self.peer_sock, False)):
            thread = threading.Thread(target=self.pump, args=(source, sink, to_fluxd), daemon=True,
                                      name=f"conn{self.number}-{'up' if to_fluxd else 'down'}")
            thread.start()
            if not to_fluxd:
                FROM_FLUXD.append(thread)

    def pump(self, source: socket.socket, sink: socket.socket, to_fluxd: bool) -> None:
        splitter = FrameSplitter()
        clean = False
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    clean = True
                    break
                frames = splitter.feed(data)
                if to_fluxd and self.peer is None and frames:
                    self.identify(frames[0])  # before fluxd can answer, so its welcome is attributed too
                try:
                    sink.sendall(data)  # forward, then validate: validation never delays the traffic
                finally:
                    # Recorded even when the receiver is gone (a client that closed right after fluxd's last
                    # frames); a failed forward then ends this direction as broken.
                    for body in frames:
                        self.recorder.check(self, to_fluxd, body)
        except OSError:
            pass
        finally:
            try:
                if clean:
                    sink.shutdown(socket.SHUT_WR)  # pass the end of this direction on (half-close)
                else:  # reset or broken pipe: end both directions
                    self.peer_sock.shutdown(socket.SHUT_RDWR)
                    self.fluxd_sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with self.lock:
                self.open_halves -= 1
                last = self.open_halves == 0
            if last:
                self.peer_sock.close()
                self.fluxd_sock.close()


# The threads forwarding fluxd's frames to peers (joined on stop, so the report has every frame fluxd sent).
FROM_FLUXD: List[threading.Thread] = []


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Validating FluxBus proxy (see the module docstring).")
    parser.add_argument("--listen", required=True, help="the socket path peers connect to")
    parser.add_argument("--upstream", required=True, help="fluxd's socket")
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    parser.add_argument("--bad-input-peer", action="append", default=[], metavar="NAME",
                        help="peers (hello name, fnmatch pattern) that send bad input on purpose")
    parser.add_argument("--report-only", action="store_true", help="exit 0 even if there were violations")
    parser.add_argument("--schemas", default=SCHEMAS, help="the schema folder (default: protocol/schemas)")
    args = parser.parse_args(argv)

    recorder = Recorder(load_validators(args.schemas), args.bad_input_peer)
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.listen)
    listener.listen(128)

    def write_report() -> Dict[str, Any]:
        report = recorder.report()
        text = json.dumps(report, indent=1, ensure_ascii=False) + "\n"
        if args.report:
            temporary = args.report + ".tmp"
            with open(temporary, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temporary, args.report)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
        return report

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: write_report())

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                peer, _ = listener.accept()
            except OSError:
                return
            try:
                ProxiedConnection(recorder, peer, args.upstream).start()
            except OSError as e:  # fluxd is gone: refuse this peer
                print(f"schema-proxy: cannot reach fluxd at {args.upstream}: {e}", file=sys.stderr, flush=True)
                peer.close()

    threading.Thread(target=accept_loop, daemon=True, name="accept").start()
    print(f"schema-proxy ready on {args.listen}", flush=True)
    while not stop.wait(0.2):
        pass
    listener.close()
    try:
        os.unlink(args.listen)
    except OSError:
        pass
    # What fluxd sent before it closed (its last `bye`s) may still be on its way through a pump: let the pumps
    # reading from fluxd finish (they do at once once fluxd has exited), for at most DRAIN_SECONDS.
    deadline = time.monotonic() + DRAIN_SECONDS
    for thread in list(FROM_FLUXD):
        thread.join(max(0.0, deadline - time.monotonic()))
    report = write_report()
    if report["violations"]:
        print(f"schema-proxy: {len(report['violations'])} violation(s)", file=sys.stderr, flush=True)
        return 0 if args.report_only else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
