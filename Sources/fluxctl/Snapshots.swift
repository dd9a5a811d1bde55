import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Synchronization

/// `fluxctl state STORE [--path /json/pointer]`: prints a store's retained snapshot.
struct State: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a store's current state (or a past one), pretty-printed.",
        discussion: """
            --path takes an RFC 6901 JSON pointer (/todos/0/title) and prints only that part of the state. \
            --version V (the store's version V; --at V is the same) or --seq N (after every action up to seq N) print \
            the state as it was (from a durable fluxd's journal, within its retention window). \
            --raw prints just the JSON value, compact on one line, with no header: T=$(fluxctl state todos --path \
            /todos/0/title --raw) captures "milk".
            """)
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String
    @Option(name: .long, help: ArgumentHelp("A JSON pointer into the state, e.g. /todos/0.", valueName: "pointer")) var path: String?
    @Option(name: [.customLong("version"), .customLong("at")], help: ArgumentHelp("The state at this version of the store (--at is the same).", valueName: "version")) var at: Int?
    @Option(name: .long, help: ArgumentHelp("The state after every action up to this seq was answered.", valueName: "seq")) var seq: Int?
    @Flag(name: .long, help: "Print only the JSON value, compact on one line (no header), e.g. for $(...).") var raw = false

    func validate() throws {
        if raw && options.json { throw ValidationError("give --raw or --json, not both") }
        if at != nil && seq != nil { throw ValidationError("give --version or --seq, not both") }
        if let at, at < 1 { throw ValidationError("--version must be a version (at least 1)") }
        if let seq, seq < 0 { throw ValidationError("--seq must not be negative") }
    }

    func run() async throws {
        try checkStoreName(store)
        let pointer: JSONPointer?
        do {
            pointer = try path.map { p throws(PointerError) in try JSONPointer(parsing: p) }
        } catch {
            throw fail(Exit.badInput, error.message)
        }
        let client = try await options.connect()
        defer { client.abort() }
        let socket = options.socketPath
        let got: Snapshot<RawJSON>
        do {
            if at != nil || seq != nil {
                got = try await client.stateAt(store: store, version: at, seq: seq)
            } else {
                got = try await client.getJSON(store: store)
            }
        } catch where error.code == .notRetained {
            throw fail(Exit.refused, "fluxd has no such state of \(store): \(error)")
        } catch where error.code == .unknownStore {
            throw fail(Exit.refused, await unknownStoreMessage(store, client: client, timeout: options.requestDuration))
        } catch {
            throw failure(error, socket: socket)
        }
        let state = (try? JSONValue(parsing: got.state.bytes)) ?? .null
        let version = got.version
        let seq = got.seq
        var value = state
        if let pointer {
            do {
                value = try pointer.resolve(in: state)
            } catch {
                throw fail(Exit.badInput, "\(error.message) (in \(store) version \(version))")
            }
        }
        if raw {
            emit(value.compact)
        } else if options.json {
            var line = JSONLine()
            line.add("store", store)
            line.add("version", version)
            line.add("seq", seq)
            if let pointer {
                line.add("path", pointer.description)
                line.add("value", value)
            } else {
                line.add("state", value)
            }
            emit(line.text)
        } else {
            emit(Style.dim("\(store) version \(version) (seq \(seq))" + (pointer.map { " \($0)" } ?? "")))
            emit(value.pretty(colors: Terminal.jsonColors))
        }
    }
}

