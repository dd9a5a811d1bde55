"""fluxd restarting under live stores and clients (SPEC §15): an ephemeral fluxd (a new epoch: versions start
over, the store offers its state again) and a durable one (``--data-dir`` in the test's temp directory; same
epoch: the subscription goes on with the next version and never delivers one twice, a pending settlement is
recovered, a dispatch fluxd never read is reported as not sent). Stopped cleanly (SIGTERM: ``bye``) or crashed
(SIGKILL). Every wait has a deadline; nothing sleeps to synchronise."""
import asyncio
import os
import queue
import signal
import threading

import pytest

from fluxbus import (AsyncClient, AsyncStore, Client, NotSentError, OutcomeUnknownError, Reconnect, Reject, Store,
                     on)

FAST = Reconnect(initial_delay=0.02, max_delay=0.2)


class Todos(Store):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"items": []}
    reconnect = FAST

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.registered = queue.Queue()

    @on("todo/add")
    def add(self, state, payload, ctx):
        self.calls.append((payload["title"], ctx.seq, ctx.redelivered))
        if payload.get("slow"):
            self.entered.set()
            assert self.gate.wait(30)
        if not payload["title"]:
            raise Reject("todo/empty-title", "a todo needs a title")
        return {"items": state["items"] + [payload["title"]]}

    def on_registered(self, resumed):
        self.registered.put(resumed)


class Events:
    def __init__(self):
        self.queue = queue.Queue()

    def __call__(self, event):
        self.queue.put(event)

    def wait(self, kind, timeout=20.0):
        while True:
            event = self.queue.get(timeout=timeout)
            if event.kind == kind:
                return event


class Watcher:
    """Every snapshot a subscription delivers, in order."""

    def __init__(self, sub):
        self.sub = sub
        self.versions = []

    def until(self, predicate, timeout=20.0):
        snap = self.sub.until(lambda s: self.versions.append((s.version, tuple(s.state["items"]))) or predicate(s),
                              timeout=timeout)
        return snap


def started(daemon):
    store = Todos(socket_path=daemon.socket_path)
    thread = store.start()
    assert store.registered.get(timeout=10) is False
    return store, thread


def assert_no_version_twice(versions):
    numbers = [v for v, _ in versions]
    assert numbers == sorted(set(numbers)), f"versions delivered: {versions}"


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_ephemeral_restart_starts_a_new_epoch(fluxd_factory, how):
    daemon = fluxd_factory()
    store, thread = started(daemon)
    events = Events()
    client = Client.connect(daemon.socket_path, name="view", on_connection_event=events, reconnect=FAST, timeout=20)
    try:
        assert client.welcome.durability in ("ephemeral", None)
        watch = Watcher(client.subscribe("todos"))
        client.dispatch_and_settle("todo/add", {"title": "milk"}).raise_for_status()
        watch.until(lambda s: s.state["items"] == ["milk"])
        epoch = client.epoch
        if how == "restart":
            daemon.restart()  # bye shutdown, then a new fluxd: nothing retained
        else:
            daemon.kill()
            daemon.start()
        back = events.wait("reconnected")
        assert back.epoch_changed is True and (epoch is None or back.epoch != epoch)
        assert store.registered.get(timeout=20) is False  # registered again, not resumed: a new fluxd
        # the store offered its state, which became version 1 of the new epoch: the subscription takes it
        snap = watch.until(lambda s: s.version == 1)
        assert snap.state == {"items": ["milk"]}
        client.dispatch_and_settle("todo/add", {"title": "eggs"}).raise_for_status()
        assert watch.until(lambda s: s.state["items"] == ["milk", "eggs"]).version == 2
        assert store.registrations == 2 and not client.errors
    finally:
        client.close()
        store.stop()
        thread.join(10)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_durable_restart_goes_on_with_the_next_version(fluxd_factory, how):
    daemon = fluxd_factory(durable=True)
    store, thread = started(daemon)
    events = Events()
    client = Client.connect(daemon.socket_path, name="view", on_connection_event=events, reconnect=FAST, timeout=20)
    try:
        assert client.welcome.durability == "batch" and client.epoch
        watch = Watcher(client.subscribe("todos"))
        for title in ("milk", "eggs"):
            client.dispatch_and_settle("todo/add", {"title": title}).raise_for_status()
        before = watch.until(lambda s: s.state["items"] == ["milk", "eggs"])
        if how == "restart":
            daemon.restart()  # bye restart
        else:
            daemon.kill()
            daemon.start()
        lost = events.wait("disconnected")
        if how == "restart":
            assert lost.reason == "fluxd said bye (restart)"
        back = events.wait("reconnected")
        assert back.epoch_changed is False and back.epoch == client.epoch
        assert store.registered.get(timeout=20) is True  # resumed
        assert store.state == {"items": ["milk", "eggs"]} and store.version == before.version
        settled = client.dispatch_and_settle("todo/add", {"title": "bread"}).raise_for_status()
        after = watch.until(lambda s: s.state["items"] == ["milk", "eggs", "bread"])
        assert after.version == before.version + 1 == settled["todos"].version
        assert_no_version_twice(watch.versions)
        assert [items for _, items in watch.versions][-1] == ("milk", "eggs", "bread")
        assert store.calls == [("milk", 1, False), ("eggs", 2, False), ("bread", settled.seq, False)]
        assert settled.seq > 2  # seqs continue
    finally:
        client.close()
        store.stop()
        thread.join(10)


