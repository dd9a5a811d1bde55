#!/usr/bin/env python3
"""Three-language differential test of JSON Patch (SPEC §16.1): seeded random (document, patch) cases applied by the
Python library (examples/python: fluxbus.number.loads + fluxbus.patch.apply, as a Python client applies a delta),
the Node library (scripts/patch-apply.mjs: parseJSON + applyPatch) and Swift (.build/debug/flux-patch-check:
FluxJSONValue's JSONValue.apply, the Swift libraries', and JSONTree.apply, fluxd's, which it checks against each
other). Every case must have one outcome everywhere: all fail (error texts may differ), or all succeed with
JSON-equal documents (member order aside, numbers by exact decimal value, judged here by a comparison of its own).

The cases: documents of nested objects and arrays with keys such as "", "~", "/", "~1", "01", "-", "__proto__" and
non-ASCII ones, numbers such as 2^53+1, 2^64+1, 40-digit integers, 0.10000000000000001, 1e400, 1e-400, -0 and
1e23; patches of 1-8 operations of all six kinds, mostly against paths that exist as the patch goes (each
operation is drawn against the document the operations before it made), some against paths that do not or cannot
(indexes out of range, with a leading zero, "-" where it is not allowed, bad escapes, no leading "/"), a few
malformed operations, and `test`s of existing values written otherwise (1 as 1.0 or 10e-1, members reordered) or
changed in their last digit.

Usage: python3 scripts/patch-differential.py [--cases N] [--seed S] [--swift PATH] [--require-swift] [--no-shrink]
Without the Swift tool (built by `swift build`), Swift is skipped with a message, unless --require-swift or CI=true.
On a disagreement: prints the seed, the case's index, document, patch and each result, then a smallest patch that
still disagrees (operations left out one at a time), and exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

from fluxbus.number import loads as exact_loads  # noqa: E402
from fluxbus.patch import PatchError, apply as py_apply  # noqa: E402
from fluxbus.wire import dumps as py_dumps  # noqa: E402

NODE_SCRIPT = os.path.join(ROOT, "scripts", "patch-apply.mjs")
DEFAULT_SWIFT = os.path.join(ROOT, ".build", "debug", "flux-patch-check")


# -- JSON text with numbers as written ---------------------------------------------------------------------------

class Num:
    """A number as a JSON text (so a case can spell it as it likes)."""
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def write(value: Any) -> str:
    """JSON text of a generated value (Num written as its text; member order kept)."""
    if isinstance(value, Num):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + write(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def from_exact(value: Any) -> Any:
    """A value parsed by fluxbus.number.loads back into generator form (numbers as Num texts)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {k: from_exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_exact(v) for v in value]
    return Num(py_dumps(value).decode("utf-8"))


# -- the judge: exact JSON equality of its own ---------------------------------------------------------------------

def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r} in a result")
        out[k] = v
    return out


class Exact:
    """A number in a result as the judge reads it: its text and its exact value as (negative, digits, exponent of
    the last digit), zero as (False, "", 0); computed here, apart from the libraries under test."""
    __slots__ = ("text", "key")

    def __init__(self, text: str):
        self.text = text
        mantissa, _, exponent = text.lower().partition("e")
        negative = mantissa.startswith("-")
        whole, _, fraction = mantissa.lstrip("-").partition(".")
        digits = (whole + fraction).lstrip("0")
        stripped = digits.rstrip("0")
        if not stripped:
            self.key: Tuple[bool, str, int] = (False, "", 0)
        else:
            self.key = (negative, stripped, int(exponent or "0") - len(fraction) + len(digits) - len(stripped))


def judge_load(text: str) -> Any:
    return json.loads(text, parse_float=Exact, parse_int=Exact, object_pairs_hook=_no_duplicates)


