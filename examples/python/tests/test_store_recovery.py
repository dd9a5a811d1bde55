"""Stores that reconnect (SPEC §15.3, §15.5), scripted with the fake fluxd: the store registers again offering
its current state, adopts the snapshot fluxd sends after ``registered`` even when it holds a newer state
(rule 1), answers ``done`` without running the handler to an action whose seq the adopted snapshot already
includes (rule 2), and never answers on a new connection an action of the lost one."""
import asyncio
import concurrent.futures
import queue
import threading

import pytest

from fakefluxd import FakeFluxd
from fluxbus import AsyncStore, Reconnect, Store, on

FAST = Reconnect(initial_delay=0.01, max_delay=0.05)
INITIAL = {"n": 0, "seen": []}


def added(state, by, seq):
    return {"n": state["n"] + by, "seen": state["seen"] + [seq]}


class Counter(Store):
    name = "counter"
    handles = ["counter/*"]
    initial_state = INITIAL
    reconnect = FAST

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.registered = []
        self.events = queue.Queue()

    def on_connection_event(self, event):
        self.events.put(event.kind)

    def wait_event(self, kind):
        while True:
            seen = self.events.get(timeout=10)
            if seen == kind:
                return

    @on("counter/add")
    def add(self, state, payload, ctx):
        self.calls.append((ctx.seq, ctx.redelivered))
        self.entered.set()
        assert self.gate.wait(10)
        return added(state, payload["by"], ctx.seq)

    def on_registered(self, resumed):
        self.registered.append(resumed)


class AsyncCounter(AsyncStore):
    name = "counter"
    handles = ["counter/*"]
    initial_state = INITIAL
    reconnect = FAST

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    @on("counter/add")
    async def add(self, state, payload, ctx):
        self.calls.append((ctx.seq, ctx.redelivered))
        return added(state, payload["by"], ctx.seq)


@pytest.fixture
def fake():
    server = FakeFluxd(welcome_extra={"epoch": "e1"})
    yield server
    server.close()


@pytest.fixture
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(2)
    yield executor
    executor.shutdown(wait=False)


def register(peer, version, seq, state, resumed=False):
    """fluxd's answer to register: registered, the retained snapshot (if any), the queries."""
    peer.send({"op": "registered", "store": "counter", "version": version, "seq": seq, "resumed": resumed})
    if version:
        peer.send({"op": "snapshot", "store": "counter", "version": version, "seq": seq if state is None else
                   state[1], "state": state[0] if state else None})
    peer.send({"op": "queries", "store": "counter", "queries": []})


def action(peer, seq, by, redelivered=False):
    msg = {"op": "action", "store": "counter", "seq": seq, "type": "counter/add", "origin": 9, "payload": {"by": by}}
    if redelivered:
        msg["redelivered"] = True
    peer.send(msg)


def start(fake, pool, store):
    """Starts the store (its thread) against the fake and completes its first registration."""
    starting = pool.submit(store.start)
    peer = fake.accept()
    first = peer.expect_op("register")
    assert first["state"] == INITIAL
    peer.send({"op": "registered", "store": "counter", "version": 1, "seq": 0, "resumed": False})
    peer.send({"op": "snapshot", "store": "counter", "version": 1, "seq": 0, "state": INITIAL})
    peer.send({"op": "queries", "store": "counter", "queries": []})
    starting.result(10)
    return peer


