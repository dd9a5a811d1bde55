"""Drafts: what a store handler changes, recorded as it changes it (SPEC §16.2).

A draft is a ``dict`` or ``list`` subclass made from a state: it holds a shallow copy of one container, and wraps a
nested container in a draft of its own the first time the handler reads it (``state["todos"][3]``, iteration,
``get``, ``items()``, ``pop``...). Writes go to the copies and mark the drafts on the way up as touched, so the
state the handler was given is never modified. When the handler returns, :func:`finish` builds the new state (the
old one with only the touched containers replaced: the rest is shared) and the patch from the old state to it,
looking only at what was touched. A handler that changes one of 10,000 todos therefore costs what it reads and
writes, not the size of the state.

Drafts behave as the dicts and lists they are (``isinstance`` is true, ``json.dumps`` works, ``{**state}``,
``list(todos)``, slices, ``copy.deepcopy`` give values whose nested containers are drafts or copies, never the
original state). They are only valid while the handler runs; keep plain copies (``copy.deepcopy``) if need be.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

from .patch import _MISSING, _diff_arrays, diff_into, escape, plain

__all__ = ["DraftDict", "DraftList", "draft", "finish", "is_draft"]


class _Changes:
    """What happened to a draft that was touched (a draft without one is untouched): ``dirty`` keys or indexes
    written, ``tkeys``: keys or indexes of touched children, ``structural``: a list changed length or order,
    ``foreign``: ids of containers the handler put in a list, ``final``: the finished value."""

    __slots__ = ("dirty", "tkeys", "structural", "foreign", "final")

    def __init__(self) -> None:
        self.dirty: Set[Any] = set()
        self.tkeys: Set[Any] = set()
        self.structural = False
        self.foreign: Set[int] = set()
        self.final: Any = None




def _touch(node: Any) -> "_Changes":
    """Marks ``node`` and its ancestors touched (each one records which child key led to it); returns ``node``'s
    changes."""
    changes = node._ch
    if changes is not None:
        return changes
    mine = changes = node._ch = _Changes()
    while True:
        _orig, parent, key = node._src
        if parent is None:
            return mine
        changes = parent._ch
        if changes is not None:
            changes.tkeys.add(key)
            return mine
        changes = parent._ch = _Changes()
        changes.tkeys.add(key)
        node = parent


def _child(value: Any, parent: Any, key: Any) -> Any:
    child: Any = DraftDict(value) if type(value) is dict else DraftList(value)
    child._src = (value, parent, key)
    child._ch = None
    return child


def _deep(value: Any) -> Any:
    """A plain deep copy of a value that may hold drafts (read through their raw storage)."""
    if isinstance(value, dict):
        return {key: _deep(child) for key, child in dict.items(value)}
    if isinstance(value, list):
        return [_deep(child) for child in list.__iter__(value)]
    if isinstance(value, tuple):
        return [_deep(child) for child in value]
    return value


class DraftDict(dict):
    """A draft of a JSON object (see the module doc)."""

    __slots__ = ("_src", "_ch")
    _flux_draft = True

    # -- reading ------------------------------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        kind = type(value)
        if (kind is dict or kind is list) and (self._ch is None or key not in self._ch.dirty):
            child = DraftDict(value) if kind is dict else DraftList(value)
            child._src = (value, self, key)
            child._ch = None
            dict.__setitem__(self, key, child)
            return child
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if dict.__contains__(self, key) else default

    def __iter__(self) -> Any:  # (defined so that dict(d) and {**d} read values through __getitem__)
        return dict.__iter__(self)

    def items(self) -> List[Tuple[Any, Any]]:  # type: ignore[override]
        return [(key, self[key]) for key in dict.keys(self)]

    def values(self) -> List[Any]:  # type: ignore[override]
        return [self[key] for key in dict.keys(self)]

    def copy(self) -> Dict[Any, Any]:
        return {key: self[key] for key in dict.keys(self)}

    __copy__ = copy

    def __or__(self, other: Any) -> Dict[Any, Any]:
        result = self.copy()
        result.update(other)
        return result

    def __deepcopy__(self, memo: Any) -> Dict[Any, Any]:
        return _deep(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (_deep(self),))

    # -- writing ------------------------------------------------------------------------------------------------

    def _changed(self, key: Any) -> None:
        _touch(self).dirty.add(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._changed(key)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._changed(key)

    def pop(self, key: Any, *default: Any) -> Any:
        if not dict.__contains__(self, key):
            return dict.pop(self, key, *default)
        value = self[key]
        dict.__delitem__(self, key)
        self._changed(key)
        return value

    def popitem(self) -> Tuple[Any, Any]:
        if not dict.__len__(self):
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self[key]
        self[key] = default
        return default

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> "DraftDict":
        self.update(other)
        return self

    def clear(self) -> None:
        keys = list(dict.keys(self))
        dict.clear(self)
        _touch(self).dirty.update(keys)

    # -- finishing ----------------------------------------------------------------------------------------------

    def _flux_final(self) -> Any:
        changes = self._ch
        if changes is None:
            return self._src[0]
        if changes.final is None:
            self._flux_diff(self._src[0], "", [])
        return changes.final

    def _flux_diff(self, old: Any, path: str, ops: List[Dict[str, Any]]) -> Any:
        orig = self._src[0]
        if old is not orig:
            return diff_into(old, self._flux_final(), path, ops)
        changes = self._ch
        if changes is None:
            return orig
        keys = changes.dirty | changes.tkeys
        final = dict(orig)
        for key in [k for k in dict.keys(self) if k in keys] + [k for k in keys if not dict.__contains__(self, k)]:
            child_path = path + "/" + escape(key if isinstance(key, str) else str(key))
            new = dict.get(self, key, _MISSING)
            before = orig.get(key, _MISSING)
            if new is _MISSING:
                if before is not _MISSING:
                    ops.append({"op": "remove", "path": child_path})
                    del final[key]
            elif before is _MISSING:
                value = plain(new)
                ops.append({"op": "add", "path": child_path, "value": value})
                final[key] = value
            else:
                final[key] = diff_into(before, new, child_path, ops)
        changes.final = final
        return final


class DraftList(list):
    """A draft of a JSON array (see the module doc)."""

    __slots__ = ("_src", "_ch")
    _flux_draft = True

    # -- reading ------------------------------------------------------------------------------------------------

    def _wrap(self, index: int) -> Any:
        value = list.__getitem__(self, index)
        kind = type(value)
        if (kind is dict or kind is list) and (self._ch is None or id(value) not in self._ch.foreign):
            child = DraftDict(value) if kind is dict else DraftList(value)
            child._src = (value, self, index)
            child._ch = None
            list.__setitem__(self, index, child)
            return child
        return value

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._wrap(i) for i in range(*index.indices(list.__len__(self)))]
        if index < 0:
            index += list.__len__(self)
            if index < 0:
                raise IndexError("list index out of range")
        return self._wrap(index)

    def _wrap_all(self) -> None:
        """Wraps every nested container not wrapped yet, in one pass (iteration reads them all)."""
        foreign = () if self._ch is None else self._ch.foreign
        setitem = list.__setitem__
        for index, value in enumerate(list.__iter__(self)):
            kind = type(value)
            if kind is dict:
                if id(value) in foreign:
                    continue
                child: Any = DraftDict(value)
            elif kind is list:
                if id(value) in foreign:
                    continue
                child = DraftList(value)
            else:
                continue
            child._src = (value, self, index)
            child._ch = None
            setitem(self, index, child)

    def __iter__(self) -> Any:
        self._wrap_all()
        return list.__iter__(self)

    def __reversed__(self) -> Any:
        self._wrap_all()
        return list.__reversed__(self)

    def copy(self) -> List[Any]:
        self._wrap_all()
        return list(list.__iter__(self))

    __copy__ = copy

    def __add__(self, other: Any) -> List[Any]:
        return self.copy() + list(other)

    def __mul__(self, count: Any) -> List[Any]:
        return self.copy() * count

    __rmul__ = __mul__

    def __deepcopy__(self, memo: Any) -> List[Any]:
        return _deep(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (_deep(self),))

    # -- writing ------------------------------------------------------------------------------------------------

    def _adopt(self, value: Any) -> None:
        """Remembers a container the handler put in the list: it is the handler's own, never wrapped."""
        kind = type(value)
        if kind is dict or kind is list:
            _touch(self).foreign.add(id(value))

    def _reshaped(self) -> None:
        _touch(self).structural = True

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            values = list(value)
            for each in values:
                self._adopt(each)
            list.__setitem__(self, index, values)
            self._reshaped()
            return
        list.__setitem__(self, index, value)
        self._adopt(value)
        if index < 0:
            index += list.__len__(self)
        _touch(self).dirty.add(index)

    def __delitem__(self, index: Any) -> None:
        list.__delitem__(self, index)
        self._reshaped()

    def append(self, value: Any) -> None:
        list.append(self, value)
        self._adopt(value)
        self._reshaped()

    def extend(self, values: Any) -> None:
        values = list(values)
        for each in values:
            self._adopt(each)
        list.extend(self, values)
        self._reshaped()

    def __iadd__(self, values: Any) -> "DraftList":
        self.extend(values)
        return self

    def __imul__(self, count: Any) -> "DraftList":
        self._wrap_all()
        list.__imul__(self, count)
        self._reshaped()
        return self

    def insert(self, index: Any, value: Any) -> None:
        list.insert(self, index, value)
        self._adopt(value)
        self._reshaped()

    def pop(self, index: int = -1) -> Any:
        value = self[index]
        list.pop(self, index)
        self._reshaped()
        return value

    def remove(self, value: Any) -> None:
        list.remove(self, value)
        self._reshaped()

    def clear(self) -> None:
        list.clear(self)
        self._reshaped()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        list.sort(self, *args, **kwargs)
        self._reshaped()

    def reverse(self) -> None:
        list.reverse(self)
        self._reshaped()

    # -- finishing ----------------------------------------------------------------------------------------------

    def _flux_final(self) -> Any:
        changes = self._ch
        if changes is None:
            return self._src[0]
        if changes.final is None:
            self._flux_diff(self._src[0], "", [])
        return changes.final

    def _flux_diff(self, old: Any, path: str, ops: List[Dict[str, Any]]) -> Any:
        orig = self._src[0]
        if old is not orig:
            return diff_into(old, self._flux_final(), path, ops)
        changes = self._ch
        if changes is None:
            return orig
        if changes.structural:
            foreign = changes.foreign
            final: Any = [value._flux_final() if getattr(value, "_flux_draft", False)
                          else (plain(value) if id(value) in foreign else value)
                          for value in list.__iter__(self)]
            final = _diff_arrays(orig, final, path, ops)
        else:
            final = list(orig)
            for index in sorted(changes.dirty | changes.tkeys):
                final[index] = diff_into(orig[index], list.__getitem__(self, index), f"{path}/{index}", ops)
        changes.final = final
        return final


def is_draft(value: Any) -> bool:
    return getattr(type(value), "_flux_draft", False)


def draft(state: Any) -> Any:
    """A draft of ``state`` (a dict or list; any other value is returned as it is: it cannot be changed in
    place)."""
    kind = type(state)
    if kind is not dict and kind is not list:
        return state
    root = _child(state, None, None)
    return root


def finish(old: Any, new: Any) -> Tuple[Any, List[Dict[str, Any]]]:
    """The final value of a handler's result ``new`` (drafts replaced by plain values that share what did not
    change with ``old``) and the patch from ``old`` to it."""
    ops: List[Dict[str, Any]] = []
    final = diff_into(old, new, "", ops)
    return final, ops
