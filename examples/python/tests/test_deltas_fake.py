"""SPEC §16 in the library, scripted with the fake fluxd (which announces ``limits.deltaHistory``): stores answer
with ``patch`` + ``base``, publish with the ``patch`` op, reconnect after ``patch-failed`` and adopt the retained
snapshot; clients apply ``delta`` frames, resynchronise on a gap, resume with ``from``, and hold path
subscriptions (``subtree``)."""
import asyncio
import threading

import pytest

from fakefluxd import LIMITS, FakeFluxd
from fluxbus import AsyncClient, AsyncStore, Client, Reconnect, Store, Subtree, on
from fluxbus.patch import apply

FAST = Reconnect(initial_delay=0.01, max_delay=0.05)
LIMITS16 = {**LIMITS, "deltaHistory": 1048576}
INITIAL = {"todos": [{"id": 1, "done": False}, {"id": 2, "done": False}], "nextID": 3}


class Todos(Store):
    name = "todos"
    handles = ["todo/*"]
    initial_state = INITIAL
    reconnect = FAST

    @on("todo/toggle")
    def toggle(self, state, payload, ctx):
        for todo in state["todos"]:
            if todo["id"] == payload["id"]:
                todo["done"] = not todo["done"]
        return state

    @on("todo/add")
    def add(self, state, payload, ctx):
        state["todos"].append({"id": state["nextID"], "done": False})
        state["nextID"] += 1
        return state

    @on("todo/noop")
    def noop(self, state, payload, ctx):
        state["nextID"] = state["nextID"]  # written, not changed
        return state


class SharedTodos(Todos):
    handler_state = "shared"

    @on("todo/toggle")
    def toggle(self, state, payload, ctx):
        todos = [{**t, "done": not t["done"]} if t["id"] == payload["id"] else t for t in state["todos"]]
        return {**state, "todos": todos}

    @on("todo/add")
    def add(self, state, payload, ctx):
        return {**state, "todos": state["todos"] + [{"id": state["nextID"], "done": False}],
                "nextID": state["nextID"] + 1}


class CopiedTodos(Todos):
    handler_state = "copy"


def start_store(fake, cls, version=1, state=INITIAL, seq=0):
    store = cls(socket_path=fake.socket_path)
    starting = threading.Thread(target=store.start)
    starting.start()
    peer = fake.accept()
    register = peer.expect_op("register")
    peer.send({"op": "registered", "store": store.name, "version": version, "seq": seq, "resumed": version > 0})
    if version:
        peer.send({"op": "snapshot", "store": store.name, "version": version, "seq": seq, "state": state})
    peer.send({"op": "queries", "store": store.name, "queries": []})
    starting.join(5)
    assert store.ready.is_set()
    return store, peer, register


def action(peer, seq, type, payload):
    peer.send({"op": "action", "store": "todos", "seq": seq, "type": type, "origin": 1, "payload": payload})
    return peer.expect(lambda m: m.get("op") in ("done", "reject") and m.get("seq") == seq, what=f"answer {seq}")


@pytest.fixture
def fake():
    daemon = FakeFluxd(limits=LIMITS16)
    yield daemon
    daemon.close()


@pytest.mark.parametrize("cls", [Todos, SharedTodos, CopiedTodos])
def test_store_answers_with_patches_from_the_adopted_version(fake, cls):
    store, peer, _ = start_store(fake, cls, version=5)
    try:
        held = INITIAL
        done = action(peer, 1, "todo/toggle", {"id": 2})
        assert "state" not in done and done["base"] == 5
        assert done["patch"] == [{"op": "replace", "path": "/todos/1/done", "value": True}]
        held = apply(held, done["patch"])
        done = action(peer, 2, "todo/add", {})
        assert done["base"] == 6 and "state" not in done
        held = apply(held, done["patch"])
        assert held == store.state == {"todos": [{"id": 1, "done": False}, {"id": 2, "done": True},
                                                 {"id": 3, "done": False}], "nextID": 4}
        done = action(peer, 3, "todo/noop", {})
        assert "patch" not in done and "state" not in done  # nothing changed: no version
        assert store.version == 7 and store.patches_sent == 2 and store.states_sent == 0
        assert INITIAL["todos"][1]["done"] is False  # the state given never changes in place
    finally:
        store.stop()


