#!/usr/bin/env python3
"""Checks docs/limits.md's "Worst case per input" table against the protocol model (issue 25).

Every op fluxd receives (Sources/FluxCore/ProtocolModel.swift's `Op` with a c2d or s2d direction, which must agree
with protocol/schemas/index.json) needs a row; every input that is not a protocol op (REQUIRED_INPUTS) needs a row;
a row for an op that does not exist, or for an op fluxd only sends, fails; every test a row names must exist:
`File.func` or `Module/File.func` (a `@Test` function in Tests/[Module/]File.swift), `attack KEY` (a key of
Benchmarks/attack.py's ATTACKS list) or `path/test_x.py::test_name` (a pytest function). Each row needs a status
that starts with "met", "partly" or "open". Every op fluxd receives also needs an entry in the `worstCases` table of
Tests/IntegrationTests/OpMatrixTests.swift (the generated matrix fails at run time without one; this says so before
the build).

    python3 scripts/check-op-matrix.py              # check the repository
    python3 scripts/check-op-matrix.py --self-test  # show that the check fails on broken tables

Python 3 standard library only.
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTION = "## Worst case per input"

# The inputs that are not protocol ops: the first cell of their row starts with the name (case-insensitive).
REQUIRED_INPUTS = [
    "zero-length frame",
    "oversized frame",
    "malformed frame",
    "unknown op",
    "unread output",
    "connection flood",
    "metrics HTTP request",
    "config file",
    "journal growth",
]

STATUSES = ("met", "partly", "open")


class CheckError(Exception):
    pass


# --- the protocol model ---------------------------------------------------------------------------------------

def model_ops(swift_text):
    """{wire op: set of directions} from ProtocolModel.swift's `Op` enum and its `directions` switch."""
    m = re.search(r"public enum Op\b[^{]*\{(.*?)\n\}", swift_text, re.S)
    if not m:
        raise CheckError("ProtocolModel.swift: no `public enum Op` found")
    body = m.group(1)
    d = re.search(r"public var directions:.*?switch self \{(.*?)\n        \}", body, re.S)
    if not d:
        raise CheckError("ProtocolModel.swift: no `directions` switch found in `Op`")
    cases_text = body[:d.start()]
    raw = {}
    for line in cases_text.splitlines():
        line = line.split("//")[0].strip()
        if not line.startswith("case "):
            continue
        for item in line[len("case "):].split(","):
            item = item.strip()
            if not item:
                continue
            cm = re.fullmatch(r'(\w+)(?:\s*=\s*"([^"]+)")?', item)
            if not cm:
                raise CheckError(f"ProtocolModel.swift: cannot read the case {item!r}")
            raw[cm.group(1)] = cm.group(2) or cm.group(1)
    directions = {}
    for cm in re.finditer(r"case ((?:\.\w+,?\s*)+):\s*return \[([^\]]*)\]", d.group(1)):
        dirs = {x.strip().lstrip(".") for x in cm.group(2).split(",") if x.strip()}
        for name in re.findall(r"\.(\w+)", cm.group(1)):
            if name not in raw:
                raise CheckError(f"ProtocolModel.swift: `directions` names .{name}, which is no case of `Op`")
            directions[raw[name]] = dirs
    missing = sorted(set(raw.values()) - set(directions))
    if missing:
        raise CheckError(f"ProtocolModel.swift: no direction found for {missing}")
    return directions


def swift_case_names(swift_text):
    """{Swift case name: wire op} of `Op`."""
    body = re.search(r"public enum Op\b[^{]*\{(.*?)public var directions", swift_text, re.S).group(1)
    out = {}
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if line.startswith("case "):
            for item in line[len("case "):].split(","):
                cm = re.fullmatch(r'\s*(\w+)(?:\s*=\s*"([^"]+)")?\s*', item)
                if cm:
                    out[cm.group(1)] = cm.group(2) or cm.group(1)
    return out


def matrix_ops(root):
    """The ops of Tests/IntegrationTests/OpMatrixTests.swift's `worstCases` table (wire spelling)."""
    text = (root / "Tests/IntegrationTests/OpMatrixTests.swift").read_text()
    m = re.search(r"static let worstCases: \[Op: WorstCase\] = \[(.*?)\n    \]", text, re.S)
    if not m:
        raise CheckError("Tests/IntegrationTests/OpMatrixTests.swift: no `worstCases` table found")
    names = swift_case_names((root / "Sources/FluxCore/ProtocolModel.swift").read_text())
    return {names.get(n, n) for n in re.findall(r"\.(\w+):", m.group(1))}


