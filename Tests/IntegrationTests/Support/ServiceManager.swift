import Foundation
import Glibc

// systemd's side of its two protocols with fluxd, played by a test without systemd (docs/systemd.md):
// `NotifySocket` receives what fluxd sends to NOTIFY_SOCKET; `listeningSocket(at:)` + `ActivatedFluxd` pass fluxd
// a listening socket as file descriptor 3 with LISTEN_FDS/LISTEN_PID, as socket activation does.

/// The `AF_UNIX SOCK_DGRAM` socket a service manager names in `NOTIFY_SOCKET`: a path, or an abstract name
/// (`@...`). Synchronous (tests using it run `.onDedicatedThreads`). Closes (and unlinks a path) on `close()`/deinit.
final class NotifySocket {
    /// What to put in `NOTIFY_SOCKET`.
    let address: String
    private var fd: Int32

    init(address: String) throws {
        self.address = address
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError.system("socket", errno) }
        var sockaddr = sockaddr_un()
        sockaddr.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(address.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        withUnsafeMutableBytes(of: &sockaddr.sun_path) { $0.copyBytes(from: bytes) }
        let length = MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1)
        let rc = withUnsafePointer(to: &sockaddr) {
            $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(length)) }
        }
        guard rc == 0 else {
            let code = errno
            Glibc.close(fd)
            throw HarnessError.system("bind \(address)", code)
        }
    }

    deinit { close() }

    func close() {
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
        if address.hasPrefix("/") { unlink(address) }
    }

    /// A new close-on-exec descriptor of the same socket (above 3), or -1 with errno set.
    func duplicateDescriptor() -> Int32 { fcntl(fd, F_DUPFD_CLOEXEC, 64) }

    /// The next message's fields (`NAME=value` per line), or nil when `timeout` passes first.
    func next(timeout: Duration) throws -> [String: String]? {
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 4096)
        switch try readWithDeadline(fd: fd, into: &buffer, deadline: deadline) {
        case .bytes(let n):
            var fields: [String: String] = [:]
            for line in String(decoding: buffer[..<n], as: UTF8.self).split(separator: "\n") {
                guard let equals = line.firstIndex(of: "=") else { continue }
                fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
            }
            return fields
        case .eof, .timeout:
            return nil
        }
    }

    /// Messages until one satisfies `accept` (returned with those before it), or nil when `timeout` passes.
    func next(timeout: Duration, until accept: ([String: String]) -> Bool) throws -> (message: [String: String], before: [[String: String]])? {
        let deadline = ContinuousClock.now + timeout
        var before: [[String: String]] = []
        while let message = try next(timeout: deadline - ContinuousClock.now) {
            if accept(message) { return (message, before) }
            before.append(message)
        }
        return nil
    }
}

/// A listening `AF_UNIX SOCK_STREAM` socket bound to `path` (what systemd makes for a `.socket` unit), on a
/// descriptor above 3 and close-on-exec: only a child that is given it explicitly gets it.
func listeningSocket(at path: String) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw HarnessError.system("socket", errno) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard rc == 0, listen(fd, 64) == 0 else {
        let code = errno
        Glibc.close(fd)
        throw HarnessError.system("bind/listen \(path)", code)
    }
    // Well above 3, so that dup2 onto 3 in the child always makes a new, inheritable descriptor.
    let high = fcntl(fd, F_DUPFD_CLOEXEC, 64)
    let code = errno
    Glibc.close(fd)
    guard high >= 0 else { throw HarnessError.system("fcntl F_DUPFD_CLOEXEC", code) }
    return high
}

/// fluxd started the way systemd starts a socket-activated service: `descriptor` becomes its file descriptor 3,
/// `LISTEN_FDS=1`, and `LISTEN_PID` is its own pid. The pid is known only after the fork, so a shell sets it and
/// execs fluxd in its place (`sh -c 'LISTEN_PID=$$ exec fluxd ...'`: the same pid). Spawned with `posix_spawn`
/// (Foundation's `Process` closes every descriptor above 2 in the child). Its stdout is read on a thread of its own
/// (the ready line), stderr goes to a file, and a thread waits for its exit. `stop()`/`cleanup()` end it
/// (SIGTERM, SIGKILL after a deadline); deinit is a safety net. The temp directory is the caller's.
final class ActivatedFluxd: @unchecked Sendable {
    // @unchecked: immutable after init but for `status` (a Watched, thread-safe) and the pipe reader (thread-safe).
    let pid: pid_t
    private let stdout: PipeReader
    private let stderrPath: String
    /// The exit status (`waitpid`'s) once it ended.
    private let status = Watched<Int32?>(nil)

