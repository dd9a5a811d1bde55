import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Histogram

/// fluxd's `info` through the SDK, as the JSON fluxd sent (so `--json` shows every field, in fluxd's order).
func fetchInfo(_ client: FluxClient, _ options: GlobalOptions) async throws -> JSONValue {
    let info = try await client.info(timeout: options.requestDuration)
    return (try? JSONValue(parsing: info.json)) ?? .null
}

/// `fluxctl stores`: a table of the stores fluxd knows.
struct Stores: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List stores: status, version, patterns, waitFor, subscribers, queue, owner pid and uid.",
        discussion: "QUEUED counts actions waiting for the store, INFLIGHT those delivered and not yet answered.")
    @OptionGroup var options: GlobalOptions

    func run() async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let info: JSONValue
        do {
            info = try await fetchInfo(client, options)
        } catch {
            throw failure(error, socket: options.socketPath)
        }
        guard case .array(let stores)? = info["stores"] else { return }
        if options.json {
            for store in stores { emit(store.compact) }
            return
        }
        if stores.isEmpty {
            emit("no stores registered")
            return
        }
        func list(_ v: JSONValue?) -> String {
            guard case .array(let items)? = v, !items.isEmpty else { return "-" }
            return items.compactMap(\.stringValue).joined(separator: ",")
        }
        func num(_ v: JSONValue?) -> String { v?.intValue.map(String.init) ?? "-" }
        let rows = stores.map { s -> [String] in
            var status = s["status"]?.stringValue ?? "?"
            let owner = s["owner"]
            let stalled = s["stalled"]?.boolValue == true
            if stalled { status += " (stalled \((s["stalledFor"]?.intValue ?? 0) / 1000) s)" }
            return [Style.bold(s["name"]?.stringValue ?? "?"), status == "up" ? Style.green(status) : Style.red(status),
                    num(s["version"]), list(s["handles"]), list(s["waitFor"]), num(s["subscribers"]),
                    num(s["queued"]), num(s["inflight"]), num(s["queries"]),
                    num(owner?["pid"]), num(owner?["uid"]), owner?["name"]?.stringValue ?? "-"]
        }
        for line in table(["STORE", "STATUS", "VERSION", "HANDLES", "WAITFOR", "SUBS", "QUEUED", "INFLIGHT", "QUERIES", "PID", "UID", "OWNER"], rows) {
            emit(line)
        }
    }
}

/// `fluxctl stats`: fluxd's counters; `--watch` refreshes them.
struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show fluxd's counters: connections, frames, bytes, actions, snapshots, errors, queues.",
        discussion: "With --watch, refreshes every --interval seconds and shows rates per second.")
    @OptionGroup var options: GlobalOptions
    @Flag(name: .long, help: "Refresh until interrupted.") var watch = false
    @Option(name: .long, help: ArgumentHelp("Seconds between refreshes with --watch.", valueName: "seconds")) var interval: Double = 2
    @Option(name: .long, help: "With --watch: exit after this many refreshes.") var count: Int?

    func validate() throws {
        if !(interval > 0) { throw ValidationError("--interval must be a positive number of seconds") }
    }

    func run() async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let options = self.options, watch = self.watch, interval = self.interval
        let limit = watch ? count : 1
        do {
            try await streamFor(watch ? options.timeout : nil, counted: count != nil, "watching stats") {
                var previous: (JSONValue, ContinuousClock.Instant)?
                var n = 0
                while true {
                    n += 1
                    let info = try await fetchInfo(client, options)
                    let now = ContinuousClock.now
                    let elapsed = previous.map { (now - $0.1) / .seconds(1) }
                    if options.json {
                        emit(Stats.json(info).compact)
                    } else {
                        if watch && Terminal.isTTY { FileHandle.standardOutput.write(Data("\u{1B}[H\u{1B}[2J".utf8)) }
                        else if n > 1 { emit("") }
                        for line in Stats.text(info, previous: previous?.0, elapsed: elapsed, socket: options.socketPath) { emit(line) }
                    }
                    previous = (info, now)
                    if let limit, n >= limit { return }
                    try await Task.sleep(for: .seconds(interval))
                }
            }
        } catch {
            throw failure(error, socket: options.socketPath)
        }
    }

    /// `{"seq","peers","counters","queues":[{"store","status","queued","inflight","subscribers"}]}`.
    static func json(_ info: JSONValue) -> JSONValue {
        var line = JSONLine()
        line.add("seq", info["seq"])
        line.add("peers", info["peers"])
        line.add("counters", info["counters"])
        line.add("memory", info["memory"])
        line.add("load", info["load"])
        if case .array(let stores)? = info["stores"] {
            line.add("queues", JSONValue.array(stores.map { s in
                var q = JSONLine()
                q.add("store", s["name"])
                q.add("status", s["status"])
                q.add("queued", s["queued"])
                q.add("inflight", s["inflight"])
                q.add("subscribers", s["subscribers"])
                return q.value
            }))
        }
        return line.value
    }

    static func text(_ info: JSONValue, previous: JSONValue?, elapsed: Double?, socket: String) -> [String] {
        let counters = info["counters"]
        func value(_ key: String) -> String {
            let v = counters?[key]?.intValue ?? 0
            guard let elapsed, elapsed > 0, let before = previous?["counters"]?[key]?.intValue else { return String(v) }
            return "\(v) (\(String(format: "%.1f", Double(v - before) / elapsed)) /s)"
        }
        let peers = info["peers"]
        var lines = [Style.bold("fluxd at \(socket)") + ", last seq \(info["seq"]?.intValue ?? 0)"]
        var rows: [[String]] = []
        rows.append(["connections", ["client", "store", "monitor"].map { "\($0) \(peers?[$0]?.intValue ?? 0)" }.joined(separator: ", ")])
        rows.append(["frames", "in \(value("framesIn")), out \(value("framesOut"))"])
        rows.append(["bytes", "in \(value("bytesIn")), out \(value("bytesOut"))"])
        rows.append(["actions", value("actions")])
        rows.append(["snapshots", value("snapshots")])
        var errors = "none"
        if case .object(let members)? = counters?["errors"], !members.isEmpty {
            errors = members.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value.intValue ?? 0)" }.joined(separator: ", ")
        }
        rows.append(["errors", errors == "none" ? errors : Style.red(errors)])
        var queues = "no stores"
        if case .array(let stores)? = info["stores"], !stores.isEmpty {
            queues = stores.map { s in
                "\(s["name"]?.stringValue ?? "?") \(s["queued"]?.intValue ?? 0)+\(s["inflight"]?.intValue ?? 0)"
                    + (s["status"]?.stringValue == "down" ? " (down)" : "")
            }.joined(separator: ", ")
        }
        rows.append(["queues", queues + (queues == "no stores" ? "" : Style.dim("  (queued+inflight)"))])
        if let memory = info["memory"] {
            func mib(_ key: String) -> String { String(format: "%.1f MiB", Double(memory[key]?.intValue ?? 0) / 1_048_576) }
            rows.append(["memory", "\(mib("used")) of \(mib("limit")) accounted (peak \(mib("peak")), \(mib("perUser")) per user), \(memory["refusals"]?.intValue ?? 0) refused"])
        }
        if let load = info["load"] {
            rows.append(["loop", "longest hold \(String(format: "%.2f", Double(load["longestLoopHoldMicros"]?.intValue ?? 0) / 1000)) ms, \(load["connections"]?.intValue ?? 0) connections, \(load["storeNames"]?.intValue ?? 0) store names"])
        }
        lines += table(["", ""], rows).dropFirst()
        return lines
    }
}

