import Synchronization

/// Records what an async sequence yields, consumed in a task of its own, so a test can wait with a deadline until
/// the elements seen satisfy a condition. `cancel()` stops consuming (ending a subscription).
final class EventLog<Element: Sendable>: Sendable {
    private struct Waiter {
        let id: Int
        let predicate: @Sendable ([Element]) -> Bool
        let continuation: CheckedContinuation<[Element], any Error>
    }

    private struct State {
        var items: [Element] = []
        var end: String? = nil
        var waiters: [Waiter] = []
        var nextWaiter = 0
        var expired: Set<Int> = []
        var task: Task<Void, Never>?
    }

    private let state = Mutex(State())

    init<S: AsyncSequence & Sendable>(_ sequence: S) where S.Element == Element {
        let task = Task { [weak self] in
            do {
                for try await element in sequence {
                    guard let self else { return }
                    self.append(element)
                }
                self?.finish("finished")
            } catch {
                self?.finish("failed: \(error)")
            }
        }
        state.withLock { $0.task = task }
    }

    deinit { state.withLock { $0.task?.cancel() } }

    /// Everything seen so far.
    var items: [Element] { state.withLock { $0.items } }

    /// Stops consuming.
    func cancel() { state.withLock { $0.task?.cancel() } }

    private func append(_ element: Element) {
        let ready = state.withLock { s -> [(CheckedContinuation<[Element], any Error>, [Element])] in
            s.items.append(element)
            var out: [(CheckedContinuation<[Element], any Error>, [Element])] = []
            s.waiters.removeAll { w in
                guard w.predicate(s.items) else { return false }
                out.append((w.continuation, s.items))
                return true
            }
            return out
        }
        for (c, items) in ready { c.resume(returning: items) }
    }

    private func finish(_ how: String) {
        let waiters = state.withLock { s -> [Waiter] in
            s.end = how
            defer { s.waiters = [] }
            return s.waiters
        }
        for w in waiters {
            w.continuation.resume(throwing: HarnessError.unexpectedOutput("the sequence \(how) before the condition held"))
        }
    }

    /// Waits until `predicate(items)` holds; returns the items at that moment. Throws on deadline or end.
    @discardableResult
    func wait(_ what: String, timeout: Duration = .seconds(20),
              until predicate: @escaping @Sendable ([Element]) -> Bool) async throws -> [Element] {
        let id = state.withLock { s -> Int in
            s.nextWaiter += 1
            return s.nextWaiter
        }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            if Task.isCancelled { return }
            self?.expire(id, what: what, timeout: timeout)
        }
        defer { timer.cancel() }
        return try await withCheckedThrowingContinuation { (c: CheckedContinuation<[Element], any Error>) in
            let outcome = state.withLock { s -> Result<[Element], any Error>? in
                if predicate(s.items) { return .success(s.items) }
                if s.expired.contains(id) { return .failure(HarnessError.timedOut("\(what) (after \(timeout))")) }
                if let end = s.end {
                    return .failure(HarnessError.unexpectedOutput("\(what): the sequence \(end) before the condition held"))
                }
                s.waiters.append(Waiter(id: id, predicate: predicate, continuation: c))
                return nil
            }
            if let outcome { c.resume(with: outcome) }
        }
    }

    private func expire(_ id: Int, what: String, timeout: Duration) {
        let waiter = state.withLock { s -> Waiter? in
            guard let i = s.waiters.firstIndex(where: { $0.id == id }) else {
                s.expired.insert(id)
                return nil
            }
            return s.waiters.remove(at: i)
        }
        waiter?.continuation.resume(throwing: HarnessError.timedOut("\(what) (after \(timeout))"))
    }
}
