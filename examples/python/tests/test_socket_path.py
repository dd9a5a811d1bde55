"""The default socket path rule, checked against every case of protocol/vectors/socket-path.json."""
import json
import os

import pytest

from conftest import VECTORS
from fluxbus import default_socket_path


def load_cases():
    with open(os.path.join(VECTORS, "socket-path.json"), encoding="utf-8") as f:
        data = json.load(f)
    cases = data["cases"] if isinstance(data, dict) else data  # a top-level array, or {"cases": [...]}
    assert isinstance(cases, list) and cases
    return cases


CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_socket_path_vector(case):
    assert default_socket_path(env=case["env"], uid=case["uid"]) == case["path"]


def test_default_uses_the_process_environment(monkeypatch):
    for name in ("FLUXBUS_SOCKET", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", "/var/tmp")
    assert default_socket_path() == f"/var/tmp/fluxbus-{os.getuid()}/fluxd.sock"
    monkeypatch.setenv("FLUXBUS_SOCKET", "/x/y.sock")
    assert default_socket_path() == "/x/y.sock"
