import ArgumentParser
import Dispatch
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Histogram
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `fluxctl bench`: dispatch -> settled through a throwaway store on the running bus, one at a time (round trip)
/// and with a window of actions in flight (pipelined), like `nats bench` and `redis-benchmark`.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure fluxd: dispatch -> settled through a throwaway store, one at a time and pipelined.",
        discussion: """
        fluxctl registers a store of its own (bench.PID.N, handling the one action type bench.PID.N/act and \
        answering each action with a small new state {"n":COUNT}), runs --warmup unmeasured round trips, then \
        measures two modes of --actions each: "round trip" (dispatch, wait for settled, then the next) and \
        "pipelined" (--window actions in flight). Latency is from sending the dispatch to reading its settlement; \
        percentiles come from an HdrHistogram (3 significant digits). The header names fluxd's version and \
        durability: with a journal (durability always or batch) the disk dominates the latency.

        The store is unregistered, its connection closed and the store forgotten (fluxctl forget) at the end, also \
        on Ctrl-C (exit code 130), so no bench.PID.N store stays behind; when fluxd refuses the forget (fluxctl is \
        not fluxd's user, root or an admin) a line on stderr says which store stays known, as a store that is down.
        """)

    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: "Actions measured in each mode.") var actions = 10_000
    @Option(name: .long, help: "Actions in flight in the pipelined mode.") var window = 64
    @Option(name: .long, help: ArgumentHelp("Size of each action's payload in bytes (a JSON string; 0: no payload).", valueName: "bytes"))
    var payload = 16
    @Option(name: .long, help: "Unmeasured round trips before measuring.") var warmup = 1_000

    func validate() throws {
        if actions < 1 { throw ValidationError("--actions must be at least 1") }
        if window < 1 { throw ValidationError("--window must be at least 1") }
        if payload < 0 { throw ValidationError("--payload must be 0 or more bytes") }
        if warmup < 0 { throw ValidationError("--warmup must be 0 or more") }
    }

    func run() async throws {
        let options = self.options
        let plan = BenchPlan(actions: actions, window: window, payloadBytes: payload, warmup: warmup)
        let report: BenchReport
        do {
            report = try await runInterruptible { try await Bench.measure(options, plan) }
        } catch is CancellationError {
            throw fail(130, "interrupted (the bench store was unregistered)")
        } catch {
            throw failure(error, socket: options.socketPath)
        }
        if options.json {
            emit(report.json.compact)
        } else {
            for line in report.text(socket: options.socketPath) { emit(line) }
        }
    }

    /// Connects, registers the throwaway store, measures both modes and always takes the store down again.
    static func measure(_ options: GlobalOptions, _ plan: BenchPlan) async throws -> BenchReport {
        let client = try await options.connect()
        defer { client.abort() }
        let welcome = client.welcome
        if let maxPending = welcome.limits.maxPending, plan.window > maxPending {
            throw fail(Exit.badInput, "--window \(plan.window) is more than fluxd's maxPending (\(maxPending)): it would answer overloaded")
        }
        if let maxFrame = welcome.limits.maxFrame, plan.payloadBytes + 256 > maxFrame {
            throw fail(Exit.badInput, "--payload \(plan.payloadBytes) does not fit fluxd's maxFrame (\(maxFrame) bytes)")
        }
        let name = "bench.\(getpid()).\(UInt32.random(in: 1...999_999))"
        let type = "\(name)/act"
        let store = try await BenchStore.start(options, name: name, type: type)
        let payloadJSON = plan.payloadJSON
        let timeout = options.requestDuration
        do {
            for _ in 0..<plan.warmup {
                try Task.checkCancellation()
                try await client.dispatchAndSettle(type: type, payloadJSON: payloadJSON, timeout: timeout).requireDone()
            }
            let roundTrip = try await roundTrip(client, type: type, payloadJSON: payloadJSON, count: plan.actions, timeout: timeout)
            let pipelined = try await pipelined(client, type: type, payloadJSON: payloadJSON, count: plan.actions,
                                                window: plan.window, timeout: timeout)
            await store.stop()
            await forget(client, name, timeout: timeout)
            return BenchReport(server: welcome.server, durability: welcome.durability, store: name, plan: plan,
                               results: [roundTrip, pipelined])
        } catch {
            await store.stop()
            await forget(client, name, timeout: timeout)
            throw error
        }
    }

    /// Forgets the bench store once it is down (`stop` returns once fluxd handled its unregister), so that no
    /// benchmark leaves a store behind; a refusal is a line on stderr, not a failure of the benchmark.
    static func forget(_ client: FluxClient, _ name: String, timeout: Duration) async {
        // (In a task of its own: after Ctrl-C the measuring task is cancelled, and the store must still go.)
        let refusal = await Task { () async -> FluxError? in
            do throws(FluxError) { _ = try await client.forget(store: name, timeout: timeout); return nil } catch { return error }
        }.value
        if let refusal {
            printError("fluxctl: the bench store \(name) stays known to fluxd as a store that is down (forget: \(refusal))")
        }
    }

    static func roundTrip(_ client: FluxClient, type: String, payloadJSON: [UInt8]?, count: Int, timeout: Duration) async throws -> BenchResult {
        var histogram = Histogram<UInt64>(numberOfSignificantValueDigits: .three)
        let clock = ContinuousClock()
        let start = clock.now
        for _ in 0..<count {
            try Task.checkCancellation()
            let sent = clock.now
            try await client.dispatchAndSettle(type: type, payloadJSON: payloadJSON, timeout: timeout).requireDone()
            _ = histogram.record(nanoseconds(clock.now - sent))
        }
        return BenchResult(mode: .roundTrip, actions: count, elapsed: clock.now - start, histogram: histogram)
    }

    static func pipelined(_ client: FluxClient, type: String, payloadJSON: [UInt8]?, count: Int, window: Int,
                          timeout: Duration) async throws -> BenchResult {
        var histogram = Histogram<UInt64>(numberOfSignificantValueDigits: .three)
        let clock = ContinuousClock()
        // A ring of the actions in flight, oldest first: settlements arrive in order (one store answers in seq order).
        var ring: [(PendingSettlement, ContinuousClock.Instant)?] = Array(repeating: nil, count: window)
        var sent = 0, settled = 0
        let start = clock.now
        while settled < count {
            try Task.checkCancellation()
            while sent < count && sent - settled < window {
                ring[sent % window] = (try client.beginDispatchAndSettle(type: type, payloadJSON: payloadJSON), clock.now)
                sent += 1
            }
            guard let (pending, at) = ring[settled % window] else { break }
            ring[settled % window] = nil
            try await pending.settlement(timeout: timeout).requireDone()
            _ = histogram.record(nanoseconds(clock.now - at))
            settled += 1
        }
        return BenchResult(mode: .pipelined, actions: count, elapsed: clock.now - start, histogram: histogram)
    }

    static func nanoseconds(_ d: Duration) -> UInt64 {
        UInt64(max(0, d.components.seconds)) * 1_000_000_000 + UInt64(max(0, d.components.attoseconds / 1_000_000_000))
    }
}

