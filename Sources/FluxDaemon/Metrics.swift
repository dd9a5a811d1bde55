import FluxCore
import FluxJournal
import FluxRouter
import Foundation
import Glibc
import Prometheus
import Synchronization

/// fluxd's Prometheus metrics (`fluxd --metrics ADDRESS`, docs/metrics.md), served as text exposition by
/// `MetricsServer`.
///
/// The router counts each store's actions in plain integers as they happen (`StoreStats`: no atomics, locks or
/// calls on the hot path). A scrape (on the server's thread) wakes the loop, where `refresh` copies them, the
/// gauges and the daemon's other counters (traffic, errors, journal, workers) into a swift-prometheus
/// `PrometheusCollectorRegistry` and renders the per-store latency histograms (`LatencyHistogram`, exposition by
/// `renderHistograms`, checked against swift-prometheus' own histogram by a differential test); the scrape waits
/// for that (at most a second, then it serves the previous values). Nothing is done between scrapes.
public final class FluxMetrics: Sendable {
    /// Counters and gauges (thread-safe).
    public let registry = PrometheusCollectorRegistry()
    /// The rendered latency histograms (replaced by each refresh, read by scrapes).
    private let histograms = Mutex<[UInt8]>([])
    /// Journal syncs (recorded on the loop or on the sync thread: a few per second at most).
    private let syncLatency: DurationHistogram
    /// Loop-thread state of `refresh`: the metrics made so far and the counter values last copied.
    private let state = Mutex<RefreshState>(RefreshState())
    private let started = monotonicNanoseconds()
    /// How many refreshes were done (a scrape waits for the next one).
    private let refreshes = NSCondition()
    private nonisolated(unsafe) var refreshCount: UInt64 = 0  // under `refreshes`

    struct RefreshState: Sendable {
        var gauges: [String: Gauge] = [:]
        var counters: [String: Counter] = [:]
        /// The counter values last copied into the registry (counters only grow: each refresh adds the difference).
        var copied: [String: UInt64] = [:]
    }

    /// The latency histograms' name and help.
    static let latencyName = "fluxbus_action_latency_seconds"
    static let latencyHelp = "From the action's acceptance by fluxd to the store's answer (done or reject), per store."

    public init(version: String = FluxBusVersion.string) {
        registry.makeGauge(descriptor: descriptor("fluxbus_build_info", "The running fluxd's release (always 1)."),
                           labels: [("version", version)]).set(Int64(1))
        syncLatency = registry.makeDurationHistogram(
            descriptor: descriptor("fluxbus_journal_sync_seconds", "How long each fdatasync of the journal took."),
            buckets: LatencyHistogram.bounds.map { .nanoseconds(Int64($0)) })
    }

    /// The router's clock (`RouterConfig.metricsClock`).
    public static let clock: MetricsClock = { monotonicNanoseconds() }

    /// What the journal's sync observer calls (any thread).
    public var journalSyncObserver: @Sendable (UInt64) -> Void {
        { [syncLatency] nanos in syncLatency.recordNanoseconds(Int64(clamping: nanos)) }
    }

    /// The whole exposition (any thread).
    public func exposition() -> [UInt8] {
        registry.emitToBuffer() + histograms.withLock { $0 }
    }

    /// Asks for a refresh (`wake`: makes the loop call `refresh`) and waits until one is done, at most `timeout`
    /// seconds (then the previous values are served). Not on the loop thread.
    public func refreshAndWait(timeout: Double = 1, wake: () -> Void) {
        refreshes.lock()
        let before = refreshCount
        refreshes.unlock()
        wake()
        let deadline = Date(timeIntervalSinceNow: timeout)
        refreshes.lock()
        while refreshCount == before && refreshes.wait(until: deadline) {}
        refreshes.unlock()
    }

