import Foundation
import Glibc
import Testing

/// fluxd under systemd, with the test playing systemd's side (docs/systemd.md): readiness notification
/// (`NOTIFY_SOCKET`), socket activation (`LISTEN_FDS`/`LISTEN_PID`, the socket as fd 3) and the restart without
/// downtime it allows (issue 17, items 1 and 7).
@Suite("fluxd under systemd", .onDedicatedThreads)
struct SystemdTests {
    @Test("--version prints fluxd and the release version")
    func version() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: "fluxd"))
        process.arguments = ["--version"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(text == "fluxd 0.4.0\n")
    }

    @Test("NOTIFY_SOCKET: READY=1 once a client can connect, with STATUS and MAINPID; STOPPING=1 on SIGTERM",
          arguments: [false, true])
    func readiness(abstract: Bool) throws {
        let dir = try TempDirectory(prefix: "fluxsd")
        defer { dir.remove() }
        let name = abstract ? "@fluxbus-notify-\(getpid())-\(UInt32.random(in: 0...UInt32.max))" : dir.path + "/notify"
        let notify = try NotifySocket(address: name)
        var environment = ProcessInfo.processInfo.environment
        environment["NOTIFY_SOCKET"] = notify.address
        let fluxd = try Fluxd(environment: environment)
        defer { fluxd.cleanup() }

        let ready = try #require(try notify.next(timeout: .seconds(20)) { $0["READY"] == "1" },
                                 "no READY=1; stderr:\n\(fluxd.stderr)")
        // READY=1 promises fluxd serves: a client connects and is welcomed now, without retrying.
        let peer = try RawPeer(connectingTo: fluxd.socketPath)
        let welcome = try peer.handshake()
        #expect(welcome["op"] as? String == "welcome")
        #expect(ready.before.isEmpty, "nothing before READY=1: \(ready.before)")
        #expect(ready.message["STATUS"] == "listening on \(fluxd.socketPath)")
        #expect(ready.message["MAINPID"] == "\(fluxd.pid)")
        #expect(try fluxd.waitForReady() == "fluxd ready on \(fluxd.socketPath)")

        fluxd.send(signal: SIGTERM)
        let stopping = try #require(try notify.next(timeout: .seconds(20)) { $0["STOPPING"] == "1" },
                                    "no STOPPING=1; stderr:\n\(fluxd.stderr)")
        #expect(stopping.message["STATUS"]?.hasPrefix("stopping") == true)
        #expect(fluxd.waitForExit(timeout: .seconds(20)) == 0)
    }

    @Test("NOTIFY_SOCKET: RELOADING=1 then READY=1 around a SIGHUP reload; workers inherit neither NOTIFY_SOCKET nor LISTEN_*")
    func reloadAndWorkerEnvironment() throws {
        let dir = try TempDirectory(prefix: "fluxsd")
        defer { dir.remove() }
        let notify = try NotifySocket(address: dir.path + "/notify")
        let configPath = dir.path + "/fluxd.toml"
        func config(_ tag: String) -> String {
            """
            [workers.env]
            command = "/bin/sh"
            args = ["-c", "echo \(tag) notify=[${NOTIFY_SOCKET-unset}] listen=[${LISTEN_PID-unset}/${LISTEN_FDS-unset}]; exec sleep 600"]
            socket_arg = false
            stop_timeout = 5
            """
        }
        try config("first").write(toFile: configPath, atomically: true, encoding: .utf8)
        var environment = ProcessInfo.processInfo.environment
        environment["NOTIFY_SOCKET"] = notify.address
        // A LISTEN_PID that is not fluxd's: the sockets are not fluxd's, and the variables still go.
        environment["LISTEN_PID"] = "1"
        environment["LISTEN_FDS"] = "1"
        let fluxd = try Fluxd(arguments: ["--config", configPath], environment: environment)
        defer { fluxd.cleanup() }
        _ = try #require(try notify.next(timeout: .seconds(20)) { $0["READY"] == "1" }, "stderr:\n\(fluxd.stderr)")
        let first = try waitForLog(fluxd, "env| first ")
        #expect(first.contains("env| first notify=[unset] listen=[unset/unset]"), "\(first)")

        try config("second").write(toFile: configPath, atomically: true, encoding: .utf8)
        fluxd.send(signal: SIGHUP)
        let reloading = try #require(try notify.next(timeout: .seconds(20)) { $0["RELOADING"] == "1" })
        #expect(UInt64(reloading.message["MONOTONIC_USEC"] ?? "") != nil)
        let again = try #require(try notify.next(timeout: .seconds(20)) { $0["READY"] == "1" })
        #expect(again.message["STATUS"] == "listening on \(fluxd.socketPath); config reloaded")
        _ = try waitForLog(fluxd, "env| second ")

        try "this is [not toml".write(toFile: configPath, atomically: true, encoding: .utf8)
        fluxd.send(signal: SIGHUP)
        _ = try #require(try notify.next(timeout: .seconds(20)) { $0["RELOADING"] == "1" })
        let failed = try #require(try notify.next(timeout: .seconds(20)) { $0["READY"] == "1" })
        #expect(failed.message["STATUS"]?.contains("config reload failed") == true)

        fluxd.send(signal: SIGTERM)
        _ = try #require(try notify.next(timeout: .seconds(20)) { $0["STOPPING"] == "1" })
        #expect(fluxd.waitForExit(timeout: .seconds(20)) == 0)
    }

    @Test("socket activation: fluxd serves fd 3, leaves the socket in place, and the next fluxd serves the clients that waited")
    func socketActivationRestart() throws {
        let dir = try TempDirectory(prefix: "fluxsd")
        defer { dir.remove() }
        let path = dir.path + "/fluxd.sock"
        // systemd's part: it binds and listens, and holds the socket across fluxd's restarts.
        let listener = try listeningSocket(at: path)
        defer { Glibc.close(listener) }

        let first = try ActivatedFluxd(descriptor: listener, directory: dir.path)
        defer { first.cleanup() }
        #expect(try first.waitForReady() == "fluxd ready on \(path)")
        let client = try RawPeer.ready(path, name: "before-restart")
        try client.send(frame: #"{"op":"ping","id":"p1"}"#)
        #expect(try client.expect("pong").string("id") == "p1")
        #expect(first.stop() == 0, "stderr:\n\(first.stderr)")
        #expect(first.stderr.contains("listening on the socket the service manager passed"))
        let mode = try #require(fileMode(path), "fluxd removed the socket systemd owns")
        #expect(mode & S_IFMT == S_IFSOCK)

        // No fluxd serves now: a client still connects (the kernel queues it in the socket's backlog) and says hello.
        let waiting = try RawPeer(connectingTo: path)
        try waiting.send(frame: #"{"op":"hello","protocol":1,"role":"client","name":"during-restart"}"#)

        let second = try ActivatedFluxd(descriptor: listener, directory: dir.path)
        defer { second.cleanup() }
        #expect(try second.waitForReady() == "fluxd ready on \(path)")
        #expect(try waiting.expect("welcome").op == "welcome")
        let after = try RawPeer.ready(path, name: "after-restart")
        try after.send(frame: #"{"op":"ping","id":"p2"}"#)
        #expect(try after.expect("pong").string("id") == "p2")
        #expect(second.stop() == 0, "stderr:\n\(second.stderr)")
        #expect(fileMode(path).map { $0 & S_IFMT == S_IFSOCK } == true)
    }

    @Test("socket activation: --socket must name the socket passed; fd 3 must be a listening Unix stream socket")
    func socketActivationRefusals() throws {
        let dir = try TempDirectory(prefix: "fluxsd")
        defer { dir.remove() }
        let path = dir.path + "/fluxd.sock"
        let listener = try listeningSocket(at: path)
        defer { Glibc.close(listener) }

        // The same path spelled differently is the same socket.
        let same = try ActivatedFluxd(descriptor: listener, arguments: ["--socket", dir.path + "/./fluxd.sock"],
                                      directory: dir.path)
        defer { same.cleanup() }
        #expect(try same.waitForReady() == "fluxd ready on \(path)")
        #expect(same.stop() == 0)

        let other = try ActivatedFluxd(descriptor: listener, arguments: ["--socket", dir.path + "/other.sock"],
                                       directory: dir.path)
        defer { other.cleanup() }
        #expect(other.waitForExit(timeout: .seconds(20)) == 1)
        #expect(other.stderr.contains("is not the socket the service manager passed (file descriptor 3 is bound to \(path))"),
                "\(other.stderr)")
        #expect(fileMode(dir.path + "/other.sock") == nil)

        // A datagram socket is no listener.
        let datagram = try NotifySocket(address: dir.path + "/dgram")
        let dgramFD = try descriptorOf(datagram)
        defer { Glibc.close(dgramFD) }
        let wrong = try ActivatedFluxd(descriptor: dgramFD, directory: dir.path)
        defer { wrong.cleanup() }
        #expect(wrong.waitForExit(timeout: .seconds(20)) == 1)
        #expect(wrong.stderr.contains("socket activation: file descriptor 3 is not a stream (SOCK_STREAM) socket"),
                "\(wrong.stderr)")

        // LISTEN_PID of another process: not for fluxd; it binds its own socket as usual.
        let own = dir.path + "/own.sock"
        let notMine = try ActivatedFluxd(descriptor: listener, arguments: ["--socket", own], directory: dir.path,
                                         listenPID: "1")
        defer { notMine.cleanup() }
        #expect(try notMine.waitForReady() == "fluxd ready on \(own)")
        #expect(notMine.stop() == 0)
        #expect(fileMode(own) == nil, "fluxd's own socket is unlinked on exit")
    }

    /// fluxd's log, once it contains `text` (waits with a deadline).
    private func waitForLog(_ fluxd: Fluxd, _ text: String, timeout: Duration = .seconds(20)) throws -> String {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let log = fluxd.stderr
            if log.contains(text) { return log }
            usleep(20_000) // polling interval, not synchronisation: the text decides
        }
        throw HarnessError.timedOut("fluxd log line containing \"\(text)\"; log:\n\(fluxd.stderr)")
    }

    /// A duplicate of the datagram socket's descriptor (close-on-exec).
    private func descriptorOf(_ socket: NotifySocket) throws -> Int32 {
        let fd = socket.duplicateDescriptor()
        guard fd >= 0 else { throw HarnessError.system("dup", errno) }
        return fd
    }
}
