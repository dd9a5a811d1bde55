"""SPEC §16 against the real fluxd ($FLUXD; it must speak §16, fluxd 0.4.0 or newer): one Python store publishing
patches, and a delta subscriber, a full-snapshot subscriber and a path subscriber that see, at every version, the
state ``get`` returns; a path subscriber is not woken by changes elsewhere. These tests fail (they are not
skipped) with a fluxd that does not speak §16."""
import pytest

from fluxbus import Client, Reject, Store, on
from fluxbus.patch import resolve, PointerError

TODOS = 200


class Todos(Store):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"todos": [{"id": i, "title": f"todo {i}", "done": False} for i in range(1, TODOS + 1)],
                     "nextID": TODOS + 1}

    @on("todo/toggle")
    def toggle(self, state, payload, ctx):
        for todo in state["todos"]:
            if todo["id"] == payload["id"]:
                todo["done"] = not todo["done"]
                return state
        raise Reject("todo/not-found", f"no todo with id {payload['id']}")

    @on("todo/create")
    def create(self, state, payload, ctx):
        state["todos"].append({"id": state["nextID"], "title": payload["title"], "done": False})
        state["nextID"] += 1
        return state

    @on("todo/delete")
    def delete(self, state, payload, ctx):
        state["todos"] = [todo for todo in state["todos"] if todo["id"] != payload["id"]]
        return state


class SharedTodos(Todos):
    handler_state = "shared"

    @on("todo/toggle")
    def toggle(self, state, payload, ctx):
        todos = list(state["todos"])
        for index, todo in enumerate(todos):
            if todo["id"] == payload["id"]:
                todos[index] = {**todo, "done": not todo["done"]}
                return {**state, "todos": todos}
        raise Reject("todo/not-found", f"no todo with id {payload['id']}")

    # "shared" handlers never change the state they are given: each returns a new one that shares what it kept.
    @on("todo/create")
    def create(self, state, payload, ctx):
        todo = {"id": state["nextID"], "title": payload["title"], "done": False}
        return {**state, "todos": state["todos"] + [todo], "nextID": state["nextID"] + 1}

    @on("todo/delete")
    def delete(self, state, payload, ctx):
        return {**state, "todos": [todo for todo in state["todos"] if todo["id"] != payload["id"]]}


def require_deltas(client):
    assert client.speaks_deltas(), (f"this fluxd ({client.welcome.server}) does not speak SPEC §16 (no "
                                    f"welcome.limits.deltaHistory): run with FLUXD=/tmp/fluxd16/fluxd or a fluxd "
                                    f"0.4.0 or newer")


def value_at(state, path):
    try:
        return True, resolve(state, path)
    except PointerError:
        return False, None


@pytest.mark.parametrize("store_class", [Todos, SharedTodos])
def test_delta_full_and_path_subscribers_agree_with_get_at_every_version(fluxd, store_class):
    store = store_class(socket_path=fluxd.socket_path)
    store.start()
    client = Client.connect(fluxd.socket_path, name="watcher", timeout=10)
    # One connection holds one whole-store subscription per store (SPEC §8.5): the full one gets its own.
    other = Client.connect(fluxd.socket_path, name="full-watcher", timeout=10)
    try:
        require_deltas(client)
        delta = client.subscribe("todos")
        full = other.subscribe("todos", deltas=False)
        path = client.subscribe("todos", path="/todos/3")
        assert delta.deltas and not full.deltas and path.path == "/todos/3"
        first = delta.first(timeout=10)
        assert first.state == store.initial_state
        assert path.first(timeout=10).value == store.initial_state["todos"][3]
        steps = [("todo/toggle", {"id": 5}), ("todo/toggle", {"id": 4}), ("todo/create", {"title": "new"}),
                 ("todo/toggle", {"id": 150}), ("todo/delete", {"id": 2}), ("todo/toggle", {"id": 5}),
                 ("todo/delete", {"id": 1}), ("todo/toggle", {"id": 999})]
        for type, payload in steps:
            settled = client.dispatch_and_settle(type, payload)
            result = settled["todos"]
            got = client.get("todos")
            if result.status == "rejected":  # (toggling a todo that does not exist: no new version)
                assert got.version == delta.latest.version and got.state == delta.latest.state
                continue
            assert got.version == result.version
            # read your writes: each subscription holds the settled version's state already (R5)
            assert delta.latest.version == got.version and delta.latest.state == got.state, (type, payload)
            # (R5 covers the dispatcher's own subscriptions; the other connection's arrives in its own time)
            while full.latest is None or full.latest.version < got.version:
                full.next(timeout=10)
            assert full.latest.version == got.version and full.latest.state == got.state
            exists, value = value_at(got.state, "/todos/3")
            assert path.latest.version <= got.version
            assert (path.latest.exists, path.latest.value) == (exists, value), (type, payload)
            assert store.state == got.state and store.version == got.version
        assert store.patches_sent >= 6 and store.states_sent == 0
        assert delta.deltas_applied >= 6 and delta.resyncs == 0
        versions = [snap.version for snap in list(delta._queue)]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
    finally:
        client.close()
        other.close()
        store.stop()


