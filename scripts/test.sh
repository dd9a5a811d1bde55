#!/usr/bin/env bash
# Runs every FluxBus test on this machine, installing what is missing first:
#   0. scripts/check-op-matrix.py: docs/limits.md has a worst-case row for every op fluxd receives (issue 25);
#      scripts/check-architecture.py: docs/ARCHITECTURE.md's module list matches Sources/ (issue 26);
#   1. a clean `swift build` that must have no warnings in FluxBus's own sources;
#      then the man pages of fluxd and fluxctl generated and rendered (scripts/man.sh, into .build/man);
#   2. `swift test`: unit tests of the core and router, SDK tests, and integration tests that start the real
#      fluxd and real store/client processes on temporary sockets;
#   3. the protocol checks: every JSON Schema and every example message in protocol/vectors, and real traffic of
#      every implementation through protocol/tools/schema_proxy.py validated against the schemas;
#      then README's Swift snippets built in a package of their own that depends on this one with `traits: []`
#      (scripts/check-sdk-package.sh: the libraries fetch none of the tools' dependencies);
#   4. the libFuzzer targets (scripts/fuzz.sh), each for a CI-sized time (--fuzz-seconds N, default 60;
#      $FLUXBUS_TEST_FUZZ_SECONDS; 0 skips them);
#   5. the Swift suites again under AddressSanitizer (scripts/asan.sh; --no-asan or FLUXBUS_TEST_ASAN=0 skips
#      it): about 2.5 minutes more, the whole run about 10 minutes on 2 cores (timings in docs/fuzzing.md).
# Prints how long each step took. FLUXBUS_BUILD_LOCK=FILE: every swift command runs under flock(1) on FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

fuzz_seconds=${FLUXBUS_TEST_FUZZ_SECONDS:-60}
asan=${FLUXBUS_TEST_ASAN:-1}
while [ $# -gt 0 ]; do
    case "$1" in
        --fuzz-seconds) fuzz_seconds=$2; shift 2 ;;
        --fuzz-seconds=*) fuzz_seconds=${1#--fuzz-seconds=}; shift ;;
        --asan) asan=1; shift ;;
        --no-asan) asan=0; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "test.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

timings=()
step_start=$SECONDS
run_start=$SECONDS
step_done() {  # step_done LABEL: records how long the step since the last one took
    timings+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$1")")
    step_start=$SECONDS
}
print_timings() {
    echo "==> timings"
    printf '%s\n' "${timings[@]}"
    printf '%5d s  total\n' $((SECONDS - run_start))
}
trap print_timings EXIT

echo "==> worst case per input (scripts/check-op-matrix.py: a row in docs/limits.md for every op fluxd receives)"
python3 scripts/check-op-matrix.py --self-test
python3 scripts/check-op-matrix.py
echo "==> module list (scripts/check-architecture.py: docs/ARCHITECTURE.md names every folder of Sources/ and no other)"
python3 scripts/check-architecture.py --self-test
python3 scripts/check-architecture.py
step_done "worst case per input (docs/limits.md)"

echo "==> swift build"
log=$(mktemp)
trap 'rm -f "$log"; print_timings' EXIT
status=0
swift_locked build --build-tests >"$log" 2>&1 || status=$?
grep -vE '^\[[0-9]+/[0-9]+\]' "$log" || true
if [ "$status" != 0 ]; then echo "build failed" >&2; exit 1; fi
own_warnings=$(grep -E '^/.*: warning:' "$log" | grep -v '/.build' | sort -u || true)
if [ -n "$own_warnings" ]; then
    echo "FluxBus's own sources have warnings:" >&2
    echo "$own_warnings" >&2
    exit 1
fi
step_done "swift build --build-tests"

