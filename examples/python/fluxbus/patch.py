"""JSON Patch (RFC 6902) and JSON Pointer (RFC 6901) for FluxBus (SPEC §16.1), standard library only.

- :func:`apply` applies a patch as a whole or not at all and returns the new document; the document given is
  never modified, and the result shares every subtree the patch does not touch with it (copy on write), so
  applying a small patch to a large state costs the size of the change plus the containers on its paths.
- :func:`diff` computes a patch from ``old`` to ``new``; subtrees that are the same object (``old is new``) are
  skipped without being looked at, so a new state that shares structure with the old one (handlers that return
  ``{**state, "todos": todos}``, or the store library's drafts) is diffed in time proportional to what changed.
  Arrays are compared by their common prefix and suffix; what lies between is replaced element by element, then
  removed or added.
- :func:`parse_pointer`, :func:`format_pointer`, :func:`escape`, :func:`unescape`, :func:`resolve`.
- :func:`json_equal`: JSON equality (numbers by exact decimal value, ``true`` is not ``1``, objects regardless of
  order): ``1`` = ``1.0`` = ``1e0``, ``-0`` = ``0``, but ``2**53 + 1`` is not ``2**53`` and ``0.10000000000000001``
  (a :class:`~fluxbus.number.JSONNumber` when read by this library) is not ``0.1`` (``fluxbus.number``).

``protocol/vectors/patch.json`` holds the cases every FluxBus implementation passes (``tests/test_patch_vectors.py``).
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Dict, List, Optional, Sequence

from .number import numbers_equal

__all__ = ["PatchError", "PointerError", "apply", "diff", "escape", "unescape", "parse_pointer", "format_pointer",
           "resolve", "json_equal", "MAX_DEPTH"]

#: SPEC §3.2: the deepest a JSON text may nest (the top-level value has depth 1).
MAX_DEPTH = 64
_INDEX = re.compile(r"(?:0|[1-9][0-9]*)\Z")
_MISSING = object()
_OPS = ("add", "remove", "replace", "move", "copy", "test")


class PatchError(ValueError):
    """A patch that does not apply (SPEC §16.1): the document is left as it was. ``index`` is the position of the
    failing operation in the patch (``None`` when the patch itself is malformed)."""

    def __init__(self, message: str, index: Optional[int] = None):
        super().__init__(message if index is None else f"operation {index}: {message}")
        self.index = index


class PointerError(PatchError):
    """A JSON Pointer that is malformed (RFC 6901) or names nothing in the document."""


# -- pointers ---------------------------------------------------------------------------------------------------

def escape(token: str) -> str:
    """One reference token as written in a pointer: ``~`` as ``~0``, ``/`` as ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """A reference token as written in a pointer, decoded; a ``~`` not followed by ``0`` or ``1`` is an error."""
    if "~" not in token:
        return token
    if re.search(r"~(?![01])", token):
        raise PointerError(f"bad escape in pointer token {token!r} (~ must be followed by 0 or 1)")
    return token.replace("~1", "/").replace("~0", "~")


