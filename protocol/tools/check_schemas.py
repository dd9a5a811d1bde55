#!/usr/bin/env python3
"""Checks the FluxBus protocol schemas and their example messages.

For every protocol/schemas/*.schema.json: it must be a valid JSON Schema (draft 2020-12) and carry the metadata
SPEC.md §14 requires (title, description, x-direction, x-since, additionalProperties: true, a const op), its file
name must be <op>.<direction>.schema.json, and index.json must list it. For every
protocol/vectors/messages/<stem>.json: each "valid" example must pass its schema and each "invalid" one must
fail it; each "invalidBySpecOnly" one (optional: what SPEC.md rejects but JSON Schema cannot express, such as byte
lengths and integers written with a fraction) must pass it, or it belongs in "invalid".

Usage: python3 protocol/tools/check_schemas.py [-v]
Prints one line per failure (and per check with -v), then a final line "N passed, M failed"; exits 1 on failure.
Needs Python 3 and the jsonschema package (pip install jsonschema).
"""
import json
import os
import sys

try:
    import jsonschema
    from jsonschema import Draft202012Validator
except ImportError:
    print("check_schemas.py needs the 'jsonschema' package: pip install jsonschema (or apt install python3-jsonschema)",
          file=sys.stderr)
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
SCHEMAS = os.path.join(ROOT, "schemas")
MESSAGES = os.path.join(ROOT, "vectors", "messages")
DIRECTIONS = {"c2d", "s2d", "d2c"}

passed = 0
failed = 0
verbose = "-v" in sys.argv[1:]


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        if verbose:
            print(f"ok    {what}")
    else:
        failed += 1
        print(f"FAIL  {what}")
    return ok


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main():
    index = load(os.path.join(SCHEMAS, "index.json"))
    listed = {e["file"]: e for e in index.get("schemas", [])}
    check(index.get("protocol") == 1, "index.json: protocol is 1")
    files = sorted(f for f in os.listdir(SCHEMAS) if f.endswith(".schema.json"))
    check(set(files) == set(listed), f"index.json lists exactly the schema files "
          f"(missing {sorted(set(files) - set(listed))}, extra {sorted(set(listed) - set(files))})")

    for name in files:
        stem = name[: -len(".schema.json")]
        op, _, direction = stem.rpartition(".")
        try:
            schema = load(os.path.join(SCHEMAS, name))
        except (OSError, ValueError) as e:
            check(False, f"{name}: readable JSON ({e})")
            continue
        try:
            Draft202012Validator.check_schema(schema)
            check(True, f"{name}: valid draft 2020-12 schema")
        except jsonschema.exceptions.SchemaError as e:
            check(False, f"{name}: valid draft 2020-12 schema: {e.message}")
            continue
        check(schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema", f"{name}: $schema is draft 2020-12")
        check(direction in DIRECTIONS, f"{name}: direction '{direction}' is one of {sorted(DIRECTIONS)}")
        check(schema.get("x-direction") == direction, f"{name}: x-direction matches the file name")
        check(schema.get("x-since") == 1, f"{name}: x-since is 1")
        check(isinstance(schema.get("title"), str) and schema["title"], f"{name}: has a title")
        desc = schema.get("description", "")
        check("protocol 1" in desc and "Sent by" in desc, f"{name}: description says who sends it and since when")
        check(schema.get("additionalProperties") is True, f"{name}: additionalProperties is true")
        check(schema.get("properties", {}).get("op") == {"const": op}, f"{name}: op is const '{op}'")
        check("op" in schema.get("required", []), f"{name}: op is required")
        entry = listed.get(name, {})
        check(entry.get("op") == op and entry.get("direction") == direction, f"{name}: index.json entry has op and direction")

        validator = Draft202012Validator(schema)
        mpath = os.path.join(MESSAGES, stem + ".json")
        if not check(os.path.exists(mpath), f"{name}: has examples in vectors/messages/{stem}.json"):
            continue
        examples = load(mpath)
        check(len(examples.get("valid", [])) >= 1 and len(examples.get("invalid", [])) >= 1,
              f"{stem}.json: at least one valid and one invalid example")
        for i, msg in enumerate(examples.get("valid", [])):
            errors = sorted(validator.iter_errors(msg), key=lambda e: list(e.path))
            check(not errors, f"{stem}.json valid[{i}] passes" + (f": {errors[0].message}" if errors else ""))
        for i, msg in enumerate(examples.get("invalid", [])):
            check(not validator.is_valid(msg), f"{stem}.json invalid[{i}] fails: {json.dumps(msg)[:120]}")
        for i, msg in enumerate(examples.get("invalidBySpecOnly", [])):
            errors = sorted(validator.iter_errors(msg), key=lambda e: list(e.path))
            check(not errors, f"{stem}.json invalidBySpecOnly[{i}] passes the schema (only SPEC.md rejects it)"
                  + (f": {errors[0].message}; move it to \"invalid\"" if errors else ""))

    for name in sorted(os.listdir(MESSAGES)):
        if name.endswith(".json"):
            check(name[: -len(".json")] + ".schema.json" in files, f"vectors/messages/{name} belongs to a schema")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