def canon(value: Any) -> Any:
    """A hashable form equal for JSON-equal values: objects as sorted members, numbers by exact value."""
    if isinstance(value, Exact):
        return ("n", value.key)
    if isinstance(value, dict):
        return ("o", tuple(sorted((k, canon(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("a", tuple(canon(v) for v in value))
    return ("s" if isinstance(value, str) else "l", value)


# -- case generation -------------------------------------------------------------------------------------------

KEYS = ["a", "b", "c", "x", "id", "", "~", "/", "~0", "~1", "a/b", "m~n", "~01", "0", "1", "01", "-", "10",
        "__proto__", "constructor", "length", "toString", "\u00e9", "e\u0301", "\u65e5\u672c", "\U0001F600", " ",
        "\u0000", "\"q\"", "\\"]
SPECIAL_NUMBERS = ["0", "-0", "0.0", "-0.0", "1", "-1", "2", "10", "100", "0.5", "0.1", "1.5", "3.14159", "12.50",
                   "9007199254740992", "9007199254740993", "-9007199254740993", "9223372036854775807",
                   "9223372036854775808", "18446744073709551615", "18446744073709551616", "18446744073709551617",
                   "1234567890123456789012345678901234567890", "0.10000000000000001", "0.30000000000000004",
                   "0.1000000000000000055511151231257827021181583404541015625", "1e23", "100000000000000000000000",
                   "99999999999999991611392", "1e400", "-1e400", "1e-400", "5e-324", "2.2250738585072014e-308",
                   "1.7976931348623157e308", "1.7976931348623159e308", "1e999999999", "123456789.123456789",
                   "1.0000000000000002", "1.00000000000000001", "4.35", "1e-7", "1.5E+3", "6.02214076e23",
                   "1e999999999999999999999999", "-1e-999999999999999999999999"]


def number_text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(SPECIAL_NUMBERS)
    if r < 0.65:
        return str(rng.randint(-1000, 1000))
    if r < 0.75:
        return str(rng.randint(-10 ** rng.randint(15, 30), 10 ** rng.randint(15, 30)))
    if r < 0.9:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 22)))
        point = rng.randint(1, len(digits))
        whole = digits[:point].lstrip("0") or "0"
        frac = digits[point:]
        return ("-" if rng.random() < 0.3 else "") + whole + ("." + frac if frac else "")
    mantissa = str(rng.randint(1, 99999))
    if rng.random() < 0.5:
        mantissa = mantissa[0] + "." + (mantissa[1:] or "0")
    return mantissa + rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.choice([0, 1, 5, 22, 23, 300, 308, 309, 324, 400]))


def respell(text: str, rng: random.Random) -> str:
    """Another JSON spelling of the same exact number: the digits shifted against the exponent, trailing zeros."""
    negative = text.startswith("-")
    body = text[1:] if negative else text
    mantissa, _, exp = body.replace("E", "e").partition("e")
    exponent = int(exp) if exp else 0
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0") or "0"
    exponent -= len(frac)
    if digits == "0":
        out = rng.choice(["0", "0.0", "0e5", "0.000", "0E-3"])
        return ("-" if rng.random() < 0.5 else "") + out
    choice = rng.randint(0, 3)
    if choice == 0:  # d.ddd e n
        text2 = digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + "e" + str(exponent + len(digits) - 1)
    elif choice == 1:  # digits with trailing zeros, exponent lowered
        k = rng.randint(1, 3)
        text2 = digits + "0" * k + "E" + str(exponent - k)
    elif choice == 2 and exponent < 0 and -exponent <= 40:  # plain decimal with extra trailing zeros
        padded = digits.rjust(-exponent + 1, "0")
        text2 = padded[:exponent] + "." + padded[exponent:] + "0" * rng.randint(0, 2)
    elif exponent >= 0 and exponent <= 30:
        text2 = digits + "0" * exponent + (".0" if rng.random() < 0.5 else "")
    else:
        e = exponent + len(digits)
        text2 = "0." + digits + "e" + ("+" if e >= 0 and rng.random() < 0.5 else "") + str(e)
    return ("-" if negative else "") + text2


def perturb(text: str) -> str:
    """A number near `text` that is not equal to it (its last significant digit changed)."""
    negative = text.startswith("-")
    body = text[1:] if negative else text
    mantissa, sep, exp = body.replace("E", "e").partition("e")
    chars = list(mantissa)
    for i in range(len(chars) - 1, -1, -1):
        if chars[i].isdigit():
            chars[i] = "1" if chars[i] != "1" else "2"
            break
    return ("-" if negative else "") + "".join(chars) + (sep + exp if sep else "")


def random_value(rng: random.Random, depth: int) -> Any:
    r = rng.random()
    if depth <= 0 or r < 0.55:
        s = rng.random()
        if s < 0.55:
            return Num(number_text(rng))
        if s < 0.8:
            return rng.choice(KEYS + ["hello", "1", "true", "null"])
        if s < 0.9:
            return rng.choice([True, False])
        return None
    if r < 0.78:
        return {rng.choice(KEYS): random_value(rng, depth - 1) for _ in range(rng.randint(0, 4))}
    return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 4))]


