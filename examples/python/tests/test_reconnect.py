"""Clients that reconnect (SPEC §15.4, §15.5), against the fake fluxd (tests/fakefluxd.py): the session, the
events, subscriptions that go on without a version twice, queries declared again, requests sent again,
settlements recovered (settled, pending, unknown, refused), new epochs, dispatches that wait for the connection,
giving up. The same against the real fluxd, ephemeral and durable, is in tests/test_restart.py.

Nothing here sleeps to synchronise: every wait is for an event or a message, with a deadline."""
import asyncio
import concurrent.futures
import queue
import re
import threading
import time

import pytest

from fakefluxd import FakeFluxd
from fluxbus import (AsyncClient, Client, ConnectionEvent, Disconnected, FluxTimeoutError, NotSentError,
                     OutcomeUnknownError, Reconnect)
from fluxbus.reconnect import reconnect_policy

FAST = Reconnect(initial_delay=0.01, max_delay=0.05)


class Events:
    """A connection-event callback that tests wait on (with a deadline)."""

    def __init__(self):
        self.queue = queue.Queue()
        self.seen = []

    def __call__(self, event):
        self.queue.put(event)

    def wait(self, kind, timeout=10.0):
        """The next event of ``kind`` (events of other kinds before it are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind} event within {timeout} s; seen: {[str(e) for e in self.seen]}")
            try:
                event = self.queue.get(timeout=remaining)
            except queue.Empty:
                continue
            self.seen.append(event)
            if event.kind == kind:
                return event

    def kinds(self):
        while True:
            try:
                self.seen.append(self.queue.get_nowait())
            except queue.Empty:
                return [e.kind for e in self.seen]


@pytest.fixture
def fake():
    server = FakeFluxd(welcome_extra={"epoch": "e1"})
    yield server
    server.close()


@pytest.fixture
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(4)
    yield executor
    executor.shutdown(wait=False)


def connect(fake, **options):
    events = Events()
    options.setdefault("reconnect", FAST)
    client = Client.connect(fake.socket_path, name="rc", timeout=10, on_connection_event=events, **options)
    return client, fake.accept(), events


def first_message(peer):
    """The first message of a connection after its hello (nothing may come before the replay)."""
    return peer.expect(what="the first message after hello")


def subscribed(peer, store, version, status="up"):
    peer.send({"op": "subscribed", "store": store, "status": status, "version": version})


def snapshot(peer, store, version, seq, state):
    peer.send({"op": "snapshot", "store": store, "version": version, "seq": seq, "state": state})


# -- the policy -------------------------------------------------------------------------------------------------

def test_policy_doubles_with_jitter_up_to_the_maximum():
    policy = Reconnect()
    assert (policy.enabled, policy.initial_delay, policy.max_delay) == (True, 0.05, 2.0)
    low = [policy.delay(n, lambda: 0.0) for n in range(1, 9)]
    high = [policy.delay(n, lambda: 1.0) for n in range(1, 9)]
    middle = [policy.delay(n, lambda: 0.5) for n in range(1, 9)]
    assert middle == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert low == pytest.approx([0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 1.6, 1.6])
    assert high[:5] == pytest.approx([0.06, 0.12, 0.24, 0.48, 0.96]) and max(high) == 2.0
    assert reconnect_policy(False).enabled is False and reconnect_policy(None) == Reconnect()
    assert reconnect_policy(FAST) is FAST
    with pytest.raises(ValueError):
        Reconnect(jitter=2)


# -- sync client ------------------------------------------------------------------------------------------------

def test_reconnects_with_the_same_session_and_reports_events(fake, pool):
    client, peer, events = connect(fake)
    try:
        assert re.fullmatch(r"[0-9a-f]{32}", peer.hello["session"]) and client.session == peer.hello["session"]
        assert (client.epoch, client.welcome.epoch, client.state) == ("e1", "e1", "connected")
        peer.hang_up()
        lost = events.wait("disconnected")
        assert lost.will_reconnect and lost.reason == "fluxd closed the connection"
        attempt = events.wait("reconnecting")
        assert attempt.attempt == 1 and 0 < attempt.delay <= 0.05
        again = fake.accept()
        assert again.hello["session"] == client.session and again.hello["role"] == "client"
        back = events.wait("reconnected")
        assert (back.attempt, back.epoch, back.epoch_changed) == (1, "e1", False)
        assert client.ping(5) >= 0 and client.welcome.peer == 2 and client.connected
        assert [e.kind for e in client.connection_events] == ["disconnected", "reconnecting", "reconnected"]
        assert str(back) == "reconnected after 1 attempt(s) (same epoch)"
    finally:
        client.close()
    assert events.kinds() == ["disconnected", "reconnecting", "reconnected"]  # closing is not a loss


def test_subscription_goes_on_without_a_version_twice(fake, pool):
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.subscribe, "todos")
        assert peer.expect_op("subscribe")["store"] == "todos"
        subscribed(peer, "todos", 3)
        snapshot(peer, "todos", 3, 7, {"n": 3})
        sub = pending.result(5)
        assert sub.next(5).version == 3
        peer.hang_up()
        again = fake.accept()
        assert first_message(again) == {"op": "subscribe", "store": "todos"}
        subscribed(again, "todos", 3, status="down")
        snapshot(again, "todos", 3, 7, {"n": 3})  # the retained snapshot, delivered already
        snapshot(again, "todos", 4, 8, {"n": 4})
        assert sub.next(5).version == 4
        assert sub.status == "down" and sub.events[-1].kind == "resubscribed"
        assert events.wait("reconnected").epoch_changed is False
    finally:
        client.close()


@pytest.mark.parametrize("new_epoch", ["e2", None])
def test_a_new_epoch_takes_the_next_snapshot_whatever_its_version(fake, pool, new_epoch):
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.subscribe, "todos")
        peer.expect_op("subscribe")
        subscribed(peer, "todos", 5)
        snapshot(peer, "todos", 5, 9, {"n": 5})
        sub = pending.result(5)
        assert sub.next(5).version == 5
        if new_epoch is None:
            del fake.welcome_extra["epoch"]  # an older fluxd: no epoch, so versions are not comparable
        else:
            fake.welcome_extra["epoch"] = new_epoch  # an ephemeral fluxd restarted
        peer.hang_up()
        again = fake.accept()
        assert first_message(again)["op"] == "subscribe"
        subscribed(again, "todos", 1)
        snapshot(again, "todos", 1, 0, {"n": 0})
        snapshot(again, "todos", 2, 1, {"n": 1})
        assert [sub.next(5).version, sub.next(5).version] == [1, 2]
        back = events.wait("reconnected")
        assert back.epoch_changed is True and back.epoch == new_epoch and client.epoch == new_epoch
    finally:
        client.close()


def test_live_queries_are_declared_again(fake, pool):
    client, peer, _ = connect(fake)
    try:
        declared = []
        for site in (7, 8):
            pending = pool.submit(client.query, "comments", {"site": site})
            query = peer.expect_op("query")
            peer.send({"op": "query-ok", "id": query["id"]})
            declared.append((pending.result(5), query))
        withdrawn, _ = declared[0]
        pending = pool.submit(withdrawn.close)
        peer.send({"op": "unquery-ok", "id": peer.expect_op("unquery")["id"]})
        pending.result(5)
        peer.hang_up()
        again = fake.accept()
        receipt, query = declared[1]
        assert first_message(again) == {"op": "query", "id": receipt.id, "store": "comments", "query": {"site": 8}}
        again.send({"op": "query-ok", "id": receipt.id})
        assert client.ping(5) >= 0 and not client.errors  # the replay's query-ok answers no call: dropped
    finally:
        client.close()


def test_a_request_in_flight_is_sent_again(fake, pool):
    client, peer, _ = connect(fake)
    try:
        pending = pool.submit(client.info, 10)
        request = peer.expect_op("info")
        peer.hang_up()
        again = fake.accept()
        assert again.expect_op("info") == request  # the same request (same id) on the new connection
        again.send({"op": "info", "id": request["id"], "seq": 0, "stores": []})
        assert pending.result(10)["stores"] == []
    finally:
        client.close()


def test_a_fatal_error_is_a_lost_connection_too(fake, pool):
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.get, "todos", 10)
        request = peer.expect_op("get")
        peer.send({"op": "error", "code": "unresponsive", "message": "2 pings unanswered", "fatal": True})
        peer.hang_up()
        lost = events.wait("disconnected")
        assert lost.error is not None and lost.error.code == "unresponsive" and "unresponsive" in lost.reason
        again = fake.accept()
        assert again.expect_op("get")["id"] == request["id"]
        again.send({"op": "got", "id": request["id"], "store": "todos", "version": 2, "seq": 4, "state": [1]})
        assert pending.result(10).state == [1]
        assert client.errors[-1].code == "unresponsive"
    finally:
        client.close()


# -- settlements across a lost connection ----------------------------------------------------------------------

RESULTS = [{"store": "todos", "status": "done", "version": 6}]


@pytest.mark.parametrize("outcome", ["settled", "pending", "unknown", "unknown-op", "bad-message"])
def test_a_pending_settlement_is_recovered(fake, pool, outcome):
    client, peer, _ = connect(fake)
    try:
        pending = pool.submit(client.dispatch_and_settle, "todo/add", {"title": "milk"}, None, 10)
        ident = peer.expect_op("dispatch")["id"]
        peer.hang_up()
        again = fake.accept()
        recover = first_message(again)
        assert recover["op"] == "recover" and recover["ids"] == [ident]
        if outcome == "settled":
            again.send({"op": "recovered", "id": recover["id"], "outcomes": [
                {"id": ident, "status": "settled", "seq": 41, "results": RESULTS}]})
        elif outcome == "pending":
            again.send({"op": "recovered", "id": recover["id"], "outcomes": [
                {"id": ident, "status": "pending", "seq": 41}]})
            again.send({"op": "settled", "id": ident, "seq": 41, "results": RESULTS})
        elif outcome == "unknown":
            again.send({"op": "recovered", "id": recover["id"], "outcomes": [{"id": ident, "status": "unknown"}]})
        else:  # an older fluxd (unknown-op), or one that refused the request
            again.send({"op": "error", "code": outcome, "message": "no", "ref": recover["id"], "fatal": False})
        if outcome in ("settled", "pending"):
            settlement = pending.result(10)
            assert (settlement.id, settlement.seq, settlement["todos"].version) == (ident, 41, 6)
        elif outcome == "unknown":
            with pytest.raises(NotSentError) as caught:
                pending.result(10)
            assert (caught.value.code, caught.value.ref) == ("not-sent", ident)
            assert "may be dispatched again" in str(caught.value)
        else:
            with pytest.raises(OutcomeUnknownError) as caught:
                pending.result(10)
            assert (caught.value.code, caught.value.ref) == ("outcome-unknown", ident)
            assert outcome in str(caught.value)
        assert client._unsettled == {} and client._recovering == {}
        assert client.ping(5) >= 0  # the client carries on
    finally:
        client.close()


def test_dispatch_ids_continue_across_connections(fake, pool):
    client, peer, _ = connect(fake)
    try:
        first = client.dispatch("todo/add", {"title": "a"})
        peer.hang_up()
        fake.accept()
        second = client.dispatch("todo/add", {"title": "b"})
        assert int(second.split("-")[1]) > int(first.split("-")[1])
    finally:
        client.close()


def test_a_new_epoch_makes_the_outcome_unknown(fake, pool):
    client, peer, _ = connect(fake)
    try:
        pending = pool.submit(client.dispatch_and_settle, "todo/add", {"title": "milk"}, None, 10)
        ident = peer.expect_op("dispatch")["id"]
        fake.welcome_extra["epoch"] = "e2"  # fluxd restarted without its history: nobody knows
        peer.hang_up()
        again = fake.accept()
        with pytest.raises(OutcomeUnknownError, match=f"outcome of dispatch {ident} is unknown: fluxd restarted"):
            pending.result(10)
        barrier = pool.submit(client.ping, 5)
        assert again.expect_op("ping") and barrier.result(5) >= 0
        assert again.messages.empty()  # no recover: the new fluxd cannot know
    finally:
        client.close()


def test_after_bye_shutdown_an_unsettled_dispatch_was_not_sent(fake, pool):
    """fluxd settles everything it accepted before its bye (SPEC §8.8): what is unsettled then was not accepted."""
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.dispatch_and_settle, "todo/add", {"title": "milk"}, None, 10)
        ident = peer.expect_op("dispatch")["id"]
        fake.welcome_extra["epoch"] = "e2"
        peer.send({"op": "bye", "reason": "shutdown"})
        peer.hang_up()
        assert events.wait("disconnected").reason == "fluxd said bye (shutdown)"
        fake.accept()
        with pytest.raises(NotSentError, match=f"dispatch {ident} was not sent: fluxd said bye \\(shutdown\\)"):
            pending.result(10)
    finally:
        client.close()


def test_dispatches_wait_for_the_new_connection(fake, pool):
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.subscribe, "todos")
        peer.expect_op("subscribe")
        subscribed(peer, "todos", 0, status="unknown")
        pending.result(5)
        fake.hold = threading.Event()  # the next handshake waits
        peer.hang_up()
        events.wait("reconnecting")
        assert client.state == "reconnecting" and not client.connected
        with pytest.raises(FluxTimeoutError, match="timed out after 0.2 s waiting to reconnect to fluxd "
                                                   r"\(fluxd closed the connection\)"):
            client.dispatch("todo/add", {"title": "late"}, timeout=0.2)
        waiting = pool.submit(client.dispatch, "todo/add", {"title": "milk"}, None, 10)
        fake.hold.set()
        again = fake.accept()
        assert first_message(again) == {"op": "subscribe", "store": "todos"}  # the replay comes first
        dispatch = again.expect_op("dispatch")
        assert dispatch["payload"] == {"title": "milk"} and waiting.result(5) == dispatch["id"]
    finally:
        client.close()


def test_closing_while_reconnecting_is_not_undone(fake, pool):
    """A subscription and a query closed while the client reconnects are not made again on the next connection
    (the lost connection took them with it: nothing is sent)."""
    client, peer, events = connect(fake)
    try:
        pending = pool.submit(client.subscribe, "todos")
        peer.expect_op("subscribe")
        subscribed(peer, "todos", 0, status="unknown")
        sub = pending.result(5)
        pending = pool.submit(client.query, "comments", {"site": 1})
        peer.send({"op": "query-ok", "id": peer.expect_op("query")["id"]})
        receipt = pending.result(5)
        fake.hold = threading.Event()
        peer.hang_up()
        events.wait("reconnecting")
        sub.close()
        receipt.close()  # both return at once
        fake.hold.set()
        again = fake.accept()
        barrier = pool.submit(client.ping, 5)
        assert first_message(again)["op"] == "ping" and barrier.result(5) >= 0
    finally:
        client.close()


def test_without_reconnection_the_first_loss_closes_the_client(fake, pool):
    client, peer, events = connect(fake, reconnect=False)
    try:
        pending = pool.submit(client.dispatch_and_settle, "todo/add", {"title": "milk"}, None, 10)
        peer.expect_op("dispatch")
        peer.hang_up()
        lost = events.wait("disconnected")
        assert not lost.will_reconnect
        with pytest.raises(OutcomeUnknownError, match="the connection was lost"):
            pending.result(10)
        with pytest.raises(Disconnected):
            client.ping(5)
        assert client.closed and client.state == "closed"
        assert events.kinds() == ["disconnected"]
    finally:
        client.close()


def test_gives_up_after_max_attempts(fake, pool):
    client, peer, events = connect(fake, reconnect=Reconnect(initial_delay=0.01, max_delay=0.02, max_attempts=2))
    try:
        pending = pool.submit(client.dispatch_and_settle, "todo/add", {"title": "milk"}, None, 10)
        peer.expect_op("dispatch")
        fake.stop_listening()  # fluxd is gone for good
        peer.hang_up()
        gave_up = events.wait("gave-up")
        assert events.kinds() == ["disconnected", "reconnecting", "reconnecting", "gave-up"]
        assert "gave up reconnecting to fluxd after 2 attempt(s): no fluxd at" in gave_up.reason
        with pytest.raises(OutcomeUnknownError):
            pending.result(10)
        with pytest.raises(Disconnected, match="gave up reconnecting"):
            client.ping(5)
        assert client.closed
    finally:
        client.close()


def test_gives_up_after_a_time(fake):
    client, peer, events = connect(fake, reconnect=Reconnect(initial_delay=0.01, max_delay=0.02, give_up_after=0.3))
    try:
        fake.stop_listening()
        peer.hang_up()
        assert "gave up reconnecting to fluxd after 0.3 s" in events.wait("gave-up").reason
        assert events.kinds().count("reconnecting") >= 2
    finally:
        client.close()


def test_close_ends_a_backoff_at_once(fake):
    client, peer, events = connect(fake, reconnect=Reconnect(initial_delay=30, max_delay=30, jitter=0))
    fake.stop_listening()
    peer.hang_up()
    assert events.wait("reconnecting").delay == 30
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < 5 and client.closed
    assert events.kinds() == ["disconnected", "reconnecting"]


def test_drop_connection_reconnects(fake):
    client, peer, events = connect(fake)
    try:
        client.drop_connection("testing")
        assert events.wait("disconnected").reason == "testing"
        fake.accept()
        events.wait("reconnected")
        client.wait_connected(5)
        assert client.ping(5) >= 0
    finally:
        client.close()


# -- asyncio client ---------------------------------------------------------------------------------------------

def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


class AsyncEvents:
    """A connection-event callback for the asyncio client (called on the loop)."""

    def __init__(self):
        self.queue = asyncio.Queue()
        self.seen = []

    def __call__(self, event):
        self.queue.put_nowait(event)

    async def wait(self, kind, timeout=10.0):
        async def until():
            while True:
                event = await self.queue.get()
                self.seen.append(event)
                if event.kind == kind:
                    return event
        return await asyncio.wait_for(until(), timeout)


async def blocking(function, *args):
    """Runs a blocking call of the fake fluxd off the loop."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


