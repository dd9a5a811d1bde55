"""Every example message a peer sends (protocol/vectors/messages/*.c2d.json and *.s2d.json), sent to a real fluxd.

One test per example (`<file>-<valid|invalid|invalidBySpecOnly>-<index>`), each against a fresh fluxd (the one the
conformance scenarios use: ``$FLUXD``, else ``.build/debug/fluxd``), so that what one example does cannot change
what another one gets:

- ``hello`` examples are the first frame of a fresh connection. Every other example is sent on a connection that
  said hello in the role that may send it (``store`` for ``*.s2d``, ``client`` for ``*.c2d``), after the state it
  needs was set up: a store that handles every type for ``dispatch``, a retained snapshot for ``get``, a live query
  for ``unquery``, an owned store with a delivered action whose ``seq`` the example answers for ``done`` and
  ``reject`` (so a valid answer is really accepted, and a lax fluxd that accepts an invalid one is seen doing so),
  a fluxd with a worker config (``--config``) naming the examples' workers for the host operations of §8.11.
- An invalid example must get the ``error`` SPEC.md gives for it (``spec_verdict`` below is SPEC's rules for the
  messages peers send, written from SPEC §3-§8 and §11): ``bad-message`` for a bad field, or ``unknown-op``,
  ``handshake-required``, ``unsupported-version`` ...; with ``ref`` by §8.9 (the message's string ``id``, else its
  string ``store``; never on ``unsupported-version``, §6); fatal, then the connection closed, during the handshake
  only; otherwise the connection survives, which a ``ping`` answered by its ``pong`` right after proves. A
  refused message must have no effect (no action delivered, no settlement, no registration). An invalid example
  whose ``op`` names another valid message (``{"op":"pong"}`` among the ``ping`` examples) is handled as that one.
- A valid example must be handled: its reply (``got``, ``query-ok``, ``registered`` ...), or the effect it has (an
  action delivered with the example's type, payload and cause; a settlement of the answered action; a snapshot).
  The one valid example with a semantic error is a ``register`` whose ``waitFor`` names the store itself:
  ``cycle`` (SPEC §8.2).
- The requests of §8.12 (since fluxd 0.3.0): ``recover`` is sent on a connection whose hello had a ``session``,
  after a first connection of that session dispatched the example's first id (settled) and its second (left
  pending) and went away: the reply must give one outcome per id (``settled``, ``pending``, ``unknown``), and the
  pending one's ``settled`` must follow on the recovering connection. ``history`` and ``state-at`` are sent after
  three settled actions, or a store's three versions: answered ``not-retained`` when ``welcome.durability`` is
  ``ephemeral``; else (a durable fluxd, on a fresh data directory like every fluxd here) with the page or the
  version asked for, ``not-retained`` for a version the store never had. A few more tests check who may recover
  what. While fluxd does not speak §8.12 (its welcome has neither ``epoch`` nor ``durability``), a failure of
  these tests (and of the ``hello`` examples with a ``session``) is an xfail: "fluxd implements §8.12 in issue 15".
- §16 (since fluxd 0.4.0): a ``patch`` example, and a ``done`` example with a ``patch``, is sent for a store
  registered with the state ``PATCH_BASE_STATE`` (version 1), watched by a delta subscriber. The outcome SPEC §16.2
  gives is computed with the reference patch implementation of ``protocol/tools/check_patch_vectors.py``: a patch
  that applies makes version 2 (the delta subscriber gets the patch as a ``delta`` from 1 to 2, ``get`` the patched
  state), an empty one no version, and one that does not apply (or names a ``base`` other than 1) is
  ``patch-failed``, fatal: fluxd closes the store's connection and keeps nothing of the answer. ``subscribe``
  examples with ``deltas``, ``from`` or ``path`` subscribe to a store registered with that state: ``subscribed``
  (echoing ``deltas: true`` and ``path``), then the retained ``snapshot``, nothing (``from`` = the retained
  version), or the ``subtree`` at ``path``; ``unsubscribe`` examples with ``path`` end a path subscription made
  first. A few more tests check who may patch what, and that an action answered by a failed patch is delivered
  again. While fluxd does not speak §16 (no ``deltaHistory`` in ``welcome.limits``), a failure of these tests is an
  xfail: "fluxd implements §16 in issue 16".
- Every frame fluxd sends in these tests must pass the schema of its op (``*.d2c.schema.json``), when the
  ``jsonschema`` package is installed.

Run: ``FLUXD=/path/to/fluxd python3 -m pytest -q protocol/conformance/test_message_vectors.py`` (``-k dispatch``
for one file's examples). Standard library only, but for the reply schema checks.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import pytest

import run

sys.path.insert(0, os.path.join(run.REPO, "protocol", "tools"))
import check_patch_vectors as reference_patch  # noqa: E402  (RFC 6902/6901, standard library only)

try:
    from jsonschema import Draft202012Validator
except ImportError:  # the reply schema checks are skipped; everything else runs
    Draft202012Validator = None

MESSAGES = os.path.join(run.REPO, "protocol", "vectors", "messages")
SCHEMAS = os.path.join(run.REPO, "protocol", "schemas")
DEADLINE = 5.0
MAX_INT = 2 ** 53 - 1
HOST_OPS = {"workers", "restart-worker", "stop-worker", "reload"}
# The requests of SPEC §8.12 (since fluxd 0.3.0): recovered settlements and the journal's history.
RECOVERY_OPS = {"recover", "history", "state-at"}
MAX_RECOVER_IDS = 4096
SESSION = "vector-session"
NOT_YET = "fluxd implements §8.12 in issue 15"
NOT_YET_16 = "fluxd implements §16 in issue 16"
MAX_POINTER_BYTES = 1024  # subscribe.path (SPEC §16.4)
KINDS = ("valid", "invalid", "invalidBySpecOnly")

# --------------------------------------------------------------------------------------------------------------
# SPEC.md's rules for the messages peers send


def is_int(v: Any) -> bool:
    """An integer of §4.3: a JSON number without fraction or exponent, 0 … 2^53−1 (`1.0` is not one)."""
    return type(v) is int and 0 <= v <= MAX_INT


def is_seq(v: Any) -> bool:
    """An integer naming an action (`cause`, `done.seq`, `reject.seq`): 1 … 2^53−1 (§4.3)."""
    return is_int(v) and v >= 1


def utf8_len(v: str) -> int:
    return len(v.encode("utf-8"))


def is_store(v: Any) -> bool:
    """A store name (§4.1): 1-128 bytes of [A-Za-z0-9._:/-]."""
    return isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._:/-]{1,128}", v) is not None


def is_type(v: Any) -> bool:
    """An action type (§4.1): 1-256 bytes of [A-Za-z0-9._:/-]."""
    return isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._:/-]{1,256}", v) is not None


def is_pattern(v: Any) -> bool:
    """A pattern (§5): an action type, or a prefix of one (maybe empty) followed by one trailing `*`; ≤ 256 bytes."""
    if not isinstance(v, str):
        return False
    if v.endswith("*"):
        return re.fullmatch(r"[A-Za-z0-9._:/-]{0,255}", v[:-1]) is not None
    return is_type(v)


def is_worker(v: Any) -> bool:
    """A worker name (§8.11): 1-64 bytes of [A-Za-z0-9._-]."""
    return isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", v) is not None


def is_id(v: Any) -> bool:
    """An id (§4.2): a string of 1-256 bytes of UTF-8, decoded."""
    return isinstance(v, str) and 1 <= utf8_len(v) <= 256


def is_peer_name(v: Any) -> bool:
    """hello.name (§4.2): a string of at most 128 bytes."""
    return isinstance(v, str) and utf8_len(v) <= 128


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_json(v: Any) -> bool:
    """An opaque value (`payload`, `state`, `query`): any JSON, `null` included (§3.3)."""
    return True


def is_role(v: Any) -> bool:
    return v in ("client", "store", "monitor")


def is_store_error(v: Any) -> bool:
    """reject.error (§8.3): an object with a string `code` of 1-256 bytes and, if present, a string `message`."""
    return (isinstance(v, dict) and isinstance(v.get("code"), str) and 1 <= utf8_len(v["code"]) <= 256
            and ("message" not in v or isinstance(v["message"], str)))


def array_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(item(x) for x in v)


def is_recover_ids(v: Any) -> bool:
    """recover.ids (§8.12): an array of at most 4096 dispatch ids."""
    return array_of(is_id)(v) and len(v) <= MAX_RECOVER_IDS


def is_array(v: Any) -> bool:
    """A patch (§16.2): any JSON array; whether it applies is a question of fluxd's state (`patch-failed`), not
    of the message's fields."""
    return isinstance(v, list)


def is_pointer(v: Any) -> bool:
    """A JSON Pointer of `subscribe.path` (§16.4): RFC 6901 syntax ("" or "/"-separated tokens in which `~` is
    followed by 0 or 1), at most 1024 bytes."""
    return (isinstance(v, str) and utf8_len(v) <= MAX_POINTER_BYTES
            and re.fullmatch(r"(/([^~/]|~[01])*)*", v, re.S) is not None)


def is_history_limit(v: Any) -> bool:
    """history.limit (§8.12): an integer 1-1000."""
    return is_int(v) and 1 <= v <= 1000


