import Foundation
import Glibc

/// What a finished `fluxctl` run printed and how it exited.
struct FluxctlResult: Sendable, CustomStringConvertible {
    var status: Int32
    var stdout: String
    var stderr: String
    var lines: [String] { stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init) }
    var description: String { "exit \(status)\nstdout:\n\(stdout)stderr:\n\(stderr)" }
}

/// The built `fluxctl` as a real process: stdout and stderr are pipes read on threads of their own, stdin is a
/// pipe (closed at once unless `stdin` text is given). `wait(forLine:)` waits with a deadline for output;
/// `finish()` waits for the exit; `cleanup()` (SIGKILL if still running) always ends it.
final class FluxctlProcess: @unchecked Sendable {
    // @unchecked: `lock` guards the buffers; the process is driven by one test.
    let process = Process()
    private let lock = NSCondition()
    private var out: [UInt8] = []
    private var err: [UInt8] = []
    private var openStreams = 2
    private let exited = DispatchSemaphore(value: 0)
    private var hasExited = false

    /// Starts `fluxctl arguments`; `socket` is passed as `FLUXBUS_SOCKET` (nil: unset), `environment` is added and
    /// the variables in `unsetting` are removed.
    init(_ arguments: [String], socket: String?, environment: [String: String] = [:], unsetting: [String] = [],
         stdin: String? = nil) throws {
        process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: "fluxctl"))
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env["FLUXBUS_SOCKET"] = socket
        env["NO_COLOR"] = nil
        env["CLICOLOR_FORCE"] = nil
        env["COLUMNS"] = "80"
        for (k, v) in environment { env[k] = v }
        for k in unsetting { env[k] = nil }
        process.environment = env
        let outPipe = Pipe(), errPipe = Pipe(), inPipe = Pipe()
        process.standardOutput = outPipe
        process.standardError = errPipe
        process.standardInput = inPipe
        let semaphore = exited
        process.terminationHandler = { _ in semaphore.signal() }
        try process.run()
        try? outPipe.fileHandleForWriting.close()
        try? errPipe.fileHandleForWriting.close()
        startReader(outPipe.fileHandleForReading.fileDescriptor, isStdout: true)
        startReader(errPipe.fileHandleForReading.fileDescriptor, isStdout: false)
        let writer = inPipe.fileHandleForWriting
        if let stdin { writer.write(Data(stdin.utf8)) }
        try? writer.close()
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    private func startReader(_ fd: Int32, isStdout: Bool) {
        let thread = Thread { [self] in
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                lock.lock()
                if n > 0 {
                    if isStdout { out += chunk[..<n] } else { err += chunk[..<n] }
                } else {
                    openStreams -= 1
                }
                lock.broadcast()
                lock.unlock()
                if n <= 0 { return }
            }
        }
        thread.start()
    }

    var stdout: String { lock.lock(); defer { lock.unlock() }; return String(decoding: out, as: UTF8.self) }
    var stderr: String { lock.lock(); defer { lock.unlock() }; return String(decoding: err, as: UTF8.self) }

    /// Waits (off the cooperative pool) until stdout satisfies `predicate`; throws on deadline or when the
    /// process closed stdout first.
    func wait(_ what: String, timeout: Duration = .seconds(20), until predicate: @escaping @Sendable (String) -> Bool) async throws {
        try await offPool { try self.waitBlocking(what, timeout: timeout, until: predicate) }
    }

    func waitBlocking(_ what: String, timeout: Duration, until predicate: (String) -> Bool) throws {
        let deadline = Date().addingTimeInterval(Double(timeout.components.seconds))
        lock.lock()
        defer { lock.unlock() }
        while true {
            let text = String(decoding: out, as: UTF8.self)
            if predicate(text) { return }
            if openStreams == 0 {
                throw HarnessError.unexpectedOutput("fluxctl ended before \(what); stdout:\n\(text)stderr:\n\(String(decoding: err, as: UTF8.self))")
            }
            if !lock.wait(until: deadline) {
                throw HarnessError.timedOut("\(what); fluxctl stdout so far:\n\(text)stderr:\n\(String(decoding: err, as: UTF8.self))")
            }
        }
    }

    /// Sends a signal (only while the process has not been reaped).
    func send(signal: Int32) {
        if !hasExited && process.isRunning { kill(process.processIdentifier, signal) }
    }

    /// Waits for the exit and for both output streams to close; returns the result. Throws on deadline.
    func finish(timeout: Duration = .seconds(20)) async throws -> FluxctlResult {
        try await offPool { try self.finishBlocking(timeout: timeout) }
    }

    func finishBlocking(timeout: Duration) throws -> FluxctlResult {
        let seconds = Double(timeout.components.seconds)
        if !hasExited {
            guard exited.wait(timeout: .now() + seconds) == .success else {
                throw HarnessError.timedOut("fluxctl \(process.arguments ?? []) to exit; stdout:\n\(stdout)stderr:\n\(stderr)")
            }
            hasExited = true
        }
        let deadline = Date().addingTimeInterval(seconds)
        lock.lock()
        while openStreams > 0 {
            if !lock.wait(until: deadline) { break }
        }
        lock.unlock()
        return FluxctlResult(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    /// Kills the process if it still runs and reaps it.
    func cleanup() {
        guard !hasExited else { return }
        send(signal: SIGKILL)
        if exited.wait(timeout: .now() + 10) == .success { hasExited = true }
    }
}

/// Runs `fluxctl arguments` to completion (deadline 20 s) and returns what it printed and its exit status.
func fluxctl(_ arguments: [String], socket: String?, environment: [String: String] = [:], stdin: String? = nil) async throws -> FluxctlResult {
    let p = try FluxctlProcess(arguments, socket: socket, environment: environment, stdin: stdin)
    defer { p.cleanup() }
    return try await p.finish()
}

extension Bus {
    /// Runs fluxctl against this bus.
    func ctl(_ arguments: String..., stdin: String? = nil, environment: [String: String] = [:]) async throws -> FluxctlResult {
        try await fluxctl(arguments, socket: socketPath, environment: environment, stdin: stdin)
    }
}
