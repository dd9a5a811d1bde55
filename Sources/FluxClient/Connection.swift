import FluxCore
#if canImport(Glibc)
import Glibc
#endif

/// What a `FluxConnection` reports to the one handler given to `start(_:)`, in the order it happened.
public enum ConnectionEvent: Sendable {
    /// One complete frame body (the JSON bytes, without the 4-byte length prefix).
    case frame([UInt8])
    /// The connection ended: `nil` when it was closed locally with `close()`, otherwise why it ended (EOF is
    /// `.disconnected`). Reported exactly once, and nothing follows it.
    case closed(FluxError?)
}

/// A byte-stream transport to fluxd: sends framed bytes, reports received frames, closes.
///
/// The SDK objects (`FluxClient`, `FluxStore`, `RawSession`) speak the protocol over any value of this type, so the
/// same code runs over a real Unix socket (`SocketConnection`) and over the in-memory bus of FluxTesting.
///
/// Contract:
/// - `start(_:)` is called at most once; events are delivered to the handler one at a time, in order, never
///   concurrently (the handler need not be reentrant, but must not block for long: it runs on the reader).
///   Frames that arrive before `start` are kept and delivered after it.
/// - `send(_:)` may be called from any thread; the bytes of one call are written contiguously and calls are written
///   in the order they were made. It throws once the connection is closed. It must not block for long: a transport
///   that writes to a socket queues the bytes and writes them from a thread of its own (`SocketConnection`), and
///   reports what waits in `pendingWriteBytes` so async callers can wait for room (`waitUntilWritable`).
/// - The handler may be called from within `send` (an in-memory transport delivers replies at once): callers must
///   hold no lock across `send` that the handler takes.
/// - `close()` is idempotent; afterwards the handler gets `.closed(nil)` (unless it already got a `.closed`).
public protocol FluxConnection: Sendable {
    /// Starts delivering events to `handler`.
    func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void)
    /// Writes bytes that are already framed (length prefix + body). Tools may write malformed bytes on purpose.
    func send(_ bytes: [UInt8]) throws(FluxError)
    /// Closes the connection (both directions).
    func close()
    /// Bytes accepted by `send` and not yet written (0 for a transport that writes synchronously).
    var pendingWriteBytes: Int { get }
    /// Returns once fewer than `limit` bytes wait to be written, or the connection is closed, or the calling task is
    /// cancelled. Never blocks a thread.
    func waitUntilWritable(below limit: Int) async
}

extension FluxConnection {
    /// A transport that writes synchronously has nothing pending.
    public var pendingWriteBytes: Int { 0 }
    /// A transport that writes synchronously is always writable.
    public func waitUntilWritable(below limit: Int) async {}
}

extension FluxConnection {
    /// Frames `body` (one JSON object) and writes it.
    public func send(body: [UInt8]) throws(FluxError) {
        try send(encodeFrame(body))
    }

    /// Writes a frame built by `FrameBuilder` (or any `Frame`).
    public func send(frame: Frame) throws(FluxError) {
        try send(frame.wireBytes)
    }
}

/// The socket path a client uses when none is given: FluxCore's one rule, the same as fluxd's (see
/// `FluxCore.defaultSocketLocation`): `$FLUXBUS_SOCKET`, else `$XDG_RUNTIME_DIR/fluxbus/fluxd.sock`, else
/// `${TMPDIR:-/tmp}/fluxbus-<uid>/fluxd.sock`.
public func defaultSocketPath() -> String {
    FluxCore.defaultSocketPath(environment: nil, uid: nil)
}
