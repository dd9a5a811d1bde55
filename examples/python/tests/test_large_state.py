"""Stores whose state is larger than one frame, and refused registrations (SPEC §16.6).

- The pieces: each fits in ``maxFrame``, and applied in order to the empty root they make the state exactly
  (member order included).
- Against a real fluxd with ``--max-frame 65536`` and a state of about 200 KB: the store registers without state
  and publishes it in pieces; after an ephemeral restart it does so again; after a durable restart it adopts the
  retained snapshot; a subscriber sees the whole state each time and the store answers actions afterwards.
- A refused registration (``name-taken``) is tried again with a growing wait: a few times in two seconds, never
  in a tight loop (counted by a monitor of a real fluxd, and as connections to the fake fluxd).
"""
import asyncio
import json
import logging
import os
import queue
import socket
import threading
import time

import pytest

from fakefluxd import FakeFluxd
from fluxbus import AsyncStore, Client, Reconnect, Store, on
from fluxbus._core import ClientCore, RegistrationCore
from fluxbus.errors import NameTakenError, StateTooLargeError
from fluxbus.patch import apply
from fluxbus.pieces import fits, refusal_delay, split_state, state_frame_length
from fluxbus.wire import FrameDecoder, dumps, encode_frame, loads

MAX_FRAME = 65536


def big_state(members=1000, text=150):
    """About 200 KB: many members, one member too large for a frame (a list of objects), an array element too
    large for a frame, keys that need escaping in a pointer, and numbers and nulls."""
    return {
        "items": {f"item-{i:05d}": {"title": f"todo {i} " + "x" * text, "done": i % 3 == 0, "n": i}
                  for i in range(members)},
        "log": [{"at": i, "what": "y" * 200} for i in range(400)],
        "nested": [[{"deep": "z" * 40000}, {"deeper": ["w" * 30000, "v" * 30000]}], 7, None],
        "a/b~c": {"é ünïcode": "ß" * 10, "": 1.5},
        "count": 0,
    }


