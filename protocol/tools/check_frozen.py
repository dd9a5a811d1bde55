#!/usr/bin/env python3
"""Compatibility contract check (SPEC.md §13): the schemas in protocol/schemas against the frozen protocol-1
copies in protocol/frozen/v1.

Within protocol 1 a schema may only grow: new optional properties (at any depth), new schema files, changed
annotations (description, title, examples, $comment). Everything else is an incompatible change that needs
protocol 2 and is reported: a removed or renamed schema file or property, a retyped property, a changed or added
or removed constraint (type, const, enum, pattern, bounds, items, ...), a property made required or no longer
required, additionalProperties no longer true, a changed x-direction or x-since.

Usage: python3 protocol/tools/check_frozen.py [--schemas DIR] [--frozen DIR]   (exit 1 on any problem)
To freeze a new protocol version, copy the schemas to protocol/frozen/v<N>/ when SPEC.md declares it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL = os.path.dirname(HERE)
ANNOTATIONS = {"description", "title", "examples", "$comment"}
GROWABLE_MAPS = {"properties", "$defs", "definitions", "patternProperties"}


def compare(frozen: Any, current: Any, where: str) -> List[str]:
    """Problems that make ``current`` incompatible with ``frozen`` (empty when compatible)."""
    if isinstance(frozen, dict) and isinstance(current, dict):
        problems: List[str] = []
        for key in sorted(set(frozen) | set(current)):
            if key in ANNOTATIONS:
                continue
            here = f"{where}/{key}"
            if key not in current:
                problems.append(f"{here}: removed")
            elif key not in frozen:
                problems.append(f"{here}: added (only new optional properties may be added)")
            elif key in GROWABLE_MAPS and isinstance(frozen[key], dict) and isinstance(current[key], dict):
                for name in sorted(frozen[key]):
                    if name not in current[key]:
                        problems.append(f"{here}/{name}: removed or renamed")
                    else:
                        problems.extend(compare(frozen[key][name], current[key][name], f"{here}/{name}"))
            elif key == "required" and isinstance(frozen[key], list) and isinstance(current[key], list):
                added = sorted(set(current[key]) - set(frozen[key]))
                removed = sorted(set(frozen[key]) - set(current[key]))
                if added:
                    problems.append(f"{here}: newly required {added}")
                if removed:
                    problems.append(f"{here}: no longer required {removed}")
            else:
                problems.extend(compare(frozen[key], current[key], here))
        return problems
    if isinstance(frozen, list) and isinstance(current, list):
        if len(frozen) != len(current):
            return [f"{where}: changed from {json.dumps(frozen)} to {json.dumps(current)}"]
        problems = []
        for i, (f, c) in enumerate(zip(frozen, current)):
            problems.extend(compare(f, c, f"{where}[{i}]"))
        return problems
    if type(frozen) is not type(current) or frozen != current:
        return [f"{where}: changed from {json.dumps(frozen)} to {json.dumps(current)}"]
    return []


def check(schemas_dir: str, frozen_dir: str) -> List[str]:
    """Every incompatibility between the schema directory and the frozen one."""
    problems: List[str] = []
    frozen_files = sorted(f for f in os.listdir(frozen_dir) if f.endswith(".json"))
    if not frozen_files:
        return [f"{frozen_dir}: no frozen schemas"]
    for name in frozen_files:
        current_path = os.path.join(schemas_dir, name)
        if not os.path.exists(current_path):
            problems.append(f"{name}: removed or renamed")
            continue
        with open(os.path.join(frozen_dir, name), encoding="utf-8") as f:
            frozen = json.load(f)
        with open(current_path, encoding="utf-8") as f:
            current = json.load(f)
        if name == "index.json":
            current_entries = {(e["op"], e["direction"]): e for e in current.get("schemas", [])}
            for entry in frozen.get("schemas", []):
                now = current_entries.get((entry["op"], entry["direction"]))
                if now is None:
                    problems.append(f"index.json: {entry['op']}.{entry['direction']} removed")
                elif now.get("file") != entry.get("file") or now.get("since") != entry.get("since"):
                    problems.append(f"index.json: {entry['op']}.{entry['direction']} changed")
            if current.get("protocol") != frozen.get("protocol"):
                problems.append("index.json: protocol changed")
            continue
        if current.get("additionalProperties", True) is not True:
            problems.append(f"{name}: additionalProperties must stay true (receivers ignore unknown fields)")
        problems.extend(f"{name}: {p}" for p in compare(frozen, current, ""))
    return problems


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description="Checks protocol/schemas against the frozen protocol-1 schemas.")
    parser.add_argument("--schemas", default=os.path.join(PROTOCOL, "schemas"))
    parser.add_argument("--frozen", default=os.path.join(PROTOCOL, "frozen", "v1"))
    args = parser.parse_args(argv)
    problems = check(args.schemas, args.frozen)
    for p in problems:
        print(f"INCOMPATIBLE {p}")
    count = len([f for f in os.listdir(args.frozen) if f.endswith(".json")])
    if problems:
        print(f"check_frozen: {len(problems)} incompatible change(s) against {args.frozen} (needs protocol 2, SPEC §13)")
        return 1
    print(f"check_frozen: {count} frozen protocol-1 files, schemas compatible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