async def async_connect(fake, **options):
    events = AsyncEvents()
    options.setdefault("reconnect", FAST)
    client = await AsyncClient.connect(fake.socket_path, name="arc", timeout=10, on_connection_event=events,
                                       **options)
    return client, await blocking(fake.accept), events


def test_async_reconnects_and_goes_on(fake):
    async def scenario():
        client, peer, events = await async_connect(fake)
        try:
            assert client.session == peer.hello["session"] and client.epoch == "e1"
            subscribing = asyncio.ensure_future(client.subscribe("todos"))
            assert (await blocking(peer.expect_op, "subscribe"))["store"] == "todos"
            subscribed(peer, "todos", 3)
            snapshot(peer, "todos", 3, 7, {"n": 3})
            sub = await subscribing
            assert (await sub.next(5)).version == 3
            querying = asyncio.ensure_future(client.query("comments", {"site": 7}))
            query = await blocking(peer.expect_op, "query")
            peer.send({"op": "query-ok", "id": query["id"]})
            await querying
            info = asyncio.ensure_future(client.info(10))
            request = await blocking(peer.expect_op, "info")
            peer.hang_up()
            assert (await events.wait("disconnected")).will_reconnect
            again = await blocking(fake.accept)
            assert again.hello["session"] == client.session
            assert await blocking(first_message, again) == {"op": "subscribe", "store": "todos"}
            assert (await blocking(again.expect, lambda m: True))["op"] == "query"
            assert await blocking(again.expect_op, "info") == request  # sent again
            again.send({"op": "info", "id": request["id"], "seq": 0, "stores": []})
            assert (await info)["stores"] == []
            subscribed(again, "todos", 3)
            snapshot(again, "todos", 3, 7, {"n": 3})
            snapshot(again, "todos", 4, 8, {"n": 4})
            assert (await sub.next(5)).version == 4  # not 3 again
            assert (await events.wait("reconnected")).epoch_changed is False
            assert client._pending == {} and client._lost_policy == {} and client.connected
        finally:
            await client.close()
    run(scenario())


