"""Strict, clear defaults of the Store: unhandled actions are rejected (unless the store opts into ignoring them),
handler failures are answered with a message for whoever dispatched, and the store waits without polling."""
import ast
import os
import threading

import pytest

from conftest import PACKAGE_ROOT
from fakefluxd import FakeFluxd
from fluxbus import STORE_UNHANDLED_ACTION, ActionRejectedError, Client, Reject, Store, on


class Todos(Store):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"items": []}

    @on("todo/add")
    def add(self, state, payload, ctx):
        state["items"].append({"title": payload["title"], "done": False})
        return state

    @on("todo/toggle")
    def toggle(self, state, payload, ctx):
        item = state["items"][int(payload["index"])]
        item["done"] = not item["done"]
        return state

    @on("todo/refuse")
    def refuse(self, state, payload, ctx):
        raise Reject("todo/refused", "refused on purpose", hint="ask nicely")

    @on("todo/setify")
    def setify(self, state, payload, ctx):
        return {"items": {1, 2}}  # not JSON

    @on("todo/async")
    async def asynchronous(self, state, payload, ctx):
        return state

    @on("todo/follow")
    def follow(self, state, payload, ctx):
        ctx.dispatch(payload["type"], payload.get("payload"))
        return state


class Counter(Store):
    name = "counter"
    handles = ["counter/*"]
    initial_state = {"value": 0}

    @on("counter/add")
    def add(self, state, payload, ctx):
        return {"value": state["value"] + payload["by"]}


@pytest.fixture
def running(fluxd):
    started = []

    def start(store):
        started.append((store, store.start()))
        return store
    yield start
    for store, thread in started:
        store.stop()
        thread.join(10)


def rejection(client, type, payload=None, store="todos"):
    """The error object ``store`` rejected the action with."""
    result = client.dispatch_and_settle(type, payload, timeout=10)[store]
    assert result.status == "rejected", result
    return result.error


def test_an_unhandled_action_is_rejected_naming_the_handled_types(fluxd, running):
    running(Todos(socket_path=fluxd.socket_path))
    running(Counter(socket_path=fluxd.socket_path))
    with Client.connect(fluxd.socket_path) as client:
        assert rejection(client, "todo/frobnicate", store="todos") == {
            "code": "store/unhandled-action",
            "message": "no handler for 'todo/frobnicate'; this store handles: todo/add, todo/async, todo/follow, "
                       "todo/refuse, todo/setify, todo/toggle"}
        settlement = client.dispatch_and_settle("counter/ad", {"by": 1}, timeout=10)  # a typo of counter/add
        with pytest.raises(ActionRejectedError) as caught:
            settlement.raise_for_status()
        assert (caught.value.store, caught.value.code) == ("counter", STORE_UNHANDLED_ACTION)
        assert caught.value.message == "no handler for 'counter/ad'; this store handles: counter/add"
        assert client.get("counter").version == 1  # no change


def test_a_store_may_ignore_unhandled_actions_explicitly(fluxd, running):
    class Lenient(Counter):
        unhandled = "ignore"

    running(Lenient(socket_path=fluxd.socket_path))
    with Client.connect(fluxd.socket_path) as client:
        settlement = client.dispatch_and_settle("counter/whatever", timeout=10)
        assert settlement.ok and settlement["counter"].version == 1
    assert Counter(unhandled="ignore").unhandled == "ignore"
    with pytest.raises(ValueError, match="unhandled must be one of 'reject', 'ignore'"):
        Counter(unhandled="drop")


def test_failure_messages_are_written_for_the_dispatcher(fluxd, running):
    store = running(Todos(socket_path=fluxd.socket_path))
    with Client.connect(fluxd.socket_path) as client:
        assert rejection(client, "todo/add", {"name": "milk"}, "todos") == {
            "code": "store/bad-payload", "message": "todo/add failed: payload is missing field 'title'", "field": "title"}
        assert rejection(client, "todo/add", None, "todos") == {
            "code": "store/bad-payload",
            "message": "todo/add failed: the action has no payload (TypeError: 'NoneType' object is not "
                       "subscriptable)"}
        assert rejection(client, "todo/toggle", {"index": "first"}, "todos") == {
            "code": "store/error",
            "message": "todo/toggle failed: ValueError: invalid literal for int() with base 10: 'first'"}
        assert rejection(client, "todo/toggle", {"index": 3}, "todos") == {
            "code": "store/error", "message": "todo/toggle failed: IndexError: list index out of range"}
        # Reject passes through unchanged
        assert rejection(client, "todo/refuse", {}, "todos") == {
            "code": "todo/refused", "message": "refused on purpose", "hint": "ask nicely"}
        error = rejection(client, "todo/setify", {}, "todos")
        assert error["code"] == "store/error"
        assert error["message"].startswith("todo/setify failed: the handler returned a state that is not JSON")
        assert rejection(client, "todo/async", {}, "todos")["message"] == (
            "todo/async failed: TypeError: the handler is a coroutine function: async handlers need "
            "fluxbus.AsyncStore")
        assert rejection(client, "todo/follow", {"type": "bad type"}, "todos")["message"] == (
            "todo/follow failed: ValueError: invalid follow-up action type 'bad type'")
        # none of it changed the state, and the store still works
        assert client.dispatch_and_settle("todo/add", {"title": "milk"}, timeout=10)["todos"].version == 2
        assert store.state == {"items": [{"title": "milk", "done": False}]}


def test_the_store_waits_without_polling_and_stop_wakes_it():
    """The store's thread blocks in one wait without a time limit until a message or stop() comes."""
    fake = FakeFluxd()
    waits = []
    waiting = threading.Event()
    store = Counter(socket_path=fake.socket_path)
    try:
        starting = threading.Thread(target=store.start)
        starting.start()
        peer = fake.accept()
        peer.expect_op("register")
        peer.send({"op": "registered", "store": "counter", "version": 1, "seq": 0, "resumed": False})
        peer.send({"op": "snapshot", "store": "counter", "version": 1, "seq": 0, "state": {"value": 0}})
        peer.send({"op": "queries", "store": "counter", "queries": []})
        starting.join(5)
        assert store.ready.is_set()
        client = store.client
        pump = client._pump

        def recording_pump(timeout):
            if threading.current_thread().name == "store-counter" and not store._stop.is_set():
                waits.append(timeout)  # (not the wait of close() for fluxd's end, after stop)
                waiting.set()
            pump(timeout)
        client._pump = recording_pump
        peer.send({"op": "action", "store": "counter", "seq": 1, "type": "counter/add", "origin": 9,
                   "payload": {"by": 2}})
        assert peer.expect_op("done") == {"op": "done", "store": "counter", "seq": 1, "state": {"value": 2}}
        assert waiting.wait(5)
        store.stop()
        peer.expect_op("bye")
        assert waits and all(timeout is None for timeout in waits), waits
    finally:
        store.stop()
        fake.close()


def test_store_uses_only_the_public_client_api():
    """store.py reaches no private member of the client (nor of a registration)."""
    with open(os.path.join(PACKAGE_ROOT, "fluxbus", "store.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Attribute) and owner.attr in ("client", "registration"):
                private.append(f"line {node.lineno}: .{owner.attr}.{node.attr}")
            elif isinstance(owner, ast.Name) and owner.id in ("client", "registration"):
                private.append(f"line {node.lineno}: {owner.id}.{node.attr}")
    assert private == []