/// `fluxctl watch STORE`: follows a store's snapshots live, as diffs (default) or whole states (`--full`); with
/// `--path`, follows the value at one JSON pointer through a path subscription (SPEC §16.4).
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow a store's snapshots live, showing what changed.",
        discussion: """
        Prints the retained state, then for every new version the changes from the previous one: \
        + added, - removed, ~ changed, each with its JSON pointer path (old -> new values), with the version, \
        the seq and the type of the action that produced it. --full prints whole snapshots instead. \
        Also shows when the store goes down and comes back, and when fluxd goes away and comes back (watch waits \
        for it like the libraries do; --no-reconnect exits instead). \
        --path /todos/3 follows only the value at that JSON pointer (a path subscription, fluxd 0.4.0 or newer): \
        the retained version's value, then the value at every version whose change touched it ("absent" when \
        the state has nothing there); changes elsewhere in the state print nothing.
        """)
    @OptionGroup var options: GlobalOptions
    @Argument(help: ArgumentHelp("The stores to watch: names, or patterns ending in * (todo*: every store whose name starts with todo, those registering later included).", valueName: "store"))
    var stores: [String]
    @Flag(name: .long, help: "Print whole snapshots instead of changes.") var full = false
    @Option(name: .long, help: ArgumentHelp("Follow only the value at this JSON pointer, e.g. /todos/3.", valueName: "pointer"))
    var path: String?
    @Option(name: .long, help: "Exit after this many snapshots (with --path: values).") var count: Int?
    @Flag(name: .customLong("no-reconnect"), help: "Exit when fluxd goes away (by default wait for it, like the libraries).")
    var noReconnect = false

    /// The one store of `watch --path`.
    var store: String { stores[0] }

    func validate() throws {
        if stores.isEmpty { throw ValidationError("name at least one store (or a pattern such as todo*)") }
        if path != nil && full { throw ValidationError("--full does not go with --path (values at a path print whole)") }
        if path != nil && (stores.count != 1 || stores[0].hasSuffix("*")) {
            throw ValidationError("--path follows one store: name exactly one, not a pattern")
        }
    }

    func run() async throws {
        let patterns = stores.filter { $0.hasSuffix("*") }
        for name in stores where !name.hasSuffix("*") { try checkStoreName(name) }
        for pattern in patterns where !Names.isValidStore(String(pattern.dropLast())) && pattern != "*" {
            throw fail(ExitCode.validationFailure.rawValue, "\"\(pattern)\" is not a store-name pattern (a name's start followed by *)")
        }
        if let path { return try await watchPath(path) }
        // A monitor connection: it may subscribe, and its event stream says which action type each seq was (and,
        // for patterns, which stores register later).
        let client = try await options.connect(role: .monitor, reconnect: !noReconnect)
        defer { client.abort() }
        let connectivity = reportConnectivity(client, json: options.json)
        defer { connectivity.cancel() }
        var names = stores.filter { !$0.hasSuffix("*") }
        if !patterns.isEmpty {
            let known = (try? await client.info(timeout: options.requestDuration))?.stores.map(\.name) ?? []
            for name in known.sorted() where Watch.matches(name, patterns) && !names.contains(name) { names.append(name) }
        }
        let stream = watchStream(client, stores: names, patterns: patterns)
        let count = self.count, socket = options.socketPath, json = options.json, full = self.full
        do {
            try await printSnapshots(from: stream, stores: names, json: json, full: full, count: count, timeout: options.timeout)
        } catch {
            throw failure(error, socket: socket)
        }
    }

    /// Whether a store name matches one of the patterns (`todo*`; `*` is every store).
    static func matches(_ name: String, _ patterns: [String]) -> Bool {
        patterns.contains { name.hasPrefix(String($0.dropLast())) }
    }

    /// `watch --path`: a path subscription through FluxClient; its values print as `PathPrinter` says.
    private func watchPath(_ path: String) async throws {
        do {
            _ = try JSONPointer(parsing: path)
        } catch {
            throw fail(Exit.badInput, error.message)
        }
        guard path.utf8.count <= FluxClient.maxPathBytes else {
            throw fail(Exit.badInput, "a JSON pointer for --path has at most \(FluxClient.maxPathBytes) bytes (this one has \(path.utf8.count))")
        }
        // A monitor connection: its event stream says which action type each seq was (the dispatch event comes
        // before the value it produced, and the SDK hands monitor events over as it reads them).
        let client = try await options.connect(role: .monitor, reconnect: !noReconnect)
        defer { client.abort() }
        let connectivity = reportConnectivity(client, json: options.json)
        defer { connectivity.cancel() }
        let socket = options.socketPath
        guard client.welcome.limits.deltaHistory != nil else {
            throw fail(Exit.refused, "the fluxd at \(socket) (\(client.welcome.server)) has no path subscriptions: watch --path needs fluxd 0.4.0 or newer")
        }
        let types = ActionTypes()
        _ = client.addMonitorListener(deliver: { types.take($0) }, end: { _ in })
        let store = self.store, count = self.count, json = options.json
        do {
            let subscription = try client.subscribeJSON(store: store, path: path)
            defer { subscription.cancel() }
            try await streamFor(options.timeout, counted: count != nil, "watching \(path) in \(store)") {
                let printer = PathPrinter(store: store, path: path, json: json)
                var seen = 0
                for try await event in subscription {
                    if printer.handle(event, status: subscription.status, type: { types[$0] }) { seen += 1 }
                    if let count, seen >= count { return }
                }
                throw FluxError.disconnected("fluxd closed the connection")
            }
        } catch {
            throw failure(error, socket: socket)
        }
    }
}