REQ, OPT = True, False
# op -> field -> (required, check). `op` itself is checked before.
FIELDS: Dict[str, Dict[str, Tuple[bool, Callable[[Any], bool]]]] = {
    "hello": {"protocol": (REQ, is_int), "role": (REQ, is_role), "name": (OPT, is_peer_name),
              "heartbeat": (OPT, is_bool), "session": (OPT, is_id)},
    "bye": {},
    "dispatch": {"type": (REQ, is_type), "payload": (OPT, is_json), "id": (OPT, is_id), "settle": (OPT, is_bool),
                 "ack": (OPT, is_bool), "cause": (OPT, is_seq)},
    "get": {"store": (REQ, is_store), "id": (OPT, is_id)},
    "info": {"id": (OPT, is_id)},
    "ping": {"id": (OPT, is_id)},
    "pong": {"id": (OPT, is_id)},
    "query": {"id": (REQ, is_id), "store": (REQ, is_store), "query": (REQ, is_json)},
    "unquery": {"id": (REQ, is_id)},
    "subscribe": {"store": (REQ, is_store), "deltas": (OPT, is_bool), "from": (OPT, is_int), "path": (OPT, is_pointer)},
    "unsubscribe": {"store": (REQ, is_store), "path": (OPT, is_pointer)},
    "workers": {"id": (REQ, is_id)},
    "reload": {"id": (REQ, is_id)},
    "restart-worker": {"id": (REQ, is_id), "name": (REQ, is_worker)},
    "stop-worker": {"id": (REQ, is_id), "name": (REQ, is_worker)},
    "forget": {"id": (REQ, is_id), "store": (REQ, is_store)},
    "register": {"store": (REQ, is_store), "handles": (REQ, array_of(is_pattern)),
                 "waitFor": (OPT, array_of(is_store)), "state": (OPT, is_json), "queryDeltas": (OPT, is_bool)},
    "unregister": {"store": (REQ, is_store)},
    "done": {"store": (REQ, is_store), "seq": (REQ, is_seq), "state": (OPT, is_json), "patch": (OPT, is_array),
             "base": (OPT, is_seq)},
    "reject": {"store": (REQ, is_store), "seq": (REQ, is_seq), "error": (REQ, is_store_error)},
    "state": {"store": (REQ, is_store), "state": (REQ, is_json)},
    "patch": {"store": (REQ, is_store), "patch": (REQ, is_array), "base": (OPT, is_seq)},
    "recover": {"id": (OPT, is_id), "ids": (REQ, is_recover_ids)},
    "history": {"id": (OPT, is_id), "from": (OPT, is_seq), "limit": (OPT, is_history_limit)},
    "state-at": {"id": (OPT, is_id), "store": (REQ, is_store), "version": (OPT, is_seq), "seq": (OPT, is_int)},
}
# The ops each role may send on a ready connection (§7; the host operations of §8.11: any role; of §8.12's,
# `recover` every role but monitor, `history` and `state-at` any role).
CLIENT_OPS = {"dispatch", "subscribe", "unsubscribe", "query", "unquery", "info", "get", "ping", "pong",
              "bye", "forget"} | RECOVERY_OPS
ROLE_OPS = {
    "client": CLIENT_OPS | HOST_OPS,
    "store": CLIENT_OPS | HOST_OPS | {"register", "unregister", "done", "reject", "state", "patch"},
    "monitor": {"subscribe", "unsubscribe", "info", "get", "ping", "pong", "bye", "history", "state-at",
                "forget"} | HOST_OPS,
}
KNOWN_OPS = set().union(*ROLE_OPS.values())


class Verdict(NamedTuple):
    """The error SPEC gives for a message."""
    code: str
    ref: Optional[str]
    fatal: bool
    why: str


def spec_ref(msg: Dict[str, Any]) -> Optional[str]:
    """`error.ref` by §8.9: the message's `id` if a string, else its `store` if a string, else none."""
    if isinstance(msg.get("id"), str):
        return msg["id"]
    if isinstance(msg.get("store"), str):
        return msg["store"]
    return None


def field_problem(msg: Dict[str, Any], op: str) -> Optional[str]:
    for field, (required, check) in FIELDS[op].items():
        if field not in msg:
            if required:
                return f"required field {field!r} missing"
        elif not check(msg[field]):
            return f"field {field!r} = {short(msg[field], 60)} breaks its rule"
    if op == "dispatch" and msg.get("settle") is True and "id" not in msg:
        return "settle: true without id"
    if op == "dispatch" and msg.get("ack") is True and "id" not in msg:
        return "ack: true without id"
    if op == "state-at" and ("version" in msg) == ("seq" in msg):
        return "state-at needs exactly one of version and seq (§8.12)"
    if op == "subscribe" and msg.get("deltas") is True and "path" in msg:
        return "deltas: true together with path (§16.3: not in protocol 1)"
    return None


def spec_verdict(msg: Dict[str, Any], role: Optional[str], session: bool = True) -> Optional[Verdict]:
    """The error SPEC.md gives for `msg` (None: a valid message). `role` None: the first frame of a connection;
    `session`: whether the connection's hello had a `session` (which `recover` needs, §8.12)."""
    op = msg.get("op")
    if role is None:  # §6
        if op != "hello":
            return Verdict("handshake-required", spec_ref(msg), True, "the first frame is not a hello")
        if is_int(msg.get("protocol")) and msg["protocol"] != 1:
            return Verdict("unsupported-version", None, True, "protocol is an integer other than 1")
        problem = field_problem(msg, "hello")
        return Verdict("bad-message", spec_ref(msg), True, problem) if problem else None
    if not isinstance(op, str):
        return Verdict("bad-message", spec_ref(msg), False, "op missing or not a string (§3.3)")
    if op == "hello":
        return Verdict("bad-message", spec_ref(msg), False, "second hello (§6)")
    if op not in KNOWN_OPS:
        return Verdict("unknown-op", spec_ref(msg), False, f"op {op!r} is not one fluxd receives (§7)")
    if op not in ROLE_OPS[role]:
        return Verdict("forbidden", spec_ref(msg), False, f"a {role} may not send {op} (§7)")
    problem = field_problem(msg, op)
    if problem is None and op == "recover" and not session:
        problem = "recover on a connection whose hello had no session (§8.12)"
    return Verdict("bad-message", spec_ref(msg), False, problem) if problem else None


# --------------------------------------------------------------------------------------------------------------
# The examples


class Case(NamedTuple):
    stem: str       # e.g. "dispatch.c2d"
    kind: str       # valid | invalid | invalidBySpecOnly
    index: int
    msg: Dict[str, Any]

    @property
    def file_op(self) -> str:
        return self.stem.rsplit(".", 1)[0]

    @property
    def role(self) -> Optional[str]:
        if self.file_op == "hello":
            return None
        return "store" if self.stem.endswith(".s2d") else "client"

    @property
    def name(self) -> str:
        return f"{self.stem}-{self.kind}-{self.index}"


def load_cases() -> List[Case]:
    cases = []
    for path in sorted(glob.glob(os.path.join(MESSAGES, "*.c2d.json")) + glob.glob(os.path.join(MESSAGES, "*.s2d.json"))):
        stem = os.path.basename(path)[: -len(".json")]
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        for kind in KINDS:
            for i, msg in enumerate(doc.get(kind, [])):
                cases.append(Case(stem, kind, i, msg))
    return cases


CASES = load_cases()


