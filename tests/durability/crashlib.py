"""The crash test: one durable fluxd SIGKILLed at seeded random moments (about one round in five stopped cleanly with
SIGTERM instead) and restarted on the same data directory, one store keeping SPEC §15.3's exactly-once rules, and
clients with sessions that recover what they did not see settled (§15.4). Used by test_crash.py (CI-sized) and by
scripts/crash-test.sh (long; run this file).

The store's state is a JSON object mapping each applied action's id (the payload's "id") to how many times it was
applied; it is published with every `done` that applies an action. The checks:
- every action whose settlement a client received (live or through `recover`) is in the state exactly once, after
  every restart and at the end; no id is ever counted twice (in the retained snapshot or in the store's memory);
- every dispatch ends settled (done) or reported not sent (`recover` says unknown, or an `error` refused it), and
  those not sent are not in the state; every id in the state is one a client dispatched;
- the epoch stays the same; the snapshot versions a client is sent never go back, across restarts (within the
  epoch), and a `settled` never names a version above the newest snapshot this connection was sent (R5);
- each store connection receives actions in increasing seq; a new action after a restart has a seq above every
  seq of the runs before (R1: never reused);
- when fluxd answers `history` (§8.12), the final state equals a replay of the history's `done` results.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Set

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fluxproto import Conn, ConnectionClosed, Fluxd, Timeout, connect, wait_until  # noqa: E402

STORE = "ledger"
ACTION_TYPE = "op/inc"


class Violation(AssertionError):
    pass


class Shared:
    """What the actors and the harness share, under one condition variable."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.stop = False
        self.finishing = False
        self.violations: List[str] = []
        self.fluxd_run = 1  # which fluxd process the actors talk to (for seq checks)
        self.round_settled = 0  # settlements received (live) since the round began
        self.counters = {"dispatched": 0, "settled": 0, "recovered": 0, "recovered-settled": 0,
                         "recovered-pending": 0, "recovered-unknown": 0, "refused": 0, "redelivered": 0,
                         "skipped": 0, "applied": 0, "reconnects": 0}

    def violation(self, text: str) -> None:
        with self.cv:
            self.violations.append(text)
            self.cv.notify_all()

    def count(self, name: str, n: int = 1) -> None:
        with self.cv:
            self.counters[name] += n
            self.cv.notify_all()


def open_connection(shared: Shared, socket_path: str, role: str, name: str, session: str) -> Optional[Conn]:
    """Connects and says hello, retrying while fluxd is down; None once the harness stops."""
    while True:
        with shared.cv:
            if shared.stop:
                return None
        try:
            return connect(socket_path, role, name, session)
        except (OSError, ConnectionClosed, Timeout, AssertionError):
            time.sleep(0.01)  # fluxd is restarting: retry the connect, not a synchronisation