def test_rule_1_a_store_rewinds_to_the_retained_snapshot(fake, pool):
    store = Counter(socket_path=fake.socket_path)
    peer = start(fake, pool, store)
    try:
        action(peer, 1, 1)
        assert peer.expect_op("done") == {"op": "done", "store": "counter", "seq": 1, "state": added(INITIAL, 1, 1)}
        action(peer, 2, 2)
        peer.expect_op("done")
        assert store.state == {"n": 3, "seen": [1, 2]} and store.version == 1
        peer.hang_up()  # fluxd crashed having journaled the answer to 1 only
        again = fake.accept()
        offer = again.expect(what="the register after reconnecting")
        assert offer["op"] == "register" and offer["state"] == {"n": 3, "seen": [1, 2]}  # its current state
        assert offer["handles"] == ["counter/*"] and offer["queryDeltas"] is True
        again.send({"op": "registered", "store": "counter", "version": 2, "seq": 1, "resumed": True})
        again.send({"op": "snapshot", "store": "counter", "version": 2, "seq": 1, "state": added(INITIAL, 1, 1)})
        again.send({"op": "queries", "store": "counter", "queries": []})
        action(again, 2, 2, redelivered=True)  # comes again: not in the retained snapshot
        assert again.expect_op("done")["state"] == {"n": 3, "seen": [1, 2]}  # applied once, on the rewound state
        assert store.calls == [(1, False), (2, False), (2, True)]
        assert (store.adopted_seq, store.skipped_actions, store.registrations) == (1, 0, 2)
        assert store.registered == [False, True]
    finally:
        store.stop()


def test_rule_2_an_action_in_the_adopted_snapshot_is_skipped(fake, pool):
    store = Counter(socket_path=fake.socket_path)
    peer = start(fake, pool, store)
    try:
        action(peer, 1, 1)
        peer.expect_op("done")
        action(peer, 2, 2)
        peer.expect_op("done")
        peer.hang_up()  # fluxd journaled the state of 2's answer (version 3, seq 2), not its result
        again = fake.accept()
        assert again.expect_op("register")
        again.send({"op": "registered", "store": "counter", "version": 3, "seq": 1, "resumed": True})
        again.send({"op": "snapshot", "store": "counter", "version": 3, "seq": 2, "state": {"n": 3, "seen": [1, 2]}})
        again.send({"op": "queries", "store": "counter", "queries": []})
        action(again, 2, 2, redelivered=True)
        assert again.expect_op("done") == {"op": "done", "store": "counter", "seq": 2}  # no state, no handler
        action(again, 5, 10)
        assert again.expect_op("done")["state"] == {"n": 13, "seen": [1, 2, 5]}
        assert store.calls == [(1, False), (2, False), (5, False)]
        assert (store.adopted_seq, store.skipped_actions, store.version) == (2, 1, 3)
    finally:
        store.stop()


def test_registered_seq_counts_when_there_is_no_snapshot(fake, pool):
    class Stateless(Counter):
        initial_state = None

    store = Stateless(socket_path=fake.socket_path)
    starting = pool.submit(store.start)
    peer = fake.accept()
    assert "state" not in peer.expect_op("register")
    register(peer, 0, 4, None, resumed=True)  # answered up to 4, no snapshot retained
    starting.result(10)
    try:
        action(peer, 4, 1, redelivered=True)
        assert peer.expect_op("done") == {"op": "done", "store": "counter", "seq": 4}
        assert store.calls == [] and store.adopted_seq == 4
    finally:
        store.stop()


def test_an_answer_of_a_lost_connection_is_not_sent_on_the_next(fake, pool):
    store = Counter(socket_path=fake.socket_path)
    peer = start(fake, pool, store)
    try:
        store.gate.clear()
        action(peer, 1, 1)
        assert store.entered.wait(10)  # the handler runs (blocked) while the connection goes
        peer.hang_up()
        again = fake.accept()
        assert again.expect_op("register")
        store.gate.set()  # the handler returns: its done belongs to the lost connection
        again.send({"op": "registered", "store": "counter", "version": 1, "seq": 0, "resumed": True})
        again.send({"op": "snapshot", "store": "counter", "version": 1, "seq": 0, "state": INITIAL})
        again.send({"op": "queries", "store": "counter", "queries": []})
        action(again, 1, 1, redelivered=True)
        done = again.expect_op("done")
        assert done == {"op": "done", "store": "counter", "seq": 1, "state": added(INITIAL, 1, 1)}
        assert store.calls == [(1, False), (1, True)] and store.state == added(INITIAL, 1, 1)
        barrier = pool.submit(store.client.ping, 5)  # nothing else was sent: no second done for seq 1
        assert again.expect(what="the ping")["op"] == "ping" and barrier.result(5) >= 0
    finally:
        store.gate.set()
        store.stop()


