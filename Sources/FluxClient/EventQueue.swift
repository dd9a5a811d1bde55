import FluxCore
import Synchronization

/// A single-consumer queue between the connection's reader (which pushes, never waiting) and one consuming task
/// (which awaits `next()`), bounded by policy rather than by blocking the producer:
///
/// - `coalesce(waiting, new)`: when it returns an item for the last waiting one, that item takes its place instead
///   of `new` being appended (a subscription's newest-wins: a snapshot replaces a waiting snapshot, SPEC §8.5, and
///   a delta merges into the waiting snapshot or delta it follows, SPEC §16.3);
/// - `limit`: when that many items wait, the oldest is dropped and counted (`takeDropped()`).
///
/// No lock is held while a continuation is resumed.
final class EventQueue<Item: Sendable>: Sendable {
    /// What `next()` returns.
    enum Next: Sendable {
        case item(Item)
        /// The queue was finished: nil normally, else with this error.
        case end(FluxError?)
        /// The consuming task was cancelled while waiting.
        case cancelled
        /// The deadline given to `next(until:)` passed first.
        case timedOut
    }

    private struct State {
        var items: [Item] = []
        var head = 0
        var end: FluxError?? = nil
        var waiter: CheckedContinuation<Next, Never>?
        var waiterID = 0
        var dropped = 0
    }

    private let state = Mutex(State())
    private let limit: Int
    private let coalesce: @Sendable (Item, Item) -> Item?

    init(limit: Int = .max, coalesce: @escaping @Sendable (Item, Item) -> Item? = { _, _ in nil }) {
        self.limit = limit
        self.coalesce = coalesce
    }

    /// Adds an item (or replaces the last waiting one, per `coalesce`). Ignored once finished.
    func push(_ item: Item) {
        let waiter = state.withLock { s -> CheckedContinuation<Next, Never>? in
            guard s.end == nil else { return nil }
            if let w = s.waiter {
                s.waiter = nil
                return w
            }
            if s.items.count > s.head, let merged = coalesce(s.items[s.items.count - 1], item) {
                s.items[s.items.count - 1] = merged
                return nil
            }
            if s.items.count - s.head >= limit {
                s.head += 1
                s.dropped += 1
            }
            if s.head > 64 && s.head * 2 > s.items.count {
                s.items.removeFirst(s.head)
                s.head = 0
            }
            s.items.append(item)
            return nil
        }
        waiter?.resume(returning: .item(item))
    }

    /// Ends the queue after the waiting items (idempotent: the first ending wins).
    func finish(_ error: FluxError?) {
        let waiter = state.withLock { s -> CheckedContinuation<Next, Never>? in
            guard s.end == nil else { return nil }
            s.end = .some(error)
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: .end(error))
    }

    /// Whether `finish` was called.
    var isFinished: Bool { state.withLock { $0.end != nil } }

    /// How many items were dropped for `limit` since the last call.
    func takeDropped() -> Int {
        state.withLock { s in
            defer { s.dropped = 0 }
            return s.dropped
        }
    }

    /// The next item, waiting for one (until `deadline`, if given); `.end` once finished and drained. One consumer
    /// at a time. A `.timedOut` or `.cancelled` consumes nothing.
    func next(until deadline: ContinuousClock.Instant? = nil) async -> Next {
        let id = state.withLock { s -> Int in
            s.waiterID += 1
            return s.waiterID
        }
        let timer = deadline.map { deadline in
            Task { [weak self] in
                try? await Task.sleep(until: deadline, clock: .continuous)
                self?.wake(id, with: Task.isCancelled ? nil : .timedOut)
            }
        }
        defer { timer?.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Next, Never>) in
                let now = state.withLock { s -> Next? in
                    if s.head < s.items.count {
                        let item = s.items[s.head]
                        s.head += 1
                        if s.head == s.items.count {
                            s.items.removeAll(keepingCapacity: true)
                            s.head = 0
                        }
                        return .item(item)
                    }
                    if let end = s.end { return .end(end) }
                    if Task.isCancelled { return .cancelled }
                    if let deadline, deadline <= .now { return .timedOut }
                    precondition(s.waiter == nil, "an EventQueue has one consumer at a time")
                    s.waiter = c
                    s.waiterID = id
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            self.wake(id, with: .cancelled)
        }
    }

    /// Resumes the waiter of `next` call `id`, if it still waits, with `result`.
    private func wake(_ id: Int, with result: Next?) {
        guard let result else { return }
        let waiter = state.withLock { s -> CheckedContinuation<Next, Never>? in
            guard s.waiterID == id, let w = s.waiter else { return nil }
            s.waiter = nil
            return w
        }
        waiter?.resume(returning: result)
    }
}

/// A local consumer that is handed events through a closure (FluxStore's `follow`, fluxctl's merged streams): events are queued under the client's lock, in wire order, and the closure is called
/// afterwards with no lock held, one event at a time and in that order, by whichever thread finds the queue idle.
/// So the closure may call back into the client.
final class CallbackQueue<Event: Sendable>: Sendable {
    enum Item: Sendable {
        case event(Event)
        case end(FluxError?)
    }

    private let deliver: @Sendable (Event) -> Void
    private let end: @Sendable (FluxError?) -> Void
    private let queue = Mutex<(items: [Item], running: Bool, ended: Bool)>(([], false, false))

    init(deliver: @escaping @Sendable (Event) -> Void, end: @escaping @Sendable (FluxError?) -> Void) {
        self.deliver = deliver
        self.end = end
    }

    /// Queues an item (cheap; may be called under the client's lock). Nothing after the first `.end`.
    func enqueue(_ item: Item) {
        queue.withLock { q in
            guard !q.ended else { return }
            if case .end = item { q.ended = true }
            q.items.append(item)
        }
    }

    /// Calls the closures for what is queued (no lock held while they run), unless another thread (or an outer
    /// call on this thread) is doing so already: that one delivers it, after what it is delivering. Call after
    /// `enqueue`, outside locks.
    func run() {
        let runner = queue.withLock { q -> Bool in
            if q.running { return false }
            q.running = true
            return true
        }
        guard runner else { return }
        while true {
            let item = queue.withLock { q -> Item? in
                if q.items.isEmpty {
                    q.running = false
                    return nil
                }
                return q.items.removeFirst()
            }
            guard let item else { return }
            switch item {
            case .event(let e): deliver(e)
            case .end(let error): end(error)
            }
        }
    }
}
