"""The shared patch vectors (``protocol/vectors/patch.json``, SPEC §16.1): every apply, pointer and diff case. The
file is read with exact numbers (``fluxbus.number.loads``, as frames are), since its numbers compare exactly."""
import copy
import os

import pytest

from conftest import VECTORS
from fluxbus.number import loads
from fluxbus.patch import PatchError, apply, diff, json_equal, resolve
from fluxbus.wire import dumps

PATH = os.path.join(VECTORS, "patch.json")


def load():
    if not os.path.exists(PATH):
        pytest.fail(f"the shared patch vectors are missing: {PATH} (SPEC §16.1)")
    with open(PATH, encoding="utf-8") as f:
        return loads(f.read())


def cases(kind):
    if not os.path.exists(PATH):
        return [pytest.param(None, id="vectors-missing")]
    return [pytest.param(case, id=f"{i}-{case.get('comment', '')[:60]}") for i, case in enumerate(load()[kind])]


def test_the_vectors_exist_and_are_not_empty():
    vectors = load()
    for kind in ("apply", "pointers", "diffs"):
        assert vectors.get(kind), f"patch.json has no {kind!r} cases"


@pytest.mark.parametrize("case", cases("apply"))
def test_apply(case):
    vectors = load()  # fails clearly when missing
    assert vectors
    doc = case["doc"]
    before = copy.deepcopy(doc)
    if "error" in case:
        with pytest.raises(PatchError):
            apply(doc, case["patch"])
    else:
        result = apply(doc, case["patch"])
        assert json_equal(result, case["expected"]), f"got {result!r}"
    assert dumps(doc) == dumps(before), "apply modified its input"


@pytest.mark.parametrize("case", cases("pointers"))
def test_pointer(case):
    assert load()
    if "error" in case:
        with pytest.raises(PatchError):
            resolve(case["doc"], case["pointer"])
    else:
        assert json_equal(resolve(case["doc"], case["pointer"]), case["value"])


@pytest.mark.parametrize("case", cases("diffs"))
def test_diff(case):
    assert load()
    old, new = case["from"], case["to"]
    before = copy.deepcopy(old)
    patch = diff(old, new)
    dumps(patch)  # a patch is JSON
    assert json_equal(apply(old, patch), new), f"diff gave {patch!r}"
    assert json_equal(old, before)
    assert diff(old, copy.deepcopy(old)) == []
