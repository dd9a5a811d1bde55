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


def fluxd_executable():
    return os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")


_HELP = {}


def fluxd_supports(option):
    """Whether ``fluxd --help`` lists ``option`` (e.g. ``--ephemeral``, ``--data-dir``)."""
    executable = fluxd_executable()
    if executable not in _HELP:
        try:
            _HELP[executable] = subprocess.run([executable, "--help"], capture_output=True, text=True,
                                               timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            _HELP[executable] = ""
    return option in _HELP[executable]


class FluxdProcess:
    """fluxd on a socket in a temp directory; ``stop()`` ends it and removes the directory.

    Ephemeral unless ``durable``: then its journal is in ``data_dir``, inside the temp directory too, so nothing
    is written elsewhere. ``restart()`` (SIGTERM) and ``kill()`` + ``start()`` (a crash) keep the socket path
    and the data directory."""

    def __init__(self, *arguments: str, durable: bool = False):
        self.executable = fluxd_executable()
        if not os.access(self.executable, os.X_OK):
            pytest.fail(f"fluxd not found at {self.executable}: build it or set FLUXD")
        if durable and not fluxd_supports("--data-dir"):
            pytest.skip("this fluxd has no --data-dir (no durable fluxd yet)")
        self.directory = tempfile.mkdtemp(prefix="fluxpy-")
        self.socket_path = os.path.join(self.directory, "fluxd.sock")
        self.data_dir = os.path.join(self.directory, "data")
        self.durable = durable
        storage = []
        if durable:
            storage = ["--data-dir", self.data_dir]
        elif fluxd_supports("--ephemeral"):
            storage = ["--ephemeral"]  # a durable fluxd would keep a journal outside the temp directory
        self.arguments = [*storage, *arguments]
        self.stderr = open(os.path.join(self.directory, "stderr.log"), "ab")
        self.process = None
        try:
            self.start()
        except BaseException:  # e.g. the binary is being rebuilt (ETXTBSY): leave no directory behind
            self.stop()
            raise

    def start(self):
        """Starts fluxd (again) and waits for its ready line."""
        assert self.process is None or self.process.poll() is not None
        if self.process is not None:
            self.process.stdout.close()
            self.process = None
        self.process = subprocess.Popen([self.executable, "--socket", self.socket_path, *self.arguments],
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

    def terminate(self, timeout=10):
        """SIGTERM (fluxd drains, says bye and exits), then waits; SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self):
        """SIGKILL: fluxd crashes (no bye; a durable fluxd recovers from its journal on the next start)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self):
        """Stops fluxd cleanly and starts it again on the same socket (and data directory)."""
        self.terminate()
        self.start()

    def stop(self):
        self.terminate()
        if self.process is not None:
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

    def start(*arguments, durable=False):
        daemon = FluxdProcess(*arguments, durable=durable)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
