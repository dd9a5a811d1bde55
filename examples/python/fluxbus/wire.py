"""FluxBus protocol 1 wire layer (SPEC.md §3): length-prefixed frames, the strict JSON/envelope check, and the
message types shared by the clients. No I/O here. (``FluxError`` and ``Disconnected`` live in
``fluxbus.errors`` and are re-exported here for older imports.)"""
from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .errors import WRONG_SERVER_UID, Disconnected  # noqa: F401 (re-exported for older imports)
from .errors import ActionRejectedError, FluxError, error_from_code, server_uid_error
from .number import dumps as _json_text
from .number import loads as _exact_loads
from .protocol import PROTOCOL_VERSION, ErrorCode, Op, ResultStatus
#: The largest frame body fluxd accepts by default; the real value is ``Welcome.limits["maxFrame"]``.
DEFAULT_MAX_FRAME = 1_048_576
MAX_DEPTH = 64
_NAME = re.compile(r"[A-Za-z0-9._:/-]+\Z")


#: Error codes callers commonly test for (``fluxbus.protocol.ErrorCode`` has them all).
LIMIT_EXCEEDED = ErrorCode.LIMIT_EXCEEDED  #: a per-connection limit (live queries, subscriptions, query bytes); not fatal
TOO_MANY_CONNECTIONS = ErrorCode.TOO_MANY_CONNECTIONS  #: refused at connect, before welcome (fatal)
UNRESPONSIVE = ErrorCode.UNRESPONSIVE  #: heartbeat pings unanswered, or a stalled store closed (fatal)
MEMORY_BUDGET = ErrorCode.MEMORY_BUDGET  #: no room in fluxd's memory budget (a request refused, or fatal: closed)


def default_socket_path(env: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """fluxd's socket, by the rule fluxd and every SDK share: ``$FLUXBUS_SOCKET`` if set and non-empty, else
    ``$XDG_RUNTIME_DIR/fluxbus/fluxd.sock`` if that is set and non-empty, else ``$TMPDIR/fluxbus-<uid>/fluxd.sock``
    with ``TMPDIR`` = ``/tmp`` when unset or empty. Trailing slashes of ``XDG_RUNTIME_DIR`` and ``TMPDIR`` are dropped
    (``/tmp/`` is ``/tmp``; ``/`` is the root directory).
    ``env`` (default ``os.environ``) and ``uid`` (default ``os.getuid()``) are injectable for tests
    (``protocol/vectors/socket-path.json``)."""
    env = os.environ if env is None else env
    if env.get("FLUXBUS_SOCKET"):
        return env["FLUXBUS_SOCKET"]
    if env.get("XDG_RUNTIME_DIR"):
        return env["XDG_RUNTIME_DIR"].rstrip("/") + "/fluxbus/fluxd.sock"
    tmpdir = (env.get("TMPDIR") or "/tmp").rstrip("/")
    return f"{tmpdir}/fluxbus-{os.getuid() if uid is None else uid}/fluxd.sock"


def expected_server_uid(expected: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                        euid: Optional[int] = None) -> Optional[int]:
    """The uid fluxd's listener must run as, or ``None`` for no check: ``expected`` if given, else
    ``$FLUXBUS_SERVER_UID`` if set and non-empty (a number), else 0 when this process runs as root (euid 0)."""
    if expected is not None:
        return int(expected)
    env = os.environ if env is None else env
    text = env.get("FLUXBUS_SERVER_UID")
    if text:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"FLUXBUS_SERVER_UID must be a uid (a number), not {text!r}") from None
        if value < 0:
            raise ValueError(f"FLUXBUS_SERVER_UID must be a uid (a number >= 0), not {text!r}")
        return value
    if (os.geteuid() if euid is None else euid) == 0:
        return 0
    return None


def check_server_uid(sock: Any, path: str, expected: Optional[int]) -> None:
    """Checks with ``SO_PEERCRED`` that the peer of the connected Unix socket ``sock`` runs as ``expected``
    (nothing to do when ``expected`` is ``None``). Raises :class:`~fluxbus.errors.WrongServerUIDError`."""
    if expected is None:
        return
    import socket as _socket
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    if uid != expected:
        raise server_uid_error(path, uid, expected)


