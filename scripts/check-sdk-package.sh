#!/usr/bin/env bash
# Uses the Swift SDK the way another project does (README, "Using the libraries from your project"): a new package
# that depends on this checkout with `traits: []`, builds README's two snippets (examples/readme) against
# FluxStore and FluxClient, and checks that resolving it fetched no dependency of fluxd or fluxctl (TOMLKit,
# swift-argument-parser, hdrhistogram-swift, swift-prometheus, ...): only the libraries' own ones.
# Usage: scripts/check-sdk-package.sh [--keep]   (FLUXBUS_BUILD_LOCK=FILE: swift runs under flock(1) on FILE)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
keep=0
[ "${1:-}" = "--keep" ] && keep=1
dir=$(mktemp -d "${TMPDIR:-/tmp}/fluxbus-sdk-consumer.XXXXXX")
cleanup() { if [ "$keep" = 1 ]; then echo "kept $dir"; else rm -rf "$dir"; fi; }
trap cleanup EXIT
swift_cmd=(swift)
if [ -n "${FLUXBUS_BUILD_LOCK:-}" ]; then swift_cmd=(flock "$FLUXBUS_BUILD_LOCK" swift); fi

mkdir -p "$dir/Sources/counter-store" "$dir/Sources/counter-view"
cp examples/readme/Store/main.swift "$dir/Sources/counter-store/main.swift"
cp examples/readme/View/main.swift "$dir/Sources/counter-view/main.swift"
# The manifest as README shows it, with the dependency on this checkout by path instead of by URL.
cat >"$dir/Package.swift" <<MANIFEST
// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "counter",
    dependencies: [
        .package(path: "$repo", traits: []),
    ],
    targets: [
        .executableTarget(name: "counter-store", dependencies: [.product(name: "FluxStore", package: "$(basename "$repo")")]),
        .executableTarget(name: "counter-view", dependencies: [.product(name: "FluxClient", package: "$(basename "$repo")")]),
    ]
)
MANIFEST
# Without the README's URL the package's identity is its directory name: the .product lines above use it.
(cd "$dir" && "${swift_cmd[@]}" package resolve >/dev/null)
fetched=$(cd "$dir" && ls .build/checkouts 2>/dev/null | sort | tr '\n' ' ')
echo "fetched for a project using FluxClient and FluxStore: ${fetched:-nothing}"
allowed=" swift-collections swift-log "
for dep in $fetched; do
    case "$allowed" in
        *" $dep "*) ;;
        *) echo "check-sdk-package: resolving the SDK fetched '$dep', a dependency of the tools, not of the libraries" >&2; exit 1 ;;
    esac
done
(cd "$dir" && "${swift_cmd[@]}" build 2>&1 | grep -vE '^\[[0-9]+/[0-9]+\]|^Building|^Compiling|^Write' || true)
for exe in counter-store counter-view; do
    [ -x "$dir/.build/debug/$exe" ] || { echo "check-sdk-package: $exe did not build" >&2; exit 1; }
done
echo "the README's store and client build in a project of their own with: .package(..., traits: [])"
