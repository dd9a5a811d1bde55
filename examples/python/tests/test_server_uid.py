"""The server uid check: SO_PEERCRED before hello, refused with a clear error when fluxd runs as another uid."""
import asyncio
import os

import pytest

from fakefluxd import FakeFluxd
from fluxbus import AsyncClient, Client, FluxError
from fluxbus.wire import expected_server_uid

OTHER = os.getuid() + 1000


def test_expected_uid_rule(monkeypatch):
    assert expected_server_uid(5, env={"FLUXBUS_SERVER_UID": "7"}, euid=0) == 5
    assert expected_server_uid(None, env={"FLUXBUS_SERVER_UID": "7"}, euid=1000) == 7
    assert expected_server_uid(None, env={"FLUXBUS_SERVER_UID": ""}, euid=0) == 0
    assert expected_server_uid(None, env={}, euid=0) == 0
    assert expected_server_uid(None, env={}, euid=1000) is None
    with pytest.raises(ValueError, match="FLUXBUS_SERVER_UID"):
        expected_server_uid(None, env={"FLUXBUS_SERVER_UID": "root"}, euid=1000)


def refused_message(path, expected):
    return (f"fluxd at {path} is run by uid {os.getuid()}, expected {expected}; "
            f"set FLUXBUS_SERVER_UID={os.getuid()} to accept")


@pytest.mark.parametrize("how", ["env", "parameter"])
def test_sync_client_refuses_another_uid(fluxd, monkeypatch, how):
    kwargs = {}
    if how == "env":
        monkeypatch.setenv("FLUXBUS_SERVER_UID", str(OTHER))
    else:
        kwargs["expected_server_uid"] = OTHER
    with pytest.raises(FluxError) as caught:
        Client.connect(fluxd.socket_path, timeout=5, **kwargs)
    assert caught.value.code == "wrong-server-uid"
    assert caught.value.message == refused_message(fluxd.socket_path, OTHER)
    monkeypatch.setenv("FLUXBUS_SERVER_UID", str(os.getuid()))
    with Client.connect(fluxd.socket_path, timeout=5) as client:
        info = client.info()
        # the refused attempt never said hello: fluxd saw only this client
        assert info["peers"]["client"] == 1


def test_hello_is_not_sent_to_a_refused_server(monkeypatch):
    fake = FakeFluxd()
    try:
        monkeypatch.setenv("FLUXBUS_SERVER_UID", str(OTHER))
        with pytest.raises(FluxError) as caught:
            Client.connect(fake.socket_path, timeout=5)
        assert caught.value.message == refused_message(fake.socket_path, OTHER)
        peer = fake.peers.get(timeout=5)
        peer.wait_closed()
        assert peer.hello is None and peer.messages.get(timeout=5) is None  # closed without a frame
        monkeypatch.setenv("FLUXBUS_SERVER_UID", str(os.getuid()))
        with Client.connect(fake.socket_path, timeout=5):
            pass
    finally:
        fake.close()


def test_async_client_refuses_another_uid(fluxd, monkeypatch):
    async def scenario():
        monkeypatch.setenv("FLUXBUS_SERVER_UID", str(OTHER))
        with pytest.raises(FluxError) as caught:
            await AsyncClient.connect(fluxd.socket_path, timeout=5)
        assert caught.value.message == refused_message(fluxd.socket_path, OTHER)
        monkeypatch.setenv("FLUXBUS_SERVER_UID", str(os.getuid()))
        async with await AsyncClient.connect(fluxd.socket_path, timeout=5) as client:
            assert await client.ping() >= 0
    asyncio.run(asyncio.wait_for(scenario(), 30))
