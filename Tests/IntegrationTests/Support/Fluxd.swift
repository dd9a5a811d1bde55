import Foundation
import Glibc

/// Failures of the process-test harness.
enum HarnessError: Error, CustomStringConvertible {
    case executableNotFound(String)
    case timedOut(String)
    case exitedBeforeReady(status: Int32, stderr: String)
    case unexpectedOutput(String)
    case system(String, Int32)

    var description: String {
        switch self {
        case .executableNotFound(let path): return "executable not found: \(path) (build the package first)"
        case .timedOut(let what): return "timed out: \(what)"
        case .exitedBeforeReady(let status, let stderr): return "fluxd exited (\(status)) before it was ready; stderr:\n\(stderr)"
        case .unexpectedOutput(let text): return "unexpected output: \(text)"
        case .system(let call, let code): return "\(call): \(String(cString: strerror(code)))"
        }
    }
}

/// The package's built executables: they sit next to the test binary (the directory of `/proc/self/exe`, also
/// with `--scratch-path` and in release builds).
enum BuiltProducts {
    static let directory: String = {
        guard let resolved = realpath("/proc/self/exe", nil) else { return "." }
        defer { free(resolved) }
        return (String(cString: resolved) as NSString).deletingLastPathComponent
    }()

    static func path(of name: String) throws -> String {
        let path = directory + "/" + name
        guard access(path, X_OK) == 0 else { throw HarnessError.executableNotFound(path) }
        return path
    }
}

/// A private temporary directory (short path: socket paths must fit in 107 bytes). Removed by `remove()`.
final class TempDirectory: @unchecked Sendable {
    let path: String

    init(prefix: String = "fluxit") throws {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
            throw HarnessError.system("mkdtemp", errno)
        }
        path = String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// A `fluxd` process started by a test: its own temp directory, socket path, stdout pipe (for the ready line, read
/// on a thread of its own) and stderr file. Cleanup (SIGTERM, SIGKILL after a deadline, remove the temp dir) runs in
/// `cleanup()` or `shutDown()`, which `withFluxd` always calls and `deinit` calls as a safety net.
///
/// Each wait has a blocking form for synchronous tests and an `async` one (same name) that suspends instead.
final class Fluxd: @unchecked Sendable {
    // @unchecked: driven by one test; the pipe reader and the exit watch are thread-safe; `lock` guards the rest.
    let directory: TempDirectory
    let socketPath: String
    let process = Process()
    private let stdout: PipeReader
    private let stderrPath: String
    private let exit = ExitWatch()
    private let lock = NSLock()
    private var storedReadyLine: String?
    private var cleanedUp = false

    /// Starts fluxd with `arguments` (plus `--socket <socketPath>` unless `passSocket` is false). The default socket
    /// path lies in a fresh temp directory. Does not wait for the ready line. With a `launcher` (e.g.
    /// `["/usr/bin/setpriv", "--reuid", "4242", ...]`) fluxd's path and arguments are appended to it and it is run
    /// instead (it must exec fluxd, so that the pid is fluxd's). fluxd runs `--ephemeral` unless `dataDirectory`
    /// is given (a durable fluxd journaling there) or the arguments choose: nothing is written outside the test's
    /// temporary folders.
    init(arguments: [String] = [], socketPath: String? = nil, passSocket: Bool = true,
         environment: [String: String]? = nil, launcher: [String] = [], dataDirectory: String? = nil) throws {
        directory = try TempDirectory()
        self.socketPath = socketPath ?? directory.path + "/fluxd.sock"
        stderrPath = directory.path + "/stderr.log"
        do {
            let chosen = arguments.contains("--ephemeral") || arguments.contains("--data-dir")
            let durability = chosen ? [] : dataDirectory.map { ["--data-dir", $0] } ?? ["--ephemeral"]
            let fluxdArguments = (passSocket ? ["--socket", self.socketPath] : []) + durability + arguments
            if let program = launcher.first {
                process.executableURL = URL(fileURLWithPath: program)
                process.arguments = Array(launcher.dropFirst()) + [try BuiltProducts.path(of: "fluxd")] + fluxdArguments
            } else {
                process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: "fluxd"))
                process.arguments = fluxdArguments
            }
            if let environment { process.environment = environment }
            stdout = try launchProcess(process, stderrPath: stderrPath, exit: exit)
        } catch {
            directory.remove()
            throw error
        }
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    /// Everything fluxd wrote to stderr so far.
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// The line fluxd printed when ready (after `waitForReady`).
    var readyLine: String? { lock.withLock { storedReadyLine } }

    /// Waits for the ready line on stdout; throws if fluxd exits first or the deadline passes. Blocks.
    @discardableResult
    func waitForReady(timeout: Duration = .seconds(20)) throws -> String {
        if let readyLine { return readyLine }
        return try ready(stdout.nextLineBlocking(deadline: .now + timeout) { _ in true }, exitStatus: {
            self.waitForExit(timeout: .seconds(5))
        })
    }

    /// Waits for the ready line on stdout; throws if fluxd exits first or the deadline passes. Suspends.
    @discardableResult
    func waitForReady(timeout: Duration = .seconds(20)) async throws -> String {
        if let readyLine { return readyLine }
        let outcome = await stdout.nextLine(timeout: timeout) { _ in true }
        let status = outcome == .eof ? await waitForExit(timeout: .seconds(5)) : nil
        return try ready(outcome, exitStatus: { status })
    }