def test_store_without_a_retained_state_sends_it_whole_then_patches(fake):
    class Empty(Todos):
        initial_state = None

        @on("todo/init")
        def init(self, state, payload, ctx):
            assert state is None
            return {"todos": [{"id": 1, "done": True}], "nextID": 2}
    store, peer, register = start_store(fake, Empty, version=0)
    try:
        assert "state" not in register
        done = action(peer, 1, "todo/init", {})
        assert "patch" not in done and done["state"]["todos"][0]["done"] is True
        done = action(peer, 2, "todo/toggle", {"id": 1})
        assert done["base"] == 1 and done["patch"] == [{"op": "replace", "path": "/todos/0/done", "value": False}]
    finally:
        store.stop()


def test_a_handler_that_fails_leaves_no_trace_and_non_json_is_rejected(fake):
    class Broken(Todos):
        @on("todo/boom")
        def boom(self, state, payload, ctx):
            state["todos"][0]["done"] = True
            raise ValueError("boom")

        @on("todo/bad")
        def bad(self, state, payload, ctx):
            state["todos"][0]["when"] = {1, 2}
            return state
    store, peer, _ = start_store(fake, Broken, version=2)
    try:
        assert action(peer, 1, "todo/boom", {})["op"] == "reject"
        assert action(peer, 2, "todo/bad", {})["error"]["code"] == "store/error"
        assert store.state == INITIAL and store.version == 2
        done = action(peer, 3, "todo/toggle", {"id": 1})
        assert done["base"] == 2
    finally:
        store.stop()


def test_publish_sends_the_patch_op(fake):
    store, peer, _ = start_store(fake, Todos, version=3)
    try:
        store.publish({**store.state, "nextID": 10})
        msg = peer.expect_op("patch")
        assert msg == {"op": "patch", "store": "todos", "base": 3,
                       "patch": [{"op": "replace", "path": "/nextID", "value": 10}]}
        store.state["nextID"] = 11  # changed in place: cannot be diffed, goes out whole
        store.publish(store.state)
        assert peer.expect_op("state")["state"]["nextID"] == 11
        done = action(peer, 1, "todo/toggle", {"id": 1})
        assert "base" not in done and done["patch"]  # the version the whole state made is not known
    finally:
        store.stop()


def test_patch_failed_reconnects_and_adopts_the_retained_snapshot(fake):
    store, peer, _ = start_store(fake, Todos, version=4)
    try:
        done = action(peer, 7, "todo/toggle", {"id": 1})
        assert done["base"] == 4
        peer.send({"op": "error", "code": "patch-failed", "message": "base 4 is not the retained version 9",
                   "ref": "todos", "fatal": True})
        peer.hang_up()
        again = fake.accept()
        register = again.expect_op("register")
        assert register["state"]["todos"][0]["done"] is True  # it offers what it has
        retained = {"todos": [{"id": 1, "done": False}], "nextID": 2}
        again.send({"op": "registered", "store": "todos", "version": 9, "seq": 6, "resumed": True})
        again.send({"op": "snapshot", "store": "todos", "version": 9, "seq": 6, "state": retained})
        again.send({"op": "queries", "store": "todos", "queries": []})
        done = action(again, 7, "todo/toggle", {"id": 1})  # delivered again
        assert done["base"] == 9 and done["patch"] == [{"op": "replace", "path": "/todos/0/done", "value": True}]
        assert store.state == {"todos": [{"id": 1, "done": True}], "nextID": 2} and store.version == 10
    finally:
        store.stop()


def test_async_store_answers_with_patches(fake):
    class AsyncTodos(AsyncStore):
        name = "todos"
        handles = ["todo/*"]
        initial_state = INITIAL

        @on("todo/toggle")
        async def toggle(self, state, payload, ctx):
            state["todos"][payload["id"] - 1]["done"] = True
            return state

    async def main(peer_box):
        store = AsyncTodos(socket_path=fake.socket_path)
        loop = asyncio.get_running_loop()

        def script():
            peer = fake.accept()
            peer.expect_op("register")
            peer.send({"op": "registered", "store": "todos", "version": 2, "seq": 0, "resumed": False})
            peer.send({"op": "snapshot", "store": "todos", "version": 2, "seq": 0, "state": INITIAL})
            peer.send({"op": "queries", "store": "todos", "queries": []})
            peer_box.append(peer)
        scripted = loop.run_in_executor(None, script)
        await store.start()
        await scripted
        peer = peer_box[0]
        answer = loop.run_in_executor(None, action, peer, 1, "todo/toggle", {"id": 2})
        done = await answer
        await store.publish({**store.state, "nextID": 5})
        published = await loop.run_in_executor(None, peer.expect_op, "patch")
        await store.stop()
        return done, published
    done, published = asyncio.run(main([]))
    assert done["base"] == 2 and done["patch"] == [{"op": "replace", "path": "/todos/1/done", "value": True}]
    assert published["base"] == 3