/// The action types of the seqs a monitor connection saw dispatched (the newest 4096), shared between the client's
/// reader (which records them) and the task printing values.
final class ActionTypes: Sendable {
    private let types = Mutex<[Int: String]>([:])

    /// Records a `dispatch` event's type.
    func take(_ event: MonitorEvent) {
        guard event.kind == "dispatch", let seq = event.seq, let type = event.type else { return }
        types.withLock { types in
            types[seq] = type
            if types.count > 4096 { types = types.filter { $0.key > seq - 2048 } }
        }
    }

    subscript(seq: Int) -> String? { types.withLock { $0[seq] } }
}

/// Prints a path subscription's events for `watch --path`. Human: `watching STORE PATH (status, version V)`, then
/// per value `STORE PATH version V (seq N type)` and the value pretty-printed (or `absent`); store-down/up lines as
/// `watch` prints them. `--json`: one object per value, `{"store","path","version","seq","exists","value"}` (as
/// SPEC §16.4's `subtree`: no `value` when it does not exist); status news go to stderr.
struct PathPrinter {
    let store: String
    let path: String
    let json: Bool

    /// Handles an event; returns true when it was a value (counted by --count).
    func handle(_ event: PathEvent<RawJSON>, status current: SubscriptionStatus?, type: (Int) -> String?) -> Bool {
        switch event {
        case .subscribed(let status):
            if !json { emit(Style.dim("watching \(store) \(path) (\(status.rawValue), version \(current?.version ?? 0))")) }
            if status == .unknown {
                printError("fluxctl: no store named \"\(store)\" has registered yet; waiting for it")
            }
            return false
        case .value(let subtree):
            let value = subtree.value.map { (try? JSONValue(parsing: $0.bytes)) ?? .null }
            if json {
                var line = JSONLine()
                line.add("store", store)
                line.add("path", path)
                line.add("version", subtree.version)
                line.add("seq", subtree.seq)
                line.add("exists", subtree.exists)
                line.add("value", value)
                emit(line.text)
                return true
            }
            let cause = subtree.seq == 0 ? "" : " (seq \(subtree.seq)\(type(subtree.seq).map { " " + $0 } ?? ""))"
            emit(Style.bold("\(store) \(path) version \(subtree.version)") + cause)
            if let value {
                emit(value.pretty(colors: Terminal.jsonColors).split(separator: "\n", omittingEmptySubsequences: false)
                    .map { "  " + $0 }.joined(separator: "\n"))
            } else {
                emit("  " + Style.dim("absent"))
            }
            return true
        case .storeDown(let reason):
            if json {
                printError("fluxctl: store \(store) is down (\(reason))")
            } else {
                emit(Style.red("\(store) down") + " (\(reason))")
            }
            return false
        case .storeUp(let version):
            if json {
                printError("fluxctl: store \(store) is up again (version \(version))")
            } else {
                emit(Style.green("\(store) up") + " (version \(version))")
            }
            return false
        }
    }
}

