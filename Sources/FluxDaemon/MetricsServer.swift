import FluxJournal
import Foundation
import Glibc

/// A loopback address for the metrics endpoint: `127.0.0.1:PORT`, `[::1]:PORT` or `localhost:PORT` (port 0: any
/// free port). Only loopback: the endpoint has no authentication, and a Unix socket cannot be scraped by Prometheus.
public struct MetricsAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// Whether `host` is IPv6 (`::1`).
    public var isIPv6: Bool { host.contains(":") }

    /// Parses `text`: a failure says why it is not a loopback `HOST:PORT`.
    public static func parse(_ text: String) -> Result<MetricsAddress, MetricsAddressError> {
        let host: Substring, portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                return .failure(.init("'\(text)' is not [IPV6]:PORT"))
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return .failure(.init("'\(text)' has no :PORT")) }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard let port = UInt16(portText) else { return .failure(.init("'\(portText)' is not a port (0-65535)")) }
        switch host {
        case "127.0.0.1", "localhost": return .success(MetricsAddress(host: "127.0.0.1", port: port))
        case "::1": return .success(MetricsAddress(host: "::1", port: port))
        default:
            return .failure(.init("\(host) is not a loopback address: the metrics endpoint has no authentication, so fluxd serves it on 127.0.0.1 or [::1] only (put a proxy in front to expose it)"))
        }
    }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Why a `--metrics` address was refused.
public struct MetricsAddressError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The HTTP side of the metrics endpoint as a pure function of the bytes received: fluxd answers `GET /metrics`
/// (and `HEAD`) and nothing else, one request per connection (HTTP/1.0 and 1.1, `Connection: close`).
public enum MetricsHTTP {
    /// The most a request head may take (request line and headers); more gets 431.
    public static let maxRequestBytes = 8192

    /// What to answer.
    public enum Answer: Equatable, Sendable {
        /// The head is not complete yet: read more.
        case incomplete
        /// The metrics (`head`: HEAD, no body).
        case metrics(head: Bool)
        /// An error status with a one-line reason.
        case error(status: Int, reason: String)
    }

    /// Reads the request head in `bytes` (everything received so far).
    public static func answer(to bytes: [UInt8]) -> Answer {
        guard let end = headEnd(bytes) else {
            return bytes.count >= maxRequestBytes ? .error(status: 431, reason: "request head too large") : .incomplete
        }
        guard end <= maxRequestBytes else { return .error(status: 431, reason: "request head too large") }
        let lineEnd = bytes[..<end].firstIndex(of: UInt8(ascii: "\n")) ?? end
        var line = bytes[..<lineEnd]
        if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
        let parts = line.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
        guard parts.count == 3, parts.allSatisfy({ !$0.isEmpty }),
              parts[2].elementsEqual("HTTP/1.1".utf8) || parts[2].elementsEqual("HTTP/1.0".utf8) else {
            return .error(status: 400, reason: "not an HTTP/1.x request line")
        }
        let method = parts[0], target = parts[1]
        let isGet = method.elementsEqual("GET".utf8), isHead = method.elementsEqual("HEAD".utf8)
        guard isGet || isHead else { return .error(status: 405, reason: "only GET and HEAD") }
        let path = target.split(separator: UInt8(ascii: "?"), maxSplits: 1, omittingEmptySubsequences: false).first ?? target[...]
        guard path.elementsEqual("/metrics".utf8) else { return .error(status: 404, reason: "fluxd serves /metrics only") }
        return .metrics(head: isHead)
    }

