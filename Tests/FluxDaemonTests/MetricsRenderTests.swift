import FluxDaemon
import FluxRouter
import Prometheus
import Testing

/// fluxd renders its per-store series itself (through swift-prometheus' registry each new labelled series copied
/// its family: a refresh of 1,000 stores x 64 codes took 94 s, issue 25); this checks that rendering against the
/// registry's own exposition of the same series, as the reference, on random stores.
@Suite("Per-store metrics: fluxd's exposition against swift-prometheus' registry (differential)")
struct MetricsRenderTests {
    /// The exposition's lines as a set (the registry orders series by its dictionaries), and whether each family's
    /// HELP and TYPE come right before its series.
    private func lines(_ bytes: [UInt8]) -> Set<String> {
        Set(String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init))
    }

    private func reference(_ stores: [RouterMetricsSample.Store]) -> [UInt8] {
        let registry = PrometheusCollectorRegistry()
        let help = Dictionary(uniqueKeysWithValues: FluxMetrics.storeFamilies.map { ($0.name, $0.help) })
        func d(_ name: String) -> MetricNameDescriptor { MetricNameDescriptor(metricName: name, unitName: "", helpText: help[name]!) }
        for s in stores {
            let labels = [("store", s.name)]
            registry.makeGauge(descriptor: d("fluxbus_store_queue_depth"), labels: labels).set(Int64(s.queued + s.inflight))
            registry.makeGauge(descriptor: d("fluxbus_store_subscribers"), labels: labels).set(Int64(s.subscribers))
            registry.makeGauge(descriptor: d("fluxbus_store_up"), labels: labels).set(Int64(s.up ? 1 : 0))
            registry.makeCounter(descriptor: d("fluxbus_actions_dispatched_total"), labels: labels).increment(by: Int64(s.stats.dispatched))
            registry.makeCounter(descriptor: d("fluxbus_actions_done_total"), labels: labels).increment(by: Int64(s.stats.done))
            for (code, n) in s.stats.rejected {
                registry.makeCounter(descriptor: d("fluxbus_actions_rejected_total"), labels: labels + [("code", code)]).increment(by: Int64(n))
            }
            // fluxd's own failure code is there from the start, at 0 (docs/metrics.md).
            var failed = s.stats.failed
            if failed["store-unavailable"] == nil { failed["store-unavailable"] = 0 }
            for (code, n) in failed {
                registry.makeCounter(descriptor: d("fluxbus_actions_failed_total"), labels: labels + [("code", code)]).increment(by: Int64(n))
            }
        }
        var out = registry.emitToBuffer()
        // The rejections' family is there from the start too, without series until a store rejects (the registry
        // writes no family without series).
        if !stores.isEmpty && !stores.contains(where: { !$0.stats.rejected.isEmpty }) {
            let name = "fluxbus_actions_rejected_total"
            out += Array("# HELP \(name) \(help[name]!)\n# TYPE \(name) counter\n".utf8)
        }
        return out
    }

    @Test("random stores (names and codes that need escaping, up to 64 codes): the same lines as the registry writes")
    func differential() {
        var generator = SystemRandomNumberGenerator()
        let names = ["todos", "a.b", "x-1", "quote\"d", "back\\slash", "line\nfeed", "é"]
        for round in 0..<200 {
            var stores: [RouterMetricsSample.Store] = []
            for i in 0..<Int.random(in: 0...6, using: &generator) {
                var stats = StoreStats()
                stats.dispatched = UInt64.random(in: 0...1_000_000, using: &generator)
                stats.done = UInt64.random(in: 0...stats.dispatched, using: &generator)
                for c in 0..<Int.random(in: 0...(round % 7 == 0 ? 64 : 3), using: &generator) {
                    stats.rejected["code-\(c)\(c % 5 == 0 ? "\"\\" : "")"] = UInt64.random(in: 1...99, using: &generator)
                }
                if Bool.random(using: &generator) { stats.failed["store-unavailable"] = UInt64.random(in: 1...9, using: &generator) }
                stores.append(.init(name: names[i % names.count] + "\(i)", up: Bool.random(using: &generator),
                                    queued: Int.random(in: 0...500, using: &generator), inflight: Int.random(in: 0...64, using: &generator),
                                    subscribers: Int.random(in: 0...9, using: &generator), version: 1, stats: stats))
            }
            let mine = FluxMetrics.renderStores(stores)
            #expect(lines(mine) == lines(reference(stores)), "round \(round)")
            // Each family's HELP and TYPE once, before its series.
            let text = String(decoding: mine, as: UTF8.self)
            for family in FluxMetrics.storeFamilies where text.contains("\n\(family.name){") || text.hasPrefix("# HELP \(family.name) ") {
                #expect(text.components(separatedBy: "# TYPE \(family.name) \(family.type)\n").count == 2)
            }
        }
    }

    @Test("1,000 stores x 64 codes render in one pass: bytes linear in the series")
    func large() {
        var stats = StoreStats()
        for c in 0..<64 { stats.rejected["code-\(c)"] = 1 }
        let stores = (0..<1_000).map { RouterMetricsSample.Store(name: "store-\($0)", up: true, queued: 0, inflight: 0, subscribers: 0, version: 1, stats: stats) }
        let text = String(decoding: FluxMetrics.renderStores(stores), as: UTF8.self)
        #expect(text.split(separator: "\n").filter { $0.hasPrefix("fluxbus_actions_rejected_total{") }.count == 64_000)
    }
}
