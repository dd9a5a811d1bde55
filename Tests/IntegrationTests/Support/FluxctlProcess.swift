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
/// `finish()` waits for the exit; `cleanup()` (SIGKILL if still running) always ends it. Each wait has an `async`
/// form that suspends and a blocking one (`...Blocking`) for synchronous tests.
final class FluxctlProcess: @unchecked Sendable {
    // @unchecked: the process is driven by one test; the pipe readers and the exit watch are thread-safe.
    let process = Process()
    private let out: PipeReader
    private let err: PipeReader
    private let exit = ExitWatch()

    /// Starts `fluxctl arguments`; `socket` is passed as `FLUXBUS_SOCKET` (nil: unset), `environment` is added and
    /// the variables in `unsetting` are removed. `launcher`: a command fluxctl runs under (e.g. setpriv as another
    /// uid), its first element the executable.
    init(_ arguments: [String], socket: String?, environment: [String: String] = [:], unsetting: [String] = [],
         stdin: String? = nil, launcher: [String] = []) throws {
        let fluxctl = try BuiltProducts.path(of: "fluxctl")
        if let first = launcher.first {
            process.executableURL = URL(fileURLWithPath: first)
            process.arguments = Array(launcher.dropFirst()) + [fluxctl] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: fluxctl)
            process.arguments = arguments
        }
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
        process.terminationHandler = exit.terminationHandler
        try process.run()
        try? outPipe.fileHandleForWriting.close()
        try? errPipe.fileHandleForWriting.close()
        out = PipeReader(outPipe.fileHandleForReading, keepAlive: outPipe)
        err = PipeReader(errPipe.fileHandleForReading, keepAlive: errPipe)
        let writer = inPipe.fileHandleForWriting
        if let stdin { writer.write(Data(stdin.utf8)) }
        try? writer.close()
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    var stdout: String { out.text }
    var stderr: String { err.text }

    /// Waits (suspended) until stdout satisfies `predicate`; throws on deadline or when the process closed stdout
    /// first.
    func wait(_ what: String, timeout: Duration = .seconds(20), until predicate: @escaping @Sendable (String) -> Bool) async throws {
        _ = await out.output.wait(timeout: timeout) { $0.ended || predicate($0.text) }
        try checkOutput(what, predicate)
    }

    /// `wait` for synchronous tests (blocks).
    func waitBlocking(_ what: String, timeout: Duration, until predicate: (String) -> Bool) throws {
        _ = out.output.waitBlocking(until: .now + timeout) { $0.ended || predicate($0.text) }
        try checkOutput(what, predicate)
    }

    private func checkOutput(_ what: String, _ predicate: (String) -> Bool) throws {
        let output = out.output.value
        if predicate(output.text) { return }
        if output.ended {
            throw HarnessError.unexpectedOutput("fluxctl ended before \(what); stdout:\n\(output.text)stderr:\n\(stderr)")
        }
        throw HarnessError.timedOut("\(what); fluxctl stdout so far:\n\(output.text)stderr:\n\(stderr)")
    }

    /// Sends a signal (only while the process has not been reaped).
    func send(signal: Int32) {
        if !exit.hasExited && process.isRunning { kill(process.processIdentifier, signal) }
    }

    /// Waits (suspended) for the exit and for both output streams to close; returns the result. Throws on deadline.
    func finish(timeout: Duration = .seconds(20)) async throws -> FluxctlResult {
        let timeout = timeout * underASan
        guard await exit.wait(timeout: timeout) else { throw exitTimeout() }
        _ = await out.output.wait(timeout: timeout) { $0.ended }
        _ = await err.output.wait(timeout: timeout) { $0.ended }
        return result
    }

    /// `finish` for synchronous tests (blocks).
    func finishBlocking(timeout: Duration) throws -> FluxctlResult {
        let timeout = timeout * underASan
        guard exit.waitBlocking(timeout: timeout) else { throw exitTimeout() }
        let deadline = ContinuousClock.now + timeout
        _ = out.output.waitBlocking(until: deadline) { $0.ended }
        _ = err.output.waitBlocking(until: deadline) { $0.ended }
        return result
    }

    private var result: FluxctlResult {
        FluxctlResult(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    private func exitTimeout() -> HarnessError {
        .timedOut("fluxctl \(process.arguments ?? []) to exit; stdout:\n\(stdout)stderr:\n\(stderr)")
    }

    /// Kills the process if it still runs and reaps it. Blocks only when it had not exited yet (after a failure).
    func cleanup() {
        guard !exit.hasExited else { return }
        send(signal: SIGKILL)
        _ = exit.waitBlocking(timeout: .seconds(10))
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
