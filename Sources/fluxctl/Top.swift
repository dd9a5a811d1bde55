import ArgumentParser
import Dispatch
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `fluxctl top`: a live view of fluxd like `nats top`/`htop`: stores by action rate, with latency, queue and
/// subscribers, refreshed every `--interval`.
struct Top: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Live view of fluxd: stores by action rate, latency, queue and subscribers; connections by role.",
        discussion: """
        Refreshes every --interval seconds (q or Ctrl-C quits). The header shows fluxd's version, durability, \
        uptime, last seq, bus-wide rates (actions, frames, bytes) and the connections by role (fluxd counts traffic \
        for the whole bus only, not per connection). Each store row: its actions settled per second and in the last \
        interval, the dispatch-to-settlement latency of those actions (p50, p99, max, from fluxd's millisecond \
        clock), queued and in-flight actions, subscribers, version, status and owner.

        top connects as a monitor (SPEC §8.10) to count settlements and time them: fluxd sends it every event \
        (about three frames per action, snapshot states included). A monitor never slows routing: when top cannot \
        keep up, fluxd drops events for it and the header says how many were missed (rates are then too low).

        --once prints one sample (two info samples --interval apart) and exits; Ctrl-C (SIGINT or SIGTERM) during \
        it ends the sample early and prints what it measured. With --json it prints one JSON object \
        (docs/fluxctl.md); --json without --once prints one such object per interval.
        """)

    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: ArgumentHelp("Seconds between refreshes.", valueName: "seconds")) var interval: Double = 1
    @Flag(name: .long, help: "Print one sample and exit.") var once = false

    func validate() throws {
        if !(interval > 0) { throw ValidationError("--interval must be a positive number of seconds") }
    }

    func run() async throws {
        let options = self.options, interval = self.interval, once = self.once
        let live = !once && !options.json && Terminal.isTTY
        let screen = live ? TopScreen() : nil
        defer { screen?.restore() }
        do {
            if once {
                // Watched from before the first connection, so a signal at any time ends the sample as soon as it
                // starts; the default action comes back once the sample is printed.
                let end = SampleEnd()
                defer { end.stop() }
                try await Top.loop(options, interval: interval, once: true, screen: nil, end: end)
                return
            }
            try await runInterruptible {
                try await streamFor(once ? nil : options.timeout) {
                    try await Top.loop(options, interval: interval, once: once, screen: screen)
                }
            }
        } catch is CancellationError {
            return
        } catch {
            screen?.restore()
            throw failure(error, socket: options.socketPath)
        }
    }

    static func loop(_ options: GlobalOptions, interval: Double, once: Bool, screen: TopScreen?, end: SampleEnd? = nil) async throws {
        let monitor = try await options.connect(role: .monitor)
        defer { monitor.abort() }
        let tally = TopTally()
        let events = monitor.monitorEvents()
        let reader = Task.detached {
            for try await event in events { tally.add(event) }
        }
        defer { reader.cancel() }
        // A second connection: its `connect` event tells fluxd's clock (`t`, ms since it started): the uptime.
        let probe = try await options.connect()
        defer { probe.abort() }
        let welcome = monitor.welcome
        // Settlements count from the monitor's start (a little before the first sample: none is lost).
        var previous = (info: try await fetchInfo(monitor, options), at: ContinuousClock.now)
        var n = 0
        while true {
            if let end {
                await end.sleep(interval)
            } else if let screen {
                try await screen.sleep(interval)
            } else {
                try await Task.sleep(for: .seconds(interval))
            }
            let info = try await fetchInfo(monitor, options)
            let now = ContinuousClock.now
            let counts = tally.take()
            let sample = TopSample(server: welcome.server, durability: welcome.durability, socket: options.socketPath,
                                   previous: previous.info, current: info, seconds: (now - previous.at) / .seconds(1),
                                   tally: counts)
            previous = (info, now)
            n += 1
            if options.json {
                emit(sample.json.compact)
            } else if let screen {
                screen.draw(Top.render(sample, width: screen.width, color: Terminal.colors))
            } else {
                if n > 1 { emit("") }
                for line in Top.render(sample, width: 200, color: false) { emit(line) }
            }
            if once { return }
        }
    }

    /// The view of one sample, as lines at most `width` characters wide (a pure function: tests pin it).
    static func render(_ s: TopSample, width: Int, color: Bool) -> [String] {
        func rate(_ v: Double) -> String { v < 10 && v != v.rounded() ? String(format: "%.1f", v) : String(format: "%.0f", v) }
        func bytes(_ v: Double) -> String {
            if v < 1024 { return String(format: "%.0f B", v) }
            if v < 1024 * 1024 { return String(format: "%.1f KiB", v / 1024) }
            return String(format: "%.1f MiB", v / 1024 / 1024)
        }
        func ms(_ v: Int?) -> String { v.map { "\($0) ms" } ?? "-" }
        var lines: [String] = []
        var first = "\(s.server) at \(s.socket)"
        if let d = s.durability { first += "  durability \(d)" }
        if let up = s.uptimeSeconds { first += "  up \(formatUptime(up))" }
        first += "  seq \(s.seq)"
        lines.append(first)
        lines.append("actions \(rate(s.actionsPerSecond))/s  frames in \(rate(s.framesInPerSecond))/s out \(rate(s.framesOutPerSecond))/s"
                     + "  bytes in \(bytes(s.bytesInPerSecond))/s out \(bytes(s.bytesOutPerSecond))/s  (last \(String(format: "%.1f", s.seconds)) s)")
        var conn = "connections \(s.connections): \(s.clients) client\(s.clients == 1 ? "" : "s"), \(s.storeConnections) store\(s.storeConnections == 1 ? "" : "s"), \(s.monitors) monitor\(s.monitors == 1 ? "" : "s") (top's own 2 included)"
        if s.missedEvents > 0 { conn += "  missed \(s.missedEvents) events (rates too low)" }
        lines.append(conn)
        lines.append("")
        if s.stores.isEmpty {
            lines.append("no stores registered")
        } else {
            let rows = s.stores.map { st -> [String] in
                var status = st.status
                if st.stalled { status += " stalled" }
                return [st.name, rate(st.actionsPerSecond), String(st.actions), ms(st.latency?.p50), ms(st.latency?.p99), ms(st.latency?.max),
                        String(st.queued), String(st.inflight), String(st.subscribers), String(st.version), status,
                        st.owner ?? "-"]
            }
            let t = plainTable(["STORE", "ACT/S", "ACTIONS", "P50", "P99", "MAX", "QUEUED", "INFLIGHT", "SUBS", "VERSION", "STATUS", "OWNER"], rows)
            lines += t
        }
        let clipped = lines.map { $0.count > width ? String($0.prefix(width)) : $0 }
        guard color, !s.stores.isEmpty, clipped.count > 4 else { return clipped }
        // The column header in reverse video, as htop does.
        var out = clipped
        out[4] = "\u{1B}[7m" + out[4] + String(repeating: " ", count: max(0, width - out[4].count)) + "\u{1B}[0m"
        return out
    }

    /// Aligned columns without colours (the numbers right-aligned), two spaces apart, the last one not padded.
    static func plainTable(_ header: [String], _ rows: [[String]]) -> [String] {
        let all = [header] + rows
        let widths = header.indices.map { i in all.map { $0[i].count }.max() ?? 0 }
        let numeric = Set(1...9)
        return all.map { row in
            row.enumerated().map { i, cell in
                let pad = String(repeating: " ", count: widths[i] - cell.count)
                if numeric.contains(i) { return pad + cell }
                return i == row.count - 1 ? cell : cell + pad
            }.joined(separator: "  ")
        }
    }
}

