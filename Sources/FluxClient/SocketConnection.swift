import FluxCore
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A `FluxConnection` over a POSIX `AF_UNIX` `SOCK_STREAM` socket, with two threads of its own so that no caller
/// ever blocks in a system call:
///
/// - the **reader** thread does blocking `read(2)`s into a `FrameDecoder` and hands out frame bodies in order;
/// - the **writer** thread does the blocking `send(2)`s. `send(_:)` appends to an outgoing queue under a short
///   lock and wakes the writer, which takes the whole queue, writes it with no lock held, and then wakes the async
///   callers waiting for room (`waitUntilWritable(below:)`; `FluxClient` waits there before a request while more
///   than its write buffer limit is queued). So a slow fluxd slows the callers that wait, never Swift's cooperative
///   thread pool, and never the reader (which must keep answering heartbeats).
///   The fast path: when nothing is queued or being written, `send(_:)` itself tries a non-blocking
///   `send(2)` (`MSG_DONTWAIT`: it never blocks, and no lock is held across it), and hands only what the kernel did
///   not take to the writer thread. A frame then costs no thread wake-up; order is kept because the writer waits
///   while a direct write is in progress and the rest of it goes to the front of the queue.
///
/// The descriptor is closed by whichever thread ends last; `close()` shuts the socket down, which wakes both.
public final class SocketConnection: FluxConnection {
    private struct State {
        var fd: Int32
        var closedLocally = false
        var started = false
        var readerRunning = false
        var writerRunning = false
        /// Bytes queued by `send`, not yet taken by the writer.
        var outgoing: [UInt8] = []
        /// Bytes the writer took and is writing now.
        var writing = 0
        /// A `send` is writing directly (its non-blocking fast path); the writer thread waits for it.
        var directWriting = false
        /// Why writing stopped (the writer saw EPIPE or another error); further sends fail with it.
        var writeFailure: FluxError?
        var spaceWaiters: [Int: (limit: Int, continuation: CheckedContinuation<Void, Never>)] = [:]
        var nextWaiter = 0
    }

    private let state: Mutex<State>
    private let wakeWriter = DispatchSemaphore(value: 0)
    private let maxFrame: UInt32
    /// The path this connection was opened to ("" for an adopted descriptor).
    public let path: String

    /// The uid of the process listening on the socket (`SO_PEERCRED` right after connecting); nil for an adopted
    /// descriptor, or when the kernel would not say and no check was required.
    public let serverUID: UInt32?
    /// The pid of the process listening on the socket, like `serverUID`.
    public let serverPID: Int32?