class StoreActor(threading.Thread):
    """The store `ledger`: adopts the snapshot sent after `registered`, skips actions it includes, applies the
    rest by counting their ids, answers `done` with the whole state."""

    def __init__(self, shared: Shared, socket_path: str):
        super().__init__(name="store", daemon=True)
        self.shared = shared
        self.socket_path = socket_path
        self.connected = False
        self.registrations = 0
        self.epoch: Optional[str] = None
        self.state: Dict[str, int] = {}
        self.adopted_seq = 0
        self.seqs_by_run: Dict[int, Set[int]] = {}  # new (not redelivered) action seqs, by fluxd run
        self.redelivered_by_run: Dict[int, Set[int]] = {}
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the harness
            self.error = e
            self.shared.violation(f"store thread failed: {e!r}")

    def _run(self) -> None:
        shared = self.shared
        while True:
            conn = open_connection(shared, self.socket_path, "store", "crash-store", "crash-store")
            if conn is None:
                return
            with shared.cv:
                run = shared.fluxd_run
                self.connected = True
                shared.cv.notify_all()
            try:
                self._serve(conn, run)
            except ConnectionClosed:
                pass
            finally:
                conn.close()
                with shared.cv:
                    self.connected = False
                    shared.cv.notify_all()
            with shared.cv:
                if shared.stop:
                    return

    def _serve(self, conn: Conn, run: int) -> None:
        shared = self.shared
        epoch = conn.welcome.get("epoch")
        if self.epoch is not None and epoch != self.epoch:
            shared.violation(f"store: the epoch changed on a restart: {self.epoch} -> {epoch}")
        self.epoch = epoch
        conn.send({"op": "register", "store": STORE, "handles": ["op/*"], "state": {}})
        adopting = False
        last_seq = 0
        while True:
            with shared.cv:
                if shared.stop:
                    return
            frame = conn.recv(0.1)
            if frame is None:
                continue
            op = frame.get("op")
            if op == "registered":
                adopting = True
                # With no retained snapshot (not expected: registering with an initial state makes version 1)
                # the store starts empty.
                self.state, self.adopted_seq = {}, 0
                with shared.cv:
                    self.registrations += 1
                    shared.cv.notify_all()
            elif op == "snapshot" and frame.get("store") == STORE:
                if not adopting:
                    shared.violation(f"store: a snapshot it did not expect: {frame}")
                    continue
                adopting = False
                state = frame["state"]
                self.state = dict(state)
                self.adopted_seq = frame["seq"]
                twice = {k: v for k, v in self.state.items() if v != 1}
                if twice:
                    shared.violation(f"store: the snapshot it adopted (version {frame['version']}) counts "
                                     f"{len(twice)} ids more than once: {dict(list(twice.items())[:5])}")
            elif op == "action":
                adopting = False
                seq = frame["seq"]
                if seq <= last_seq:
                    shared.violation(f"store: action seq {seq} after seq {last_seq} on one connection")
                last_seq = seq
                redelivered = frame.get("redelivered") is True
                if redelivered:
                    shared.count("redelivered")
                    self.redelivered_by_run.setdefault(run, set()).add(seq)
                else:
                    self.seqs_by_run.setdefault(run, set()).add(seq)
                if seq <= self.adopted_seq:
                    # §15.3 rule 2: the adopted snapshot already includes it.
                    shared.count("skipped")
                    conn.send({"op": "done", "store": STORE, "seq": seq})
                    continue
                aid = frame["payload"]["id"]
                self.state[aid] = self.state.get(aid, 0) + 1
                if self.state[aid] > 1:
                    shared.violation(f"store: action {aid} (seq {seq}, redelivered={redelivered}) applied "
                                     f"twice: its effect was in the adopted state (snapshot seq "
                                     f"{self.adopted_seq}) though its seq is above it")
                shared.count("applied")
                conn.send({"op": "done", "store": STORE, "seq": seq, "state": self.state})
            elif op == "error":
                shared.violation(f"store: error from fluxd: {frame}")