def parse_pointer(pointer: str) -> List[str]:
    """The reference tokens of a JSON Pointer (``""`` is the whole document: ``[]``)."""
    if not isinstance(pointer, str):
        raise PointerError(f"a pointer is a string, not {type(pointer).__name__}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PointerError(f"pointer {pointer!r} does not start with '/'")
    return [unescape(token) for token in pointer[1:].split("/")]


def format_pointer(tokens: Sequence[Any]) -> str:
    """The pointer of a list of tokens (strings or array indexes)."""
    return "".join("/" + escape(token if isinstance(token, str) else str(token)) for token in tokens)


def _index(token: str, length: int, for_add: bool = False) -> int:
    """An array index token (RFC 6901: ``0`` or digits without a leading zero; ``-`` only to add at the end)."""
    if for_add and token == "-":
        return length
    if not _INDEX.match(token):
        raise PointerError(f"{token!r} is not an array index")
    index = int(token)
    if index > length or (index == length and not for_add):
        raise PointerError(f"array index {index} is out of range (length {length})")
    return index


def _get(doc: Any, tokens: Sequence[str]) -> Any:
    value = doc
    for depth, token in enumerate(tokens):
        if isinstance(value, dict):
            value = value.get(token, _MISSING)
            if value is _MISSING:
                raise PointerError(f"no member {token!r} at {format_pointer(tokens[:depth]) or 'the root'}")
        elif isinstance(value, list):
            value = value[_index(token, len(value))]
        else:
            raise PointerError(f"{format_pointer(tokens[:depth]) or 'the root'} is not an object or array")
    return value


def resolve(doc: Any, pointer: str) -> Any:
    """The value at ``pointer`` in ``doc``; raises :class:`PointerError` when there is none."""
    return _get(doc, parse_pointer(pointer))


# -- equality and depth -----------------------------------------------------------------------------------------

def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by exact decimal value (SPEC §16.1: ``1 == 1.0 == 1e0``, ``-0 == 0``,
    ``2**53 + 1 != 2**53``; a float counts as the decimal its ``repr`` names, a
    :class:`~fluxbus.number.JSONNumber` as its text), booleans are not numbers, objects regardless of member
    order, arrays element by element."""
    if a is b:
        return True
    ta, tb = type(a), type(b)
    if ta is bool or tb is bool or a is None or b is None:
        return ta is tb and a == b
    if isinstance(a, (int, float, Decimal)):
        return isinstance(b, (int, float, Decimal)) and numbers_equal(a, b)
    if isinstance(a, str):
        return isinstance(b, str) and a == b
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for key, value in a.items():
            other = b.get(key, _MISSING)
            if other is _MISSING or not json_equal(value, other):
                return False
        return True
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return all(json_equal(x, y) for x, y in zip(a, b))
    return a == b


def _depth(value: Any, limit: int) -> int:
    """How many containers ``value`` nests (SPEC §3.2: ``{"a":[[1]]}`` is 3; a scalar is 0), counted up to
    ``limit + 1``."""
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    else:
        return 0
    deepest = 0
    for child in children:
        if isinstance(child, (dict, list, tuple)):
            deepest = max(deepest, _depth(child, limit - 1))
            if deepest >= limit:
                break
    return 1 + deepest


def _json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _json_copy(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_copy(child) for child in value]
    return value


# -- apply ------------------------------------------------------------------------------------------------------

class _Applier:
    """One application of a patch: copies each container on an operation's path the first time it is written
    (later operations write the copies in place), so the input document stays untouched."""

    def __init__(self, doc: Any, max_depth: int):
        self.box: List[Any] = [doc]
        self.owned: Dict[int, Any] = {}  # id -> container made here (kept alive so ids are not reused)
        self.max_depth = max_depth

    def _own(self, value: Any) -> Any:
        if id(value) in self.owned:
            return value
        copied = dict(value) if isinstance(value, dict) else list(value)
        self.owned[id(copied)] = copied
        return copied

    def parent(self, tokens: List[str]) -> Any:
        """The writable container holding the last token of ``tokens`` (copied on the way as needed)."""
        holder: Any = self.box
        key: Any = 0
        for depth, token in enumerate(tokens[:-1]):
            current = holder[key]
            if isinstance(current, dict):
                if token not in current:
                    raise PointerError(f"no member {token!r} at {format_pointer(tokens[:depth]) or 'the root'}")
                current = self._own(current)
                holder[key] = current
                holder, key = current, token
            elif isinstance(current, (list, tuple)):
                index = _index(token, len(current))
                current = self._own(current)
                holder[key] = current
                holder, key = current, index
            else:
                raise PointerError(f"{format_pointer(tokens[:depth]) or 'the root'} is not an object or array")
        container = holder[key]
        if not isinstance(container, (dict, list, tuple)):
            raise PointerError(f"{format_pointer(tokens[:-1]) or 'the root'} is not an object or array")
        container = self._own(container)
        holder[key] = container
        return container

    def check_depth(self, tokens: List[str], value: Any, known: Optional[int] = None) -> None:
        """The value put at ``tokens`` must not make the document deeper than the limit. ``known``: the depth
        the value had where it came from (a move or copy within the document), which bounds it."""
        room = self.max_depth - len(tokens)
        if known is not None and known <= room:
            return
        if _depth(value, room) > room:
            raise PatchError(f"the result would nest deeper than {self.max_depth}")

    def add(self, tokens: List[str], value: Any) -> None:
        if not tokens:
            self.box[0] = value
            return
        container = self.parent(tokens)
        token = tokens[-1]
        if isinstance(container, dict):
            container[token] = value
        else:
            container.insert(_index(token, len(container), for_add=True), value)

    def remove(self, tokens: List[str]) -> Any:
        if not tokens:
            raise PointerError("the root cannot be removed")
        container = self.parent(tokens)
        token = tokens[-1]
        if isinstance(container, dict):
            if token not in container:
                raise PointerError(f"no member {token!r} at {format_pointer(tokens[:-1]) or 'the root'}")
            return container.pop(token)
        return container.pop(_index(token, len(container)))

    def replace(self, tokens: List[str], value: Any) -> None:
        if not tokens:
            self.box[0] = value
            return
        container = self.parent(tokens)
        token = tokens[-1]
        if isinstance(container, dict):
            if token not in container:
                raise PointerError(f"no member {token!r} at {format_pointer(tokens[:-1]) or 'the root'}")
            container[token] = value
        else:
            container[_index(token, len(container))] = value

    def run(self, index: int, operation: Any) -> None:
        if not isinstance(operation, dict):
            raise PatchError("an operation is an object", index)
        op = operation.get("op")
        if op not in _OPS:
            raise PatchError(f"unknown op {op!r}" if isinstance(op, str) else "an operation needs a string op", index)
        path = operation.get("path", _MISSING)
        if not isinstance(path, str):
            raise PatchError(f"{op} needs a string path", index)
        try:
            tokens = parse_pointer(path)
            if op in ("add", "replace", "test"):
                if "value" not in operation:
                    raise PatchError(f"{op} needs a value")
                value = operation["value"]
                if op == "test":
                    if not json_equal(_get(self.box[0], tokens), value):
                        raise PatchError(f"test failed: the value at {path!r} is not the one expected")
                    return
                self.check_depth(tokens, value)
                if op == "add":
                    self.add(tokens, value)
                else:
                    self.replace(tokens, value)
            elif op == "remove":
                self.remove(tokens)
            else:  # move, copy
                source = operation.get("from", _MISSING)
                if not isinstance(source, str):
                    raise PatchError(f"{op} needs a string from")
                from_tokens = parse_pointer(source)
                value = _get(self.box[0], from_tokens)
                known = self.max_depth - len(from_tokens)
                if op == "copy":
                    self.check_depth(tokens, value, known)
                    self.add(tokens, _json_copy(value))
                    return
                if from_tokens == tokens:
                    return
                if len(from_tokens) < len(tokens) and tokens[:len(from_tokens)] == from_tokens:
                    raise PatchError(f"cannot move {source!r} into its own child {path!r}")
                self.check_depth(tokens, value, known)
                self.remove(from_tokens)
                self.add(tokens, value)
        except PatchError as error:
            if error.index is None:
                raise type(error)(str(error), index) from None
            raise


def apply(doc: Any, patch: Any, max_depth: int = MAX_DEPTH) -> Any:
    """Applies ``patch`` (a list of RFC 6902 operations) to ``doc`` and returns the result; ``doc`` itself is not
    modified, and the result shares with it every subtree no operation touched (do not modify either in place).
    Raises :class:`PatchError` (:class:`PointerError` for paths) when an operation fails: then nothing is
    applied. An empty patch returns ``doc``."""
    if not isinstance(patch, list):
        raise PatchError("a patch is an array of operations")
    applier = _Applier(doc, max_depth)
    for index, operation in enumerate(patch):
        applier.run(index, operation)
    return applier.box[0]


# -- diff -------------------------------------------------------------------------------------------------------

def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple))


def _same_scalar(a: Any, b: Any) -> bool:
    """Whether two values (not both the same object) are equal scalars."""
    if _is_container(a) or _is_container(b):
        return False
    return json_equal(a, b)


def plain(value: Any) -> Any:
    """``value`` with every draft (``fluxbus.draft``) inside it replaced by its final value."""
    finish = getattr(value, "_flux_final", None)
    if finish is not None:
        return finish()
    if isinstance(value, dict):
        changed = None
        for key, child in value.items():
            if _is_container(child):
                final = plain(child)
                if final is not child:
                    if changed is None:
                        changed = dict(value)
                    changed[key] = final
        return value if changed is None else changed
    if isinstance(value, (list, tuple)):
        changed_list = None
        for index, child in enumerate(value):
            if _is_container(child):
                final = plain(child)
                if final is not child:
                    if changed_list is None:
                        changed_list = list(value)
                    changed_list[index] = final
        return value if changed_list is None else changed_list
    return value


def _token(key: Any) -> str:
    return key if isinstance(key, str) else str(key)


def diff_into(old: Any, new: Any, path: str, ops: List[Dict[str, Any]]) -> Any:
    """Appends to ``ops`` the operations that turn ``old`` (at ``path``) into ``new`` and returns ``new``'s final
    value (``new`` itself, unless drafts had to be replaced by their final values)."""
    if new is old:
        return old
    draft_diff = getattr(new, "_flux_diff", None)
    if draft_diff is not None:
        return draft_diff(old, path, ops)
    if isinstance(new, dict) and isinstance(old, dict):
        final: Any = new
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": path + "/" + escape(_token(key))})
        for key, value in new.items():
            child_path = path + "/" + escape(_token(key))
            before = old.get(key, _MISSING)
            if before is _MISSING:
                result = plain(value)
                ops.append({"op": "add", "path": child_path, "value": result})
            else:
                result = diff_into(before, value, child_path, ops)
            if result is not value:
                if final is new:
                    final = dict(new)
                final[key] = result
        return final
    if isinstance(new, (list, tuple)) and isinstance(old, (list, tuple)):
        return _diff_arrays(old, new, path, ops)
    if not _is_container(new) and not _is_container(old) and json_equal(old, new):
        return new
    final = plain(new)
    ops.append({"op": "replace", "path": path, "value": final})
    return final


def _diff_arrays(old: Sequence[Any], new: Sequence[Any], path: str, ops: List[Dict[str, Any]]) -> Any:
    n, m = len(old), len(new)
    shortest = min(n, m)
    start = 0
    while start < shortest:
        a, b = old[start], new[start]
        if a is not b and not _same_scalar(a, b):
            break
        start += 1
    end = 0
    while end < shortest - start:
        a, b = old[n - 1 - end], new[m - 1 - end]
        if a is not b and not _same_scalar(a, b):
            break
        end += 1
    final: Any = new
    paired = min(n, m) - start - end
    for offset in range(paired):
        index = start + offset
        value = new[index]
        result = diff_into(old[index], value, f"{path}/{index}", ops)
        if result is not value:
            if final is new:
                final = list(new)
            final[index] = result
    at = start + paired
    for _ in range(n - m if n > m else 0):
        ops.append({"op": "remove", "path": f"{path}/{at}"})
    for offset in range(m - n if m > n else 0):
        index = at + offset
        value = new[index]
        result = plain(value)
        ops.append({"op": "add", "path": f"{path}/{index}", "value": result})
        if result is not value:
            if final is new:
                final = list(new)
            final[index] = result
    return final


def diff(old: Any, new: Any) -> List[Dict[str, Any]]:
    """A patch that turns ``old`` into ``new`` (``apply(old, diff(old, new))`` is JSON-equal to ``new``).
    Subtrees that are the same object in both are skipped; arrays are compared by common prefix and suffix."""
    ops: List[Dict[str, Any]] = []
    diff_into(old, new, "", ops)
    return ops