def short(value: Any, n: int = 240) -> str:
    """`value` as JSON, cut to about `n` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 12] + f"…({len(text)} chars)"


def encode(msg: Any) -> bytes:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# --------------------------------------------------------------------------------------------------------------
# fluxd, connections and the replies' schemas


def _reply_validators() -> Dict[str, Any]:
    if Draft202012Validator is None:
        return {}
    validators = {}
    for path in glob.glob(os.path.join(SCHEMAS, "*.d2c.schema.json")):
        with open(path, encoding="utf-8") as f:
            validators[os.path.basename(path).split(".")[0]] = Draft202012Validator(json.load(f))
    return validators


REPLY_VALIDATORS = _reply_validators()

WORKER_SCRIPT = r'''
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[sys.argv.index("--socket") + 1])
body = json.dumps({"op": "hello", "protocol": 1, "role": "client", "name": "vector-worker"}).encode()
s.sendall(struct.pack(">I", len(body)) + body)
while s.recv(65536):  # until fluxd closes the connection (or SIGTERM ends this process)
    pass
'''


class Fluxd(run.Fluxd):
    """run.Fluxd, stopped at once: a graceful stop would drain for up to 5 s while a test's actions are
    unsettled, so the stop signal is sent twice (SPEC §8.8: a second SIGTERM/SIGINT ends the drain)."""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        super().stop()


def worker_names() -> List[str]:
    """The workers the config of the host-operation tests lists: the names of the valid examples, and `todo`,
    `comments`."""
    names = {"todo", "comments"}
    for case in CASES:
        if case.file_op in ("restart-worker", "stop-worker") and case.kind == "valid" and is_worker(case.msg.get("name")):
            names.add(case.msg["name"])
    return sorted(names)


@pytest.fixture
def start_fluxd():
    """Starts a fluxd (with a worker config when `workers` is true); every one is stopped after the test."""
    started: List[Fluxd] = []
    directories: List[str] = []

    def start(workers: bool = False) -> Fluxd:
        arguments = []
        if workers:
            directory = tempfile.mkdtemp(prefix="fluxvec-")
            directories.append(directory)
            script = os.path.join(directory, "worker.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(WORKER_SCRIPT)
            config = os.path.join(directory, "fluxd.toml")
            with open(config, "w", encoding="utf-8") as f:
                for name in worker_names():
                    f.write(f'[workers."{name}"]\ncommand = {json.dumps(sys.executable)}\n'
                            f'args = [{json.dumps(script)}]\nstores = []\nrestart = "never"\nstop_timeout = 2\n\n')
            arguments = ["--config", config]
        fluxd = Fluxd(run.fluxd_path(), arguments)
        started.append(fluxd)
        return fluxd

    yield start
    for fluxd in started:
        fluxd.stop()
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


class Conn:
    """A raw connection to fluxd that reads JSON frames with deadlines and checks each against its schema."""

    def __init__(self, fluxd: Fluxd, label: str, problems: List[str]):
        self.peer = run.Peer(fluxd.socket_path)
        self.label = label
        self.problems = problems
        self.pings = 0
        self.peer_id: Optional[int] = None
        self.welcome: Dict[str, Any] = {}

    def send(self, msg: Any) -> None:
        self.peer.send_body(encode(msg))

    def read(self, timeout: float = DEADLINE) -> Optional[Dict[str, Any]]:
        """The next frame, or None at EOF; fails the test at the deadline."""
        try:
            body = self.peer.next_frame(timeout)
        except run.ScenarioFailure:
            pytest.fail(f"{self.label}: no frame from fluxd within {timeout} s")
        except ConnectionResetError:
            body = None  # fluxd closed with our ping unread: the end of the connection
        if body is None:
            return None
        frame = json.loads(body)
        validator = REPLY_VALIDATORS.get(frame.get("op"))
        if validator is not None:
            for error in validator.iter_errors(frame):
                self.problems.append(f"{self.label} got a frame that breaks {frame.get('op')}.d2c.schema.json "
                                     f"({error.message}): {short(frame)}")
        return frame

    def hello(self, role: str, session: Optional[str] = None) -> Dict[str, Any]:
        hello = {"op": "hello", "protocol": 1, "role": role, "name": self.label}
        if session is not None:
            hello["session"] = session
        self.send(hello)
        welcome = self.read()
        assert welcome and welcome.get("op") == "welcome", f"{self.label}: hello answered {welcome}"
        self.peer_id = welcome["peer"]
        self.welcome = welcome
        return welcome

    def barrier(self) -> Tuple[List[Dict[str, Any]], bool]:
        """Sends a ping; returns the frames before its pong and whether the pong came (False: the connection
        ended first)."""
        self.pings += 1
        ident = f"vector-barrier-{self.pings}"
        frames = []
        try:
            self.send({"op": "ping", "id": ident})
        except (BrokenPipeError, ConnectionResetError):
            pass  # fluxd closed the connection already (bye, a fatal error): read what it sent before

        deadline = time.monotonic() + DEADLINE
        while True:
            frame = self.read(max(0.0, deadline - time.monotonic()))
            if frame is None:
                return frames, False
            if frame.get("op") == "pong" and frame.get("id") == ident:
                return frames, True
            frames.append(frame)

    def until(self, what: str, predicate: Callable[[Dict[str, Any]], bool]) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
        """Reads until a frame matches; returns it and the frames before it."""
        before = []
        deadline = time.monotonic() + DEADLINE
        while True:
            frame = self.read(max(0.0, deadline - time.monotonic()))
            if frame is None:
                pytest.fail(f"{self.label}: the connection ended while waiting for {what}; got {short(before)}")
            if predicate(frame):
                return frame, before
            before.append(frame)

    def close(self) -> None:
        self.peer.close()


class Run:
    """One example's test: its fluxd, its connections, the SPEC verdict and the checks."""

    def __init__(self, case: Case, start_fluxd, workers: bool = False):
        self.case = case
        self.msg = case.msg
        self.problems: List[str] = []
        self.conns: List[Conn] = []
        self.fluxd = start_fluxd(workers)
        self.verdict = spec_verdict(self.msg, case.role)
        self._check_model()

    def _check_model(self) -> None:
        """The SPEC model and the example's list agree (a gap in `spec_verdict` would make a test meaningless)."""
        same_op = self.msg.get("op") == self.case.file_op
        if self.case.kind == "valid":
            assert self.verdict is None, f"valid example, yet SPEC (as this test reads it) says {self.verdict}"
        elif same_op:
            assert self.verdict is not None, "invalid example that this test's reading of SPEC finds valid"

    def conn(self, label: str, role: Optional[str], session: Optional[str] = None) -> Conn:
        c = Conn(self.fluxd, label, self.problems)
        self.conns.append(c)
        if role:
            c.hello(role, session)
        return c

    def store(self, label: str, name: str, handles: List[str], state: Any = None, with_state: bool = False) -> Conn:
        """A store-role connection that registered `name`."""
        c = self.conn(label, "store")
        reg = {"op": "register", "store": name, "handles": handles}
        if with_state:
            reg["state"] = state
        c.send(reg)
        c.until(f"registered {name}", lambda f: f.get("op") == "registered" and f.get("store") == name)
        c.until(f"queries of {name}", lambda f: f.get("op") == "queries" and f.get("store") == name)
        return c

    def describe(self, frames: List[Dict[str, Any]]) -> str:
        return f"sent {short(self.msg)}\n  fluxd answered: {short(frames, 600) if frames else 'nothing'}"

    def expect_refused(self, frames: List[Dict[str, Any]], alive: bool) -> None:
        """The example got exactly the error SPEC gives, and the connection survived or closed as SPEC says."""
        v = self.verdict
        assert v is not None
        errors = [f for f in frames if f.get("op") == "error"]
        want = f"error {v.code} (ref {v.ref!r}, fatal {v.fatal}) because {v.why}"
        assert errors, f"expected {want}\n  {self.describe(frames)}"
        assert len(errors) == 1, f"expected one error, {want}\n  {self.describe(frames)}"
        e = errors[0]
        assert e.get("code") == v.code, f"expected {want}\n  {self.describe(frames)}"
        assert e.get("ref") == v.ref, f"expected ref {v.ref!r} (SPEC §8.9), {want}\n  {self.describe(frames)}"
        assert e.get("fatal") is v.fatal, f"expected fatal {v.fatal}, {want}\n  {self.describe(frames)}"
        if v.fatal:
            assert not alive, f"a fatal error must close the connection\n  {self.describe(frames)}"
        else:
            assert alive, f"the connection must survive {v.code} (SPEC §11)\n  {self.describe(frames)}"
        others = [f for f in frames if f.get("op") != "error"]
        assert not others, f"a refused message has no other reply\n  {self.describe(frames)}"

    def expect_no_error(self, frames: List[Dict[str, Any]]) -> None:
        errors = [f for f in frames if f.get("op") == "error"]
        assert not errors, f"a valid message must be handled (no error)\n  {self.describe(frames)}"

    def finish(self) -> None:
        for c in self.conns:
            c.close()
        assert not self.problems, "\n".join(self.problems)


def only(frames: List[Dict[str, Any]], op: str, describe: str) -> Dict[str, Any]:
    assert len(frames) >= 1 and frames[0].get("op") == op, f"expected {op}\n  {describe}"
    return frames[0]


# --------------------------------------------------------------------------------------------------------------
# Expected replies of valid requests (by the op the example names)


def check_reply(r: Run, frames: List[Dict[str, Any]], alive: bool, context: Dict[str, Any]) -> None:
    msg = r.msg
    op = msg["op"]
    d = r.describe(frames)
    r.expect_no_error(frames)
    if op == "bye":
        assert not alive and not frames, f"bye: fluxd closes the connection (§8.8)\n  {d}"
        return
    assert alive, f"the connection must stay open\n  {d}"
    echo = msg.get("id")
    if op == "pong":
        assert not frames, f"fluxd sends nothing in reply to a pong (§8.7)\n  {d}"
    elif op == "ping":
        pong = only(frames, "pong", d)
        assert pong.get("id") == echo, f"pong echoes the id\n  {d}"
        assert len(frames) == 1, d
    elif op == "info":
        info = only(frames, "info", d)
        assert info.get("id") == echo and isinstance(info.get("stores"), list), f"info echoes the id\n  {d}"
    elif op == "get":
        got = only(frames, "got", d)
        assert (got.get("id"), got.get("store"), got.get("state")) == (echo, msg["store"], context["state"]), \
            f"got: id echoed, the store, its retained state {context['state']!r}\n  {d}"
    elif op == "subscribe" and "state" in context:
        check_subscribed_16(msg, frames, context["state"], d)
    elif op == "subscribe":
        sub = only(frames, "subscribed", d)
        assert sub.get("store") == msg["store"] and sub.get("status") == "unknown", f"subscribed (unknown)\n  {d}"
        assert len(frames) == 1, f"nothing retained: nothing follows subscribed\n  {d}"
    elif op == "unsubscribe":
        unsub = only(frames, "unsubscribed", d)
        assert unsub.get("store") == msg["store"], f"unsubscribed\n  {d}"
        assert unsub.get("path") == msg.get("path") and ("path" in unsub) == ("path" in msg), \
            f"unsubscribed echoes the path of a path subscription, only then (§16.4)\n  {d}"
    elif op == "query":
        assert only(frames, "query-ok", d).get("id") == echo, f"query-ok echoes the id\n  {d}"
    elif op == "unquery":
        assert only(frames, "unquery-ok", d).get("id") == echo, f"unquery-ok echoes the id\n  {d}"
    elif op == "workers":
        reply = only(frames, "workers", d)
        assert reply.get("id") == echo and sorted(w["name"] for w in reply["workers"]) == worker_names(), \
            f"workers: id echoed, every configured worker\n  {d}"
    elif op == "reload":
        reply = only(frames, "reloaded", d)
        assert reply.get("id") == echo and reply.get("workers") == {"added": [], "removed": [], "changed": []} \
            and reply.get("settings") == [], f"reloaded: id echoed, nothing changed (the file is the same)\n  {d}"
    elif op == "forget":
        reply = next((f for f in frames if f.get("op") == "forgotten"), None)
        assert reply is not None and (reply.get("id"), reply.get("store"), reply.get("gaveUp")) == (echo, msg["store"], 0), \
            f"forgotten: id echoed, the store, nothing queued\n  {d}"
        assert [f.get("reason") for f in frames if f.get("op") == "store-down"] == ["forgotten"], \
            f"the subscriber (this connection) is told: store-down forgotten\n  {d}"
    elif op in ("restart-worker", "stop-worker"):
        reply = only(frames, "worker", d)
        assert reply.get("id") == echo and reply["worker"].get("name") == msg["name"], \
            f"worker: id echoed, the named worker\n  {d}"
    else:
        raise AssertionError(f"no reply check for {op}")


