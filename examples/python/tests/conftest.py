"""Fixtures: a real fluxd on a private socket (``$FLUXD`` or ``.build/debug/fluxd``) per test."""
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PACKAGE_ROOT))
sys.path.insert(0, PACKAGE_ROOT)
VECTORS = os.path.join(REPO, "protocol", "vectors")


class FluxdProcess:
    """fluxd on a socket in a temp directory; ``stop()`` ends it and removes the directory."""

    def __init__(self, *arguments: str):
        executable = os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
        if not os.access(executable, os.X_OK):
            pytest.fail(f"fluxd not found at {executable}: build it or set FLUXD")
        self.directory = tempfile.mkdtemp(prefix="fluxpy-")
        self.socket_path = os.path.join(self.directory, "fluxd.sock")
        self.stderr = open(os.path.join(self.directory, "stderr.log"), "wb")
        self.process = subprocess.Popen([executable, "--socket", self.socket_path, *arguments],
                                        stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL)
        fd = self.process.stdout.fileno()
        line = b""
        deadline = time.monotonic() + 20
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.stop()
                pytest.fail("fluxd did not become ready")
            chunk = os.read(fd, 1)
            if not chunk:
                self.stop()
                pytest.fail("fluxd exited before it was ready")
            line += chunk

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.stderr.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def fluxd():
    daemon = FluxdProcess()
    yield daemon
    daemon.stop()


@pytest.fixture
def fluxd_factory():
    started = []

    def start(*arguments):
        daemon = FluxdProcess(*arguments)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