# -- clients ------------------------------------------------------------------------------------------------------

def subscribe_scripted(fake, client, **options):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("sub", client.subscribe("todos", **options)))
    thread.start()
    return thread, result


def test_client_applies_deltas_and_resyncs_on_a_gap(fake):
    client = Client.connect(fake.socket_path, reconnect=False)
    peer = fake.accept()
    try:
        thread, result = subscribe_scripted(fake, client)
        request = peer.expect_op("subscribe")
        assert request == {"op": "subscribe", "store": "todos", "deltas": True}
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 1, "deltas": True})
        thread.join(5)
        sub = result["sub"]
        peer.send({"op": "snapshot", "store": "todos", "version": 1, "seq": 0, "state": INITIAL})
        peer.send({"op": "delta", "store": "todos", "from": 1, "version": 2, "seq": 4,
                   "patch": [{"op": "replace", "path": "/todos/0/done", "value": True}]})
        assert sub.next(timeout=5).state == INITIAL
        second = sub.next(timeout=5)
        assert (second.version, second.seq) == (2, 4) and second.state["todos"][0]["done"] is True
        assert second.state["todos"][1] is INITIAL["todos"][1] or second.state["todos"][1] == INITIAL["todos"][1]
        # a gap: from 5, not 2 -> subscribe again (without from), ignore deltas until the snapshot
        peer.send({"op": "delta", "store": "todos", "from": 5, "version": 6, "seq": 9, "patch": []})
        client.poll(0.2)
        assert peer.expect_op("subscribe") == {"op": "subscribe", "store": "todos", "deltas": True}
        assert sub.resyncs == 1
        peer.send({"op": "delta", "store": "todos", "from": 6, "version": 7, "seq": 10, "patch": []})
        retained = {"todos": [], "nextID": 9}
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 7, "deltas": True})
        peer.send({"op": "snapshot", "store": "todos", "version": 7, "seq": 10, "state": retained})
        peer.send({"op": "delta", "store": "todos", "from": 7, "version": 8, "seq": 11,
                   "patch": [{"op": "add", "path": "/todos/-", "value": {"id": 9}}]})
        assert sub.next(timeout=5).state == retained
        assert sub.next(timeout=5).state == {"todos": [{"id": 9}], "nextID": 9}
        assert sub.deltas_applied == 2 and sub.latest.version == 8
        # a delta that does not apply: resync too
        peer.send({"op": "delta", "store": "todos", "from": 8, "version": 9, "seq": 12,
                   "patch": [{"op": "remove", "path": "/nothing"}]})
        client.poll(0.2)
        assert peer.expect_op("subscribe") and sub.resyncs == 2 and sub.latest.version == 8
    finally:
        client.abort()


def test_full_subscription_when_asked_and_no_deltas_from_an_older_fluxd(fake):
    client = Client.connect(fake.socket_path, reconnect=False)
    peer = fake.accept()
    try:
        thread, result = subscribe_scripted(fake, client, deltas=False)
        assert peer.expect_op("subscribe") == {"op": "subscribe", "store": "todos"}
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 0})
        thread.join(5)
        assert result["sub"].deltas is False
    finally:
        client.abort()
    old = FakeFluxd()  # no deltaHistory: fluxd before 0.4
    try:
        client = Client.connect(old.socket_path, reconnect=False)
        peer = old.accept()
        thread, result = subscribe_scripted(old, client)
        assert peer.expect_op("subscribe") == {"op": "subscribe", "store": "todos"}
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 0})
        thread.join(5)
        with pytest.raises(ValueError):
            client.subscribe("todos", path="/todos/0")
        client.abort()
    finally:
        old.close()