/// `fluxctl query STORE QUERY-JSON`: holds a query open and prints the store's snapshots.
struct Query: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Hold a query open on a store and print its snapshots.",
        discussion: "The query stays active until fluxctl exits (interrupt it, or use --count). Snapshots print as in `watch --full`.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String
    @Argument(help: ArgumentHelp("The query as JSON, e.g. '{\"site\":1}'.", valueName: "query-json")) var query: String
    @Option(name: .long, help: "Exit after this many snapshots.") var count: Int?

    func run() async throws {
        try checkStoreName(store)
        _ = try parseJSONArgument(query, what: "the query")
        let client = try await options.connect()
        defer { client.abort() }
        let store = self.store, count = self.count, socket = options.socketPath, json = options.json
        do {
            let receipt = try await client.query(store: store, queryJSON: Array(query.utf8))
            defer { withExtendedLifetime(receipt) {} }
            if !json { emit(Style.dim("query \(store) \(query) active")) }
            let stream = watchStream(client, stores: [store], patterns: nil)
            try await printSnapshots(from: stream, stores: [store], json: json, full: true, count: count, timeout: options.timeout)
        } catch {
            throw failure(error, socket: socket)
        }
    }
}

/// What `watch` and `query` print from: the stores' subscription events and (for `watch`) fluxd's monitor events,
/// merged in the order fluxd sent them (the SDK hands both to callbacks in wire order), so the dispatch event of an
/// action is seen before the snapshot it produced.
enum WatchItem: Sendable {
    case store(String, WireStoreEvent)
    case monitor(MonitorEvent)
    /// A store that matches a pattern registered: it is watched from now on.
    case added(String)
    case ended(FluxError?)
}

/// Subscribes to `stores` (and, for `watch`, `patterns` not nil, to the monitor stream: action types, and the
/// stores that register later and match a pattern) and merges what arrives into one stream.
func watchStream(_ client: FluxClient, stores: [String], patterns: [String]?) -> AsyncStream<WatchItem> {
    let (stream, continuation) = AsyncStream.makeStream(of: WatchItem.self)
    let watched = Mutex(Set(stores))
    @Sendable func subscribe(_ store: String) {
        let id = client.addSubscriber(store: store, deliver: { continuation.yield(.store(store, $0)) },
                                      end: { continuation.yield(.ended($0)); continuation.finish() })
        if id == nil { continuation.finish() }
    }
    if let patterns {
        _ = client.addMonitorListener(deliver: { event in
            continuation.yield(.monitor(event))
            // A store that registers (store-up) and matches a pattern: watched from now on.
            guard !patterns.isEmpty, event.kind == "store-up", let name = event.message.str("store"),
                  Watch.matches(name, patterns) else { return }
            let isNew = watched.withLock { $0.insert(name).inserted }
            if isNew {
                continuation.yield(.added(name))
                subscribe(name)
            }
        }, end: { _ in })
    }
    for store in stores { subscribe(store) }
    return stream
}

/// Prints the stores' subscription events from `stream` with a `SnapshotPrinter` each (watch and query) until
/// `count` snapshots have printed, within `timeout` seconds; throws `disconnected` if fluxd closes the connection
/// first.
private func printSnapshots(from stream: AsyncStream<WatchItem>, stores: [String], json: Bool, full: Bool, count: Int?,
                            timeout: Double?) async throws {
    try await streamFor(timeout, counted: count != nil, "watching \(stores.joined(separator: ", "))") {
        var printers = Dictionary(uniqueKeysWithValues: stores.map { ($0, SnapshotPrinter(store: $0, json: json, full: full)) })
        var types: [Int: String] = [:]
        var seen = 0
        for await item in stream {
            switch item {
            case .ended(let error):
                throw error ?? FluxError.disconnected("fluxd closed the connection")
            case .monitor(let event):
                if event.kind == "dispatch", let seq = event.seq, let type = event.type {
                    types[seq] = type
                    if types.count > 4096 { types = types.filter { $0.key > seq - 2048 } }
                }
            case .added(let store):
                printers[store] = SnapshotPrinter(store: store, json: json, full: full)
            case .store(let store, let event):
                if printers[store]?.handle(event, types: types) == true { seen += 1 }
            }
            if let count, seen >= count { return }
        }
        throw FluxError.disconnected("fluxd closed the connection")
    }
}

