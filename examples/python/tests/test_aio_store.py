"""AsyncStore: the asyncio store worker, with plain and async handlers, against a real fluxd (and the fake one for
heartbeats during an awaiting handler)."""
import asyncio

import pytest

from fakefluxd import FakeFluxd
from fluxbus import AsyncClient, AsyncStore, Client, NameTakenError, Reject, Store, on


class AsyncTodos(AsyncStore):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"items": [], "log": []}

    @on("todo/add")
    async def add(self, state, payload, ctx):
        await asyncio.sleep(0)  # an await inside the handler (e.g. a database call)
        state["items"].append(payload["title"])
        if payload.get("announce"):
            ctx.dispatch("todo/logged", {"title": payload["title"]})
        return state

    @on("todo/logged")
    def logged(self, state, payload, ctx):  # a plain handler in an AsyncStore
        state["log"].append({"title": payload["title"], "cause": ctx.cause})
        return state

    @on("todo/refuse")
    async def refuse(self, state, payload, ctx):
        raise Reject("todo/refused", "refused on purpose", why="test")


class AsyncComments(AsyncStore):
    """Fetches what is queried, asynchronously (the QueryStore pattern)."""
    name = "comments"
    handles = []
    initial_state = {}

    async def on_queries(self, queries):
        await asyncio.sleep(0)
        await self.publish({str(q.query["site"]): [f"comment on {q.query['site']}"] for q in queries})


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_async_store_handles_actions(fluxd):
    async def scenario():
        store = AsyncTodos(socket_path=fluxd.socket_path)
        task = await store.start()
        assert store.ready.is_set() and store.state == {"items": [], "log": []}
        try:
            async with await AsyncClient.connect(fluxd.socket_path) as client:
                sub = await client.subscribe("todos")
                settled = await client.dispatch_and_settle("todo/add", {"title": "milk", "announce": True})
                assert settled.raise_for_status()["todos"].version == 2
                snap = await sub.until(lambda s: s.state["log"], timeout=10)
                assert snap.state == {"items": ["milk"], "log": [{"title": "milk", "cause": settled.seq}]}
                refused = await client.dispatch_and_settle("todo/refuse", {})
                assert refused["todos"].error == {"code": "todo/refused", "message": "refused on purpose",
                                                  "why": "test"}
                unhandled = await client.dispatch_and_settle("todo/frobnicate", {})
                assert unhandled["todos"].error == {
                    "code": "store/unhandled-action",
                    "message": "no handler for 'todo/frobnicate'; this store handles: todo/add, todo/logged, "
                               "todo/refuse"}
                missing = await client.dispatch_and_settle("todo/add", {"name": "x"})
                assert missing["todos"].error["message"] == "todo/add failed: payload is missing field 'title'"
                assert (await client.get("todos")).version == 3
        finally:
            await store.stop()
        assert task.done() and store.client.closed
    run(scenario())


def test_async_store_queries_and_publish(fluxd):
    async def scenario():
        store = AsyncComments(socket_path=fluxd.socket_path)
        await store.start()
        try:
            async with await AsyncClient.connect(fluxd.socket_path) as client:
                sub = await client.subscribe("comments")
                async with await client.query("comments", {"site": 7}):
                    snap = await sub.until(lambda s: "7" in s.state, timeout=10)
                    assert snap.state == {"7": ["comment on 7"]}
                await sub.until(lambda s: s.state == {}, timeout=10)
                assert store.queries == []
        finally:
            await store.stop()
    run(scenario())


def test_async_store_ignore_and_refused_registration(fluxd):
    class Lenient(AsyncTodos):
        unhandled = "ignore"

    async def scenario():
        store = Lenient(socket_path=fluxd.socket_path)
        await store.start()
        try:
            with pytest.raises(NameTakenError):
                await AsyncTodos(socket_path=fluxd.socket_path).connect()
            async with await AsyncClient.connect(fluxd.socket_path) as client:
                assert (await client.dispatch_and_settle("todo/frobnicate")).ok
                assert (await client.info())["peers"]["store"] == 1  # the refused store closed its connection
        finally:
            await store.stop()
    run(scenario())


def test_async_store_run_returns_on_stop(fluxd):
    async def scenario():
        store = AsyncTodos(socket_path=fluxd.socket_path)
        runner = asyncio.ensure_future(store.run())
        await asyncio.wait_for(store.ready.wait(), 10)
        await store.stop()
        assert runner.done() and runner.exception() is None
    run(scenario())


def test_heartbeats_are_answered_while_an_async_handler_awaits():
    fake = FakeFluxd()
    entered = None
    release = None

    class Slow(AsyncStore):
        name = "slow"
        handles = ["slow/*"]
        initial_state = 0

        @on("slow/wait")
        async def wait(self, state, payload, ctx):
            entered.set()
            await release.wait()
            return state + 1

    async def scenario():
        nonlocal entered, release
        entered, release = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        store = Slow(socket_path=fake.socket_path)
        starting = asyncio.ensure_future(store.start())
        peer = await loop.run_in_executor(None, fake.accept)
        register = await loop.run_in_executor(None, peer.expect_op, "register")
        assert register["store"] == "slow" and register["queryDeltas"] is True and peer.hello["heartbeat"] is True
        peer.send({"op": "registered", "store": "slow", "version": 1, "seq": 0, "resumed": False})
        peer.send({"op": "snapshot", "store": "slow", "version": 1, "seq": 0, "state": 0})
        peer.send({"op": "queries", "store": "slow", "queries": []})
        await asyncio.wait_for(starting, 10)
        peer.send({"op": "action", "store": "slow", "seq": 1, "type": "slow/wait", "origin": 9, "payload": None})
        await asyncio.wait_for(entered.wait(), 10)
        for n in range(1, 4):  # the handler awaits all along
            peer.send({"op": "ping", "id": f"hb-{n}"})
            pong = await loop.run_in_executor(None, peer.expect_op, "pong")
            assert pong["id"] == f"hb-{n}"
        release.set()
        done = await loop.run_in_executor(None, peer.expect_op, "done")
        assert done == {"op": "done", "store": "slow", "seq": 1, "state": 1}
        await store.stop()
        await loop.run_in_executor(None, peer.expect_op, "bye")
    try:
        run(scenario())
    finally:
        fake.close()


def test_sync_and_async_stores_share_the_handler_api():
    class Sync(Store):
        name = "s"
        handles = ["s/*"]

        @on("s/a", "s/b*")
        def a(self, state, payload, ctx):
            return state

    class Async(AsyncStore):
        name = "s"
        handles = ["s/*"]

        @on("s/a", "s/b*")
        async def a(self, state, payload, ctx):
            return state

    for store in (Sync(), Async()):
        assert store.handled_types() == ["s/a", "s/b*"]
        assert store.handler_for("s/bee") is not None and store.handler_for("s/c") is None
        assert store.unhandled == "reject"


def test_sync_client_sees_async_store(fluxd):
    async def scenario():
        store = AsyncTodos(socket_path=fluxd.socket_path)
        await store.start()
        try:
            loop = asyncio.get_running_loop()

            def use():
                with Client.connect(fluxd.socket_path) as client:
                    return client.dispatch_and_settle("todo/add", {"title": "from sync"}, timeout=10)
            settled = await loop.run_in_executor(None, use)
            assert settled.ok and store.state["items"] == ["from sync"]
        finally:
            await store.stop()
    run(scenario())
