"""fluxbus.protocol against protocol/: ops and directions from schemas/index.json, roles and statuses from the
schemas' enums, error codes from the first column of the table in SPEC.md §11; and every code has its class."""
import json
import os
import re

import pytest

from conftest import REPO
import fluxbus
from fluxbus import errors, protocol

PROTOCOL = os.path.join(REPO, "protocol")


def schema(name):
    with open(os.path.join(PROTOCOL, "schemas", name), encoding="utf-8") as f:
        return json.load(f)


def spec_error_codes():
    """The first column of the table in SPEC.md §11, in order."""
    with open(os.path.join(PROTOCOL, "SPEC.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## 11\..*?(?=^## 12\.)", text, re.S | re.M)
    assert section, "SPEC.md has no section 11"
    codes = re.findall(r"^\| `([^`]+)` \|", section.group(0), re.M)
    assert len(codes) >= 20, f"the §11 table was not found (parsed {codes})"
    return codes


def test_ops_and_directions_match_the_schema_index():
    index = schema("index.json")
    assert index["protocol"] == protocol.PROTOCOL_VERSION
    theirs = {(entry["op"], entry["direction"]) for entry in index["schemas"]}
    ours = {(op, direction) for direction, ops in protocol.OPS_BY_DIRECTION.items() for op in ops}
    assert ours == theirs, f"only here: {sorted(ours - theirs)}; only in index.json: {sorted(theirs - ours)}"
    named = {value for key, value in vars(protocol.Op).items() if key.isupper()}
    assert named == {op for op, _ in theirs}


def test_error_codes_match_the_spec_table():
    assert list(protocol.ERROR_CODES) == spec_error_codes()
    named = [value for key, value in vars(protocol.ErrorCode).items() if key.isupper()]
    assert named == list(protocol.ERROR_CODES)


def test_roles_and_statuses_match_the_schema_enums():
    assert list(protocol.ROLES) == schema("hello.c2d.schema.json")["properties"]["role"]["enum"]
    assert list(protocol.STORE_STATUSES) == schema("subscribed.d2c.schema.json")["properties"]["status"]["enum"]
    result = schema("settled.d2c.schema.json")["properties"]["results"]["items"]["properties"]["status"]
    assert list(protocol.RESULT_STATUSES) == result["enum"]
    worker = schema("worker.d2c.schema.json")["properties"]["worker"]["properties"]["state"]
    assert list(protocol.WORKER_STATES) == worker["enum"]
    outcome = schema("recovered.d2c.schema.json")["properties"]["outcomes"]["items"]["properties"]["status"]
    assert list(protocol.RECOVER_STATUSES) == outcome["enum"]
    assert list(protocol.DURABILITY_MODES) == schema("welcome.d2c.schema.json")["properties"]["durability"]["enum"]
    assert protocol.BYE_RESTART in schema("bye.d2c.schema.json")["properties"]["reason"]["examples"]


@pytest.mark.parametrize("code", spec_error_codes())
def test_every_spec_code_has_its_own_class(code):
    cls = errors.error_class(code)
    assert cls is not errors.FluxError and issubclass(cls, errors.FluxError)
    assert cls.default_code == code
    assert getattr(fluxbus, cls.__name__) is cls  # exported from the package
    error = errors.FluxError.from_frame({"op": "error", "code": code, "message": "m", "fatal": True, "ref": "r-1"})
    assert type(error) is cls
    assert (error.code, error.message, error.fatal, error.ref) == (code, "m", True, "r-1")


def test_classes_are_distinct_and_unknown_codes_are_generic():
    classes = [errors.error_class(code) for code in protocol.ERROR_CODES]
    assert len(set(classes)) == len(classes)
    assert set(errors.ERROR_CLASSES) == set(protocol.ERROR_CODES)
    unknown = errors.FluxError.from_frame({"op": "error", "code": "from-the-future", "message": "new", "fatal": False})
    assert type(unknown) is errors.FluxError and unknown.code == "from-the-future" and not unknown.fatal