def ordered(value):
    """``value`` as JSON with members in the order they are in (not sorted)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def rebuild(pieces):
    state = loads(pieces.root)
    for patch in pieces.patches:
        state = apply(state, loads(patch))
    return state


# -- the pieces ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_frame", [MAX_FRAME, 45000, 1048576])
def test_pieces_fit_and_rebuild_the_state_exactly(max_frame):
    state = big_state()
    pieces = split_state(state, "todos", max_frame)
    assert loads(pieces.root) == {} and len(pieces.patches) >= (1 if max_frame > 300000 else 4)
    assert state_frame_length("todos", pieces.root) <= max_frame
    for patch in pieces.patches:
        body = ClientCore._change_frame({"op": "patch", "store": "todos"}, None, patch, 2 ** 53 - 1)[4:]
        assert len(body) <= max_frame
        assert all(op["op"] == "add" for op in loads(patch))
    rebuilt = rebuild(pieces)
    assert rebuilt == state
    assert ordered(rebuilt) == dumps(state).decode()  # members in the order a whole state is written (sorted)
    assert pieces.whole() == state and pieces.state_after(0) == {}


def test_pieces_split_a_member_and_an_element_too_large_for_one_frame():
    state = {"big": ["s" * 3000 for _ in range(10)], "list": [{"k": "t" * 3000, "j": "u" * 3000}, 1]}
    pieces = split_state(state, "s", 4096)
    ops = [op for patch in pieces.patches for op in loads(patch)]
    paths = [(op["path"], op["value"] if op["value"] in ({}, []) else "...") for op in ops]
    assert paths[:2] == [("/big", []), ("/big/-", "...")]  # added empty, then its elements appended
    assert ("/list/-", {}) in paths and ("/list/0/j", "...") in paths and ("/list/0/k", "...") in paths
    assert paths.index(("/list/0/j", "...")) < paths.index(("/list/0/k", "..."))  # member order kept
    assert rebuild(pieces) == state


def test_an_array_root_is_appended_to():
    state = [{"n": i, "pad": "p" * 500} for i in range(50)]
    pieces = split_state(state, "list", 4096)
    assert loads(pieces.root) == []
    assert {op["path"] for patch in pieces.patches for op in loads(patch)} == {"/-"}
    assert rebuild(pieces) == state


def test_what_cannot_be_published_in_pieces_is_an_error():
    with pytest.raises(StateTooLargeError, match="single str"):
        split_state("x" * 10000, "s", 4096)
    with pytest.raises(StateTooLargeError, match="'/a/0'") as caught:
        split_state({"a": ["x" * 10000]}, "s", 4096)
    assert caught.value.code == "state-too-large" and caught.value.ref == "s"


def test_a_register_frame_that_does_not_fit_leaves_the_state_out():
    fields = ClientCore._register_fields("s", ["s/*"], [], {"pad": "p" * 5000}, True)
    frame, omitted = RegistrationCore._fitting_frame(fields, 4096)
    assert omitted and "state" not in loads(frame[4:]) and loads(frame[4:])["handles"] == ["s/*"]
    frame, omitted = RegistrationCore._fitting_frame(fields, 8192)
    assert not omitted and loads(frame[4:])["state"] == {"pad": "p" * 5000}
    assert fits(len(frame) - 4, 8192) and not fits(len(frame) - 4, 4096) and fits(10 ** 9, None)


def test_the_wait_after_a_refusal_doubles_up_to_30_s_with_jitter():
    for refusals in range(1, 16):
        ceiling = min(30.0, 0.1 * 2 ** (refusals - 1))
        assert refusal_delay(refusals, lambda: 0.0) == pytest.approx(ceiling / 2)
        assert refusal_delay(refusals, lambda: 0.999999) == pytest.approx(ceiling, rel=1e-5)
    assert refusal_delay(10 ** 6, lambda: 0.5) == pytest.approx(22.5)


# -- against a real fluxd ----------------------------------------------------------------------------------------

class BigStore(Store):
    name = "big"
    handles = ["big/*"]
    initial_state = big_state()
    reconnect = Reconnect(initial_delay=0.02, max_delay=0.2)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.registered = queue.Queue()

    def on_registered(self, resumed):
        self.registered.put((resumed, self.version, self.states_sent, self.patches_sent))

    @on("big/count")
    def count(self, state, payload, ctx):
        state["count"] += payload["by"]
        return state


class AsyncBigStore(AsyncStore):
    name = "big"
    handles = ["big/*"]
    initial_state = big_state()
    reconnect = Reconnect(initial_delay=0.02, max_delay=0.2)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.registered = asyncio.Queue()

    def on_registered(self, resumed):
        self.registered.put_nowait((resumed, self.version, self.states_sent, self.patches_sent))

    @on("big/count")
    def count(self, state, payload, ctx):
        state["count"] += payload["by"]
        return state


def test_a_large_state_is_published_in_pieces_again_after_an_ephemeral_restart(fluxd_factory):
    daemon = fluxd_factory("--max-frame", str(MAX_FRAME))
    store = BigStore(socket_path=daemon.socket_path)
    assert len(dumps(store.initial_state)) > 3 * MAX_FRAME
    store.start()
    viewer = Client.connect(daemon.socket_path, "viewer", timeout=20)
    whole = Client.connect(daemon.socket_path, "whole-viewer", timeout=20)
    try:
        assert store.registered.get(timeout=10)[1:] == (1 + store.patches_sent, 1, store.patches_sent)
        assert store.patches_sent > 3 and store.state == BigStore.initial_state
        deltas = viewer.subscribe("big")  # applies the pieces as deltas, or takes the snapshot
        full = whole.subscribe("big", deltas=False)
        for sub in (deltas, full):
            snap = sub.until(lambda s: s.version == store.version, timeout=10)
            assert snap.state == BigStore.initial_state and ordered(snap.state) == dumps(snap.state).decode()

        daemon.restart()  # ephemeral: the new fluxd retains nothing, and the register cannot carry the state
        resumed, version, states, patches = store.registered.get(timeout=20)
        assert (resumed, states) == (False, 2) and version == 1 + patches // 2 and patches > 6
        for sub in (deltas, full):
            snap = sub.until(lambda s: s.version == version, timeout=20)
            assert snap.state == BigStore.initial_state
        settlement = viewer.dispatch_and_settle("big/count", {"by": 3}, timeout=10)
        assert settlement.results[0].status == "done" and settlement.results[0].version == version + 1
        assert deltas.until(lambda s: s.version == version + 1, timeout=10).state["count"] == 3
        assert store.state["count"] == 3 and store.registration.refusals == 0
    finally:
        viewer.close()
        whole.close()
        store.stop()


def test_a_large_state_is_adopted_after_a_durable_restart(fluxd_factory):
    daemon = fluxd_factory("--max-frame", str(MAX_FRAME), durable=True)
    store = BigStore(socket_path=daemon.socket_path)
    store.start()
    viewer = Client.connect(daemon.socket_path, "viewer", timeout=20)
    try:
        _, version, states, patches = store.registered.get(timeout=10)
        assert states == 1 and patches > 3 and version == 1 + patches  # published in pieces the first time
        sub = viewer.subscribe("big", deltas=False)
        assert sub.until(lambda s: s.version == version, timeout=10).state == BigStore.initial_state

        daemon.restart()  # durable: fluxd retains the state; the store registers without it and adopts it
        resumed, again, states_after, patches_after = store.registered.get(timeout=20)
        assert resumed and again == version and (states_after, patches_after) == (states, patches)  # nothing sent
        assert store.state == BigStore.initial_state and store.registrations == 2
        assert viewer.get("big", timeout=10).state == BigStore.initial_state
        settlement = viewer.dispatch_and_settle("big/count", {"by": 5}, timeout=10)
        assert settlement.results[0].status == "done" and settlement.results[0].version == version + 1
        assert sub.until(lambda s: s.version == version + 1, timeout=10).state["count"] == 5
        assert store.registration.refusals == 0
    finally:
        viewer.close()
        store.stop()


def test_an_async_store_publishes_a_large_state_in_pieces_after_an_ephemeral_restart(fluxd_factory):
    daemon = fluxd_factory("--max-frame", str(MAX_FRAME))

    async def scenario():
        from fluxbus import AsyncClient
        store = AsyncBigStore(socket_path=daemon.socket_path)
        await store.start()
        viewer = await AsyncClient.connect(daemon.socket_path, "viewer", timeout=20)
        try:
            _, version, _, _ = await asyncio.wait_for(store.registered.get(), 10)
            sub = await viewer.subscribe("big")
            assert (await sub.until(lambda s: s.version == version, timeout=10)).state == AsyncBigStore.initial_state
            await asyncio.get_running_loop().run_in_executor(None, daemon.restart)
            resumed, again, states, _ = await asyncio.wait_for(store.registered.get(), 20)
            assert not resumed and states == 2
            assert (await sub.until(lambda s: s.version == again, timeout=20)).state == AsyncBigStore.initial_state
            settlement = await viewer.dispatch_and_settle("big/count", {"by": 2}, timeout=10)
            assert settlement.results[0].status == "done" and store.state["count"] == 2
            assert store.registration.refusals == 0
        finally:
            await viewer.close()
            await store.stop()
    asyncio.run(asyncio.wait_for(scenario(), 90))


def test_a_state_that_cannot_be_published_fails_the_start(fluxd_factory):
    daemon = fluxd_factory("--max-frame", str(MAX_FRAME))

    class Text(Store):
        name = "text"
        initial_state = "t" * (MAX_FRAME + 1)
    with pytest.raises(StateTooLargeError, match="single str"):
        Text(socket_path=daemon.socket_path).start()


class Monitor:
    """A raw ``monitor`` connection that keeps fluxd's events with the time they arrived."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.sendall(encode_frame(dumps({"op": "hello", "protocol": 1, "role": "monitor", "name": "watch"})))
        self.events = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        decoder = FrameDecoder()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                for kind, body in decoder.feed(data):
                    if kind == "frame":
                        msg = loads(body)
                        if msg.get("op") == "event":
                            self.events.put((time.monotonic(), msg))
        except OSError:
            pass

    def next(self, predicate, deadline):
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                at, msg = self.events.get(timeout=remaining)
            except queue.Empty:
                return None
            if predicate(msg):
                return at, msg

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(5)
        self.sock.close()


