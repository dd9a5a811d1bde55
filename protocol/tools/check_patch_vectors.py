#!/usr/bin/env python3
"""Checks protocol/vectors/patch.json, the shared JSON Patch / JSON Pointer cases (SPEC.md §16.1).

The file is proven consistent against an independent reference implementation of RFC 6902 (apply) and RFC 6901
(pointers) written here, on purpose apart from the libraries that run the vectors:
- every "apply" case: the reference applies "patch" to a copy of "doc"; the result must equal "expected" (JSON
  equality), or the reference must fail with exactly the category "error" names, and "doc" must be unchanged;
- every "pointers" case: the reference evaluates "pointer" in "doc"; the result must equal "value", or fail with
  the category "error" names;
- every "diffs" case: "from" and "to" must be valid states (depth at most 64), and a simple reference diff must
  turn one into the other (apply(from, diff(from, to)) equals to; the diff is [] exactly when they are equal);
- every "touches" case (SPEC.md §16.4, what fluxd sends path subscribers): "patch" applies to "doc", and a
  reference of §16.4's rule says whether it touches "path" as "touches" says.
It also checks the file's shape: the keys each case has, known error categories, unique comments per section,
no duplicate object keys anywhere and no NaN/Infinity (parsers disagree on both).
Numbers are read as exact decimals (int, or decimal.Decimal for a fraction or exponent) and compare by exact decimal
value (SPEC.md §16.1: 1 = 1.0 = 1e0, -0 = 0, 2^53+1 != 2^53, 0.10000000000000001 != 0.1); a float given by a caller
counts as the decimal its repr names.

Usage: python3 protocol/tools/check_patch_vectors.py [-v] [FILE]
Prints one line per failure (and per case with -v), then "N passed, M failed"; exits 1 on failure.
Standard library only.
"""
import copy
import decimal
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILE = os.path.normpath(os.path.join(HERE, "..", "vectors", "patch.json"))

MAX_DEPTH = 64  # SPEC.md §3.2: the top-level value has depth 1; scalars add nothing ({"a":[[1]]} has depth 3)
CATEGORIES = {"invalid-op", "invalid-pointer", "not-found", "index", "move-into-child", "test-failed", "too-deep"}
OPS = {"add", "remove", "replace", "move", "copy", "test"}
ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")  # RFC 6901 §4: ASCII digits, no leading zero (used with fullmatch)
BAD_ESCAPE = re.compile(r"~(?![01])")


class PatchError(Exception):
    def __init__(self, category, message):
        super().__init__(message)
        self.category = category


# ---- JSON values -------------------------------------------------------------------------------------------

def is_number(v):
    return isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)


def exact(v):
    """A number's exact decimal value (a float: the decimal its repr names, 0.1 for the double nearest 0.1)."""
    return decimal.Decimal(repr(v)) if isinstance(v, float) else decimal.Decimal(v)


def json_equal(a, b):
    """JSON equality: numbers by exact decimal value (1 == 1.0, 2^53+1 != 2^53), objects regardless of member
    order, arrays in order, strings code point by code point (no normalization), and no cross-type equality (true
    is not 1, null is not false)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_number(a) or is_number(b):
        return is_number(a) and is_number(b) and exact(a) == exact(b)  # Decimal comparison is exact
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(json_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    raise TypeError("not a JSON value: %r / %r" % (a, b))


def depth(value):
    """Nesting depth as SPEC.md §3.2 counts it: containers count, scalars do not (a scalar alone has depth 0)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v)
    return deepest


# ---- RFC 6901 ----------------------------------------------------------------------------------------------