def is_valid_store_name(name: str) -> bool:
    """SPEC §4.1: ``[A-Za-z0-9._:/-]+``, 1–128 bytes."""
    return isinstance(name, str) and 1 <= len(name) <= 128 and bool(_NAME.match(name))


def is_valid_action_type(name: str) -> bool:
    """SPEC §4.1: ``[A-Za-z0-9._:/-]+``, 1–256 bytes."""
    return isinstance(name, str) and 1 <= len(name) <= 256 and bool(_NAME.match(name))


def pattern_matches(pattern: str, action_type: str) -> bool:
    """SPEC §5: an exact type, or a prefix followed by one trailing ``*``."""
    if pattern.endswith("*"):
        return action_type.startswith(pattern[:-1])
    return pattern == action_type


def dumps(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no whitespace, UTF-8): what the clients send for payloads, states and
    queries, so equal values are byte-equal (queries are deduplicated and states compared byte for byte). A
    :class:`~fluxbus.number.JSONNumber` is written as its text (SPEC §16.1: numbers keep their exact value)."""
    return _json_text(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def loads(body: bytes) -> Any:
    """Decodes a frame body (rejects NaN/Infinity, which are not JSON). Numbers keep their exact value (SPEC
    §16.1): ints as ``int``, others as ``float`` when the float's ``repr`` has the text's value, else as a
    :class:`~fluxbus.number.JSONNumber` (``0.10000000000000001``, ``1e400``) that keeps the text."""
    return _exact_loads(body)


def encode_frame(body: bytes) -> bytes:
    """A frame: the 4-byte big-endian length, then the body."""
    return struct.pack(">I", len(body)) + body


def encode_message(fields: Dict[str, Any]) -> bytes:
    """A frame holding ``fields`` as one JSON object (``op`` first)."""
    ordered = {"op": fields["op"], **{k: v for k, v in fields.items() if k != "op"}}
    return encode_frame(_json_text(ordered, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8"))


# ---------------------------------------------------------------------------------------------------------------
# Frame decoder (SPEC §3.1, vectors/framing.json)

FrameEvent = Tuple[str, Union[bytes, int, None]]


class FrameDecoder:
    """Reassembles frames from a byte stream split or coalesced in any way.

    ``feed(data)`` returns the events completed so far: ``("frame", body)``, ``("empty", None)`` for a zero-length
    frame (``bad-frame``; decoding continues) and ``("too-large", length)`` as soon as a length above
    ``max_frame`` is read; after that the decoder produces nothing and keeps nothing (the stream is lost).
    """

    def __init__(self, max_frame: int = 0xFFFFFFFF):
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._failed = False

    @property
    def pending(self) -> int:
        """Bytes held that are not yet a complete frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> List[FrameEvent]:
        if self._failed:
            return []
        self._buffer += data
        events: List[FrameEvent] = []
        while len(self._buffer) >= 4:
            length = struct.unpack_from(">I", self._buffer)[0]
            if length > self.max_frame:
                self._failed = True
                self._buffer.clear()
                events.append(("too-large", length))
                break
            if len(self._buffer) < 4 + length:
                break
            if length == 0:
                events.append(("empty", None))
            else:
                events.append(("frame", bytes(self._buffer[4:4 + length])))
            del self._buffer[:4 + length]
        return events


# ---------------------------------------------------------------------------------------------------------------
# Strict JSON and envelope check (SPEC §3.2, vectors/envelope.json)

