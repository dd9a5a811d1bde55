import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation

/// `fluxctl state STORE [--path /json/pointer]`: prints a store's retained snapshot.
struct State: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a store's current state, pretty-printed.",
        discussion: "--path takes an RFC 6901 JSON pointer (/todos/0/title) and prints only that part of the state.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String
    @Option(name: .long, help: ArgumentHelp("A JSON pointer into the state, e.g. /todos/0.", valueName: "pointer")) var path: String?

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
        let reader = FrameReader(client)
        let socket = options.socketPath
        let got: Envelope
        do {
            try client.sendRaw(body: Array(#"{"op":"get","id":"g","store":"\#(store)"}"#.utf8))
            got = try await withTimeout(options.requestTimeout, "waiting for the state of \(store)") { () -> Envelope in
                while let env = await reader.next() {
                    if env.str("id") == "g" || env.str("ref") == "g" { return env }
                }
                throw FluxError.disconnected("fluxd closed the connection")
            }
        } catch {
            throw failure(error, socket: socket)
        }
        if got.str("op") == "error" {
            if got.str("code") == ErrorCode.unknownStore.rawValue {
                throw fail(Exit.refused, await unknownStoreMessage(store, client: client, timeout: options.requestTimeout))
            }
            throw failure(got.serverError, socket: socket)
        }
        let state = got.json("state") ?? .null
        let version = got.integer("version") ?? 0
        let seq = got.integer("seq") ?? 0
        var value = state
        if let pointer {
            do {
                value = try pointer.resolve(in: state)
            } catch {
                throw fail(Exit.badInput, "\(error.message) (in \(store) version \(version))")
            }
        }
        if options.json {
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

/// `fluxctl watch STORE`: follows a store's snapshots live, as diffs (default) or whole states (`--full`).
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow a store's snapshots live, showing what changed.",
        discussion: """
        Prints the retained state, then for every new version the changes from the previous one: \
        + added, - removed, ~ changed, each with its JSON pointer path (old -> new values), with the version, \
        the seq and the type of the action that produced it. --full prints whole snapshots instead. \
        Also shows when the store goes down and comes back.
        """)
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String
    @Flag(name: .long, help: "Print whole snapshots instead of changes.") var full = false
    @Option(name: .long, help: "Exit after this many snapshots.") var count: Int?

    func run() async throws {
        try checkStoreName(store)
        // A monitor connection: it may subscribe, and its event stream says which action type each seq was.
        let client = try await options.connect(role: .monitor)
        defer { client.abort() }
        let reader = FrameReader(client)
        try? client.sendRaw(body: Array(#"{"op":"subscribe","store":"\#(store)"}"#.utf8))
        let store = self.store, count = self.count, socket = options.socketPath, json = options.json, full = self.full
        do {
            try await printSnapshots(from: reader, store: store, json: json, full: full, count: count, timeout: options.timeout)
        } catch {
            throw failure(error, socket: socket)
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
        let reader = FrameReader(client)
        let store = self.store, count = self.count, socket = options.socketPath, json = options.json
        do {
            try client.sendRaw(body: Array(#"{"op":"query","id":"q","store":"\#(store)","query":"#.utf8) + Array(query.utf8) + [UInt8(ascii: "}")])
            let reply = try await withTimeout(options.requestTimeout, "waiting for fluxd to accept the query") { () -> Envelope in
                while let env = await reader.next() {
                    if env.str("id") == "q" || env.str("ref") == "q" { return env }
                }
                throw FluxError.disconnected("fluxd closed the connection")
            }
            if reply.str("op") == "error" { throw reply.serverError }
            if !json { emit(Style.dim("query \(store) \(query) active")) }
            try client.sendRaw(body: Array(#"{"op":"subscribe","store":"\#(store)"}"#.utf8))
            try await printSnapshots(from: reader, store: store, json: json, full: true, count: count, timeout: options.timeout)
        } catch {
            throw failure(error, socket: socket)
        }
    }
}

/// Prints `store`'s subscription frames from `reader` with a `SnapshotPrinter` (watch and query) until `count`
/// snapshots have printed, within `timeout` seconds; throws `disconnected` if fluxd closes the connection first.
private func printSnapshots(from reader: FrameReader, store: String, json: Bool, full: Bool, count: Int?,
                            timeout: Double?) async throws {
    try await withTimeout(timeout, "watching \(store)") {
        var printer = SnapshotPrinter(store: store, json: json, full: full)
        var seen = 0
        while let env = await reader.next() {
            if try printer.handle(env) { seen += 1 }
            if let count, seen >= count { return }
        }
        throw FluxError.disconnected("fluxd closed the connection")
    }
}

/// Prints one store's subscription frames (`subscribed`, `snapshot`, `store-down`, `store-up`) for watch and
/// query, and remembers action types from monitor `event`s to name the action behind each snapshot.
struct SnapshotPrinter {
    let store: String
    let json: Bool
    let full: Bool
    private var previous: JSONValue?
    private var types: [Int: String] = [:]

    init(store: String, json: Bool, full: Bool) {
        self.store = store
        self.json = json
        self.full = full
    }

    /// Handles a frame; returns true when it was a snapshot of the store (counted by --count).
    mutating func handle(_ env: Envelope) throws -> Bool {
        let op = env.str("op")
        if op == "event" {
            if env.str("kind") == "dispatch", let seq = env.integer("seq"), let type = env.str("type") {
                types[seq] = type
                if types.count > 4096 { types = types.filter { $0.key > seq - 2048 } }
            }
            return false
        }
        if op == "error" {
            let error = env.serverError
            if env.bool("fatal").value == true { throw error }
            printError("fluxctl: fluxd error: \(error)")
            return false
        }
        if op == "bye" { throw FluxError.disconnected("fluxd said bye (\(env.str("reason") ?? "?"))") }
        guard env.str("store") == store else { return false }
        var line = JSONLine()
        switch op {
        case "subscribed":
            let status = env.str("status") ?? "?"
            let version = env.integer("version") ?? 0
            if json {
                line.add("event", "subscribed")
                line.add("store", store)
                line.add("status", status)
                line.add("version", version)
                emit(line.text)
            } else {
                emit(Style.dim("watching \(store) (\(status), version \(version))"))
                if status == "unknown" {
                    printError("fluxctl: no store named \"\(store)\" has registered yet; waiting for it")
                }
            }
            return false
        case "snapshot":
            let state = env.json("state") ?? .null
            let version = env.integer("version") ?? 0
            let seq = env.integer("seq") ?? 0
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
        case "store-down":
            let reason = env.str("reason") ?? "?"
            if json {
                line.add("event", "store-down")
                line.add("store", store)
                line.add("reason", reason)
                emit(line.text)
            } else {
                emit(Style.red("\(store) down") + " (\(reason))")
            }
            return false
        case "store-up":
            let version = env.integer("version") ?? 0
            if json {
                line.add("event", "store-up")
                line.add("store", store)
                line.add("version", version)
                emit(line.text)
            } else {
                emit(Style.green("\(store) up") + " (version \(version))")
            }
            return false
        default:
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
