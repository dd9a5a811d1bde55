import Foundation
import Testing

// How the harness waits without tying up Swift's cooperative thread pool (as many threads as cores: 2 on the CI
// machine). A thread of that pool blocked in poll(2), usleep or a semaphore wait is a thread no other test can run
// on: with a few integration tests blocking at once, every other test in the process (router tests that take
// 0.03 s) waited for them and reported ~17 s.
//
// - Async helpers suspend: pipes are read on threads of their own and waited on through `Watched` (continuations
//   resumed by the reader, or by a deadline), processes' exits likewise (`ExitWatch`).
// - Synchronous tests keep their synchronous helpers (condition variables, blocking reads on a socket), and run on
//   threads of their own: their suites (or the tests themselves) carry the `.onDedicatedThreads` trait.

/// A value that threads update and that both blocking and async code wait on: `waitBlocking` parks the calling
/// thread on a condition variable (for synchronous tests, which run on dedicated threads); `wait` suspends on a
/// continuation that the update satisfying it (or its deadline, or cancellation) resumes.
final class Watched<State: Sendable>: @unchecked Sendable {
    // @unchecked: `condition` guards every stored property.
    private let condition = NSCondition()
    private var state: State
    private var waiters: [Int: Waiter] = [:]
    private var expired: Set<Int> = []
    private var nextWaiter = 0

    private struct Waiter {
        let predicate: @Sendable (State) -> Bool
        let continuation: CheckedContinuation<Bool, Never>
    }

    init(_ state: State) {
        self.state = state
    }

    /// The current value.
    var value: State {
        condition.lock()
        defer { condition.unlock() }
        return state
    }

    /// Changes the value and wakes whoever waits for what it now satisfies.
    func update<T>(_ body: (inout State) -> T) -> T {
        condition.lock()
        let result = body(&state)
        var ready: [CheckedContinuation<Bool, Never>] = []
        for (id, waiter) in waiters where waiter.predicate(state) {
            ready.append(waiter.continuation)
            waiters[id] = nil
        }
        condition.broadcast()
        condition.unlock()
        for continuation in ready { continuation.resume(returning: true) }
        return result
    }

    /// Blocks the calling thread until `predicate` holds (true) or `deadline` passes (false). For synchronous code
    /// only: never call it from an async context.
    func waitBlocking(until deadline: ContinuousClock.Instant, _ predicate: (State) -> Bool) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        while !predicate(state) {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return false }
            _ = condition.wait(until: Date(timeIntervalSinceNow: remaining.timeInterval))
        }
        return true
    }

    /// Suspends until `predicate` holds (true), or `timeout` passes or the task is cancelled (false). Blocks no
    /// thread.
    func wait(timeout: Duration, _ predicate: @escaping @Sendable (State) -> Bool) async -> Bool {
        let id = condition.withLock { () -> Int in
            nextWaiter += 1
            return nextWaiter
        }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.expire(id)
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                condition.lock()
                if predicate(state) {
                    condition.unlock()
                    continuation.resume(returning: true)
                } else if expired.remove(id) != nil {
                    condition.unlock()
                    continuation.resume(returning: false)
                } else {
                    waiters[id] = Waiter(predicate: predicate, continuation: continuation)
                    condition.unlock()
                }
            }
        } onCancel: {
            expire(id)
        }
    }

    /// Resumes waiter `id` with false (or marks it expired if it is not waiting yet).
    private func expire(_ id: Int) {
        let waiter = condition.withLock { () -> Waiter? in
            if let waiter = waiters.removeValue(forKey: id) { return waiter }
            expired.insert(id)
            return nil
        }
        waiter?.continuation.resume(returning: false)
    }
}

extension Duration {
    /// In seconds, for Foundation's clocks.
    var timeInterval: TimeInterval {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}

/// Everything a pipe delivered so far, read to its end on a thread of its own (so a child process never blocks on a
/// full pipe, and nobody waiting for its output ties up a thread of the cooperative pool). The reader owns the read
/// end from `init` on and closes it at end of stream.
final class PipeReader: Sendable {
    struct Output: Sendable {
        var bytes: [UInt8] = []
        /// The stream ended (the writers closed it).
        var ended = false
        /// Where the lines not yet taken by `nextLine` start.
        var consumed = 0

        var text: String { String(decoding: bytes, as: UTF8.self) }