def test_a_path_subscriber_is_not_woken_by_changes_elsewhere(fluxd):
    store = Todos(socket_path=fluxd.socket_path)
    store.start()
    client = Client.connect(fluxd.socket_path, name="path-watcher", timeout=10)
    try:
        require_deltas(client)
        path = client.subscribe("todos", path="/todos/3")
        assert path.next(timeout=10).value["id"] == 4
        for todo_id in (10, 20, 30, 2, 3):  # none of these touches /todos/3 (index 3 is id 4)
            result = client.dispatch_and_settle("todo/toggle", {"id": todo_id})["todos"]
            assert result.status == "done"
            assert not path._queue, f"woken by toggling id {todo_id}: {list(path._queue)}"  # R5: it would be here
        client.dispatch_and_settle("todo/toggle", {"id": 4})
        woken = path.next(timeout=0)
        assert woken.value == {"id": 4, "title": "todo 4", "done": True}
        client.dispatch_and_settle("todo/delete", {"id": 1})  # index 0 removed: /todos/3 is now id 5
        shifted = path.next(timeout=0)
        assert shifted.value["id"] == 5
    finally:
        client.close()
        store.stop()


def test_a_late_delta_subscriber_gets_the_whole_state_then_deltas(fluxd):
    store = Todos(socket_path=fluxd.socket_path)
    store.start()
    client = Client.connect(fluxd.socket_path, name="late", timeout=10)
    try:
        require_deltas(client)
        for todo_id in range(1, 6):
            client.dispatch_and_settle("todo/toggle", {"id": todo_id})
        sub = client.subscribe("todos")
        first = sub.next(timeout=10)
        assert first.version == client.get("todos").version and first.state == store.state
        client.dispatch_and_settle("todo/toggle", {"id": 7})
        after = sub.next(timeout=0)
        assert after.version == first.version + 1 and after.state == client.get("todos").state
        assert sub.deltas_applied == 1
    finally:
        client.close()
        store.stop()


class BigTodos(Todos):
    """About 700 KB of state: more than the kernel holds for a subscriber that does not read, so fluxd has to keep
    the rest, and the subscriber is behind (SPEC §16.3: more than 64 KiB waiting in fluxd)."""
    initial_state = {"todos": [{"id": i, "title": f"todo {i} " + "x" * 140, "done": False} for i in range(1, 4001)],
                     "nextID": 4001}


class RawSubscriber:
    """A subscriber on a plain socket, so the test decides when (and whether) it reads."""

    def __init__(self, path):
        import socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = b""
        self.send({"op": "hello", "protocol": 1, "role": "client", "name": "slow"})
        assert self.recv(10)["op"] == "welcome"

    def send(self, message):
        import json
        import struct
        body = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def recv(self, timeout):
        import json
        import struct
        import time
        deadline = time.monotonic() + timeout
        while len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack(">I", self.buffer[:4])[0]:
            left = deadline - time.monotonic()
            assert left > 0, "no frame within the deadline"
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 20)
            assert chunk, "fluxd closed the connection"
            self.buffer += chunk
        size = struct.unpack(">I", self.buffer[:4])[0]
        body, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
        return json.loads(body)

    def close(self):
        self.sock.close()


def test_a_slow_delta_subscriber_skips_versions_and_resyncs_never_holding_a_wrong_state(fluxd_factory):
    from fluxbus.patch import apply
    daemon = fluxd_factory(durable=True)  # durable: state-at tells the true state of every version afterwards
    store = BigTodos(socket_path=daemon.socket_path)
    store.start()
    client = Client.connect(daemon.socket_path, name="driver", timeout=10)
    slow = RawSubscriber(daemon.socket_path)
    try:
        require_deltas(client)
        slow.send({"op": "subscribe", "store": "todos", "deltas": True})
        # It reads nothing now: its snapshot fills the kernel's buffer, and what follows waits in fluxd.
        for n in range(60):
            client.dispatch_and_settle("todo/toggle", {"id": 1 + n * 61})
        middle = client.get("todos").version
        held, version, seen, snapshots, deltas = None, 0, [], 0, 0

        def take_until(target):
            nonlocal held, version, snapshots, deltas
            while version < target:
                frame = slow.recv(20)
                if frame["op"] == "snapshot":
                    held, version = frame["state"], frame["version"]
                    snapshots += 1
                elif frame["op"] == "delta":
                    assert frame["from"] == version, f"a delta from {frame['from']} to a subscriber at {version}"
                    held, version = apply(held, frame["patch"]), frame["version"]
                    deltas += 1
                else:
                    assert frame["op"] == "subscribed", frame
                    continue
                seen.append((version, held))

        take_until(middle)
        assert version == middle
        assert snapshots >= 2 and len(seen) < middle, \
            f"it skipped versions and was resynchronised by a whole snapshot: saw {[v for v, _ in seen]}"
        # Caught up, it is sent deltas again.
        for n in range(5):
            client.dispatch_and_settle("todo/toggle", {"id": 2 + n})
        final = client.get("todos")
        take_until(final.version)
        assert deltas >= 1 and held == final.state
        # Never a wrong state: each one it held is the state of that version (the journal's state-at).
        checker = RawSubscriber(daemon.socket_path)
        try:
            for v, state in seen:
                checker.send({"op": "state-at", "id": f"v{v}", "store": "todos", "version": v})
                answer = checker.recv(20)
                assert answer["op"] == "state-at" and answer["version"] == v, answer
                assert answer["state"] == state, f"version {v}: the subscriber held another state"
        finally:
            checker.close()
    finally:
        slow.close()
        client.close()
        store.stop()
