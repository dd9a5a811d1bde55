"""The exception hierarchy in use: errors from a real fluxd arrive as their code's class, a store's rejection as
ActionRejectedError, connect failures as FluxConnectionError naming the path and what to do."""
import asyncio
import os
import socket
import tempfile

import pytest

from fluxbus import (ActionRejectedError, AsyncClient, Client, Disconnected, FluxConnectionError, FluxError,
                     FluxTimeoutError, NameTakenError, NoHandlerError, Reject, Store, StoreUnavailableError,
                     UnknownOpError, UnknownStoreError, on)
from fluxbus.wire import Settlement


class Strict(Store):
    name = "strict"
    handles = ["strict/*"]
    initial_state = {"n": 0}

    @on("strict/bump")
    def bump(self, state, payload, ctx):
        if payload.get("by", 1) <= 0:
            raise Reject("strict/bad-step", "the step must be positive", field="by")
        return {"n": state["n"] + payload.get("by", 1)}


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_hierarchy():
    assert issubclass(FluxTimeoutError, TimeoutError) and issubclass(FluxTimeoutError, FluxError)
    assert issubclass(Disconnected, FluxConnectionError) and issubclass(FluxConnectionError, FluxError)
    assert issubclass(NoHandlerError, FluxError) and issubclass(ActionRejectedError, FluxError)
    error = NoHandlerError("no store handles x/y", ref="d-1")
    assert (error.code, error.message, error.fatal, error.ref) == ("no-handler", "no store handles x/y", False, "d-1")
    assert str(error) == "no-handler: no store handles x/y"
    with pytest.raises(TimeoutError):  # plain `except TimeoutError` catches the library's timeouts
        raise FluxTimeoutError("timed out after 1 s waiting")


def test_settlement_raise_for_status():
    settled = Settlement.from_frame({"op": "settled", "id": "c-1", "seq": 42, "results": [
        {"store": "a", "status": "done", "version": 3},
        {"store": "b", "status": "rejected", "error": {"code": "b/full", "message": "no room", "limit": 3}},
        {"store": "c", "status": "unavailable", "error": {"code": "store-unavailable", "message": "down 5000 ms"}}]})
    with pytest.raises(ActionRejectedError) as caught:
        settled.raise_for_status()
    error = caught.value
    assert (error.store, error.code, error.message, error.seq) == ("b", "b/full", "no room", 42)
    assert error.details == {"limit": 3} and not error.fatal
    assert "store 'b' rejected the action: b/full: no room" == str(error)
    unavailable = settled["c"].exception()
    assert isinstance(unavailable, StoreUnavailableError) and unavailable.store == "c"
    ok = Settlement.from_frame({"op": "settled", "id": "c-2", "seq": 43, "results": [
        {"store": "a", "status": "done", "version": 4}]})
    assert ok.raise_for_status() is ok


def test_live_errors_have_their_classes(fluxd):
    store = Strict(socket_path=fluxd.socket_path)
    thread = store.start()
    try:
        with Client.connect(fluxd.socket_path) as client:
            with pytest.raises(NoHandlerError) as caught:
                client.dispatch_and_settle("nobody/handles", timeout=10)
            assert caught.value.ref is not None and not caught.value.fatal
            with pytest.raises(UnknownStoreError):
                client.get("nothing")
            client.send_raw(b'{"op":"teleport"}')
            client.ping()
            assert isinstance(client.errors[-1], UnknownOpError)
            with pytest.raises(NameTakenError):
                Strict(socket_path=fluxd.socket_path).connect()
            settled = client.dispatch_and_settle("strict/bump", {"by": -1}, timeout=10)
            with pytest.raises(ActionRejectedError) as rejected:
                settled.raise_for_status()
            assert rejected.value.code == "strict/bad-step" and rejected.value.details == {"field": "by"}
            assert client.dispatch_and_settle("strict/bump", {"by": 2}, timeout=10).raise_for_status().ok
            assert client.info()["peers"]["store"] == 1  # the refused second store did not stay connected
    finally:
        store.stop()
        thread.join(10)


def test_live_errors_have_their_classes_async(fluxd):
    async def scenario():
        async with await AsyncClient.connect(fluxd.socket_path) as client:
            with pytest.raises(NoHandlerError):
                await client.dispatch_and_settle("nobody/handles")
            with pytest.raises(UnknownStoreError):
                await client.get("nothing")
    run(scenario())