        /// The first line after `consumed` that satisfies `accept`, and the offset after its newline.
        func firstLine(from offset: Int, where accept: (String) -> Bool) -> (line: String, end: Int)? {
            var start = offset
            while let newline = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: bytes[start..<newline], as: UTF8.self)
                if accept(line) { return (line, newline + 1) }
                start = newline + 1
            }
            return nil
        }
    }

    let output = Watched(Output())

    /// Starts reading `handle` (a pipe's read end) until end of stream. `keepAlive` (the `Pipe`) is retained until
    /// then, so that nothing closes the descriptor under the reader.
    init(_ handle: FileHandle, keepAlive: (any Sendable)? = nil) {
        let fd = handle.fileDescriptor
        let output = self.output
        let thread = Thread {
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n > 0 {
                    output.update { $0.bytes += chunk[..<n] }
                } else {
                    try? handle.close()
                    withExtendedLifetime(keepAlive) {}
                    output.update { $0.ended = true }
                    return
                }
            }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// What was read so far, as text.
    var text: String { output.value.text }

    enum LineOutcome: Equatable { case line(String), eof, timeout }

    /// Takes lines until one satisfies `accept` (skipping the others); blocks the calling thread until then, the
    /// end of the stream or `deadline`. Synchronous code only.
    func nextLineBlocking(deadline: ContinuousClock.Instant, where accept: (String) -> Bool) -> LineOutcome {
        let ready = output.waitBlocking(until: deadline) { $0.ended || $0.firstLine(from: $0.consumed, where: accept) != nil }
        return take(ready: ready, where: accept)
    }

    /// Takes lines until one satisfies `accept` (skipping the others); suspends until then, the end of the stream
    /// or `timeout`.
    func nextLine(timeout: Duration, where accept: @escaping @Sendable (String) -> Bool) async -> LineOutcome {
        let ready = await output.wait(timeout: timeout) {
            $0.ended || $0.firstLine(from: $0.consumed, where: accept) != nil
        }
        return take(ready: ready, where: accept)
    }

    private func take(ready: Bool, where accept: (String) -> Bool) -> LineOutcome {
        output.update { output in
            if let (line, end) = output.firstLine(from: output.consumed, where: accept) {
                output.consumed = end
                return .line(line)
            }
            return ready && output.ended ? .eof : .timeout
        }
    }
}

/// Whether a `Process` has exited, set by its termination handler; waited on blocking or async.
final class ExitWatch: Sendable {
    private let exited = Watched(false)

    /// Install as the process's termination handler (before `run()`).
    var terminationHandler: @Sendable (Process) -> Void {
        { [exited] _ in exited.update { $0 = true } }
    }

    var hasExited: Bool { exited.value }

    /// Blocks until the process exited (true) or `timeout` passed. Synchronous code only.
    func waitBlocking(timeout: Duration) -> Bool {
        exited.waitBlocking(until: .now + timeout) { $0 }
    }

    /// Suspends until the process exited (true) or `timeout` passed.
    func wait(timeout: Duration) async -> Bool {
        await exited.wait(timeout: timeout) { $0 }
    }
}

// MARK: - Synchronous tests off the cooperative pool

/// Runs every job it is given on a new thread of its own (4 MiB of stack, like the test's main thread has). As a
/// task's preferred executor (`withTaskExecutorPreference`), it moves the task's synchronous code — a synchronous
/// test that blocks in `read`, `poll` or a condition wait — off the cooperative pool: the task is the same (its
/// task-locals, so the current test, and its issues go where they belong), only the thread is not the pool's.
final class DedicatedThreadExecutor: TaskExecutor {
    static let shared = DedicatedThreadExecutor()

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let thread = Thread { job.runSynchronously(on: executor) }
        thread.stackSize = 4 << 20
        thread.start()
    }
}

/// Runs a test, or every test of a suite, with `DedicatedThreadExecutor` as its task's preferred executor: for
/// synchronous tests that block (raw sockets, process waits, polling).
struct OnDedicatedThreads: TestTrait, SuiteTrait, TestScoping {
    func provideScope(for test: Test, testCase: Test.Case?,
                      performing function: @Sendable () async throws -> Void) async throws {
        try await withTaskExecutorPreference(DedicatedThreadExecutor.shared) {
            try await function()
        }
    }
}

extension Trait where Self == OnDedicatedThreads {
    /// The test (or every test of the suite) runs on threads of its own, not on Swift's cooperative pool: for
    /// synchronous tests that block.
    static var onDedicatedThreads: Self { Self() }
}
