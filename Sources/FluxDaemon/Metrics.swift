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
/// calls on the hot path). A scrape (on the server's thread) wakes the loop, where `refresh` only takes a snapshot
/// of them (`Router.metricsSample()`, the journal's and the workers' numbers) and hands it over; the scrape waits
/// for that (at most a second, then it serves the previous snapshot). On the scrape's thread the bus-wide numbers
/// go into a swift-prometheus `PrometheusCollectorRegistry` (a fixed set of series), and the per-store series and
/// latency histograms are rendered here (`renderStores`, `renderHistograms`: linear in the stores and their codes,
/// checked against the registry's and swift-prometheus' histogram's own exposition by differential tests).
/// Nothing is done between scrapes.
public final class FluxMetrics: Sendable {
    /// Counters and gauges (thread-safe).
    public let registry = PrometheusCollectorRegistry()
    /// What the loop handed over at the last refresh (read by scrapes).
    private let latest = Mutex<Snapshot?>(nil)
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
        /// The process's CPU seconds last copied.
        var copiedSeconds: Double = 0
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

    /// The whole exposition (any thread; the scrape's): the bus-wide series through the registry, the per-store
    /// ones and the latency histograms rendered here, all from the loop's last snapshot.
    public func exposition() -> [UInt8] {
        guard let snapshot = latest.withLock({ $0 }) else { return registry.emitToBuffer() }
        let stores = snapshot.sample.stores.sorted { $0.name < $1.name }
        update(from: snapshot)
        let latency = stores.filter { $0.stats.latency.count > 0 }.map { ([("store", $0.name)], $0.stats.latency) }
        // (The latency family is there from the start, without series until a store answers.)
        let histograms = latency.isEmpty ? Array("# HELP \(Self.latencyName) \(Self.latencyHelp)\n# TYPE \(Self.latencyName) histogram\n".utf8)
            : Self.renderHistograms(name: Self.latencyName, help: Self.latencyHelp, series: latency)
        return registry.emitToBuffer() + Self.renderStores(stores) + histograms
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
        // On the loop: only the snapshot is kept (the router's sample is a copy of plain integers, per store a few
        // words and its stats' copy-on-write dictionaries). Everything else happens on the scrape's thread.
        let snapshot = Snapshot(sample: sample, uptime: Double(monotonicNanoseconds() &- started) / 1e9,
                                journal: journal.map { ($0.bytesWritten, $0.writes, $0.syncs) },
                                workerRestarts: workerRestarts)
        latest.withLock { $0 = snapshot }
        refreshes.lock()
        refreshCount &+= 1
        refreshes.broadcast()
        refreshes.unlock()
    }

    /// What the loop handed over at the last refresh.
    struct Snapshot: Sendable {
        var sample: RouterMetricsSample
        var uptime: Double
        var journal: (bytes: UInt64, writes: UInt64, syncs: UInt64)?
        var workerRestarts: [String: Int]
    }