class EnvelopeError(ValueError):
    """The body is not valid protocol JSON (``code == "bad-json"``) or not an envelope (``"bad-message"``)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass
class Envelope:
    """A checked frame body: its top-level keys in order and the exact source text of each top-level value."""
    keys: List[str] = field(default_factory=list)
    raw: Dict[str, str] = field(default_factory=dict)


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WS = " \t\r\n"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Scanner:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def fail(self, what: str) -> EnvelopeError:
        return EnvelopeError("bad-json", f"{what} at offset {self.i}")

    def ws(self) -> None:
        s, i = self.s, self.i
        while i < len(s) and s[i] in _WS:
            i += 1
        self.i = i

    def value(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.fail("nesting deeper than 64")
        if self.i >= len(self.s):
            raise self.fail("unexpected end")
        c = self.s[self.i]
        if c == "{":
            self.obj(depth, None)
        elif c == "[":
            self.i += 1
            self.ws()
            if self.peek() == "]":
                self.i += 1
                return
            while True:
                self.ws()
                self.value(depth + 1)
                self.ws()
                c = self.take()
                if c == "]":
                    return
                if c != ",":
                    raise self.fail("expected , or ]")
        elif c == '"':
            self.string()
        elif c == "-" or "0" <= c <= "9":
            m = _NUMBER.match(self.s, self.i)
            if not m:
                raise self.fail("bad number")
            self.i = m.end()
            if self.i < len(self.s) and (self.s[self.i] in "0123456789.eE+-"):
                raise self.fail("bad number")
        else:
            for lit in ("true", "false", "null"):
                if self.s.startswith(lit, self.i):
                    self.i += len(lit)
                    return
            raise self.fail("unexpected character")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise self.fail("unexpected end")
        self.i += 1
        return c

    def obj(self, depth: int, top: Optional[List[Tuple[str, int, int]]]) -> None:
        self.i += 1  # {
        self.ws()
        if self.peek() == "}":
            self.i += 1
            return
        while True:
            self.ws()
            if self.peek() != '"':
                raise self.fail("expected a key")
            key = self.string()
            self.ws()
            if self.take() != ":":
                raise self.fail("expected :")
            self.ws()
            start = self.i
            self.value(depth + 1)
            if top is not None:
                top.append((key, start, self.i))
            self.ws()
            c = self.take()
            if c == "}":
                return
            if c != ",":
                raise self.fail("expected , or }")

    def string(self) -> str:
        self.i += 1  # opening quote
        out: List[str] = []
        s = self.s
        while True:
            if self.i >= len(s):
                raise self.fail("unterminated string")
            c = s[self.i]
            self.i += 1
            if c == '"':
                return "".join(out)
            if c < " ":
                raise self.fail("raw control character in string")
            if c != "\\":
                out.append(c)
                continue
            e = self.take()
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                continue
            if e != "u":
                raise self.fail("bad escape")
            code = self.hex4()
            if 0xDC00 <= code <= 0xDFFF:
                raise self.fail("unpaired low surrogate escape")
            if 0xD800 <= code <= 0xDBFF:
                if not s.startswith("\\u", self.i):
                    raise self.fail("unpaired high surrogate escape")
                self.i += 2
                low = self.hex4()
                if not 0xDC00 <= low <= 0xDFFF:
                    raise self.fail("high surrogate not followed by a low one")
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
            out.append(chr(code))

    def hex4(self) -> int:
        digits = self.s[self.i:self.i + 4]
        if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail("bad \\u escape")
        self.i += 4
        return int(digits, 16)


def check_envelope(body: bytes) -> Envelope:
    """Checks a frame body as fluxd does (SPEC §3.2): the whole body must be valid protocol JSON (``bad-json``),
    then a JSON object with no repeated top-level key (``bad-message``). Returns its keys and raw value texts."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise EnvelopeError("bad-json", "byte order mark")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EnvelopeError("bad-json", f"invalid UTF-8: {error}") from None
    scanner = _Scanner(text)
    scanner.ws()
    top: List[Tuple[str, int, int]] = []
    is_object = scanner.peek() == "{"
    if is_object:
        scanner.obj(1, top)
    else:
        scanner.value(1)
    scanner.ws()
    if scanner.i != len(text):
        raise scanner.fail("bytes after the value")
    if not is_object:
        raise EnvelopeError("bad-message", "the top-level value is not an object")
    envelope = Envelope()
    for key, start, end in top:
        if key in envelope.raw:
            raise EnvelopeError("bad-message", f"duplicate top-level key {key!r}")
        envelope.keys.append(key)
        envelope.raw[key] = text[start:end]
    return envelope


# ---------------------------------------------------------------------------------------------------------------
# Message types