    /// Where the head ends (after its blank line: CRLF CRLF, or LF LF), or nil.
    static func headEnd(_ bytes: [UInt8]) -> Int? {
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "\n") {
                if i + 1 < bytes.count, bytes[i + 1] == UInt8(ascii: "\n") { return i + 2 }
                if i + 2 < bytes.count, bytes[i + 1] == UInt8(ascii: "\r"), bytes[i + 2] == UInt8(ascii: "\n") { return i + 3 }
            }
            i += 1
        }
        return nil
    }

    /// The whole response for `answer` (not `.incomplete`), `body` being the exposition.
    public static func response(_ answer: Answer, body: () -> [UInt8]) -> [UInt8] {
        let status: Int, reason: String, content: [UInt8], contentType: String, sendBody: Bool
        switch answer {
        case .incomplete:
            return []
        case .metrics(let head):
            status = 200; reason = "OK"; content = body(); sendBody = !head
            contentType = "text/plain; version=0.0.4; charset=utf-8"
        case .error(let code, let text):
            status = code; content = Array((text + "\n").utf8); sendBody = true
            contentType = "text/plain; charset=utf-8"
            switch code {
            case 400: reason = "Bad Request"
            case 404: reason = "Not Found"
            case 405: reason = "Method Not Allowed"
            case 408: reason = "Request Timeout"
            case 431: reason = "Request Header Fields Too Large"
            default: reason = "Error"
            }
        }
        var head = "HTTP/1.1 \(status) \(reason)\r\nContent-Type: \(contentType)\r\nContent-Length: \(content.count)\r\nConnection: close\r\n"
        if status == 405 { head += "Allow: GET, HEAD\r\n" }
        head += "\r\n"
        return Array(head.utf8) + (sendBody ? content : [])
    }
}

/// Serves `GET /metrics` on a loopback TCP address from a thread of its own: it never touches fluxd's loop (the
/// snapshot it renders is handed over). It serves up to `maxConnections` connections at once with one `poll`: each
/// gets `readTimeout` to send its request head and as long again to read the answer, and when a new connection comes
/// while that many are open, the one that has waited longest for its head is closed. So slow or silent clients
/// (slowloris) can hold neither fluxd nor the endpoint: a real scrape is answered as soon as it has sent its
/// request. Lifecycle: `init` binds and listens (errors are thrown before fluxd reports ready), `start()` starts the
/// thread, `stop()` wakes it through a pipe; the thread closes every connection, the listening socket and the pipe
/// when it ends.
public final class MetricsServer: Sendable {
    /// The address served (with the port the kernel chose for port 0).
    public let address: MetricsAddress
    private let listenFD: Int32
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let render: @Sendable () -> [UInt8]
    private let readTimeout: Int32

