"""History (SPEC §15.6, §8.12) as the journal keeps it.

- What a durable fluxd keeps for `history` is counted in actions. A restart after a crash makes seqs jump by a
  reserved block (§15.1: seq continues above every seq that may have been revealed, 65536 at a time in fluxd; after
  a clean stop it continues at the next), so a window counted in seq numbers would shrink by a block per crash. fluxd runs with small segments (they roll over into
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
    damaged. But `history` must not then answer as if nothing were missing: paging through it (following `next`)
    gives every action from `first` on (they are contiguous here: one run, no restart), or the actions before the
    damage and then an error.
    (Failed with fluxd at 92090af: Journal.history ignored JournalScan's problem and silently skipped the records
    from the damaged one to the segment's end: first 1, last 60, no next, 41 entries. Still failed at a7e871b one
    page later: the first page ended before the damage with next 18, but `history from 18` skipped the damaged
    segment and answered 37..60 without an error. Fixed in 9abea93/65f44ea.)"""
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
        # Page by page (following `next`): the actions come contiguous from `first`, until the end or an error.
        seqs, request, error, first = [], {"op": "history", "limit": 1000}, None, None
        while True:
            reply = conn.request(request, "history")
            if reply["op"] == "error":
                error = reply
                break
            first = reply["first"] if first is None else first
            seqs += [e["seq"] for e in reply["entries"]]
            if "next" not in reply:
                break
            request = {"op": "history", "limit": 1000, "from": reply["next"]}
        assert seqs == list(range(first, first + len(seqs))), f"history skipped actions: {seqs}"
        assert error is not None or seqs == list(range(first, 61)), (
            f"history answered first {first} and {len(seqs)} entries, missing "
            f"{sorted(set(range(first, 61)) - set(seqs))}, without an error; {os.path.basename(first_segment)} "
            f"is damaged at {damaged.start}. fluxd's log:\n{fluxd.stderr()}")
        if error is not None:
            assert error["code"] == "not-retained" and seqs and seqs[-1] < 60, (error, seqs)
    finally:
        for c in conns:
            c.close()
        fluxd.kill()
        shutil.rmtree(work, ignore_errors=True)
