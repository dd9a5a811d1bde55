"""The crash test, CI-sized: per durability mode, 5 rounds of SIGKILL at a seeded random moment of the traffic (about
one round in five a clean stop instead) and a restart on the same data directory, with a store keeping the
exactly-once rules and 8 clients with sessions (crashlib.py says what is checked); once more with segments so small
that they roll over into checkpoints during the test. scripts/crash-test.sh runs the long version.

The seed is random unless FLUXBUS_CRASH_SEED is set; a failure names it so the run can be repeated."""

import os
import random

import pytest

from crashlib import CrashTest, format_summary

SEED = int(os.environ.get("FLUXBUS_CRASH_SEED") or random.randrange(1 << 30))


@pytest.mark.parametrize("mode,args", [("always", []), ("batch", []), ("batch", ["--segment-bytes", "16384"])],
                         ids=["always", "batch", "batch-small-segments"])
def test_crash_and_restart(mode, args):
    lines = []
    test = CrashTest(mode, rounds=5, per_round=12, seed=SEED, log=lines.append, timeout=60, fluxd_args=args)
    try:
        summary = test.run()
    except AssertionError as e:
        raise AssertionError(f"seed {SEED} (FLUXBUS_CRASH_SEED={SEED} repeats it): {e}\n" + "\n".join(lines)) from None
    print(format_summary(summary))
    assert summary["actions"] == 5 * 12 * 8
    assert summary["recovered"] > 0, "no crash left a dispatch to recover: the kills missed the traffic"
