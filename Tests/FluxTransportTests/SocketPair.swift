import CLibUV
import FluxCore
@testable import FluxTransport
import Glibc
import Logging
import Testing

/// What a `Connection` told its delegate, in order.
final class Recorder: ConnectionDelegate {
    var frames: [DecodedFrame] = []
    var closes: [CloseReason] = []
    /// `accountableBytes` at each `connectionAccountingChanged`.
    var accountingReports: [Int] = []
    /// Do what fluxd's daemon core does with a report: account for the bytes (`accounted`), which makes the
    /// connection report every later change, down to 0.
    var chargesReports = false
    /// Called for each frame (after it was recorded), e.g. to answer it.
    var onFrame: ((Connection, DecodedFrame) -> Void)?

    func connection(_ connection: Connection, received frame: DecodedFrame) {
        frames.append(frame)
        onFrame?(connection, frame)
    }

    func connectionClosed(_ connection: Connection, reason: CloseReason) {
        closes.append(reason)
    }

    func connectionAccountingChanged(_ connection: Connection) {
        accountingReports.append(connection.accountableBytes)
        if chargesReports { connection.accounted = connection.accountableBytes }
    }

    /// The bodies of the frames received, as text (`.empty` and `.tooLarge` are spelled out).
    var texts: [String] {
        frames.map {
            switch $0 {
            case .frame(let body): return String(decoding: body, as: UTF8.self)
            case .empty: return "<empty>"
            case .tooLarge(let length): return "<too large: \(length)>"
            }
        }
    }
}

/// Failures of the harness itself (a deadline passed, a system call failed).
struct HarnessFailure: Error, CustomStringConvertible {
    var description: String
}

/// One `EventLoop` and one `Connection` over a `socketpair(2)`, driven from the test's thread: the test plays the
/// peer on the other descriptor (non-blocking, plain system calls) and runs loop iterations in between
/// (`runOnce()`, `run(until:)`), so everything happens in an order the test decides. No fluxd, no listener, no
/// second thread. `finish()` ends every test: it closes the connection, runs the loop until every handle closed,
/// checks that nothing is left open, lets `EventLoop.run()` return and checks that the connection was freed.
final class SocketPair {
    let loop: EventLoop
    let recorder = Recorder()
    /// The test's end of the pair (non-blocking); -1 once closed.
    private(set) var peer: Int32
    private(set) var connection: Connection!
    private weak var weakConnection: Connection?
    private var peerDecoder = FrameDecoder(maxFrame: .max)
    private var finished = false

    /// - Parameters:
    ///   - type: `SOCK_STREAM` (what fluxd serves) or `SOCK_SEQPACKET` (one record per write: lets a test count
    ///     the connection's `writev` calls).
    ///   - sendBuffer: `SO_SNDBUF` of the connection's end; small values make the kernel take only part of a write.
    init(type: __socket_type = SOCK_STREAM, maxFrame: UInt32 = 1 << 20, sendBuffer: Int32? = nil) throws {
        // The connection writes with writev(2): a write to a peer that closed raises SIGPIPE unless it is ignored
        // (fluxd ignores it at startup, ProcessSetup.prepareSignals).
        _ = signal(SIGPIPE, SIG_IGN)
        loop = try EventLoop(logger: Logger(label: "FluxTransportTests") { _ in SwiftLogNoOpLogHandler() })
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(type.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw HarnessFailure(description: "socketpair: \(String(cString: strerror(errno)))")
        }
        peer = fds[1]
        _ = fcntl(peer, F_SETFL, fcntl(peer, F_GETFL) | O_NONBLOCK)
        if var size = sendBuffer {
            _ = setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        connection = try Connection.adopting(descriptor: fds[0], loop: loop, maxFrame: maxFrame, delegate: recorder)
        weakConnection = connection
    }

    deinit {
        // A test that threw before `finish()`: close the connection so that the loop's deinit can run it down.
        if !finished { connection?.close(afterFlush: false) }
        if peer >= 0 { Glibc.close(peer) }
    }

    // MARK: - The loop

    /// One loop iteration that does not wait for I/O (`UV_RUN_NOWAIT`): callbacks of what is ready, the flush of
    /// what is queued.
    func runOnce() {
        _ = uv_run(loop.loop, UV_RUN_NOWAIT)
    }

    /// Runs loop iterations until `condition` holds, calling `step` (the peer's part) before each one. An iteration
    /// waits for I/O at most a few milliseconds (a repeating timer wakes it), so `step` gets its turns while the
    /// connection waits for the peer. Throws when `timeout` passes first.
    func run(until what: String, timeout: Duration = .seconds(10), step: () throws -> Void = {},
             _ condition: () -> Bool) throws {
        let deadline = ContinuousClock.now + timeout
        let wake = LoopTimer(loop: loop) {}
        wake.start(after: 2, repeat: 2)
        defer { wake.close() }
        while !condition() {
            guard ContinuousClock.now < deadline else {
                throw HarnessFailure(description: "timed out after \(timeout) waiting until \(what)")
            }
            try step()
            _ = uv_run(loop.loop, UV_RUN_ONCE)
        }
    }

    /// Closes the connection (unless it closed), runs the loop until it reported its close, checks that no handle
    /// but the loop's own is open, stops the loop and runs it to completion (`run()` returns once every handle
    /// closed and closes the loop), and checks that the connection object was freed.
    func finish(sourceLocation: SourceLocation = #_sourceLocation) throws {
        finished = true
        connection?.close(afterFlush: false)
        try run(until: "the connection reported its close") { !recorder.closes.isEmpty }
        // The close callbacks of the wake-up timers and the connection run in this iteration.
        runOnce()
        let open = openHandles()
        #expect(open.sorted() == ["async", "check", "idle", "prepare"], "handles left open", sourceLocation: sourceLocation)
        connection = nil
        loop.stop()
        loop.run()
        #expect(weakConnection == nil, "the connection outlived its close", sourceLocation: sourceLocation)
        #expect(recorder.closes.count == 1, "connectionClosed reported \(recorder.closes.count) times",
                sourceLocation: sourceLocation)
    }

