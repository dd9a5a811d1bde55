import FluxCore
import Foundation
import Glibc
import Testing

/// fluxd as a process: startup, the socket file, refusing a live socket, signals and clean shutdown.
@Suite("fluxd process", .onDedicatedThreads)
struct FluxdProcessTests {
    @Test("prints exactly one ready line naming the socket, which is a socket")
    func readyLine() throws {
        try withFluxd { fluxd in
            #expect(fluxd.readyLine == "fluxd ready on \(fluxd.socketPath)")
            let mode = try #require(fileMode(fluxd.socketPath))
            #expect(mode & S_IFMT == S_IFSOCK)
        }
    }

    @Test("socket mode is 0600 by default (an explicit path's directory must exist: SocketSecurityTests)")
    func socketModeDefault() throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let socketPath = dir.path + "/fluxd.sock"
        try withFluxd(socketPath: socketPath) { _ in
            let socketMode = try #require(fileMode(socketPath))
            #expect(socketMode & 0o777 == 0o600)
        }
    }

    @Test("--socket-mode sets the socket file's mode")
    func socketModeOption() throws {
        try withFluxd(["--socket-mode", "660"]) { fluxd in
            let mode = try #require(fileMode(fluxd.socketPath))
            #expect(mode & 0o777 == 0o660)
        }
    }

    @Test("a second fluxd on a live socket refuses to start and leaves the first alone")
    func secondInstanceRefuses() throws {
        try withFluxd { first in
            let second = try Fluxd(socketPath: first.socketPath)
            defer { second.cleanup() }
            let status = try #require(second.waitForExit(timeout: .seconds(20)), "second fluxd did not exit")
            #expect(second.exitedNormally)
            #expect(status != 0)
            #expect(second.stderr.contains("another fluxd is listening on \(first.socketPath)"))
            // The first one still owns the path and still answers.
            let mode = try #require(fileMode(first.socketPath))
            #expect(mode & S_IFMT == S_IFSOCK)
            let peer = try RawPeer(connectingTo: first.socketPath)
            #expect(try peer.handshake()["op"] as? String == "welcome")
        }
    }

    @Test("a stale socket file is replaced")
    func staleSocket() throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let socketPath = dir.path + "/fluxd.sock"
        try makeStaleSocket(at: socketPath)
        // Nobody listens there: connecting is refused.
        let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #expect(connectUnix(probe, socketPath) == -1 && errno == ECONNREFUSED)
        close(probe)
        try withFluxd(socketPath: socketPath) { _ in
            let peer = try RawPeer(connectingTo: socketPath)
            #expect(try peer.handshake()["op"] as? String == "welcome")
        }
    }

    @Test("a path that is not a socket is neither used nor removed")
    func notASocket() throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let path = dir.path + "/fluxd.sock"
        try Data("keep me".utf8).write(to: URL(fileURLWithPath: path))
        let fluxd = try Fluxd(socketPath: path)
        defer { fluxd.cleanup() }
        let status = try #require(fluxd.waitForExit(timeout: .seconds(20)))
        #expect(fluxd.exitedNormally)
        #expect(status != 0)
        #expect(fluxd.stderr.contains("is not a socket"))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "keep me")
    }

    @Test("a socket that cannot be bound makes fluxd exit non-zero with a message")
    func cannotBind() throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let file = dir.path + "/file"
        try Data().write(to: URL(fileURLWithPath: file))
        let fluxd = try Fluxd(socketPath: file + "/fluxd.sock") // parent is a regular file
        defer { fluxd.cleanup() }
        let status = try #require(fluxd.waitForExit(timeout: .seconds(20)))
        #expect(fluxd.exitedNormally) // a clean exit: no leaked-handle assertion on the failure path
        #expect(status != 0)
        #expect(fluxd.stderr.contains("fluxd: error: cannot listen on \(file)/fluxd.sock"))
        #expect(fluxd.readyLine == nil)
    }

    @Test("SIGTERM and SIGINT: exit 0 and the socket file is removed", arguments: [SIGTERM, SIGINT])
    func signalShutdown(signal: Int32) throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            fluxd.send(signal: signal)
            let status = try #require(fluxd.waitForExit(timeout: .seconds(20)), "fluxd did not exit")
            #expect(fluxd.exitedNormally)
            #expect(status == 0)
            #expect(fileMode(fluxd.socketPath) == nil)
            #expect(fluxd.stderr.contains("stopped"))
        }
    }

    @Test("the socket path honours FLUXBUS_SOCKET when --socket is absent")
    func environmentSocket() throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let socketPath = dir.path + "/env.sock"
        var environment = ProcessInfo.processInfo.environment
        environment["FLUXBUS_SOCKET"] = socketPath
        let fluxd = try Fluxd(socketPath: socketPath, passSocket: false, environment: environment)
        defer { fluxd.cleanup() }
        #expect(try fluxd.waitForReady() == "fluxd ready on \(socketPath)")
        let mode = try #require(fileMode(socketPath))
        #expect(mode & S_IFMT == S_IFSOCK)
    }

    @Test("bad options are refused")
    func badOptions() throws {
        let fluxd = try Fluxd(arguments: ["--socket-mode", "9x"])
        defer { fluxd.cleanup() }
        let status = try #require(fluxd.waitForExit(timeout: .seconds(20)))
        #expect(status != 0)
        #expect(fluxd.stderr.contains("--socket-mode"))
        #expect(fileMode(fluxd.socketPath) == nil)
    }
}
