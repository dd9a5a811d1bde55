import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `fluxctl`: see and poke a live FluxBus from a terminal or a script.
@main
struct FluxCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fluxctl",
        abstract: "See and poke a live FluxBus.",
        discussion: """
        Every subcommand takes the options below, before or after its name (fluxctl --socket S stores and \
        fluxctl stores --socket S are the same): --socket (default: $FLUXBUS_SOCKET, else \
        $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else ${TMPDIR:-/tmp}/fluxbus-$UID/fluxd.sock, the same rule as \
        fluxd's), --server-uid UID (refuse a fluxd run by another uid; default $FLUXBUS_SERVER_UID, else 0 when run \
        as root), --json (one JSON object per line; formats in docs/fluxctl.md) and --timeout SECONDS.

        Exit codes:
          0   success
          1   an action was rejected or unavailable, or no store handles it
          2   bad input: JSON argument, JSON pointer or --file line (shown where)
          3   no fluxd at the socket, the connection to it was lost, or it runs as an
              unexpected uid (--server-uid, $FLUXBUS_SERVER_UID; 0 when run as root)
          4   timed out (--timeout; a stream without --count stops then with 0)
          5   fluxd refused a request (e.g. unknown store)
          64  bad usage (unknown option, missing argument)
        """,
        // `fluxctl --version` prints `fluxctl 0.4.0`: FluxCore's version, the one fluxd names itself with.
        version: "fluxctl \(FluxBusVersion.string)",
        // One line per subcommand; keep the list easy to extend.
        subcommands: [
            Dispatch.self,
            State.self,
            Watch.self,
            Query.self,
            Stores.self,
            Stats.self,
            Monitor.self,
            Ping.self,
            Workers.self, Restart.self, Stop.self, Reload.self, Forget.self,
            Journal.self, Replay.self,
            Bench.self, Top.self,
            Completions.self,
        ]
    )

    /// The global options given before the subcommand's name. The parser reads the root command's options
    /// wherever they appear on the command line, and a subcommand's `@OptionGroup var options: GlobalOptions` takes
    /// these same values (an option group of a type its parent command already decoded is shared), so
    /// `fluxctl --socket S stores` and `fluxctl stores --socket S` are the same, and both help screens list them.
    @OptionGroup var options: GlobalOptions

    /// Parses the command line and runs the subcommand, as the parser's own `main` does, except that a usage error
    /// reads `fluxctl: Unknown option '--frobnicate'` (then the usage lines) instead of `Error: ...`, like every
    /// other fluxctl error; its exit code stays the parser's (64).
    static func main() async {
        if let unknown = unknownSubcommand(in: Array(CommandLine.arguments.dropFirst())) {
            printError(usageErrorText(unknown))
            Glibc.exit(ExitCode.validationFailure.rawValue)
        }
        do {
            var command = try await asyncParseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exitReporting(error)
        }
    }

    /// Exits for `error`: help, `--version` and an `ExitCode` (whose message `fail` already printed) as the parser
    /// does; any other error as `fluxctl: MESSAGE` on stderr with the parser's exit code.
    static func exitReporting(_ error: any Error) -> Never {
        let code = exitCode(for: error)
        if code == .success || error is ExitCode { exit(withError: error) }
        printError(usageErrorText(fullMessage(for: error)))
        Glibc.exit(code.rawValue)
    }

    /// The subcommands' names (and `help`).
    static var subcommandNames: [String] {
        configuration.subcommands.map { $0._commandName } + ["help"]
    }

    /// "unknown subcommand 'x'; did you mean 'y'?" when the first word that is not a global option (or its value)
    /// names no subcommand (the parser said only "Unexpected argument"), else nil.
    static func unknownSubcommand(in arguments: [String]) -> String? {
        let takesValue: Set<String> = ["--socket", "--server-uid", "--timeout"]
        var i = 0
        while i < arguments.count {
            let word = arguments[i]
            if word == "--" { return nil }
            if word.hasPrefix("-") {
                i += takesValue.contains(word) ? 2 : 1
                continue
            }
            let names = subcommandNames
            guard !names.contains(word) else { return nil }
            let near = names.map { ($0, editDistance(Array(word.utf8), Array($0.utf8))) }
                .filter { $0.1 <= max(1, min(3, word.count / 3)) }
            let best = near.map(\.1).min()
            let nearest = near.filter { $0.1 == best }.map { "'\($0.0)'" }
            let hint = nearest.isEmpty ? " (subcommands: \(names.dropLast().joined(separator: ", ")))"
                : "; did you mean \(nearest.joined(separator: " or "))?"
            return "unknown subcommand '\(word)'\(hint)\nSee 'fluxctl --help'."
        }
        return nil
    }

    /// The parser's message (`Error: Unknown option '--x'\nUsage: ...`) with fluxctl's prefix for its first line.
    static func usageErrorText(_ message: String) -> String {
        let prefix = Terminal.stderrColors ? "\u{1B}[31mfluxctl:\u{1B}[0m " : "fluxctl: "
        let body = message.hasPrefix("Error: ") ? message.dropFirst("Error: ".count) : Substring(message)
        return prefix + body.trimmingCharacters(in: .newlines)
    }
}