def parse_pointer(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError("invalid-pointer", "a pointer is empty or starts with '/': %r" % pointer)
    if BAD_ESCAPE.search(pointer):
        raise PatchError("invalid-pointer", "'~' must be followed by '0' or '1': %r" % pointer)
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def array_index(token, length, allow_end):
    """The index a token names in an array of `length` elements. allow_end: an add's last token, where "-" and
    `length` itself name the position after the last element."""
    if token == "-":
        if allow_end:
            return length
        raise PatchError("index", "'-' names no element here")
    if not ARRAY_INDEX.fullmatch(token):
        raise PatchError("index", "not an array index: %r" % token)
    i = int(token)
    if i > length or (i == length and not allow_end):
        raise PatchError("index", "index %d out of range (length %d)" % (i, length))
    return i


def resolve(doc, tokens):
    """The value at tokens (already parsed); PatchError if there is none."""
    v = doc
    for t in tokens:
        if isinstance(v, dict):
            if t not in v:
                raise PatchError("not-found", "no member %r" % t)
            v = v[t]
        elif isinstance(v, list):
            v = v[array_index(t, len(v), False)]
        else:
            raise PatchError("not-found", "%r goes into a scalar" % t)
    return v


def evaluate(doc, pointer):
    return resolve(doc, parse_pointer(pointer))


# ---- RFC 6902 ----------------------------------------------------------------------------------------------

def _member(op, name, kind):
    if name not in op:
        raise PatchError("invalid-op", "%s has no %r member" % (op.get("op"), name))
    if kind is str and not isinstance(op[name], str):
        raise PatchError("invalid-op", "%r is not a string" % name)
    return op[name]


def _container(doc, tokens):
    parent = resolve(doc, tokens[:-1])
    if not isinstance(parent, (dict, list)):
        raise PatchError("not-found", "the parent of %r is a scalar" % tokens[-1])
    return parent


def _add(doc, tokens, value):
    if not tokens:
        return value
    parent, last = _container(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    else:
        parent.insert(array_index(last, len(parent), True), value)
    return doc


def _remove(doc, tokens):
    """Removes the value at tokens; returns it."""
    if not tokens:
        raise PatchError("invalid-op", "the root cannot be removed")
    parent, last = _container(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError("not-found", "no member %r" % last)
        return parent.pop(last)
    return parent.pop(array_index(last, len(parent), False))


def _replace(doc, tokens, value):
    if not tokens:
        return value
    parent, last = _container(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError("not-found", "no member %r" % last)
        parent[last] = value
    else:
        parent[array_index(last, len(parent), False)] = value
    return doc


def apply_op(doc, op):
    if not isinstance(op, dict):
        raise PatchError("invalid-op", "an operation is an object")
    name = _member(op, "op", str)
    if name not in OPS:
        raise PatchError("invalid-op", "unknown op %r" % name)
    path = parse_pointer(_member(op, "path", str))
    if name in ("move", "copy"):
        source = parse_pointer(_member(op, "from", str))
    if name in ("add", "replace", "test"):
        value = copy.deepcopy(_member(op, "value", None))

    if name == "add":
        return _add(doc, path, value)
    if name == "remove":
        _remove(doc, path)
        return doc
    if name == "replace":
        return _replace(doc, path, value)
    if name == "test":
        if not json_equal(resolve(doc, path), value):
            raise PatchError("test-failed", "not equal")
        return doc
    if name == "copy":
        return _add(doc, path, copy.deepcopy(resolve(doc, source)))
    # move
    if source == path:
        resolve(doc, source)  # must exist; otherwise nothing to do
        return doc
    if path[:len(source)] == source:
        raise PatchError("move-into-child", "a value cannot move into its own child")
    return _add(doc, path, _remove(doc, source))  # source is not "" here: "" is a prefix of every path


def apply_patch(doc, patch):
    """Applies patch to a copy of doc: the new document, or PatchError (doc is never changed)."""
    if not isinstance(patch, list):
        raise PatchError("invalid-op", "a patch is an array")
    result = copy.deepcopy(doc)
    for op in patch:
        result = apply_op(result, op)
    if depth(result) > MAX_DEPTH:
        raise PatchError("too-deep", "the result is deeper than %d" % MAX_DEPTH)
    return result


# ---- a reference diff (only to prove the diffs pairs usable) ------------------------------------------------

def escape(token):
    return token.replace("~", "~0").replace("/", "~1")


def diff(a, b, path=""):
    if json_equal(a, b):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        ops = [{"op": "remove", "path": path + "/" + escape(k)} for k in a if k not in b]
        for k in b:
            p = path + "/" + escape(k)
            ops += diff(a[k], b[k], p) if k in a else [{"op": "add", "path": p, "value": b[k]}]
        return ops
    if isinstance(a, list) and isinstance(b, list):
        start = 0
        while start < min(len(a), len(b)) and json_equal(a[start], b[start]):
            start += 1
        end_a, end_b = len(a), len(b)
        while end_a > start and end_b > start and json_equal(a[end_a - 1], b[end_b - 1]):
            end_a, end_b = end_a - 1, end_b - 1
        ops = []
        common = min(end_a - start, end_b - start)
        for i in range(start, start + common):
            ops += diff(a[i], b[i], "%s/%d" % (path, i))
        ops += [{"op": "remove", "path": "%s/%d" % (path, start + common)} for _ in range(end_a - start - common)]
        ops += [{"op": "add", "path": "%s/%d" % (path, i), "value": b[i]} for i in range(start + common, end_b)]
        return ops
    return [{"op": "replace", "path": path, "value": b}]


# ---- the file ----------------------------------------------------------------------------------------------

def _no_duplicates(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise ValueError("duplicate key %r" % k)
        obj[k] = v
    return obj


def _no_constants(name):
    raise ValueError("%s is not JSON" % name)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f, object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=decimal.Decimal)


def dumps(value):
    """JSON text of a value as load() gives it (Decimals written exactly), with json.dumps's default separators."""
    if isinstance(value, decimal.Decimal):
        return str(value)  # 1E+400, 0.10000000000000001, -0: JSON numbers
    if isinstance(value, dict):
        return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": " + dumps(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _shape(case, required, either):
    keys = set(case)
    problems = ["missing %r" % k for k in required if k not in keys]
    present = [k for k in either if k in keys]
    if len(present) != 1:
        problems.append("needs exactly one of %s" % " / ".join(either))
    extra = keys - set(required) - set(either)
    if extra:
        problems.append("unknown keys %s" % sorted(extra))
    if "error" in case and case["error"] not in CATEGORIES:
        problems.append("unknown error category %r" % case["error"])
    if not isinstance(case.get("comment"), str) or not case.get("comment"):
        problems.append("comment must be a non-empty string")
    return problems


def check_apply(case):
    problems = _shape(case, ("comment", "doc", "patch"), ("expected", "error"))
    if problems:
        return problems
    if not isinstance(case["patch"], list):
        return ["patch must be an array"]
    if depth(case["doc"]) > MAX_DEPTH:
        return ["doc is deeper than %d" % MAX_DEPTH]
    pristine = copy.deepcopy(case["doc"])
    try:
        result = apply_patch(case["doc"], case["patch"])
    except PatchError as e:
        result, error = None, e
    else:
        error = None
    if not json_equal(case["doc"], pristine):
        return ["the reference changed doc"]
    if "expected" in case:
        if error is not None:
            return ["expected a result, the reference failed: %s (%s)" % (error.category, error)]
        if not json_equal(result, case["expected"]):
            return ["result %s != expected" % dumps(result)]
        step = copy.deepcopy(case["doc"])
        for op in case["patch"]:
            step = apply_op(step, op)
            if depth(step) > MAX_DEPTH:  # SPEC bounds the result; keep cases clear of the in-between question
                return ["deeper than %d in between (README: only the result counts, no case tests this)" % MAX_DEPTH]
        return []
    if error is None:
        return ["expected error %s, the reference produced %s" % (case["error"], dumps(result))]
    if error.category != case["error"]:
        return ["expected error %s, the reference failed with %s (%s)" % (case["error"], error.category, error)]
    return []


def check_pointer(case):
    problems = _shape(case, ("comment", "doc", "pointer"), ("value", "error"))
    if problems:
        return problems
    if not isinstance(case["pointer"], str):
        return ["pointer must be a string"]
    try:
        value, error = evaluate(case["doc"], case["pointer"]), None
    except PatchError as e:
        value, error = None, e
    if "value" in case:
        if error is not None:
            return ["expected a value, the reference failed: %s (%s)" % (error.category, error)]
        return [] if json_equal(value, case["value"]) else ["value %s != expected" % dumps(value)]
    if error is None:
        return ["expected error %s, the reference found %s" % (case["error"], dumps(value))]
    if error.category != case["error"]:
        return ["expected error %s, the reference failed with %s" % (case["error"], error.category)]
    return []


def check_diff(case):
    problems = _shape(case, ("comment", "from", "to"), ())
    problems = [p for p in problems if not p.startswith("needs exactly one")]
    if problems:
        return problems
    a, b = case["from"], case["to"]
    if depth(a) > MAX_DEPTH or depth(b) > MAX_DEPTH:
        return ["from or to is deeper than %d" % MAX_DEPTH]
    patch = diff(a, b)
    if (patch == []) != json_equal(a, b):
        return ["the reference diff is %s" % dumps(patch)]
    try:
        result = apply_patch(a, patch)
    except PatchError as e:
        return ["the reference diff does not apply: %s" % e]
    if not json_equal(result, b):
        return ["apply(from, diff(from, to)) != to"]
    return []


def touches(op, path):
    """SPEC.md §16.4, written from its text: whether one operation (as applied: an add at "-" already names the index
    it made) touches the subtree at `path` (tokens). Tokens compare as strings, code point by code point."""
    name = op["op"]
    if name == "test":
        return False
    targets = [parse_pointer(op["path"])]
    if name == "move":
        targets.append(parse_pointer(op["from"]))
    shifts = name in ("add", "remove", "copy", "move")
    for t in targets:
        n = min(len(t), len(path))
        if t[:n] == path[:n]:  # T is P, an ancestor of P, or a descendant of P
            return True
        if shifts and 0 < len(t) <= len(path) and t[:-1] == path[:len(t) - 1]:
            last, mine = t[-1], path[len(t) - 1]
            if ARRAY_INDEX.fullmatch(last) and ARRAY_INDEX.fullmatch(mine) and int(mine) >= int(last):
                return True
    return False


def resolved(doc, patch):
    """The patch's operations as applied to doc: an add at "-" names the index the element got."""
    out = []
    current = copy.deepcopy(doc)
    for op in patch:
        op = dict(op)
        if op["op"] == "add":
            tokens = parse_pointer(op["path"])
            if tokens and tokens[-1] == "-":
                parent = resolve(current, tokens[:-1])
                op["path"] = "".join("/" + escape(t) for t in tokens[:-1]) + "/" + str(len(parent))
        current = apply_op(current, op)
        out.append(op)
    return out


def check_touches(case):
    keys = set(case)
    problems = ["missing %r" % k for k in ("comment", "doc", "patch", "path", "touches") if k not in keys]
    if keys - {"comment", "doc", "patch", "path", "touches"}:
        problems.append("unknown keys %s" % sorted(keys - {"comment", "doc", "patch", "path", "touches"}))
    if problems:
        return problems
    if not isinstance(case["touches"], bool):
        return ["touches must be true or false"]
    try:
        apply_patch(case["doc"], case["patch"])
        ops = resolved(case["doc"], case["patch"])
        path = parse_pointer(case["path"])
    except PatchError as e:
        return ["the patch must apply to doc: %s" % e]
    got = any(touches(op, path) for op in ops)
    if got != case["touches"]:
        return ["the reference says touches %s" % str(got).lower()]
    return []


SECTIONS = (("apply", check_apply), ("pointers", check_pointer), ("diffs", check_diff), ("touches", check_touches))


def check(path=DEFAULT_FILE):
    """[(section, index, comment, problem)] for every failure; [] when the file is consistent."""
    try:
        data = load(path)
    except (OSError, ValueError) as e:
        return [("file", 0, path, str(e))]
    failures = []
    if not isinstance(data, dict) or set(data) != {"description", "apply", "pointers", "diffs", "touches"}:
        return [("file", 0, path, "top level must be an object with description, apply, pointers, diffs, touches")]
    for section, checker in SECTIONS:
        cases = data[section]
        if not isinstance(cases, list):
            failures.append((section, 0, "", "must be an array"))
            continue
        seen = set()
        for i, case in enumerate(cases):
            if not isinstance(case, dict):
                failures.append((section, i, "", "a case is an object"))
                continue
            comment = case.get("comment")
            if comment in seen:
                failures.append((section, i, comment, "comment repeated in this section"))
            seen.add(comment)
            failures += [(section, i, comment, p) for p in checker(case)]
    return failures


def cases(path=DEFAULT_FILE):
    data = load(path)
    return [(s, i, c) for s, _ in SECTIONS for i, c in enumerate(data[s])]


def main(argv):
    verbose = "-v" in argv
    files = [a for a in argv if a != "-v"]
    path = files[0] if files else DEFAULT_FILE
    failures = check(path)
    total = len(cases(path)) if not any(f[0] == "file" for f in failures) else 0
    for section, i, comment, problem in failures:
        print("FAIL %s[%d] %s: %s" % (section, i, comment, problem))
    failed_cases = {(s, i) for s, i, _, _ in failures}
    if verbose and total:
        for s, i, c in cases(path):
            if (s, i) not in failed_cases:
                print("ok   %s[%d] %s" % (s, i, c.get("comment")))
    print("%d passed, %d failed" % (total - len(failed_cases), len(failed_cases) or (1 if failures else 0)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
