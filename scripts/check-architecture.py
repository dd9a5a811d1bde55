#!/usr/bin/env python3
"""docs/ARCHITECTURE.md's module list against the tree (issue 26: it named modules that were gone and missed two).

Every folder of Sources/ must be named in the first code block under "## Modules and the direction of
dependencies", and every module name there must be a folder of Sources/. Exit 1 naming what differs.
    scripts/check-architecture.py [--self-test]
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NAME = re.compile(r"\b(?:Flux[A-Za-z]+|flux[a-z-]*|C[A-Z][A-Za-z]+)\b")


def named_modules(text):
    section = text[text.index("## Modules and the direction of dependencies"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    names = set()
    for line in block.splitlines():
        # A module is named at the start of a line or after a "+--" branch, before its description; a line may
        # list several, separated by commas (C shims, the benchmark executables).
        head = re.match(r"^[\s|+\-]*([A-Za-z][\w-]*(?:,\s*[A-Za-z][\w-]*)*)", line)
        if head:
            names.update(n.strip() for n in head.group(1).split(","))
    return {n for n in names if NAME.fullmatch(n)}


def check(text, folders):
    named = named_modules(text)
    problems = [f"Sources/{f} is not named in docs/ARCHITECTURE.md's module list" for f in sorted(folders - named)]
    problems += [f"docs/ARCHITECTURE.md names {n}, which is not a folder of Sources/" for n in sorted(named - folders)]
    return problems


def self_test():
    doc = "## Modules and the direction of dependencies\n\n```\nFluxCore  core\n  +-- FluxGone  old\n" \
          "  +-- CLibUV, CFluxSys   shims\nfluxd-exec  helper\n```\n"
    assert check(doc, {"FluxCore", "CLibUV", "CFluxSys", "fluxd-exec"}) == [
        "docs/ARCHITECTURE.md names FluxGone, which is not a folder of Sources/"], check(doc, set())
    assert check(doc, {"FluxCore", "FluxGone", "CLibUV", "CFluxSys", "fluxd-exec", "FluxNew"}) == [
        "Sources/FluxNew is not named in docs/ARCHITECTURE.md's module list"]
    print("check-architecture: self-test passed")


def main():
    if "--self-test" in sys.argv:
        return self_test()
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    folders = {d for d in os.listdir(os.path.join(ROOT, "Sources")) if os.path.isdir(os.path.join(ROOT, "Sources", d))}
    problems = check(text, folders)
    for p in problems:
        print(f"check-architecture: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"check-architecture: the {len(folders)} folders of Sources/ and docs/ARCHITECTURE.md's module list agree")


if __name__ == "__main__":
    main()
