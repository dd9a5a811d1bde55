@testable import fluxctl
import FluxJSONValue
import Testing

/// `fluxctl top`'s and `fluxctl bench`'s views are pure functions of a sample: pinned here with fixed samples.
@Suite("fluxctl top and bench views")
struct TopViewTests {
    static let sample = TopSample(
        server: "fluxd/0.4.0", durability: "batch", socket: "/run/fluxbus/fluxd.sock", uptimeSeconds: 3723.4, seconds: 1.002,
        seq: 48213, actionsPerSecond: 1250.4, framesInPerSecond: 2501, framesOutPerSecond: 3760.2, bytesInPerSecond: 180_000,
        bytesOutPerSecond: 2_400_000, connections: 7, clients: 3, storeConnections: 2, monitors: 2, missedEvents: 0,
        stores: [
            .init(name: "todos", status: "up", stalled: false, version: 48000, subscribers: 3, queued: 2, inflight: 1, queries: 1,
                  actions: 1200, actionsPerSecond: 1197.6, latency: .init(p50: 1, p99: 4, max: 9, samples: 1200),
                  owner: "todo-store (pid 4242)"),
            .init(name: "stats", status: "up", stalled: true, version: 310, subscribers: 1, queued: 0, inflight: 0, queries: 0,
                  actions: 50, actionsPerSecond: 49.9, latency: .init(p50: 0, p99: 2, max: 2, samples: 50), owner: "stats-store (pid 4243)"),
            .init(name: "old", status: "down", stalled: false, version: 7, subscribers: 0, queued: 0, inflight: 0, queries: 0,
                  actions: 0, actionsPerSecond: 0, latency: nil, owner: nil),
        ])

