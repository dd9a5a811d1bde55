import FluxClient
import Synchronization

/// Runs `body`, failing with `FluxError.timedOut` if it has not finished within `timeout` (the body is then
/// cancelled). Use it instead of sleeping: wait for the thing itself, with a deadline.
public func withTimeout<T: Sendable>(
    _ timeout: Duration = .seconds(5), _ what: String = "operation",
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw FluxError.timedOut("\(what) (after \(timeout))")
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

/// Collects what an async sequence yields (in a task of its own) so a test can wait, with a deadline, until the
/// collected elements satisfy a condition.
///
///     let events = Recorder(client.subscribe(store: "todos", as: TodoState.self))
///     let seen = try await events.wait { $0.contains { $0.snapshot?.version == 2 } }
public final class Recorder<Element: Sendable>: Sendable {
    private struct Waiter {
        let predicate: @Sendable ([Element], Bool) -> Bool
        let continuation: CheckedContinuation<[Element], any Error>
    }

    private struct State {
        var items: [Element] = []
        var ended = false
        var failure: (any Error)?
        var waiters: [Int: Waiter] = [:]
        var nextWaiter = 0
        var task: Task<Void, Never>?
    }

    private let state = Mutex(State())

    /// An empty recorder, fed with `append(_:)`.
    public init() {}

    /// Starts consuming `sequence`.
    public init<Source: AsyncSequence & Sendable>(_ sequence: Source) where Source.Element == Element {
        let task = Task { [weak self] in
            do {
                for try await element in sequence {
                    guard let self else { return }
                    self.append(element)
                }
                self?.end(nil)
            } catch {
                self?.end(error)
            }
        }
        state.withLock { $0.task = task }
    }

    /// Everything collected so far.
    public var elements: [Element] { state.withLock { $0.items } }

    /// Whether the sequence ended, and with what error (nil inner value = ended normally).
    public var ending: (any Error)?? {
        state.withLock { s in s.ended ? .some(s.failure) : .none }
    }

    /// Adds an element (for recorders fed by hand, e.g. from a callback).
    public func append(_ element: Element) {
        let ready = state.withLock { s -> [(CheckedContinuation<[Element], any Error>, [Element])] in
            s.items.append(element)
            return takeSatisfied(&s)
        }
        for (c, items) in ready { c.resume(returning: items) }
    }

    /// Marks the end of the sequence; waiters whose condition can no longer become true fail.
    public func end(_ error: (any Error)?) {
        let (waiters, items) = state.withLock { s -> ([Waiter], [Element]) in
            s.ended = true
            s.failure = error
            defer { s.waiters = [:] }
            return (Array(s.waiters.values), s.items)
        }
        for w in waiters {
            if w.predicate(items, true) {
                w.continuation.resume(returning: items)
            } else {
                w.continuation.resume(throwing: FluxError.timedOut(
                    "the sequence ended (\(String(describing: error))) before the condition held"))
            }
        }
    }

    /// Waits until the sequence ends; returns the error it ended with (nil when it finished normally).
    public func waitForEnd(timeout: Duration = .seconds(5)) async throws -> (any Error)? {
        _ = try await wait(timeout: timeout, "the end of the sequence", matching: { _, ended in ended })
        return state.withLock { $0.failure }
    }

    /// Stops consuming the source sequence (cancelling its task, which e.g. ends a subscription).
    public func cancel() {
        let task = state.withLock { $0.task }
        task?.cancel()
    }

    /// Waits until the collected elements satisfy `predicate`; returns them. Fails with `FluxError.timedOut`
    /// after `timeout`, or when the sequence ends first.
    @discardableResult
    public func wait(
        timeout: Duration = .seconds(5), _ what: String = "condition",
        until predicate: @escaping @Sendable ([Element]) -> Bool
    ) async throws -> [Element] {
        try await wait(timeout: timeout, what, matching: { items, _ in predicate(items) })
    }

    private func wait(
        timeout: Duration, _ what: String, matching predicate: @escaping @Sendable ([Element], Bool) -> Bool
    ) async throws -> [Element] {
        let id = state.withLock { s -> Int in
            s.nextWaiter += 1
            return s.nextWaiter
        }
        let timer = Task { [weak self] in
            do {
                try await Task.sleep(for: timeout)
            } catch {
                return
            }
            self?.fail(id, FluxError.timedOut("\(what) within \(timeout); got \(self?.elements.count ?? 0) elements"))
        }
        defer { timer.cancel() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<[Element], any Error>) in
                let immediate = state.withLock { s -> Result<[Element], any Error>? in
                    if predicate(s.items, s.ended) { return .success(s.items) }
                    if s.ended {
                        return .failure(FluxError.timedOut("the sequence ended (\(String(describing: s.failure))) before \(what)"))
                    }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    s.waiters[id] = Waiter(predicate: predicate, continuation: c)
                    return nil
                }
                if let immediate { c.resume(with: immediate) }
            }
        } onCancel: {
            self.fail(id, CancellationError())
        }
    }

    /// Waits until at least `count` elements were collected; returns them all.
    @discardableResult
    public func wait(count: Int, timeout: Duration = .seconds(5)) async throws -> [Element] {
        try await wait(timeout: timeout, "\(count) elements") { $0.count >= count }
    }

    private func fail(_ id: Int, _ error: any Error) {
        let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
        waiter?.continuation.resume(throwing: error)
    }

    private func takeSatisfied(_ s: inout State) -> [(CheckedContinuation<[Element], any Error>, [Element])] {
        var ready: [(CheckedContinuation<[Element], any Error>, [Element])] = []
        for (id, w) in s.waiters where w.predicate(s.items, s.ended) {
            ready.append((w.continuation, s.items))
            s.waiters[id] = nil
        }
        return ready
    }

    deinit {
        let task = state.withLock { $0.task }
        task?.cancel()
    }
}
