"""A small raw FluxBus protocol client and a fluxd process handle, for the durability tests.

Nothing here depends on the repository's SDKs: frames are a 4-byte big-endian length and a JSON object
(protocol/SPEC.md §3). `Conn` reads frames with deadlines; `Fluxd` starts, kills and stops one fluxd on a socket
and a data directory and waits for its ready line (or its exit) with deadlines.
"""

import json
import os
import select
import signal
import socket
import struct
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ConnectionClosed(Exception):
    """The peer closed the connection (or it broke)."""


class Timeout(AssertionError):
    """Nothing matching arrived before the deadline."""


def encode(message: Dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


class Conn:
    """One connection to fluxd: `send` a message, `recv` the next frame, `expect` a frame matching a predicate
    (frames read on the way are kept, in order, for later `recv`s)."""

    def __init__(self, path: str, timeout: float = 5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.buffer = bytearray()
        self.kept: List[Dict[str, Any]] = []
        self.closed = False
        self.welcome: Dict[str, Any] = {}

    def send(self, message: Dict[str, Any]) -> None:
        self.send_bytes(encode(message))

    def send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10
        while view:
            try:
                n = self.sock.send(view)
                view = view[n:]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout("fluxd did not read what was sent within 10 s")
                select.select([], [self.sock], [], remaining)
            except OSError as e:
                self.closed = True
                raise ConnectionClosed(str(e)) from e

    def _frame_from_buffer(self) -> Optional[Dict[str, Any]]:
        if len(self.buffer) < 4:
            return None
        (n,) = struct.unpack(">I", self.buffer[:4])
        if len(self.buffer) < 4 + n:
            return None
        body = bytes(self.buffer[4:4 + n])
        del self.buffer[:4 + n]
        return json.loads(body)

    def recv(self, timeout: float) -> Optional[Dict[str, Any]]:
        """The next frame, or None if none arrived within `timeout` seconds; ConnectionClosed at the end."""
        if self.kept:
            return self.kept.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            frame = self._frame_from_buffer()
            if frame is not None:
                return frame
            if self.closed:
                raise ConnectionClosed("closed")
            remaining = max(0.0, deadline - time.monotonic())
            ready = select.select([self.sock], [], [], remaining)[0]
            if not ready:
                return None
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                frame = self._frame_from_buffer()
                if frame is not None:
                    return frame
                raise ConnectionClosed("fluxd closed the connection")
            self.buffer += chunk

    def expect(self, predicate: Callable[[Dict[str, Any]], bool], timeout: float = 10.0,
               what: str = "a frame") -> Dict[str, Any]:
        """Reads until a frame matches `predicate` (within `timeout` s); the others are kept for `recv`."""
        for i, frame in enumerate(self.kept):
            if predicate(frame):
                return self.kept.pop(i)
        deadline = time.monotonic() + timeout
        passed: List[Dict[str, Any]] = []
        kept, self.kept = self.kept, []
        try:
            while True:
                remaining = deadline - time.monotonic()
                frame = self.recv(max(0.0, remaining))
                if frame is None:
                    raise Timeout(f"no {what} within {timeout} s; got {passed[-5:]}")
                if predicate(frame):
                    return frame
                passed.append(frame)
        finally:
            self.kept = kept + passed + self.kept

    def hello(self, role: str, name: str = "", session: Optional[str] = None, timeout: float = 10.0) -> Dict[str, Any]:
        message: Dict[str, Any] = {"op": "hello", "protocol": 1, "role": role, "name": name}
        if session is not None:
            message["session"] = session
        self.send(message)
        frame = self.expect(lambda f: f.get("op") in ("welcome", "error"), timeout, "welcome")
        if frame["op"] != "welcome":
            raise AssertionError(f"hello refused: {frame}")
        self.welcome = frame
        return frame

    def request(self, message: Dict[str, Any], reply_op: str, timeout: float = 10.0) -> Dict[str, Any]:
        """Sends a request carrying a fresh id and returns the reply with that id (or the error about it)."""
        message = dict(message)
        message.setdefault("id", f"r{time.monotonic_ns()}")
        rid = message["id"]
        self.send(message)
        return self.expect(lambda f: f.get("id") == rid and f.get("op") in (reply_op, "error")
                           or (f.get("op") == "error" and f.get("ref") == rid), timeout, f"{reply_op} {rid}")

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def connect(path: str, role: str, name: str = "", session: Optional[str] = None) -> Conn:
    conn = Conn(path)
    try:
        conn.hello(role, name, session)
    except BaseException:
        conn.close()
        raise
    return conn


def fluxd_executable(wait: float = 120.0) -> str:
    """$FLUXD, else the repository's .build/debug/fluxd. While it is missing (a rebuild in progress) this waits
    for it, up to `wait` s."""
    path = os.environ.get("FLUXD") or os.path.join(REPO, ".build", "debug", "fluxd")
    deadline = time.monotonic() + wait
    while not os.access(path, os.X_OK):
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"fluxd not found at {path} (build it or set FLUXD)")
        time.sleep(0.5)  # a retry while the file is absent, not a synchronisation
    return path


class FluxdStartFailed(AssertionError):
    def __init__(self, returncode: Optional[int], stderr: str):
        super().__init__(f"fluxd exited ({returncode}) before it was ready:\n{stderr}")
        self.returncode = returncode
        self.stderr = stderr


class Fluxd:
    """fluxd on `socket_path` with `data_dir` (None: --ephemeral). Each `start` appends its stderr to a log file
    of its own (`stderr_path`), read back with `stderr()` (this run's part only)."""

    def __init__(self, socket_path: str, data_dir: Optional[str], log_dir: str, args: Optional[List[str]] = None,
                 wrapper: Optional[List[str]] = None):
        self.socket_path = socket_path
        self.data_dir = data_dir
        self.args = list(args or [])
        self.wrapper = list(wrapper or [])
        self.log_dir = log_dir
        self.process: Optional[subprocess.Popen] = None
        self.runs = 0
        self.stderr_path = ""

    def command(self, extra: Optional[List[str]] = None) -> List[str]:
        cmd = [*self.wrapper, fluxd_executable(), "--socket", self.socket_path]
        cmd += ["--data-dir", self.data_dir] if self.data_dir is not None else ["--ephemeral"]
        return cmd + self.args + list(extra or [])

    def launch(self, extra: Optional[List[str]] = None) -> subprocess.Popen:
        assert self.process is None or self.process.poll() is not None, "fluxd is already running"
        self.runs += 1
        self.stderr_path = os.path.join(self.log_dir, f"fluxd-{self.runs}.log")
        deadline = time.monotonic() + 60
        while True:
            try:
                with open(self.stderr_path, "wb") as err:
                    self.process = subprocess.Popen(self.command(extra), stdout=subprocess.PIPE, stderr=err,
                                                    stdin=subprocess.DEVNULL, start_new_session=True)
                return self.process
            except OSError:
                # The executable is being rebuilt (missing, or "text file busy" while it is written): try again.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start(self, extra: Optional[List[str]] = None, timeout: float = 30.0) -> "Fluxd":
        """Starts fluxd and waits for "fluxd ready on <path>"; FluxdStartFailed if it exits first."""
        process = self.launch(extra)
        assert process.stdout is not None
        fd = process.stdout.fileno()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.kill()
                raise AssertionError(f"fluxd printed no ready line within {timeout} s:\n{self.stderr()}")
            chunk = os.read(fd, 1)
            if not chunk:
                rc = process.wait(timeout=10)
                raise FluxdStartFailed(rc, self.stderr())
            line += chunk
        assert line.startswith(b"fluxd ready on "), line
        return self

    def run_expecting_exit(self, extra: Optional[List[str]] = None, timeout: float = 30.0):
        """Starts fluxd expecting it to refuse: returns (exit status, stderr); fails if it gets ready instead."""
        try:
            self.start(extra, timeout)
        except FluxdStartFailed as e:
            self.process = None
            return e.returncode, e.stderr
        self.stop()
        raise AssertionError(f"fluxd started where it should have refused:\n{self.stderr()}")

    def stderr(self) -> str:
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, then waits for the process to be gone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._close_pipe()

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        """SIGTERM (a clean stop), SIGKILL if it has not exited within `timeout` s. Returns the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._close_pipe()
        return self.process.returncode

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
            self.process.stdout = None


def wait_until(condition: Callable[[], bool], timeout: float, what: str, cv=None) -> None:
    """Waits until `condition()` holds, on `cv` (a threading.Condition whose lock the caller does not hold) when
    given, else by polling the condition every 10 ms; AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    if cv is not None:
        with cv:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
                cv.wait(remaining)
        return
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
