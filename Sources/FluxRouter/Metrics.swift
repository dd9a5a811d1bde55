import FluxCore

/// Where the router reports what Prometheus-style metrics count per store (docs/metrics.md): set as
/// `RouterConfig.metrics` by a host that exports metrics (`fluxd --metrics`), nil otherwise — then the router does
/// no metrics work at all but a nil check per action.
///
/// Called on the router's thread only (fluxd's loop thread), synchronously, in the middle of handling an event:
/// an implementation counts and returns (no I/O, no locks held for long, no call back into the router).
public protocol RouterMetrics: AnyObject, Sendable {
    /// The metrics of one store, asked once when the router first knows the name (kept with the store's entry).
    func store(_ name: String) -> any StoreMetrics
    /// A monotonic clock in nanoseconds (dispatch-to-result latency is the difference of two readings).
    func nanoseconds() -> UInt64
}

/// What one store's metrics are told: each target of an accepted action, and each result it got.
public protocol StoreMetrics: AnyObject {
    /// An accepted action has this store as a target.
    func dispatched()
    /// The store answered `done` `nanoseconds` after the action was accepted.
    func done(nanoseconds: UInt64)
    /// The store answered `reject` with `code` (the store's own error code) `nanoseconds` after the action was accepted.
    func rejected(code: String, nanoseconds: UInt64)
    /// fluxd gave the action up for this store (`code`: `store-unavailable`, ...): no answer came.
    func failed(code: ErrorCode)
}

/// A point-in-time reading of the router for gauges (queue depths, subscribers, connections by role) and the
/// traffic counters, taken on the router's thread (`Router.metricsSample()`).
public struct RouterMetricsSample: Sendable {
    /// One store's gauges.
    public struct Store: Sendable, Equatable {
        public var name: String
        public var up: Bool
        /// Actions waiting to be delivered, and delivered but not answered.
        public var queued: Int
        public var inflight: Int
        public var subscribers: Int
        public var version: UInt64
    }
    public var stores: [Store] = []
    /// Connections by role (`client`, `store`, `monitor`; `handshake`: no hello yet).
    public var connections: [String: Int] = [:]
    /// The counters `info` reports (frames and bytes in and out, actions, snapshots, errors by code).
    public var counters = Counters()
    /// Actions accepted and not settled.
    public var unsettled: Int = 0
}

extension Router {
    /// Gauges and counters for a metrics scrape (see `RouterMetricsSample`).
    public func metricsSample() -> RouterMetricsSample {
        var sample = RouterMetricsSample()
        sample.counters = counters
        sample.unsettled = pendingCount
        for (name, s) in stores {
            sample.stores.append(.init(name: name, up: s.status == .up, queued: s.queue.count, inflight: s.inflight.count,
                                       subscribers: s.subscribers.count + s.deltaSubscribers.count + s.pathSubscribers.count,
                                       version: s.version))
        }
        sample.stores.sort { $0.name < $1.name }
        for p in peers.values {
            sample.connections[p.role?.rawValue ?? "handshake", default: 0] += 1
        }
        return sample
    }

    /// The code of a store's rejection (`reject.error.code`), read from the error object's bytes.
    static func rejectionCode(_ error: ArraySlice<UInt8>) -> String {
        (try? Envelope(body: Array(error)))?.string("code").value ?? "unknown"
    }
}