/// `1h02m03s`, `4m05s`, `12s`.
func formatUptime(_ seconds: Double) -> String {
    let s = Int(seconds)
    if s >= 3600 { return String(format: "%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60) }
    if s >= 60 { return String(format: "%dm%02ds", s / 60, s % 60) }
    return "\(s)s"
}

/// What the monitor stream said during one interval: settlements per store, their latencies (ms, fluxd's clock),
/// dropped events, and fluxd's clock.
struct TopCounts: Sendable, Equatable {
    var actions: [String: Int] = [:]
    var latencies: [String: [Int]] = [:]
    var missed = 0
    /// fluxd's clock (ms since it started) at the last event, and when it was read here.
    var clock: (t: Int, at: ContinuousClock.Instant)?

    static func == (a: TopCounts, b: TopCounts) -> Bool {
        a.actions == b.actions && a.latencies == b.latencies && a.missed == b.missed && a.clock?.t == b.clock?.t
    }
}

/// Counts monitor events as they come (from the reading task) until `take` hands them over.
final class TopTally: Sendable {
    private struct State {
        var counts = TopCounts()
        /// Dispatch time (fluxd's `t`) by seq, until the action settles.
        var dispatched: [Int: Int] = [:]
    }
    private let state = Mutex(State())

    func add(_ event: MonitorEvent) {
        let env = event.message
        let t = event.time
        // A settle's results, parsed outside the lock.
        var stores: [String] = []
        if event.kind == "settle", let raw = env.raw("results"), case .array(let results)? = try? JSONValue(parsing: String(decoding: raw, as: UTF8.self)) {
            stores = results.compactMap { $0["store"]?.stringValue }
        }
        state.withLock { s in
            if let t { s.counts.clock = (t, .now) }
            switch event.kind {
            case "missed":
                s.counts.missed += event.missed ?? 0
            case "dispatch":
                if let seq = event.seq, let t {
                    s.dispatched[seq] = t
                    // Bounded: actions whose settle was dropped (missed) are forgotten after a while.
                    if s.dispatched.count > 100_000 { s.dispatched.removeAll(keepingCapacity: true) }
                }
            case "settle":
                let started = event.seq.flatMap { s.dispatched.removeValue(forKey: $0) }
                for store in stores {
                    s.counts.actions[store, default: 0] += 1
                    if let started, let t { s.counts.latencies[store, default: []].append(max(0, t - started)) }
                }
            default:
                break
            }
        }
    }

    /// The counts since the last call (fluxd's clock carries over).
    func take() -> TopCounts {
        state.withLock { s in
            let counts = s.counts
            s.counts = TopCounts()
            s.counts.clock = counts.clock
            return counts
        }
    }
}

/// One sample of `fluxctl top`: what the view and `--json` show.
struct TopSample: Sendable, Equatable {
    /// Latency percentiles of one store's actions in the interval, ms.
    struct Latency: Sendable, Equatable {
        var p50: Int
        var p99: Int
        var max: Int
        var samples: Int
    }

    /// One store's row.
    struct Store: Sendable, Equatable {
        var name: String
        var status: String
        var stalled: Bool
        var version: Int
        var subscribers: Int
        var queued: Int
        var inflight: Int
        var queries: Int
        var actions: Int
        var actionsPerSecond: Double
        var latency: Latency?
        var owner: String?
    }

    var server: String
    var durability: String?
    var socket: String
    var uptimeSeconds: Double?
    var seconds: Double
    var seq: Int
    var actionsPerSecond: Double
    var framesInPerSecond: Double
    var framesOutPerSecond: Double
    var bytesInPerSecond: Double
    var bytesOutPerSecond: Double
    var connections: Int
    var clients: Int
    var storeConnections: Int
    var monitors: Int
    var missedEvents: Int
    /// By actions per second, then queue, then name.
    var stores: [Store]

    init(server: String, durability: String?, socket: String, uptimeSeconds: Double?, seconds: Double, seq: Int,
         actionsPerSecond: Double, framesInPerSecond: Double, framesOutPerSecond: Double, bytesInPerSecond: Double,
         bytesOutPerSecond: Double, connections: Int, clients: Int, storeConnections: Int, monitors: Int,
         missedEvents: Int, stores: [Store]) {
        self.server = server
        self.durability = durability
        self.socket = socket
        self.uptimeSeconds = uptimeSeconds
        self.seconds = seconds
        self.seq = seq
        self.actionsPerSecond = actionsPerSecond
        self.framesInPerSecond = framesInPerSecond
        self.framesOutPerSecond = framesOutPerSecond
        self.bytesInPerSecond = bytesInPerSecond
        self.bytesOutPerSecond = bytesOutPerSecond
        self.connections = connections
        self.clients = clients
        self.storeConnections = storeConnections
        self.monitors = monitors
        self.missedEvents = missedEvents
        self.stores = stores
    }

    /// A sample from two `info` replies `seconds` apart and the monitor's counts in between.
    init(server: String, durability: String?, socket: String, previous: JSONValue, current: JSONValue, seconds: Double, tally: TopCounts) {
        func int(_ v: JSONValue?) -> Int { v?.intValue ?? 0 }
        func perSecond(_ key: String) -> Double {
            seconds > 0 ? Double(max(0, int(current["counters"]?[key]) - int(previous["counters"]?[key]))) / seconds : 0
        }
        var stores: [Store] = []
        if case .array(let list)? = current["stores"] {
            for s in list {
                let name = s["name"]?.stringValue ?? "?"
                let actions = tally.actions[name] ?? 0
                var latency: Latency?
                if let samples = tally.latencies[name], !samples.isEmpty {
                    let sorted = samples.sorted()
                    func at(_ p: Double) -> Int { sorted[min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1)] }
                    latency = Latency(p50: at(50), p99: at(99), max: sorted.last ?? 0, samples: sorted.count)
                }
                var owner: String?
                if let o = s["owner"] {
                    owner = (o["name"]?.stringValue).map { $0.isEmpty ? "peer \(int(o["peer"]))" : $0 }
                    if let pid = o["pid"]?.intValue { owner = (owner ?? "") + " (pid \(pid))" }
                }
                stores.append(Store(name: name, status: s["status"]?.stringValue ?? "?", stalled: s["stalled"]?.boolValue == true,
                                    version: int(s["version"]), subscribers: int(s["subscribers"]), queued: int(s["queued"]),
                                    inflight: int(s["inflight"]), queries: int(s["queries"]), actions: actions,
                                    actionsPerSecond: seconds > 0 ? Double(actions) / seconds : 0, latency: latency, owner: owner))
            }
        }
        stores.sort { ($0.actionsPerSecond, $0.queued, $1.name) > ($1.actionsPerSecond, $1.queued, $0.name) }
        let peers = current["peers"]
        let uptime = tally.clock.map { Double($0.t) / 1000 + (ContinuousClock.now - $0.at) / .seconds(1) }
        self.init(server: server, durability: durability, socket: socket, uptimeSeconds: uptime, seconds: seconds,
                  seq: int(current["seq"]), actionsPerSecond: perSecond("actions"), framesInPerSecond: perSecond("framesIn"),
                  framesOutPerSecond: perSecond("framesOut"), bytesInPerSecond: perSecond("bytesIn"),
                  bytesOutPerSecond: perSecond("bytesOut"),
                  connections: current["load"]?["connections"]?.intValue ?? (int(peers?["client"]) + int(peers?["store"]) + int(peers?["monitor"])),
                  clients: int(peers?["client"]), storeConnections: int(peers?["store"]), monitors: int(peers?["monitor"]),
                  missedEvents: tally.missed, stores: stores)
    }

    /// `--json`: `{"server","durability","socket","uptimeSeconds","intervalSeconds","seq","actionsPerSecond",
    /// "framesInPerSecond","framesOutPerSecond","bytesInPerSecond","bytesOutPerSecond","connections":{"total",
    /// "client","store","monitor"},"missedEvents","stores":[{"name","status","stalled","version","subscribers",
    /// "queued","inflight","queries","actions","actionsPerSecond","latencyMs":{"p50","p99","max","samples"},"owner"}]}`
    /// (`latencyMs` and `owner` only when known).
    var json: JSONValue {
        func number(_ v: Double) -> JSONValue { .number(String(format: "%.1f", v)) }
        var line = JSONLine()
        line.add("server", server)
        line.add("durability", durability.map(JSONValue.string) ?? .null)
        line.add("socket", socket)
        line.add("uptimeSeconds", uptimeSeconds.map(number) ?? .null)
        line.add("intervalSeconds", .number(String(format: "%.3f", seconds)))
        line.add("seq", seq)
        line.add("actionsPerSecond", number(actionsPerSecond))
        line.add("framesInPerSecond", number(framesInPerSecond))
        line.add("framesOutPerSecond", number(framesOutPerSecond))
        line.add("bytesInPerSecond", number(bytesInPerSecond))
        line.add("bytesOutPerSecond", number(bytesOutPerSecond))
        var conn = JSONLine()
        conn.add("total", connections)
        conn.add("client", clients)
        conn.add("store", storeConnections)
        conn.add("monitor", monitors)
        line.add("connections", conn.value)
        line.add("missedEvents", missedEvents)
        line.add("stores", JSONValue.array(stores.map { s in
            var o = JSONLine()
            o.add("name", s.name)
            o.add("status", s.status)
            o.add("stalled", s.stalled)
            o.add("version", s.version)
            o.add("subscribers", s.subscribers)
            o.add("queued", s.queued)
            o.add("inflight", s.inflight)
            o.add("queries", s.queries)
            o.add("actions", s.actions)
            o.add("actionsPerSecond", number(s.actionsPerSecond))
            if let l = s.latency {
                var lat = JSONLine()
                lat.add("p50", l.p50)
                lat.add("p99", l.p99)
                lat.add("max", l.max)
                lat.add("samples", l.samples)
                o.add("latencyMs", lat.value)
            }
            o.add("owner", s.owner)
            return o.value
        }))
        return line.value
    }
}

/// `top --once`: SIGINT or SIGTERM ends the sample early and the sample so far is printed (as `ping` prints its
/// summary on Ctrl-C). Signals are watched from `init` (one that comes before the sample starts ends it at once)
/// until `stop()`, which gives them back their default action. `@unchecked Sendable`: its stored properties are set
/// once in `init`; the dispatch sources are only cancelled.
final class SampleEnd: @unchecked Sendable {
    private let signals: AsyncStream<Void>
    private let sources: [any DispatchSourceSignal]

    init() {
        let (signals, continuation) = AsyncStream<Void>.makeStream()
        self.signals = signals
        sources = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { continuation.yield() }
            source.resume()
            return source
        }
    }

    /// Returns after `seconds`, or as soon as a signal came (also one that came before the call).
    func sleep(_ seconds: Double) async {
        let signals = self.signals
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: .seconds(seconds)) }
            group.addTask { for await _ in signals { return } }
            _ = await group.next()
            group.cancelAll()
        }
    }

    /// Stops watching: SIGINT and SIGTERM end the process again.
    func stop() {
        for source in sources { source.cancel() }
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
    }
}