class ClientActor(threading.Thread):
    """A client with a session of its own, dispatching `op/inc` with settle:true and unique ids (a counter kept
    across reconnections), at most `window` unanswered at a time, up to the budget the harness grants."""

    def __init__(self, shared: Shared, socket_path: str, index: int, window: int = 4):
        super().__init__(name=f"client-{index}", daemon=True)
        self.shared = shared
        self.socket_path = socket_path
        self.index = index
        self.session = f"crash-client-{index}-{os.getpid()}-{random.getrandbits(32):08x}"
        self.window = window
        self.budget = 0
        self.next = 1
        self.connected = False
        self.epoch: Optional[str] = None
        self.outstanding: Set[str] = set()  # sent on the current connection, no answer yet
        self.unresolved: Set[str] = set()  # sent on a lost connection, to recover
        self.settled: Dict[str, Dict[str, Any]] = {}  # id -> {"seq", "results", "how"}
        self.not_sent: Dict[str, str] = {}  # id -> why (an error code, or "unknown" from recover)
        self.max_version = 0  # newest snapshot version sent to this client (the epoch does not change)
        self.max_seq = 0
        self.error: Optional[BaseException] = None

    def done(self) -> bool:
        """Every dispatch of the budget made and resolved (call under shared.cv)."""
        return self.next > self.budget and not self.outstanding and not self.unresolved

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:
            self.error = e
            self.shared.violation(f"client {self.index} thread failed: {e!r}")

    def _run(self) -> None:
        shared = self.shared
        while True:
            conn = open_connection(shared, self.socket_path, "client", f"crash-client-{self.index}",
                                   self.session)
            if conn is None:
                return
            with shared.cv:
                self.connected = True
                shared.cv.notify_all()
            try:
                self._serve(conn)
            except ConnectionClosed:
                pass
            finally:
                conn.close()
                with shared.cv:
                    self.unresolved |= self.outstanding
                    self.outstanding.clear()
                    self.connected = False
                    shared.cv.notify_all()
            with shared.cv:
                if shared.stop:
                    return
                shared.counters["reconnects"] += 1

    def _settle(self, aid: str, seq: int, results: List[Dict[str, Any]], how: str) -> None:
        shared = self.shared
        if aid in self.settled:
            shared.violation(f"client {self.index}: {aid} settled twice: {self.settled[aid]} then {how} {results}")
            return
        if aid in self.not_sent:
            shared.violation(f"client {self.index}: {aid} settled ({how}) after it was reported not sent "
                             f"({self.not_sent[aid]})")
        ok = len(results) == 1 and results[0].get("store") == STORE and results[0].get("status") == "done"
        if not ok:
            shared.violation(f"client {self.index}: {aid} (seq {seq}) settled {how} with {results}, not done")
        self.settled[aid] = {"seq": seq, "results": results, "how": how}
        self.max_seq = max(self.max_seq, seq)

    def _serve(self, conn: Conn) -> None:
        shared = self.shared
        epoch = conn.welcome.get("epoch")
        if self.epoch is not None and epoch != self.epoch:
            shared.violation(f"client {self.index}: the epoch changed on a restart: {self.epoch} -> {epoch}")
        self.epoch = epoch
        conn_version = 0  # newest snapshot version sent on this connection (R5)
        conn.send({"op": "subscribe", "store": STORE})
        with shared.cv:
            to_recover = sorted(self.unresolved)
        for start in range(0, len(to_recover), 4096):
            conn.send({"op": "recover", "id": f"rec-{start}", "ids": to_recover[start:start + 4096]})
        while True:
            sends = []
            with shared.cv:
                if shared.stop:
                    return
                while len(self.outstanding) < self.window and self.next <= self.budget:
                    aid = f"{self.index}-{self.next}"
                    self.next += 1
                    self.outstanding.add(aid)
                    shared.counters["dispatched"] += 1
                    sends.append(aid)
            for aid in sends:
                conn.send({"op": "dispatch", "id": aid, "type": ACTION_TYPE, "payload": {"id": aid}, "settle": True})
            frame = conn.recv(0.05)
            if frame is None:
                continue
            op = frame.get("op")
            with shared.cv:
                if op == "settled":
                    aid = frame["id"]
                    if aid not in self.outstanding:
                        shared.violation(f"client {self.index}: a settlement for {aid}, not outstanding here: {frame}")
                    self.outstanding.discard(aid)
                    self.unresolved.discard(aid)
                    self._settle(aid, frame["seq"], frame["results"], "live")
                    for r in frame["results"]:
                        if r.get("status") == "done" and r.get("version", 0) > conn_version:
                            shared.violation(f"client {self.index}: settled {aid} names version {r['version']} "
                                             f"but this connection was sent snapshots up to {conn_version} (R5)")
                    shared.counters["settled"] += 1
                    shared.round_settled += 1
                elif op == "recovered":
                    for outcome in frame["outcomes"]:
                        aid, status = outcome["id"], outcome["status"]
                        shared.counters["recovered"] += 1
                        shared.counters["recovered-" + status] += 1
                        if aid not in self.unresolved:
                            shared.violation(f"client {self.index}: recovered {aid}, which it did not ask about")
                            continue
                        self.unresolved.discard(aid)
                        if status == "settled":
                            self._settle(aid, outcome["seq"], outcome["results"], "recovered")
                        elif status == "pending":
                            self.outstanding.add(aid)  # its settlement now comes on this connection
                        elif status == "unknown":
                            self.not_sent[aid] = "unknown"
                        else:
                            shared.violation(f"client {self.index}: recover outcome {outcome}")
                elif op in ("snapshot", "subscribed") and frame.get("store") == STORE:
                    version = frame.get("version", 0)
                    if version < self.max_version:
                        shared.violation(f"client {self.index}: {op} version {version} after version "
                                         f"{self.max_version} (same epoch {self.epoch})")
                    self.max_version = max(self.max_version, version)
                    if op == "snapshot":
                        conn_version = max(conn_version, version)
                elif op == "error":
                    ref = frame.get("ref")
                    if ref in self.outstanding:
                        self.outstanding.discard(ref)
                        self.not_sent[ref] = frame.get("code", "?")
                        shared.counters["refused"] += 1
                    else:
                        shared.violation(f"client {self.index}: error from fluxd: {frame}")
                shared.cv.notify_all()