    public init(address: MetricsAddress, readTimeoutMs: Int32 = 2000, render: @escaping @Sendable () -> [UInt8]) throws(MetricsAddressError) {
        self.render = render
        self.readTimeout = readTimeoutMs
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw MetricsAddressError("socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var bound: UInt16 = 0
        let rc: Int32
        if address.isIPv6 {
            var a = sockaddr_in6()
            a.sin6_family = sa_family_t(AF_INET6)
            a.sin6_port = address.port.bigEndian
            a.sin6_addr = in6addr_loopback
            rc = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) } }
        } else {
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_port = address.port.bigEndian
            a.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
            rc = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        }
        guard rc == 0, listen(fd, 16) == 0 else {
            let message = String(cString: strerror(errno))
            close(fd)
            throw MetricsAddressError("cannot listen on \(address): \(message)")
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        if address.isIPv6 {
            bound = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) } }
        } else {
            bound = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) } }
        }
        var pipeFDs: [Int32] = [-1, -1]
        guard pipe(&pipeFDs) == 0 else {
            close(fd)
            throw MetricsAddressError("pipe: \(String(cString: strerror(errno)))")
        }
        for p in pipeFDs { _ = fcntl(p, F_SETFD, FD_CLOEXEC) }
        listenFD = fd
        wakeRead = pipeFDs[0]
        wakeWrite = pipeFDs[1]
        self.address = MetricsAddress(host: address.host, port: bound)
    }

    /// Starts serving on a thread of its own.
    public func start() {
        let thread = Thread { [self] in serve() }
        thread.name = "fluxd-metrics"
        thread.stackSize = 256 << 10
        thread.start()
    }

    /// Stops serving (idempotent; the thread ends after the request it is answering, if any).
    public func stop() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    /// Connections served at once (more: the one waiting longest for its request head is closed).
    public static let maxConnections = 64

    /// One client: its request head so far, then its answer being written, and when it must be done.
    private struct Client {
        let fd: Int32
        var received: [UInt8] = []
        var answer: [UInt8]? = nil
        var sent = 0
        var deadline: UInt64
        let accepted: UInt64
    }

    private func serve() {
        var clients: [Client] = []
        defer {
            for c in clients { close(c.fd) }
            close(listenFD)
            close(wakeRead)
            close(wakeWrite)
        }
        let budget = UInt64(readTimeout) * 1_000_000
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            var fds = [pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0), pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            for c in clients { fds.append(pollfd(fd: c.fd, events: Int16(c.answer == nil ? POLLIN : POLLOUT), revents: 0)) }
            let now = monotonicNanoseconds()
            let next = clients.map(\.deadline).min()
            let wait = next.map { $0 > now ? Int32(min(($0 - now) / 1_000_000 + 1, 60_000)) : 0 } ?? -1
            let n = poll(&fds, nfds_t(fds.count), wait)
            if n < 0 { if errno == EINTR { continue } else { return } }
            if fds[1].revents != 0 { return }
            var closing = Set<Int32>()
            for (i, p) in fds.enumerated().dropFirst(2) where p.revents != 0 {
                let k = i - 2
                if clients[k].answer == nil {
                    let got = buffer.withUnsafeMutableBytes { read(clients[k].fd, $0.baseAddress, $0.count) }
                    if got < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                    if got <= 0 { closing.insert(clients[k].fd); continue }  // closed before a whole request
                    clients[k].received += buffer[..<got]
                    let answer = MetricsHTTP.answer(to: clients[k].received)
                    if case .incomplete = answer { continue }
                    clients[k].answer = MetricsHTTP.response(answer, body: render)
                    clients[k].received = []
                    clients[k].deadline = monotonicNanoseconds() + budget
                }
                if !writeAnswer(&clients[k]) { closing.insert(clients[k].fd) }
            }
            // Past their deadline: a head that did not come gets 408 (best effort), an answer not read is dropped.
            let late = monotonicNanoseconds()
            for k in clients.indices where clients[k].deadline <= late && !closing.contains(clients[k].fd) {
                if clients[k].answer == nil {
                    let bytes = MetricsHTTP.response(.error(status: 408, reason: "no complete request within \(readTimeout) ms"), body: render)
                    _ = bytes.withUnsafeBytes { send(clients[k].fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
                }
                closing.insert(clients[k].fd)
            }
            if !closing.isEmpty {
                for c in clients where closing.contains(c.fd) { close(c.fd) }
                clients.removeAll { closing.contains($0.fd) }
            }
            if fds[0].revents != 0 {
                let fd = accept(listenFD, nil, nil)
                guard fd >= 0 else { continue }  // EAGAIN, ECONNABORTED, EMFILE...: the next poll tries again
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)  // (workers are spawned through fluxd-exec, which closes the rest)
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                if clients.count >= Self.maxConnections,
                   let oldest = clients.indices.filter({ clients[$0].answer == nil }).min(by: { clients[$0].accepted < clients[$1].accepted }) {
                    close(clients[oldest].fd)
                    clients.remove(at: oldest)
                }
                if clients.count >= Self.maxConnections {
                    close(fd)  // (every one is being answered: this one tries again)
                    continue
                }
                let at = monotonicNanoseconds()
                clients.append(Client(fd: fd, deadline: at + budget, accepted: at))
            }
        }
    }

    /// Writes what the socket takes of `client`'s answer; false once it is all written (the connection is then
    /// shut down for writing and closed) or the peer is gone.
    private func writeAnswer(_ client: inout Client) -> Bool {
        guard let bytes = client.answer else { return true }
        while client.sent < bytes.count {
            let n = bytes[client.sent...].withUnsafeBytes { send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
            if n < 0 {
                if errno == EINTR { continue }
                return errno == EAGAIN || errno == EWOULDBLOCK
            }
            client.sent += n
        }
        shutdown(client.fd, Int32(SHUT_WR))
        return false
    }
}