    /// Connects to the socket at `path`. `maxFrame` bounds frames *received* (fluxd's frames to us).
    ///
    /// When nothing accepts the connection it throws `FluxError.cannotConnect`, saying what is at the path (no
    /// socket, a socket nobody listens on, a directory, ...) and what to do; its `source` is "the given path" (a
    /// caller that knows better, like `FluxClient.connect`, replaces it).
    ///
    /// Right after connecting it reads who listens there (`SO_PEERCRED`) and refuses the connection
    /// (`FluxError.untrustedServer`) when that uid is not the expected one: `expectedServerUID` if given, else
    /// `$FLUXBUS_SERVER_UID`, else 0 when this process runs as root; otherwise any uid is accepted (see
    /// `expectedServerUID(explicit:environmentValue:clientEUID:)`).
    public init(path: String = defaultSocketPath(), maxFrame: UInt32 = 64 << 20,
                expectedServerUID: UInt32? = nil) throws(FluxError) {
        let expected = try expectedServerUIDFromEnvironment(explicit: expectedServerUID)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .io(operation: "socket", errno: errno) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard !pathBytes.isEmpty, pathBytes.count < capacity else {
            Glibc.close(fd)
            throw .invalidArgument("socket path must be 1-\(capacity - 1) bytes: \(path)")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            raw.copyBytes(from: pathBytes)
            raw[pathBytes.count] = 0
        }
        let rc = withUnsafePointer(to: &addr) { ptr in
            ptr.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if rc != 0 {
            let err = errno
            Glibc.close(fd)
            throw .cannotConnect(ConnectError(path: path, source: "the given path", problem: Self.diagnose(path, errno: err)))
        }
        var server: (pid: Int32, uid: UInt32, gid: UInt32)?
        do {
            server = try peerCredentials(of: fd)
        } catch {
            // Without a required check an unknown server is fine; with one, it is refused.
            if expected != nil {
                Glibc.close(fd)
                throw error
            }
        }
        if let server, let refusal = checkServerUID(server.uid, expected: expected, path: path) {
            Glibc.close(fd)
            throw refusal
        }
        self.serverUID = server?.uid
        self.serverPID = server?.pid
        self.path = path
        self.maxFrame = maxFrame
        self.state = Mutex(State(fd: fd))
    }

    /// Adopts an already connected `AF_UNIX` stream socket (e.g. one end of `socketpair(2)`, or a descriptor
    /// inherited from the process that spawned this one). The connection owns it from now on.
    public init(fileDescriptor fd: Int32, maxFrame: UInt32 = 64 << 20) {
        self.serverUID = nil
        self.serverPID = nil
        self.path = ""
        self.maxFrame = maxFrame
        self.state = Mutex(State(fd: fd))
    }

    /// What is at `path`, given the `connect(2)` error.
    static func diagnose(_ path: String, errno err: Int32) -> ConnectError.Problem {
        var st = stat()
        let exists = stat(path, &st) == 0
        if exists {
            switch st.st_mode & S_IFMT {
            case S_IFDIR: return .isDirectory
            case S_IFSOCK: break
            default: return .notASocket
            }
        }
        switch err {
        case ENOENT: return .noSuchSocket
        case ECONNREFUSED: return exists ? .notListening : .noSuchSocket
        case EACCES, EPERM: return .permissionDenied
        case ENOTSOCK: return .notASocket
        case ENOTDIR: return .noSuchSocket
        default: return .other(errno: err)
        }
    }

    deinit {
        // Only reached when no thread runs (each retains `self`).
        state.withLock { s in
            if s.fd >= 0 { Glibc.close(s.fd); s.fd = -1 }
        }
    }

    public func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) {
        let go = state.withLock { s -> Bool in
            guard !s.started else { return false }
            s.started = true
            s.readerRunning = true
            s.writerRunning = true
            return true
        }
        precondition(go, "SocketConnection.start called twice")
        let reader = Thread { [self] in self.readLoop(handler) }
        reader.name = "fluxbus-reader"
        reader.start()
        let writer = Thread { [self] in self.writeLoop() }
        writer.name = "fluxbus-writer"
        writer.start()
    }

    // MARK: Reading