def test_durable_crash_recovers_a_pending_settlement(fluxd_factory):
    """The action was accepted and delivered, not answered, when fluxd crashed: after the restart it is
    delivered again (redelivered), answered once, and the dispatcher's settlement comes through ``recover``."""
    daemon = fluxd_factory(durable=True, )
    store, thread = started(daemon)
    events = Events()
    client = Client.connect(daemon.socket_path, name="view", on_connection_event=events, reconnect=FAST, timeout=30)
    try:
        watch = Watcher(client.subscribe("todos"))
        client.dispatch_and_settle("todo/add", {"title": "milk"}).raise_for_status()
        store.gate.clear()
        result = {}

        def settle():
            try:
                result["settled"] = client.dispatch_and_settle("todo/add", {"title": "eggs", "slow": True})
            except Exception as error:  # noqa: BLE001 (reported below)
                result["error"] = error
        caller = threading.Thread(target=settle)
        caller.start()
        assert store.entered.wait(10)
        daemon.kill()  # the answer never reaches this fluxd
        daemon.start()
        events.wait("reconnected")
        store.gate.set()  # the first delivery's answer belongs to the lost connection: not sent
        caller.join(30)
        assert "error" not in result, result.get("error")
        settled = result["settled"].raise_for_status()
        after = watch.until(lambda s: s.state["items"] == ["milk", "eggs"])
        assert settled["todos"].version == after.version
        assert [(title, redelivered) for title, _, redelivered in store.calls] == [
            ("milk", False), ("eggs", False), ("eggs", True)]
        assert store.state == {"items": ["milk", "eggs"]}  # applied once
        assert_no_version_twice(watch.versions)
    finally:
        store.gate.set()
        client.close()
        store.stop()
        thread.join(10)


class SpyClient(Client):
    """Tells when the dispatch of the todo ``watched`` has been written to the socket."""

    watched = b'"title":"eggs"'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dispatched = threading.Event()

    def _send_raw(self, frame, *args, **kwargs):
        gen = super()._send_raw(frame, *args, **kwargs)
        if b'"op":"dispatch"' in frame and self.watched in frame and gen:
            self.dispatched.set()
        return gen


def test_a_dispatch_fluxd_never_read_is_not_sent(fluxd_factory):
    daemon = fluxd_factory(durable=True)
    store, thread = started(daemon)
    events = Events()
    client = SpyClient.connect(daemon.socket_path, name="view", on_connection_event=events, reconnect=FAST,
                               timeout=30)
    try:
        client.dispatch_and_settle("todo/add", {"title": "milk"}).raise_for_status()
        os.kill(daemon.process.pid, signal.SIGSTOP)  # fluxd reads nothing more...
        _, status = os.waitpid(daemon.process.pid, os.WUNTRACED)  # ...once it has stopped (we are its parent)
        assert os.WIFSTOPPED(status)
        result = {}

        def settle():
            try:
                result["settled"] = client.dispatch_and_settle("todo/add", {"title": "eggs"})
            except Exception as error:  # noqa: BLE001
                result["error"] = error
        caller = threading.Thread(target=settle)
        caller.start()
        assert client.dispatched.wait(10)  # in the socket, never read by fluxd
        daemon.kill()
        daemon.start()
        caller.join(30)
        error = result.get("error")
        assert isinstance(error, NotSentError), result
        assert error.code == "not-sent" and "may be dispatched again" in str(error)
        assert events.wait("reconnected").epoch_changed is False
        # it may be dispatched again, and the store never saw it
        client.dispatch_and_settle("todo/add", {"title": "eggs"}).raise_for_status()
        assert [title for title, _, _ in store.calls] == ["milk", "eggs"]
    finally:
        if daemon.process.poll() is None:
            os.kill(daemon.process.pid, signal.SIGCONT)
        client.close()
        store.stop()
        thread.join(10)