def test_a_refused_registration_is_tried_again_with_a_growing_wait(fluxd_factory, caplog):
    """The store's connection is lost while another connection takes its name: each registration it makes again
    is refused name-taken. It tries a few times in two seconds (not ~40), logging each refusal, and registers as
    soon as the name is free again."""
    caplog.set_level(logging.WARNING, logger="fluxbus")
    daemon = fluxd_factory()
    alias = daemon.socket_path + ".alias"  # the same socket under a second name
    os.link(daemon.socket_path, alias)
    store = BigStore(socket_path=daemon.socket_path)
    store.initial_state = {"count": 0}
    store.start()
    monitor = Monitor(alias)
    rival = None
    try:
        assert store.registered.get(timeout=10)
        os.unlink(daemon.socket_path)  # the store cannot reconnect until the name is back
        store.client.drop_connection("test: connection lost")
        rival = Client.connect(alias, "rival", role="store", timeout=10, reconnect=False)
        deadline = time.monotonic() + 10
        while True:  # fluxd takes the lost connection's store down, then the name is free
            try:
                rival.register("big", [])
                break
            except NameTakenError:
                assert time.monotonic() < deadline, "fluxd never freed the name"
                rival.ping(5)
        os.link(alias, daemon.socket_path)

        def refused(msg):
            return msg.get("kind") == "error" and msg.get("code") == "name-taken"
        first = monitor.next(refused, time.monotonic() + 20)
        assert first is not None, "the store did not register again"
        window_end = first[0] + 2.0
        count = 1
        while monitor.next(refused, window_end) is not None:
            count += 1
        assert 2 <= count <= 7, f"{count} registrations refused in 2 s"
        assert store.registration.refusals >= count
        logged = [r for r in caplog.records if "registration refused (name-taken" in r.getMessage()]
        assert len(logged) >= count and "registering again in" in logged[0].getMessage()

        rival.close()  # the name is free: the next try succeeds and the backoff starts over
        up = monitor.next(lambda m: m.get("kind") == "store-up" and m.get("store") == "big", time.monotonic() + 40)
        assert up is not None, "the store did not register once the name was free"
        assert store.registered.get(timeout=10)
        assert store.registration.refusals == 0
    finally:
        if rival is not None:
            rival.close()
        monitor.close()
        store.stop()
        if os.path.exists(alias):
            os.unlink(alias)


