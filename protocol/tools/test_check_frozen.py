"""The compatibility checker catches every incompatible kind of change and lets compatible growth through."""
import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_frozen  # noqa: E402

PROTOCOL = check_frozen.PROTOCOL


def test_current_schemas_match_the_frozen_ones():
    assert check_frozen.check(os.path.join(PROTOCOL, "schemas"), os.path.join(PROTOCOL, "frozen", "v1")) == []


@pytest.fixture
def copy(tmp_path):
    target = tmp_path / "schemas"
    shutil.copytree(os.path.join(PROTOCOL, "frozen", "v1"), target)

    def edit(name, change):
        path = target / name
        schema = json.loads(path.read_text())
        change(schema)
        path.write_text(json.dumps(schema))
        return check_frozen.check(str(target), os.path.join(PROTOCOL, "frozen", "v1"))
    return edit


def test_compatible_growth_passes(copy, tmp_path):
    def grow(s):
        s["properties"]["trace"] = {"type": "string"}
        s["description"] = "reworded"
    assert copy("dispatch.c2d.schema.json", grow) == []
    (tmp_path / "schemas" / "future-op.d2c.schema.json").write_text("{}")
    assert check_frozen.check(str(tmp_path / "schemas"), os.path.join(PROTOCOL, "frozen", "v1")) == []


@pytest.mark.parametrize("name,change,expected", [
    ("dispatch.c2d.schema.json", lambda s: s["properties"].pop("cause"), "removed or renamed"),
    ("dispatch.c2d.schema.json", lambda s: s["properties"].__setitem__("kind", s["properties"].pop("type")), "removed or renamed"),
    ("settled.d2c.schema.json", lambda s: s["properties"]["seq"].__setitem__("type", "string"), "changed"),
    ("hello.c2d.schema.json", lambda s: s["required"].append("name"), "newly required"),
    ("hello.c2d.schema.json", lambda s: s["required"].remove("role"), "no longer required"),
    ("hello.c2d.schema.json", lambda s: s.__setitem__("additionalProperties", False), "additionalProperties"),
    ("hello.c2d.schema.json", lambda s: s["properties"]["role"]["enum"].append("admin"), "changed"),
    ("hello.c2d.schema.json", lambda s: s.__setitem__("x-since", 2), "changed"),
])
def test_incompatible_changes_are_caught(copy, name, change, expected):
    problems = copy(name, change)
    assert problems and any(expected in p for p in problems), problems


def test_a_removed_schema_file_is_caught(tmp_path):
    target = tmp_path / "schemas"
    shutil.copytree(os.path.join(PROTOCOL, "frozen", "v1"), target)
    os.remove(target / "pong.d2c.schema.json")
    assert any("pong.d2c.schema.json: removed" in p for p in
               check_frozen.check(str(target), os.path.join(PROTOCOL, "frozen", "v1")))