/// What `fluxctl bench` was asked to do.
struct BenchPlan: Sendable, Equatable {
    var actions: Int
    var window: Int
    var payloadBytes: Int
    var warmup: Int

    /// The payload: nothing for 0 bytes, `0` for 1, else a JSON string of exactly `payloadBytes` bytes.
    var payloadJSON: [UInt8]? {
        switch payloadBytes {
        case 0: return nil
        case 1: return Array("0".utf8)
        default: return Array("\"\(String(repeating: "x", count: payloadBytes - 2))\"".utf8)
        }
    }
}

/// One mode's figures.
struct BenchResult: Sendable, Equatable {
    enum Mode: String, Sendable { case roundTrip, pipelined }
    var mode: Mode
    var actions: Int
    var seconds: Double
    var p50Us: Double
    var p90Us: Double
    var p99Us: Double
    var p999Us: Double
    var maxUs: Double

    init(mode: Mode, actions: Int, seconds: Double, p50Us: Double, p90Us: Double, p99Us: Double, p999Us: Double, maxUs: Double) {
        self.mode = mode
        self.actions = actions
        self.seconds = seconds
        self.p50Us = p50Us
        self.p90Us = p90Us
        self.p99Us = p99Us
        self.p999Us = p999Us
        self.maxUs = maxUs
    }

