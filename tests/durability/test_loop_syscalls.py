"""No blocking sync on fluxd's loop thread (issue 27): in `none` and `batch` mode the loop thread makes no
`fsync`/`fdatasync` once fluxd is ready. Seq reservations are made durable off the loop (the first one before
the loop starts), batch syncs run on the journal's sync thread, checkpoints on its writer thread.

fluxd runs under `strace -f` (every thread, each line tagged with its thread id), with seq blocks of 512 actions
(a few reservations; the next is made durable off the loop while half a block, 256 actions, is left), 64 KiB segments (rollovers and checkpoints) and a state of ~1 KB per action. The loop thread
is the one that wrote the ready line (fluxd runs its loop on its main thread). The same run in `always` mode is
the control: there the loop thread must sync, so a test that saw none would be blind, not right.
"""

import os
import re
import shutil
import signal
import tempfile

import pytest

from fluxproto import Fluxd, connect

STORE = "ledger"
ACTIONS = 1500

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


def traced_run(mode: str):
    """Runs ACTIONS settled dispatches on a fluxd in `mode` under strace; returns (loop tid, [(tid, syscall)]
    after the ready line)."""
    work = tempfile.mkdtemp(prefix="fluxsyscalls-")
    trace = os.path.join(work, "strace.txt")
    fluxd = Fluxd(os.path.join(work, "fluxd.sock"), os.path.join(work, "data"), work,
                  ["--durability", mode, "--segment-bytes", "65536"],
                  wrapper=["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,write", "-o", trace])
    old = os.environ.get("FLUXBUS_SEQ_BLOCK")
    os.environ["FLUXBUS_SEQ_BLOCK"] = "512"
    conns = []
    try:
        fluxd.start(timeout=60)
        store = connect(fluxd.socket_path, "store", "syscalls-store")
        client = connect(fluxd.socket_path, "client", "syscalls-client")
        conns += [store, client]
        store.send({"op": "register", "store": STORE, "handles": ["op/*"], "state": {"n": 0}})
        store.expect(lambda f: f.get("op") == "queries", what="registration")
        pad = "x" * 1000
        window = 16
        sent = settled = 0
        while settled < ACTIONS:
            while sent < ACTIONS and sent - settled < window:
                client.send({"op": "dispatch", "id": f"a{sent}", "type": "op/inc", "payload": {"k": sent}, "settle": True})
                sent += 1
            action = store.expect(lambda f: f.get("op") == "action", what="an action")
            store.send({"op": "done", "store": STORE, "seq": action["seq"], "state": {"n": action["seq"], "pad": pad}})
            client.expect(lambda f: f.get("op") == "settled", what="a settlement")
            settled += 1
    finally:
        for c in conns:
            c.close()
        # The whole session (strace and fluxd): SIGKILL, so that no clean stop's sync is counted either.
        if fluxd.process is not None:
            try:
                os.killpg(fluxd.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        fluxd.kill()
        if old is None:
            os.environ.pop("FLUXBUS_SEQ_BLOCK", None)
        else:
            os.environ["FLUXBUS_SEQ_BLOCK"] = old
    with open(trace, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    shutil.rmtree(work, ignore_errors=True)
    loop = None
    calls = []
    for line in lines:
        m = re.match(r"(\d+)\s+(\w+)\((.*)", line)
        if not m:
            continue
        tid, name, rest = int(m.group(1)), m.group(2), m.group(3)
        if loop is None:
            if name == "write" and rest.startswith('1, "fluxd ready on'):
                loop = tid
            continue
        if name in ("fsync", "fdatasync"):
            calls.append((tid, name))
    assert loop is not None, "no ready line in the trace:\n" + "\n".join(lines[:20])
    return loop, calls


@pytest.mark.parametrize("mode", ["none", "batch"])
def test_the_loop_thread_never_syncs(mode):
    loop, calls = traced_run(mode)
    on_loop = [c for c in calls if c[0] == loop]
    off_loop = [c for c in calls if c[0] != loop]
    assert not on_loop, f"{mode}: the loop thread (tid {loop}) called {len(on_loop)} syncs: {on_loop[:5]}"
    # The syncs happened, on other threads: 1,500 actions in blocks of 512 need 3 more durable reservations,
    # and ~1.5 MB of records in 64 KiB segments make checkpoints, each synced.
    assert len(off_loop) >= 3, f"{mode}: only {len(off_loop)} syncs off the loop: {off_loop}"


def test_control_always_syncs_on_the_loop_thread():
    loop, calls = traced_run("always")
    on_loop = [c for c in calls if c[0] == loop]
    assert len(on_loop) >= 100, f"always: the loop thread (tid {loop}) synced {len(on_loop)} times; the trace is blind"