# -- scripted with the fake fluxd -------------------------------------------------------------------------------

class Small(Store):
    name = "s"
    handles = ["s/*"]
    initial_state = {f"k{i:03d}": "v" * 100 for i in range(60)}
    reconnect = Reconnect(initial_delay=0.01, max_delay=0.05)

    @on("s/touch")
    def touch(self, state, payload, ctx):
        return {**state, "touched": ctx.seq}


@pytest.fixture
def small_fake():
    server = FakeFluxd(limits={"maxFrame": 2048, "storeWindow": 64, "queueLimit": 1024, "queueTimeout": 5000,
                               "handshakeTimeout": 5000, "maxPending": 65536, "deltaHistory": 1048576},
                       welcome_extra={"epoch": "e1"})
    yield server
    server.close()


def registered(peer, version, state=None, seq=0, resumed=False):
    peer.send({"op": "registered", "store": "s", "version": version, "seq": seq, "resumed": resumed})
    if version:
        peer.send({"op": "snapshot", "store": "s", "version": version, "seq": seq, "state": state})
    peer.send({"op": "queries", "store": "s", "queries": []})


def test_actions_wait_until_every_piece_is_sent(small_fake):
    store = Small(socket_path=small_fake.socket_path)
    thread = threading.Thread(target=store.run, daemon=True)
    thread.start()
    try:
        peer = small_fake.accept()
        register = peer.expect_op("register")
        assert "state" not in register  # 6 KB: does not fit in 2048
        registered(peer, 0)
        peer.send({"op": "action", "store": "s", "seq": 1, "type": "s/touch", "origin": 2, "payload": None})
        sent = []
        while not sent or sent[-1]["op"] != "done":
            sent.append(peer.expect(lambda m: m.get("op") in ("state", "patch", "ping", "done")))
        ops = [m["op"] for m in sent]
        assert ops[0] == "state" and sent[0]["state"] == {} and ops[-2:] == ["ping", "done"]
        patches = sent[1:-2]
        assert patches and all(m["op"] == "patch" for m in patches)
        assert [m["base"] for m in patches] == list(range(1, len(patches) + 1))
        state = {}
        for m in patches:
            state = apply(state, m["patch"])
        assert state == Small.initial_state
        assert sent[-1]["base"] == len(patches) + 1
        assert sent[-1]["patch"] == [{"op": "add", "path": "/touched", "value": 1}]
        assert store.registration.refusals == 0
    finally:
        store.stop()
        thread.join(10)