def respelled(value: Any, rng: random.Random) -> Any:
    """`value` written otherwise but JSON-equal: numbers respelled, members reordered."""
    if isinstance(value, Num):
        return Num(respell(value.text, rng))
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: respelled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [respelled(v, rng) for v in value]
    return value


def changed(value: Any, rng: random.Random) -> Any:
    """`value` with one small change (a number's last digit, a member, an element, a type)."""
    if isinstance(value, Num):
        return Num(perturb(value.text))
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        out = dict(value)
        if rng.random() < 0.7:
            out[key] = changed(value[key], rng)
        else:
            del out[key]
        return out
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        out = list(value)
        out[i] = changed(value[i], rng)
        return out
    return rng.choice([Num("0"), "0", None, False, [], {}])


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def locations(doc: Any, prefix: str = "", out: Optional[List[Tuple[str, Any]]] = None) -> List[Tuple[str, Any]]:
    """Every (pointer, value) in `doc`, the root included."""
    if out is None:
        out = []
    out.append((prefix, doc))
    if isinstance(doc, dict):
        for k, v in doc.items():
            locations(v, prefix + "/" + escape(k), out)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            locations(v, f"{prefix}/{i}", out)
    return out


def random_path(rng: random.Random, doc: Any, for_add: bool) -> str:
    """A pointer into `doc`: mostly one that exists (or, for add, a new member or index), sometimes not."""
    locs = locations(doc)
    r = rng.random()
    if r < 0.65:
        return rng.choice(locs[1:] or locs)[0]
    containers = [(p, v) for p, v in locs if isinstance(v, (dict, list))]
    if r < 0.92 and containers:
        p, v = rng.choice(containers)
        if isinstance(v, dict):
            return p + "/" + escape(rng.choice(KEYS))
        n = len(v)
        token = rng.choice([str(n), "-", str(n + 1), "0", "01", "00", "-1", "1e0", " 1", "+1", str(max(0, n - 1)),
                            "99999999999999999999", "1.0", ""] if for_add or rng.random() < 0.5 else [str(n), "-", "0"])
        return p + "/" + token
    bad = ["a", "/~2", "/a~", "//", "/a/", "#/a", "/-/a", "/0/-", " /a", "/\u00e9/e\u0301"]
    return rng.choice(bad + [rng.choice(locs)[0] + "/" + escape(rng.choice(KEYS))])


def random_op(rng: random.Random, doc: Any) -> Any:
    r = rng.random()
    if r < 0.03:  # malformed operations
        return rng.choice([
            {"op": "add", "path": "/a"}, {"op": "copy", "path": "/a"}, {"op": "move", "path": "/a", "from": Num("1")},
            {"op": "frobnicate", "path": "/a", "value": Num("1")}, {"path": "/a", "value": Num("1")},
            {"op": "remove", "path": Num("0")}, {"op": "test", "path": "/a"}, "add", [], {"op": None, "path": ""},
            {"op": "replace", "path": "", "value": None, "extra": [Num("1")]}, {"op": "remove", "path": ""},
        ])
    kind = rng.choice(["add", "add", "remove", "replace", "move", "copy", "test", "test", "test"])
    if kind == "test":
        locs = locations(doc)
        path, value = rng.choice(locs)
        s = rng.random()
        if s < 0.6:
            value = respelled(value, rng)
        elif s < 0.88:
            value = changed(value, rng)
        else:
            path = random_path(rng, doc, False)
            value = respelled(value, rng) if rng.random() < 0.5 else random_value(rng, 2)
        return {"op": "test", "path": path, "value": value}
    if kind in ("add", "replace"):
        return {"op": kind, "path": random_path(rng, doc, kind == "add"), "value": random_value(rng, 3)}
    if kind == "remove":
        return {"op": "remove", "path": random_path(rng, doc, False)}
    source = random_path(rng, doc, False) if rng.random() < 0.2 else rng.choice(locations(doc))[0]
    return {"op": kind, "from": source, "path": random_path(rng, doc, True)}


