#!/usr/bin/env python3
"""Plays the FluxBus conformance scenarios (protocol/conformance/*.json) against a real fluxd.

Standard library only (Python 3.9+). Usage::

    python3 protocol/conformance/run.py [--fluxd PATH] [SCENARIO.json ...]

fluxd is found through ``--fluxd``, else the environment variable ``FLUXD``, else ``.build/debug/fluxd``.
Each scenario starts its own fluxd on a private socket (with the scenario's ``fluxd`` arguments), plays its
steps and stops it. The format is described in ``protocol/conformance/README.md``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_TIMEOUT = 10.0
# The ops fluxd sends in protocol 1 (SPEC §7). A peer ignores any other op it receives (SPEC §13), and so does
# the runner: e.g. a later fluxd may send new ops to monitors.
KNOWN_D2C_OPS = frozenset([
    "welcome", "registered", "action", "settled", "snapshot", "subscribed", "unsubscribed", "store-down",
    "store-up", "query-ok", "unquery-ok", "queries", "info", "got", "pong", "bye", "error",
    "recovered", "history", "state-at",  # replies to §8.12's requests, since fluxd 0.3.0
    "delta", "subtree",  # sent to delta and path subscribers, since fluxd 0.4.0 (§16.3, §16.4)
    "forgotten"])  # the reply to forget, since fluxd 0.4.0 (§10)
PLACEHOLDER = re.compile(r"^\$[A-Za-z_][A-Za-z0-9_.:-]*$")


class ScenarioFailure(AssertionError):
    """A scenario step did not get what it expected."""


def fluxd_path(explicit: Optional[str] = None) -> str:
    """The fluxd executable: ``explicit``, else ``$FLUXD``, else ``.build/debug/fluxd`` in the repository."""
    path = explicit or os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"fluxd not found at {path} (build it or set FLUXD)")
    return path


def scenario_files() -> List[str]:
    """Every scenario file, sorted by name."""
    return sorted(glob.glob(os.path.join(HERE, "*.json")))


class Fluxd:
    """A fluxd process on a socket in a private temporary directory."""

    def __init__(self, executable: str, arguments: List[str]):
        self.directory = tempfile.mkdtemp(prefix="fluxconf-")
        self.socket_path = os.path.join(self.directory, "fluxd.sock")
        self.stderr_path = os.path.join(self.directory, "stderr.log")
        with open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen([executable, "--socket", self.socket_path, "--ephemeral", *arguments],
                                            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        line = b""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.stop()
                raise ScenarioFailure("fluxd did not print its ready line")
            chunk = os.read(fd, 1)
            if not chunk:
                err = self.stderr
                self.stop()
                raise ScenarioFailure(f"fluxd exited before it was ready:\n{err}")
            line += chunk

    @property
    def stderr(self) -> str:
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def signal(self, name: str) -> None:
        if self.process.poll() is None:
            self.process.send_signal(getattr(signal, "SIG" + name))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class Peer:
    """A raw connection: sends frames or bytes, reads frames with deadlines."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = bytearray()
        self.eof = False

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def next_frame(self, timeout: float) -> Optional[bytes]:
        """The next frame body; None at EOF; raises ScenarioFailure at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 4:
                n = struct.unpack(">I", bytes(self.buffer[:4]))[0]
                if len(self.buffer) >= 4 + n:
                    body = bytes(self.buffer[4:4 + n])
                    del self.buffer[:4 + n]
                    return body
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                raise ScenarioFailure("timed out waiting for a frame")
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                self.buffer += chunk
            else:
                self.eof = True

    def close(self) -> None:
        self.sock.close()


def substitute(value: Any, bindings: Dict[str, Any]) -> Any:
    """``value`` with every bound placeholder string replaced by its value (``$$x`` becomes ``$x``)."""
    if isinstance(value, dict):
        return {k: substitute(v, bindings) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, bindings) for v in value]
    if isinstance(value, str):
        if value.startswith("$$"):
            return value[1:]
        if PLACEHOLDER.match(value):
            if value not in bindings:
                raise ScenarioFailure(f"placeholder {value} used before it was bound")
            return bindings[value]
    return value


def match(pattern: Any, actual: Any, bindings: Dict[str, Any], path: str = "") -> Optional[str]:
    """None if ``actual`` matches ``pattern`` (binding new placeholders), else a description of the mismatch."""
    if isinstance(pattern, str) and not pattern.startswith("$$") and PLACEHOLDER.match(pattern):
        if pattern == "$any":
            return None
        if pattern in bindings:
            return None if same(bindings[pattern], actual) else f"{path or 'value'}: {actual!r} != {pattern}={bindings[pattern]!r}"
        bindings[pattern] = actual
        return None
    if isinstance(pattern, str) and pattern.startswith("$$"):
        pattern = pattern[1:]
    if isinstance(pattern, dict):
        if not isinstance(actual, dict):
            return f"{path or 'value'}: expected an object, got {actual!r}"
        for key, sub in pattern.items():
            if sub == "$absent":
                if key in actual:
                    return f"{path}.{key}: expected absent, got {actual[key]!r}"
                continue
            if key not in actual:
                return f"{path}.{key}: missing"
            problem = match(sub, actual[key], bindings, f"{path}.{key}")
            if problem:
                return problem
        return None
    if isinstance(pattern, list):
        if not isinstance(actual, list) or len(actual) != len(pattern):
            return f"{path or 'value'}: expected {len(pattern)} elements, got {actual!r}"
        for i, (p, a) in enumerate(zip(pattern, actual)):
            problem = match(p, a, bindings, f"{path}[{i}]")
            if problem:
                return problem
        return None
    return None if same(pattern, actual) else f"{path or 'value'}: expected {pattern!r}, got {actual!r}"


def same(a: Any, b: Any) -> bool:
    """JSON equality (booleans are not numbers)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def run_scenario(path: str, executable: Optional[str] = None, log=None) -> None:
    """Plays one scenario file against a fresh fluxd; raises ScenarioFailure on the first mismatch."""
    with open(path, encoding="utf-8") as f:
        scenario = json.load(f)
    fluxd = Fluxd(fluxd_path(executable), scenario.get("fluxd", []))
    peers: Dict[str, Peer] = {}
    bindings: Dict[str, Any] = {}
    barrier = 0
    try:
        for index, step in enumerate(scenario["steps"]):
            where = f"{os.path.basename(path)} step {index + 1} ({json.dumps(step)[:160]})"
            try:
                kind = step["do"]
                name = step.get("peer")
                timeout = step.get("timeout", DEFAULT_TIMEOUT)
                if kind == "connect":
                    peers[name] = Peer(fluxd.socket_path)
                elif kind == "hello":
                    if name not in peers:
                        peers[name] = Peer(fluxd.socket_path)
                    hello = {"op": "hello", "protocol": 1, "role": step.get("role", "client"), "name": step.get("name", name)}
                    peers[name].send_body(json.dumps(hello).encode())
                    expect_frame(peers[name], {"op": "welcome", "protocol": 1, "peer": "$peer." + name}, bindings, timeout)
                elif kind == "send":
                    peer = peers[name]
                    if "frame" in step:
                        peer.send_body(json.dumps(substitute(step["frame"], bindings), separators=(",", ":")).encode())
                    elif "body" in step:
                        peer.send_body(step["body"].encode("utf-8"))
                    else:
                        peer.send_bytes(bytes.fromhex(step["hex"]))
                elif kind == "expect":
                    expect_frame(peers[name], step["frame"], bindings, timeout)
                elif kind == "expect-closed":
                    body = next_known(peers[name], timeout)
                    if body is not None:
                        raise ScenarioFailure(f"expected the connection to close, got {body!r}")
                elif kind == "quiet":
                    barrier += 1
                    ident = f"quiet-{barrier}"
                    peers[name].send_body(json.dumps({"op": "ping", "id": ident}).encode())
                    expect_frame(peers[name], {"op": "pong", "id": ident}, bindings, timeout)
                elif kind == "close":
                    peers.pop(name).close()
                elif kind == "signal":
                    fluxd.signal(step["signal"])
                else:
                    raise ScenarioFailure(f"unknown step kind {kind!r}")
            except ScenarioFailure as failure:
                raise ScenarioFailure(f"{where}: {failure}\nfluxd stderr:\n{fluxd.stderr[-2000:]}") from None
            if log:
                log(f"  ok {where}")
    finally:
        for peer in peers.values():
            peer.close()
        fluxd.stop()