/// Prints one store's subscription events (`subscribed`, `snapshot`, `store-down`, `store-up`) for watch and
/// query, naming the action behind each snapshot from the monitor's `dispatch` events.
struct SnapshotPrinter {
    let store: String
    let json: Bool
    let full: Bool
    private var previous: JSONValue?
    private var lastVersion = 0

    init(store: String, json: Bool, full: Bool) {
        self.store = store
        self.json = json
        self.full = full
    }

    /// Handles an event; returns true when it was a snapshot of the store (counted by --count).
    /// Prints one event of its store; `types` names the action of each seq (from the monitor). Returns whether
    /// it printed a snapshot (counted by --count).
    mutating func handle(_ event: WireStoreEvent, types: [Int: String]) -> Bool {
        var line = JSONLine()
        switch event {
        case .subscribed(let status, let version):
            if json {
                line.add("event", "subscribed")
                line.add("store", store)
                line.add("status", status.rawValue)
                line.add("version", version)
                emit(line.text)
            } else {
                emit(Style.dim("watching \(store) (\(status.rawValue), version \(version))"))
                if status == .unknown {
                    printError("fluxctl: no store named \"\(store)\" has registered yet; waiting for it")
                }
            }
            return false
        case .snapshot(let raw):
            let state = (try? JSONValue(parsing: raw.state)) ?? .null
            let version = raw.version
            let seq = raw.seq
            if version <= lastVersion { return false }
            lastVersion = version
            let type = types[seq]
            defer { previous = state }
            let changes = (full ? nil : previous).map { $0.changes(to: state) }
            if json {
                line.add("event", changes == nil ? "snapshot" : "diff")
                line.add("store", store)
                line.add("version", version)
                line.add("seq", seq)
                line.add("type", type)
                if let changes {
                    line.add("changes", JSONValue.array(changes.map(changeJSON)))
                } else {
                    line.add("state", state)
                }
                emit(line.text)
                return true
            }
            let cause = seq == 0 ? "" : " (seq \(seq)\(type.map { " " + $0 } ?? ""))"
            emit(Style.bold("\(store) version \(version)") + cause)
            if let changes {
                if changes.isEmpty { emit("  (no change)") }
                for c in changes { emit("  " + changeText(c)) }
            } else {
                emit(state.pretty(colors: Terminal.jsonColors).split(separator: "\n", omittingEmptySubsequences: false)
                    .map { "  " + $0 }.joined(separator: "\n"))
            }
            return true
        case .storeDown(let reason):
            if json {
                line.add("event", "store-down")
                line.add("store", store)
                line.add("reason", reason)
                emit(line.text)
            } else {
                emit(Style.red("\(store) down") + " (\(reason))")
            }
            return false
        case .storeUp(let version):
            if json {
                line.add("event", "store-up")
                line.add("store", store)
                line.add("version", version)
                emit(line.text)
            } else {
                emit(Style.green("\(store) up") + " (version \(version))")
            }
            return false
        }
    }
}

/// A change as `{"op":"add"|"remove"|"replace","path":...,"old":...,"value":...}` (JSON Patch, plus `old`).
func changeJSON(_ c: JSONChange) -> JSONValue {
    var line = JSONLine()
    line.add("op", c.kind.rawValue)
    line.add("path", c.path.description)
    line.add("old", c.old)
    line.add("value", c.new)
    return line.value
}

/// A change as one line: `+ /path value`, `- /path old`, `~ /path old -> new`.
func changeText(_ c: JSONChange) -> String {
    let path = c.path.tokens.isEmpty ? "(root)" : c.path.description
    switch c.kind {
    case .add: return Style.green("+ \(path)") + "  " + (c.new?.compact ?? "")
    case .remove: return Style.red("- \(path)") + "  " + (c.old?.compact ?? "")
    case .replace: return Style.yellow("~ \(path)") + "  " + (c.old?.compact ?? "") + " -> " + (c.new?.compact ?? "")
    }
}