    init(mode: Mode, actions: Int, elapsed: Duration, histogram: Histogram<UInt64>) {
        func us(_ ns: UInt64) -> Double { Double(ns) / 1000 }
        self.init(mode: mode, actions: actions, seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18,
                  p50Us: us(histogram.valueAtPercentile(50)), p90Us: us(histogram.valueAtPercentile(90)),
                  p99Us: us(histogram.valueAtPercentile(99)), p999Us: us(histogram.valueAtPercentile(99.9)),
                  maxUs: us(histogram.max))
    }

    var actionsPerSecond: Double { seconds > 0 ? Double(actions) / seconds : 0 }
}

/// `fluxctl bench`'s report: the header (fluxd, durability, the store) and one row per mode.
struct BenchReport: Sendable, Equatable {
    var server: String
    var durability: String?
    var store: String
    var plan: BenchPlan
    var results: [BenchResult]

    /// `{"server","durability","store","actionType","payloadBytes","warmup","window","results":[{"mode","actions",
    /// "seconds","actionsPerSecond","p50Us","p90Us","p99Us","p999Us","maxUs"}]}`.
    var json: JSONValue {
        func number(_ v: Double, _ decimals: Int) -> JSONValue { .number(String(format: "%.\(decimals)f", v)) }
        var line = JSONLine()
        line.add("server", server)
        line.add("durability", durability.map(JSONValue.string) ?? .null)
        line.add("store", store)
        line.add("actionType", "\(store)/act")
        line.add("payloadBytes", plan.payloadBytes)
        line.add("warmup", plan.warmup)
        line.add("window", plan.window)
        line.add("results", JSONValue.array(results.map { r in
            var o = JSONLine()
            o.add("mode", r.mode.rawValue)
            o.add("actions", r.actions)
            o.add("seconds", number(r.seconds, 6))
            o.add("actionsPerSecond", number(r.actionsPerSecond, 1))
            o.add("p50Us", number(r.p50Us, 1))
            o.add("p90Us", number(r.p90Us, 1))
            o.add("p99Us", number(r.p99Us, 1))
            o.add("p999Us", number(r.p999Us, 1))
            o.add("maxUs", number(r.maxUs, 1))
            return o.value
        }))
        return line.value
    }

    func text(socket: String) -> [String] {
        let durabilityText: String
        switch durability {
        case "always": durabilityText = "durability always (a settlement waits for the journal's fdatasync: the disk dominates latency)"
        case "batch": durabilityText = "durability batch (the journal is synced on a timer, off the settlement path)"
        case let d?: durabilityText = "durability \(d)"
        case nil: durabilityText = "durability unknown (fluxd before 0.3.0)"
        }
        let header = [
            "\(server) at \(socket), \(durabilityText)",
            "store \(store), payload \(plan.payloadBytes) B, warmup \(plan.warmup), window \(plan.window) (pipelined)",
            "",
        ]
        let rows = results.map { r -> [String] in
            [r.mode == .roundTrip ? "round trip" : "pipelined", String(r.actions), String(format: "%.3f", r.seconds),
             String(format: "%.0f", r.actionsPerSecond), formatMicros(r.p50Us), formatMicros(r.p90Us), formatMicros(r.p99Us),
             formatMicros(r.p999Us), formatMicros(r.maxUs)]
        }
        return header + table(["MODE", "ACTIONS", "SECONDS", "ACTIONS/S", "P50", "P90", "P99", "P99.9", "MAX"], rows)
    }
}

/// A latency for people: `87 µs`, `1.25 ms`, `2.10 s`.
func formatMicros(_ us: Double) -> String {
    if us < 1000 { return String(format: "%.0f µs", us) }
    if us < 1_000_000 { return String(format: "%.2f ms", us / 1000) }
    return String(format: "%.2f s", us / 1_000_000)
}