/// `fluxctl ping`: round-trip time to fluxd.
struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure the round trip to fluxd.",
        discussion: """
            Pings back to back. One ping prints its round trip; --count N > 1 prints a summary, as ping(8) does: \
            N pings to SOCKET: round trip min/avg/p50/p99/max = 58/79/76/133/140 µs. --verbose also prints each \
            round trip before it. With --json, the summary as one object (and with --verbose one object per ping \
            before it).
            """)
    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: "How many pings.") var count = 1
    @Flag(name: .long, help: "Print every round trip, not only the summary.") var verbose = false

    func validate() throws {
        if count < 1 { throw ValidationError("--count must be at least 1") }
    }

    func run() async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let path = options.socketPath
        // Percentiles from an HdrHistogram of nanoseconds (3 significant digits); min, max and the mean exact.
        var histogram = Histogram<UInt64>(numberOfSignificantValueDigits: .three)
        var minNs = UInt64.max, maxNs: UInt64 = 0, totalNs: Double = 0
        do {
            for n in 1...count {
                let d = try await client.ping(timeout: options.requestDuration)
                let ns = UInt64(d.components.seconds) * 1_000_000_000 + UInt64(d.components.attoseconds / 1_000_000_000)
                _ = histogram.record(ns)
                minNs = min(minNs, ns)
                maxNs = max(maxNs, ns)
                totalNs += Double(ns)
                let us = Double(ns) / 1000
                if count == 1 && !options.json {
                    emit(String(format: "pong from %@ in %.0f µs", path, us))
                } else if verbose {
                    emit(options.json ? String(format: #"{"ping":%d,"us":%.1f}"#, n, us) : String(format: "pong %d: %.0f µs", n, us))
                }
            }
        } catch {
            throw failure(error, socket: path)
        }
        func us(_ ns: UInt64) -> Double { Double(ns) / 1000 }
        let summary = PingSummary(count: Int(histogram.totalCount), minUs: us(minNs), avgUs: totalNs / Double(count) / 1000,
                                  medianUs: us(histogram.valueAtPercentile(50)), p99Us: us(histogram.valueAtPercentile(99)),
                                  maxUs: us(maxNs))
        if options.json {
            emit(summary.json)
        } else if count > 1 {
            emit(summary.text(socket: path))
        }
    }
}

/// `ping --count N`'s summary, in microseconds; p50 and p99 are HdrHistogram's nearest-rank percentiles.
struct PingSummary {
    var count: Int
    var minUs: Double
    var avgUs: Double
    var medianUs: Double
    var p99Us: Double
    var maxUs: Double

    /// `{"count":N,"minUs":..,"avgUs":..,"medianUs":..,"p99Us":..,"maxUs":..}` (one decimal).
    var json: String {
        String(format: #"{"count":%d,"minUs":%.1f,"avgUs":%.1f,"medianUs":%.1f,"p99Us":%.1f,"maxUs":%.1f}"#,
               count, minUs, avgUs, medianUs, p99Us, maxUs)
    }

    /// `N pings to SOCKET: round trip min/avg/p50/p99/max = 58/79/76/133/140 µs`, as ping(8) sums up.
    func text(socket: String) -> String {
        String(format: "%d pings to %@: round trip min/avg/p50/p99/max = %.0f/%.0f/%.0f/%.0f/%.0f µs",
               count, socket, minUs, avgUs, medianUs, p99Us, maxUs)
    }
}