def schema_ops(index):
    out = {}
    for s in index["schemas"]:
        out.setdefault(s["op"], set()).add(s["direction"])
    return out


def received_ops(root):
    model = model_ops((root / "Sources/FluxCore/ProtocolModel.swift").read_text())
    index = json.loads((root / "protocol/schemas/index.json").read_text())
    schemas = schema_ops(index)
    if model != schemas:
        diff = sorted(op for op in set(model) | set(schemas) if model.get(op) != schemas.get(op))
        raise CheckError("ProtocolModel.swift and protocol/schemas/index.json disagree on "
                         + ", ".join(f"{op} (model {sorted(model.get(op, []))}, schemas {sorted(schemas.get(op, []))})"
                                     for op in diff))
    return {op for op, dirs in model.items() if dirs & {"c2d", "s2d"}}, set(model)


# --- what tests exist -------------------------------------------------------------------------------------------

def swift_tests(root):
    """{(module, file stem): set of @Test function names} under Tests/."""
    out = {}
    for p in (root / "Tests").rglob("*.swift"):
        text = p.read_text(errors="replace")
        names = set()
        for m in re.finditer(r"@Test\b", text):
            f = re.compile(r"\bfunc\s+(\w+)").search(text, m.end())
            if f:
                names.add(f.group(1))
        out[(p.parent.name, p.stem)] = names
    return out


def attack_keys(root):
    text = (root / "Benchmarks/attack.py").read_text()
    m = re.search(r"\n\s*ATTACKS = \[(.*?)\n\s*\]", text, re.S)
    if not m:
        raise CheckError("Benchmarks/attack.py: no ATTACKS list found")
    return set(re.findall(r'^\s*\("([^"]+)",', m.group(1), re.M))


