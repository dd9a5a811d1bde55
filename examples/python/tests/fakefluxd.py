"""A fake fluxd for unit tests: a Unix socket server speaking protocol-1 frames, driven by the test.

Each accepted connection is a :class:`FakePeer`; a thread per connection reads its frames into a queue. The fake
answers ``hello`` itself (``welcome`` with the limits given, or the ``refuse`` error; ``refuse_at_connect``
sends that error and closes as soon as a connection is accepted, before any hello) and, if ``auto_pong``, the
client's own ``ping`` requests; everything else the test reads with :meth:`FakePeer.expect` and answers with
:meth:`FakePeer.send`. ``close()`` ends every connection and removes the socket and its directory.

For reconnection tests: ``welcome_extra`` (e.g. ``{"epoch": "e1"}``) goes into every ``welcome`` and may be
changed between connections; while ``hold`` is an unset :class:`threading.Event`, new connections get no
``welcome`` (the client stays in its handshake); :meth:`FakePeer.hang_up` ends a connection as fluxd does
(whatever was sent is still read, then end of stream).
"""
import json
import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time

LIMITS = {"maxFrame": 1048576, "storeWindow": 64, "queueLimit": 1024, "queueTimeout": 5000,
          "handshakeTimeout": 5000, "maxPending": 65536, "maxBacklog": 67108864,
          "pingInterval": 50, "maxPingsOut": 2}


def frame(msg):
    body = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


class FakePeer:
    def __init__(self, fake, sock):
        self.fake = fake
        self.sock = sock
        self.messages = queue.Queue()
        self.hello = None
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def send(self, msg):
        with self._lock:
            self.sock.sendall(frame(msg))

    def expect(self, predicate=lambda m: True, timeout=5.0, what="a message"):
        """The next message (skipping others) that satisfies ``predicate``; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"fake fluxd: timed out waiting for {what}")
            try:
                msg = self.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                raise AssertionError(f"fake fluxd: the peer closed while waiting for {what}")
            if predicate(msg):
                return msg

    def expect_op(self, op, timeout=5.0):
        return self.expect(lambda m: m.get("op") == op, timeout, f"op {op!r}")

    def hang_up(self):
        """Ends the connection from the fake's side: the peer reads what was sent, then the end of the stream."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def wait_closed(self, timeout=5.0):
        assert self.closed.wait(timeout), "fake fluxd: the peer did not close"

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self.sock.close()

    def _read(self):
        buffer = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buffer += data
                while len(buffer) >= 4:
                    n = struct.unpack(">I", buffer[:4])[0]
                    if len(buffer) < 4 + n:
                        break
                    msg = json.loads(buffer[4:4 + n])
                    buffer = buffer[4 + n:]
                    self._handle(msg)
        except OSError:
            pass
        self.closed.set()
        self.messages.put(None)

    def _handle(self, msg):
        op = msg.get("op")
        if op == "hello" and self.hello is None:
            self.hello = msg
            if self.fake.refuse is not None:
                self.send({"op": "error", "code": self.fake.refuse, "message": "refused by the fake", "fatal": True})
                self.sock.shutdown(socket.SHUT_WR)
                return
            if self.fake.hold is not None:
                assert self.fake.hold.wait(30), "fake fluxd: held a handshake for 30 s"
            self.fake.peer_ids += 1
            self.send({"op": "welcome", "protocol": 1, "server": "fakefluxd/0", "peer": self.fake.peer_ids,
                       "limits": self.fake.limits, **self.fake.welcome_extra})
        elif op == "ping" and self.fake.auto_pong:
            reply = {"op": "pong"}
            if "id" in msg:
                reply["id"] = msg["id"]
            self.send(reply)
        elif op == "bye":
            self.sock.shutdown(socket.SHUT_WR)
        self.messages.put(msg)


class FakeFluxd:
    def __init__(self, limits=None, refuse=None, auto_pong=True, refuse_at_connect=None, welcome_extra=None):
        self.limits = dict(LIMITS if limits is None else limits)
        self.welcome_extra = dict(welcome_extra or {})
        self.hold = None
        self.refuse = refuse
        self.refuse_at_connect = refuse_at_connect
        self.auto_pong = auto_pong
        self.peer_ids = 0
        self.directory = tempfile.mkdtemp(prefix="fakefluxd-")
        self.socket_path = os.path.join(self.directory, "fluxd.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.socket_path)
        self.listener.listen(16)
        self.peers = queue.Queue()
        self._all = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse_at_connect is not None:  # as fluxd past its connection limits: before any hello
                sock.sendall(frame({"op": "error", "code": self.refuse_at_connect, "message": "refused at connect",
                                    "fatal": True}))
                sock.close()
                continue
            peer = FakePeer(self, sock)
            self._all.append(peer)
            self.peers.put(peer)

    def accept(self, timeout=5.0):
        """The next connection (after its hello was answered)."""
        try:
            peer = self.peers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("fake fluxd: no connection") from None
        peer.expect_op("hello", timeout)
        return peer

    def stop_listening(self):
        """No more connections: the socket file goes away (as when fluxd is not running)."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(5)
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.stop_listening()
        for peer in self._all:
            peer.close()
        shutil.rmtree(self.directory, ignore_errors=True)
