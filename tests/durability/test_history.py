"""History (SPEC §15.6, §8.12) as the journal keeps it.

- What a durable fluxd keeps for `history` is counted in actions. A restart makes seqs jump by a reserved block
  (§15.1: seq continues above every seq that may have been revealed, 65536 at a time in fluxd), so a window counted
  in seq numbers would shrink by a block per restart. fluxd runs with small segments (they roll over into
  checkpoints, behind which retention deletes segments) and --retain-actions 1000, restarts twice with 40 actions
  each time (120 in all, far fewer than 1000), and the whole history must still be there, in seq order.
- A damaged segment behind a checkpoint (history only) does not stop fluxd, and must not make `history` silently
  skip actions.
"""

import os
import shutil
import tempfile

from fluxproto import Fluxd, connect
from journalfile import checkpoints, parse_segment, segments

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


def test_a_damaged_segment_behind_a_checkpoint_does_not_silently_shorten_history():
    """A segment that a checkpoint covers is history only: fluxd starts from the checkpoint even if the segment is
    damaged. But `history` must not then answer as if nothing were missing: either every action from `first` on
    (they are contiguous here: one run, no restart), or an error.
    FAILS with fluxd at 92090af: Journal.history reads each segment with JournalScan and ignores its problem, so the
    records from the damaged one to the segment's end are skipped; the reply says first 1, last 60, no next, and
    lacks some 20 actions. Nothing is logged about the damaged segment either."""
    work = tempfile.mkdtemp(prefix="fluxhistory-")
    data = os.path.join(work, "data")
    fluxd = Fluxd(os.path.join(work, "fluxd.sock"), data, work, ["--durability", "always", "--segment-bytes", "4096"])
    conns = []
    try:
        fluxd.start()
        store = connect(fluxd.socket_path, "store", "history-store")
        client = connect(fluxd.socket_path, "client", "history-client")
        conns += [store, client]
        store.send({"op": "register", "store": STORE, "handles": ["op/*"], "state": {"n": 0}})
        store.expect(lambda f: f.get("op") == "queries", what="registration")
        for k in range(60):
            aid = f"h-{k}"
            client.send({"op": "dispatch", "id": aid, "type": "op/inc", "payload": {"id": aid}, "settle": True})
            action = store.expect(lambda f: f.get("op") == "action", what=f"action {aid}")
            store.send({"op": "done", "store": STORE, "seq": action["seq"], "state": {"n": k + 1}})
            client.expect(lambda f: f.get("op") == "settled" and f.get("id") == aid, what="settled")
        fluxd.kill()
        assert checkpoints(data) and len(segments(data)) >= 2, sorted(os.listdir(data))
        first_segment = segments(data)[0]
        with open(first_segment, "rb") as f:
            content = bytearray(f.read())
        records = parse_segment(bytes(content))
        damaged = records[len(records) // 2]
        content[damaged.start + 12] ^= 0xFF
        with open(first_segment, "wb") as f:
            f.write(content)

        fluxd.start()  # the checkpoint holds the state: fluxd starts
        conn = connect(fluxd.socket_path, "client", "reader")
        conns.append(conn)
        reply = conn.request({"op": "history", "limit": 1000}, "history")
        if reply["op"] == "history":
            seqs = [e["seq"] for e in reply["entries"]]
            assert seqs == list(range(reply["first"], 61)), (
                f"history answered first {reply['first']}, last {reply.get('last')}, next {reply.get('next')} and "
                f"{len(seqs)} entries, missing {sorted(set(range(reply['first'], 61)) - set(seqs))}; "
                f"{os.path.basename(first_segment)} is damaged at {damaged.start}. fluxd's log:\n{fluxd.stderr()}")
    finally:
        for c in conns:
            c.close()
        fluxd.kill()
        shutil.rmtree(work, ignore_errors=True)