@pytest.mark.parametrize("outcome", ["settled", "unknown", "unknown-op"])
def test_async_pending_settlement_is_recovered(fake, outcome):
    async def scenario():
        client, peer, _ = await async_connect(fake)
        try:
            settling = asyncio.ensure_future(client.dispatch_and_settle("todo/add", {"title": "milk"}))
            ident = (await blocking(peer.expect_op, "dispatch"))["id"]
            peer.hang_up()
            again = await blocking(fake.accept)
            recover = await blocking(first_message, again)
            assert recover["op"] == "recover" and recover["ids"] == [ident]
            if outcome == "settled":
                again.send({"op": "recovered", "id": recover["id"], "outcomes": [
                    {"id": ident, "status": "settled", "seq": 41, "results": RESULTS}]})
                assert (await settling).seq == 41
            elif outcome == "unknown":
                again.send({"op": "recovered", "id": recover["id"], "outcomes": [{"id": ident, "status": "unknown"}]})
                with pytest.raises(NotSentError):
                    await settling
            else:
                again.send({"op": "error", "code": "unknown-op", "message": "no", "ref": recover["id"],
                            "fatal": False})
                with pytest.raises(OutcomeUnknownError):
                    await settling
            assert client._unsettled == {} and client._pending == {}
        finally:
            await client.close()
    run(scenario())