def deep_value(depth: int) -> Any:
    value: Any = [Num("1")]
    for _ in range(depth - 1):
        value = [value]
    return value


def random_case(rng: random.Random) -> Tuple[Any, List[Any]]:
    r = rng.random()
    if r < 0.02:  # near §3.2's depth limit: copies into itself may make 65
        doc: Any = {"a": deep_value(rng.randint(28, 33))}
    elif r < 0.1:
        doc = random_value(rng, 1)
    else:
        doc = random_value(rng, rng.randint(1, 4))
        if rng.random() < 0.7:
            doc = {rng.choice(KEYS): random_value(rng, 3) for _ in range(rng.randint(1, 5))}
    patch: List[Any] = []
    current = doc
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4, 5, 6, 8])):
        op = random_op(rng, current)
        patch.append(op)
        try:  # the next operation is drawn against what this one made (when it applies)
            current = from_exact(py_apply(exact_loads(write(current)), exact_loads(write([op]))))
        except (PatchError, ValueError, TypeError):
            pass
    return doc, patch


# -- the three implementations ---------------------------------------------------------------------------------

STATS: Dict[str, int] = {}


def _count(patch: Any, failed_at: Optional[int]) -> None:
    """Counts the operations Python applied and the one that failed, by kind (the summary line)."""
    if not isinstance(patch, list):
        return
    for i, op in enumerate(patch[:len(patch) if failed_at is None else failed_at + 1]):
        kind = op.get("op") if isinstance(op, dict) and isinstance(op.get("op"), str) else "malformed"
        key = f"{kind} {'failed' if i == failed_at else 'applied'}"
        STATS[key] = STATS.get(key, 0) + 1


def run_python(lines: List[str]) -> List[Dict[str, Any]]:
    results = []
    for line in lines:
        case = exact_loads(line)
        try:
            doc = py_apply(case["doc"], case["patch"])
        except PatchError as error:
            results.append({"ok": False, "error": str(error)})
            _count(case["patch"], error.index if error.index is not None else -1)
            continue
        except Exception as error:  # noqa: BLE001 (any other exception is a bug)
            results.append({"ok": False, "crash": f"{type(error).__name__}: {error}"})
            continue
        _count(case["patch"], None)
        results.append({"ok": True, "doc": judge_load(py_dumps(doc).decode("utf-8"))})
    return results


