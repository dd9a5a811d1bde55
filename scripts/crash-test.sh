#!/usr/bin/env bash
# The long crash test (tests/durability/crashlib.py; CI runs 5 rounds per mode in tests/durability/test_crash.py):
# a durable fluxd SIGKILLed at seeded random moments (about one round in five a clean stop, SIGTERM, instead) and
# restarted on the same data directory, 50 rounds in each of the modes always and batch, with a store keeping the
# exactly-once rules and 8 clients with sessions; then a summary per mode: rounds, actions, settled, recovered,
# redelivered, checks passed. About 2 minutes. --segment-bytes 16384 makes segments roll over into checkpoints.
#   scripts/crash-test.sh [--rounds N] [--seed S] [--modes always,batch] [--per-round N] [--segment-bytes B]
#                         [--keep] [--quiet]
# fluxd is $FLUXD, else .build/debug/fluxd (build it first: swift build). Exit status 1 if a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export FLUXD="${FLUXD:-$PWD/.build/debug/fluxd}"
exec python3 tests/durability/crashlib.py --rounds 50 "$@"