def test_exists(ref, root, swift, attacks):
    """None when `ref` names a test that exists, else why not."""
    if ref.startswith("attack "):
        key = ref[len("attack "):].strip()
        return None if key in attacks else f"no attack {key!r} in Benchmarks/attack.py's ATTACKS"
    if "::" in ref:
        path, func = ref.split("::", 1)
        p = root / path
        if not p.is_file():
            return f"no file {path}"
        return None if re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(", p.read_text(), re.M) else f"no {func} in {path}"
    m = re.fullmatch(r"(?:(\w+)/)?(\w+)\.(\w+)", ref)
    if not m:
        return "not a test reference (File.func, Module/File.func, attack KEY or path.py::test)"
    module, stem, func = m.groups()
    files = [k for k in swift if k[1] == stem and (module is None or k[0] == module)]
    if not files:
        return f"no Tests/{module + '/' if module else '*/'}{stem}.swift"
    if not any(func in swift[k] for k in files):
        return f"no @Test func {func} in {stem}.swift"
    return None


# --- the table --------------------------------------------------------------------------------------------------

def table_rows(doc):
    """The rows of the first table after SECTION: [(line number, [cells])]."""
    start = doc.find("\n" + SECTION + "\n")
    if start < 0:
        raise CheckError(f"docs/limits.md has no section {SECTION!r}")
    lines = doc[start + 1:].split("\n")
    base = doc[:start + 1].count("\n") + 1
    rows, in_table, header_seen = [], False, False
    for i, line in enumerate(lines[1:], start=1):
        if line.startswith("## "):
            break
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not header_seen:
                header_seen = True
                continue
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            rows.append((base + i, cells))
        elif in_table:
            break
    if not rows:
        raise CheckError(f"docs/limits.md: the section {SECTION!r} has no table rows")
    return rows


def check(doc, root):
    """The problems found (empty: all good)."""
    problems = []
    received, all_ops = received_ops(root)
    swift = swift_tests(root)
    attacks = attack_keys(root)
    covered_ops, covered_inputs = set(), set()
    for line, cells in table_rows(doc):
        if len(cells) != 5:
            problems.append(f"docs/limits.md:{line}: a row needs 5 cells (input, worst case, bound, tests, status), has {len(cells)}")
            continue
        what, _, bound, tests, status = cells
        op = re.match(r"`([a-z-]+)`", what)
        if op:
            name = op.group(1)
            if name not in all_ops:
                problems.append(f"docs/limits.md:{line}: a row for `{name}`, which is no op of the protocol model (remove it)")
            elif name not in received:
                problems.append(f"docs/limits.md:{line}: a row for `{name}`, which fluxd only sends (remove it)")
            else:
                covered_ops.add(name)
        else:
            matched = [i for i in REQUIRED_INPUTS if what.lower().startswith(i.lower())]
            if not matched:
                problems.append(f"docs/limits.md:{line}: {what!r} is neither an op in backticks nor one of the inputs "
                                f"{REQUIRED_INPUTS}")
            covered_inputs.update(matched)
        refs = re.findall(r"`([^`]+)`", tests)
        if not refs:
            problems.append(f"docs/limits.md:{line}: the row for {what} names no test")
        for ref in refs:
            why = test_exists(ref, root, swift, attacks)
            if why:
                problems.append(f"docs/limits.md:{line}: the row for {what} names the test `{ref}`: {why}")
        if not bound:
            problems.append(f"docs/limits.md:{line}: the row for {what} says no bound")
        if not status.lower().startswith(STATUSES):
            problems.append(f"docs/limits.md:{line}: the row for {what}: status must start with one of {STATUSES}")
    for name in sorted(received - covered_ops):
        problems.append(f"docs/limits.md: no row for the op `{name}` (fluxd receives it): add its worst-case input, "
                        f"the bound it meets and the test that shows it")
    for name in sorted(received - matrix_ops(root)):
        problems.append(f"Tests/IntegrationTests/OpMatrixTests.swift: no worst case for the op `{name}` in `worstCases`")
    for name in REQUIRED_INPUTS:
        if name not in covered_inputs:
            problems.append(f"docs/limits.md: no row for the input {name!r}")
    return problems


def self_test(doc, root):
    """Broken copies of the real table must each fail; the real one must pass."""
    failures = []
    if check(doc, root):
        failures.append("the real table does not pass")
    rows = table_rows(doc)
    lines = doc.split("\n")

    def mutated(line_no, new):
        copy = list(lines)
        if new is None:
            del copy[line_no - 1]
        else:
            copy[line_no - 1] = new
        return "\n".join(copy)

    op_row = next((ln, c) for ln, c in rows if c[0].startswith("`dispatch`"))
    input_row = next((ln, c) for ln, c in rows if c[0].lower().startswith("journal growth"))
    cases = {
        "a row removed (dispatch)": mutated(op_row[0], None),
        "a non-protocol input's row removed (journal growth)": mutated(input_row[0], None),
        "a row for an op that does not exist": mutated(op_row[0], lines[op_row[0] - 1].replace("`dispatch`", "`dispatch-all`", 1)),
        "a row for an op fluxd only sends": doc.replace(lines[op_row[0] - 1], lines[op_row[0] - 1] + "\n"
                                                         + lines[op_row[0] - 1].replace("`dispatch`", "`settled`", 1), 1),
        "a test that does not exist": mutated(op_row[0], lines[op_row[0] - 1].replace(
            op_row[1][3], op_row[1][3] + ", `AttackTests.noSuchTest`", 1)),
        "an attack that does not exist": mutated(op_row[0], lines[op_row[0] - 1].replace(
            op_row[1][3], op_row[1][3] + ", `attack 99z`", 1)),
        "a row without a status": mutated(op_row[0], lines[op_row[0] - 1].rstrip().rstrip("|").rsplit("|", 1)[0] + "| |"),
        "the section missing": doc.replace(SECTION, "## Something else"),
    }
    for label, text in cases.items():
        try:
            problems = check(text, root)
        except CheckError as e:
            problems = [str(e)]
        if not problems:
            failures.append(f"the check passed {label}")
    # The protocol model parsed: an op added to it without a row fails.
    swift = (root / "Sources/FluxCore/ProtocolModel.swift").read_text()
    ops = model_ops(swift)
    if "dispatch" not in ops or ops["dispatch"] != {"c2d"} or ops.get("ping") != {"c2d", "d2c"}:
        failures.append(f"ProtocolModel.swift read wrong: {ops}")
    return failures


def main(argv):
    doc = (ROOT / "docs/limits.md").read_text()
    try:
        if "--self-test" in argv:
            failures = self_test(doc, ROOT)
            if failures:
                print("check-op-matrix self-test FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
                return 1
            print("check-op-matrix self-test: every broken table fails the check")
            return 0
        problems = check(doc, ROOT)
    except CheckError as e:
        problems = [str(e)]
    if problems:
        print("docs/limits.md's worst case per input is incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    received, _ = received_ops(ROOT)
    print(f"check-op-matrix: every one of the {len(received)} ops fluxd receives and the {len(REQUIRED_INPUTS)} other "
          f"inputs has a row in docs/limits.md, and every test it names exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