def next_known(peer: Peer, timeout: float) -> Optional[bytes]:
    """The next frame whose op is a protocol-1 op (others are ignored, SPEC §13); None at EOF."""
    deadline = time.monotonic() + timeout
    while True:
        body = peer.next_frame(max(0.0, deadline - time.monotonic()))
        if body is None:
            return None
        try:
            op = json.loads(body).get("op")
        except (ValueError, AttributeError):
            return body
        if op in KNOWN_D2C_OPS:
            return body


def expect_frame(peer: Peer, pattern: Any, bindings: Dict[str, Any], timeout: float) -> None:
    body = next_known(peer, timeout)
    if body is None:
        raise ScenarioFailure("connection closed instead of a frame")
    try:
        actual = json.loads(body)
    except ValueError:
        raise ScenarioFailure(f"frame is not JSON: {body!r}") from None
    trial = dict(bindings)
    problem = match(pattern, actual, trial)
    if problem:
        raise ScenarioFailure(f"{problem}\n  frame: {body.decode('utf-8', 'replace')}")
    bindings.update(trial)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fluxd", help="path of the fluxd executable")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step")
    parser.add_argument("scenarios", nargs="*", help="scenario files (default: all)")
    args = parser.parse_args(argv)
    failed = 0
    files = args.scenarios or scenario_files()
    for path in files:
        try:
            run_scenario(path, args.fluxd, log=print if args.verbose else None)
            print(f"PASS {os.path.basename(path)}")
        except ScenarioFailure as failure:
            failed += 1
            print(f"FAIL {os.path.basename(path)}: {failure}")
    print(f"{len(files) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
