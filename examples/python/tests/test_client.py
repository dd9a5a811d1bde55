"""The sync client and the Store base class against a real fluxd."""
import threading

import pytest

from fluxbus import Client, FluxError, Reject, Store, on


class Todos(Store):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"items": [], "next": 1}

    @on("todo/add")
    def add(self, state, payload, ctx):
        if not payload.get("title"):
            raise Reject("todo/empty-title", "a todo needs a title", field="title")
        state["items"].append({"id": state["next"], "title": payload["title"], "seq": ctx.seq})
        state["next"] += 1
        if payload.get("announce"):
            ctx.dispatch("log/added", {"title": payload["title"]})
        return state

    @on("todo/touch")
    def touch(self, state, payload, ctx):
        return state  # unchanged: answered done without state, no new version

    @on("todo/crash")
    def crash(self, state, payload, ctx):
        state["items"].clear()
        raise RuntimeError("boom")


class Log(Store):
    name = "log"
    handles = ["log/*"]
    initial_state = []

    @on("log/*")
    def append(self, state, payload, ctx):
        return state + [{"type": ctx.type, "cause": ctx.cause, "origin": ctx.origin}]


class Comments(Store):
    """Fetches only what is queried (the QueryStore pattern)."""
    name = "comments"
    handles = []
    initial_state = {}

    def on_queries(self, queries):
        wanted = {str(q.query["site"]) for q in queries}
        state = {site: [f"comment on {site}"] for site in sorted(wanted)}
        self.publish(state)


@pytest.fixture
def stores(fluxd):
    running = []

    def start(cls):
        store = cls(socket_path=fluxd.socket_path)
        thread = store.start()
        running.append((store, thread))
        return store

    yield start
    for store, thread in running:
        store.stop()
        thread.join(10)


def test_welcome_info_ping(fluxd):
    with Client.connect(fluxd.socket_path, name="py-test") as client:
        assert client.welcome.peer >= 1
        assert client.welcome.limits["maxFrame"] == 1048576
        assert client.ping() >= 0
        info = client.info()
        assert info["peers"]["client"] == 1
        with pytest.raises(FluxError) as caught:
            client.get("nothing")
        assert caught.value.code == "unknown-store"


def test_dispatch_and_settle_with_read_your_writes(fluxd, stores):
    stores(Todos)
    with Client.connect(fluxd.socket_path) as client:
        sub = client.subscribe("todos")
        assert sub.status == "up"
        first = sub.next(10)
        assert first.version == 1 and first.state == {"items": [], "next": 1}
        settlement = client.dispatch_and_settle("todo/add", {"title": "milk"}, timeout=10)
        assert settlement.ok and settlement["todos"].version == 2
        # read your writes: the snapshot of version 2 has already arrived
        assert sub.latest.version == 2
        assert sub.next(0).state["items"][0]["title"] == "milk"
        assert client.get("todos").version == 2


def test_unchanged_state_makes_no_new_version(fluxd, stores):
    stores(Todos)
    with Client.connect(fluxd.socket_path) as client:
        settlement = client.dispatch_and_settle("todo/touch", timeout=10)
        assert settlement["todos"].status == "done" and settlement["todos"].version == 1
        assert client.get("todos").version == 1


def test_rejection_and_handler_failure(fluxd, stores):
    stores(Todos)
    with Client.connect(fluxd.socket_path) as client:
        rejected = client.dispatch_and_settle("todo/add", {"title": ""}, timeout=10)
        assert rejected["todos"].status == "rejected"
        assert rejected["todos"].error == {"code": "todo/empty-title", "message": "a todo needs a title", "field": "title"}
        crashed = client.dispatch_and_settle("todo/crash", timeout=10)
        assert crashed["todos"].error["code"] == "store/error"
        # the failed handler's mutation left no trace
        assert client.dispatch_and_settle("todo/add", {"title": "x"}, timeout=10)["todos"].version == 2
        assert len(client.get("todos").state["items"]) == 1


def test_follow_up_dispatch_carries_cause(fluxd, stores):
    stores(Todos)
    stores(Log)
    with Client.connect(fluxd.socket_path) as client:
        log = client.subscribe("log")
        log.next(10)
        settlement = client.dispatch_and_settle("todo/add", {"title": "t", "announce": True}, timeout=10)
        snap = log.until(lambda s: len(s.state) == 1, timeout=10)
        assert snap.state[0] == {"type": "log/added", "cause": settlement.seq, "origin": snap.state[0]["origin"]}
        assert snap.state[0]["origin"] != client.welcome.peer


