import Synchronization

/// Proof that a query is active on a store (WordPressFlux's Receipt): the query lasts as long as the receipt.
/// `cancel()`, or releasing the last reference, sends `unquery`. Keep it alive for as long as the view needs the data.
public final class QueryReceipt: Sendable {
    /// The query id on this connection.
    public let id: String
    /// The store queried.
    public let store: String
    private let client: FluxClient
    private let cancelled = Mutex(false)

    init(client: FluxClient, id: String, store: String) {
        self.client = client
        self.id = id
        self.store = store
    }

    /// Withdraws the query (idempotent; a no-op once the connection has ended).
    public func cancel() {
        let first = cancelled.withLock { c -> Bool in
            defer { c = true }
            return !c
        }
        if first && !client.isClosed { client.unquery(id: id) }
    }

    /// Whether `cancel()` was called.
    public var isCancelled: Bool { cancelled.withLock { $0 } }

    deinit { cancel() }
}