# --------------------------------------------------------------------------------------------------------------
# One runner per file


def run_hello(case: Case, start_fluxd) -> None:
    r = Run(case, start_fluxd)
    c = r.conn("first-frame", None)
    c.send(r.msg)
    first = c.read()
    frames = [first] if first is not None else []
    if r.verdict:
        after = c.read()
        r.expect_refused(frames, alive=after is not None)
        assert after is None, f"fatal: the connection is closed after the error\n  {r.describe(frames + [after])}"
    else:
        assert first is not None and first.get("op") == "welcome", f"expected welcome\n  {r.describe(frames)}"
        assert first.get("protocol") == 1 and isinstance(first.get("peer"), int), r.describe(frames)
        more, alive = c.barrier()
        assert alive and not more, f"the connection is ready\n  {r.describe(frames + more)}"
    r.finish()


def run_request(case: Case, start_fluxd) -> None:
    """Requests a client sends, answered by a reply (or by nothing: pong, bye)."""
    op = case.file_op
    r = Run(case, start_fluxd, workers=op in HOST_OPS)
    msg = r.msg
    context: Dict[str, Any] = {}
    c = r.conn("client", case.role)
    if op == "get" and is_store(msg.get("store")):
        context["state"] = {"vector": "get"}
        r.store("owner", msg["store"], [], context["state"], with_state=True)
    if op == "forget" and not r.verdict:
        # A store of that name that is down (its owner closed), seen going down through a subscription.
        owner = r.store("owner", msg["store"], [])
        c.send({"op": "subscribe", "store": msg["store"]})
        c.until("subscribed", lambda f: f.get("op") == "subscribed")
        owner.peer.close()
        c.until("store-down", lambda f: f.get("op") == "store-down" and f.get("reason") == "disconnected")
    if op == "unquery" and is_id(msg.get("id")):
        c.send({"op": "query", "id": msg["id"], "store": "vector-queries", "query": {}})
        c.until("query-ok", lambda f: f.get("op") == "query-ok")
    if op == "subscribe" and not r.verdict and any(k in msg for k in FIELDS_16["subscribe"]):
        context["state"] = PATCH_BASE_STATE
        r.store("owner", msg["store"], [], PATCH_BASE_STATE, with_state=True)
    if op == "unsubscribe" and is_store(msg.get("store")):
        sub = {"op": "subscribe", "store": msg["store"]}
        if is_pointer(msg.get("path")):
            sub["path"] = msg["path"]
        c.send(sub)
        c.until("subscribed", lambda f: f.get("op") == "subscribed")
    c.send(msg)
    frames, alive = c.barrier()
    if r.verdict:
        r.expect_refused(frames, alive)
    else:
        check_reply(r, frames, alive, context)
    r.finish()


def run_dispatch(case: Case, start_fluxd) -> None:
    r = Run(case, start_fluxd)
    msg = r.msg
    store = r.store("catch-all", "catch-all", ["*"])
    c = r.conn("dispatcher", "client")
    c.send(msg)
    frames, alive = c.barrier()
    if r.verdict:
        r.expect_refused(frames, alive)
        delivered, _ = store.barrier()
        actions = [f for f in delivered if f.get("op") == "action"]
        assert not actions, f"a refused dispatch reaches no store (R1, R6)\n  {r.describe(frames)}\n  the store got {short(actions)}"
    else:
        r.expect_no_error(frames)
        if msg.get("ack") is True:
            # (§8.3) accepted, with the seq, and nothing else until it settles.
            assert alive and [f.get("op") for f in frames] == ["accepted"], f"ack: one accepted\n  {r.describe(frames)}"
            assert frames[0]["id"] == msg["id"] and frames[0]["seq"] == 1, f"accepted names the id and seq 1\n  {r.describe(frames)}"
        else:
            assert alive and not frames, f"an accepted dispatch has no reply until it settles\n  {r.describe(frames)}"
        action, _ = store.until("the action", lambda f: f.get("op") == "action")
        d = f"{r.describe(frames)}\n  the store got {short(action)}"
        assert action["type"] == msg["type"] and action["payload"] == msg.get("payload"), f"type and payload forwarded\n  {d}"
        assert action["origin"] == c.peer_id and action["seq"] == 1 and action["store"] == "catch-all", d
        assert action.get("cause") == msg.get("cause"), f"cause forwarded as is, only if given (§8.3)\n  {d}"
        if msg.get("settle") is True:
            store.send({"op": "done", "store": "catch-all", "seq": action["seq"]})
            settled, _ = c.until("settled", lambda f: f.get("op") in ("settled", "error"))
            assert settled.get("op") == "settled" and settled["id"] == msg["id"], f"settled\n  {d}\n  then {short(settled)}"
            assert settled["results"] == [{"store": "catch-all", "status": "done", "version": 0}], short(settled)
    r.finish()


def run_register(case: Case, start_fluxd) -> None:
    r = Run(case, start_fluxd)
    msg = r.msg
    c = r.conn("store", "store")
    c.send(msg)
    frames, alive = c.barrier()
    if r.verdict:
        r.expect_refused(frames, alive)
    elif msg["store"] in msg.get("waitFor", []):
        # Valid by the schema; SPEC §8.2: a store waiting for itself is a cycle.
        r.verdict = Verdict("cycle", msg["store"], False, "waitFor names the store itself (§8.2)")
        r.expect_refused(frames, alive)
    else:
        r.expect_no_error(frames)
        d = r.describe(frames)
        ops = [f.get("op") for f in frames]
        with_state = "state" in msg
        assert ops == (["registered", "snapshot", "queries"] if with_state else ["registered", "queries"]), \
            f"registered, {'the snapshot of the initial state, ' if with_state else ''}queries (§8.2)\n  {d}"
        reg = frames[0]
        assert (reg["store"], reg["version"], reg["seq"], reg["resumed"]) == (msg["store"], 1 if with_state else 0, 0, False), \
            f"a first registration: version {1 if with_state else 0}, seq 0, not resumed\n  {d}"
        if with_state:
            snap = frames[1]
            assert (snap["store"], snap["version"], snap["seq"], snap["state"]) == (msg["store"], 1, 0, msg["state"]), d
        assert frames[-1] == {"op": "queries", "store": msg["store"], "queries": []}, d
    r.finish()


def owned_name(msg: Dict[str, Any], fallback: str) -> str:
    """The store a store example is about: its own name if valid, else `fallback` (so the connection owns one)."""
    return msg["store"] if is_store(msg.get("store")) else fallback


def run_unregister(case: Case, start_fluxd) -> None:
    r = Run(case, start_fluxd)
    msg = r.msg
    name = owned_name(msg, "todos")
    owner = r.store("owner", name, [])
    watcher = r.conn("subscriber", "client")
    watcher.send({"op": "subscribe", "store": name})
    watcher.until("subscribed", lambda f: f.get("op") == "subscribed")
    owner.send(msg)
    frames, alive = owner.barrier()
    seen, _ = watcher.barrier()
    if r.verdict:
        r.expect_refused(frames, alive)
        assert not [f for f in seen if f.get("op") == "store-down"], \
            f"a refused unregister takes no store down\n  {r.describe(frames)}\n  the subscriber got {short(seen)}"
    else:
        r.expect_no_error(frames)
        assert alive and not frames, f"unregister has no reply (§8.2)\n  {r.describe(frames)}"
        assert {"op": "store-down", "store": name, "reason": "unregistered"} in seen, \
            f"subscribers get store-down unregistered\n  {r.describe(frames)}\n  the subscriber got {short(seen)}"
    r.finish()