def test_a_publication_cut_short_goes_on_after_reconnecting(small_fake):
    """The connection is lost after two pieces: fluxd retains what they made; registering again, the store
    sends the rest from there instead of adopting a partial state."""
    store = Small(socket_path=small_fake.socket_path)
    thread = threading.Thread(target=store.run, daemon=True)
    thread.start()
    try:
        peer = small_fake.accept()
        peer.expect_op("register")
        small_fake.auto_pong = False  # the barrier after the pieces gets no answer on this connection
        registered(peer, 0)
        assert peer.expect_op("state")["state"] == {}
        first = peer.expect_op("patch")
        peer.expect_op("patch")
        partial = apply({}, first["patch"])
        peer.expect_op("ping")
        peer.hang_up()  # fluxd took the root and the first patch only: version 2
        small_fake.auto_pong = True
        again = small_fake.accept()
        assert again.expect_op("register")
        registered(again, 2, partial, resumed=True)
        rest = []
        while True:
            msg = again.expect(lambda m: m.get("op") in ("state", "patch", "ping"))
            if msg["op"] == "ping":
                break
            rest.append(msg)
        assert rest and all(m["op"] == "patch" for m in rest)
        assert rest[0]["base"] == 2 and rest[0]["patch"] != first["patch"]
        state = partial
        for m in rest:
            state = apply(state, m["patch"])
        assert state == Small.initial_state and store.state == Small.initial_state
        assert store.version == 2 + len(rest)
    finally:
        store.stop()
        thread.join(10)


def test_refused_registrations_back_off_counted_by_the_fake(small_fake):
    """Every registration after the first is refused (name-taken, then too-large fatal): the store connects
    again a few times in two seconds, not in a tight loop."""
    store = Small(socket_path=small_fake.socket_path)
    store.initial_state = {"small": True}
    thread = threading.Thread(target=store.run, daemon=True)
    thread.start()
    try:
        peer = small_fake.accept()
        peer.expect_op("register")
        registered(peer, 1, {"small": True})
        assert store.ready.wait(10)  # the store is running... then its connection is lost
        peer.hang_up()
        start = time.monotonic()
        attempts = 0
        while True:
            try:
                again = small_fake.peers.get(timeout=max(0.001, start + 2.0 - time.monotonic()))
            except queue.Empty:
                break
            if time.monotonic() > start + 2.0:
                break
            attempts += 1
            again.expect_op("register")
            if attempts % 2:
                again.send({"op": "error", "code": "name-taken", "message": "s is registered", "ref": "s",
                            "fatal": False})
            else:
                again.send({"op": "error", "code": "too-large", "message": "frame too large", "fatal": True})
                again.hang_up()
        assert 2 <= attempts <= 7, f"{attempts} registrations in 2 s"
        assert store.registration.refusals >= attempts
    finally:
        store.stop()
        thread.join(10)
