import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation

/// `fluxctl journal`: the actions fluxd's journal holds, with their outcomes (SPEC §8.12 `history`).
struct Journal: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the actions in fluxd's journal with their results (a durable fluxd; docs/journal.md).",
        discussion: """
            By default the newest 20. --from SEQ [--to SEQ] prints a range; --all everything retained. With --json, \
            one object per action (seq, time, type, origin, cause, payload, targets, results: the export format \
            that fluxctl replay reads).
            """)
    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: "Print the newest N actions.") var tail: Int?
    @Option(name: .long, help: ArgumentHelp("Start at this seq.", valueName: "seq")) var from: Int?
    @Option(name: .long, help: ArgumentHelp("Stop after this seq.", valueName: "seq")) var to: Int?
    @Flag(name: .long, help: "Print every action the journal retains.") var all = false

    func validate() throws {
        if let tail, tail < 1 { throw ValidationError("--tail must be at least 1") }
        if let from, from < 1 { throw ValidationError("--from must be a seq (at least 1)") }
        if tail != nil && (from != nil || all) { throw ValidationError("--tail cannot be combined with --from or --all") }
    }

    func run() async throws {
        let client = try await options.connect(role: .monitor)
        defer { client.abort() }
        let socket = options.socketPath
        let entries: [HistoryEntry]
        do {
            if from != nil || all {
                entries = try await Self.range(client, from: from, to: to, timeout: options.requestDuration)
            } else {
                entries = try await Self.newest(client, count: tail ?? 20, timeout: options.requestDuration)
            }
        } catch {
            if case .server(let e)? = error as? FluxError, e.code == .notRetained {
                throw fail(Exit.refused, "fluxd keeps no journal (it runs --ephemeral): \(e.message)")
            }
            throw failure(error, socket: socket)
        }
        for entry in entries {
            if options.json {
                emit(entry.json.description)
            } else {
                emit(Self.line(entry))
            }
        }
    }

    /// Every entry from `from` (nil: the oldest retained) to `to`, page by page.
    static func range(_ client: FluxClient, from: Int?, to: Int?, timeout: Duration) async throws -> [HistoryEntry] {
        var out: [HistoryEntry] = []
        var next = from
        while true {
            let page = try await client.history(from: next, limit: 1000, timeout: timeout)
            for e in page.entries {
                if let to, e.seq > to { return out }
                out.append(e)
            }
            guard let n = page.next, !page.entries.isEmpty else { return out }
            next = n
        }
    }

    /// The newest `count` entries (seqs have gaps after restarts: the window grows until it holds enough).
    static func newest(_ client: FluxClient, count: Int, timeout: Duration) async throws -> [HistoryEntry] {
        let probe = try await client.history(limit: 1, timeout: timeout)
        guard probe.last > 0, !probe.entries.isEmpty else { return [] }
        var span = count
        while true {
            let from = max(probe.first, probe.last - span + 1)
            let entries = try await range(client, from: from, to: nil, timeout: timeout)
            if entries.count >= count || from == probe.first { return Array(entries.suffix(count)) }
            span *= 4
        }
    }

    static func line(_ e: HistoryEntry) -> String {
        let time = Date(timeIntervalSince1970: Double(e.time) / 1000)
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let results = ((try? JSONValue(parsing: e.results.bytes))?.arrayValue ?? []).map { r -> String in
            let store = r["store"]?.stringValue ?? "?"
            switch r["status"]?.stringValue {
            case "done": return "\(store) \(Style.green("done")) v\(r["version"]?.intValue ?? 0)"
            case "rejected": return "\(store) \(Style.red("rejected")) \(r["error"]?["code"]?.stringValue ?? "")"
            case let s: return "\(store) \(Style.yellow(s ?? "?")) \(r["error"]?["code"]?.stringValue ?? "")"
            }
        }
        let pending = e.targets.count - results.count
        let outcome = results.joined(separator: ", ") + (pending > 0 ? (results.isEmpty ? "" : ", ") + Style.dim("\(pending) pending") : "")
        let cause = e.cause.map { " cause \($0)" } ?? ""
        return "\(Style.bold(String(e.seq))) \(Style.dim(formatter.string(from: time))) \(Style.cyan(e.type)) \(e.payload) \(Style.dim("from peer \(e.origin)\(cause)")) -> \(outcome)"
    }
}

