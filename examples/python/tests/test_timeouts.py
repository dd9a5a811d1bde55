"""Subscription status (``unknown``/``up``/``down``) and timeouts that cover the whole call: the request, the reply
and any wait (a store that never registers, fluxd that never answers or never reads)."""
import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time

import pytest

from fakefluxd import LIMITS, FakeFluxd, frame
from fluxbus import AsyncClient, Client, FluxTimeoutError, Store, on


class Pycounter(Store):
    name = "pycountr"
    handles = ["pycountr/*"]
    initial_state = {"n": 0}

    @on("pycountr/add")
    def add(self, state, payload, ctx):
        return {"n": state["n"] + 1}


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


NOT_YET = "no store named 'pycountr' has registered yet"


# -- a store that has never registered ----------------------------------------------------------------------------

def test_subscribe_to_a_store_that_never_registered_times_out(fluxd):
    with Client.connect(fluxd.socket_path) as client:
        start = time.monotonic()
        sub = client.subscribe("pycountr", timeout=1)
        assert sub.status == "unknown"
        with pytest.raises(FluxTimeoutError) as caught:
            for _ in sub:
                pass
        elapsed = time.monotonic() - start
        assert 0.9 <= elapsed < 5, elapsed  # one timeout for subscribe and the wait for its first snapshot
        assert str(caught.value) == f"timed out after 1 s waiting for a snapshot of 'pycountr': {NOT_YET}"
        assert isinstance(caught.value, TimeoutError)
        with pytest.raises(FluxTimeoutError, match=NOT_YET):
            sub.first(timeout=0.2)
        with pytest.raises(FluxTimeoutError, match=NOT_YET):
            client.subscribe("pycountr").next(timeout=0.2)
        assert client.ping() >= 0  # the connection is fine


def test_subscribe_to_a_store_that_never_registered_times_out_async(fluxd):
    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path) as client:
            start = time.monotonic()
            sub = await client.subscribe("pycountr", timeout=1)
            assert sub.status == "unknown"
            with pytest.raises(FluxTimeoutError) as caught:
                async for _ in sub:
                    pass
            assert 0.9 <= time.monotonic() - start < 5
            assert str(caught.value) == f"timed out after 1 s waiting for a snapshot of 'pycountr': {NOT_YET}"
            with pytest.raises(FluxTimeoutError, match=NOT_YET):
                await sub.first(timeout=0.2)
            with pytest.raises(FluxTimeoutError, match=NOT_YET):
                await sub.next(timeout=0.2)
            assert await client.ping() >= 0
            assert client._pending == {}  # timed-out waits leave nothing behind
    run(scenario())


def test_status_follows_the_store(fluxd):
    with Client.connect(fluxd.socket_path) as client:
        sub = client.subscribe("pycountr")
        assert sub.status == "unknown" and sub.latest is None
        store = Pycounter(socket_path=fluxd.socket_path)
        thread = store.start()
        try:
            assert sub.first(timeout=10).state == {"n": 0}
            assert sub.status == "up" and sub.events[-1].kind == "store-up"
            assert sub.next(timeout=10).version == 1
        finally:
            store.stop()
            thread.join(10)
        assert sub.wait_status("down", timeout=10) == "down"
        assert sub.events[-1].reason == "disconnected"
        with pytest.raises(FluxTimeoutError, match="store 'pycountr' is down \\(disconnected\\)"):
            sub.next(timeout=0.2)


def test_status_follows_the_store_async(fluxd):
    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path) as client:
            sub = await client.subscribe("pycountr")
            assert sub.status == "unknown"
            with pytest.raises(FluxTimeoutError, match="to be up: " + NOT_YET):
                await sub.wait_status("up", timeout=0.2)
            store = Pycounter(socket_path=fluxd.socket_path)
            loop = asyncio.get_running_loop()
            thread = await loop.run_in_executor(None, store.start)
            try:
                assert await sub.wait_status("up", timeout=10) == "up"
                assert (await sub.first(timeout=10)).state == {"n": 0}
            finally:
                store.stop()
                await loop.run_in_executor(None, thread.join, 10)
            assert await sub.wait_status("down", timeout=10) == "down"
    run(scenario())


# -- fluxd that never answers ---------------------------------------------------------------------------------------

@pytest.fixture
def fake():
    server = FakeFluxd()
    yield server
    server.close()