/// The throwaway store of `fluxctl bench`: a raw store-role connection (no SDK between fluxd and the answer) that
/// answers every action with `done` and the state `{"n":COUNT}`.
final class BenchStore: Sendable {
    let session: RawSession
    let name: String
    /// `welcome`, `registered`, `pong` and `error` frames seen by the reading task, for the steps that wait for them.
    let control: AsyncStream<Envelope>
    let reader: Task<Void, Never>

    private init(session: RawSession, name: String, control: AsyncStream<Envelope>, reader: Task<Void, Never>) {
        self.session = session
        self.name = name
        self.control = control
        self.reader = reader
    }

    /// Connects, says hello as a store and registers `name` handling `type`; throws fluxd's refusal.
    static func start(_ options: GlobalOptions, name: String, type: String) async throws -> BenchStore {
        let session: RawSession
        do {
            session = try RawSession(socketPath: options.socketPath, expectedServerUID: options.serverUID)
        } catch {
            throw failure(error, socket: options.socketPath)
        }
        let (control, continuation) = AsyncStream.makeStream(of: Envelope.self)
        let reader = Task.detached {
            var count = 0
            do {
                for try await body in session.frames {
                    guard let env = try? Envelope(body: body) else { continue }
                    switch env.str("op") {
                    case "action":
                        count += 1
                        let seq = env.integer("seq") ?? 0
                        try? session.send(json: #"{"op":"done","store":"\#(name)","seq":\#(seq),"state":{"n":\#(count)}}"#)
                    case "welcome", "registered", "pong", "error", "bye":
                        continuation.yield(env)
                    default:
                        break
                    }
                }
            } catch {}
            continuation.finish()
        }
        let store = BenchStore(session: session, name: name, control: control, reader: reader)
        do {
            try await withTimeout(options.requestTimeout, "registering the bench store \(name)") {
                try session.send(json: #"{"op":"hello","protocol":1,"role":"store","name":"fluxctl-bench"}"#)
                try await store.expect("welcome")
                try session.send(json: #"{"op":"register","store":"\#(name)","handles":["\#(type)"],"state":{"n":0}}"#)
                try await store.expect("registered")
            }
        } catch {
            store.session.close()
            throw error
        }
        return store
    }

    /// Waits for the next control frame and checks it is `op`.
    private func expect(_ op: String) async throws {
        for await env in control {
            if env.str("op") == op { return }
            if env.str("op") == "error" || env.str("op") == "bye" {
                throw fail(Exit.refused, "fluxd refused the bench store \(name): \(env.str("code") ?? env.str("reason") ?? "?"): \(env.str("message") ?? "")")
            }
        }
        throw FluxError.disconnected("fluxd closed the bench store's connection")
    }

    /// Unregisters the store, waits (at most a second) until fluxd has taken that, and closes the connection.
    func stop() async {
        try? session.send(json: #"{"op":"unregister","store":"\#(name)"}"#)
        try? session.send(json: #"{"op":"ping","id":"bench-stop"}"#)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await self.expect("pong") }
            group.addTask { try? await Task.sleep(for: .seconds(1)) }
            await group.next()
            group.cancelAll()
        }
        session.close()
        reader.cancel()
    }
}

/// Runs `body` in a task that SIGINT and SIGTERM cancel, so that a command can clean up before it exits; once
/// interrupted it throws `CancellationError` whatever `body` threw. The default dispositions come back afterwards.
func runInterruptible<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let interrupted = InterruptFlag()
    let task = Task { try await body() }
    let sources = [SIGINT, SIGTERM].map { number -> any DispatchSourceSignal in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler {
            interrupted.set()
            task.cancel()
        }
        source.resume()
        return source
    }
    defer {
        for source in sources { source.cancel() }
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
    }
    do {
        return try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
    } catch {
        if interrupted.isSet { throw CancellationError() }
        throw error
    }
}

/// Whether a signal arrived (set from a dispatch queue, read by the interrupted task).
final class InterruptFlag: Sendable {
    private let flag = Mutex(false)
    func set() { flag.withLock { $0 = true } }
    var isSet: Bool { flag.withLock { $0 } }
}