/// `fluxctl replay FILE`: dispatches an exported journal (`fluxctl journal --json`) again, keeping its outcomes.
struct Replay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replay an exported journal (fluxctl journal --json) into a bus, e.g. fresh stores on an ephemeral fluxd.",
        discussion: """
            Actions are dispatched in seq order, one at a time, each awaiting its settlement, with the seq and \
            cause they had (the bus must run fluxd --replay: stores that keep seqs in their state then end the \
            same). An action that fluxd gave up for every target when it was journaled (unavailable: the store was \
            down) had no effect then and is skipped, so later actions see the same states; each result is \
            compared with the journaled one (done or rejected, store by store). Exit 1 if any differs or an action \
            was given up for some targets only (it cannot be replayed exactly).
            """)
    @OptionGroup var options: GlobalOptions
    @Argument(help: ArgumentHelp("The exported journal (- for stdin).", valueName: "file")) var file: String

    func run() async throws {
        let text: String
        if file == "-" {
            text = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
        } else {
            guard let data = FileManager.default.contents(atPath: file) else { throw fail(Exit.badInput, "cannot read \(file)") }
            text = String(decoding: data, as: UTF8.self)
        }
        var entries: [(line: Int, value: JSONValue)] = []
        for (i, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() where !line.isEmpty {
            entries.append((i + 1, try parseJSONArgument(String(line), what: "\(file) line \(i + 1)")))
        }
        let client = try await options.connect()
        defer { client.abort() }
        let socket = options.socketPath
        var replayed = 0, skipped = 0, differing = 0, partial = 0
        for (line, entry) in entries {
            guard let seq = entry["seq"]?.intValue, let type = entry["type"]?.stringValue, let payload = entry["payload"],
                  let results = entry["results"]?.arrayValue else {
                throw fail(Exit.badInput, "\(file) line \(line): not an exported journal entry (seq, type, payload, results)")
            }
            let journaled = Dictionary(results.compactMap { r in r["store"]?.stringValue.map { ($0, r["status"]?.stringValue ?? "") } },
                                       uniquingKeysWith: { a, _ in a })
            let givenUp = journaled.values.filter { $0 == "unavailable" }.count
            if givenUp > 0 && givenUp == journaled.count {
                skipped += 1
                if !options.json { emit(Style.dim("seq \(seq) \(type): skipped (given up for every store when journaled)")) }
                continue
            }
            if givenUp > 0 {
                partial += 1
                printError("fluxctl: seq \(seq) \(type): given up for some stores only when journaled; replayed to all of them")
            }
            let settlement: Settlement
            do {
                settlement = try await client.replayDispatch(type: type, payloadJSON: Array(payload.compact.utf8), seq: seq,
                                                             cause: entry["cause"]?.intValue, timeout: options.requestDuration)
            } catch {
                if case .server(let e) = error, e.code == .forbidden {
                    throw fail(Exit.refused, "fluxd refused a replayed seq (\(e.message)): replay into a fluxd started with --replay")
                }
                throw failure(error, socket: socket)
            }
            replayed += 1
            var differences: [String] = []
            for r in settlement.results {
                let now: String
                switch r.status {
                case .done: now = "done"
                case .rejected: now = "rejected"
                case .unavailable: now = "unavailable"
                }
                let then = journaled[r.store] ?? "absent"
                if then != "unavailable" && then != now { differences.append("\(r.store): \(then) then, \(now) now") }
            }
            if !differences.isEmpty {
                differing += 1
                printError("fluxctl: seq \(seq) \(type) (replayed as seq \(settlement.seq)) differs: \(differences.joined(separator: "; "))")
            }
        }
        if options.json {
            var line = JSONLine()
            line.add("replayed", replayed)
            line.add("skipped", skipped)
            line.add("differing", differing)
            line.add("partial", partial)
            emit(line.text)
        } else {
            emit("replayed \(replayed) actions, skipped \(skipped) given up when journaled; \(differing) differed, \(partial) partly given up")
        }
        if differing > 0 || partial > 0 { throw ExitCode(Exit.failed) }
    }
}
