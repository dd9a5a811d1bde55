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

/// A `fluxd` process started by a test: its own temp directory, socket path, stdout pipe (for the ready line) and
/// stderr file. Cleanup (SIGTERM, SIGKILL after a deadline, remove the temp dir) runs in `cleanup()`, which
/// `withFluxd` always calls and `deinit` calls as a safety net.
final class Fluxd: @unchecked Sendable {
    // @unchecked: used from one test at a time; the termination handler only signals a semaphore.
    let directory: TempDirectory
    let socketPath: String
    let process = Process()
    /// The line fluxd printed when ready (after `waitForReady`).
    private(set) var readyLine: String?
    private let stdout = Pipe()
    private let stderrPath: String
    private let exited = DispatchSemaphore(value: 0)
    private var hasExited = false
    private var cleanedUp = false
    private var stdoutBuffer: [UInt8] = []

    /// Starts fluxd with `arguments` (plus `--socket <socketPath>` unless `passSocket` is false). The default socket
    /// path lies in a fresh temp directory. Does not wait for the ready line. With a `launcher` (e.g.
    /// `["/usr/bin/setpriv", "--reuid", "4242", ...]`) fluxd's path and arguments are appended to it and it is run
    /// instead (it must exec fluxd, so that the pid is fluxd's).
    init(arguments: [String] = [], socketPath: String? = nil, passSocket: Bool = true,
         environment: [String: String]? = nil, launcher: [String] = []) throws {
        directory = try TempDirectory()
        self.socketPath = socketPath ?? directory.path + "/fluxd.sock"
        stderrPath = directory.path + "/stderr.log"
        do {
            let fluxdArguments = (passSocket ? ["--socket", self.socketPath] : []) + arguments
            if let program = launcher.first {
                process.executableURL = URL(fileURLWithPath: program)
                process.arguments = Array(launcher.dropFirst()) + [try BuiltProducts.path(of: "fluxd")] + fluxdArguments
            } else {
                process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: "fluxd"))
                process.arguments = fluxdArguments
            }
            if let environment { process.environment = environment }
            try launchProcess(process, stdout: stdout, stderrPath: stderrPath, exited: exited)
        } catch {
            directory.remove()
            throw error
        }
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    /// Everything fluxd wrote to stderr so far.
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Waits for the ready line on stdout; throws if fluxd exits first or the deadline passes.
    @discardableResult
    func waitForReady(timeout: Duration = .seconds(20)) throws -> String {
        if let readyLine { return readyLine }
        let deadline = ContinuousClock.now + timeout
        switch try nextLine(fd: stdout.fileHandleForReading.fileDescriptor, buffer: &stdoutBuffer, deadline: deadline,
                            where: { _ in true }) {
        case .line(let line):
            readyLine = line
            return line
        case .eof:
            let status = waitForExit(timeout: .seconds(5)) ?? -1
            throw HarnessError.exitedBeforeReady(status: status, stderr: stderr)
        case .timeout:
            throw HarnessError.timedOut("fluxd ready line (stderr so far:\n\(stderr))")
        }
    }

    /// Waits until the process exits; returns its exit status (or the signal number if a signal killed it, see
    /// `terminationReason`), nil when the deadline passes.
    func waitForExit(timeout: Duration) -> Int32? {
        if !hasExited {
            let nanoseconds = timeout.components.seconds * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000
            guard exited.wait(timeout: .now() + .nanoseconds(Int(nanoseconds))) == .success else { return nil }
            hasExited = true
        }
        return process.terminationStatus
    }

    /// Whether fluxd ended by calling exit (as opposed to being killed by a signal). Valid after it exited.
    var exitedNormally: Bool { process.terminationReason == .exit }

    /// Sends a signal to fluxd.
    func send(signal: Int32) {
        // isRunning turns false when Foundation reaps the child, so a recycled pid is never signalled.
        if !hasExited && process.isRunning { kill(process.processIdentifier, signal) }
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit status after SIGTERM (nil if it had to be killed).
    @discardableResult
    func stop(timeout: Duration = .seconds(10)) -> Int32? {
        send(signal: SIGTERM)
        if let status = waitForExit(timeout: timeout) { return status }
        send(signal: SIGKILL)
        _ = waitForExit(timeout: .seconds(10))
        return nil
    }

    /// Ends the process if still running and removes the temp directory. Idempotent.
    func cleanup() {
        guard !cleanedUp else { return }
        cleanedUp = true
        if process.isRunning || !hasExited { _ = stop(timeout: .seconds(5)) }
        try? stdout.fileHandleForReading.close()
        directory.remove()
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

/// Points `process`'s stdout at `stdout`, its stderr at a new file `stderrPath` and its stdin at /dev/null, has
/// `exited` signalled when it terminates, and runs it.
func launchProcess(_ process: Process, stdout: Pipe, stderrPath: String, exited: DispatchSemaphore) throws {
    guard FileManager.default.createFile(atPath: stderrPath, contents: nil),
          let stderrHandle = FileHandle(forWritingAtPath: stderrPath) else {
        throw HarnessError.system("create \(stderrPath)", errno)
    }
    process.standardOutput = stdout
    process.standardError = stderrHandle
    process.standardInput = FileHandle.nullDevice
    process.terminationHandler = { _ in exited.signal() }
    try process.run()
    try? stderrHandle.close()
}

enum LineOutcome { case line(String), eof, timeout }

/// Reads lines from `fd` (bytes after the last newline stay in `buffer`) until one satisfies `accept`, skipping the
/// others; `.eof` when the stream ends first, `.timeout` when `deadline` passes.
func nextLine(fd: Int32, buffer: inout [UInt8], deadline: ContinuousClock.Instant,
              where accept: (String) -> Bool) throws -> LineOutcome {
    while true {
        while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
            let line = String(decoding: buffer[..<newline], as: UTF8.self)
            buffer.removeSubrange(...newline)
            if accept(line) { return .line(line) }
        }
        var chunk = [UInt8](repeating: 0, count: 4096)
        switch try readWithDeadline(fd: fd, into: &chunk, deadline: deadline) {
        case .bytes(let n): buffer.append(contentsOf: chunk[..<n])
        case .eof: return .eof
        case .timeout: return .timeout
        }
    }
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
