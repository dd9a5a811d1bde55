import FluxCore
import Foundation
import Glibc

/// A blocking test client on a raw Unix socket: sends arbitrary bytes or frames and reads frames with deadlines
/// (`poll(2)`), so tests can say exactly what goes over the wire. For synchronous tests, which run on threads of
/// their own (`.onDedicatedThreads`).
final class RawPeer {
    let fd: Int32
    private var decoder = FrameDecoder(maxFrame: UInt32.max)
    private var sawEOF = false

    /// What `next(timeout:)` found.
    enum Event: Equatable {
        case frame([UInt8])
        case eof
        case timeout
    }

    /// Connects to the Unix socket at `path`.
    init(connectingTo path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError.system("socket", errno) }
        let rc = connectUnix(fd, path)
        if rc != 0 {
            let code = errno
            Glibc.close(fd)
            throw HarnessError.system("connect \(path)", code)
        }
    }

    deinit { Glibc.close(fd) }

    /// Writes all of `bytes`.
    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw HarnessError.system("send", errno)
            }
            offset += n
        }
    }

    /// Sends `json` as one frame.
    func send(frame json: String) throws { try send(encodeFrame(Array(json.utf8))) }

    /// The next frame, EOF, or timeout.
    func next(timeout: Duration = .seconds(10)) throws -> Event {
        let deadline = ContinuousClock.now + timeout
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            if let decoded = decoder.next() {
                switch decoded {
                case .frame(let body): return .frame(body)
                case .empty: return .frame([])
                case .tooLarge: throw HarnessError.unexpectedOutput("oversized frame from fluxd")
                }
            }
            if sawEOF { return .eof }
            switch try readWithDeadline(fd: fd, into: &chunk, deadline: deadline) {
            case .bytes(let n): decoder.append(chunk[..<n])
            case .eof: sawEOF = true
            case .timeout: return .timeout
            }
        }
    }

    /// The next frame as a JSON object; throws on EOF, timeout or non-object.
    func nextMessage(timeout: Duration = .seconds(10)) throws -> [String: Any] {
        switch try next(timeout: timeout) {
        case .frame(let body):
            guard let object = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
                throw HarnessError.unexpectedOutput(String(decoding: body, as: UTF8.self))
            }
            return object
        case .eof: throw HarnessError.unexpectedOutput("EOF instead of a frame")
        case .timeout: throw HarnessError.timedOut("frame from fluxd")
        }
    }

    /// Reads frames until EOF; returns them (throws on timeout).
    func readUntilEOF(timeout: Duration = .seconds(10)) throws -> [[String: Any]] {
        let deadline = ContinuousClock.now + timeout
        var messages: [[String: Any]] = []
        while true {
            switch try next(timeout: deadline - ContinuousClock.now) {
            case .frame(let body):
                messages.append((try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]) ?? [:])
            case .eof: return messages
            case .timeout: throw HarnessError.timedOut("EOF from fluxd")
            }
        }
    }

    /// Sends hello and returns the welcome.
    func handshake(role: String = "client", name: String = "test") throws -> [String: Any] {
        try send(frame: #"{"op":"hello","protocol":1,"role":"\#(role)","name":"\#(name)"}"#)
        return try nextMessage()
    }
}

/// `connect(2)` to a Unix socket path; returns 0 or -1 with errno set.
func connectUnix(_ fd: Int32, _ path: String) -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        errno = ENAMETOOLONG
        return -1
    }
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
}

/// Leaves a stale socket file at `path`: binds a socket there and closes it without unlinking.
func makeStaleSocket(at path: String) throws {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError.system("socket", errno) }
    defer { Glibc.close(fd) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
    guard rc == 0 else { throw HarnessError.system("bind \(path)", errno) }
}

/// `lstat` mode bits of a path, or nil if it does not exist.
func fileMode(_ path: String) -> mode_t? {
    var st = stat()
    return lstat(path, &st) == 0 ? st.st_mode : nil
}

enum ReadOutcome { case bytes(Int), eof, timeout }

/// One `read(2)` that waits with `poll(2)` until `deadline`.
func readWithDeadline(fd: Int32, into buffer: inout [UInt8], deadline: ContinuousClock.Instant) throws -> ReadOutcome {
    while true {
        let remaining = deadline - ContinuousClock.now
        if remaining <= .zero { return .timeout }
        let ms = Int32(min(remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1,
                           Int64(Int32.max)))
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&pfd, 1, ms)
        if ready < 0 {
            if errno == EINTR { continue }
            throw HarnessError.system("poll", errno)
        }
        if ready == 0 { continue }
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR || errno == EAGAIN { continue }
            if errno == ECONNRESET { return .eof }
            throw HarnessError.system("read", errno)
        }
        return n == 0 ? .eof : .bytes(n)
    }
}