# -- connect errors ------------------------------------------------------------------------------------------------

@pytest.fixture
def scratch():
    directory = tempfile.mkdtemp(prefix="fluxpy-connect-")
    yield directory
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def hint(path):
    return (f"  start one with:  fluxd --socket {path}\n"
            f"  or point the client at a running one with socket_path=PATH or FLUXBUS_SOCKET=PATH")


def connect_both(path=None):
    """The errors Client.connect and AsyncClient.connect raise (both must raise)."""
    found = []
    with pytest.raises(FluxConnectionError) as caught:
        Client.connect(path, timeout=5)
    found.append(caught.value)

    async def scenario():
        with pytest.raises(FluxConnectionError) as caught:
            await AsyncClient.connect(path, timeout=5)
        found.append(caught.value)
    run(scenario())
    return found


def test_no_such_socket_names_the_path_its_source_and_what_to_do(scratch, monkeypatch):
    path = os.path.join(scratch, "none.sock")
    monkeypatch.setenv("FLUXBUS_SOCKET", path)
    for error in connect_both():
        assert str(error) == f"no fluxd at {path} (from $FLUXBUS_SOCKET): no such socket\n" + hint(path)
        assert (error.code, error.path, error.source) == ("no-fluxd", path, "$FLUXBUS_SOCKET")
        assert not isinstance(error, OSError)
    for error in connect_both(path):
        assert str(error).startswith(f"no fluxd at {path} (from socket_path): no such socket\n")


def test_socket_with_nobody_listening(scratch):
    path = os.path.join(scratch, "dead.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.close()  # the file stays, nobody listens
    for error in connect_both(path):
        assert str(error) == (f"no fluxd at {path} (from socket_path): the socket exists but no fluxd is listening "
                              f"on it\n" + hint(path))


def test_directory_and_file_are_not_sockets(scratch):
    for error in connect_both(scratch):
        assert str(error) == (f"no fluxd at {scratch} (from socket_path): it is a directory, not a socket\n"
                              + hint(os.path.join(scratch, "fluxd.sock")))
    plain = os.path.join(scratch, "plain.txt")
    open(plain, "w").close()
    for error in connect_both(plain):
        assert str(error).startswith(f"no fluxd at {plain} (from socket_path): it is a file, not a socket\n")
    for error in connect_both(os.path.join(plain, "fluxd.sock")):
        assert "a part of the path is not a directory" in str(error)


def test_path_too_long():
    path = "/tmp/" + "x" * 200 + "/fluxd.sock"
    for error in connect_both(path):
        assert "the path is too long for a Unix socket" in str(error) and error.path == path


def test_default_path_is_named(scratch, monkeypatch):
    monkeypatch.delenv("FLUXBUS_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", scratch)
    path = os.path.join(scratch, "fluxbus", "fluxd.sock")
    for error in connect_both():
        assert str(error).startswith(f"no fluxd at {path} (from $XDG_RUNTIME_DIR): no such socket\n")


def test_lost_dispatch_errors():
    """NotSentError (the dispatch never reached fluxd: dispatch it again) and OutcomeUnknownError (it may or may
    not have been applied) are connection errors that leave the client running."""
    from fluxbus import NotSent, NotSentError, OutcomeUnknownError
    assert NotSent is NotSentError
    for cls, code in ((NotSentError, "not-sent"), (OutcomeUnknownError, "outcome-unknown")):
        error = cls("dispatch d-3 was not sent", ref="d-3")
        assert isinstance(error, FluxConnectionError) and not isinstance(error, Disconnected)
        assert (error.code, error.ref, error.fatal) == (code, "d-3", False)
        assert str(error) == f"{code}: dispatch d-3 was not sent"
    assert Disconnected("x", bye_reason="restart").bye_reason == "restart" and Disconnected("y").bye_reason is None


def test_welcome_epoch_and_durability():
    from fluxbus import Welcome
    old = Welcome.from_frame({"op": "welcome", "protocol": 1, "server": "fluxd/0.2.0", "peer": 3, "limits": {}})
    assert (old.peer, old.epoch, old.durability) == (3, None, None)
    new = Welcome.from_frame({"op": "welcome", "protocol": 1, "server": "fluxd/0.3.0", "peer": 4, "limits": {},
                              "epoch": "e-1", "durability": "batch"})
    assert (new.epoch, new.durability) == ("e-1", "batch")
