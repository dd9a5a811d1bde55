import FluxCore

/// A dispatch-to-answer latency histogram: plain counters in fixed buckets, recorded on the router's thread
/// (`fluxd --metrics`, docs/metrics.md). Buckets are Prometheus-style upper bounds in nanoseconds; `counts` has
/// one more entry than `bounds` (above the last bound: `+Inf`). Not cumulative (the exposition sums them).
public struct LatencyHistogram: Sendable, Equatable {
    /// Upper bounds, 50 µs ... 10 s.
    public static let bounds: [UInt64] = [
        50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000, 50_000_000,
        100_000_000, 250_000_000, 500_000_000, 1_000_000_000, 2_500_000_000, 5_000_000_000, 10_000_000_000,
    ]
    /// Observations per bucket (the first bucket whose bound is >= the value; the last: above every bound).
    public var counts: [UInt64] = []
    /// The sum of the observations, in nanoseconds, and how many there were.
    public var sum: UInt64 = 0
    public var count: UInt64 = 0

    public init() {}

    /// Counts one observation.
    @inline(__always)
    public mutating func record(_ nanoseconds: UInt64) {
        if counts.isEmpty { counts = [UInt64](repeating: 0, count: Self.bounds.count + 1) }
        var i = 0
        let bounds = Self.bounds
        while i < bounds.count && nanoseconds > bounds[i] { i += 1 }
        counts[i] &+= 1
        sum &+= nanoseconds
        count &+= 1
    }
}

/// What the router counts for one store while metrics are on (`RouterConfig.metricsClock` set): plain integers
/// in the store's entry, read by the host once a second (`Router.metricsSample()`).
public struct StoreStats: Sendable, Equatable {
    /// Accepted actions that target the store.
    public var dispatched: UInt64 = 0
    /// Answers `done`, and `reject` by the store's error code.
    public var done: UInt64 = 0
    public var rejected: [String: UInt64] = [:]
    /// Actions given up for the store without an answer, by fluxd's error code (`store-unavailable`, ...).
    public var failed: [String: UInt64] = [:]
    /// From the action's acceptance to the store's answer (`done` or `reject`).
    public var latency = LatencyHistogram()
    /// Distinct rejection codes counted on their own; more are counted as `other` (a store's codes are its own: it
    /// must not be able to grow fluxd's metrics without bound).
    public static let maxRejectionCodes = 64
    /// The most a store's series can take (every code at its longest, and the latency histogram): charged to the
    /// user that registers the store when metrics are on (`Router.register`), so series memory is its user's.
    public static let worstCaseBytes = maxRejectionCodes * (256 + 64) + MemoryLayout<LatencyHistogram>.size + 2048

    public init() {}

    mutating func reject(code: String) {
        if rejected[code] != nil || rejected.count < Self.maxRejectionCodes {
            rejected[code, default: 0] &+= 1
        } else {
            rejected["other", default: 0] &+= 1
        }
    }
}

/// A monotonic clock in nanoseconds for the metrics' latencies (fluxd: CLOCK_MONOTONIC; tests: their own). A C
/// function pointer, so that reading it costs the router no reference counting.
public typealias MetricsClock = @convention(c) () -> UInt64

/// A point-in-time reading of the router for metrics (`Router.metricsSample()`, on the router's thread): each
/// store's gauges and counters, connections by role, and the traffic counters `info` reports.
public struct RouterMetricsSample: Sendable {
    /// One store.
    public struct Store: Sendable, Equatable {
        public var name: String
        public var up: Bool
        /// Actions waiting to be delivered, and delivered but not answered.
        public var queued: Int
        public var inflight: Int
        public var subscribers: Int
        public var version: UInt64
        public var stats: StoreStats

        public init(name: String, up: Bool, queued: Int, inflight: Int, subscribers: Int, version: UInt64, stats: StoreStats) {
            self.name = name
            self.up = up
            self.queued = queued
            self.inflight = inflight
            self.subscribers = subscribers
            self.version = version
            self.stats = stats
        }
    }
    public var stores: [Store] = []
    /// Connections by role (`client`, `store`, `monitor`; `handshake`: no hello yet).
    public var connections: [String: Int] = [:]
    /// The counters `info` reports (frames and bytes in and out, actions, snapshots, errors by code).
    public var counters = Counters()
    /// Actions accepted and not settled.
    public var unsettled: Int = 0
    /// The memory budget (docs/limits.md): bytes accounted now, the budget, one user's share, and refusals since
    /// start.
    public var memoryUsed: Int = 0
    public var memoryLimit: Int = 0
    public var memoryPerUser: Int = 0
    public var memoryRefusals: UInt64 = 0
}

extension Router {
    /// Gauges and counters for metrics (see `RouterMetricsSample`).
    public func metricsSample() -> RouterMetricsSample {
        var sample = RouterMetricsSample()
        sample.counters = counters
        sample.unsettled = pendingCount
        sample.memoryUsed = memory.used
        sample.memoryLimit = config.memory.total
        sample.memoryPerUser = config.memory.perUser
        sample.memoryRefusals = memory.refusals
        for (name, s) in stores {
            sample.stores.append(.init(name: name, up: s.status == .up, queued: s.queue.count, inflight: s.inflight.count,
                                       subscribers: s.subscribers.count + s.deltaSubscribers.count + s.pathSubscribers.count,
                                       version: s.version, stats: s.stats))
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
