"""protocol/vectors/patch.json is consistent (every case holds against the reference in check_patch_vectors.py),
covers what SPEC.md §16.1 asks, and the checker catches a wrong case."""
import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_patch_vectors as cpv  # noqa: E402

DATA = cpv.load(cpv.DEFAULT_FILE)
CHECKERS = {"apply": cpv.check_apply, "pointers": cpv.check_pointer, "diffs": cpv.check_diff}


def test_the_whole_file_checks():
    assert cpv.check() == []


@pytest.mark.parametrize("section,index", [(s, i) for s in CHECKERS for i in range(len(DATA[s]))],
                         ids=lambda v: str(v))
def test_case(section, index):
    case = DATA[section][index]
    assert CHECKERS[section](case) == [], case["comment"]


def test_coverage():
    assert len(DATA["apply"]) >= 120 and len(DATA["pointers"]) >= 25 and len(DATA["diffs"]) >= 25
    ops = {op.get("op") for c in DATA["apply"] for op in c["patch"] if isinstance(op, dict)}
    assert cpv.OPS <= ops
    assert {c["error"] for c in DATA["apply"] if "error" in c} == cpv.CATEGORIES
    assert {"not-found", "index", "invalid-pointer"} <= {c["error"] for c in DATA["pointers"] if "error" in c}
    # every operation has both passing and failing cases
    for name in cpv.OPS:
        outcomes = {"expected" in c for c in DATA["apply"] if any(isinstance(o, dict) and o.get("op") == name
                                                                 for o in c["patch"])}
        assert outcomes == {True, False}, name
    # equal pairs (an empty diff) and unequal ones
    assert {cpv.json_equal(c["from"], c["to"]) for c in DATA["diffs"]} == {True, False}


def test_reference_equality():
    eq = cpv.json_equal
    assert eq(1, 1.0) and eq({"a": 1, "b": [2]}, {"b": [2.0], "a": 1}) and eq(-0.0, 0)
    d = cpv.decimal.Decimal
    assert eq(d("1e0"), 1) and eq(d("10e-1"), 1.0) and eq(d("1e400"), d("10e399")) and eq(10 ** 23, 1e23)
    assert not eq(2 ** 53 + 1, 2 ** 53) and not eq(d("0.10000000000000001"), 0.1) and not eq(99999999999999991611392, 1e23)
    assert not eq(True, 1) and not eq(0, False) and not eq(None, False) and not eq([1, 2], [2, 1])
    assert not eq("\u00e9", "e\u0301") and not eq({}, []) and not eq({"a": None}, {})


def write(tmp_path, mutate):
    data = copy.deepcopy(DATA)
    mutate(data)
    path = tmp_path / "patch.json"
    path.write_text(cpv.dumps(data), encoding="utf-8")
    return cpv.check(str(path))


def first(data, section, predicate):
    return next(c for c in data[section] if predicate(c))


@pytest.mark.parametrize("what,mutate", [
    ("a wrong expected result",
     lambda d: first(d, "apply", lambda c: c["comment"].startswith("RFC 6902 A.1:")).__setitem__("expected", {})),
    ("a success expected where the patch fails",
     lambda d: first(d, "apply", lambda c: c.get("error") == "test-failed").update(expected=None)
     or first(d, "apply", lambda c: c.get("expected", 0) is None and "error" in c).pop("error")),
    ("an error expected where the patch applies",
     lambda d: d["apply"].append({"comment": "x", "doc": {}, "patch": [{"op": "add", "path": "/a", "value": 1}],
                                  "error": "not-found"})),
    ("the wrong category",
     lambda d: first(d, "apply", lambda c: c.get("error") == "index").__setitem__("error", "not-found")),
    ("an unknown category",
     lambda d: first(d, "apply", lambda c: c.get("error") == "index").__setitem__("error", "out-of-range")),
    ("both expected and error",
     lambda d: first(d, "apply", lambda c: "expected" in c).__setitem__("error", "index")),
    ("a repeated comment", lambda d: d["apply"].append(dict(d["apply"][0]))),
    ("a wrong pointer value",
     lambda d: first(d, "pointers", lambda c: c.get("value") == 8).__setitem__("value", "8")),
    ("a pointer error that is not one",
     lambda d: first(d, "pointers", lambda c: c["pointer"] == "/a~1b").__setitem__("error", "not-found")
     or first(d, "pointers", lambda c: c["pointer"] == "/a~1b").pop("value")),
    ("a diffs pair too deep",
     lambda d: d["diffs"].append({"comment": "deep", "from": {}, "to": json.loads("[" * 65 + "]" * 65)})),
    ("an unknown key in a case", lambda d: d["diffs"][0].__setitem__("expected", [])),
    ("a missing section", lambda d: d.pop("diffs")),
])
def test_the_checker_catches(tmp_path, what, mutate):
    assert write(tmp_path, mutate) != [], what


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": 1, "a": 2}'])
def test_the_checker_rejects_json_parsers_disagree_on(tmp_path, text):
    body = cpv.dumps(DATA)
    path = tmp_path / "patch.json"
    path.write_text(body.replace('"doc": {"foo": "bar"}', '"doc": ' + text, 1), encoding="utf-8")
    assert text not in body and '"doc": ' + text in path.read_text(encoding="utf-8")
    assert cpv.check(str(path)) != []