def test_every_call_times_out_as_a_whole(fake):
    with Client.connect(fake.socket_path, timeout=0.5) as client:
        peer = fake.accept()
        for call, what in [(lambda: client.info(), "waiting for fluxd's info"),
                           (lambda: client.subscribe("todos"), "waiting for fluxd to confirm the subscription"),
                           (lambda: client.query("todos", {"a": 1}), "waiting for fluxd to accept the query"),
                           (lambda: client.dispatch_and_settle("todo/add", {}), "waiting for the settlement")]:
            start = time.monotonic()
            with pytest.raises(FluxTimeoutError, match="timed out after 0.5 s " + what):
                call()
            assert 0.45 <= time.monotonic() - start < 5
        # a reply that comes after its call gave up is dropped, and the connection goes on
        info = peer.expect_op("info")
        peer.send({"op": "info", "id": info["id"], "seq": 0})
        assert client.ping(5) >= 0 and client._replies == {}


def test_every_call_times_out_as_a_whole_async(fake):
    async def scenario():
        async with await AsyncClient.connect(fake.socket_path, timeout=0.5) as client:
            for call in (client.info(), client.subscribe("todos"), client.get("todos"),
                         client.dispatch_and_settle("todo/add", {})):
                start = time.monotonic()
                with pytest.raises(FluxTimeoutError, match="timed out after 0.5 s waiting for"):
                    await call
                assert 0.45 <= time.monotonic() - start < 5
            assert client._pending == {}
            assert await client.ping(5) >= 0
    run(scenario())


class SilentServer:
    """A Unix socket that accepts connections and, when ``welcome`` is set, answers the hello and then never reads
    again (so the peer's sends block); otherwise it never says anything."""

    def __init__(self, welcome):
        self.directory = tempfile.mkdtemp(prefix="fluxpy-silent-")
        self.socket_path = os.path.join(self.directory, "fluxd.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.socket_path)
        self.listener.listen(4)
        self.welcome = welcome
        self.connections = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            if self.welcome:
                conn.recv(4096)  # the hello
                conn.sendall(frame({"op": "welcome", "protocol": 1, "server": "silent/0", "peer": 1,
                                    "limits": LIMITS}))

    def close(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
        for conn in self.connections:
            conn.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def silent():
    servers = []

    def make(welcome):
        servers.append(SilentServer(welcome))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def test_connect_timeout_covers_the_handshake(silent):
    server = silent(welcome=False)
    start = time.monotonic()
    with pytest.raises(FluxTimeoutError, match=f"timed out after 0.3 s waiting for fluxd's welcome at "
                                              f"{server.socket_path}"):
        Client.connect(server.socket_path, timeout=0.3)
    assert time.monotonic() - start < 5

    async def scenario():
        with pytest.raises(FluxTimeoutError, match=f"timed out after 0.3 s connecting to fluxd at "
                                                  f"{server.socket_path}"):
            await AsyncClient.connect(server.socket_path, timeout=0.3)
    run(scenario())


def test_send_timeout_when_fluxd_does_not_read(silent):
    server = silent(welcome=True)
    big = "x" * (8 << 20)
    client = Client.connect(server.socket_path, timeout=5, reconnect=False)
    try:
        start = time.monotonic()
        with pytest.raises(FluxTimeoutError, match="timed out after 0.3 s sending to fluxd"):
            client.dispatch("big/thing", big, timeout=0.3)
        assert time.monotonic() - start < 5
        assert client.closed  # part of the frame went out: the stream cannot be used any more
    finally:
        client.close()
    # With reconnection (the default) the cut stream is dropped and the client connects again.
    client = Client.connect(server.socket_path, timeout=5)
    try:
        with pytest.raises(FluxTimeoutError, match="the frame was sent in part, so the connection was closed"):
            client.dispatch("big/thing", big, timeout=0.3)
        client.wait_connected(5)
        assert not client.closed and len(server.connections) == 3
        lost = [e for e in client.connection_events if e.kind == "disconnected"]
        assert len(lost) == 1 and "a frame was cut short" in lost[0].reason
    finally:
        client.close(timeout=0.1)

    async def scenario():
        client = await AsyncClient.connect(server.socket_path, timeout=5)
        try:
            with pytest.raises(FluxTimeoutError, match="timed out after 0.3 s sending to fluxd"):
                await client.dispatch("big/thing", big, timeout=0.3)
        finally:
            await client.close(timeout=0.1)
    run(scenario())
