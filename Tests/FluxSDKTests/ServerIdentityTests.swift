import FluxClient
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The client's check of who listens on fluxd's socket: the pure rule, then the wiring in `SocketConnection` against
/// a plain listening socket of this process.
@Suite("Server uid check")
struct ServerIdentityTests {
    @Test("expected uid: explicit, else FLUXBUS_SERVER_UID, else 0 for root, else none")
    func expectedUID() throws {
        #expect(try expectedServerUID(explicit: 7, environmentValue: "1000", clientEUID: 0) == 7)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "1000", clientEUID: 0) == 1000)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "1000", clientEUID: 1000) == 1000)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "0", clientEUID: 1000) == 0)
        #expect(try expectedServerUID(explicit: nil, environmentValue: nil, clientEUID: 0) == 0)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "", clientEUID: 0) == 0)
        #expect(try expectedServerUID(explicit: nil, environmentValue: nil, clientEUID: 1000) == nil)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "", clientEUID: 1000) == nil)
        #expect(try expectedServerUID(explicit: nil, environmentValue: "4294967295", clientEUID: 1000) == 4_294_967_295)
    }

    @Test("a FLUXBUS_SERVER_UID that is not a decimal uid is an error, not 'no check'",
          arguments: ["root", "-1", "+5", " 5", "5 ", "0x10", "4294967296", "1e3"])
    func badEnvironmentValue(value: String) {
        #expect(throws: FluxError.self) {
            _ = try expectedServerUID(explicit: nil, environmentValue: value, clientEUID: 1000)
        }
    }

    @Test("the check: no expectation or the same uid passes; another uid is refused with a message saying how to accept it")
    func check() {
        #expect(checkServerUID(1000, expected: nil, path: "/p") == nil)
        #expect(checkServerUID(0, expected: 0, path: "/p") == nil)
        let refusal = checkServerUID(1000, expected: 0, path: "/run/fluxbus/fluxd.sock")
        #expect(refusal == .untrustedServer(path: "/run/fluxbus/fluxd.sock", uid: 1000, expected: 0))
        #expect(refusal?.description
                == "fluxd at /run/fluxbus/fluxd.sock is run by uid 1000, expected 0; set FLUXBUS_SERVER_UID=1000 to accept")
    }

    @Test("SocketConnection reads the listener's uid and refuses an unexpected one before anything is sent")
    func wiring() throws {
        let dir = "/tmp/fluxsdk-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        #expect(mkdir(dir, 0o700) == 0)
        defer { rmdir(dir) }
        let path = dir + "/listener.sock"
        let listener = try listeningSocket(at: path)
        defer { Glibc.close(listener); unlink(path) }

        let me = UInt32(geteuid())
        let accepted = try SocketConnection(path: path, expectedServerUID: me)
        #expect(accepted.serverUID == me)
        #expect(accepted.serverPID == getpid())
        accepted.close()

        let other: UInt32 = me == 4242 ? 4243 : 4242
        do {
            _ = try SocketConnection(path: path, expectedServerUID: other)
            Issue.record("a listener run by uid \(me) was accepted while \(other) was expected")
        } catch {
            #expect(error == .untrustedServer(path: path, uid: me, expected: other))
        }
    }

    private func listeningSocket(at path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw FluxError.io(operation: "socket", errno: errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, listen(fd, 8) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw FluxError.io(operation: "bind/listen", errno: code)
        }
        return fd
    }
}