    private func readLoop(_ handler: @Sendable (ConnectionEvent) -> Void) {
        let fd = state.withLock { $0.fd }
        var decoder = FrameDecoder(maxFrame: maxFrame)
        let size = 65_536
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
        defer { buffer.deallocate() }
        var failure: FluxError?
        let burst = ReadBurst()
        ReadBurst.install(burst)
        defer { ReadBurst.install(nil) }
        reading: while true {
            let n = read(fd, buffer.baseAddress, size)
            if n < 0 {
                if errno == EINTR { continue }
                failure = errno == ECONNRESET ? .disconnected("fluxd closed the connection") : .io(operation: "read", errno: errno)
                break
            }
            if n == 0 { break }
            decoder.append(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
            // The frames of one read are one burst: work held with `ReadBurst.atEnd` runs after the last of them.
            burst.begin()
            defer { burst.end() }
            while let decoded = decoder.next() {
                switch decoded {
                case .frame(let body): handler(.frame(body))
                case .empty: continue
                case .tooLarge(let length):
                    failure = .protocolViolation("received a frame of \(length) bytes (limit \(maxFrame))")
                    break reading
                }
            }
        }
        let (local, waiters) = state.withLock { s -> (Bool, [CheckedContinuation<Void, Never>]) in
            s.readerRunning = false
            // Nothing more will be read: the writer has no reason to go on either.
            if s.fd >= 0 && s.writerRunning { Glibc.shutdown(s.fd, Int32(SHUT_RDWR)) }
            if s.writeFailure == nil { s.writeFailure = .disconnected("the connection is closed") }
            closeIfIdle(&s)
            let waiters = s.spaceWaiters.values.map(\.continuation)
            s.spaceWaiters = [:]
            return (s.closedLocally, waiters)
        }
        wakeWriter.signal()
        for w in waiters { w.resume() }
        if local {
            handler(.closed(nil))
        } else if let failure {
            handler(.closed(failure))
        } else {
            handler(.closed(.disconnected("fluxd closed the connection")))
        }
    }

    // MARK: Writing

    public func send(_ bytes: [UInt8]) throws(FluxError) {
        let (wake, direct) = try state.withLock { s throws(FluxError) -> (Bool, Int32?) in
            if s.closedLocally { throw .closed }
            if let failure = s.writeFailure { throw failure }
            guard s.fd >= 0 else { throw .disconnected("the connection is closed") }
            if s.outgoing.isEmpty && s.writing == 0 && !s.directWriting && s.writerRunning {
                s.directWriting = true
                return (false, s.fd)
            }
            let wasIdle = s.outgoing.isEmpty && !s.directWriting
            s.outgoing.append(contentsOf: bytes)
            return (wasIdle, nil)
        }
        if wake { wakeWriter.signal() }
        guard let fd = direct else { return }
        // The fast path (no lock held): what the kernel takes now, without blocking.
        var offset = 0
        var failure: FluxError?
        bytes.withUnsafeBytes { raw in
            while offset < raw.count {
                let n = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if n < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN || errno == EWOULDBLOCK { return }
                    failure = errno == EPIPE || errno == ECONNRESET
                        ? .disconnected("fluxd closed the connection") : .io(operation: "send", errno: errno)
                    return
                }
                offset += n
            }
        }
        let handOver = state.withLock { s -> Bool in
            s.directWriting = false
            closeIfIdle(&s)  // the reader and the writer may have ended meanwhile: the last one closes
            if let failure, s.writeFailure == nil { s.writeFailure = failure }
            if failure == nil && offset < bytes.count { s.outgoing.insert(contentsOf: bytes[offset...], at: 0) }
            return !s.outgoing.isEmpty || s.writeFailure != nil
        }
        if handOver { wakeWriter.signal() }
    }

    public var pendingWriteBytes: Int {
        state.withLock { $0.outgoing.count + $0.writing }
    }

    public func waitUntilWritable(below limit: Int) async {
        let id = state.withLock { s -> Int in
            s.nextWaiter += 1
            return s.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { s -> Bool in
                    if s.outgoing.count + s.writing < limit || s.closedLocally || s.writeFailure != nil || Task.isCancelled {
                        return true
                    }
                    s.spaceWaiters[id] = (limit, c)
                    return false
                }
                if ready { c.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { $0.spaceWaiters.removeValue(forKey: id) }
            waiter?.continuation.resume()
        }
    }

    private func writeLoop() {
        while true {
            wakeWriter.wait()
            while true {
                let (fd, chunk, stop) = state.withLock { s -> (Int32, [UInt8], Bool) in
                    if s.closedLocally || s.writeFailure != nil || s.fd < 0 { return (-1, [], true) }
                    // A direct write in progress goes first; it wakes this thread when it is done.
                    if s.directWriting { return (s.fd, [], false) }
                    let chunk = s.outgoing
                    s.outgoing = []
                    s.writing = chunk.count
                    return (s.fd, chunk, false)
                }
                if stop {
                    finishWriter()
                    return
                }
                if chunk.isEmpty { break }
                let failure = write(chunk, to: fd)
                let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
                    s.writing = 0
                    if let failure, s.writeFailure == nil { s.writeFailure = failure }
                    let pending = s.outgoing.count
                    let ready = s.spaceWaiters.filter { pending < $0.value.limit || s.writeFailure != nil }
                    for key in ready.keys { s.spaceWaiters[key] = nil }
                    return ready.values.map(\.continuation)
                }
                for w in waiters { w.resume() }
            }
        }
    }