    /// The type names of the loop's handles that are not closing (the loop's own: async, prepare, check, idle).
    func openHandles() -> [String] {
        var found: [String] = []
        withUnsafeMutablePointer(to: &found) { pointer in
            uv_walk(loop.loop, { handle, arg in
                guard let handle, let arg, uv_is_closing(handle) == 0 else { return }
                let type = String(cString: uv_handle_type_name(uv_handle_get_type(handle)))
                arg.assumingMemoryBound(to: [String].self).pointee.append(type)
            }, pointer)
        }
        return found
    }

    // MARK: - The peer

    /// Writes all of `bytes` to the peer's end (the kernel buffer must have room: tests write little).
    func peerWrite(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(peer, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw HarnessFailure(description: "peer send: \(String(cString: strerror(errno)))") }
            offset += n
        }
    }

    /// Writes `text` as one frame.
    func peerWrite(frame text: String) throws { try peerWrite(encodeFrame(Array(text.utf8))) }

    enum PeerRead: Equatable {
        case bytes([UInt8])
        /// Nothing to read now (`EAGAIN`).
        case nothing
        case eof
        case error(Int32)
    }

    /// One non-blocking `recv` of at most `max` bytes.
    func peerRead(max: Int = 1 << 20) -> PeerRead {
        var buffer = [UInt8](repeating: 0, count: max)
        let n = buffer.withUnsafeMutableBytes { recv(peer, $0.baseAddress, $0.count, 0) }
        if n > 0 { return .bytes(Array(buffer[..<n])) }
        if n == 0 { return .eof }
        return errno == EAGAIN || errno == EWOULDBLOCK ? .nothing : .error(errno)
    }

    /// Frames the peer decoded from what it read so far (`readFrames` feeds it).
    private(set) var peerFrames: [String] = []
    /// Whether the peer read end of stream (or `ECONNRESET`: the connection closed with bytes of ours unread).
    private(set) var peerSawEOF = false
    /// Bytes the peer read so far.
    private(set) var peerBytesRead = 0

    /// Reads what is there (at most `max` bytes) and decodes it into `peerFrames`. Returns the byte count read.
    @discardableResult
    func readFrames(max: Int = 1 << 20) throws -> Int {
        switch peerRead(max: max) {
        case .bytes(let bytes):
            peerBytesRead += bytes.count
            peerDecoder.append(bytes)
            while let frame = peerDecoder.next() {
                guard case .frame(let body) = frame else { throw HarnessFailure(description: "peer decoded \(frame)") }
                peerFrames.append(String(decoding: body, as: UTF8.self))
            }
            return bytes.count
        case .nothing:
            return 0
        case .eof:
            peerSawEOF = true
            return 0
        case .error(ECONNRESET):
            // The connection closed with bytes of ours unread: the kernel says so instead of end of stream.
            peerSawEOF = true
            return 0
        case .error(let code):
            throw HarnessFailure(description: "peer recv: \(String(cString: strerror(code)))")
        }
    }

    /// Bytes the peer wrote that the connection has not read yet (`SIOCOUTQ`, in the kernel's accounting: 0 means
    /// the connection read everything).
    var peerUnread: Int {
        var count: Int32 = 0
        _ = ioctl(peer, UInt(TIOCOUTQ), &count)
        return Int(count)
    }

    /// Closes the peer's end.
    func closePeer() {
        Glibc.close(peer)
        peer = -1
    }
}

/// A frame whose body is `text` (not necessarily a protocol message: the transport does not look inside).
func frame(_ text: String) -> Frame { Frame(body: Array(text.utf8)) }

/// A frame of `size` body bytes whose text starts with `label` (padded with dots), so order and integrity show.
func bigFrame(_ label: String, size: Int) -> Frame {
    var body = Array(label.utf8)
    body += [UInt8](repeating: UInt8(ascii: "."), count: max(0, size - body.count))
    return Frame(body: body)
}

/// The text `bigFrame(label, size:)` arrives as.
func bigText(_ label: String, size: Int) -> String {
    label + String(repeating: ".", count: max(0, size - label.utf8.count))
}
