import FluxCore
import Synchronization

/// The value at a JSON Pointer inside a store's state at one version, as a path subscription received it (SPEC §16.4
/// `subtree`): `exists` false (and `value` nil) when the state has nothing at `path` at that version.
public struct Subtree<Value> {
    /// The store's name.
    public var store: String
    /// The subscription's JSON Pointer, as given to `FluxClient.subscribe(store:path:as:)`.
    public var path: String
    /// The store's version this value belongs to.
    public var version: Int
    /// The seq of the last action the store had answered when it made that version.
    public var seq: Int
    /// Whether the state has a value at `path` at this version.
    public var exists: Bool
    /// The decoded value, when it exists (a JSON `null` that exists decodes as `Value` would decode `null`).
    public var value: Value?

    /// A subtree value (`value` should be nil exactly when `exists` is false).
    public init(store: String, path: String, version: Int, seq: Int, exists: Bool, value: Value?) {
        self.store = store
        self.path = path
        self.version = version
        self.seq = seq
        self.exists = exists
        self.value = value
    }
}

extension Subtree: Sendable where Value: Sendable {}
extension Subtree: Equatable where Value: Equatable {}

/// One event of a path subscription (`FluxClient.subscribe(store:path:as:)`), in the order fluxd sent them.
public enum PathEvent<Value> {
    /// fluxd holds the subscription; the store's status at that moment. First event of every path subscription.
    case subscribed(StoreStatus)
    /// The value at the path at a new version: the retained version's right after `subscribed` (if the store has
    /// one), then one for each version whose change touched the path (SPEC §16.4; intermediate ones may be skipped
    /// when the consumer is slow, never an older one than already handed out).
    case value(Subtree<Value>)
    /// The store went down (`disconnected`, `unregistered` or `shutdown`). The last value stays valid.
    case storeDown(reason: String)
    /// The store is back, at this version (a value follows if the change since touched the path).
    case storeUp(version: Int)

    /// The value, when this event is one.
    public var subtree: Subtree<Value>? {
        if case .value(let s) = self { return s }
        return nil
    }
}

extension PathEvent: Sendable where Value: Sendable {}
extension PathEvent: Equatable where Value: Equatable {}

/// A `subtree` before decoding (what `FluxClient` hands to a path subscription's queue).
package struct RawSubtree: Sendable {
    package var store: String
    package var path: String
    package var version: Int
    package var seq: Int
    /// The value's JSON bytes when it exists (nil: `exists` false).
    package var value: ArraySlice<UInt8>?
    /// As `RawSnapshot.era`: bumped when a reconnection finds another fluxd history.
    package var era: Int

    package var exists: Bool { value != nil }
}

/// One event of a wire path subscription before decoding.
package enum WirePathEvent: Sendable {
    case subscribed(StoreStatus, version: Int)
    case subtree(RawSubtree)
    case storeDown(String)
    case storeUp(Int)
}

/// What a `PathSubscription` and its iterators share: the newest-wins queue the client fills, the status as of the
/// last event handed out, and the local subscriber id (removed once).
final class PathSubscriptionCore: Sendable {
    let client: FluxClient
    let store: String
    let path: String
    /// Filled by the client under its lock: a newer value replaces a waiting one, at its place (SPEC §8.5's newest
    /// wins, which fluxd applies to `subtree` frames too); status events are all kept.
    let queue = EventQueue<WirePathEvent>(coalesce: { waiting, new in
        guard case .subtree(let old) = waiting, case .subtree(let newer) = new,
              newer.era == old.era, newer.version > old.version else { return nil }
        return new
    })
    private let shared = Mutex<(id: Int?, cancelled: Bool, lastVersion: Int, era: Int, status: SubscriptionStatus?)>(
        (nil, false, 0, 0, nil))

    init(client: FluxClient, store: String, path: String) {
        self.client = client
        self.store = store
        self.path = path
    }

    func attach(_ id: Int?) {
        guard let id else { return }
        let cancelNow = shared.withLock { s -> Bool in
            s.id = id
            return s.cancelled
        }
        if cancelNow { client.removePathSubscriber(store: store, path: path, id: id) }
    }

    func cancel() {
        let id = shared.withLock { s -> Int? in
            if s.cancelled { return nil }
            s.cancelled = true
            return s.id
        }
        if let id { client.removePathSubscriber(store: store, path: path, id: id) }
        queue.finish(nil)
    }

    var status: SubscriptionStatus? { shared.withLock { $0.status } }