def test_client_resumes_from_the_version_it_holds_after_reconnecting(fake):
    fake.welcome_extra = {"epoch": "e1"}
    client = Client.connect(fake.socket_path, reconnect=FAST)
    peer = fake.accept()
    try:
        thread, result = subscribe_scripted(fake, client)
        peer.expect_op("subscribe")
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 3, "deltas": True})
        thread.join(5)
        sub = result["sub"]
        peer.send({"op": "snapshot", "store": "todos", "version": 3, "seq": 2, "state": INITIAL})
        assert sub.next(timeout=5).version == 3
        peer.hang_up()
        again = fake.accept()
        assert again.expect_op("subscribe") == {"op": "subscribe", "store": "todos", "deltas": True, "from": 3}
        again.send({"op": "subscribed", "store": "todos", "status": "up", "version": 4, "deltas": True})
        again.send({"op": "delta", "store": "todos", "from": 3, "version": 4, "seq": 5,
                    "patch": [{"op": "replace", "path": "/nextID", "value": 4}]})
        assert sub.next(timeout=5).state["nextID"] == 4
        # another epoch: no from, and the next snapshot whatever its version
        fake.welcome_extra = {"epoch": "e2"}
        again.hang_up()
        third = fake.accept()
        assert third.expect_op("subscribe") == {"op": "subscribe", "store": "todos", "deltas": True}
        third.send({"op": "subscribed", "store": "todos", "status": "up", "version": 1, "deltas": True})
        third.send({"op": "delta", "store": "todos", "from": 0, "version": 1, "seq": 0, "patch": []})
        third.send({"op": "snapshot", "store": "todos", "version": 1, "seq": 0, "state": {"fresh": True}})
        assert sub.next(timeout=5).state == {"fresh": True}
    finally:
        client.abort()


def test_path_subscriptions(fake):
    client = Client.connect(fake.socket_path, reconnect=False)
    peer = fake.accept()
    try:
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            whole=client.subscribe("todos", deltas=False), one=client.subscribe("todos", path="/todos/1")))
        thread.start()
        peer.expect_op("subscribe")
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 2})
        peer.send({"op": "snapshot", "store": "todos", "version": 2, "seq": 1, "state": INITIAL})
        request = peer.expect_op("subscribe")
        assert request == {"op": "subscribe", "store": "todos", "path": "/todos/1"}
        peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 2, "path": "/todos/1"})
        peer.send({"op": "subtree", "store": "todos", "path": "/todos/1", "version": 2, "seq": 1, "exists": True,
                   "value": {"id": 2, "done": False}})
        thread.join(5)
        one = result["one"]
        first = one.next(timeout=5)
        assert first == Subtree("todos", "/todos/1", 2, 1, True, {"id": 2, "done": False})
        assert first.state == first.value and one.state == {"id": 2, "done": False}
        peer.send({"op": "subtree", "store": "todos", "path": "/todos/1", "version": 5, "seq": 4, "exists": False})
        gone = one.next(timeout=5)
        assert (gone.version, gone.exists, gone.value) == (5, False, None)
        peer.send({"op": "store-down", "store": "todos", "reason": "disconnected"})
        client.poll(0.2)
        assert one.status == "down" and result["whole"].status == "down"
        closing = threading.Thread(target=one.close)
        closing.start()
        assert peer.expect_op("unsubscribe") == {"op": "unsubscribe", "store": "todos", "path": "/todos/1"}
        peer.send({"op": "unsubscribed", "store": "todos", "path": "/todos/1"})
        closing.join(5)
        assert not closing.is_alive()
        assert "todos" in client._subscriptions and "todos|/todos/1" not in client._subscriptions
        with pytest.raises(ValueError):
            client.subscribe("todos", path="todos")  # not a pointer
        with pytest.raises(ValueError):
            client.subscribe("todos", path="/a", deltas=True)
    finally:
        client.abort()


def test_async_client_applies_deltas_and_path_subscriptions(fake):
    async def main():
        loop = asyncio.get_running_loop()
        client = await AsyncClient.connect(fake.socket_path, reconnect=False)
        peer = await loop.run_in_executor(None, fake.accept)

        def script():
            peer.expect_op("subscribe")
            peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 1, "deltas": True})
            peer.send({"op": "snapshot", "store": "todos", "version": 1, "seq": 0, "state": INITIAL})
            peer.send({"op": "delta", "store": "todos", "from": 1, "version": 2, "seq": 3,
                       "patch": [{"op": "remove", "path": "/todos/0"}]})
            assert peer.expect_op("subscribe")["path"] == "/nextID"
            peer.send({"op": "subscribed", "store": "todos", "status": "up", "version": 2, "path": "/nextID"})
            peer.send({"op": "subtree", "store": "todos", "path": "/nextID", "version": 2, "seq": 3,
                       "exists": True, "value": 3})
        scripted = loop.run_in_executor(None, script)
        sub = await client.subscribe("todos")
        assert (await sub.next(timeout=5)).version == 1
        second = await sub.next(timeout=5)
        path = await client.subscribe("todos", path="/nextID")
        value = await path.next(timeout=5)
        await scripted
        await client.close()
        return second, value
    second, value = asyncio.run(main())
    assert second.state == {"todos": [{"id": 2, "done": False}], "nextID": 3}
    assert value.value == 3 and value.exists
