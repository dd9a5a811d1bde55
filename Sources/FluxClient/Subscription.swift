import FluxCore
import Foundation
import Synchronization

/// Shared between a subscription's token and its stream's termination handler: removes the local subscriber once.
final class SubscriptionCore: Sendable {
    private let client: FluxClient
    private let store: String
    private let state = Mutex<(id: Int?, cancelled: Bool)>((nil, false))

    init(client: FluxClient, store: String) {
        self.client = client
        self.store = store
    }

    func attach(_ id: Int?) {
        guard let id else { return }
        let cancelNow = state.withLock { s -> Bool in
            s.id = id
            return s.cancelled
        }
        if cancelNow { client.removeSubscriber(store: store, id: id) }
    }

    func cancel() {
        let id = state.withLock { s -> Int? in
            if s.cancelled { return nil }
            s.cancelled = true
            return s.id
        }
        if let id { client.removeSubscriber(store: store, id: id) }
    }
}

/// Ends a subscription when the last holder (the `Subscription` value or its iterator) lets go of it.
final class SubscriptionToken: Sendable {
    let core: SubscriptionCore
    init(_ core: SubscriptionCore) { self.core = core }
    deinit { core.cancel() }
}

/// A live subscription to one store: an `AsyncSequence` of `StoreEvent<S>` (see `FluxClient.subscribe`).
///
/// Iterate it once. It unsubscribes when its consumer is cancelled, when it and its iterator are dropped, or on
/// `cancel()`. Snapshots are decoded on the consumer's task; a snapshot never older than (or equal to) one already
/// yielded is passed on.
public struct Subscription<S: Decodable & Sendable>: AsyncSequence, Sendable {
    public typealias Element = StoreEvent<S>
    public typealias Failure = any Error

    /// The store subscribed to.
    public let store: String
    let stream: AsyncThrowingStream<WireStoreEvent, any Error>
    let token: SubscriptionToken

    init(store: String, stream: AsyncThrowingStream<WireStoreEvent, any Error>, token: SubscriptionToken) {
        self.store = store
        self.stream = stream
        self.token = token
    }

    /// Ends the subscription now: the sequence finishes, and `unsubscribe` is sent if no other local
    /// subscription to the store remains.
    public func cancel() { token.core.cancel() }

    /// Only the snapshots (skipping status events).
    public var snapshots: AsyncCompactMapSequence<Subscription<S>, Snapshot<S>> {
        compactMap { $0.snapshot }
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(base: stream.makeAsyncIterator(), token: token)
    }

    /// Decodes events as they are consumed.
    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<WireStoreEvent, any Error>.Iterator
        let token: SubscriptionToken
        var lastVersion = 0
        var finished = false
        let decoder = JSONDecoder()

        init(base: AsyncThrowingStream<WireStoreEvent, any Error>.Iterator, token: SubscriptionToken) {
            self.base = base
            self.token = token
        }

        public mutating func next() async throws -> StoreEvent<S>? {
            while !finished {
                guard let event = try await base.next() else {
                    finished = true
                    return nil
                }
                switch event {
                case .subscribed(let status):
                    return .subscribed(status)
                case .storeDown(let reason):
                    return .storeDown(reason: reason)
                case .storeUp(let version):
                    return .storeUp(version: version)
                case .snapshot(let raw):
                    if raw.version <= lastVersion { continue }
                    let state: S
                    do {
                        state = try decoder.decode(S.self, from: Data(raw.state))
                    } catch {
                        finished = true
                        token.core.cancel()
                        throw FluxError.coding("snapshot \(raw.version) of \(raw.store) does not decode as \(S.self): \(error)")
                    }
                    lastVersion = raw.version
                    return .snapshot(Snapshot(store: raw.store, version: raw.version, seq: raw.seq, state: state))
                }
            }
            return nil
        }
    }
}