    /// Copies the bus-wide numbers of `snapshot` into the registry (the scrape's thread): a fixed set of series,
    /// plus one per error code and per worker.
    private func update(from snapshot: Snapshot) {
        let sample = snapshot.sample
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

            gauge("fluxbus_uptime_seconds", help: "Seconds since fluxd started.").set(snapshot.uptime)
            gauge("fluxbus_actions_unsettled", help: "Actions accepted and not settled yet.").set(Int64(sample.unsettled))
            for role in ["client", "store", "monitor", "handshake"] {
                gauge("fluxbus_connections", [("role", role)], help: "Open connections by role (handshake: no hello yet).")
                    .set(Int64(sample.connections[role] ?? 0))
            }
            let t = sample.counters.traffic
            count("fluxbus_connections_accepted_total", t.connections, help: "Connections accepted.")
            count("fluxbus_frames_received_total", t.framesIn, help: "Frames received from peers.")
            count("fluxbus_frames_sent_total", t.framesOut, help: "Frames sent to peers.")
            count("fluxbus_received_bytes_total", t.bytesIn, help: "Frame bytes received from peers.")
            count("fluxbus_sent_bytes_total", t.bytesOut, help: "Frame bytes sent to peers (snapshots, deltas, settlements, ...).")
            count("fluxbus_actions_accepted_total", t.actions, help: "Actions accepted (each counted once, whatever its targets).")
            count("fluxbus_snapshots_sent_total", t.snapshots, help: "Snapshot frames sent to subscribers.")
            // Every code of SPEC section 11 from the start (0 until it is sent), and any other code fluxd counted.
            for code in Set(ErrorCode.allCases.map(\.rawValue)).union(sample.counters.errors.keys).sorted() {
                count("fluxbus_errors_total", sample.counters.errors[code] ?? 0, [("code", code)],
                      help: "Error frames sent, by code (SPEC section 11).")
            }
            gauge("fluxbus_memory_used_bytes", help: "Bytes fluxd accounts for on behalf of peers (its memory budget, docs/limits.md).")
                .set(Int64(sample.memoryUsed))
            gauge("fluxbus_memory_limit_bytes", help: "The memory budget (--memory-budget).").set(Int64(sample.memoryLimit))
            gauge("fluxbus_memory_per_user_bytes", help: "One user's share of the memory budget (--memory-per-user).")
                .set(Int64(sample.memoryPerUser))
            count("fluxbus_memory_refusals_total", sample.memoryRefusals, help: "Requests refused because they did not fit the memory budget.")
            let process = ProcessStats.read()
            // The standard process metrics (the names and help of the Prometheus client libraries), from /proc.
            let cpuKey = "process_cpu_seconds_total"
            let cpu: Counter
            if let c = state.counters[cpuKey] { cpu = c } else {
                cpu = registry.makeCounter(descriptor: descriptor(cpuKey, "Total user and system CPU time spent in seconds."))
                state.counters[cpuKey] = cpu
            }
            if process.cpuSeconds > state.copiedSeconds { cpu.increment(by: process.cpuSeconds - state.copiedSeconds) }
            state.copiedSeconds = max(state.copiedSeconds, process.cpuSeconds)
            gauge("process_resident_memory_bytes", help: "Resident memory size in bytes.").set(Int64(process.residentBytes))
            gauge("process_virtual_memory_bytes", help: "Virtual memory size in bytes.").set(Int64(process.virtualBytes))
            gauge("process_open_fds", help: "Number of open file descriptors.").set(Int64(process.openFDs))
            gauge("process_max_fds", help: "Maximum number of open file descriptors.").set(Int64(process.maxFDs))
            gauge("process_start_time_seconds", help: "Start time of the process since unix epoch in seconds.").set(process.startTime)
            count("fluxbus_slow_consumer_closes_total", sample.counters.errors[ErrorCode.slowConsumer.rawValue] ?? 0,
                  help: "Connections closed because they did not read what was sent to them.")
            if let journal = snapshot.journal {
                count("fluxbus_journal_written_bytes_total", journal.bytes, help: "Bytes written to the journal.")
                count("fluxbus_journal_writes_total", journal.writes, help: "write calls on the journal (one per loop iteration with records).")
                count("fluxbus_journal_syncs_total", journal.syncs, help: "fdatasync calls on the journal.")
            }
            for (worker, restarts) in snapshot.workerRestarts {
                count("fluxbus_worker_restarts_total", UInt64(max(0, restarts)), [("worker", worker)],
                      help: "Restarts of a supervised worker.")
            }
        }
    }

    /// The per-store families, help texts in `renderStores`' order.
    public static let storeFamilies: [(name: String, type: String, help: String)] = [
        ("fluxbus_store_queue_depth", "gauge", "Actions waiting for the store: queued (not delivered yet) and in flight (delivered, not answered)."),
        ("fluxbus_store_subscribers", "gauge", "Subscriptions to the store (whole, delta and path)."),
        ("fluxbus_store_up", "gauge", "1 while the store is registered, 0 while it is down."),
        ("fluxbus_actions_dispatched_total", "counter", "Accepted actions targeting the store."),
        ("fluxbus_actions_done_total", "counter", "Actions the store answered done."),
        ("fluxbus_actions_rejected_total", "counter", "Actions the store rejected, by the store's error code (at most 64 codes per store; more count as other)."),
        ("fluxbus_actions_failed_total", "counter", "Actions fluxd gave up for the store without an answer (store-unavailable, ...)."),
    ]

    /// The per-store series in Prometheus text exposition (0.0.4), rendered here in one pass: linear in the
    /// stores and their codes. (Through swift-prometheus' registry each new labelled series copied its family, so
    /// a refresh was quadratic in new series: 1,000 stores x 64 codes took 94 s. `MetricsRenderTests` checks this
    /// against the registry's own exposition.) Gauges are written as the registry writes a `Double`, counters as
    /// integers; a store's counters are its cumulative `StoreStats` (they start again at 0 if fluxd forgets the
    /// store and hears of it again, which Prometheus reads as a counter reset).
    public static func renderStores(_ stores: [RouterMetricsSample.Store]) -> [UInt8] {
        guard !stores.isEmpty else { return [] }
        var out: [UInt8] = []
        out.reserveCapacity(stores.count * 600)
        func family(_ index: Int) {
            let f = storeFamilies[index]
            out.append(contentsOf: "# HELP \(f.name) \(f.help)\n# TYPE \(f.name) \(f.type)\n".utf8)
        }
        func line(_ name: String, _ store: String, code: String? = nil, _ value: String) {
            out.append(contentsOf: name.utf8)
            out.append(contentsOf: "{store=\"".utf8)
            out.append(contentsOf: escapeLabelValue(store).utf8)
            if let code {
                out.append(contentsOf: "\",code=\"".utf8)
                out.append(contentsOf: escapeLabelValue(code).utf8)
            }
            out.append(contentsOf: "\"} ".utf8)
            out.append(contentsOf: value.utf8)
            out.append(UInt8(ascii: "\n"))
        }
        let names = storeFamilies.map(\.name)
        family(0); for s in stores { line(names[0], s.name, "\(Double(s.queued + s.inflight))") }
        family(1); for s in stores { line(names[1], s.name, "\(Double(s.subscribers))") }
        family(2); for s in stores { line(names[2], s.name, "\(Double(s.up ? 1 : 0))") }
        family(3); for s in stores { line(names[3], s.name, "\(s.stats.dispatched)") }
        family(4); for s in stores { line(names[4], s.name, "\(s.stats.done)") }
        // Both families from the start: rejections by the stores' own codes (none known ahead: the family alone), and
        // fluxd's failures with its one code at 0 until it happens.
        family(5)
        for s in stores { for code in s.stats.rejected.keys.sorted() { line(names[5], s.name, code: code, "\(s.stats.rejected[code]!)") } }
        family(6)
        let unavailable = ErrorCode.storeUnavailable.rawValue
        for s in stores {
            var failed = s.stats.failed
            if failed[unavailable] == nil { failed[unavailable] = 0 }
            for code in failed.keys.sorted() { line(names[6], s.name, code: code, "\(failed[code]!)") }
        }
        return out
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