    private func ready(_ outcome: PipeReader.LineOutcome, exitStatus: () -> Int32?) throws -> String {
        switch outcome {
        case .line(let line):
            lock.withLock { storedReadyLine = line }
            return line
        case .eof:
            throw HarnessError.exitedBeforeReady(status: exitStatus() ?? -1, stderr: stderr)
        case .timeout:
            throw HarnessError.timedOut("fluxd ready line (stderr so far:\n\(stderr))")
        }
    }

    /// Waits until the process exits; returns its exit status (or the signal number if a signal killed it, see
    /// `terminationReason`), nil when the deadline passes. Blocks.
    func waitForExit(timeout: Duration) -> Int32? {
        exit.waitBlocking(timeout: timeout * underASan) ? process.terminationStatus : nil
    }

    /// Waits until the process exits; returns its exit status, nil when the deadline passes. Suspends.
    func waitForExit(timeout: Duration) async -> Int32? {
        await exit.wait(timeout: timeout * underASan) ? process.terminationStatus : nil
    }

    /// Whether fluxd ended by calling exit (as opposed to being killed by a signal). Valid after it exited.
    var exitedNormally: Bool { process.terminationReason == .exit }

    /// Sends a signal to fluxd.
    func send(signal: Int32) {
        // hasExited turns true when Foundation reaps the child, so a recycled pid is never signalled.
        if !exit.hasExited && process.isRunning { kill(process.processIdentifier, signal) }
    }

    /// How long `stop` waits for fluxd to exit after SIGTERM by default (times `underASan`, as every wait for a
    /// process's exit).
    static let stopTimeout: Duration = .seconds(10)

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status after SIGTERM (nil if it had to be
    /// killed). Blocks.
    @discardableResult
    func stop(timeout: Duration = Fluxd.stopTimeout) -> Int32? {
        send(signal: SIGTERM)
        if let status = waitForExit(timeout: timeout) { return status }  // (times underASan)
        send(signal: SIGKILL)
        _ = waitForExit(timeout: .seconds(10))
        return nil
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status after SIGTERM (nil if it had to be
    /// killed). Suspends.
    @discardableResult
    func stop(timeout: Duration = Fluxd.stopTimeout) async -> Int32? {
        send(signal: SIGTERM)
        if let status = await waitForExit(timeout: timeout) { return status }
        send(signal: SIGKILL)
        _ = await waitForExit(timeout: .seconds(10))
        return nil
    }

    /// Ends the process if still running and removes the temp directory. Idempotent. Blocks (briefly: fluxd stops
    /// at once on SIGTERM); async code calls `shutDown()`.
    func cleanup() {
        guard beginCleanup() else { return }
        if !exit.hasExited { _ = stop(timeout: .seconds(5)) }
        directory.remove()
    }

    /// `cleanup()` for async code: suspends while fluxd stops.
    func shutDown() async {
        guard beginCleanup() else { return }
        if !exit.hasExited { _ = await stop(timeout: .seconds(5)) }
        directory.remove()
    }

    private func beginCleanup() -> Bool {
        lock.withLock {
            defer { cleanedUp = true }
            return !cleanedUp
        }
    }
}

/// Starts fluxd, waits for its ready line, runs `body`, and always cleans up (also when `body` throws or an
/// expectation fails).
func withFluxd<T>(
    _ arguments: [String] = [], socketPath: String? = nil, _ body: (Fluxd) throws -> T
) throws -> T {
    let fluxd = try Fluxd(arguments: arguments, socketPath: socketPath)
    defer { fluxd.cleanup() }
    try fluxd.waitForReady()
    return try body(fluxd)
}

/// Points `process`'s stdout at a new pipe (read by the returned reader), its stderr at a new file `stderrPath` and
/// its stdin at /dev/null, has `exit` told when it terminates, and runs it.
func launchProcess(_ process: Process, stderrPath: String, exit: ExitWatch) throws -> PipeReader {
    guard FileManager.default.createFile(atPath: stderrPath, contents: nil),
          let stderrHandle = FileHandle(forWritingAtPath: stderrPath) else {
        throw HarnessError.system("create \(stderrPath)", errno)
    }
    let stdout = Pipe()
    process.standardOutput = stdout
    process.standardError = stderrHandle
    process.standardInput = FileHandle.nullDevice
    process.terminationHandler = exit.terminationHandler
    try process.run()
    try? stderrHandle.close()
    // Only the child writes: the reader sees end of stream when it exits.
    try? stdout.fileHandleForWriting.close()
    return PipeReader(stdout.fileHandleForReading, keepAlive: stdout)
}

/// How much longer a test waits for a process to exit under AddressSanitizer (scripts/asan.sh sets FLUXBUS_ASAN):
/// there the suite runs ~10x slower with every test in parallel on 2 cores, and a fluxd that exits within
/// milliseconds natively (a refused start, a SIGTERM) was seen to take past 20 s, with no ASan report. Natively 1.
let underASan: Int = ProcessInfo.processInfo.environment["FLUXBUS_ASAN"] == nil ? 1 : 4