/// fluxctl's exit codes (documented in `fluxctl --help`).
enum Exit {
    static let failed: Int32 = 1
    static let badInput: Int32 = 2
    static let noFluxd: Int32 = 3
    static let timedOut: Int32 = 4
    static let refused: Int32 = 5
}

/// Prints `fluxctl: message` to stderr and returns the exit code to throw.
func fail(_ code: Int32, _ message: String) -> ExitCode {
    printError((Terminal.stderrColors ? "\u{1B}[31mfluxctl:\u{1B}[0m " : "fluxctl: ") + message)
    return ExitCode(code)
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp(
        "fluxd's socket.",
        discussion: "Default: $FLUXBUS_SOCKET, else $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else ${TMPDIR:-/tmp}/fluxbus-$UID/fluxd.sock (the same rule as fluxd's).",
        valueName: "path"))
    var socket: String?

    @Option(name: .long, help: ArgumentHelp(
        "Refuse fluxd unless it runs as this uid.",
        discussion: "Default: $FLUXBUS_SERVER_UID, else 0 when fluxctl runs as root, else any uid.",
        valueName: "uid"))
    var serverUID: UInt32?

    @Flag(name: .long, help: "Machine-readable output: one JSON object per line (see docs/fluxctl.md).")
    var json = false

    @Option(name: .long, help: ArgumentHelp(
        "Give up after this many seconds (exit code 4); a stream stops after this many seconds (exit code 0).",
        discussion: "Default 5 for requests; streams (watch, query, monitor, stats --watch, top) run until interrupted unless given.",
        valueName: "seconds"))
    var timeout: Double?

    func validate() throws {
        if let timeout, !(timeout > 0) { throw ValidationError("--timeout must be a positive number of seconds") }
    }

    var socketPath: String { socket ?? defaultSocketPath() }

    /// Where `socketPath` came from, for error messages.
    var socketSource: String {
        if socket != nil { return "--socket" }
        if let env = ProcessInfo.processInfo.environment["FLUXBUS_SOCKET"], !env.isEmpty { return "$FLUXBUS_SOCKET" }
        return "the default path"
    }

    /// The time limit of one request (connect, get, info, a settlement).
    var requestTimeout: Double { timeout ?? 5 }
    /// `requestTimeout` as a `Duration` (the SDK's per-request deadline).
    var requestDuration: Duration { .milliseconds(Int64((requestTimeout * 1000).rounded(.up))) }

    /// Connects and says hello, turning failure into a clear message and exit code 3 (or 4 on timeout). The
    /// "no fluxd at PATH" text is FluxClient's (`ConnectError`), with fluxctl's own options as the advice.
    func connect(role: Role = .client, reconnect: Bool = false) async throws -> FluxClient {
        let path = socketPath
        let source = socketSource
        do {
            // A request reports a lost fluxd (exit 3) rather than waiting for it to come back; a stream (`watch`,
            // `monitor`) reconnects like the libraries unless told not to (`--no-reconnect`).
            return try await FluxClient.connect(socketPath: path, name: "fluxctl", role: role, expectedServerUID: serverUID,
                                                requestTimeout: requestDuration, reconnect: reconnect ? .default : .disabled)
        } catch {
            switch error {
            case .untrustedServer(let path, let uid, let expected):
                throw fail(Exit.noFluxd, """
                    refusing fluxd at \(path) (from \(source)): it is run by uid \(uid), expected \(expected)
                      to accept it: --server-uid \(uid) or \(serverUIDEnvironmentVariable)=\(uid)
                    """)
            case .invalidArgument(let what):
                throw fail(ExitCode.validationFailure.rawValue, what)
            case .cannotConnect(var problem):
                problem.source = source
                problem.pointAtAnother = "or point fluxctl at a running one with --socket PATH or FLUXBUS_SOCKET=PATH"
                throw fail(Exit.noFluxd, problem.description)
            case .timedOut:
                throw fail(Exit.timedOut, "timed out after \(formatSeconds(requestTimeout)) s connecting to fluxd at \(path)")
            default:
                throw fail(Exit.noFluxd, "no fluxd at \(path) (from \(source)): \(error)")
            }
        }
    }
}

/// Runs `body`; after `seconds` prints `timed out after S s: what` and throws exit code 4. Nil = no limit.
func withTimeout<T: Sendable>(_ seconds: Double?, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    guard let seconds else { return try await body() }
    return try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw fail(Exit.timedOut, "timed out after \(formatSeconds(seconds)) s \(what)")
        }
        return value
    }
}

/// Runs a stream (`watch`, `query`, `monitor`, `stats --watch`, `top`) for at most `seconds`: when they run out
/// the stream just ends (exit 0: watching for a while is what was asked). A stream told to end after `--count`
/// items (`counted`) that has not seen them by then timed out like a request (`withTimeout`, exit 4, `what`).
func streamFor(_ seconds: Double?, counted: Bool = false, _ what: String = "",
               _ body: @escaping @Sendable () async throws -> Void) async throws {
    guard let seconds else { return try await body() }
    if counted { return try await withTimeout(seconds, what, body) }
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await body() }
        group.addTask { try await Task.sleep(for: .seconds(seconds)) }
        defer { group.cancelAll() }
        try await group.next()
    }
}

