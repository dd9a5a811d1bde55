import FluxCore
import FluxJournal
import FluxRouter
import Glibc
import Prometheus
import Synchronization

/// fluxd's Prometheus metrics (`fluxd --metrics ADDRESS`, docs/metrics.md), kept in a swift-prometheus
/// `PrometheusCollectorRegistry` and served as text exposition by `MetricsServer`.
///
/// Two sources: the router reports each store's actions as they happen (`RouterMetrics`: counters and a latency
/// histogram per store, recorded on the loop thread, one atomic add or a short lock per event), and the daemon
/// copies its gauges and its own plain counters (traffic, errors, journal, workers) into the registry once a
/// second on the loop thread (`refresh`): a scrape reads values at most a second old and never touches the loop.
public final class FluxMetrics: RouterMetrics, @unchecked Sendable {
    // @unchecked: `registry` is thread-safe; everything else is touched on the loop thread only (the router's
    // calls and `refresh`).
    public let registry = PrometheusCollectorRegistry()
    /// Latency buckets of the per-store dispatch-to-result histogram, and of journal syncs.
    static let latencyBuckets: [Duration] = [
        .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
        .milliseconds(2.5), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10),
    ]
    private let syncLatency: DurationHistogram
    private var stores: [String: PrometheusStoreMetrics] = [:]
    private var gauges: [String: Gauge] = [:]
    /// The counter values last copied into the registry (counters only grow: each refresh adds the difference).
    private var copied: [String: UInt64] = [:]
    private var counters: [String: Counter] = [:]
    private let started = monotonicClock()

    public init(version: String = FluxBusVersion.string) {
        registry.makeGauge(descriptor: descriptor("fluxbus_build_info", "The running fluxd's release (always 1)."), labels: [("version", version)]).set(Int64(1))
        syncLatency = registry.makeDurationHistogram(descriptor: descriptor("fluxbus_journal_sync_seconds", "How long each fdatasync of the journal took."), buckets: Self.latencyBuckets)
    }

    // MARK: RouterMetrics (loop thread)

    public func store(_ name: String) -> any StoreMetrics {
        if let known = stores[name] { return known }
        let metrics = PrometheusStoreMetrics(name: name, registry: registry)
        stores[name] = metrics
        return metrics
    }

    public func nanoseconds() -> UInt64 { monotonicClock() }

    /// What the journal's sync observer calls (any thread).
    public var journalSyncObserver: @Sendable (UInt64) -> Void {
        { [syncLatency] nanos in syncLatency.recordNanoseconds(Int64(clamping: nanos)) }
    }

    // MARK: Refresh (loop thread, once a second and before the first scrape)

    /// Copies the router's gauges and counters, the journal's and the workers' into the registry.
    public func refresh(_ sample: RouterMetricsSample, journal: Journal?, workerRestarts: [String: Int]) {
        gauge("fluxbus_uptime_seconds", help: "Seconds since fluxd started.").set(Double(monotonicClock() &- started) / 1e9)
        gauge("fluxbus_actions_unsettled", help: "Actions accepted and not settled yet.").set(Int64(sample.unsettled))
        for role in ["client", "store", "monitor", "handshake"] {
            gauge("fluxbus_connections", labels: [("role", role)], help: "Open connections by role (handshake: no hello yet).")
                .set(Int64(sample.connections[role] ?? 0))
        }
        for store in sample.stores {
            let labels = [("store", store.name)]
            gauge("fluxbus_store_queue_depth", labels: labels,
                  help: "Actions waiting for the store: queued (not delivered yet) and in flight (delivered, not answered).")
                .set(Int64(store.queued + store.inflight))
            gauge("fluxbus_store_subscribers", labels: labels, help: "Subscriptions to the store (whole, delta and path).")
                .set(Int64(store.subscribers))
            gauge("fluxbus_store_up", labels: labels, help: "1 while the store is registered, 0 while it is down.")
                .set(Int64(store.up ? 1 : 0))
        }
        let t = sample.counters.traffic
        count("fluxbus_connections_accepted_total", t.connections, help: "Connections accepted.")
        count("fluxbus_frames_received_total", t.framesIn, help: "Frames received from peers.")
        count("fluxbus_frames_sent_total", t.framesOut, help: "Frames sent to peers.")
        count("fluxbus_received_bytes_total", t.bytesIn, help: "Frame bytes received from peers.")
        count("fluxbus_sent_bytes_total", t.bytesOut, help: "Frame bytes sent to peers (snapshots, deltas, settlements, ...).")
        count("fluxbus_actions_accepted_total", t.actions, help: "Actions accepted (each counted once, whatever its targets).")
        count("fluxbus_snapshots_sent_total", t.snapshots, help: "Snapshot frames sent to subscribers.")
        for (code, n) in sample.counters.errors {
            count("fluxbus_errors_total", n, labels: [("code", code)], help: "Error frames sent, by code (SPEC §11).")
        }
        count("fluxbus_slow_consumer_closes_total", sample.counters.errors[ErrorCode.slowConsumer.rawValue] ?? 0,
              help: "Connections closed because they did not read what was sent to them.")
        if let journal {
            count("fluxbus_journal_written_bytes_total", journal.bytesWritten, help: "Bytes written to the journal.")
            count("fluxbus_journal_writes_total", journal.writes, help: "write calls on the journal (one per loop iteration with records).")
            count("fluxbus_journal_syncs_total", journal.syncs, help: "fdatasync calls on the journal.")
        }
        for (worker, restarts) in workerRestarts {
            count("fluxbus_worker_restarts_total", UInt64(max(0, restarts)), labels: [("worker", worker)],
                  help: "Restarts of a supervised worker.")
        }
    }

    private func key(_ name: String, _ labels: [(String, String)]) -> String {
        labels.reduce(name) { $0 + "\u{0}" + $1.0 + "=" + $1.1 }
    }

    private func gauge(_ name: String, labels: [(String, String)] = [], help: String) -> Gauge {
        let k = key(name, labels)
        if let g = gauges[k] { return g }
        let g = registry.makeGauge(descriptor: descriptor(name, help), labels: labels)
        gauges[k] = g
        return g
    }

    /// Adds to counter `name` what `value` grew since the last refresh.
    private func count(_ name: String, _ value: UInt64, labels: [(String, String)] = [], help: String) {
        let k = key(name, labels)
        let counter: Counter
        if let c = counters[k] {
            counter = c
        } else {
            counter = registry.makeCounter(descriptor: descriptor(name, help), labels: labels)
            counters[k] = counter
        }
        let before = copied[k] ?? 0
        guard value > before else { return }
        counter.increment(by: Int64(clamping: value - before))
        copied[k] = value
    }
}

