#!/usr/bin/env bash
# Builds FluxBus's libFuzzer targets (Fuzz/, a package of its own: the root build never needs the fuzzer runtime)
# with -sanitize=fuzzer,address and runs each for a fixed time on a copy of its seed corpus (Fuzz/corpus/<target>)
# in a temporary directory: nothing is written into the repository. Fails on any finding (a violated invariant, a
# crash, an AddressSanitizer report, a leak, a timeout or running out of memory) and then keeps the directory with
# the log and the input that reproduces it. See docs/fuzzing.md.
#
#   scripts/fuzz.sh [--seconds N] [--no-build] [TARGET...]     TARGET: frame-decoder envelope router (default all)
#
# --seconds N (default 60, or $FLUXBUS_FUZZ_SECONDS): how long each target runs. Set FLUXBUS_BUILD_LOCK=FILE to
# take flock(1) on FILE around every swift command (a machine shared with other builds).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-deps.sh

seconds=${FLUXBUS_FUZZ_SECONDS:-60}
build=1
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --seconds=*) seconds=${1#--seconds=}; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        frame-decoder|envelope|router) targets+=("$1"); shift ;;
        *) echo "fuzz.sh: unknown argument '$1' (targets: frame-decoder envelope router)" >&2; exit 2 ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame-decoder envelope router)

# The fuzzer and AddressSanitizer runtimes come with the Swift toolchain (clang's resource directory).
swift_bin=$(dirname "$(readlink -f "$(command -v swift)")")
fuzzer_rt=$(ls "$swift_bin"/../lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
               "$swift_bin"/../lib/swift/clang/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null | head -1 || true)
if [ -z "$fuzzer_rt" ]; then
    echo "fuzz.sh: this Swift toolchain ($swift_bin) has no libclang_rt.fuzzer: install a swift.org toolchain for Linux," >&2
    echo "         which ships libFuzzer and AddressSanitizer (Debian's libclang-rt-*-dev belong to its own clang)" >&2
    exit 1
fi

scratch=.build-fuzz
if [ "$build" = 1 ]; then
    echo "==> building the fuzz targets (release, -sanitize=fuzzer,address, --scratch-path $scratch)"
    start=$SECONDS
    log=$(mktemp)
    if ! swift_locked build --package-path Fuzz --scratch-path "$scratch" -c release \
            -Xswiftc -sanitize=fuzzer,address >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "fuzz.sh: building the fuzz targets failed" >&2
        exit 1
    fi
    rm -f "$log"
    echo "    built in $((SECONDS - start)) s"
fi
bin=$(swift_locked build --package-path Fuzz --scratch-path "$scratch" -c release --show-bin-path)

work=$(mktemp -d "${TMPDIR:-/tmp}/fluxbus-fuzz.XXXXXX")
failed=()
summary=()
for t in "${targets[@]}"; do
    exe=$bin/fuzz-$t
    [ -x "$exe" ] || { echo "fuzz.sh: $exe is missing (build without --no-build)" >&2; exit 1; }
    mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
    cp Fuzz/corpus/"$t"/* "$work/$t/corpus/"
    seeds=$(ls "$work/$t/corpus" | wc -l)
    echo "==> fuzz-$t for ${seconds} s ($seeds seeds)"
    status=0
    # SWIFT_BACKTRACE=enable=no: Swift's crash backtracer reads memory AddressSanitizer flags; a violated
    # invariant (fatalError) then goes straight to libFuzzer's crash report.
    SWIFT_BACKTRACE=enable=no ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1} \
        "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" >"$work/$t/log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t/log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$work/$t/log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    line="fuzz-$t: ${execs:-?} execs (${rate:-?}/s) in ${seconds} s, coverage ${cov:-?} edges / ${ft:-?} features, corpus $seeds -> ${corp:-?}"
    if [ "$status" = 0 ]; then
        summary+=("PASS $line")
    else
        summary+=("FAIL $line (exit $status)")
        failed+=("$t")
        echo "---- fuzz-$t failed (exit $status); the end of its log ($work/$t/log):" >&2
        grep -vE '^#[0-9]+|^\s*NEW_FUNC|^INFO:' "$work/$t/log" | tail -60 >&2
        echo "---- reproduce: SWIFT_BACKTRACE=enable=no $exe $(ls -d "$work/$t/artifacts"/* 2>/dev/null | head -1)" >&2
    fi
done

echo "==> fuzzing summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz.sh: findings in: ${failed[*]} (logs and inputs kept in $work)" >&2
    exit 1
fi
rm -rf "$work"