@dataclass(frozen=True)
class Welcome:
    """fluxd's ``welcome`` (SPEC §8.1): this connection's peer id and the limits in force; since fluxd 0.3.0 also
    ``epoch`` (the history its seqs and versions belong to: the same across restarts of a durable fluxd, new for
    every run of an ephemeral one; ``None`` from an older fluxd) and ``durability`` (``always``, ``batch``,
    ``none`` or ``ephemeral``; ``None`` from an older fluxd), SPEC §8.12, §15.1."""
    peer: int
    server: str
    limits: Dict[str, int]
    protocol: int = PROTOCOL_VERSION
    epoch: Optional[str] = None
    durability: Optional[str] = None

    @classmethod
    def from_frame(cls, msg: Dict[str, Any]) -> "Welcome":
        epoch = msg.get("epoch")
        durability = msg.get("durability")
        return cls(msg["peer"], msg.get("server", ""), dict(msg.get("limits", {})), msg["protocol"],
                   epoch if isinstance(epoch, str) else None, durability if isinstance(durability, str) else None)


@dataclass(frozen=True)
class Snapshot:
    """A store's full ``state`` at ``version`` (≥1), made after the action ``seq`` (0 = before any)."""
    store: str
    version: int
    seq: int
    state: Any


@dataclass(frozen=True)
class Subtree:
    """A path subscription's value (SPEC §16.4 ``subtree``): the value at JSON Pointer ``path`` in the store's state
    at ``version`` (``exists`` false, ``value`` ``None``: the state has nothing there)."""
    store: str
    path: str
    version: int
    seq: int
    exists: bool
    value: Any = None

    @property
    def state(self) -> Any:
        """The value (the name :class:`Snapshot` uses, so code written for either reads ``.state``)."""
        return self.value


@dataclass(frozen=True)
class StoreResult:
    """One target store's result in a settlement: ``status`` is ``done`` (with ``version``), ``rejected`` or
    ``unavailable`` (with ``error``: the store's error object, or ``{"code":"store-unavailable",...}``)."""
    store: str
    status: str
    version: Optional[int] = None
    error: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.status == ResultStatus.DONE

    def exception(self, seq: Optional[int] = None) -> Optional[FluxError]:
        """The exception this result stands for (``None`` when ``done``): :class:`ActionRejectedError` for
        ``rejected`` (the store's code and message), the code's class for ``unavailable``
        (:class:`StoreUnavailableError`, :class:`ShuttingDownError`), with ``.store`` set."""
        if self.ok:
            return None
        error = self.error if isinstance(self.error, dict) else {}
        if self.status == ResultStatus.REJECTED:
            return ActionRejectedError(self.store, error, seq)
        code = error.get("code") if isinstance(error.get("code"), str) else ErrorCode.STORE_UNAVAILABLE
        message = error.get("message") if isinstance(error.get("message"), str) else ""
        exception = error_from_code(code, message or f"store {self.store!r} is unavailable")
        exception.store = self.store  # type: ignore[attr-defined]
        return exception


@dataclass(frozen=True)
class Settlement:
    """Every target store's result for one action (SPEC §8.3 ``settled``), sorted by store name.

    A settlement is returned whatever the stores answered; ``ok`` says whether all were ``done``, and
    :meth:`raise_for_status` turns the first result that is not into an exception."""
    id: str
    seq: int
    results: List[StoreResult]

    @property
    def ok(self) -> bool:
        """True when every target answered ``done``."""
        return all(r.ok for r in self.results)

    def raise_for_status(self) -> "Settlement":
        """Returns the settlement if every target answered ``done``; else raises the first other result's
        exception (:meth:`StoreResult.exception`): :class:`ActionRejectedError` (``code``/``message`` are the
        store's), :class:`StoreUnavailableError` or :class:`ShuttingDownError`."""
        for result in self.results:
            exception = result.exception(self.seq)
            if exception is not None:
                raise exception
        return self

    def __getitem__(self, store: str) -> StoreResult:
        for r in self.results:
            if r.store == store:
                return r
        raise KeyError(store)

    @classmethod
    def from_frame(cls, msg: Dict[str, Any]) -> "Settlement":
        return cls(msg["id"], msg["seq"], [StoreResult(r["store"], r["status"], r.get("version"), r.get("error"))
                                           for r in msg.get("results", [])])


@dataclass(frozen=True)
class SubscriptionEvent:
    """A non-snapshot event of a subscription: ``kind`` is ``subscribed`` (``status`` up/down/unknown),
    ``store-down`` (``reason``), ``store-up`` (``version``) or ``resubscribed`` (the client subscribed again
    after reconnecting: ``status`` and ``version`` of fluxd's ``subscribed``)."""
    kind: str
    store: str
    status: Optional[str] = None
    reason: Optional[str] = None
    version: Optional[int] = None