def run_answer(case: Case, start_fluxd) -> None:
    """done/reject: the store owns the example's store (or `todos`) and has been delivered the action whose seq
    the example answers (or seq 1), dispatched with settle by a client."""
    r = Run(case, start_fluxd)
    msg = r.msg
    name = owned_name(msg, "todos")
    seq = msg.get("seq")
    target = seq if type(seq) is int and 1 <= seq <= 60 else 1
    patched = msg["op"] == "done" and ("patch" in msg or "base" in msg)  # §16.2: a store with a retained state
    if patched:
        owner = r.store("owner", name, ["vector/target"], PATCH_BASE_STATE, with_state=True)
    else:
        owner = r.store("owner", name, ["vector/target"])
    if target > 1:
        r.store("filler", "vector-filler", ["vector/filler"])
    client = r.conn("dispatcher", "client")
    for _ in range(target - 1):
        client.send({"op": "dispatch", "type": "vector/filler"})
    client.send({"op": "dispatch", "id": "vector-action", "type": "vector/target", "settle": True, "payload": {}})
    action, _ = owner.until("the action", lambda f: f.get("op") == "action")
    assert action["seq"] == target and action["store"] == name, f"set-up: expected action {target}, got {action}"
    owner.send(msg)
    frames, alive = owner.barrier()
    outcome = patch_outcome(msg) if patched and not r.verdict else None
    if outcome is not None and outcome[0] == "failed":
        r.verdict = Verdict("patch-failed", name, True, outcome[1])
    if r.verdict:
        r.expect_refused(frames, alive)
        seen, _ = client.barrier()
        assert not [f for f in seen if f.get("op") == "settled"], \
            f"a refused answer settles nothing\n  {r.describe(frames)}\n  the dispatcher got {short(seen)}"
        if patched:
            expect_retained(r, client, name, 1, 0, PATCH_BASE_STATE, "nothing of a refused answer is kept (§16.2)")
    elif patched:
        r.expect_no_error(frames)
        assert alive and not frames, f"done has no reply\n  {r.describe(frames)}"
        settled, _ = client.until("settled", lambda f: f.get("op") in ("settled", "error"))
        d = f"{r.describe(frames)}\n  the dispatcher got {short(settled)}"
        version = 1 if outcome[0] == "none" else 2
        want = {"store": name, "status": "done", "version": version}
        assert settled.get("op") == "settled" and settled["results"] == [want], \
            f"settled with {want} ({outcome[1]}, §16.2)\n  {d}"
        expect_retained(r, client, name, version, target if version == 2 else 0, outcome[2], outcome[1])
    else:
        r.expect_no_error(frames)
        assert alive and not frames, f"{msg['op']} has no reply\n  {r.describe(frames)}"
        settled, _ = client.until("settled", lambda f: f.get("op") in ("settled", "error"))
        d = f"{r.describe(frames)}\n  the dispatcher got {short(settled)}"
        assert settled.get("op") == "settled" and settled["seq"] == target, d
        if msg["op"] == "done":
            want = {"store": name, "status": "done", "version": 1 if "state" in msg else 0}
        else:
            want = {"store": name, "status": "rejected", "error": msg["error"]}
        assert settled["results"] == [want], f"settled with {want}\n  {d}"
    r.finish()


def run_state(case: Case, start_fluxd) -> None:
    r = Run(case, start_fluxd)
    msg = r.msg
    name = owned_name(msg, "comments")
    owner = r.store("owner", name, [])
    owner.send(msg)
    frames, alive = owner.barrier()
    owner.send({"op": "get", "id": "vector-get", "store": name})
    got, _ = owner.until("got", lambda f: f.get("id") == "vector-get" or f.get("ref") == "vector-get")
    if r.verdict:
        r.expect_refused(frames, alive)
        assert got.get("code") == "unknown-store", \
            f"a refused state makes no snapshot\n  {r.describe(frames)}\n  then get: {short(got)}"
    else:
        r.expect_no_error(frames)
        assert alive and not frames, f"state has no reply (§8.4)\n  {r.describe(frames)}"
        assert got.get("op") == "got" and (got["version"], got["seq"], got["state"]) == (1, 0, msg["state"]), \
            f"the state is retained as version 1\n  {r.describe(frames)}\n  then get: {short(got)}"
    r.finish()


# --------------------------------------------------------------------------------------------------------------
# §8.12: recover, history, state-at (since fluxd 0.3.0). A fluxd that does not speak §8.12 yet (its welcome has no
# `epoch` or `durability`, §8.12) cannot pass these; their tests are then xfailed (NOT_YET), and run for real as soon
# as fluxd announces them.

_SPEAKS_8_12: Dict[str, bool] = {}


def fluxd_speaks_8_12() -> bool:
    """Whether the fluxd under test announces §8.12's welcome fields (checked once, on a fluxd of its own)."""
    if "answer" not in _SPEAKS_8_12:
        fluxd = Fluxd(run.fluxd_path(), [])
        try:
            c = Conn(fluxd, "probe", [])
            welcome = c.hello("client")
            c.close()
            _SPEAKS_8_12["answer"] = "epoch" in welcome or "durability" in welcome
        finally:
            fluxd.stop()
    return _SPEAKS_8_12["answer"]


def about_8_12(case: Case) -> bool:
    """Examples whose answer needs §8.12: the requests of §8.12, and hellos with a `session`."""
    return case.file_op in RECOVERY_OPS or (case.file_op == "hello" and "session" in case.msg)


def until_8_12(test: Callable[[], None]) -> None:
    """Runs `test`; a failure is an xfail (NOT_YET) while fluxd does not speak §8.12, a failure otherwise."""
    try:
        test()
    except (Exception, pytest.fail.Exception):
        if not fluxd_speaks_8_12():
            pytest.xfail(NOT_YET)
        raise


def durability(c: Conn, d: str) -> str:
    """`welcome.durability` of the connection (§8.12, §15): ephemeral, or a durable fluxd's mode."""
    mode = c.welcome.get("durability")
    assert mode in ("always", "batch", "none", "ephemeral"), \
        f"welcome.durability is {mode!r}: a fluxd that answers §8.12's requests announces it (§8.12)\n  {d}"
    return mode


def expect_not_retained(r: Run, frames: List[Dict[str, Any]], alive: bool, why: str) -> None:
    r.verdict = Verdict("not-retained", spec_ref(r.msg), False, why)
    r.expect_refused(frames, alive)


DONE_CATCH_ALL = [{"store": "catch-all", "status": "done", "version": 0}]


def dispatch_settled(c: Conn, store: Conn, ident: str, type_: str, payload: Any, store_state: Any = None,
                     cause: Optional[int] = None) -> int:
    """Dispatches with settle from `c`, has `store` answer it (done, with `store_state` if given), waits for the
    settlement; returns the action's seq."""
    msg = {"op": "dispatch", "id": ident, "type": type_, "payload": payload, "settle": True}
    if cause is not None:
        msg["cause"] = cause
    c.send(msg)
    action, _ = store.until("the action", lambda f: f.get("op") == "action")
    done = {"op": "done", "store": action["store"], "seq": action["seq"]}
    if store_state is not None:
        done["state"] = store_state
    store.send(done)
    settled, _ = c.until("settled", lambda f: f.get("op") in ("settled", "error"))
    assert settled.get("op") == "settled" and settled.get("id") == ident, f"set-up: {ident} settled, got {short(settled)}"
    return action["seq"]


def run_recover(case: Case, start_fluxd) -> None:
    """recover (§8.12, §15.4), on a connection whose hello had a session. For a valid example, a first connection
    of the same session dispatched the example's first id (settled) and its second (accepted, left unanswered) and
    went away; the request must then find the first `settled`, the second `pending` (its `settled` then comes to
    this connection) and every other id `unknown`, one outcome per requested id, in request order."""
    r = Run(case, start_fluxd)
    msg = r.msg
    if r.verdict:
        c = r.conn("recoverer", case.role, SESSION)
        c.send(msg)
        frames, alive = c.barrier()
        r.expect_refused(frames, alive)
        return r.finish()
    ids = msg["ids"]
    distinct = list(dict.fromkeys(ids))
    store = r.store("catch-all", "catch-all", ["*"])
    first = r.conn("dispatcher", "client", SESSION)
    seqs: Dict[str, int] = {}
    if distinct:
        seqs[distinct[0]] = dispatch_settled(first, store, distinct[0], "vector/recover", {"n": 0})
    pending = None
    if len(distinct) > 1:
        first.send({"op": "dispatch", "id": distinct[1], "type": "vector/recover", "payload": {"n": 1}, "settle": True})
        pending, _ = store.until("the pending action", lambda f: f.get("op") == "action")
        seqs[distinct[1]] = pending["seq"]
    first.close()
    c = r.conn("recoverer", case.role, SESSION)
    c.send(msg)
    frames, alive = c.barrier()
    d = r.describe(frames)
    r.expect_no_error(frames)
    assert alive, f"the connection must stay open\n  {d}"
    reply = only(frames, "recovered", d)
    assert len(frames) == 1, f"one reply\n  {d}"
    assert reply.get("id") == msg.get("id") and ("id" in reply) == ("id" in msg), f"recovered echoes the id, if any\n  {d}"
    outcomes = reply.get("outcomes")
    assert isinstance(outcomes, list) and len(outcomes) == len(ids), f"one outcome per requested id\n  {d}"
    for ident, outcome in zip(ids, outcomes):
        if distinct and ident == distinct[0]:
            want = {"id": ident, "status": "settled", "seq": seqs[ident], "results": DONE_CATCH_ALL}
        elif len(distinct) > 1 and ident == distinct[1]:
            want = {"id": ident, "status": "pending", "seq": seqs[ident]}
        else:
            want = {"id": ident, "status": "unknown"}
        got = {k: outcome.get(k) for k in want}
        assert got == want, f"outcome of {short(ident, 40)}: expected {want}, got {short(outcome)} (§15.4)\n  {d}"
    if pending is not None:
        store.send({"op": "done", "store": "catch-all", "seq": pending["seq"]})
        settled, _ = c.until("settled", lambda f: f.get("op") in ("settled", "error"))
        assert (settled.get("op"), settled.get("id"), settled.get("seq"), settled.get("results")) == \
            ("settled", distinct[1], pending["seq"], DONE_CATCH_ALL), \
            f"a pending outcome's settled comes to the connection that recovered it (§15.4): got {short(settled)}"
    r.finish()