def test_publish_while_reconnecting_is_not_sent(fake, pool):
    from fluxbus import NotSentError
    store = Counter(socket_path=fake.socket_path)
    peer = start(fake, pool, store)
    try:
        store.publish({"n": 5, "seen": []})
        assert peer.expect_op("state")["state"] == {"n": 5, "seen": []}
        fake.hold = threading.Event()  # the store cannot register again yet
        peer.hang_up()
        store.wait_event("reconnecting")
        with pytest.raises(NotSentError, match="not registered on the current connection"):
            store.publish({"n": 6, "seen": []})
        assert store.state == {"n": 5, "seen": []}  # kept as it was
    finally:
        fake.hold.set()
        store.stop()


def test_async_store_rewinds_and_skips(fake):
    async def scenario():
        loop = asyncio.get_running_loop()
        store = AsyncCounter(socket_path=fake.socket_path)
        starting = asyncio.ensure_future(store.start())
        peer = await loop.run_in_executor(None, fake.accept)
        assert (await loop.run_in_executor(None, peer.expect_op, "register"))["state"] == INITIAL
        register(peer, 1, 0, (INITIAL, 0))
        await starting
        try:
            action(peer, 1, 1)
            await loop.run_in_executor(None, peer.expect_op, "done")
            action(peer, 2, 2)
            await loop.run_in_executor(None, peer.expect_op, "done")
            action(peer, 3, 4)
            await loop.run_in_executor(None, peer.expect_op, "done")
            assert store.state == {"n": 7, "seen": [1, 2, 3]}
            peer.hang_up()
            again = await loop.run_in_executor(None, fake.accept)
            offer = await loop.run_in_executor(None, again.expect_op, "register")
            assert offer["state"] == {"n": 7, "seen": [1, 2, 3]}
            # retained: version 3 made by action 2; answered: up to 1 (2's result and 3 not journaled)
            register(again, 3, 1, ({"n": 3, "seen": [1, 2]}, 2), resumed=True)
            action(again, 2, 2, redelivered=True)
            action(again, 3, 4, redelivered=True)
            skipped = await loop.run_in_executor(None, again.expect_op, "done")
            applied = await loop.run_in_executor(None, again.expect_op, "done")
            assert skipped == {"op": "done", "store": "counter", "seq": 2}
            assert applied["state"] == {"n": 7, "seen": [1, 2, 3]}
            assert store.calls == [(1, False), (2, False), (3, False), (3, True)]
            assert (store.adopted_seq, store.skipped_actions, store.registrations) == (2, 1, 2)
        finally:
            await store.stop()
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_name_taken_after_reconnecting_is_tried_again(fake, pool):
    """fluxd may see the new connection's register before the end of the old one: the store reconnects and
    registers again (a few times in a row at most)."""
    store = Counter(socket_path=fake.socket_path)
    peer = start(fake, pool, store)
    try:
        peer.hang_up()
        again = fake.accept()
        assert again.expect_op("register")
        again.send({"op": "error", "code": "name-taken", "message": "counter is registered by peer 1",
                    "ref": "counter", "fatal": False})
        third = fake.accept()  # the store dropped that connection and came back
        assert third.expect_op("register")["store"] == "counter"
        register(third, 1, 0, (INITIAL, 0), resumed=True)
        action(third, 1, 1)
        assert third.expect_op("done")["seq"] == 1
        assert store.registered == [False, True] and not store.client.errors
    finally:
        store.stop()
