"""History across restarts (SPEC §15.6, §8.12): what a durable fluxd keeps for `history` is counted in actions.

A restart makes seqs jump by a reserved block (§15.1: seq continues above every seq that may have been revealed,
65536 at a time in fluxd), so a window counted in seq numbers shrinks by a block per restart. This test runs a
fluxd with small segments (they roll over into checkpoints, behind which retention deletes segments) and
--retain-actions 1000, restarts it twice with 40 actions each time (120 in all, far fewer than 1000), and reads the
whole history: every action must still be there, in seq order, with its payload and result.
"""

import os
import shutil
import tempfile

from fluxproto import Fluxd, connect

STORE = "ledger"


def read_history(conn):
    entries, start, first = [], None, None
    while True:
        request = {"op": "history", "limit": 1000}
        if start is not None:
            request["from"] = start
        reply = conn.request(request, "history")
        assert reply["op"] == "history", reply
        if first is None:
            first = reply["first"]
        entries += reply["entries"]
        if "next" not in reply:
            return first, entries
        start = reply["next"]


def test_history_keeps_the_newest_actions_across_restarts():
    work = tempfile.mkdtemp(prefix="fluxhistory-")
    fluxd = Fluxd(os.path.join(work, "fluxd.sock"), os.path.join(work, "data"), work,
                  ["--durability", "always", "--segment-bytes", "4096", "--retain-actions", "1000"])
    conns = []
    try:
        dispatched = []  # (id, seq)
        for run in range(3):
            fluxd.start()
            store = connect(fluxd.socket_path, "store", "history-store")
            client = connect(fluxd.socket_path, "client", "history-client")
            conns += [store, client]
            store.send({"op": "register", "store": STORE, "handles": ["op/*"], "state": {"n": 0}})
            store.expect(lambda f: f.get("op") == "queries", what="registration")
            for k in range(40):
                aid = f"r{run}-{k}"
                client.send({"op": "dispatch", "id": aid, "type": "op/inc", "payload": {"id": aid}, "settle": True})
                action = store.expect(lambda f: f.get("op") == "action", what=f"action {aid}")
                store.send({"op": "done", "store": STORE, "seq": action["seq"], "state": {"n": len(dispatched) + 1}})
                settled = client.expect(lambda f: f.get("op") == "settled" and f.get("id") == aid, what="settled")
                dispatched.append((aid, settled["seq"]))
            if run < 2:
                fluxd.kill()
                store.close()
                client.close()
        first, entries = read_history(client)
        got = [(e["payload"]["id"], e["seq"]) for e in entries]
        assert got == dispatched, (
            f"history holds {len(entries)} of the {len(dispatched)} actions (first {first}, seqs "
            f"{[s for _, s in dispatched][:1]}..{dispatched[-1][1]}) with --retain-actions 1000; "
            f"missing: {[d for d in dispatched if d not in got][:5]}...; data directory: "
            f"{sorted(os.listdir(os.path.join(work, 'data')))}")
        assert all(e["results"] == [{"store": STORE, "status": "done", "version": e["results"][0]["version"]}]
                   for e in entries), entries[:3]
    finally:
        for c in conns:
            c.close()
        fluxd.kill()
        shutil.rmtree(work, ignore_errors=True)