def test_async_dispatch_waits_for_the_new_connection(fake):
    async def scenario():
        client, peer, events = await async_connect(fake)
        try:
            fake.hold = threading.Event()
            peer.hang_up()
            await events.wait("reconnecting")
            assert client.state == "reconnecting"
            with pytest.raises(FluxTimeoutError):
                await client.dispatch("todo/add", {"title": "late"}, timeout=0.2)
            waiting = asyncio.ensure_future(client.dispatch("todo/add", {"title": "milk"}))
            fake.hold.set()
            again = await blocking(fake.accept)
            dispatch = await blocking(again.expect_op, "dispatch")
            assert dispatch["payload"] == {"title": "milk"} and await waiting == dispatch["id"]
        finally:
            await client.close()
    run(scenario())


def test_async_gives_up_and_close_ends_a_backoff(fake):
    async def scenario():
        client, peer, events = await async_connect(
            fake, reconnect=Reconnect(initial_delay=0.01, max_delay=0.02, max_attempts=1))
        settling = asyncio.ensure_future(client.dispatch_and_settle("todo/add", {}))
        await blocking(peer.expect_op, "dispatch")
        fake.stop_listening()
        peer.hang_up()
        assert "after 1 attempt(s)" in (await events.wait("gave-up")).reason
        with pytest.raises(OutcomeUnknownError):
            await settling
        with pytest.raises(Disconnected, match="gave up"):
            await client.ping()
        assert client.state == "closed"
        await client.close()
    run(scenario())


def test_async_close_during_backoff(fake):
    async def scenario():
        client, peer, events = await async_connect(fake, reconnect=Reconnect(initial_delay=30, max_delay=30))
        fake.stop_listening()
        peer.hang_up()
        await events.wait("reconnecting")
        start = time.monotonic()
        await client.close()
        assert time.monotonic() - start < 5 and client.closed
    run(scenario())


def test_async_callback_may_be_a_coroutine(fake):
    async def scenario():
        seen = asyncio.Queue()

        async def on_event(event):
            await seen.put(event.kind)
        client = await AsyncClient.connect(fake.socket_path, reconnect=FAST, on_connection_event=on_event)
        peer = await blocking(fake.accept)
        peer.hang_up()
        kinds = [await asyncio.wait_for(seen.get(), 10) for _ in range(3)]
        assert kinds == [ConnectionEvent.DISCONNECTED, ConnectionEvent.RECONNECTING, ConnectionEvent.RECONNECTED]
        await client.close()
    run(scenario())
