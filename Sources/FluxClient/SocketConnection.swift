import FluxCore
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A `FluxConnection` over a POSIX `AF_UNIX` `SOCK_STREAM` socket: blocking writes serialized under a lock, and a
/// dedicated reader thread doing blocking reads into a `FrameDecoder` and handing out frame bodies in order.
public final class SocketConnection: FluxConnection {
    private struct State {
        var fd: Int32
        var closedLocally = false
        var started = false
        var readerExited = false
    }

    private let state: Mutex<State>
    private let fd: Int32
    private let maxFrame: UInt32
    /// The path this connection was opened to.
    public let path: String

    /// The uid of the process listening on the socket (`SO_PEERCRED` right after connecting); nil for an adopted
    /// descriptor, or when the kernel would not say and no check was required.
    public let serverUID: UInt32?
    /// The pid of the process listening on the socket, like `serverUID`.
    public let serverPID: Int32?

    /// Connects to the socket at `path`. `maxFrame` bounds frames *received* (fluxd's frames to us).
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
            throw .io(operation: "connect(\(path))", errno: err)
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
        self.fd = fd
        self.path = path
        self.maxFrame = maxFrame
        self.state = Mutex(State(fd: fd))
    }

    /// Adopts an already connected `AF_UNIX` stream socket (e.g. one end of `socketpair(2)`, or a descriptor
    /// inherited from the process that spawned this one). The connection owns it from now on.
    public init(fileDescriptor fd: Int32, maxFrame: UInt32 = 64 << 20) {
        self.serverUID = nil
        self.serverPID = nil
        self.fd = fd
        self.path = ""
        self.maxFrame = maxFrame
        self.state = Mutex(State(fd: fd))
    }

    deinit {
        // Only reached when the reader never started or has exited (the reader thread retains `self`).
        state.withLock { s in
            if s.fd >= 0 { Glibc.close(s.fd); s.fd = -1 }
        }
    }

    public func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) {
        let go = state.withLock { s -> Bool in
            guard !s.started else { return false }
            s.started = true
            return true
        }
        precondition(go, "SocketConnection.start called twice")
        let thread = Thread { [self] in self.readLoop(handler) }
        thread.name = "fluxbus-reader"
        thread.start()
    }

    private func readLoop(_ handler: @Sendable (ConnectionEvent) -> Void) {
        var decoder = FrameDecoder(maxFrame: maxFrame)
        let size = 65_536
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
        defer { buffer.deallocate() }
        var failure: FluxError?
        reading: while true {
            let n = read(fd, buffer.baseAddress, size)
            if n < 0 {
                if errno == EINTR { continue }
                failure = .io(operation: "read", errno: errno)
                break
            }
            if n == 0 { break }
            decoder.append(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
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
        let local = state.withLock { s -> Bool in
            s.readerExited = true
            if s.fd >= 0 { Glibc.close(s.fd); s.fd = -1 }
            return s.closedLocally
        }
        if local {
            handler(.closed(nil))
        } else if let failure {
            handler(.closed(failure))
        } else {
            handler(.closed(.disconnected("fluxd closed the connection")))
        }
    }

    public func send(_ bytes: [UInt8]) throws(FluxError) {
        let err: FluxError? = state.withLock { s -> FluxError? in
            if s.closedLocally { return .closed }
            guard s.fd >= 0 else { return .disconnected("the connection is closed") }
            return bytes.withUnsafeBytes { raw -> FluxError? in
                var offset = 0
                while offset < raw.count {
                    let n = Glibc.send(s.fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
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
        if let err { throw err }
    }

    public func close() {
        state.withLock { s in
            guard !s.closedLocally else { return }
            s.closedLocally = true
            guard s.fd >= 0 else { return }
            if s.started && !s.readerExited {
                // Wakes the reader, which closes the descriptor and reports `.closed(nil)`.
                Glibc.shutdown(s.fd, Int32(SHUT_RDWR))
            } else {
                Glibc.close(s.fd)
                s.fd = -1
            }
        }
    }
}