    /// Starts fluxd with `descriptor` as fd 3 and `arguments` (`--ephemeral` unless a durability is chosen);
    /// `listenPID` overrides the pid put in `LISTEN_PID` (nil: fluxd's own).
    init(descriptor: Int32, arguments: [String] = [], directory: String, listenPID: String? = nil,
         extraEnvironment: [String: String] = [:]) throws {
        let fluxd = try BuiltProducts.path(of: "fluxd")
        stderrPath = directory + "/stderr-\(UUID().uuidString.prefix(8)).log"
        let chosen = arguments.contains("--ephemeral") || arguments.contains("--data-dir")
        let fluxdArguments = (chosen ? [] : ["--ephemeral"]) + arguments
        let script = listenPID.map { "LISTEN_PID=\($0) exec \"$0\" \"$@\"" } ?? #"LISTEN_PID=$$ exec "$0" "$@""#
        let argv = ["/bin/sh", "-c", script, fluxd] + fluxdArguments
        var environment = ProcessInfo.processInfo.environment
        for name in ["NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "FLUXBUS_SOCKET"] {
            environment[name] = nil
        }
        environment["LISTEN_FDS"] = "1"
        environment["LISTEN_FDNAMES"] = "fluxd.socket"
        for (key, value) in extraEnvironment { environment[key] = value }
        let envp = environment.map { "\($0.key)=\($0.value)" }

        var pipeFDs: [Int32] = [-1, -1]
        // pipe2 is not exported by Swift's Glibc; a child spawned meanwhile by another test (Foundation's Process)
        // closes every descriptor above 2 anyway.
        guard pipe(&pipeFDs) == 0 else { throw HarnessError.system("pipe", errno) }
        for fd in pipeFDs { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_adddup2(&actions, descriptor, 3)
        var child: pid_t = 0
        let rc = withCStrings(argv) { argvPointers in
            withCStrings(envp) { envPointers in
                posix_spawn(&child, "/bin/sh", &actions, nil, argvPointers, envPointers)
            }
        }
        Glibc.close(pipeFDs[1])
        guard rc == 0 else {
            Glibc.close(pipeFDs[0])
            throw HarnessError.system("posix_spawn", rc)
        }
        pid = child
        stdout = PipeReader(FileHandle(fileDescriptor: pipeFDs[0], closeOnDealloc: false))
        let status = self.status
        let spawned = child
        let thread = Thread {
            var raw: Int32 = 0
            while waitpid(spawned, &raw, 0) < 0 && errno == EINTR {}
            status.update { $0 = raw }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    deinit { cleanup() }

    /// Everything fluxd wrote to stderr so far.
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Waits for fluxd's ready line; throws if it exits first or the deadline passes.
    @discardableResult
    func waitForReady(timeout: Duration = .seconds(20)) throws -> String {
        switch stdout.nextLineBlocking(deadline: .now + timeout, where: { _ in true }) {
        case .line(let line): return line
        case .eof: throw HarnessError.exitedBeforeReady(status: waitForExit(timeout: .seconds(5)) ?? -1, stderr: stderr)
        case .timeout: throw HarnessError.timedOut("fluxd ready line (stderr so far:\n\(stderr))")
        }
    }

    /// Its exit code (128 + signal if a signal ended it), or nil when `timeout` passes first.
    func waitForExit(timeout: Duration) -> Int32? {
        guard status.waitBlocking(until: .now + timeout, { $0 != nil }), let raw = status.value else { return nil }
        let signal = raw & 0x7f
        return signal == 0 ? (raw >> 8) & 0xff : 128 + signal
    }

    /// SIGTERM, then SIGKILL after `timeout`; returns the exit code after SIGTERM (nil when it had to be killed).
    @discardableResult
    func stop(timeout: Duration = .seconds(10)) -> Int32? {
        signal(SIGTERM)
        if let code = waitForExit(timeout: timeout) { return code }
        signal(SIGKILL)
        _ = waitForExit(timeout: .seconds(10))
        return nil
    }

    /// Sends `number` unless it was reaped (the reaper is ours: the pid cannot be reused before).
    func signal(_ number: Int32) {
        if status.value == nil { kill(pid, number) }
    }

    /// Ends it if it still runs. Idempotent.
    func cleanup() {
        if status.value == nil { _ = stop(timeout: .seconds(5)) }
    }
}

/// Calls `body` with a NULL-terminated array of C strings (argv/envp).
private func withCStrings<R>(_ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> R) -> R {
    let pointers = strings.map { strdup($0) } + [nil]
    defer { for pointer in pointers { free(pointer) } }
    return body(pointers)
}
