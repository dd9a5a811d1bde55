"""Query deltas: a Store registers with ``queryDeltas``, takes the full ``queries`` once and then
``queries-changed``, and shows user code the same full set as before (fake fluxd, then the real one)."""
import random
import threading

import pytest

from fakefluxd import FakeFluxd
from fluxbus import ActiveQuery, Client, Store
from fluxbus.wire import QuerySet, dumps


class Watched(Store):
    """Records every set on_queries is called with; ``until(pred)`` waits for one satisfying pred."""
    name = "watched"
    handles = []
    initial_state = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []
        self.ops = {}
        self._changed = threading.Condition()

    def handle_message(self, msg):
        self.ops[msg.get("op")] = self.ops.get(msg.get("op"), 0) + 1
        super().handle_message(msg)

    def on_queries(self, queries):
        with self._changed:
            self.seen.append(queries)
            self._changed.notify_all()

    def until(self, predicate, timeout=10.0):
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.queries), timeout), \
                f"store saw {self.queries}"


def as_pairs(queries):
    return [(dumps(q.query), q.count) for q in queries]


def full_set(counts):
    """What fluxd's full `queries` would list: count ≥ 1, sorted by the canonical bytes."""
    return [(key, n) for key, n in sorted(counts.items()) if n > 0]


def test_query_set_applies_deltas():
    qs = QuerySet()
    qs.replace([{"query": {"site": 7}, "count": 2}, {"query": "a", "count": 1}])
    assert [(q.query, q.count) for q in qs.active] == [("a", 1), ({"site": 7}, 2)]
    qs.apply([{"query": {"site": 7}, "count": 0}, {"query": {"b": [1, {"y": 1, "x": 2}]}, "count": 3}])
    assert [(q.query, q.count) for q in qs.active] == [("a", 1), ({"b": [1, {"x": 2, "y": 1}]}, 3)]
    qs.apply([{"query": {"site": 9}, "count": 0}])  # withdrawing an unknown query is harmless
    assert len(qs) == 2
    qs.replace([])
    assert qs.active == []


def register_with_fake(fake, store_cls, initial_queries):
    store = store_cls(socket_path=fake.socket_path)
    starting = threading.Thread(target=store.start)
    starting.start()
    peer = fake.accept()
    register = peer.expect_op("register")
    peer.send({"op": "registered", "store": store.name, "version": 0, "seq": 0, "resumed": False})
    peer.send({"op": "queries", "store": store.name, "queries": initial_queries})
    starting.join(5)
    assert store.ready.is_set()
    return store, peer, register


def test_store_keeps_the_set_from_deltas_fake():
    fake = FakeFluxd()
    rng = random.Random(1)
    universe = [{"site": n} for n in range(12)] + ["plain", {"nested": {"b": 1, "a": [True, None]}}, 0, []]
    counts = {dumps(q): 0 for q in universe}
    by_key = {dumps(q): q for q in universe}
    counts[dumps(universe[0])] = 2
    store, peer, register = register_with_fake(fake, Watched, [{"query": universe[0], "count": 2}])
    try:
        assert register["queryDeltas"] is True
        assert as_pairs(store.queries) == full_set(counts)
        for round in range(60):
            changed = rng.sample(sorted(counts), rng.randint(1, 4))
            for key in changed:
                counts[key] = max(0, counts[key] + rng.choice([-2, -1, 1, 1, 3]))
            before = len(store.seen)
            peer.send({"op": "queries-changed", "store": "watched",
                       "changes": [{"query": by_key[k], "count": counts[k]} for k in sorted(changed)]})
            store.until(lambda _: len(store.seen) > before)
            assert as_pairs(store.queries) == full_set(counts), f"round {round}"
            assert as_pairs(store.seen[-1]) == full_set(counts)
        assert all(isinstance(q, ActiveQuery) for q in store.queries)
        # a full `queries` (e.g. after re-registration) replaces everything kept so far
        peer.send({"op": "queries", "store": "watched", "queries": [{"query": "only", "count": 1}]})
        store.until(lambda qs: as_pairs(qs) == [(b'"only"', 1)])
    finally:
        store.stop()
        peer.expect_op("bye")
        fake.close()


def test_store_can_ask_for_whole_sets():
    class Whole(Watched):
        query_deltas = False

    fake = FakeFluxd()
    store, peer, register = register_with_fake(fake, Whole, [])
    try:
        assert "queryDeltas" not in register
    finally:
        store.stop()
        fake.close()


def test_live_many_clients_adding_and_removing_queries(fluxd):
    """Clients add and withdraw overlapping queries on two stores: one with deltas, one with whole sets. Each
    store's view must equal the set the test's own bookkeeping predicts, after every burst."""
    class Whole(Watched):
        name = "whole"
        query_deltas = False

    deltas = Watched(socket_path=fluxd.socket_path)
    whole = Whole(socket_path=fluxd.socket_path)
    threads = [deltas.start(), whole.start()]
    clients = [Client.connect(fluxd.socket_path, name=f"q{i}") for i in range(6)]
    rng = random.Random(7)
    universe = [{"site": n % 5, "lang": ["en", "fr"][n % 2]} for n in range(10)] + ["all", {"é/ü": "\u00e9"}]
    live = []  # (client index, store name, receipt)
    try:
        for burst in range(8):
            for _ in range(25):
                if live and rng.random() < 0.45:
                    _, _, receipt = live.pop(rng.randrange(len(live)))
                    receipt.close()
                else:
                    i = rng.randrange(len(clients))
                    query = rng.choice(universe)
                    for name in ("watched", "whole"):
                        live.append((i, name, clients[i].query(name, query)))
            for store in (deltas, whole):
                counts = {}
                for _, name, receipt in live:
                    if name == store.name:
                        counts[dumps(receipt.query)] = counts.get(dumps(receipt.query), 0) + 1
                store.until(lambda qs: as_pairs(qs) == full_set(counts))
        # a client going away withdraws all of its queries at once
        clients[0].close()
        live = [entry for entry in live if entry[0] != 0]
        for store in (deltas, whole):
            counts = {}
            for _, name, receipt in live:
                if name == store.name:
                    counts[dumps(receipt.query)] = counts.get(dumps(receipt.query), 0) + 1
            store.until(lambda qs: as_pairs(qs) == full_set(counts))
        assert deltas.ops.get("queries-changed", 0) > 0 and deltas.ops.get("queries", 0) == 0
        assert whole.ops.get("queries", 0) > 0 and whole.ops.get("queries-changed", 0) == 0
    finally:
        for client in clients:
            client.close()
        for store in (deltas, whole):
            store.stop()
        for thread in threads:
            thread.join(10)