/// The terminal while `top` runs live: cursor hidden, keys read without echo (`q` quits), and everything restored
/// on exit. `@unchecked Sendable`: its stored properties are set once in `init`; a dispatch source may be cancelled
/// from any thread.
final class TopScreen: @unchecked Sendable {
    private let saved: termios?
    private let quit = InterruptFlag()
    private let keys: any DispatchSourceRead

    init() {
        var t = termios()
        if tcgetattr(STDIN_FILENO, &t) == 0 {
            saved = t
            var raw = t
            raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
            tcsetattr(STDIN_FILENO, TCSANOW, &raw)
        } else {
            saved = nil
        }
        let quit = self.quit
        keys = DispatchSource.makeReadSource(fileDescriptor: STDIN_FILENO, queue: .global())
        keys.setEventHandler {
            var byte: UInt8 = 0
            let n = read(STDIN_FILENO, &byte, 1)
            if n <= 0 || byte == UInt8(ascii: "q") || byte == UInt8(ascii: "Q") { quit.set() }
        }
        keys.resume()
        FileHandle.standardOutput.write(Data("\u{1B}[?25l".utf8))
    }

    /// Columns of the terminal (80 when unknown).
    var width: Int {
        var size = winsize()
        return ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 && size.ws_col > 0 ? Int(size.ws_col) : 80
    }

    /// Clears the screen and draws `lines` from the top.
    func draw(_ lines: [String]) {
        FileHandle.standardOutput.write(Data(("\u{1B}[H\u{1B}[2J" + lines.joined(separator: "\n") + "\n").utf8))
    }

    /// Sleeps `seconds`, waking every 50 ms to see whether `q` was pressed (then throws `CancellationError`).
    func sleep(_ seconds: Double) async throws {
        let end = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < end {
            if quit.isSet { throw CancellationError() }
            try await Task.sleep(for: .milliseconds(50))
        }
        if quit.isSet { throw CancellationError() }
    }

    /// Shows the cursor again and restores the terminal's mode (idempotent).
    func restore() {
        keys.cancel()
        if var t = saved { tcsetattr(STDIN_FILENO, TCSANOW, &t) }
        FileHandle.standardOutput.write(Data("\u{1B}[?25h".utf8))
    }
}
