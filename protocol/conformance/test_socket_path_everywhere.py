"""One default socket path everywhere (protocol/vectors/socket-path.json): fluxd started without --socket, and then
fluxctl (the Swift FluxClient), the Python client and the Node client started without a path, all under the same
environment, must meet. Run with XDG_RUNTIME_DIR set, with only TMPDIR set, and with neither (plain /tmp).

The test does not compute the path itself (that would re-implement the rule it checks): fluxd says where it
listens, the clients must find it there, and the path must lie in the directory the environment names."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLUXD = os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
FLUXCTL = os.environ.get("FLUXCTL") or os.path.join(os.path.dirname(FLUXD), "fluxctl")
DEADLINE = 20.0

PYTHON_CLIENT = (
    "import sys; sys.path.insert(0, sys.argv[1]);"
    "from fluxbus import Client\n"
    "with Client.connect(timeout=10) as c: c.ping(); print('python ok')"
)
NODE_CLIENT = (
    "const m = await import(process.argv[1]);"
    "const c = await m.Client.connect({ timeout: 10000 });"
    "await c.ping(); console.log('node ok'); c.close();"
)


def environment(kind: str, base: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLUXBUS_SOCKET", "XDG_RUNTIME_DIR", "TMPDIR")}
    if kind == "xdg":
        os.makedirs(os.path.join(base, "run"), mode=0o700)
        env["XDG_RUNTIME_DIR"] = os.path.join(base, "run")
        env["TMPDIR"] = os.path.join(base, "tmp")  # set too: XDG_RUNTIME_DIR wins
    elif kind == "tmpdir":
        os.makedirs(os.path.join(base, "tmp"))
        env["TMPDIR"] = os.path.join(base, "tmp")
    return env


def expected_directory(kind: str, base: str) -> str:
    return {"xdg": os.path.join(base, "run"), "tmpdir": os.path.join(base, "tmp"), "plain": "/tmp"}[kind]


def listening_path(proc: subprocess.Popen, log_path: str) -> str:
    """The socket path fluxd logs when it listens (its `listening` line has path=...)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with open(log_path) as f:
            for line in f:
                if "listening" in line and "path=" in line:
                    return line.split("path=", 1)[1].split()[0]
        time.sleep(0.02)  # polling a log file for its line, with a deadline
    with open(log_path) as f:
        pytest.fail(f"fluxd did not report listening within {DEADLINE} s:\n{f.read()}")


@pytest.mark.parametrize("kind", ["xdg", "tmpdir", "plain"])
def test_every_implementation_finds_fluxd_at_the_default_path(kind):
    if not os.path.exists(FLUXD) or not os.path.exists(FLUXCTL):
        pytest.fail(f"fluxd/fluxctl not built at {FLUXD}, {FLUXCTL}")
    if not shutil.which("node"):
        pytest.fail("node is not installed")
    base = tempfile.mkdtemp(prefix="fluxbus-path-")
    env = environment(kind, base)
    plain_folder = f"/tmp/fluxbus-{os.getuid()}"
    plain_folder_existed = os.path.exists(plain_folder)
    if kind == "plain" and os.path.exists(os.path.join(plain_folder, "fluxd.sock")):
        pytest.skip(f"{plain_folder}/fluxd.sock exists: another fluxd may be using the plain default")
    log_path = os.path.join(base, "fluxd.log")
    with open(log_path, "w") as log:
        fluxd = subprocess.Popen([FLUXD, "--ephemeral"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        path = listening_path(fluxd, log_path)
        assert os.path.dirname(os.path.dirname(path)) == expected_directory(kind, base), \
            f"fluxd listens at {path}, not in a folder of {expected_directory(kind, base)}"
        runs = {
            "fluxctl (Swift FluxClient)": [FLUXCTL, "ping", "--count", "1"],
            "Python client": [sys.executable, "-c", PYTHON_CLIENT, os.path.join(REPO, "examples", "python")],
            "Node client": ["node", "--input-type=module", "-e", NODE_CLIENT,
                            os.path.join(REPO, "examples", "node", "fluxbus.mjs")],
        }
        for label, argv in runs.items():
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=DEADLINE)
            assert done.returncode == 0, f"{label} did not reach fluxd at {path} ({kind}):\n{done.stdout}{done.stderr}"
    finally:
        fluxd.terminate()
        try:
            fluxd.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            fluxd.kill()
            fluxd.wait()
        shutil.rmtree(base, ignore_errors=True)
        if kind == "plain" and not plain_folder_existed:
            shutil.rmtree(plain_folder, ignore_errors=True)