def run_history(case: Case, start_fluxd) -> None:
    """history (§8.12, §15.6). For a valid example, three actions were dispatched and settled first (the third
    caused by the first): an ephemeral fluxd answers `not-retained`; a durable one (on a fresh data directory, as
    every test here assumes a fresh fluxd) the page of them the example asks for."""
    r = Run(case, start_fluxd)
    msg = r.msg
    c = r.conn("reader", case.role)
    if r.verdict:
        c.send(msg)
        frames, alive = c.barrier()
        r.expect_refused(frames, alive)
        return r.finish()
    store = r.store("catch-all", "catch-all", ["*"])
    t0 = int(time.time() * 1000)
    seqs: List[int] = []
    for n in range(3):
        seqs.append(dispatch_settled(c, store, f"vector-h{n}", f"vector/history-{n}", {"n": n},
                                     cause=seqs[0] if n == 2 else None))
    c.send(msg)
    frames, alive = c.barrier()
    t1 = int(time.time() * 1000)
    d = r.describe(frames)
    if durability(c, d) == "ephemeral":
        expect_not_retained(r, frames, alive, "an ephemeral fluxd keeps no history (§8.12)")
        return r.finish()
    r.expect_no_error(frames)
    assert alive, f"the connection must stay open\n  {d}"
    reply = only(frames, "history", d)
    assert len(frames) == 1, f"one reply\n  {d}"
    assert reply.get("id") == msg.get("id") and ("id" in reply) == ("id" in msg), f"history echoes the id, if any\n  {d}"
    assert (reply.get("first"), reply.get("last")) == (seqs[0], seqs[-1]), \
        f"first and last: the oldest retained and the newest accepted seq, {seqs[0]} and {seqs[-1]}\n  {d}"
    want = [s for s in seqs if s >= msg.get("from", seqs[0])][: msg.get("limit", 100)]
    entries = reply.get("entries")
    assert [e.get("seq") for e in entries] == want, f"entries: seqs {want}, from {msg.get('from')}, limit {msg.get('limit')}\n  {d}"
    for entry in entries:
        n = seqs.index(entry["seq"])
        expected = {"type": f"vector/history-{n}", "origin": c.peer_id, "payload": {"n": n}, "targets": ["catch-all"],
                    "results": DONE_CATCH_ALL}
        assert {k: entry.get(k) for k in expected} == expected, f"entry {entry['seq']}: expected {expected}\n  {d}"
        assert entry.get("cause") == (seqs[0] if n == 2 else None), f"entry {entry['seq']}: cause only if any\n  {d}"
        assert isinstance(entry.get("time"), int) and t0 - 1000 <= entry["time"] <= t1 + 1000, \
            f"entry {entry['seq']}: time, ms since the Unix epoch when accepted\n  {d}"
    if want and want[-1] < seqs[-1]:
        assert reply.get("next") == want[-1] + 1, f"next: the seq to ask from for the following page\n  {d}"
    else:
        assert "next" not in reply, f"no next when the entries reached last\n  {d}"
    r.finish()


def run_state_at(case: Case, start_fluxd) -> None:
    """state-at (§8.12). For a valid example, the example's store registered with an initial state (version 1,
    seq 0) and then answered two actions with new states (versions 2 and 3): an ephemeral fluxd answers
    `not-retained`; a durable one the version asked for (or the newest whose seq is at most the one asked for),
    and `not-retained` for a version the store never had."""
    r = Run(case, start_fluxd)
    msg = r.msg
    c = r.conn("reader", case.role)
    if r.verdict:
        c.send(msg)
        frames, alive = c.barrier()
        r.expect_refused(frames, alive)
        return r.finish()
    name = msg["store"]
    owner = r.store("owner", name, ["vector/state-at"], {"n": 0}, with_state=True)
    versions = [(1, 0, {"n": 0})]
    for n in (1, 2):
        seq = dispatch_settled(c, owner, f"vector-s{n}", "vector/state-at", None, store_state={"n": n})
        versions.append((n + 1, seq, {"n": n}))
    c.send(msg)
    frames, alive = c.barrier()
    d = r.describe(frames)
    if durability(c, d) == "ephemeral":
        expect_not_retained(r, frames, alive, "an ephemeral fluxd keeps no history (§8.12)")
        return r.finish()
    if "version" in msg:
        match = [v for v in versions if v[0] == msg["version"]]
    else:
        match = [v for v in versions if v[1] <= msg["seq"]][-1:]
    if not match:
        expect_not_retained(r, frames, alive, "the store never had that version (§8.12)")
        return r.finish()
    version, seq, state = match[0]
    r.expect_no_error(frames)
    assert alive, f"the connection must stay open\n  {d}"
    reply = only(frames, "state-at", d)
    assert len(frames) == 1, f"one reply\n  {d}"
    assert reply.get("id") == msg.get("id") and ("id" in reply) == ("id" in msg), f"state-at echoes the id, if any\n  {d}"
    assert (reply.get("store"), reply.get("version"), reply.get("seq"), reply.get("state")) == (name, version, seq, state), \
        f"state-at: {name} version {version} (seq {seq}) with state {state}\n  {d}"
    r.finish()