echo "==> man pages (scripts/man.sh: generated from the command definitions, each rendered with groff)"
bash scripts/man.sh .build/man
# ... and scripts/install.sh installs them with everything else: staged (DESTDIR), and into a user's own prefix
# without root (scripts/check-install.sh).
bash scripts/check-install.sh "$(swift_locked build --show-bin-path)" .build/man
step_done "man pages and install.sh"

echo "==> swift test"
timeout 1200 "${SWIFT[@]}" test --skip-build   # a hung test fails the run instead of stalling CI
step_done "swift test"

echo "==> protocol schemas and message vectors"
python3 protocol/tools/check_schemas.py
step_done "protocol schemas and vectors"

echo "==> the Swift SDK used from another package (scripts/check-sdk-package.sh)"
bash scripts/check-sdk-package.sh
step_done "Swift SDK from another package (traits: [])"

# Clients in other languages and the language-neutral conformance suite, against the fluxd just built.
echo "==> Python, Node and conformance suites"
if ! python3 -m pytest --version >/dev/null 2>&1; then
    echo "==> installing pytest (pip)"
    python3 -m pip install -q pytest
fi
if ! command -v node >/dev/null 2>&1; then echo "node is not installed (the Node.js suite needs Node 20.19+ or 22.12+)" >&2; exit 1; fi
export FLUXD="${FLUXD:-$(swift_locked build --show-bin-path)/fluxd}"
polyglot_failed=()
run_suite() {  # run_suite LABEL COMMAND...: runs one suite and prints a PASS/FAIL line for it
    local label=$1; shift
    echo "--> $label"
    if timeout 300 "$@"; then echo "PASS $label"; else echo "FAIL $label"; polyglot_failed+=("$label"); fi
}
run_suite "pytest examples/python (sync + asyncio clients, Store, vectors, polyglot demo)" \
    python3 -m pytest -q -p no:cacheprovider examples/python/tests
run_suite "pytest protocol/conformance (scenarios against fluxd) + protocol/tools" \
    python3 -m pytest -q -p no:cacheprovider protocol/conformance protocol/tools/test_check_frozen.py \
        protocol/tools/test_patch_vectors.py
run_suite "pytest tests/durability (crash and restart, torn and corrupt journals, the data directory's lock, disk full)" \
    python3 -m pytest -q -p no:cacheprovider tests/durability
run_suite "schema proxy (every frame of fluxd, fluxctl, Swift/Python/Node clients and stores validates)" \
    python3 -m pytest -q -p no:cacheprovider protocol/tools/test_schema_proxy.py
run_suite "node --test examples/node (client, Store, vectors, conformance scenarios)" \
    node --test examples/node/test/*.test.mjs
run_suite "patch differential (3,000 seeded random patches: Python, Node, Swift and fluxd agree, SPEC §16.1)" python3 scripts/patch-differential.py --swift "$(swift_locked build --show-bin-path)/flux-patch-check"
run_suite "tsc --noEmit (Node declarations: ES module use in examples/node/types-check, CommonJS use in types-check-cjs)" bash -c 'tsc -p examples/node/types-check && tsc -p examples/node/types-check-cjs'
run_suite "check_frozen.py (schemas compatible with protocol/frozen/v1)" \
    python3 protocol/tools/check_frozen.py
if [ ${#polyglot_failed[@]} -ne 0 ]; then
    printf 'FAILED: %s\n' "${polyglot_failed[@]}" >&2
    exit 1
fi
echo "all Python, Node and conformance suites passed"
step_done "Python, Node and conformance suites"

if [ "$fuzz_seconds" != 0 ]; then
    echo "==> fuzz targets (scripts/fuzz.sh --seconds $fuzz_seconds)"
    bash scripts/fuzz.sh --seconds "$fuzz_seconds"
    step_done "fuzz targets, ${fuzz_seconds} s each (build included)"
fi

if [ "$asan" = 1 ]; then
    echo "==> Swift suites under AddressSanitizer (scripts/asan.sh)"
    bash scripts/asan.sh
    step_done "AddressSanitizer build and Swift suites"
fi
