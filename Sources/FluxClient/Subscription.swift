import FluxCore
import FluxJSONValue
import Foundation
import Synchronization

/// What a `Subscription` and its iterators share: the newest-wins queue the client fills, the status as of the last
/// event handed out, and the local subscriber id (removed once).
final class SubscriptionCore: Sendable {
    let client: FluxClient
    let store: String
    /// Filled by the client under its lock: a slow consumer finds only the newest state waiting (SPEC §8.5's
    /// newest wins, kept by the library too). A whole snapshot replaces a waiting older one, at its place; a delta
    /// that follows the waiting snapshot or delta merges into it (its operations appended: the consumer applies
    /// them at once); past `RawSnapshot.maxMergedOperations` the merged change is dropped for a resync (fluxd
    /// sends the whole state), so what waits stays bounded.
    let queue = EventQueue<WireStoreEvent>(coalesce: { waiting, new in
        guard case .snapshot(let old) = waiting, case .snapshot(let newer) = new,
              newer.era == old.era, newer.version > old.version else { return nil }
        guard let patch = newer.patch, newer.state.isEmpty else { return new }
        guard newer.from == old.version, !old.mustResync else { return nil }
        var merged = old
        let operations = (old.patch?.operations ?? []) + patch.operations
        if operations.count > RawSnapshot.maxMergedOperations {
            merged = RawSnapshot(store: newer.store, version: newer.version, seq: newer.seq, state: [], era: newer.era)
            merged.mustResync = true
            return .snapshot(merged)
        }
        merged.patch = JSONPatch(operations: operations)
        merged.version = newer.version
        merged.seq = newer.seq
        if old.state.isEmpty { merged.from = old.from } else { merged.from = old.version }
        return .snapshot(merged)
    })
    private let shared = Mutex<(id: Int?, cancelled: Bool, lastVersion: Int, era: Int, status: SubscriptionStatus?,
                                resyncing: Bool)>((nil, false, 0, 0, nil, false))

    init(client: FluxClient, store: String) {
        self.client = client
        self.store = store
    }

    func attach(_ id: Int?) {
        guard let id else { return }
        let cancelNow = shared.withLock { s -> Bool in
            s.id = id
            return s.cancelled
        }
        if cancelNow { client.removeSubscriber(store: store, id: id) }
    }

    func cancel() {
        let id = shared.withLock { s -> Int? in
            if s.cancelled { return nil }
            s.cancelled = true
            return s.id
        }
        if let id { client.removeSubscriber(store: store, id: id) }
        queue.finish(nil)
    }

    var status: SubscriptionStatus? { shared.withLock { $0.status } }

    /// The held state cannot take the deltas that come: asks fluxd for the whole state (once until it comes).
    func resync() {
        let ask = shared.withLock { s -> Bool in
            s.lastVersion = 0
            defer { s.resyncing = true }
            return !s.resyncing
        }
        if ask { client.resync(store: store) }
    }

    /// Takes in one event before it is handed out: updates the status; false for a stale snapshot (skip it).
    func admit(_ event: WireStoreEvent) -> Bool {
        shared.withLock { s in
            var status = s.status ?? SubscriptionStatus(store: store, status: .unknown, version: 0)
            switch event {
            case .subscribed(let st, let version):
                status.status = st
                status.version = max(status.version, version)
                if st != .down { status.downReason = nil }
            case .snapshot(let raw):
                if raw.era != s.era {
                    // The client reconnected to another fluxd history: versions start over.
                    s.era = raw.era
                    s.lastVersion = 0
                    status.version = 0
                }
                if raw.version <= s.lastVersion { return false }
                if s.resyncing {
                    // Waiting for a whole state: deltas until then cannot apply.
                    if raw.isDelta { return false }
                    s.resyncing = false
                }
                s.lastVersion = raw.version
                status.version = max(status.version, raw.version)
            case .storeDown(let reason):
                status.status = .down
                status.downReason = reason
            case .storeUp(let version):
                status.status = .up
                status.downReason = nil
                status.version = max(status.version, version)
            }
            s.status = status
            return true
        }
    }
}

/// Ends a subscription when the last holder (the `Subscription` value or its iterator) lets go of it.
final class SubscriptionToken: Sendable {
    let core: SubscriptionCore
    init(_ core: SubscriptionCore) { self.core = core }
    deinit { core.cancel() }
}

/// A live subscription to one store: an `AsyncSequence` of `StoreEvent<S>` (see `FluxClient.subscribe`) whose
/// failures are `FluxError`.
///
/// Iterate it once (or take snapshots with `nextSnapshot(timeout:)` and then iterate: both read the same queue).
/// Only the newest unread snapshot waits for the consumer, so a slow consumer sees the latest state rather than a
/// backlog; a snapshot never older than (or equal to) one already handed out is passed on. It unsubscribes when its
/// consumer is cancelled, when it and its iterator are dropped, or on `cancel()`. Snapshots are decoded on the
/// consumer's task.
public struct Subscription<S: Sendable>: AsyncSequence, Sendable {
    public typealias Element = StoreEvent<S>
    public typealias Failure = FluxError

    /// The store subscribed to.
    public var store: String { token.core.store }
    let token: SubscriptionToken
    /// Turns snapshots and deltas into states (holding the state between them).
    let read: @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<S>

    init(core: SubscriptionCore, read: @escaping @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<S>) {
        self.token = SubscriptionToken(core)
        self.read = read
    }

    /// Where the store stands as of the last event this subscription handed out: nil before the first
    /// (`.subscribed`), then `up`, `down` (with the reason) or `unknown` (no store of that name has registered
    /// yet; its snapshots will come once one does), with the newest version seen. For a UI's "connecting…",
    /// "store down" or "no such store yet".
    public var status: SubscriptionStatus? { token.core.status }