class CrashTest:
    """One mode's run: fluxd, the store, the clients, the rounds of kill and restart, the checks."""

    def __init__(self, mode: str, rounds: int, per_round: int, seed: int, clients: int = 8,
                 log=print, keep: bool = False, timeout: float = 120.0, fluxd_args: Optional[List[str]] = None,
                 term_share: float = 0.2):
        self.mode = mode
        self.fluxd_args = list(fluxd_args or [])
        self.term_share = term_share
        self.clean_stops = 0
        self.rounds = rounds
        self.per_round = per_round
        self.rng = random.Random(f"{seed}-{mode}")
        self.seed = seed
        self.nclients = clients
        self.log = log
        self.keep = keep
        self.timeout = timeout
        self.checks = 0
        self.notes: List[str] = []
        self.torn = 0
        self.history_checked: Optional[bool] = None
        self.history_first = 0
        self.elapsed = 0.0

    def check(self, condition: bool, text: str) -> None:
        if not condition:
            raise Violation(f"[{self.mode}] {text}")
        self.checks += 1

    def run(self) -> Dict[str, Any]:
        started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix=f"fluxcrash-{self.mode}-")
        socket_path = os.path.join(self.dir, "fluxd.sock")
        data_dir = os.path.join(self.dir, "data")
        self.fluxd = Fluxd(socket_path, data_dir, self.dir, ["--durability", self.mode, *self.fluxd_args])
        self.shared = shared = Shared()
        self.store = StoreActor(shared, socket_path)
        self.clients = [ClientActor(shared, socket_path, k) for k in range(self.nclients)]
        ok = False
        try:
            self.fluxd.start()
            self.store.start()
            wait_until(lambda: self.store.registrations >= 1, 30, "the store's first registration", shared.cv)
            for c in self.clients:
                c.start()
            for r in range(1, self.rounds + 1):
                self.round(r)
            self.finish()
            ok = True
        finally:
            with shared.cv:
                shared.stop = True
                shared.cv.notify_all()
            for actor in [self.store, *self.clients]:
                if actor.is_alive():
                    actor.join(timeout=10)
            if self.fluxd.running:
                self.fluxd.stop()
            self.elapsed = time.monotonic() - started
            if ok and not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:
                self.log(f"[{self.mode}] kept {self.dir} (fluxd logs fluxd-N.log)")
        return self.summary()

    def raise_violations(self) -> None:
        with self.shared.cv:
            found = list(self.shared.violations)
        if found:
            raise Violation(f"[{self.mode}] {len(found)} violations:\n  " + "\n  ".join(found[:30]))
        self.checks += 1

    def round(self, r: int) -> None:
        shared = self.shared
        total = self.per_round * self.nclients
        kill_after = self.rng.randrange(total)
        jitter = self.rng.uniform(0, 0.005)
        # Mostly a crash; sometimes a clean stop (SIGTERM: bye "restart", a checkpoint, unsettled work kept).
        how = "SIGTERM" if self.term_share and self.rng.random() < self.term_share else "SIGKILL"
        with shared.cv:
            shared.round_settled = 0
            for c in self.clients:
                c.budget += self.per_round
            shared.cv.notify_all()
        wait_until(lambda: shared.round_settled >= kill_after or bool(shared.violations)
                   or all(c.done() for c in self.clients), self.timeout,
                   f"{kill_after} settlements in round {r}", shared.cv)
        self.raise_violations()
        time.sleep(jitter)  # a seeded moment inside the traffic, not a synchronisation
        if how == "SIGKILL":
            self.fluxd.kill()
        else:
            status = self.fluxd.stop()
            self.check(status == 0, f"round {r}: fluxd exited {status} on SIGTERM:\n{self.fluxd.stderr()[-3000:]}")
            self.clean_stops += 1
        # Every actor sees its connection end (frames still buffered are read first).
        wait_until(lambda: not self.store.connected and not any(c.connected for c in self.clients), 30,
                   f"every connection to end after {how}", shared.cv)
        with shared.cv:
            seen_settled = {aid: s for c in self.clients for aid, s in c.settled.items()}
            not_sent = {aid for c in self.clients for aid in c.not_sent}
            max_version = max(c.max_version for c in self.clients)
            shared.fluxd_run += 1
            settled_in_round = shared.round_settled
        self.fluxd.start()
        log = self.fluxd.stderr()
        if "dropped a torn last record" in log:
            self.torn += 1
        self.check_state(f"after restart {r}", seen_settled, not_sent, max_version)
        self.log(f"[{self.mode}] round {r}: {how} after {settled_in_round} settlements (target {kill_after}); "
                 f"{len(seen_settled)} settled so far; restart ok")

    def checker(self) -> Conn:
        conn = connect(self.fluxd.socket_path, "client", "crash-checker")
        self.check(conn.welcome.get("epoch") == (self.store.epoch or conn.welcome.get("epoch")),
                   f"epoch {conn.welcome.get('epoch')} is the store's {self.store.epoch}")
        self.check(conn.welcome.get("durability") == self.mode,
                   f"welcome.durability {conn.welcome.get('durability')} is {self.mode}")
        return conn

    def check_state(self, when: str, seen_settled: Dict[str, Dict[str, Any]], not_sent: Set[str],
                    max_version: int) -> Dict[str, Any]:
        conn = self.checker()
        try:
            got = conn.request({"op": "get", "store": STORE}, "got")
        finally:
            conn.close()
        self.check(got.get("op") == "got", f"{when}: get {STORE}: {got}")
        state = got["state"]
        self.check(got["version"] >= max_version,
                   f"{when}: the retained version {got['version']} is below version {max_version} a client saw")
        twice = {k: v for k, v in state.items() if v != 1}
        self.check(not twice, f"{when}: ids counted more than once in the retained state: {twice}")
        missing = sorted(aid for aid in seen_settled if aid not in state)
        self.check(not missing, f"{when}: {len(missing)} settled actions are not in the retained state: "
                                f"{missing[:10]} (e.g. {missing[0] if missing else ''}: "
                                f"{seen_settled.get(missing[0]) if missing else ''})")
        ghosts = sorted(aid for aid in not_sent if aid in state)
        self.check(not ghosts, f"{when}: actions reported not sent are in the state: {ghosts[:10]}")
        return got

    def finish(self) -> None:
        shared = self.shared
        with shared.cv:
            shared.finishing = True
            shared.cv.notify_all()
        wait_until(lambda: all(c.done() for c in self.clients) or bool(shared.violations), self.timeout,
                   "every dispatch to be settled or reported not sent", shared.cv)
        self.raise_violations()
        # The store has answered everything: nothing queued or in flight for it.
        conn = self.checker()
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                info = conn.request({"op": "info"}, "info")
                entry = next(s for s in info["stores"] if s["name"] == STORE)
                if entry["queued"] == 0 and entry["inflight"] == 0:
                    break
                if time.monotonic() > deadline:
                    raise Violation(f"[{self.mode}] the store still has work after {self.timeout} s: {entry}")
                time.sleep(0.02)  # polling fluxd's counters: there is no event for "queue empty"
            history = self.read_history(conn)
        finally:
            conn.close()
        with shared.cv:
            dispatched = {f"{c.index}-{n}" for c in self.clients for n in range(1, c.next)}
            settled = {aid: s for c in self.clients for aid, s in c.settled.items()}
            not_sent = {aid: why for c in self.clients for aid, why in c.not_sent.items()}
            max_version = max(c.max_version for c in self.clients)
        self.check(not (set(settled) & set(not_sent)), "no id is both settled and not sent")
        unresolved = dispatched - set(settled) - set(not_sent)
        self.check(not unresolved, f"every dispatch is settled or reported not sent; unresolved: {sorted(unresolved)[:10]}")
        got = self.check_state("at the end", settled, set(not_sent), max_version)
        state = got["state"]
        strangers = sorted(set(state) - dispatched)
        self.check(not strangers, f"ids in the state that no client dispatched: {strangers[:10]}")
        self.check(len(state) == len(settled), f"the state holds {len(state)} ids, {len(settled)} were settled")
        self.check_seqs()
        if history is None:
            self.history_checked = False
        else:
            replay: Dict[str, int] = {}
            for entry in history:
                for result in entry.get("results", []):
                    if result.get("store") == STORE and result.get("status") == "done":
                        aid = entry["payload"]["id"]
                        replay[aid] = replay.get(aid, 0) + 1
            # What history retains: every action from `first` on (test_history.py checks how much it keeps).
            retained = {aid: n for aid, n in state.items() if settled[aid]["seq"] >= self.history_first}
            diff = {k: (retained.get(k), replay.get(k)) for k in set(retained) | set(replay)
                    if retained.get(k) != replay.get(k)}
            self.check(not diff, f"the final state differs from a replay of history's done results "
                                 f"(state, replay): {dict(list(diff.items())[:10])}")
            self.history_checked = True
        self.raise_violations()

    def check_seqs(self) -> None:
        """R1 across restarts: every new action of a later fluxd run has a seq above all seqs of earlier runs."""
        by_run = self.store.seqs_by_run
        highest = 0
        for run in sorted(by_run):
            seqs = by_run[run]
            self.check(min(seqs) > highest, f"run {run}: a new action has seq {min(seqs)}, not above {highest} "
                                            f"of the runs before (a seq reused)")
            highest = max(highest, max(seqs))
        # A redelivered action was accepted by an earlier run (whether or not it reached the store then): its seq
        # is below every new seq of the run that redelivers it.
        for run, seqs in self.store.redelivered_by_run.items():
            new = by_run.get(run)
            if new:
                self.check(max(seqs) < min(new), f"run {run}: redelivered seq {max(seqs)} is not below the run's "
                                                 f"first new seq {min(new)}")

    def read_history(self, conn: Conn) -> Optional[List[Dict[str, Any]]]:
        """Every history entry (§8.12), or None (with a note) when fluxd does not answer history."""
        entries: List[Dict[str, Any]] = []
        start: Optional[int] = None
        while True:
            request: Dict[str, Any] = {"op": "history", "limit": 1000}
            if start is not None:
                request["from"] = start
            reply = conn.request(request, "history", timeout=30)
            if reply.get("op") == "error":
                note = f"[{self.mode}] history check skipped: fluxd answered history with {reply.get('code')} " \
                       f"({reply.get('message')})"
                self.notes.append(note)
                self.log(note)
                return None
            if start is None:
                self.history_first = reply.get("first", 0)
                if self.history_first > 1:
                    note = f"[{self.mode}] history starts at seq {self.history_first}: the replay is compared " \
                           f"with the actions from there on only"
                    self.notes.append(note)
            entries.extend(reply.get("entries", []))
            if "next" not in reply:
                return entries
            start = reply["next"]

    def summary(self) -> Dict[str, Any]:
        c = self.shared.counters
        return {"mode": self.mode, "rounds": self.rounds, "actions": c["dispatched"], "settled": c["settled"],
                "recovered": c["recovered"], "recovered-settled": c["recovered-settled"],
                "recovered-pending": c["recovered-pending"], "recovered-unknown": c["recovered-unknown"],
                "refused": c["refused"], "redelivered": c["redelivered"], "skipped": c["skipped"],
                "torn-restarts": self.torn, "clean-stops": self.clean_stops, "history": self.history_checked,
                "checks": self.checks,
                "seconds": round(self.elapsed, 1), "notes": self.notes}