def run_process(command: List[str], lines: List[str], name: str) -> List[Dict[str, Any]]:
    done = subprocess.run(command, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{name} ({' '.join(command)}) exited {done.returncode}:\n{done.stderr[-2000:]}")
    out = done.stdout.splitlines()
    if len(out) != len(lines):
        raise SystemExit(f"{name} answered {len(out)} lines for {len(lines)} cases:\n{done.stderr[-2000:]}")
    results = []
    for text in out:
        result = judge_load(text)
        if result.get("ok") is True:
            results.append({"ok": True, "doc": result.get("doc")})
        elif "crash" in result:
            results.append({"ok": False, "crash": result["crash"]})
        else:
            error = str(result.get("error"))
            key = "crash" if error.startswith("internal disagreement") or error.startswith("unreadable") else "error"
            results.append({"ok": False, key: error})
    return results


def disagreement(results: Dict[str, Dict[str, Any]]) -> Optional[str]:
    """Why the results disagree, or None when they agree."""
    crashes = [f"{name}: {r['crash'].splitlines()[0][:300]}" for name, r in results.items() if "crash" in r]
    if crashes:
        return "; ".join(crashes)
    outcomes = {name: r["ok"] for name, r in results.items()}
    if len(set(outcomes.values())) > 1:
        return "success and failure: " + ", ".join(f"{n} {'applied' if ok else 'failed'}" for n, ok in outcomes.items())
    docs = {name: canon(r["doc"]) for name, r in results.items() if r["ok"]}
    if len(set(docs.values())) > 1:
        return "different documents"
    return None


def show(value: Any) -> str:
    if isinstance(value, Exact):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + show(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(show(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--swift", default=DEFAULT_SWIFT, help="flux-patch-check (default: .build/debug/)")
    parser.add_argument("--require-swift", action="store_true", help="fail when the Swift tool is missing "
                        "(the default under CI=true)")
    parser.add_argument("--node", default="node")
    parser.add_argument("--no-shrink", action="store_true", help="do not look for a smaller disagreeing patch")
    args = parser.parse_args()
    started = time.monotonic()

    implementations: Dict[str, Any] = {"python": run_python,
                                       "node": lambda lines: run_process([args.node, NODE_SCRIPT], lines, "node")}
    require_swift = args.require_swift or os.environ.get("CI") == "true"
    if os.access(args.swift, os.X_OK):
        implementations["swift"] = lambda lines: run_process([args.swift], lines, "swift")
    elif require_swift:
        print(f"patch-differential: the Swift tool {args.swift} is missing (build it: swift build --product "
              "flux-patch-check); required (--require-swift or CI=true)", file=sys.stderr)
        return 1
    else:
        print(f"patch-differential: SKIPPING Swift: {args.swift} is missing (swift build --product flux-patch-check; "
              "--require-swift to fail instead)")

    rng = random.Random(args.seed)
    cases = [random_case(rng) for _ in range(args.cases)]
    lines = [write({"doc": doc, "patch": patch}) for doc, patch in cases]
    generated = time.monotonic()

    def run_all(batch: List[str]) -> Dict[str, List[Dict[str, Any]]]:
        return {name: run(batch) for name, run in implementations.items()}

    outputs = run_all(lines)
    stats = dict(STATS)
    failures = 0
    applied = 0
    for index, line in enumerate(lines):
        results = {name: out[index] for name, out in outputs.items()}
        applied += results["python"]["ok"]
        why = disagreement(results)
        if why is None:
            continue
        failures += 1
        if failures > 5:
            continue
        doc, patch = cases[index]
        print(f"DISAGREEMENT (seed {args.seed}, case {index}): {why}")
        print(f"  doc:   {write(doc)}")
        print(f"  patch: {write(patch)}")
        for name, r in results.items():
            text = (f"applied: {show(r['doc'])}" if r["ok"] else f"failed: {r['error']}" if "error" in r
                    else "CRASHED: " + " | ".join(r["crash"].splitlines()[:3]))
            print(f"  {name}: " + (text if len(text) <= 2000 else text[:2000] + " ..."))
        if not args.no_shrink and failures == 1 and len(patch) > 1:
            smallest = list(patch)
            i = 0
            while i < len(smallest) and len(smallest) > 1:
                candidate = smallest[:i] + smallest[i + 1:]
                again = run_all([write({"doc": doc, "patch": candidate})])
                if disagreement({n: out[0] for n, out in again.items()}) is not None:
                    smallest = candidate
                else:
                    i += 1
            if len(smallest) < len(patch):
                print(f"  smallest patch that still disagrees: {write(smallest)}")
    elapsed = time.monotonic() - started
    names = ", ".join(implementations)
    if failures:
        print(f"patch-differential: {failures} of {len(lines)} cases disagree ({names}; seed {args.seed}; "
              f"{elapsed:.1f} s)")
        return 1
    print(f"patch-differential: {len(lines)} cases agree ({names}; seed {args.seed}): {applied} applied, "
          f"{len(lines) - applied} failed alike; {elapsed:.1f} s ({generated - started:.1f} s generating)")
    print("  operations (as Python ran them): " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
