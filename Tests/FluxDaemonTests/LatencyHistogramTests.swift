import FluxDaemon
import FluxRouter
import Prometheus
import Testing

/// fluxd renders its per-store latency histograms itself (recording into swift-prometheus' `Histogram` cost the hot
/// path ~600 instructions per action, docs/metrics.md); this checks the rendering against that library's, as the
/// reference, on random observations.
@Suite("Latency histograms: fluxd's exposition against swift-prometheus' (differential)")
struct LatencyHistogramTests {
    /// `series -> value` of an exposition's samples, values parsed as numbers (`0.00005` = `5e-05`).
    private func samples(_ bytes: [UInt8]) -> [String: Double] {
        var out: [String: Double] = [:]
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " ") else { continue }
            var series = String(line[..<space])
            // le="0.00005" and le="5e-05" are the same bucket: normalise the bound through Double.
            if let start = series.range(of: "le=\""), let end = series[start.upperBound...].firstIndex(of: "\"") {
                let bound = String(series[start.upperBound..<end])
                let normal = bound == "+Inf" ? bound : "\(Double(bound)!)"
                series = String(series[..<start.upperBound]) + normal + String(series[end...])
            }
            out[series] = Double(line[line.index(after: space)...])
        }
        return out
    }

    @Test("random observations (0 ns to 20 s, bucket edges included): the same buckets, sum and count as swift-prometheus")
    func differential() {
        var generator = SystemRandomNumberGenerator()
        let edges = LatencyHistogram.bounds.flatMap { [$0 - 1, $0, $0 + 1] }
        for round in 0..<200 {
            let registry = PrometheusCollectorRegistry()
            let reference = registry.makeDurationHistogram(
                descriptor: MetricNameDescriptor(metricName: "h", unitName: "", helpText: "x"),
                labels: [("store", "s\(round)")], buckets: LatencyHistogram.bounds.map { .nanoseconds(Int64($0)) })
            var mine = LatencyHistogram()
            for _ in 0..<Int.random(in: 0...300, using: &generator) {
                let value: UInt64 = Bool.random(using: &generator)
                    ? edges.randomElement(using: &generator)!
                    : UInt64.random(in: 0...20_000_000_000, using: &generator)
                mine.record(value)
                reference.recordNanoseconds(Int64(value))
            }
            let ours = samples(FluxMetrics.renderHistograms(name: "h", help: "x", series: [([("store", "s\(round)")], mine)]))
            let theirs = samples(registry.emitToBuffer())
            #expect(ours == theirs, "round \(round)")
        }
    }

    @Test("label values are escaped; HELP and TYPE come once for several series")
    func rendering() {
        var h = LatencyHistogram()
        h.record(50_000)
        let text = String(decoding: FluxMetrics.renderHistograms(
            name: "h", help: "help", series: [([("store", "a")], h), ([("code", "x\"y\\z\n")], h)]), as: UTF8.self)
        #expect(text.components(separatedBy: "# TYPE h histogram\n").count == 2)
        #expect(text.contains(#"h_bucket{code="x\"y\\z\n",le="0.00005"} 1"#))
        #expect(text.contains("h_sum{store=\"a\"} 0.00005\nh_count{store=\"a\"} 1\n"))
    }
}
