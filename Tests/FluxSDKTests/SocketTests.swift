import FluxClient
import FluxCore
import FluxTesting
import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Blocking helpers for the far end of a socket in tests.
enum Far {
    static func write(_ fd: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, bytes.count - offset) }
            precondition(n > 0, "write failed")
            offset += n
        }
    }

    /// Reads one frame body (blocking).
    static func readFrame(_ fd: Int32) -> [UInt8]? {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            if case .frame(let body)? = decoder.next() { return body }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, 1) } // one byte: never over-reads
            if n <= 0 { return nil }
            decoder.append(buffer[0..<n])
        }
    }
}

func socketPair() -> (Int32, Int32) {
    var fds: [Int32] = [0, 0]
    let rc = socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds)
    precondition(rc == 0)
    return (fds[0], fds[1])
}

@Suite("Socket transport")
struct SocketTests {
    @Test func defaultSocketPathFollowsTheEnvironmentOrder() {
        // The environment of the test run decides which branch applies; each is checked exactly.
        let path = defaultSocketPath()
        if let explicit = ProcessInfo.processInfo.environment["FLUXBUS_SOCKET"], !explicit.isEmpty {
            #expect(path == explicit)
        } else if let runtime = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            #expect(path == runtime + "/fluxbus/fluxd.sock")
        } else if let tmp = ProcessInfo.processInfo.environment["TMPDIR"], !tmp.isEmpty, tmp != "/" {
            #expect(path == tmp.replacingOccurrences(of: "/+$", with: "", options: .regularExpression) + "/fluxbus-\(getuid())/fluxd.sock")
        } else if ProcessInfo.processInfo.environment["TMPDIR"] != "/" {
            #expect(path == "/tmp/fluxbus-\(getuid())/fluxd.sock")
        }
        // FluxClient's default is FluxCore's, the rule fluxd uses (protocol/vectors/socket-path.json).
        #expect(path == FluxCore.defaultSocketPath(environment: ProcessInfo.processInfo.environment, uid: getuid()))
    }

    @Test func connectingToAMissingSocketSaysWhereAndWhatToDo() {
        let path = "/tmp/fluxbus-does-not-exist-\(getpid())/x.sock"
        do {
            _ = try SocketConnection(path: path)
            Issue.record("connect should fail")
        } catch {
            guard case .cannotConnect(let problem) = error else { Issue.record("\(error)"); return }
            #expect(problem.path == path)
            #expect(problem.problem == .noSuchSocket)
            #expect(error.description == """
                no fluxd at \(path) (from the given path): no such socket
                  start one with:  fluxd --socket \(path)
                  or connect to a running one: pass its socket path, or set FLUXBUS_SOCKET=PATH
                """)
        }
    }

    @Test func reassemblesFramesSplitAnywhereAndReportsEOF() async throws {
        let (mine, far) = socketPair()
        defer { Glibc.close(far) }
        let connection = SocketConnection(fileDescriptor: mine)
        let events = Recorder<String>()
        connection.start { event in
            switch event {
            case .frame(let body): events.append(String(decoding: body, as: UTF8.self))
            case .closed(let error): events.append("closed: \(String(describing: error))")
            }
        }
        let stream = encodeFrame(Array(#"{"op":"a"}"#.utf8)) + encodeFrame(Array(#"{"op":"b","x":"\u00e9"}"#.utf8))
        // Split inside the first length prefix and inside the second body.
        Far.write(far, Array(stream[0..<2]))
        Far.write(far, Array(stream[2..<20]))
        Far.write(far, Array(stream[20...]))
        try await events.wait(count: 2)
        #expect(events.elements == [#"{"op":"a"}"#, #"{"op":"b","x":"\u00e9"}"#])
        // What we send arrives framed.
        try connection.send(body: Array(#"{"op":"ping","id":"1"}"#.utf8))
        #expect(Far.readFrame(far).map { String(decoding: $0, as: UTF8.self) } == #"{"op":"ping","id":"1"}"#)
        Glibc.shutdown(far, Int32(SHUT_RDWR))
        let all = try await events.wait(count: 3)
        #expect(all[2] == "closed: Optional(disconnected: fluxd closed the connection)")
        #expect(throws: FluxError.self) { try connection.send(body: Array("{}".utf8)) }
    }

    @Test func localCloseReportsClosedWithoutError() async throws {
        let (mine, far) = socketPair()
        defer { Glibc.close(far) }
        let connection = SocketConnection(fileDescriptor: mine)
        let events = Recorder<String>()
        connection.start { event in
            if case .closed(let error) = event { events.append("closed: \(String(describing: error))") }
        }
        connection.close()
        connection.close()
        #expect(try await events.wait(count: 1) == ["closed: nil"])
        #expect(throws: FluxError.closed) { try connection.send(body: Array("{}".utf8)) }
    }

    @Test func clientOverARealSocketHandshakesAndPings() async throws {
        let (mine, far) = socketPair()
        // The far end plays fluxd on a thread of its own (blocking reads).
        let fluxd = Thread {
            guard let hello = Far.readFrame(far), (try? Envelope(body: hello))?.string("op").value == "hello" else { return }
            Far.write(far, encodeFrame(Array(welcomeJSON.utf8)))
            guard let ping = Far.readFrame(far), let env = try? Envelope(body: ping) else { return }
            var pong = FrameBuilder(op: "pong")
            pong.string("id", env.string("id").value ?? "")
            let frame = pong.finish()
            Far.write(far, encodeFrame(frame.bodyArray))
            _ = Far.readFrame(far) // bye
            Glibc.close(far)
        }
        fluxd.start()
        let client = try await FluxClient.connect(over: SocketConnection(fileDescriptor: mine), name: "sock")
        #expect(client.welcome.peer == 7)
        #expect(try await client.ping() > .zero)
        await client.close()
        #expect(client.isClosed)
    }

    @Test func concurrentSendsAreNeverInterleaved() async throws {
        let (mine, far) = socketPair()
        let connection = SocketConnection(fileDescriptor: mine)
        connection.start { _ in }
        let frame = "{\"op\":\"" + String(repeating: "x", count: 3000) + "\"}"
        // Blocking I/O stays off the cooperative pool: the far reader and the senders are threads.
        let good = Recorder<Int>()
        let reader = Thread {
            var decoder = FrameDecoder(maxFrame: 1 << 20)
            var buffer = [UInt8](repeating: 0, count: 65536)
            var count = 0
            reading: while count < 400 {
                let n = buffer.withUnsafeMutableBytes { Glibc.read(far, $0.baseAddress, 65536) }
                if n <= 0 { break }
                decoder.append(buffer[0..<n])
                while case .frame(let body)? = decoder.next() {
                    guard String(decoding: body, as: UTF8.self) == frame else { break reading }
                    count += 1
                }
            }
            good.append(count)
            Glibc.close(far)
        }
        reader.start()
        for _ in 0..<4 {
            Thread { for _ in 0..<100 { try? connection.send(body: Array(frame.utf8)) } }.start()
        }
        #expect(try await good.wait(count: 1, timeout: .seconds(20)) == [400])
        connection.close()
    }
}