    @Test("top renders a sample as the pinned screen, clipped to the width")
    func render() {
        let lines = Top.render(Self.sample, width: 200, color: false)
        #expect(lines == [
            "fluxd/0.4.0 at /run/fluxbus/fluxd.sock  durability batch  up 1h02m03s  seq 48213",
            "actions 1250/s  frames in 2501/s out 3760/s  bytes in 175.8 KiB/s out 2.3 MiB/s  (last 1.0 s)",
            "connections 7: 3 clients, 2 stores, 2 monitors (top's own 2 included)",
            "",
            "STORE  ACT/S  ACTIONS   P50   P99   MAX  QUEUED  INFLIGHT  SUBS  VERSION  STATUS      OWNER",
            "todos   1198     1200  1 ms  4 ms  9 ms       2         1     3    48000  up          todo-store (pid 4242)",
            "stats     50       50  0 ms  2 ms  2 ms       0         0     1      310  up stalled  stats-store (pid 4243)",
            "old        0        0     -     -     -       0         0     0        7  down        -",
        ], "\(lines.joined(separator: "\n"))")
        let narrow = Top.render(Self.sample, width: 40, color: false)
        #expect(narrow.allSatisfy { $0.count <= 40 })
        #expect(narrow[0] == "fluxd/0.4.0 at /run/fluxbus/fluxd.sock  ")
        let colored = Top.render(Self.sample, width: 100, color: true)
        #expect(colored[4].hasPrefix("\u{1B}[7mSTORE") && colored[4].hasSuffix("\u{1B}[0m"))
        var empty = Self.sample
        empty.stores = []
        #expect(Top.render(empty, width: 100, color: true).last == "no stores registered")
    }

    @Test("top --json of a sample: camelCase keys in a fixed order")
    func json() {
        #expect(Self.sample.json.compact == #"{"server":"fluxd/0.4.0","durability":"batch","socket":"/run/fluxbus/fluxd.sock","uptimeSeconds":3723.4,"intervalSeconds":1.002,"seq":48213,"actionsPerSecond":1250.4,"framesInPerSecond":2501.0,"framesOutPerSecond":3760.2,"bytesInPerSecond":180000.0,"bytesOutPerSecond":2400000.0,"connections":{"total":7,"client":3,"store":2,"monitor":2},"missedEvents":0,"stores":[{"name":"todos","status":"up","stalled":false,"version":48000,"subscribers":3,"queued":2,"inflight":1,"queries":1,"actions":1200,"actionsPerSecond":1197.6,"latencyMs":{"p50":1,"p99":4,"max":9,"samples":1200},"owner":"todo-store (pid 4242)"},{"name":"stats","status":"up","stalled":true,"version":310,"subscribers":1,"queued":0,"inflight":0,"queries":0,"actions":50,"actionsPerSecond":49.9,"latencyMs":{"p50":0,"p99":2,"max":2,"samples":50},"owner":"stats-store (pid 4243)"},{"name":"old","status":"down","stalled":false,"version":7,"subscribers":0,"queued":0,"inflight":0,"queries":0,"actions":0,"actionsPerSecond":0.0}]}"#)
    }

    @Test("a sample from two info replies: rates from the counters, stores by action rate, latency percentiles from the monitor's counts")
    func sampleFromInfo() throws {
        let before = try JSONValue(parsing: #"{"op":"info","seq":10,"stores":[],"peers":{"client":1,"store":1,"monitor":1},"counters":{"framesIn":100,"framesOut":200,"bytesIn":1000,"bytesOut":2000,"actions":10,"snapshots":0,"errors":{}}}"#)
        let after = try JSONValue(parsing: #"{"op":"info","seq":30,"stores":[{"name":"a","status":"up","handles":["a/*"],"waitFor":[],"version":3,"seq":12,"subscribers":0,"queued":0,"inflight":0,"queries":0,"owner":{"peer":2,"name":"","pid":77}},{"name":"b","status":"up","handles":["b/*"],"waitFor":[],"version":21,"seq":30,"subscribers":2,"queued":5,"inflight":1,"queries":0}],"peers":{"client":2,"store":1,"monitor":1},"counters":{"framesIn":140,"framesOut":260,"bytesIn":3000,"bytesOut":6000,"actions":30,"snapshots":0,"errors":{}},"load":{"connections":4,"handshakes":0,"storeNames":2,"longestLoopHoldMicros":1,"maxCycleCheckSteps":0}}"#)
        var counts = TopCounts()
        counts.actions = ["a": 2, "b": 18]
        counts.latencies = ["b": Array(1...18) + [], "a": [5, 7]]
        let s = TopSample(server: "fluxd/0.4.0", durability: nil, socket: "S", previous: before, current: after, seconds: 2, tally: counts)
        #expect(s.seq == 30 && s.actionsPerSecond == 10 && s.framesInPerSecond == 20 && s.bytesOutPerSecond == 2000)
        #expect(s.connections == 4 && s.clients == 2 && s.uptimeSeconds == nil)
        #expect(s.stores.map(\.name) == ["b", "a"])
        #expect(s.stores[0].actionsPerSecond == 9 && s.stores[0].latency == .init(p50: 9, p99: 18, max: 18, samples: 18))
        #expect(s.stores[1].owner == "peer 2 (pid 77)" && s.stores[1].latency == .init(p50: 5, p99: 7, max: 7, samples: 2))
    }

    @Test("bench's report: the pinned table and JSON keys")
    func benchReport() {
        let report = BenchReport(server: "fluxd/0.4.0", durability: "always", store: "bench.1.2",
                                 plan: BenchPlan(actions: 1000, window: 64, payloadBytes: 16, warmup: 100),
                                 results: [BenchResult(mode: .roundTrip, actions: 1000, seconds: 0.5, p50Us: 480, p90Us: 610.2, p99Us: 1250, p999Us: 2000, maxUs: 2_500_000),
                                           BenchResult(mode: .pipelined, actions: 1000, seconds: 0.05, p50Us: 3000, p90Us: 3500, p99Us: 4000, p999Us: 4100, maxUs: 4200)])
        #expect(report.text(socket: "S") == [
            "fluxd/0.4.0 at S, durability always (a settlement waits for the journal's fdatasync: the disk dominates latency)",
            "store bench.1.2, payload 16 B, warmup 100, window 64 (pipelined)",
            "",
            "MODE        ACTIONS  SECONDS  ACTIONS/S  P50      P90      P99      P99.9    MAX",
            "round trip  1000     0.500    2000       480 µs   610 µs   1.25 ms  2.00 ms  2.50 s",
            "pipelined   1000     0.050    20000      3.00 ms  3.50 ms  4.00 ms  4.10 ms  4.20 ms",
        ])
        #expect(report.json.compact == #"{"server":"fluxd/0.4.0","durability":"always","store":"bench.1.2","actionType":"bench.1.2/act","payloadBytes":16,"warmup":100,"window":64,"results":[{"mode":"roundTrip","actions":1000,"seconds":0.500000,"actionsPerSecond":2000.0,"p50Us":480.0,"p90Us":610.2,"p99Us":1250.0,"p999Us":2000.0,"maxUs":2500000.0},{"mode":"pipelined","actions":1000,"seconds":0.050000,"actionsPerSecond":20000.0,"p50Us":3000.0,"p90Us":3500.0,"p99Us":4000.0,"p999Us":4100.0,"maxUs":4200.0}]}"#)
        #expect(BenchPlan(actions: 1, window: 1, payloadBytes: 5, warmup: 0).payloadJSON == Array(#""xxx""#.utf8))
        #expect(BenchPlan(actions: 1, window: 1, payloadBytes: 0, warmup: 0).payloadJSON == nil)
    }
}