/// One store's counters and latency histogram (`fluxbus_actions_*_total{store=...}`,
/// `fluxbus_action_latency_seconds{store=...}`). Loop thread only.
final class PrometheusStoreMetrics: StoreMetrics {
    private let name: String
    private let registry: PrometheusCollectorRegistry
    private let dispatchedCounter: Counter
    private let doneCounter: Counter
    private let latency: DurationHistogram
    private var rejectedCounters: [String: Counter] = [:]
    private var failedCounters: [ErrorCode: Counter] = [:]
    /// Distinct rejection codes get a series each up to this many; further ones count as `other` (a store's codes
    /// are its own: a store must not be able to grow fluxd's metrics without bound).
    static let maxRejectionCodes = 64

    init(name: String, registry: PrometheusCollectorRegistry) {
        self.name = name
        self.registry = registry
        dispatchedCounter = registry.makeCounter(descriptor: descriptor("fluxbus_actions_dispatched_total", "Accepted actions targeting the store."), labels: [("store", name)])
        doneCounter = registry.makeCounter(descriptor: descriptor("fluxbus_actions_done_total", "Actions the store answered done."), labels: [("store", name)])
        latency = registry.makeDurationHistogram(descriptor: descriptor("fluxbus_action_latency_seconds", "From the action's acceptance by fluxd to the store's answer (done or reject), per store."), labels: [("store", name)], buckets: FluxMetrics.latencyBuckets)
    }

    func dispatched() { dispatchedCounter.increment() }

    func done(nanoseconds: UInt64) {
        doneCounter.increment()
        latency.recordNanoseconds(Int64(clamping: nanoseconds))
    }

    func rejected(code: String, nanoseconds: UInt64) {
        latency.recordNanoseconds(Int64(clamping: nanoseconds))
        if let counter = rejectedCounters[code] { return counter.increment() }
        let label = rejectedCounters.count < Self.maxRejectionCodes ? code : "other"
        if let counter = rejectedCounters[label] { return counter.increment() }
        let counter = registry.makeCounter(descriptor: descriptor("fluxbus_actions_rejected_total", "Actions the store rejected, by the store's error code."), labels: [("store", name), ("code", label)])
        rejectedCounters[label] = counter
        counter.increment()
    }

    func failed(code: ErrorCode) {
        if let counter = failedCounters[code] { return counter.increment() }
        let counter = registry.makeCounter(descriptor: descriptor("fluxbus_actions_failed_total", "Actions fluxd gave up for the store without an answer (store-unavailable, shutting-down, ...)."), labels: [("store", name), ("code", code.rawValue)])
        failedCounters[code] = counter
        counter.increment()
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
@inline(__always)
func monotonicClock() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return UInt64(t.tv_sec) &* 1_000_000_000 &+ UInt64(t.tv_nsec)
}

/// A metric's name and help text (the name is whole: no namespace or unit parts are added).
func descriptor(_ name: String, _ help: String) -> MetricNameDescriptor {
    MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
}
