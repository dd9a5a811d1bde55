#!/usr/bin/env bash
# Runs the Swift unit and integration suites under AddressSanitizer: everything built with --sanitize=address in
# its own scratch directory (.build-asan), fluxd without jemalloc (FLUXBUS_NO_JEMALLOC=1, see Package.swift: ASan
# replaces malloc itself). The integration tests start the fluxd, store and client executables that sit next to
# the test binary, so they run the ASan builds too. Every process writes its sanitizer reports to a temporary
# directory (ASAN_OPTIONS log_path); any report fails the run, as does a failing test. See docs/fuzzing.md.
#
#   scripts/asan.sh [--leaks] [swift test arguments, e.g. --filter FluxRouterTests]
#
# --leaks also runs LeakSanitizer at the exit of every process (with scripts/lsan-suppressions.txt); off by
# default: processes that exit with tasks, connections or clients still alive report them as leaks (and LSan's
# exit code then fails the tests that check exit codes); docs/fuzzing.md lists what it reports.
# Set FLUXBUS_BUILD_LOCK=FILE to take flock(1) on FILE around every swift command.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

leaks=0
if [ "${1:-}" = --leaks ]; then leaks=1; shift; fi

export FLUXBUS_NO_JEMALLOC=1
export FLUXBUS_ASAN=1  # tests that measure memory (RSS) skip that check: ASan's quarantine keeps freed memory
scratch=.build-asan
start=$SECONDS

echo "==> swift build --build-tests --sanitize=address (--scratch-path $scratch, without jemalloc)"
log=$(mktemp)
reports=$(mktemp -d "${TMPDIR:-/tmp}/fluxbus-asan.XXXXXX")
trap 'rm -f "$log"' EXIT
if ! swift_locked build --build-tests --scratch-path "$scratch" --sanitize=address >"$log" 2>&1; then
    grep -vE '^\[[0-9]+/[0-9]+\]' "$log" >&2 || true
    echo "asan.sh: build failed" >&2
    exit 1
fi
built=$SECONDS
echo "    built in $((built - start)) s"

echo "==> swift test --sanitize=address"
status=0
# log_path: the reports of every process (the test runner, and the fluxd, stores and clients it starts) land in
# $reports/asan.<pid>, whoever captures their stderr. SWIFT_BACKTRACE=enable=no: Swift's crash backtracer reads
# memory that ASan would report as its own finding.
if [ "$leaks" = 1 ]; then
    export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-suppressions.txt:print_suppressions=0"
fi
SWIFT_BACKTRACE=enable=no \
ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=$leaks:halt_on_error=1:${ASAN_OPTIONS:-}" \
    timeout 2400 "${SWIFT[@]}" test --skip-build --scratch-path "$scratch" --sanitize=address "$@" || status=$?
tested=$SECONDS
echo "    tests ran in $((tested - built)) s"

found=$(ls "$reports" 2>/dev/null | wc -l)
if [ "$found" != 0 ]; then
    echo "asan.sh: $found sanitizer report(s):" >&2
    for f in "$reports"/*; do
        echo "---- $f" >&2
        head -60 "$f" >&2
    done
fi
echo "==> asan: build $((built - start)) s, tests $((tested - built)) s, total $((tested - start)) s; test exit $status, $found report(s)"
if [ "$status" != 0 ] || [ "$found" != 0 ]; then
    echo "asan.sh: FAILED (reports kept in $reports)" >&2
    exit 1
fi
rm -rf "$reports"