    /// Ends the subscription now: the sequence finishes, and `unsubscribe` is sent if no other local
    /// subscription to the store remains.
    public func cancel() { token.core.cancel() }

    /// Only the snapshots (skipping status events).
    public var snapshots: AsyncCompactMapSequence<Subscription<S>, Snapshot<S>> {
        compactMap { $0.snapshot }
    }

    /// Waits for the next snapshot (the retained one right after subscribing), skipping status events, within
    /// `timeout` (the client's `requestTimeout` when nil). On timeout it throws `FluxError.timedOut` saying why no
    /// snapshot came: "no store named 'x' has registered yet" when the status is `unknown`, the store is down, or
    /// it published nothing newer. The subscription stays in place after a timeout.
    public func nextSnapshot(timeout: Duration? = nil) async throws(FluxError) -> Snapshot<S> {
        let limit = timeout ?? token.core.client.requestTimeout
        let deadline = ContinuousClock.now + limit
        var iterator = makeAsyncIterator()
        while true {
            guard let event = try await iterator.next(until: deadline, what: limit) else {
                throw .closed
            }
            if case .snapshot(let s) = event { return s }
        }
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(token: token, read: read)
    }

    /// Decodes events as they are consumed (a delta: applied to the state held, decoded incrementally).
    public struct Iterator: AsyncIteratorProtocol {
        let token: SubscriptionToken
        let read: @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<S>
        var finished = false

        init(token: SubscriptionToken, read: @escaping @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<S>) {
            self.token = token
            self.read = read
        }

        /// The next event; nil when the subscription ended (cancelled, closed, or the consumer's task cancelled).
        public mutating func next() async throws(FluxError) -> StoreEvent<S>? {
            try await next(until: nil, what: .zero, isolation: nil)
        }

        /// The next event (see `next()`).
        public mutating func next(isolation actor: isolated (any Actor)?) async throws(FluxError) -> StoreEvent<S>? {
            try await next(until: nil, what: .zero, isolation: actor)
        }

        mutating func next(until deadline: ContinuousClock.Instant?, what limit: Duration,
                           isolation actor: isolated (any Actor)? = #isolation) async throws(FluxError) -> StoreEvent<S>? {
            let core = token.core
            while !finished {
                switch await core.queue.next(until: deadline) {
                case .item(let event):
                    guard core.admit(event) else { continue }
                    switch event {
                    case .subscribed(let status, _): return .subscribed(status)
                    case .storeDown(let reason): return .storeDown(reason: reason)
                    case .storeUp(let version): return .storeUp(version: version)
                    case .snapshot(let raw):
                        let step: ReadStep<S>
                        do {
                            step = try read(raw)
                        } catch {
                            finished = true
                            core.cancel()
                            throw .coding("snapshot \(raw.version) of \(raw.store) does not decode as \(S.self): \(error)")
                        }
                        switch step {
                        case .state(let state):
                            return .snapshot(Snapshot(store: raw.store, version: raw.version, seq: raw.seq, state: state))
                        case .skip:
                            continue
                        case .resync:
                            core.resync()
                            continue
                        }
                    }
                case .end(let error):
                    finished = true
                    if let error { throw error }
                    return nil
                case .cancelled:
                    finished = true
                    core.cancel()
                    return nil
                case .timedOut:
                    let store = core.store
                    let within = limit.formatted
                    switch core.status?.status {
                    case .unknown?:
                        throw .timedOut("no store named '\(store)' has registered yet (no snapshot of it within \(within))")
                    case .down?:
                        throw .timedOut("store '\(store)' is down (\(core.status?.downReason ?? "unknown reason")) and sent no snapshot within \(within)")
                    case .up?:
                        throw .timedOut("store '\(store)' sent no new snapshot within \(within)")
                    case nil:
                        throw .timedOut("fluxd did not confirm the subscription to '\(store)' within \(within)")
                    }
                }
            }
            return nil
        }
    }
}

/// Removes a monitor listener when the last holder lets go of it.
final class MonitorToken: Sendable {
    let client: FluxClient
    let id: Int?
    init(client: FluxClient, id: Int?) {
        self.client = client
        self.id = id
    }
    deinit { if let id { client.removeMonitorListener(id) } }
}

/// fluxd's monitor events as an `AsyncSequence` (see `FluxClient.monitorEvents(buffer:)`). Ends when the connection
/// ends (with an error if it dropped), when the consumer's task is cancelled, or on `cancel()`.
public struct MonitorEvents: AsyncSequence, Sendable {
    public typealias Element = MonitorEvent
    public typealias Failure = FluxError

    let queue: EventQueue<MonitorEvent>
    let token: MonitorToken

    /// Stops the stream.
    public func cancel() { token.id.map(token.client.removeMonitorListener) }

    public func makeAsyncIterator() -> Iterator { Iterator(queue: queue, token: token) }

    /// Hands out the events, a `missed` one first where the buffer dropped some.
    public struct Iterator: AsyncIteratorProtocol {
        let queue: EventQueue<MonitorEvent>
        let token: MonitorToken

        /// The next event; nil at the end.
        public mutating func next() async throws(FluxError) -> MonitorEvent? {
            try await next(isolation: nil)
        }

        /// The next event (see `next()`).
        public mutating func next(isolation actor: isolated (any Actor)?) async throws(FluxError) -> MonitorEvent? {
            let dropped = queue.takeDropped()
            if dropped > 0, let env = try? Envelope(body: Array(#"{"op":"missed","count":\#(dropped)}"#.utf8)) {
                return MonitorEvent(kind: "missed", message: env)
            }
            switch await queue.next() {
            case .item(let event): return event
            case .end(let error?): throw error
            case .end(nil), .cancelled, .timedOut: return nil
            }
        }
    }
}
