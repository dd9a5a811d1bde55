"""Heartbeats (hello ``heartbeat``, fluxd's ``ping`` answered with ``pong``) and the new error codes, against a
fake fluxd (tests/fakefluxd.py) and, where said, the real one (``fluxd --ping-interval``)."""
import asyncio
import socket
import struct
import threading
import time

import pytest

from fakefluxd import FakeFluxd, frame
from fluxbus import AsyncClient, Client, Disconnected, FluxError, Store, on


@pytest.fixture
def fake():
    server = FakeFluxd()
    yield server
    server.close()


class CountingClient(Client):
    """Counts the heartbeat pings its reader thread answered; ``answered(n)`` waits for n of them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._answered = threading.Condition()

    def _answer_ping(self, msg):
        super()._answer_ping(msg)
        with self._answered:
            self._answered.notify_all()

    def answered(self, n, timeout=10.0):
        with self._answered:
            return self._answered.wait_for(lambda: self.pings_answered >= n, timeout)


def test_hello_asks_for_heartbeat_and_limits_are_kept(fake):
    with Client.connect(fake.socket_path, name="hb") as client:
        peer = fake.accept()
        assert peer.hello["heartbeat"] is True
        assert client.welcome.limits["pingInterval"] == 50
        assert client.welcome.limits["maxPingsOut"] == 2


def test_heartbeat_can_be_turned_off(fake):
    with Client.connect(fake.socket_path, heartbeat=False):
        assert "heartbeat" not in fake.accept().hello


def test_reader_thread_answers_pings_while_the_caller_does_nothing(fake):
    client = CountingClient.connect(fake.socket_path)
    try:
        peer = fake.accept()
        for n in range(1, 4):
            peer.send({"op": "ping", "id": f"hb-{n}"})
            # the test thread makes no client call: only the reader thread can answer
            assert peer.expect_op("pong") == {"op": "pong", "id": f"hb-{n}"}
        assert client.answered(3)  # counted just after the send
        assert client.ping(5) >= 0  # the connection still works, and pings never reach the caller's inbox
        assert not client.errors
    finally:
        client.close()


def test_store_answers_pings_while_a_handler_blocks(fake):
    release = threading.Event()
    entered = threading.Event()

    class Slow(Store):
        name = "slow"
        handles = ["slow/*"]
        initial_state = 0

        @on("slow/wait")
        def wait(self, state, payload, ctx):
            entered.set()
            assert release.wait(10)
            return state + 1

    store = Slow(socket_path=fake.socket_path)
    starting = threading.Thread(target=store.start)
    starting.start()
    peer = fake.accept()
    register = peer.expect_op("register")
    assert register["store"] == "slow" and peer.hello["heartbeat"] is True
    peer.send({"op": "registered", "store": "slow", "version": 1, "seq": 0, "resumed": False})
    peer.send({"op": "snapshot", "store": "slow", "version": 1, "seq": 0, "state": 0})
    peer.send({"op": "queries", "store": "slow", "queries": []})
    starting.join(5)
    assert store.ready.is_set()
    try:
        peer.send({"op": "action", "store": "slow", "seq": 1, "type": "slow/wait", "origin": 9, "payload": None})
        assert entered.wait(5)
        for n in range(1, 4):  # the handler is blocked on the store's thread all along
            peer.send({"op": "ping", "id": f"hb-{n}"})
            assert peer.expect_op("pong")["id"] == f"hb-{n}"
        release.set()
        assert peer.expect_op("done") == {"op": "done", "store": "slow", "seq": 1, "state": 1}
    finally:
        release.set()
        store.stop()
        peer.expect_op("bye")


def test_async_client_answers_pings(fake):
    async def scenario():
        client = await AsyncClient.connect(fake.socket_path)
        peer = await asyncio.get_running_loop().run_in_executor(None, fake.accept)
        assert peer.hello["heartbeat"] is True
        assert client.welcome.limits["pingInterval"] == 50
        peer.send({"op": "ping", "id": "hb-7"})
        pong = await asyncio.get_running_loop().run_in_executor(None, peer.expect_op, "pong")
        assert pong == {"op": "pong", "id": "hb-7"}
        assert await client.ping(5) >= 0
        await client.close()
    asyncio.run(asyncio.wait_for(scenario(), 30))


# -- error codes ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("when", ["after-hello", "at-connect"])
def test_too_many_connections_is_raised_by_connect(when):
    if when == "at-connect":  # what fluxd does: the error and the close come before the client's hello
        server = FakeFluxd(refuse_at_connect="too-many-connections")
    else:
        server = FakeFluxd(refuse="too-many-connections")
    try:
        with pytest.raises(FluxError) as caught:
            Client.connect(server.socket_path, timeout=5)
        assert caught.value.code == "too-many-connections" and caught.value.fatal
        assert not isinstance(caught.value, Disconnected)
        assert "too many connections" in str(caught.value)

        async def scenario():
            with pytest.raises(FluxError) as caught:
                await AsyncClient.connect(server.socket_path, timeout=5)
            assert caught.value.code == "too-many-connections" and caught.value.fatal
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        server.close()


@pytest.mark.parametrize("code", ["unresponsive", "memory-budget"])
def test_fatal_codes_end_the_connection_and_say_why(fake, code):
    # without reconnection (with it, the client reconnects: tests/test_reconnect.py)
    client = Client.connect(fake.socket_path, reconnect=False)
    peer = fake.accept()
    try:
        result = {}

        def call():
            try:
                client.info(timeout=5)
            except FluxError as error:
                result["error"] = error

        caller = threading.Thread(target=call)
        caller.start()
        peer.expect_op("info")
        peer.send({"op": "error", "code": code, "message": "test", "fatal": True})
        peer.sock.shutdown(socket.SHUT_WR)
        caller.join(10)
        error = result["error"]
        assert isinstance(error, Disconnected) and error.error is not None
        assert (error.error.code, error.error.fatal) == (code, True)
        assert code in str(error)
        assert client.closed and client.errors[-1].code == code
    finally:
        client.close()


def test_limit_exceeded_is_raised_by_the_call_and_the_connection_survives(fake):
    client = Client.connect(fake.socket_path)
    peer = fake.accept()
    try:
        outcome = {}

        def call():
            try:
                client.query("comments", {"site": 1}, timeout=5)
            except FluxError as error:
                outcome["error"] = error

        caller = threading.Thread(target=call)
        caller.start()
        query = peer.expect_op("query")
        peer.send({"op": "error", "code": "limit-exceeded", "message": "too many live queries (limit 2)",
                   "ref": query["id"], "fatal": False})
        caller.join(10)
        error = outcome["error"]
        assert (error.code, error.fatal, error.ref) == ("limit-exceeded", False, query["id"])
        assert "per-connection limit" in str(error)
        assert client.ping(5) >= 0 and not client.closed
    finally:
        client.close()


# -- against the real fluxd (needs `fluxd --ping-interval`) ---------------------------------------------------

def raw_hello(path, heartbeat):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(frame({"op": "hello", "protocol": 1, "role": "client", "name": "silent", "heartbeat": heartbeat}))
    return sock


def read_frames(sock, until, timeout):
    """Reads frames from a raw socket until ``until(msg)`` or EOF; returns them all."""
    import json
    sock.settimeout(timeout)
    buffer, frames = b"", []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            return frames
        buffer += data
        while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
            n = struct.unpack(">I", buffer[:4])[0]
            frames.append(json.loads(buffer[4:4 + n]))
            buffer = buffer[4 + n:]
            if until(frames[-1]):
                return frames
    raise AssertionError(f"timed out; frames so far: {frames}")


def test_live_heartbeat(fluxd_factory):
    daemon = fluxd_factory("--ping-interval", "50")
    client = CountingClient.connect(daemon.socket_path)
    try:
        assert client.welcome.limits["pingInterval"] == 50
        assert client.welcome.limits["maxPingsOut"] >= 1
        # silent for many intervals: the reader thread keeps the connection alive
        assert client.answered(5), f"only {client.pings_answered} pings answered"
        assert client.ping(5) >= 0 and not client.errors
        # a peer that asks for heartbeats and never answers is closed as unresponsive
        silent = raw_hello(daemon.socket_path, True)
        frames = read_frames(silent, lambda m: m.get("op") == "error", 10)
        silent.close()
        assert [m["op"] for m in frames[1:-1]] and all(m["op"] == "ping" for m in frames[1:-1])
        assert frames[-1]["code"] == "unresponsive" and frames[-1]["fatal"] is True
        assert client.answered(client.pings_answered + 2)
    finally:
        client.close()


def test_live_store_stays_up_while_its_handler_blocks(fluxd_factory):
    daemon = fluxd_factory("--ping-interval", "50")
    watcher = CountingClient.connect(daemon.socket_path)
    release = threading.Event()

    class Blocking(Store):
        name = "blocking"
        handles = ["blocking/*"]
        initial_state = 0

        @on("blocking/wait")
        def wait(self, state, payload, ctx):
            # blocks for several ping intervals × maxPingsOut: until the watcher saw 6 pings answered
            release.wait(10)
            return state + 1

    store = Blocking(socket_path=daemon.socket_path)
    thread = store.start()
    try:
        result = {}
        dispatcher = Client.connect(daemon.socket_path)
        sender = threading.Thread(target=lambda: result.update(s=dispatcher.dispatch_and_settle("blocking/wait", timeout=20)))
        sender.start()
        assert watcher.answered(6)
        release.set()
        sender.join(20)
        assert result["s"]["blocking"].status == "done"
        assert store.client.pings_answered >= 1 and not store.client.closed
        dispatcher.close()
    finally:
        release.set()
        store.stop()
        thread.join(10)
        watcher.close()


def test_live_limit_exceeded_and_too_many_connections(fluxd_factory):
    daemon = fluxd_factory("--max-queries", "2", "--max-connections", "1")
    with Client.connect(daemon.socket_path) as client:
        client.query("comments", {"site": 1})
        client.query("comments", {"site": 2})
        with pytest.raises(FluxError) as caught:
            client.query("comments", {"site": 3}, timeout=5)
        assert (caught.value.code, caught.value.fatal) == ("limit-exceeded", False)
        assert client.ping(5) >= 0
        with pytest.raises(FluxError) as refused:
            Client.connect(daemon.socket_path, timeout=5)
        assert (refused.value.code, refused.value.fatal) == ("too-many-connections", True)

        async def scenario():
            with pytest.raises(FluxError) as caught:
                await AsyncClient.connect(daemon.socket_path, timeout=5)
            assert caught.value.code == "too-many-connections"
        asyncio.run(asyncio.wait_for(scenario(), 30))
        assert client.ping(5) >= 0
