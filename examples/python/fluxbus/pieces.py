"""Stores whose state is larger than one frame (SPEC §16.6).

- :func:`fits`: whether a frame body is at most ``welcome.limits.maxFrame`` bytes.
- :func:`split_state`: the pieces a state is published in when fluxd retains nothing for the store and the whole
  state does not fit in one ``state`` frame: an empty container of the root's type, then ``patch`` operations
  that ``add`` the members (in the order a whole state is written: sorted keys) and append the elements, packed
  into patches that each fit in a frame; a member too large for one ``add`` is added empty and filled the same way.
- :func:`refusal_delay`: how long a store waits before registering again after its n-th refused registration in
  a row (100 ms doubling up to 30 s, each a random time between half of that and all of it).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from .errors import StateTooLargeError
from .patch import apply, escape
from .wire import dumps, loads

#: The first wait after a refused registration, and the longest (seconds; SPEC §16.6).
REFUSAL_FIRST_DELAY = 0.1
REFUSAL_MAX_DELAY = 30.0
#: Digits of the largest version a ``base`` can hold (2^53 - 1): the room a piece's envelope keeps for it.
_VERSION_DIGITS = 16


def fits(body_length: int, max_frame: Optional[int]) -> bool:
    """Whether a frame body of ``body_length`` bytes is accepted by a fluxd whose ``maxFrame`` is ``max_frame``
    (``None``: no limit announced)."""
    return max_frame is None or body_length <= max_frame


def refusal_delay(refusals: int, rand: Callable[[], float] = random.random, first: float = REFUSAL_FIRST_DELAY,
                  longest: float = REFUSAL_MAX_DELAY) -> float:
    """The wait (s) after the ``refusals``-th refused registration in a row: d = min(``longest``, ``first`` ×
    2^(refusals−1)), then a random time between d/2 and d."""
    exponent = min(max(0, refusals - 1), 64)
    ceiling = min(longest, first * (2 ** exponent))
    return ceiling * (0.5 + 0.5 * rand())


def state_frame_length(store: str, encoded_state: bytes) -> int:
    """The body length of the ``state`` frame that publishes ``encoded_state`` (as the clients write it)."""
    return len(dumps({"op": "state", "store": store})) + len(b',"state":') + len(encoded_state)


def _patch_overhead(store: str) -> int:
    """The bytes of a ``patch`` frame's body besides its patch array, with room for any ``base``."""
    return len(dumps({"base": 10 ** _VERSION_DIGITS - 1, "op": "patch", "store": store})) + len(b',"patch":')


@dataclass
class Pieces:
    """A state split for publishing (SPEC §16.6): ``root`` (``{}`` or ``[]``, encoded) is sent as ``state``, then
    each of ``patches`` (encoded patch arrays) as a ``patch`` whose ``base`` is the version the one before made."""
    root: bytes
    patches: List[bytes] = field(default_factory=list)

    def state_after(self, count: int) -> Any:
        """The state the root and the first ``count`` patches make (what fluxd retains after them)."""
        state = loads(self.root)
        for patch in self.patches[:count]:
            state = apply(state, loads(patch))
        return state

    def whole(self) -> Any:
        return self.state_after(len(self.patches))


def _add(path: str, value: bytes) -> bytes:
    return b'{"op":"add","path":' + dumps(path) + b',"value":' + value + b"}"


class _Splitter:
    def __init__(self, store: str, room: int, max_frame: int):
        self.store = store
        self.max_frame = max_frame
        self.room = room  # bytes one operation may take inside a patch array ("[" op "]")
        self.ops: List[bytes] = []

    def add(self, add_path: str, ref_path: str, value: Any, encoded: Optional[bytes] = None) -> None:
        """Adds ``value`` at ``add_path`` (``.../-`` for an element appended); once added, it is at ``ref_path``."""
        if encoded is None:
            encoded = dumps(value)
        op = _add(add_path, encoded)
        if len(op) <= self.room:
            self.ops.append(op)
            return
        if isinstance(value, dict):
            self._container(add_path, b"{}", value)
            for key in sorted(value):  # the order dumps writes them in (sort_keys)
                child = f"{ref_path}/{escape(key if isinstance(key, str) else str(key))}"
                self.add(child, child, value[key])
        elif isinstance(value, (list, tuple)):
            self._container(add_path, b"[]", value)
            for index, item in enumerate(value):
                self.add(f"{ref_path}/-", f"{ref_path}/{index}", item)
        else:
            raise StateTooLargeError(
                f"store {self.store!r}: the value at {ref_path!r} ({len(encoded)} bytes of JSON) does not fit in one "
                f"frame ({self.max_frame} bytes, fluxd's maxFrame), so the state cannot be published; keep single "
                f"strings and numbers smaller", ref=self.store)

    def _container(self, path: str, empty: bytes, value: Any) -> None:
        op = _add(path, empty)
        if len(op) > self.room:
            raise StateTooLargeError(f"store {self.store!r}: even an empty value at {path!r} does not fit in one "
                                     f"frame (fluxd's maxFrame)", ref=self.store)
        self.ops.append(op)

    def pack(self, root: bytes) -> Pieces:
        """The operations, in order, in as few patches as fit."""
        pieces = Pieces(root)
        current: List[bytes] = []
        size = 2  # "[" and "]"
        for op in self.ops:
            extra = len(op) + (1 if current else 0)
            if current and size + extra > self.room + 2:
                pieces.patches.append(b"[" + b",".join(current) + b"]")
                current, size, extra = [], 2, len(op)
            current.append(op)
            size += extra
        if current:
            pieces.patches.append(b"[" + b",".join(current) + b"]")
        return pieces


def split_state(state: Any, store: str, max_frame: int) -> Pieces:
    """The pieces that publish ``state`` (an object or array: its members or elements are added to an empty one)
    in ``state`` and ``patch`` frames of at most ``max_frame`` bytes each. Raises
    :class:`~fluxbus.errors.StateTooLargeError` when that cannot be done: a root that is not an object or array,
    or a string or number that alone does not fit."""
    if isinstance(state, dict):
        root = b"{}"
    elif isinstance(state, (list, tuple)):
        root = b"[]"
    else:
        raise StateTooLargeError(f"store {store!r}: its state is a single {type(state).__name__} larger than one "
                                 f"frame ({max_frame} bytes, fluxd's maxFrame): it cannot be published in pieces",
                                 ref=store)
    room = max_frame - _patch_overhead(store) - 2
    if room <= 0 or state_frame_length(store, root) > max_frame:
        raise StateTooLargeError(f"store {store!r}: fluxd's maxFrame ({max_frame} bytes) leaves no room for a "
                                 f"piece of its state", ref=store)
    splitter = _Splitter(store, room, max_frame)
    if isinstance(state, dict):
        for key in sorted(state):
            path = "/" + escape(key if isinstance(key, str) else str(key))
            splitter.add(path, path, state[key])
    else:
        for index, item in enumerate(state):
            splitter.add("/-", f"/{index}", item)
    return splitter.pack(root)
