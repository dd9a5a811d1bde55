import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation

/// `fluxctl dispatch TYPE [PAYLOAD]`, or `fluxctl dispatch --file F`: dispatches actions; with `--wait` (always for
/// `--file`), prints each settlement.
struct Dispatch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Dispatch an action, or replay recorded actions from a file.",
        discussion: """
        With --wait, prints every target store's result and new version, and exits 1 when a store rejected the \
        action, gave it up as unavailable, or no store handles it.

        --file F (or - for stdin) replays JSON lines {"type":"todo/create","payload":{...}} in order, as written \
        by `fluxctl monitor --record F`; fields other than type and payload are ignored, and lines with a \
        "cause" (actions a store dispatched in reaction to another one) are skipped unless --include-caused. \
        The whole input is read and checked first; then each action is dispatched and its settlement awaited \
        (--window N keeps up to N actions in flight; fluxd orders them as sent). Exits 1 if any action failed.
        """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "The action type, e.g. todo/create.") var type: String?
    @Argument(help: ArgumentHelp("The payload as JSON, e.g. '{\"title\":\"milk\"}'.", valueName: "payload-json")) var payload: String?
    @Flag(name: .long, help: "Wait for the settlement and print each store's result.") var wait = false
    @Option(name: .long, help: "Dispatch the action this many times.") var count = 1
    @Option(name: .long, help: ArgumentHelp("Replay actions from JSON lines in this file (- for stdin).", valueName: "file")) var file: String?
    @Option(name: .long, help: "How many actions may await their settlement at once (--file: 1 unless given; --count --wait: 64, or more if given).") var window = 1
    @Flag(name: .long, help: "With --file: also replay actions that carry a \"cause\".") var includeCaused = false

    func validate() throws {
        if file == nil && type == nil { throw ValidationError("give an action TYPE, or --file F") }
        if file != nil && (type != nil || payload != nil) { throw ValidationError("--file replaces TYPE and PAYLOAD") }
        if count < 1 { throw ValidationError("--count must be at least 1") }
        if window < 1 { throw ValidationError("--window must be at least 1") }
        if let type, !Names.isValidType(type) {
            throw ValidationError("\"\(type)\" is not an action type (1-256 bytes of A-Z a-z 0-9 . _ : / -)")
        }
    }

    func run() async throws {
        if let file {
            let actions = try readActions(file)
            try await replay(actions, source: file == "-" ? "stdin" : file)
            return
        }
        guard let type else { return }
        let payloadBytes: [UInt8]? = try payload.map { text in
            _ = try parseJSONArgument(text, what: "the payload")
            return Array(text.utf8)
        }
        let actions = Array(repeating: PlannedAction(line: nil, type: type, payload: payloadBytes), count: count)
        if wait {
            try await replay(actions, source: nil)
        } else {
            try await fireAndForget(actions)
        }
    }

    // MARK: Fire and forget

    private func fireAndForget(_ actions: [PlannedAction]) async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let socket = options.socketPath
        // One action and a fluxd that acknowledges (0.4.0): wait for `accepted` and print its seq.
        if actions.count == 1, client.welcome.limits.deltaHistory != nil {
            let action = actions[0]
            let seq: Int
            do {
                seq = try await client.dispatchAccepted(type: action.type, payloadJSON: action.payload, timeout: options.requestDuration)
            } catch {
                if case .server(let e) = error, e.ref != nil, !e.fatal { throw refusal(code: e.rawCode, message: e.message, type: action.type) }
                throw failure(error, socket: socket)
            }
            if options.json {
                var line = JSONLine()
                line.add("type", action.type)
                line.add("seq", seq)
                emit(line.text)
            } else {
                emit("\(action.type) seq \(seq)")
            }
            return
        }
        do {
            var ids: [String] = []
            for action in actions {
                ids.append(try client.dispatch(type: action.type, payloadJSON: action.payload))
            }
            // A ping barrier: a refusal of any of them arrives before the pong (SPEC §8.7).
            try await client.confirmDispatched(ids, timeout: options.requestDuration)
        } catch {
            if case .server(let e) = error, e.ref != nil, !e.fatal { throw refusal(code: e.rawCode, message: e.message, type: actions[0].type) }
            throw failure(error, socket: socket)
        }
        let type = actions[0].type
        if options.json {
            var line = JSONLine()
            line.add("type", type)
            line.add("dispatched", actions.count)
            emit(line.text)
        } else {
            emit(actions.count == 1 ? "dispatched \(type)" : "dispatched \(type) \(actions.count) times")
        }
    }

    private func refusal(code: String, message: String, type: String) -> ExitCode {
        if code == ErrorCode.noHandler.rawValue {
            return fail(Exit.failed, "no store handles \"\(type)\" (fluxd: no-handler)")
        }
        return fail(Exit.refused, "fluxd refused \(type): \(code): \(message)")
    }

    // MARK: Settled dispatch and replay

    private func replay(_ actions: [PlannedAction], source: String?) async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let socket = options.socketPath
        // --count --wait: a bounded window too (all at once would meet a store's queueLimit past 1024).
        let window = source == nil ? min(actions.count, max(self.window, 64)) : self.window
        var inFlight: [Int: PendingSettlement] = [:]
        var next = 0
        var printed = 0
        var failed = 0
        var refusedOther = false
        do {
            while printed < actions.count {
                // Up to `window` settled dispatches in flight, sent in file order (fluxd orders them as sent).
                while next < actions.count && inFlight.count < window {
                    inFlight[next] = try client.beginDispatchAndSettle(type: actions[next].type, payloadJSON: actions[next].payload)
                    next += 1
                }
                let action = actions[printed]
                let outcome: ActionOutcome
                do throws(FluxError) {
                    outcome = .settled(try await inFlight[printed]!.settlement(timeout: options.requestDuration))
                } catch {
                    guard case .server(let e) = error, !e.fatal else {
                        if case .timedOut(let message) = error {
                            // (The client's message ends with what fluxd says the action still waits for.)
                            let waiting = message.range(of: "; still waiting for ").map { String(message[$0.lowerBound...]) } ?? ""
                            throw fail(Exit.timedOut, "timed out after \(formatSeconds(options.requestTimeout)) s waiting for the settlement of \(action.type)"
                                       + (action.line.map { " (line \($0))" } ?? "") + waiting)
                        }
                        throw error
                    }
                    outcome = .refused(code: e.rawCode, message: e.message)
                }
                inFlight[printed] = nil
                switch outcome {
                case .settled(let s):
                    if !s.ok { failed += 1 }
                case .refused(let code, _):
                    failed += 1
                    if code != ErrorCode.noHandler.rawValue { refusedOther = true }
                    if source == nil { throw refusalExit(code: code, outcome: outcome, type: action.type) }
                }
                report(action, outcome)
                printed += 1
            }
        } catch {
            throw failure(error, socket: socket)
        }
        if let source, !options.json {
            emit("replayed \(actions.count) action\(actions.count == 1 ? "" : "s") from \(source): "
                 + "\(actions.count - failed) ok, \(failed) failed")
        }
        if refusedOther { throw ExitCode(Exit.refused) }
        if failed > 0 { throw ExitCode(Exit.failed) }
    }

    private func refusalExit(code: String, outcome: ActionOutcome, type: String) -> ExitCode {
        guard case .refused(_, let message) = outcome else { return ExitCode(Exit.failed) }
        if code == ErrorCode.noHandler.rawValue {
            return fail(Exit.failed, "no store handles \"\(type)\" (fluxd: no-handler)")
        }
        return fail(Exit.refused, "fluxd refused \(type): \(code): \(message)")
    }

    private func report(_ action: PlannedAction, _ outcome: ActionOutcome) {
        if options.json {
            var line = JSONLine()
            line.add("line", action.line)
            line.add("type", action.type)
            switch outcome {
            case .settled(let s):
                line.add("seq", s.seq)
                line.add("ok", s.ok)
                line.add("results", JSONValue.array(s.results.map(resultJSON)))
            case .refused(let code, let message):
                line.add("ok", false)
                var error = JSONLine()
                error.add("code", code)
                error.add("message", message)
                line.add("error", error.value)
            }
            emit(line.text)
            return
        }
        let at = action.line.map { " (line \($0))" } ?? ""
        switch outcome {
        case .settled(let s):
            emit(Style.bold(action.type) + " seq \(s.seq)" + at)
            for row in table(["", "", ""], s.results.map(resultRow)).dropFirst() { emit("  " + row) }
        case .refused(let code, let message):
            emit(Style.bold(action.type) + at + ": " + Style.red("refused") + " \(code): \(message)")
        }
    }

    // MARK: Reading --file

    private func readActions(_ file: String) throws -> [PlannedAction] {
        let data: Data
        if file == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            guard let contents = FileManager.default.contents(atPath: file) else {
                throw fail(Exit.badInput, "cannot read \(file): \(FileManager.default.fileExists(atPath: file) ? "permission denied" : "no such file")")
            }
            data = contents
        }
        let name = file == "-" ? "stdin" : file
        var actions: [PlannedAction] = []
        for (n, raw) in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).enumerated() {
            let lineNumber = n + 1
            let line = raw.last == UInt8(ascii: "\r") ? raw.dropLast() : raw
            if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
            let value: JSONValue
            do {
                value = try JSONValue(parsing: line)
            } catch {
                let text = String(decoding: line, as: UTF8.self)
                let caret = String(repeating: " ", count: max(0, min(error.column - 1, text.utf8.count))) + "^"
                throw fail(Exit.badInput, "\(name) line \(lineNumber) is not valid JSON at column \(error.column): \(error.reason)\n  \(text)\n  \(caret)")
            }
            guard case .object = value else {
                throw fail(Exit.badInput, "\(name) line \(lineNumber): expected an object {\"type\":...,\"payload\":...}")
            }
            if value["gap"] != nil && value["type"] == nil { continue }  // (monitor --record's mark of a gap)
            guard let type = value["type"]?.stringValue else {
                throw fail(Exit.badInput, "\(name) line \(lineNumber): no \"type\" string")
            }
            guard Names.isValidType(type) else {
                throw fail(Exit.badInput, "\(name) line \(lineNumber): \"\(type)\" is not an action type")
            }
            if value["cause"] != nil && !includeCaused { continue }
            actions.append(PlannedAction(line: lineNumber, type: type, payload: value["payload"].map { Array($0.compact.utf8) }))
        }
        return actions
    }
}

/// One action to dispatch.
struct PlannedAction: Sendable {
    var line: Int?
    var type: String
    var payload: [UInt8]?
}

/// How one dispatched action ended.
enum ActionOutcome: Sendable {
    case settled(Settlement)
    case refused(code: String, message: String)
}

/// A `settled.results` element.
func parseResult(_ v: JSONValue) -> StoreResult {
    let store = v["store"]?.stringValue ?? "?"
    let code = v["error"]?["code"]?.stringValue ?? ""
    let message = v["error"]?["message"]?.stringValue ?? ""
    switch v["status"]?.stringValue {
    case "done": return StoreResult(store: store, status: .done(version: v["version"]?.intValue ?? 0))
    case "rejected": return StoreResult(store: store, status: .rejected(code: code, message: message))
    default: return StoreResult(store: store, status: .unavailable(code: code.isEmpty ? (v["status"]?.stringValue ?? "?") : code, message: message))
    }
}