@dataclass(frozen=True)
class ActiveQuery:
    """One distinct active query of a store and how many live queries (over all connections) carry it."""
    query: Any
    count: int


def _query_key(query: Any) -> bytes:
    try:
        return dumps(query)
    except ValueError:  # a number too large for a float (1e400) decodes as inf
        return json.dumps(query, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class QuerySet:
    """A store's active queries, kept from fluxd's full ``queries`` message and the ``queries-changed`` deltas
    that follow it when the store registered with ``"queryDeltas": true``. Keyed by the query's canonical JSON
    text (:func:`dumps`); :attr:`active` lists them sorted by those bytes, as fluxd sorts ``queries``."""

    def __init__(self) -> None:
        self._by_key: Dict[bytes, ActiveQuery] = {}
        self._sorted: Optional[List[ActiveQuery]] = []

    def replace(self, entries: List[Dict[str, Any]]) -> None:
        """Takes a full ``queries`` list: it replaces whatever was known."""
        self._by_key = {}
        self._apply(entries)

    def apply(self, changes: List[Dict[str, Any]]) -> None:
        """Takes a ``queries-changed`` list: each entry's ``count`` is the query's new count, 0 = withdrawn."""
        self._apply(changes)

    def _apply(self, entries: List[Dict[str, Any]]) -> None:
        for entry in entries:
            key = _query_key(entry.get("query"))
            count = entry.get("count", 0)
            if isinstance(count, int) and count > 0:
                self._by_key[key] = ActiveQuery(entry.get("query"), count)
            else:
                self._by_key.pop(key, None)
        self._sorted = None

    @property
    def active(self) -> List[ActiveQuery]:
        """The active queries (a new list each time), sorted by canonical bytes."""
        if self._sorted is None:
            self._sorted = [self._by_key[k] for k in sorted(self._by_key)]
        return list(self._sorted)

    def __len__(self) -> int:
        return len(self._by_key)


_REPLIES = frozenset({Op.PONG, Op.INFO, Op.GOT, Op.QUERY_OK, Op.UNQUERY_OK, Op.SETTLED, Op.RECOVERED, Op.ACCEPTED})
_SUBSCRIPTION = frozenset({Op.SNAPSHOT, Op.DELTA, Op.SUBTREE, Op.STORE_DOWN, Op.STORE_UP})
_STORE = frozenset({Op.REGISTERED, Op.QUERIES, Op.QUERIES_CHANGED, Op.ACTION})


def subscription_key(store: Any, path: Optional[str] = None) -> str:
    """How a client names a subscription: the store, or ``store|path`` for a path subscription (SPEC §16.4; ``|``
    cannot occur in a store name)."""
    return f"{store}|{path}" if isinstance(path, str) else f"{store}"


def subscription_reply_key(op: str, store: Any, path: Optional[str] = None) -> str:
    """The reply key of ``subscribed``/``unsubscribed`` for a store (and path)."""
    return f"{op}:{subscription_key(store, path)}"


def route_key(msg: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """Where a message from fluxd goes: ``("reply", id)``, ``("subscription", store)``, ``("store", store)``,
    ``("error", ref)``, ``("ping", id)`` (a heartbeat), ``("bye", None)`` or ``("ignore", None)`` for ops this
    library does not know (§13)."""
    op = msg.get("op")
    if op in _REPLIES:
        return ("reply", msg.get("id") if isinstance(msg.get("id"), str) else None)
    if op == Op.SUBSCRIBED or op == Op.UNSUBSCRIBED:
        return ("reply", subscription_reply_key(op, msg.get("store"), msg.get("path")))
    if op in _SUBSCRIPTION:
        return ("subscription", msg.get("store"))
    if op in _STORE:
        return ("store", msg.get("store"))
    if op == Op.PING:  # a heartbeat ping (only to a peer that said hello with "heartbeat": true)
        return ("ping", msg.get("id") if isinstance(msg.get("id"), str) else None)
    if op == Op.ERROR:
        return ("error", msg.get("ref") if isinstance(msg.get("ref"), str) else None)
    if op == Op.BYE:
        return ("bye", None)
    return ("ignore", None)