    /// Copies the router's, the journal's and the workers' numbers into the registry (loop thread).
    public func refresh(_ sample: RouterMetricsSample, journal: Journal?, workerRestarts: [String: Int]) {
        state.withLock { state in
            func gauge(_ name: String, _ labels: [(String, String)] = [], help: String) -> Gauge {
                let k = key(name, labels)
                if let g = state.gauges[k] { return g }
                let g = registry.makeGauge(descriptor: descriptor(name, help), labels: labels)
                state.gauges[k] = g
                return g
            }
            func count(_ name: String, _ value: UInt64, _ labels: [(String, String)] = [], help: String) {
                let k = key(name, labels)
                let counter: Counter
                if let c = state.counters[k] {
                    counter = c
                } else {
                    counter = registry.makeCounter(descriptor: descriptor(name, help), labels: labels)
                    state.counters[k] = counter
                }
                let before = state.copied[k] ?? 0
                guard value > before else { return }
                counter.increment(by: Int64(clamping: value - before))
                state.copied[k] = value
            }

            gauge("fluxbus_uptime_seconds", help: "Seconds since fluxd started.").set(Double(monotonicNanoseconds() &- started) / 1e9)
            gauge("fluxbus_actions_unsettled", help: "Actions accepted and not settled yet.").set(Int64(sample.unsettled))
            for role in ["client", "store", "monitor", "handshake"] {
                gauge("fluxbus_connections", [("role", role)], help: "Open connections by role (handshake: no hello yet).")
                    .set(Int64(sample.connections[role] ?? 0))
            }
            for store in sample.stores {
                let labels = [("store", store.name)]
                gauge("fluxbus_store_queue_depth", labels,
                      help: "Actions waiting for the store: queued (not delivered yet) and in flight (delivered, not answered).")
                    .set(Int64(store.queued + store.inflight))
                gauge("fluxbus_store_subscribers", labels, help: "Subscriptions to the store (whole, delta and path).")
                    .set(Int64(store.subscribers))
                gauge("fluxbus_store_up", labels, help: "1 while the store is registered, 0 while it is down.")
                    .set(Int64(store.up ? 1 : 0))
                let stats = store.stats
                count("fluxbus_actions_dispatched_total", stats.dispatched, labels, help: "Accepted actions targeting the store.")
                count("fluxbus_actions_done_total", stats.done, labels, help: "Actions the store answered done.")
                for (code, n) in stats.rejected {
                    count("fluxbus_actions_rejected_total", n, labels + [("code", code)],
                          help: "Actions the store rejected, by the store's error code (at most 64 codes per store; more count as other).")
                }
                for (code, n) in stats.failed {
                    count("fluxbus_actions_failed_total", n, labels + [("code", code)],
                          help: "Actions fluxd gave up for the store without an answer (store-unavailable, ...).")
                }
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
                count("fluxbus_errors_total", n, [("code", code)], help: "Error frames sent, by code (SPEC section 11).")
            }
            count("fluxbus_slow_consumer_closes_total", sample.counters.errors[ErrorCode.slowConsumer.rawValue] ?? 0,
                  help: "Connections closed because they did not read what was sent to them.")
            if let journal {
                count("fluxbus_journal_written_bytes_total", journal.bytesWritten, help: "Bytes written to the journal.")
                count("fluxbus_journal_writes_total", journal.writes, help: "write calls on the journal (one per loop iteration with records).")
                count("fluxbus_journal_syncs_total", journal.syncs, help: "fdatasync calls on the journal.")
            }
            for (worker, restarts) in workerRestarts {
                count("fluxbus_worker_restarts_total", UInt64(max(0, restarts)), [("worker", worker)],
                      help: "Restarts of a supervised worker.")
            }
        }
        let rendered = Self.renderHistograms(name: Self.latencyName, help: Self.latencyHelp,
                                             series: sample.stores.filter { $0.stats.latency.count > 0 }
                                                 .map { ([("store", $0.name)], $0.stats.latency) })
        histograms.withLock { $0 = rendered }
        refreshes.lock()
        refreshCount &+= 1
        refreshes.broadcast()
        refreshes.unlock()
    }

    private func key(_ name: String, _ labels: [(String, String)]) -> String {
        labels.reduce(name) { $0 + "\u{0}" + $1.0 + "=" + $1.1 }
    }

    /// Prometheus text exposition (0.0.4) of histograms with `LatencyHistogram.bounds` as buckets, in seconds:
    /// HELP and TYPE once, then per series the cumulative `_bucket` lines, `+Inf`, `_sum` and `_count`. Empty
    /// without series.
    public static func renderHistograms(name: String, help: String, series: [([(String, String)], LatencyHistogram)]) -> [UInt8] {
        guard !series.isEmpty else { return [] }
        var out = "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (labels, histogram) in series {
            let rendered = labels.map { "\($0.0)=\"\(escapeLabelValue($0.1))\"" }.joined(separator: ",")
            let prefix = rendered.isEmpty ? "" : rendered + ","
            var cumulative: UInt64 = 0
            for (i, bound) in LatencyHistogram.bounds.enumerated() {
                cumulative += histogram.counts.isEmpty ? 0 : histogram.counts[i]
                out += "\(name)_bucket{\(prefix)le=\"\(seconds(bound))\"} \(cumulative)\n"
            }
            out += "\(name)_bucket{\(prefix)le=\"+Inf\"} \(histogram.count)\n"
            let braces = rendered.isEmpty ? "" : "{\(rendered)}"
            out += "\(name)_sum\(braces) \(seconds(histogram.sum))\n"
            out += "\(name)_count\(braces) \(histogram.count)\n"
        }
        return Array(out.utf8)
    }

    /// Nanoseconds as decimal seconds, exactly (`50000` -> `0.00005`, `1000000000` -> `1.0`).
    static func seconds(_ nanoseconds: UInt64) -> String {
        let whole = nanoseconds / 1_000_000_000, fraction = nanoseconds % 1_000_000_000
        guard fraction > 0 else { return "\(whole).0" }
        var digits = String(fraction)
        digits = String(repeating: "0", count: 9 - digits.count) + digits
        while digits.hasSuffix("0") { digits.removeLast() }
        return "\(whole).\(digits)"
    }

    /// A label value as the text format wants it: backslash, double quote and line feed escaped.
    static func escapeLabelValue(_ value: String) -> String {
        var out = ""
        for c in value {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(c)
            }
        }
        return out
    }
}


/// A metric's name and help text (the name is whole: no namespace or unit parts are added).
func descriptor(_ name: String, _ help: String) -> MetricNameDescriptor {
    MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
}
