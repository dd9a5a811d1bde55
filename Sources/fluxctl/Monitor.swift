import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Synchronization

/// `fluxctl monitor`: a live tap of all traffic through fluxd (a `monitor`-role connection's event stream).
struct Monitor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show all traffic through fluxd live: actions, settlements, snapshots, connections, errors.",
        discussion: """
        One line per event: dispatch (#seq type, origin peer, payload), settle (each store's result), snapshot \
        (store, version, the seq that made it), delta (the same for a change a store sent as a patch), store-up, store-down, connect, disconnect, error. When fluxctl \
        cannot keep up, fluxd drops events for it (routing is never slowed) and fluxctl prints "missed N events".

        Filters combine (all must match): --type PATTERN (repeatable; todo/* style) keeps actions of matching \
        types with their settlements and snapshots; --store NAME keeps what concerns that store (actions it \
        handles, its snapshots, its owner's connection); --peer ID-or-NAME keeps what that peer did.

        --record FILE writes every dispatched action that passes the filters as a JSON line \
        {"seq":..,"type":..,"payload":..} (plus "cause" when a store dispatched it in reaction to another \
        action); `fluxctl dispatch --file FILE` replays it.

        When fluxd goes away (a restart, a crash), monitor waits for it like the libraries do and says so in one \
        line when it goes and when it is back; the record gets a line {"gap":{"reason":..,"newHistory":..}} where \
        events were missed (dispatch --file skips it). --no-reconnect exits instead (exit 3).
        """)

    enum TimeFormat: String, ExpressibleByArgument, CaseIterable {
        case wall, uptime, none
    }

    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: ArgumentHelp("Only actions whose type matches this pattern (repeatable).", valueName: "pattern")) var type: [String] = []
    @Option(name: .long, help: ArgumentHelp("Only events concerning this store.", valueName: "name")) var store: String?
    @Option(name: .long, help: ArgumentHelp("Only events of this peer (its id or name).", valueName: "id-or-name")) var peer: String?
    @Option(name: .long, help: ArgumentHelp("Also write the dispatched actions to this file as JSON lines.", valueName: "file")) var record: String?
    @Option(name: .long, help: "Exit after this many events.") var count: Int?
    @Option(name: .long, help: "Timestamps: wall (local time), uptime (seconds since fluxd started) or none.") var time: TimeFormat = .wall
    @Flag(name: .long, help: "Print snapshot states and delta patches (otherwise only their size).") var states = false
    @Flag(name: .customLong("no-reconnect"), help: "Exit when fluxd goes away (by default wait for it, like the libraries; --record marks the gap).")
    var noReconnect = false

    func validate() throws {
        for pattern in type where !Names.isValidPattern(pattern) {
            throw ValidationError("\"\(pattern)\" is not an action-type pattern (a type, or a prefix followed by *)")
        }
        if let store, !Names.isValidStore(store) { throw ValidationError("\"\(store)\" is not a store name") }
        if let count, count < 1 { throw ValidationError("--count must be at least 1") }
    }

    func run() async throws {
        var recorder: FileHandle?
        if let record {
            guard FileManager.default.createFile(atPath: record, contents: nil), let handle = FileHandle(forWritingAtPath: record) else {
                throw fail(Exit.badInput, "cannot write \(record): \(String(cString: strerror(errno)))")
            }
            recorder = handle
        }
        defer { try? recorder?.close() }
        let client = try await options.connect(role: .monitor, reconnect: !noReconnect)
        defer { client.abort() }
        // fluxd going and coming back: a line each, a gap marker in the record, fluxd's info learned again.
        let relearn = Mutex(false)
        let lostReason = Mutex("")
        let recording = recorder.map { SendableHandle(handle: $0) }
        let connectivity = reportConnectivity(client, json: options.json, lost: { reason in
            lostReason.withLock { $0 = reason }
        }, back: { changed in
            relearn.withLock { $0 = true }
            if let recording {
                let reason = lostReason.withLock { $0 }
                recording.handle.write(Data(#"{"gap":{"reason":\#(JSONValue.quote(reason)),"newHistory":\#(changed)}}"#.utf8 + [0x0A]))
            }
        })
        defer { connectivity.cancel() }
        // Events from now on are kept while fluxd's info (store handles and owners, for the filters) is fetched.
        let events = client.monitorEvents()
        if !options.json && Terminal.isTTY {
            emit(Style.dim("monitoring fluxd at \(options.socketPath) (interrupt to stop)"))
        }
        let tap = MonitorTap(filter: MonitorFilter(types: type, store: store, peer: peer), json: options.json,
                             time: time, states: states, recorder: recorder)
        let count = self.count, socket = options.socketPath, requestTimeout = options.requestDuration
        do {
            try await streamFor(options.timeout, counted: count != nil, "monitoring") {
                var tap = tap
                tap.learn(from: try await client.info(timeout: requestTimeout))
                for try await event in events {
                    if relearn.withLock({ let r = $0; $0 = false; return r }) {
                        tap.learn(from: try await client.info(timeout: requestTimeout))
                    }
                    if try tap.handle(event.message), let count, tap.printed >= count { return }
                    if tap.takeInfoRequest() { tap.learn(from: try await client.info(timeout: requestTimeout)) }
                }
                throw FluxError.disconnected("fluxd closed the connection")
            }
        } catch {
            throw failure(error, socket: socket)
        }
    }
}

/// What `--type`, `--store` and `--peer` keep.
struct MonitorFilter: Sendable {
    var types: [String]
    var store: String?
    var peer: String?
    var isEmpty: Bool { types.isEmpty && store == nil && peer == nil }
}

/// The monitor's state: peer names, store handles and owners (from `info` and events), which seqs passed the
/// filters, and the output.
struct MonitorTap: @unchecked Sendable {
    // @unchecked: the FileHandle is written from one task at a time.
    let filter: MonitorFilter
    let json: Bool
    let time: Monitor.TimeFormat
    let states: Bool
    let recorder: FileHandle?
    var printed = 0
    private var names: [Int: String] = [:]
    private var handles: [String: [String]] = [:]
    private var owners: [String: Int] = [:]
    private var passed = Set<Int>()
    private var epochOffset: Double?
    private var infoRequests = 0

    init(filter: MonitorFilter, json: Bool, time: Monitor.TimeFormat, states: Bool, recorder: FileHandle?) {
        self.filter = filter
        self.json = json
        self.time = time
        self.states = states
        self.recorder = recorder
    }

    /// Handles one frame; returns true when it printed an event (counted by --count).
    mutating func handle(_ env: Envelope) throws -> Bool {
        switch env.str("op") {
        case "missed":
            let n = env.integer("count") ?? 0
            if json {
                emit(#"{"kind":"missed","count":\#(n)}"#)
            } else {
                emit(Style.yellow("missed \(n) event\(n == 1 ? "" : "s")") + Style.dim(" (fluxctl could not keep up)"))
            }
            return false
        case "bye":
            throw FluxError.disconnected("fluxd said bye (\(env.str("reason") ?? "?"))")
        case "event":
            break
        default:
            return false
        }
        guard let kind = env.str("kind") else { return false }
        remember(kind, env)
        guard passes(kind, env) else { return false }
        if kind == "dispatch", let recorder { record(env, to: recorder) }
        emit(json ? wireJSON(env) : line(kind, env))
        printed += 1
        return true
    }

    // MARK: Knowledge

    /// Learns store handles and owners from fluxd's `info`.
    mutating func learn(from info: BusInfo) {
        learn(from: (try? JSONValue(parsing: info.json)) ?? .null)
    }

    private mutating func learn(from info: JSONValue) {
        guard case .array(let stores)? = info["stores"] else { return }
        for s in stores {
            guard let name = s["name"]?.stringValue else { continue }
            if case .array(let patterns)? = s["handles"] { handles[name] = patterns.compactMap(\.stringValue) }
            if let owner = s["owner"], let peer = owner["peer"]?.intValue {
                owners[name] = peer
                if let ownerName = owner["name"]?.stringValue { names[peer] = ownerName }
            } else {
                owners[name] = nil
            }
        }
    }

    private mutating func remember(_ kind: String, _ env: Envelope) {
        switch kind {
        case "connect", "disconnect":
            if let peer = env.integer("peer"), let name = env.str("name") { names[peer] = name }
        case "dispatch":
            if let origin = env.integer("origin"), let name = env.str("originName") { names[origin] = name }
        case "store-up":
            // A (re-)registration may change handles and owner: ask again (the reply comes through `handle`).
            infoRequests += 1
        default:
            break
        }
    }

    /// Whether info should be requested again (after a store-up).
    mutating func takeInfoRequest() -> Bool {
        defer { infoRequests = 0 }
        return infoRequests > 0
    }

    private func peerMatches(_ id: Int?, _ name: String?) -> Bool {
        guard let want = filter.peer else { return true }
        guard let id else { return false }
        return String(id) == want || (name ?? names[id]) == want
    }

    private func targets(_ type: String) -> [String] {
        handles.filter { $0.value.contains { Names.matches(pattern: $0, type: type) } }.map(\.key)
    }

    private mutating func passes(_ kind: String, _ env: Envelope) -> Bool {
        if filter.isEmpty { return true }
        let seq = env.integer("seq") ?? -1
        switch kind {
        case "dispatch":
            let type = env.str("type") ?? ""
            guard filter.types.isEmpty || filter.types.contains(where: { Names.matches(pattern: $0, type: type) }),
                  filter.store.map({ targets(type).contains($0) }) ?? true,
                  peerMatches(env.integer("origin"), env.str("originName")) else { return false }
            passed.insert(seq)
            if passed.count > 8192, let newest = passed.max() { passed = passed.filter { $0 > newest - 4096 } }
            return true
        case "settle":
            if passed.contains(seq) { return true }
            guard filter.types.isEmpty, filter.peer == nil, let store = filter.store,
                  case .array(let results)? = env.json("results") else { return false }
            return results.contains { $0["store"]?.stringValue == store }
        case "snapshot", "delta":
            let store = env.str("store") ?? ""
            guard filter.types.isEmpty || passed.contains(seq) else { return false }
            if let want = filter.store, want != store { return false }
            if filter.peer != nil && !passed.contains(seq) && !peerMatches(owners[store], nil) { return false }
            return true
        case "store-up", "store-down":
            let store = env.str("store") ?? ""
            guard filter.types.isEmpty else { return false }
            if let want = filter.store, want != store { return false }
            return filter.peer == nil || peerMatches(owners[store], nil)
        default: // connect, disconnect, error
            guard filter.types.isEmpty else { return false }
            let peer = env.integer("peer")
            if let want = filter.store, owners[want] == nil || owners[want] != peer { return false }
            return peerMatches(peer, env.str("name"))
        }
    }

    // MARK: Output

    private func record(_ env: Envelope, to handle: FileHandle) {
        var out = #"{"seq":\#(env.integer("seq") ?? 0),"type":"# + JSONValue.quote(env.str("type") ?? "")
        if let cause = env.integer("cause") { out += #","cause":\#(cause)"# }
        if let payload = env.raw("payload") { out += #","payload":"# + String(decoding: payload, as: UTF8.self) }
        handle.write(Data((out + "}\n").utf8))
    }

    /// The event as fluxd sent it, without `op`: `{"kind":...,"t":...,...}`.
    private func wireJSON(_ env: Envelope) -> String {
        "{" + env.fields.filter { $0.key != "op" }.map { field in
            JSONValue.quote(field.key) + ":" + String(decoding: env.body[field.value.range], as: UTF8.self)
        }.joined(separator: ",") + "}"
    }

    private func who(_ id: Int?, _ name: String? = nil) -> String {
        guard let id else { return "?" }
        return "\(name ?? names[id] ?? "peer")(\(id))"
    }

    private mutating func timestamp(_ t: Int?) -> String {
        guard let t else { return "" }
        switch time {
        case .none: return ""
        case .uptime: return Style.dim(String(format: "%10.3f", Double(t) / 1000)) + " "
        case .wall:
            let offset = epochOffset ?? (Date().timeIntervalSince1970 - Double(t) / 1000)
            epochOffset = offset
            let date = Date(timeIntervalSince1970: offset + Double(t) / 1000)
            var seconds = time_t(date.timeIntervalSince1970)
            var parts = tm()
            localtime_r(&seconds, &parts)
            let ms = Int((date.timeIntervalSince1970 - Double(seconds)) * 1000)
            return Style.dim(String(format: "%02d:%02d:%02d.%03d", parts.tm_hour, parts.tm_min, parts.tm_sec, ms)) + " "
        }
    }

    private mutating func line(_ kind: String, _ env: Envelope) -> String {
        let label = kind.padding(toLength: 10, withPad: " ", startingAt: 0)
        let stamp = timestamp(env.integer("t"))
        let seq = env.integer("seq").map { "#\($0)" } ?? "#?"
        var text: String
        switch kind {
        case "dispatch":
            text = Style.cyan(label) + " \(seq) " + Style.bold(env.str("type") ?? "?") + " from \(who(env.integer("origin"), env.str("originName")))"
            if let cause = env.integer("cause") { text += " cause #\(cause)" }
            if let payload = env.raw("payload"), String(decoding: payload, as: UTF8.self) != "null" {
                text += " " + String(decoding: payload, as: UTF8.self)
            }
        case "settle":
            let results = (env.json("results").flatMap { if case .array(let a) = $0 { a } else { nil } } ?? []).map(parseResult)
            text = Style.blue(label) + " \(seq) " + results.map { r -> String in
                switch r.status {
                case .done(let version): return "\(r.store) " + Style.green("done") + " v\(version)"
                case .rejected(let code, _): return "\(r.store) " + Style.red("rejected") + " \(code)"
                case .unavailable(let code, _): return "\(r.store) " + Style.yellow("unavailable") + " \(code)"
                }
            }.joined(separator: ", ")
        case "snapshot":
            text = Style.magenta(label) + " \(env.str("store") ?? "?") v\(env.integer("version") ?? 0) \(seq)"
            if let state = env.raw("state") {
                text += states ? " " + String(decoding: state, as: UTF8.self) : " (\(state.count) bytes)"
            }
        case "delta":  // SPEC §16: a change that came as a patch
            text = Style.magenta(label) + " \(env.str("store") ?? "?") v\(env.integer("version") ?? 0) \(seq)"
            if let patch = env.raw("patch") {
                text += states ? " " + String(decoding: patch, as: UTF8.self) : " (patch, \(patch.count) bytes)"
            }
        case "store-up":
            text = Style.green(label) + " \(env.str("store") ?? "?") v\(env.integer("version") ?? 0)"
        case "store-down":
            text = Style.red(label) + " \(env.str("store") ?? "?") (\(env.str("reason") ?? "?"))"
        case "connect":
            text = Style.green(label) + " \(who(env.integer("peer"), env.str("name"))) \(env.str("role") ?? "?")"
            if let pid = env.integer("pid") { text += " pid \(pid)" }
            if let uid = env.integer("uid") { text += " uid \(uid)" }
        case "disconnect":
            text = Style.yellow(label) + " \(who(env.integer("peer"), env.str("name")))"
        case "error":
            text = Style.red(label) + " \(who(env.integer("peer"))) \(env.str("code") ?? "?"): \(env.str("message") ?? "")"
        default:
            text = label + " " + wireJSON(env)
        }
        return stamp + text
    }
}

/// A `FileHandle` handed to the task that writes the record's gap markers (each `write` is one system call).
struct SendableHandle: @unchecked Sendable {
    let handle: FileHandle
}
