import Foundation
import Glibc

/// An example executable (`todo-store`, `stats-store`, `comments-store` …) started by a test against a test's
/// fluxd: `--socket <path>` is passed, stdout is a pipe read for the ready line, stderr goes to a file. Always
/// ended by `cleanup()` (SIGKILL, then reaped with a deadline), which `Bus` calls and `deinit` calls as a safety net.
final class StoreProcess: @unchecked Sendable {
    // @unchecked: one test drives it; the termination handler only signals a semaphore; `lock` guards the rest.
    let executable: String
    let process = Process()
    let stderrPath: String
    private let stdout = Pipe()
    private let exited = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var hasExited = false
    private var cleanedUp = false
    private var stdoutBuffer: [UInt8] = []

    /// Starts `executable` (found next to the test binary) with `--socket socketPath` and `arguments`. Its stderr
    /// goes to a file in `logDirectory`. Does not wait for the ready line.
    init(_ executable: String, socketPath: String, arguments: [String] = [], logDirectory: String) throws {
        self.executable = executable
        stderrPath = logDirectory + "/\(executable)-\(UInt32.random(in: 0...UInt32.max)).stderr"
        process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: executable))
        process.arguments = ["--socket", socketPath] + arguments
        try launchProcess(process, stdout: stdout, stderrPath: stderrPath, exited: exited)
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    /// Everything the process wrote to stderr so far.
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Waits for a stdout line containing `text`; throws if the process exits first or the deadline passes.
    @discardableResult
    func waitForLine(containing text: String, timeout: Duration = .seconds(20)) throws -> String {
        let deadline = ContinuousClock.now + timeout
        switch try nextLine(fd: stdout.fileHandleForReading.fileDescriptor, buffer: &stdoutBuffer, deadline: deadline,
                            where: { $0.contains(text) }) {
        case .line(let line):
            return line
        case .eof:
            let status = waitForExit(timeout: .seconds(5)) ?? -1
            throw HarnessError.unexpectedOutput("\(executable) exited (\(status)) before printing \"\(text)\"; stderr:\n\(stderr)")
        case .timeout:
            throw HarnessError.timedOut("\(executable): line \"\(text)\" (stderr so far:\n\(stderr))")
        }
    }

    /// Waits until the process exits; its status, or nil when the deadline passes.
    func waitForExit(timeout: Duration) -> Int32? {
        let already = lock.withLock { hasExited }
        if !already {
            let ns = timeout.components.seconds * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000
            guard exited.wait(timeout: .now() + .nanoseconds(Int(ns))) == .success else { return nil }
            lock.withLock { hasExited = true }
        }
        return process.terminationStatus
    }

    /// Sends a signal (never to a reaped, possibly recycled pid).
    func send(signal: Int32) {
        let running = lock.withLock { !hasExited } && process.isRunning
        if running { kill(process.processIdentifier, signal) }
    }

    /// SIGKILL and reap (a crash, as far as fluxd can tell). Throws if it is still there after the deadline.
    func crash(timeout: Duration = .seconds(10)) throws {
        send(signal: SIGKILL)
        guard waitForExit(timeout: timeout) != nil else {
            throw HarnessError.timedOut("\(executable) (pid \(pid)) to die after SIGKILL")
        }
    }

    /// Kills the process if it is still running and reaps it. Idempotent.
    func cleanup() {
        let first = lock.withLock { () -> Bool in
            defer { cleanedUp = true }
            return !cleanedUp
        }
        guard first else { return }
        send(signal: SIGKILL)
        _ = waitForExit(timeout: .seconds(10))
        try? stdout.fileHandleForReading.close()
    }
}