def test_errors_raise_or_are_kept(fluxd):
    with Client.connect(fluxd.socket_path) as client:
        with pytest.raises(FluxError) as caught:
            client.dispatch_and_settle("nobody/handles", timeout=10)
        assert caught.value.code == "no-handler" and not caught.value.fatal
        # A dispatch waits for fluxd's acceptance (SPEC §8.3) and raises the refusal to the caller ...
        with pytest.raises(FluxError) as caught:
            client.dispatch("nobody/handles")
        assert caught.value.code == "no-handler"
        assert client.dispatch("nobody/handles", ack=False) is not None  # ... or, not waiting, it is kept
        ident = client.dispatch("nobody/handles", ack=False)
        client.ping()
        assert [(e.code, e.ref) for e in client.errors][-1] == ("no-handler", ident)
        client.send_raw(b'{"op":"teleport"}')
        client.ping()
        assert client.errors[-1].code == "unknown-op"
        with pytest.raises(ValueError):
            client.dispatch("bad type")


def test_queries_drive_the_store(fluxd, stores):
    comments = stores(Comments)
    with Client.connect(fluxd.socket_path) as a, Client.connect(fluxd.socket_path) as b:
        sub = a.subscribe("comments")
        sub.next(10)
        with a.query("comments", {"site": 7}) as receipt:
            assert receipt.active
            snap = sub.until(lambda s: "7" in s.state, timeout=10)
            assert snap.state == {"7": ["comment on 7"]}
            b_receipt = b.query("comments", {"site": 3})
            sub.until(lambda s: set(s.state) == {"3", "7"}, timeout=10)
            b_receipt.close()
            sub.until(lambda s: set(s.state) == {"7"}, timeout=10)
        sub.until(lambda s: s.state == {}, timeout=10)
        assert comments.queries == []


def test_store_down_and_up_are_seen(fluxd):
    todos = Todos(socket_path=fluxd.socket_path)
    thread = todos.start()
    with Client.connect(fluxd.socket_path) as client:
        sub = client.subscribe("todos")
        sub.next(10)
        todos.stop()
        thread.join(10)
        client.ping()
        while sub.status != "down":
            client.poll(1)
        assert sub.events[-1].reason == "disconnected"
        again = Todos(socket_path=fluxd.socket_path)
        again_thread = again.start()
        try:
            client.ping()
            while sub.status != "up":
                client.poll(1)
            assert again.state == {"items": [], "next": 1}  # resumed from the retained snapshot
        finally:
            again.stop()
            again_thread.join(10)


def test_name_taken_is_refused(fluxd, stores):
    stores(Todos)
    with pytest.raises(FluxError) as caught:
        Todos(socket_path=fluxd.socket_path).connect()
    assert caught.value.code == "name-taken"


def test_unsubscribe_is_idempotent_and_close_ends_iteration(fluxd, stores):
    stores(Todos)
    client = Client.connect(fluxd.socket_path)
    sub = client.subscribe("todos")
    seen = []
    done = threading.Event()

    sub.next(10)
    sub.close()
    sub.close()
    client.close()
    for snap in sub:
        seen.append(snap)
    done.set()
    assert seen == [] and client.closed


def test_dispatch_waits_for_acceptance_and_gives_the_seq(fluxd, stores):
    """SPEC §8.3 (fluxd 0.4.0): dispatch asks for ``ack`` and returns once fluxd accepted the action; its seq is
    ``last_seq``; the settlement is not awaited."""
    stores(Todos)
    with Client.connect(fluxd.socket_path) as client:
        client.dispatch("todo/add", {"title": "a"})
        first = client.last_seq
        client.dispatch("todo/add", {"title": "b"})
        assert isinstance(first, int) and client.last_seq == first + 1
        settled = client.dispatch_and_settle("todo/add", {"title": "c"}, timeout=10)
        assert settled.seq == first + 2


def test_settle_timeout_names_the_store_it_waits_for(fluxd, stores):
    """A settlement that times out says what it still waits for, as fluxd's info tells: here a store that is
    down, with its queue (fluxctl says the same)."""
    todos = stores(Todos)
    todos.stop()
    with Client.connect(fluxd.socket_path) as client:
        with pytest.raises(TimeoutError) as caught:
            client.dispatch_and_settle("todo/add", {"title": "a"}, timeout=0.3)
        assert '; still waiting for store "todos", which is down (1 action queued for it' in str(caught.value)