RUNNERS = {
    "hello": run_hello, "dispatch": run_dispatch, "register": run_register, "unregister": run_unregister,
    "done": run_answer, "reject": run_answer, "state": run_state,
    "recover": run_recover, "history": run_history, "state-at": run_state_at,
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_example(case: Case, start_fluxd) -> None:
    runner = RUNNERS.get(case.file_op, run_request)
    if about_8_12(case):
        until_8_12(lambda: runner(case, start_fluxd))
    elif about_16(case):
        until_16(lambda: runner(case, start_fluxd))
    else:
        runner(case, start_fluxd)


# --------------------------------------------------------------------------------------------------------------
# fluxd's own registered reply (SPEC §8.2)


@pytest.mark.parametrize("initial_state", [False, True], ids=["without-state", "with-state"])
def test_registered_again_is_resumed(initial_state: bool, start_fluxd) -> None:
    """`registered.resumed` is true when the name was registered before in this run (§8.2), whether or not the
    store ever had a snapshot; `version` and `seq` are the retained ones."""
    fluxd = start_fluxd()
    problems: List[str] = []
    c = Conn(fluxd, "store", problems)
    c.hello("store")
    first = {"op": "register", "store": "again", "handles": []}
    if initial_state:
        first["state"] = {"n": 1}
    c.send(first)
    reg, _ = c.until("registered", lambda f: f.get("op") == "registered")
    assert (reg["version"], reg["seq"], reg["resumed"]) == (1 if initial_state else 0, 0, False), reg
    c.send({"op": "unregister", "store": "again"})
    c.send({"op": "register", "store": "again", "handles": []})
    again, before = c.until("registered", lambda f: f.get("op") == "registered")
    assert not [f for f in before if f.get("op") == "error"], before
    assert (again["version"], again["seq"], again["resumed"]) == (1 if initial_state else 0, 0, True), \
        f"registering a name registered before in this run: resumed true (SPEC §8.2); fluxd sent {again}"
    c.close()
    assert not problems, "\n".join(problems)


def test_every_peer_sent_schema_has_examples() -> None:
    """Each schema of a message peers send has examples here, valid and invalid."""
    stems = {os.path.basename(p)[: -len(".schema.json")] for p in glob.glob(os.path.join(SCHEMAS, "*.schema.json"))}
    sent = {s for s in stems if not s.endswith(".d2c")}
    have = {c.stem for c in CASES}
    assert sent <= have, sorted(sent - have)
    for stem in sent:
        kinds = {c.kind for c in CASES if c.stem == stem}
        assert {"valid", "invalid"} <= kinds, (stem, kinds)


# --------------------------------------------------------------------------------------------------------------
# §8.12: who may recover what


def recover_refused(start_fluxd, role: str, session: Optional[str], code: str) -> None:
    fluxd = start_fluxd()
    problems: List[str] = []
    c = Conn(fluxd, role, problems)
    c.hello(role, session)
    c.send({"op": "recover", "id": "vector-recover", "ids": ["c-1"]})
    frames, alive = c.barrier()
    frames = [f for f in frames if f.get("op") != "event"]  # a monitor also sees the error as an event (§8.10)
    assert alive and [(f.get("op"), f.get("code"), f.get("ref"), f.get("fatal")) for f in frames] == \
        [("error", code, "vector-recover", False)], f"expected error {code} (ref the request's id), got {short(frames)}"
    c.close()
    assert not problems, "\n".join(problems)


def test_recover_needs_a_session(start_fluxd) -> None:
    """`recover` on a connection whose hello had no `session` is `bad-message` (§8.12)."""
    until_8_12(lambda: recover_refused(start_fluxd, "client", None, "bad-message"))


def test_recover_is_forbidden_to_monitors(start_fluxd) -> None:
    """A monitor may not send `recover` (§7, §8.12), session or not."""
    until_8_12(lambda: recover_refused(start_fluxd, "monitor", SESSION, "forbidden"))


def test_recover_sees_only_its_own_session(start_fluxd) -> None:
    """Outcomes are remembered per (uid, session, id) (§15.4): another session of the same uid finds the id
    `unknown`, a later connection of the same session finds it `settled`."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        store = Conn(fluxd, "store", problems)
        store.hello("store")
        store.send({"op": "register", "store": "catch-all", "handles": ["*"]})
        store.until("queries", lambda f: f.get("op") == "queries")
        a = Conn(fluxd, "session-a", problems)
        a.hello("client", "vector-a")
        seq = dispatch_settled(a, store, "c-1", "vector/recover", None)
        a.close()
        for session, want in (("vector-b", {"id": "c-1", "status": "unknown"}),
                              ("vector-a", {"id": "c-1", "status": "settled", "seq": seq, "results": DONE_CATCH_ALL})):
            c = Conn(fluxd, session, problems)
            c.hello("client", session)
            c.send({"op": "recover", "ids": ["c-1"]})
            reply, before = c.until("recovered", lambda f: f.get("op") in ("recovered", "error"))
            outcomes = reply.get("outcomes") or [{}]
            assert reply.get("op") == "recovered" and {k: outcomes[0].get(k) for k in want} == want, \
                f"session {session}: expected {want}, got {short(reply)}"
            c.close()
        store.close()
        assert not problems, "\n".join(problems)
    until_8_12(check)


@pytest.mark.parametrize("op", ["history", "state-at"])
def test_monitors_may_read_history(op: str, start_fluxd) -> None:
    """A monitor may send `history` and `state-at` (§8.12: any role): answered, or `not-retained`, never
    `forbidden`."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        c = Conn(fluxd, "monitor", problems)
        c.hello("monitor")
        msg = {"op": op, "id": "vector-read"} if op == "history" else \
            {"op": op, "id": "vector-read", "store": "never-registered", "version": 1}
        c.send(msg)
        frames, alive = c.barrier()
        frames = [f for f in frames if f.get("op") != "event"]  # its own error, as a monitor event (§8.10)
        d = f"sent {short(msg)}, got {short(frames)}"
        durable = durability(c, d) != "ephemeral"
        want = [("history", None)] if durable and op == "history" else [("error", "not-retained")]
        assert alive and [(f.get("op"), f.get("code")) for f in frames] == want, f"expected {want}\n  {d}"
        c.close()
        assert not problems, "\n".join(problems)
    until_8_12(check)


# --------------------------------------------------------------------------------------------------------------
# §16: patches, delta and path subscriptions (since fluxd 0.4.0). A fluxd that does not speak §16 yet (no
# `deltaHistory` in its welcome.limits, §8.1) cannot pass these; their tests are then xfailed (NOT_YET_16).

# The state the stores of the §16 examples register with (version 1, seq 0); the examples' patches are written
# against it.
PATCH_BASE_STATE = {"todos": [{"id": 1, "title": "milk", "done": False}], "count": 1, "a/b": {"~": 0}}
# The fields §16 adds to messages peers send.
FIELDS_16 = {"done": ("patch", "base"), "subscribe": ("deltas", "from", "path"), "unsubscribe": ("path",)}

_SPEAKS_16: Dict[str, bool] = {}


def fluxd_speaks_16() -> bool:
    """Whether the fluxd under test announces §16's limit (checked once, on a fluxd of its own)."""
    if "answer" not in _SPEAKS_16:
        fluxd = Fluxd(run.fluxd_path(), [])
        try:
            c = Conn(fluxd, "probe", [])
            welcome = c.hello("client")
            c.close()
            _SPEAKS_16["answer"] = "deltaHistory" in welcome.get("limits", {})
        finally:
            fluxd.stop()
    return _SPEAKS_16["answer"]


def about_16(case: Case) -> bool:
    """Examples whose answer needs §16: `patch`, and messages with a field §16 adds."""
    return case.file_op == "patch" or any(k in case.msg for k in FIELDS_16.get(case.file_op, ()))


def until_16(test: Callable[[], None]) -> None:
    """Runs `test`; a failure is an xfail (NOT_YET_16) while fluxd does not speak §16, a failure otherwise."""
    try:
        test()
    except (Exception, pytest.fail.Exception):
        if not fluxd_speaks_16():
            pytest.xfail(NOT_YET_16)
        raise


def patch_outcome(msg: Dict[str, Any], retained: int = 1, state: Any = None) -> Tuple[str, str, Any]:
    """What SPEC §16.2 makes of a valid `patch`, or `done` with a patch, sent for a store whose retained version
    is `retained` with `state` (default PATCH_BASE_STATE): ("failed", why, None), ("none", why, the state) for an
    empty patch, or ("applied", why, the new state)."""
    state = PATCH_BASE_STATE if state is None else state
    if "base" in msg and msg["base"] != retained:
        return "failed", f"base {msg['base']} is not the retained version {retained}", None
    if "state" in msg:
        return "applied", "state and patch: the state is the new one, the patch is not applied", msg["state"]
    patch = msg.get("patch", [])
    try:
        result = reference_patch.apply_patch(state, patch)
    except reference_patch.PatchError as e:
        return "failed", f"the patch does not apply ({e.category}: {e})", None
    if not patch:
        return "none", "an empty patch makes no version", state
    return "applied", "a non-empty patch that applies makes the next version", result


def expect_retained(r: Run, c: Conn, name: str, version: int, seq: int, state: Any, why: str) -> None:
    """`get` on `c` answers the store's retained version, seq and state (JSON equality)."""
    c.send({"op": "get", "id": "vector-get", "store": name})
    got, _ = c.until("got", lambda f: f.get("id") == "vector-get" or f.get("ref") == "vector-get")
    assert got.get("op") == "got" and (got.get("version"), got.get("seq")) == (version, seq) \
        and reference_patch.json_equal(got.get("state"), state), \
        f"retained: version {version}, seq {seq}, state {short(state)} ({why})\n  sent {short(r.msg)}\n  then get: {short(got)}"


def expected_subtree(name: str, path: str, version: int, seq: int, state: Any) -> Dict[str, Any]:
    try:
        return {"op": "subtree", "store": name, "path": path, "version": version, "seq": seq, "exists": True,
                "value": reference_patch.evaluate(state, path)}
    except reference_patch.PatchError:
        return {"op": "subtree", "store": name, "path": path, "version": version, "seq": seq, "exists": False}


def check_subscribed_16(msg: Dict[str, Any], frames: List[Dict[str, Any]], state: Any, d: str) -> None:
    """A subscribe with §16's fields to a store whose retained version is 1: `subscribed` (echoing `deltas: true`
    and `path`), then the subtree at `path`, nothing (`from` 1), or the retained snapshot (§16.3, §16.4)."""
    name = msg["store"]
    sub = only(frames, "subscribed", d)
    assert (sub.get("store"), sub.get("status"), sub.get("version")) == (name, "up", 1), \
        f"subscribed: {name}, up, version 1\n  {d}"
    if msg.get("deltas") is True:
        assert sub.get("deltas") is True, f"subscribed echoes deltas: true for a delta subscription (§16.3)\n  {d}"
    else:
        assert sub.get("deltas") in (None, False), f"deltas: true only for a delta subscription (§16.3)\n  {d}"
    assert sub.get("path") == msg.get("path") and ("path" in sub) == ("path" in msg), \
        f"subscribed echoes the path of a path subscription, only then (§16.3)\n  {d}"
    rest = frames[1:]
    if "path" in msg:
        want = [expected_subtree(name, msg["path"], 1, 0, state)]
        got = [{k: f.get(k) for k in want[0]} | ({"value": f["value"]} if "value" in f else {}) for f in rest]
        assert got == want and ("value" in rest[0]) == want[0]["exists"], \
            f"then the subtree of the retained version, {short(want)} (§16.4)\n  {d}"
    elif msg.get("from") == 1:
        assert not rest, f"from the retained version: nothing follows subscribed (§16.3)\n  {d}"
    else:
        assert len(rest) == 1 and rest[0].get("op") == "snapshot" and \
            (rest[0].get("store"), rest[0].get("version"), rest[0].get("seq")) == (name, 1, 0) and \
            reference_patch.json_equal(rest[0].get("state"), state), \
            f"then the retained snapshot, version 1 (§8.5, §16.3)\n  {d}"


def run_patch(case: Case, start_fluxd) -> None:
    """patch (§16.2): the store owns the example's store (or `todos`), registered with PATCH_BASE_STATE (version
    1), and a delta subscriber watches it. A valid example's patch makes version 2 (the subscriber gets it as a
    `delta`, `get` the patched state), no version when empty, or `patch-failed` (fatal; the subscriber sees the
    store go down) when it does not apply; a refused one changes nothing."""
    r = Run(case, start_fluxd)
    msg = r.msg
    name = owned_name(msg, "todos")
    owner = r.store("owner", name, [], PATCH_BASE_STATE, with_state=True)
    watcher = r.conn("delta-subscriber", "client")
    watcher.send({"op": "subscribe", "store": name, "deltas": True})
    watcher.until("the retained snapshot", lambda f: f.get("op") == "snapshot")
    owner.send(msg)
    frames, alive = owner.barrier()
    outcome = patch_outcome(msg) if not r.verdict else None
    if outcome is not None and outcome[0] == "failed":
        r.verdict = Verdict("patch-failed", name, True, outcome[1])
    seen, _ = watcher.barrier()
    if r.verdict:
        r.expect_refused(frames, alive)
        changes = [f for f in seen if f.get("op") in ("delta", "snapshot")]
        assert not changes, f"a refused patch makes no version\n  {r.describe(frames)}\n  the subscriber got {short(seen)}"
        if r.verdict.fatal:
            assert {"op": "store-down", "store": name, "reason": "disconnected"} in seen, \
                f"patch-failed closes the store's connection: its store goes down (§16.2, §10)\n  the subscriber got {short(seen)}"
        expect_retained(r, watcher, name, 1, 0, PATCH_BASE_STATE, "nothing of a refused patch is kept (§16.2)")
        return r.finish()
    r.expect_no_error(frames)
    assert alive and not frames, f"patch has no reply (§16.2)\n  {r.describe(frames)}"
    d = f"{r.describe(frames)}\n  the delta subscriber got {short(seen)}"
    if outcome[0] == "none":
        assert not seen, f"{outcome[1]} (§16.2)\n  {d}"
        expect_retained(r, watcher, name, 1, 0, PATCH_BASE_STATE, outcome[1])
    else:
        want = {"op": "delta", "store": name, "from": 1, "version": 2, "seq": 0, "patch": msg["patch"]}
        assert [{k: f.get(k) for k in want} for f in seen] == [want], \
            f"the delta subscriber gets the patch as written, from 1 to 2, seq 0 (§16.2, §16.3)\n  {d}"
        expect_retained(r, watcher, name, 2, 0, outcome[2], outcome[1])
    r.finish()


RUNNERS["patch"] = run_patch


def test_patch_is_forbidden_to_clients(start_fluxd) -> None:
    """A client may not send `patch` (§7): `forbidden`, ref the store, and the connection survives."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        c = Conn(fluxd, "client", problems)
        c.hello("client")
        c.send({"op": "patch", "store": "todos", "patch": []})
        frames, alive = c.barrier()
        assert alive and [(f.get("op"), f.get("code"), f.get("ref"), f.get("fatal")) for f in frames] == \
            [("error", "forbidden", "todos", False)], f"expected error forbidden, got {short(frames)}"
        c.close()
        assert not problems, "\n".join(problems)
    until_16(check)


def test_patch_for_a_store_not_owned_is_forbidden(start_fluxd) -> None:
    """A store-role connection patching a store another connection owns: `forbidden` (§7), survives, and the
    store's state is unchanged."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        owner = Conn(fluxd, "owner", problems)
        owner.hello("store")
        owner.send({"op": "register", "store": "todos", "handles": [], "state": PATCH_BASE_STATE})
        owner.until("queries", lambda f: f.get("op") == "queries")
        other = Conn(fluxd, "other", problems)
        other.hello("store")
        other.send({"op": "patch", "store": "todos", "patch": [{"op": "replace", "path": "/count", "value": 2}], "base": 1})
        frames, alive = other.barrier()
        assert alive and [(f.get("op"), f.get("code"), f.get("ref"), f.get("fatal")) for f in frames] == \
            [("error", "forbidden", "todos", False)], f"expected error forbidden, got {short(frames)}"
        other.send({"op": "get", "id": "g", "store": "todos"})
        got, _ = other.until("got", lambda f: f.get("id") == "g" or f.get("ref") == "g")
        assert (got.get("version"), got.get("state")) == (1, PATCH_BASE_STATE), f"unchanged, got {short(got)}"
        owner.close()
        other.close()
        assert not problems, "\n".join(problems)
    until_16(check)


@pytest.mark.parametrize("op", ["patch", "done"])
def test_patch_without_a_retained_state_fails(op: str, start_fluxd) -> None:
    """A patch for a store with no retained state is `patch-failed` (§16.2): fatal, ref the store, the connection
    closed. For `done`, the action stays unanswered and is delivered again (`redelivered`) to the store's next
    owner, whose answer settles it."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        store = Conn(fluxd, "store", problems)
        store.hello("store")
        store.send({"op": "register", "store": "empty", "handles": ["vector/empty"]})
        store.until("queries", lambda f: f.get("op") == "queries")
        patch = [{"op": "add", "path": "/n", "value": 1}]
        client = Conn(fluxd, "client", problems)
        client.hello("client")
        seq = None
        if op == "done":
            client.send({"op": "dispatch", "id": "d-1", "type": "vector/empty", "settle": True})
            action, _ = store.until("the action", lambda f: f.get("op") == "action")
            seq = action["seq"]
            store.send({"op": "done", "store": "empty", "seq": seq, "patch": patch})
        else:
            store.send({"op": "patch", "store": "empty", "patch": patch})
        frames, alive = store.barrier()
        assert not alive and [(f.get("op"), f.get("code"), f.get("ref"), f.get("fatal")) for f in frames] == \
            [("error", "patch-failed", "empty", True)], \
            f"expected error patch-failed (ref empty, fatal) and the connection closed, got {short(frames)} (alive: {alive})"
        client.send({"op": "get", "id": "g", "store": "empty"})
        got, _ = client.until("got", lambda f: f.get("id") == "g" or f.get("ref") == "g")
        assert got.get("code") == "unknown-store", f"nothing of the patch is kept: get answered {short(got)}"
        if op == "done":
            again = Conn(fluxd, "store-again", problems)
            again.hello("store")
            again.send({"op": "register", "store": "empty", "handles": ["vector/empty"]})
            action, before = again.until("the action again", lambda f: f.get("op") == "action")
            assert [f.get("op") for f in before] == ["registered", "queries"], short(before)
            assert (action.get("seq"), action.get("redelivered")) == (seq, True), \
                f"the action answered by a failed patch is delivered again, redelivered (§16.2): {short(action)}"
            again.send({"op": "done", "store": "empty", "seq": seq, "state": {"n": 1}})
            settled, _ = client.until("settled", lambda f: f.get("op") == "settled")
            assert settled.get("results") == [{"store": "empty", "status": "done", "version": 1}], short(settled)
            again.close()
        client.close()
        store.close()
        assert not problems, "\n".join(problems)
    until_16(check)


def test_monitors_see_patches_as_delta_events(start_fluxd) -> None:
    """A change that came as a patch only is a monitor `event` of kind `delta` (`store`, `from`, `version`, `seq`,
    `patch` as written) instead of `snapshot`; a change with a state (with or without a patch) stays a `snapshot`
    event (§8.10, §16.5)."""
    def check() -> None:
        fluxd = start_fluxd()
        problems: List[str] = []
        monitor = Conn(fluxd, "monitor", problems)
        monitor.hello("monitor")
        store = Conn(fluxd, "store", problems)
        store.hello("store")
        store.send({"op": "register", "store": "todos", "handles": ["vector/*"], "state": PATCH_BASE_STATE})
        store.until("queries", lambda f: f.get("op") == "queries")
        patch = [{"op": "replace", "path": "/count", "value": 2}]
        store.send({"op": "patch", "store": "todos", "patch": patch, "base": 1})
        store.barrier()
        client = Conn(fluxd, "client", problems)
        client.hello("client")
        both = reference_patch.apply_patch(PATCH_BASE_STATE, [{"op": "replace", "path": "/count", "value": 3}])
        seq = dispatch_settled(client, store, "d-1", "vector/both", None, store_state=both)
        kinds = ("snapshot", "delta")
        first, _ = monitor.until("the event of version 1", lambda f: f.get("op") == "event" and f.get("kind") in kinds)
        second, _ = monitor.until("the event of version 2", lambda f: f.get("op") == "event" and f.get("kind") in kinds)
        third, _ = monitor.until("the event of version 3", lambda f: f.get("op") == "event" and f.get("kind") in kinds)
        assert (first.get("kind"), first.get("version")) == ("snapshot", 1), short(first)
        want = {"kind": "delta", "store": "todos", "from": 1, "version": 2, "seq": 0, "patch": patch}
        assert {k: second.get(k) for k in want} == want and "state" not in second, \
            f"a patch-only change: event kind delta {want} (§16.5), got {short(second)}"
        want = {"kind": "snapshot", "store": "todos", "version": 3, "seq": seq, "state": both}
        assert {k: third.get(k) for k in want} == want, f"a change with a state: event kind snapshot, got {short(third)}"
        for c in (monitor, store, client):
            c.close()
        assert not problems, "\n".join(problems)
    until_16(check)