    /// Writes all of `bytes` (blocking; no lock held). Returns why it could not.
    private func write(_ bytes: [UInt8], to fd: Int32) -> FluxError? {
        bytes.withUnsafeBytes { raw -> FluxError? in
            var offset = 0
            while offset < raw.count {
                let n = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n < 0 {
                    if errno == EINTR { continue }
                    return errno == EPIPE || errno == ECONNRESET
                        ? .disconnected("fluxd closed the connection") : .io(operation: "send", errno: errno)
                }
                offset += n
            }
            return nil
        }
    }

    private func finishWriter() {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.writerRunning = false
            s.writing = 0
            closeIfIdle(&s)
            defer { s.spaceWaiters = [:] }
            return s.spaceWaiters.values.map(\.continuation)
        }
        for w in waiters { w.resume() }
    }

    /// Closes the descriptor once neither thread uses it.
    private func closeIfIdle(_ s: inout State) {
        if !s.readerRunning && !s.writerRunning && !s.directWriting && s.fd >= 0 {
            Glibc.close(s.fd)
            s.fd = -1
        }
    }

    // MARK: Closing

    public func close() {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            guard !s.closedLocally else { return [] }
            s.closedLocally = true
            s.outgoing = []
            if s.fd >= 0 {
                if s.started && (s.readerRunning || s.writerRunning) {
                    // Wakes the reader (and a writer blocked in send), which report and close.
                    Glibc.shutdown(s.fd, Int32(SHUT_RDWR))
                } else {
                    Glibc.close(s.fd)
                    s.fd = -1
                }
            }
            defer { s.spaceWaiters = [:] }
            return s.spaceWaiters.values.map(\.continuation)
        }
        wakeWriter.signal()
        for w in waiters { w.resume() }
    }
}

/// The frames a connection's reader got from one `read(2)` arrive together (a burst: a peer's batch of messages);
/// work that is worth doing once per burst rather than once per frame (waking the store's loop) is held until the
/// reader has delivered the last of them. Only `SocketConnection`'s reader thread has bursts; called from any other
/// thread (or another transport's delivery), `atEnd` runs the work at once.
package final class ReadBurst {
    // Unchecked: only the reader thread touches its burst.
    @exclusivity(unchecked) private var active = false
    @exclusivity(unchecked) private var pending: [() -> Void] = []

    fileprivate init() {}

    /// Runs `work` after the current thread's burst, or now when the current thread is not delivering one.
    package static func atEnd(_ work: @escaping () -> Void) {
        if let raw = pthread_getspecific(burstKey) {
            let burst = Unmanaged<ReadBurst>.fromOpaque(raw).takeUnretainedValue()
            if burst.active {
                burst.pending.append(work)
                return
            }
        }
        work()
    }

    /// Makes `burst` the current thread's (nil: none). The reader holds it for as long as it is installed.
    fileprivate static func install(_ burst: ReadBurst?) {
        pthread_setspecific(burstKey, burst.map { UnsafeRawPointer(Unmanaged.passUnretained($0).toOpaque()) })
    }

    fileprivate func begin() { active = true }

    fileprivate func end() {
        active = false
        while !pending.isEmpty {
            let work = pending
            pending.removeAll(keepingCapacity: true)
            for w in work { w() }
        }
    }
}

/// The thread-specific slot of the reader's `ReadBurst`.
private let burstKey: pthread_key_t = {
    var key = pthread_key_t()
    pthread_key_create(&key, nil)
    return key
}()
