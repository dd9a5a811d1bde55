"""The asyncio client against a real fluxd (a Python store serves the actions)."""
import asyncio

import pytest

from fluxbus import AsyncClient, FluxError
from test_client import Comments, Todos


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


@pytest.fixture
def todos(fluxd):
    store = Todos(socket_path=fluxd.socket_path)
    thread = store.start()
    yield store
    store.stop()
    thread.join(10)


def test_async_dispatch_subscribe_settle(fluxd, todos):
    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path, name="py-async") as client:
            assert client.welcome.peer >= 1
            sub = await client.subscribe("todos")
            assert sub.status == "up"
            assert (await sub.next(10)).version == 1
            settlement = await client.dispatch_and_settle("todo/add", {"title": "eggs"})
            assert settlement.ok and settlement["todos"].version == 2
            assert sub.latest.version == 2  # read your writes
            versions = []
            await client.dispatch("todo/add", {"title": "more"})
            async for snap in sub:
                versions.append(snap.version)
                if snap.version == 3:
                    break
            assert versions == [2, 3]
            assert (await client.get("todos")).state["items"][1]["title"] == "more"
            assert (await client.info())["seq"] == 2
            assert await client.ping() >= 0
            await sub.close()
    run(scenario())


def test_async_errors(fluxd):
    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path) as client:
            with pytest.raises(FluxError) as caught:
                await client.dispatch_and_settle("nobody/handles")
            assert caught.value.code == "no-handler"
            # A dispatch waits for fluxd's acceptance (SPEC §8.3) and raises the refusal to the caller ...
            with pytest.raises(FluxError) as caught:
                await client.dispatch("nobody/handles")
            assert caught.value.code == "no-handler"
            # ... or, sent without waiting (ack=False), the refusal arrives on errors with its id.
            ident = await client.dispatch("nobody/handles", ack=False)
            error = await asyncio.wait_for(client.errors.get(), 10)
            assert (error.code, error.ref) == ("no-handler", ident)
            with pytest.raises(FluxError) as caught:
                await client.get("nothing")
            assert caught.value.code == "unknown-store"
    run(scenario())


def test_async_query_receipt(fluxd):
    store = Comments(socket_path=fluxd.socket_path)
    thread = store.start()

    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path) as client:
            sub = await client.subscribe("comments")
            await sub.next(10)
            async with await client.query("comments", {"site": 5}):
                while "5" not in (await sub.next(10)).state:
                    pass
            while (await sub.next(10)).state != {}:
                pass
    try:
        run(scenario())
    finally:
        store.stop()
        thread.join(10)


def test_async_disconnect_ends_subscriptions(fluxd, todos):
    async def scenario():
        client = await AsyncClient.connect(fluxd.socket_path, reconnect=False)  # (reconnecting: test_reconnect.py)
        sub = await client.subscribe("todos")
        await sub.next(10)
        fluxd.process.terminate()
        remaining = [snap async for snap in sub]
        assert remaining == [] and client.closed
        with pytest.raises(FluxError):
            await client.ping()
        await client.close()
    run(scenario())