    /// Takes in one event before it is handed out: updates the status; false for a stale value (skip it).
    func admit(_ event: WirePathEvent) -> Bool {
        shared.withLock { s in
            var status = s.status ?? SubscriptionStatus(store: store, status: .unknown, version: 0)
            switch event {
            case .subscribed(let st, let version):
                status.status = st
                status.version = max(status.version, version)
                if st != .down { status.downReason = nil }
            case .subtree(let raw):
                if raw.era != s.era {
                    // The client reconnected to another fluxd history: versions start over.
                    s.era = raw.era
                    s.lastVersion = 0
                    status.version = 0
                }
                if raw.version <= s.lastVersion { return false }
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

/// Ends a path subscription when the last holder (the `PathSubscription` value or its iterator) lets go of it.
final class PathSubscriptionToken: Sendable {
    let core: PathSubscriptionCore
    init(_ core: PathSubscriptionCore) { self.core = core }
    deinit { core.cancel() }
}

/// A live subscription to the value at one JSON Pointer inside a store's state (SPEC §16.4): an `AsyncSequence` of
/// `PathEvent<Value>` whose failures are `FluxError` (see `FluxClient.subscribe(store:path:as:)`).
///
/// It works like `Subscription`: iterate it once (or take values with `nextValue(timeout:)` and then iterate: both
/// read the same queue); only the newest unread value waits for a slow consumer; a value never older than (or equal
/// to) one already handed out is passed on; values are decoded on the consumer's task. It is woken only by changes
/// that touch its path: a change elsewhere in the state sends it nothing. It unsubscribes (`unsubscribe` with the
/// path) when its consumer is cancelled, when it and its iterator are dropped, or on `cancel()`.
public struct PathSubscription<Value: Sendable>: AsyncSequence, Sendable {
    /// What it yields: status events and values.
    public typealias Element = PathEvent<Value>
    /// What iterating it throws.
    public typealias Failure = FluxError

    /// The store subscribed to.
    public var store: String { token.core.store }
    /// The JSON Pointer subscribed to, as given.
    public var path: String { token.core.path }
    let token: PathSubscriptionToken
    /// Decodes a value that exists.
    let decode: @Sendable (ArraySlice<UInt8>) throws(FluxError) -> Value

    init(core: PathSubscriptionCore, decode: @escaping @Sendable (ArraySlice<UInt8>) throws(FluxError) -> Value) {
        self.token = PathSubscriptionToken(core)
        self.decode = decode
    }

    /// Where the store stands as of the last event this subscription handed out: nil before the first
    /// (`.subscribed`), then `up`, `down` (with the reason) or `unknown` (no store of that name has registered
    /// yet), with the newest version seen.
    public var status: SubscriptionStatus? { token.core.status }

    /// Ends the subscription now: the sequence finishes, and `unsubscribe` (with the path) is sent if no other
    /// local subscription to the same store and path remains.
    public func cancel() { token.core.cancel() }

    /// Only the values (skipping status events).
    public var subtrees: AsyncCompactMapSequence<PathSubscription<Value>, Subtree<Value>> {
        compactMap { $0.subtree }
    }

    /// Waits for the next value (the retained version's right after subscribing), skipping status events, within
    /// `timeout` (the client's `requestTimeout` when nil). On timeout it throws `FluxError.timedOut` saying why no
    /// value came: no store of that name has registered yet, the store is down, or no change touched the path. The
    /// subscription stays in place after a timeout.
    public func nextValue(timeout: Duration? = nil) async throws(FluxError) -> Subtree<Value> {
        let limit = timeout ?? token.core.client.requestTimeout
        let deadline = ContinuousClock.now + limit
        var iterator = makeAsyncIterator()
        while true {
            guard let event = try await iterator.next(until: deadline, what: limit) else {
                throw .closed
            }
            if case .value(let s) = event { return s }
        }
    }

    /// An iterator over the events (all iterators of one subscription read the same queue: iterate one at a time).
    public func makeAsyncIterator() -> Iterator {
        Iterator(token: token, decode: decode)
    }

    /// Decodes values as they are consumed.
    public struct Iterator: AsyncIteratorProtocol {
        let token: PathSubscriptionToken
        let decode: @Sendable (ArraySlice<UInt8>) throws(FluxError) -> Value
        var finished = false

        init(token: PathSubscriptionToken, decode: @escaping @Sendable (ArraySlice<UInt8>) throws(FluxError) -> Value) {
            self.token = token
            self.decode = decode
        }

        /// The next event; nil when the subscription ended (cancelled, closed, or the consumer's task cancelled).
        public mutating func next() async throws(FluxError) -> PathEvent<Value>? {
            try await next(until: nil, what: .zero, isolation: nil)
        }

        /// The next event (see `next()`).
        public mutating func next(isolation actor: isolated (any Actor)?) async throws(FluxError) -> PathEvent<Value>? {
            try await next(until: nil, what: .zero, isolation: actor)
        }

        mutating func next(until deadline: ContinuousClock.Instant?, what limit: Duration,
                           isolation actor: isolated (any Actor)? = #isolation) async throws(FluxError) -> PathEvent<Value>? {
            let core = token.core
            while !finished {
                switch await core.queue.next(until: deadline) {
                case .item(let event):
                    guard core.admit(event) else { continue }
                    switch event {
                    case .subscribed(let status, _): return .subscribed(status)
                    case .storeDown(let reason): return .storeDown(reason: reason)
                    case .storeUp(let version): return .storeUp(version: version)
                    case .subtree(let raw):
                        var value: Value?
                        if let bytes = raw.value {
                            do {
                                value = try decode(bytes)
                            } catch {
                                finished = true
                                core.cancel()
                                throw .coding("the value at \(raw.path) in \(raw.store) version \(raw.version) does not decode as \(Value.self): \(error)")
                            }
                        }
                        return .value(Subtree(store: raw.store, path: raw.path, version: raw.version, seq: raw.seq,
                                              exists: raw.exists, value: value))
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
                    let store = core.store, path = core.path
                    let within = limit.formatted
                    switch core.status?.status {
                    case .unknown?:
                        throw .timedOut("no store named '\(store)' has registered yet (no value at \(path) within \(within))")
                    case .down?:
                        throw .timedOut("store '\(store)' is down (\(core.status?.downReason ?? "unknown reason")) and sent no value at \(path) within \(within)")
                    case .up?:
                        throw .timedOut("no change of store '\(store)' touched \(path) within \(within)")
                    case nil:
                        throw .timedOut("fluxd did not confirm the subscription to \(path) in '\(store)' within \(within)")
                    }
                }
            }
            return nil
        }
    }
}