def test_ephemeral_crash_makes_a_pending_outcome_unknown(fluxd_factory):
    daemon = fluxd_factory()
    store, thread = started(daemon)
    client = Client.connect(daemon.socket_path, name="view", reconnect=FAST, timeout=30)
    try:
        store.gate.clear()
        result = {}

        def settle():
            try:
                result["settled"] = client.dispatch_and_settle("todo/add", {"title": "eggs", "slow": True})
            except Exception as error:  # noqa: BLE001
                result["error"] = error
        caller = threading.Thread(target=settle)
        caller.start()
        assert store.entered.wait(10)
        daemon.kill()
        daemon.start()
        caller.join(30)
        assert isinstance(result.get("error"), OutcomeUnknownError), result
    finally:
        store.gate.set()
        client.close()
        store.stop()
        thread.join(10)


class AsyncTodos(AsyncStore):
    name = "todos"
    handles = ["todo/*"]
    initial_state = {"items": []}
    reconnect = FAST

    @on("todo/add")
    async def add(self, state, payload, ctx):
        return {"items": state["items"] + [payload["title"]]}


def test_async_durable_restart(fluxd_factory):
    daemon = fluxd_factory(durable=True)

    async def scenario():
        store = AsyncTodos(socket_path=daemon.socket_path)
        await store.start()
        seen = asyncio.Queue()
        client = await AsyncClient.connect(daemon.socket_path, reconnect=FAST, timeout=20,
                                           on_connection_event=lambda e: seen.put_nowait(e))
        try:
            sub = await client.subscribe("todos")
            versions = []
            first = await client.dispatch_and_settle("todo/add", {"title": "milk"})
            while not versions or versions[-1] < first["todos"].version:
                versions.append((await sub.next(10)).version)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, daemon.restart)
            while (await asyncio.wait_for(seen.get(), 20)).kind != "reconnected":
                pass
            settled = await client.dispatch_and_settle("todo/add", {"title": "eggs"})
            while versions[-1] < settled["todos"].version:
                versions.append((await sub.next(10)).version)
            assert versions == sorted(set(versions)) and versions[-1] == first["todos"].version + 1
            assert store.state == {"items": ["milk", "eggs"]} and store.registrations == 2
        finally:
            await client.close()
            await store.stop()
    asyncio.run(asyncio.wait_for(scenario(), 90))


class Lines:
    """The lines a process prints, read by a thread; ``wait_for(text)`` waits for one containing ``text``."""

    def __init__(self, stream):
        self.queue = queue.Queue()
        self.seen = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, text, timeout=20.0):
        while True:
            try:
                line = self.queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r}; lines: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended without a line with {text!r}; lines: {self.seen}")
            self.seen.append(line)
            if text in line:
                return line


def test_demo_audit_store_waits_for_fluxd_and_resumes(fluxd_factory):
    """demo/audit_store.py (the Python store of scripts/polyglot-demo.sh) outlives a fluxd restart."""
    import subprocess
    import sys
    daemon = fluxd_factory(durable=True)
    demo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo", "audit_store.py")
    process = subprocess.Popen([sys.executable, demo], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "FLUXBUS_SOCKET": daemon.socket_path}, stdin=subprocess.DEVNULL)
    lines = Lines(process.stdout)
    try:
        assert lines.wait_for("audit-store ready") == "audit-store ready"
        with Client.connect(daemon.socket_path, reconnect=FAST, timeout=20) as client:
            client.dispatch_and_settle("todo/create", {"title": "milk"}).raise_for_status()
            daemon.restart()
            # Its log, in fluxd's format (docs/logging.md): the library says the connection went and came back,
            # the store that it registered again (test_log_format.py checks every line and that each comes once).
            assert lines.wait_for("connection to fluxd lost").endswith(
                " notice fluxbus: connection to fluxd lost (fluxd said bye (restart)); reconnecting client=audit-py")
            assert " notice fluxbus: reconnected to fluxd after " in lines.wait_for("reconnected to fluxd")
            assert lines.wait_for("registered again").endswith(
                " info audit-store: registered again resumed=true version=2")
            client.dispatch_and_settle("todo/create", {"title": "eggs"}).raise_for_status()
            assert client.get("audit").state["byType"] == {"todo/create": 2}
        assert process.poll() is None  # still serving
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()
