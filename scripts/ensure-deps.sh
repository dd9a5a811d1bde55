#!/usr/bin/env bash
# Installs what FluxBus needs on a fresh Debian machine when it is missing: pkg-config, libuv1-dev and
# libjemalloc-dev (apt), nodejs and node-typescript (apt: `tsc`, for the Node package's declarations), groff-base
# (apt: the man pages' check), and Python's jsonschema
# (pip, for the protocol schema checks). Sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
        echo "need root to run: $*" >&2; return 1; fi
}

if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libuv || ! pkg-config --exists jemalloc; then
    echo "==> installing libuv1-dev, libjemalloc-dev and pkg-config (apt)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq libuv1-dev libjemalloc-dev pkg-config >/dev/null
fi

if ! command -v node >/dev/null 2>&1; then
    echo "==> installing nodejs (apt; the Node.js client library's suite)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs >/dev/null
fi

if ! command -v tsc >/dev/null 2>&1; then
    echo "==> installing node-typescript (apt; tsc checks examples/node's .d.mts declarations)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq node-typescript >/dev/null
fi

if ! command -v groff >/dev/null 2>&1; then
    echo "==> installing groff-base (apt; scripts/man.sh renders every generated man page with it)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq groff-base >/dev/null
fi

if ! command -v strace >/dev/null 2>&1; then
    echo "==> installing strace (apt; tests/durability/test_loop_syscalls.py traces fluxd's loop thread for syncs)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq strace >/dev/null
fi

if ! command -v swift >/dev/null 2>&1; then
    if [ -x /opt/swift/usr/bin/swift ]; then export PATH="/opt/swift/usr/bin:$PATH"; else
        echo "swift is not installed (FluxBus needs Swift 6.1 or newer)" >&2; exit 1; fi
fi

if ! python3 -c 'import jsonschema' >/dev/null 2>&1; then
    echo "==> installing jsonschema (pip)"
    python3 -m pip install -q jsonschema
fi

# `swift_locked ARGS...` runs `swift ARGS...` ("${SWIFT[@]}" in commands such as timeout), under flock(1) on
# $FLUXBUS_BUILD_LOCK when that is set (a machine shared with other builds: no two Swift builds at once).
if [ -n "${FLUXBUS_BUILD_LOCK:-}" ]; then SWIFT=(flock "$FLUXBUS_BUILD_LOCK" swift); else SWIFT=(swift); fi
swift_locked() { "${SWIFT[@]}" "$@"; }