func formatSeconds(_ s: Double) -> String {
    s == s.rounded() ? String(Int(s)) : String(s)
}

/// Turns an error from FluxClient into a message and an exit code.
func failure(_ error: any Error, socket: String) -> ExitCode {
    if let exit = error as? ExitCode { return exit }
    guard let flux = error as? FluxError else { return fail(Exit.failed, "\(error)") }
    switch flux {
    case .server(let e):
        switch e.code {
        case .noHandler: return fail(Exit.failed, "no store handles this action (fluxd: no-handler: \(e.message))")
        case .unknownStore: return fail(Exit.refused, "unknown store (fluxd: unknown-store: \(e.message))")
        default: return fail(Exit.refused, "fluxd refused it: \(e.rawCode): \(e.message)")
        }
    case .disconnected(let why): return fail(Exit.noFluxd, "lost the connection to fluxd at \(socket): \(why)")
    case .cannotConnect(let problem): return fail(Exit.noFluxd, problem.description)
    case .io: return fail(Exit.noFluxd, "lost the connection to fluxd at \(socket): \(flux)")
    case .timedOut(let what): return fail(Exit.timedOut, "timed out: \(what)")
    case .invalidArgument(let what): return fail(Exit.badInput, what)
    default: return fail(Exit.failed, "\(flux)")
    }
}

/// Parses a JSON argument, pointing at the byte where it goes wrong (exit code 2).
func parseJSONArgument(_ text: String, what: String) throws -> JSONValue {
    do {
        return try JSONValue(parsing: text)
    } catch {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        let lineText = error.line <= lines.count ? String(lines[error.line - 1]) : ""
        let caret = String(repeating: " ", count: max(0, min(error.column - 1, lineText.utf8.count))) + "^"
        let position = lines.count > 1 ? "line \(error.line) column \(error.column)" : "column \(error.column)"
        throw fail(Exit.badInput, "\(what) is not valid JSON at \(position) (byte \(error.offset)): \(error.reason)\n  \(lineText)\n  \(caret)")
    }
}

/// Validates a store name argument (exit code 2).
func checkStoreName(_ name: String) throws {
    guard Names.isValidStore(name) else {
        throw fail(Exit.badInput, "\"\(name)\" is not a store name (1-128 bytes of A-Z a-z 0-9 . _ : / -)")
    }
}

/// The message for an unknown store, listing the known ones.
func unknownStoreMessage(_ store: String, client: FluxClient, timeout: Duration) async -> String {
    let known = (try? await client.info(timeout: timeout))?.stores.map(\.name) ?? []
    return "unknown store \"\(store)\": fluxd has no snapshot of it"
        + (known.isEmpty ? " (no stores are registered)" : " (known stores: \(known.joined(separator: ", ")))")
}

extension Envelope {
    func str(_ key: String) -> String? { string(key).value }
    func integer(_ key: String) -> Int? { int(key).value.map { Int($0) } }
    /// A top-level field parsed as a JSON value.
    func json(_ key: String) -> JSONValue? { raw(key).flatMap { try? JSONValue(parsing: $0) } }
}

/// What a reconnecting stream (`watch`, `monitor`) says when fluxd goes and comes back: one line each, to stdout
/// among the stream's lines (to stderr with `--json`, like store news), and `nil` for events it does not report.
func connectivityLine(_ event: ConnectivityEvent) -> String? {
    switch event {
    case .disconnected(let reason):
        let why: String
        if case .disconnected(let text) = reason { why = text } else { why = "the connection to fluxd was lost (\(reason))" }
        return "\(why); waiting for fluxd to come back"
    case .reconnected(let epochChanged):
        return epochChanged
            ? "fluxd is back with another history (an ephemeral fluxd, or another data directory): versions and seqs start over"
            : "fluxd is back (the same history: versions and seqs continue)"
    case .gaveUp(let error):
        return "gave up waiting for fluxd (\(error))"
    case .reconnecting:
        return nil
    }
}

/// Prints `connectivityLine`s for `client` until it ends (a task the caller cancels), and calls `back` after each
/// reconnection and `lost` after each loss.
func reportConnectivity(_ client: FluxClient, json: Bool, lost: @escaping @Sendable (String) -> Void = { _ in },
                        back: @escaping @Sendable (Bool) -> Void = { _ in }) -> Task<Void, Never> {
    let events = client.connectivityEvents()
    return Task {
        for await event in events {
            if let line = connectivityLine(event) {
                if json { printError("fluxctl: " + line) } else { emit(Style.dim(line)) }
            }
            if case .disconnected(let reason) = event { lost("\(reason)") }
            if case .reconnected(let changed) = event { back(changed) }
        }
    }
}