def format_summary(s: Dict[str, Any]) -> str:
    history = {True: "checked", False: "skipped (not answered)", None: "not reached"}[s["history"]]
    return (f"{s['mode']:>6}: {s['rounds']} rounds ({s['clean-stops']} of them a clean stop), {s['actions']} actions, {s['settled']} settled live, "
            f"{s['recovered']} recovered ({s['recovered-settled']} settled, {s['recovered-pending']} pending, "
            f"{s['recovered-unknown']} unknown), {s['refused']} refused, {s['redelivered']} redelivered "
            f"({s['skipped']} skipped by the store), {s['torn-restarts']} restarts dropped a torn record, "
            f"history replay {history}, {s['checks']} checks passed, {s['seconds']} s")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--per-round", type=int, default=12, help="dispatches per client per round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--modes", default="always,batch")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data directories and fluxd logs")
    parser.add_argument("--quiet", action="store_true", help="no line per round")
    parser.add_argument("--segment-bytes", type=int, default=None,
                        help="fluxd --segment-bytes (small: segments roll over into checkpoints during the test)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"crash test: seed {seed}, {args.rounds} rounds per mode, {args.clients} clients x {args.per_round} "
          f"dispatches per round, modes {args.modes}", flush=True)
    summaries = []
    failed = False
    for mode in args.modes.split(","):
        extra = ["--segment-bytes", str(args.segment_bytes)] if args.segment_bytes else []
        test = CrashTest(mode, args.rounds, args.per_round, seed, args.clients,
                         log=(lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True)), keep=args.keep,
                         fluxd_args=extra)
        try:
            summaries.append(test.run())
        except AssertionError as e:
            failed = True
            print(f"FAILED [{mode}] (seed {seed}): {e}", flush=True)
            summaries.append(test.summary())
    print("summary (seed %d):" % seed)
    for s in summaries:
        print("  " + format_summary(s))
        for note in s["notes"]:
            print("    note: " + note)
    print("FAILED" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
