import Foundation
import Glibc

/// An example executable (`todo-store`, `stats-store`, `comments-store` …) started by a test against a test's
/// fluxd: `--socket <path>` is passed, stdout is a pipe read on a thread of its own (for the ready line), stderr
/// goes to a file. Always ended by `cleanup()` or `shutDown()` (SIGKILL, then reaped with a deadline), which `Bus`
/// calls and `deinit` calls as a safety net.
///
/// Each wait has a blocking form for synchronous tests and an `async` one (same name) that suspends instead.
final class StoreProcess: @unchecked Sendable {
    // @unchecked: one test drives it; the pipe reader and the exit watch are thread-safe; `lock` guards the rest.
    let executable: String
    let process = Process()
    let stderrPath: String
    private let stdout: PipeReader
    private let exit = ExitWatch()
    private let lock = NSLock()
    private var cleanedUp = false

    /// Starts `executable` (found next to the test binary) with `--socket socketPath` and `arguments`. Its stderr
    /// goes to a file in `logDirectory`; `environment` is added to the test's. Does not wait for the ready line.
    init(_ executable: String, socketPath: String, arguments: [String] = [], environment: [String: String] = [:],
         logDirectory: String) throws {
        self.executable = executable
        stderrPath = logDirectory + "/\(executable)-\(UInt32.random(in: 0...UInt32.max)).stderr"
        process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: executable))
        process.arguments = ["--socket", socketPath] + arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        stdout = try launchProcess(process, stderrPath: stderrPath, exit: exit)
    }

    deinit { cleanup() }

    var pid: Int32 { process.processIdentifier }

    /// Everything the process wrote to stderr so far.
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Waits for a stdout line containing `text`; throws if the process exits first or the deadline passes. Blocks.
    @discardableResult
    func waitForLine(containing text: String, timeout: Duration = .seconds(20)) throws -> String {
        let outcome = stdout.nextLineBlocking(deadline: .now + timeout) { $0.contains(text) }
        return try line(outcome, containing: text, exitStatus: { self.waitForExit(timeout: .seconds(5)) })
    }

    /// Waits for a stdout line containing `text`; throws if the process exits first or the deadline passes.
    /// Suspends.
    @discardableResult
    func waitForLine(containing text: String, timeout: Duration = .seconds(20)) async throws -> String {
        let outcome = await stdout.nextLine(timeout: timeout) { $0.contains(text) }
        let status = outcome == .eof ? await waitForExit(timeout: .seconds(5)) : nil
        return try line(outcome, containing: text, exitStatus: { status })
    }

    private func line(_ outcome: PipeReader.LineOutcome, containing text: String,
                      exitStatus: () -> Int32?) throws -> String {
        switch outcome {
        case .line(let line):
            return line
        case .eof:
            throw HarnessError.unexpectedOutput(
                "\(executable) exited (\(exitStatus() ?? -1)) before printing \"\(text)\"; stderr:\n\(stderr)")
        case .timeout:
            throw HarnessError.timedOut("\(executable): line \"\(text)\" (stderr so far:\n\(stderr))")
        }
    }

    /// Waits until the process exits; its status, or nil when the deadline passes. Blocks.
    func waitForExit(timeout: Duration) -> Int32? {
        exit.waitBlocking(timeout: timeout) ? process.terminationStatus : nil
    }

    /// Waits until the process exits; its status, or nil when the deadline passes. Suspends.
    func waitForExit(timeout: Duration) async -> Int32? {
        await exit.wait(timeout: timeout) ? process.terminationStatus : nil
    }

    /// Sends a signal (never to a reaped, possibly recycled pid).
    func send(signal: Int32) {
        if !exit.hasExited && process.isRunning { kill(process.processIdentifier, signal) }
    }

    /// SIGKILL and reap (a crash, as far as fluxd can tell). Throws if it is still there after the deadline. Blocks.
    func crash(timeout: Duration = .seconds(10)) throws {
        send(signal: SIGKILL)
        guard waitForExit(timeout: timeout) != nil else {
            throw HarnessError.timedOut("\(executable) (pid \(pid)) to die after SIGKILL")
        }
    }

    /// SIGKILL and reap (a crash, as far as fluxd can tell). Throws if it is still there after the deadline.
    /// Suspends.
    func crash(timeout: Duration = .seconds(10)) async throws {
        send(signal: SIGKILL)
        guard await waitForExit(timeout: timeout) != nil else {
            throw HarnessError.timedOut("\(executable) (pid \(pid)) to die after SIGKILL")
        }
    }

    /// Kills the process if it is still running and reaps it. Idempotent. Blocks (briefly); async code calls
    /// `shutDown()`.
    func cleanup() {
        guard beginCleanup() else { return }
        send(signal: SIGKILL)
        _ = waitForExit(timeout: .seconds(10))
    }

    /// `cleanup()` for async code: suspends while the process is reaped.
    func shutDown() async {
        guard beginCleanup() else { return }
        send(signal: SIGKILL)
        _ = await waitForExit(timeout: .seconds(10))
    }

    private func beginCleanup() -> Bool {
        lock.withLock {
            defer { cleanedUp = true }
            return !cleanedUp
        }
    }
}
