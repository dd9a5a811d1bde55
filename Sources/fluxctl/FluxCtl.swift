import ArgumentParser
import FluxClient
import FluxCore
import Foundation

/// `fluxctl`: see and poke a live FluxBus from a terminal or a script.
@main
struct FluxCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fluxctl",
        abstract: "See and poke a live FluxBus.",
        discussion: """
        Exit codes: 0 success; 1 an action was rejected, unavailable, or no store handles it; \
        2 bad arguments; 3 no fluxd at the socket; 4 timed out; 5 fluxd answered with an error.
        """,
        subcommands: [Dispatch.self, State.self, Watch.self, Stores.self, Ping.self]
    )
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: "fluxd's socket (default: $FLUXBUS_SOCKET, else $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else /tmp/fluxbus-$UID/fluxd.sock).")
    var socket: String?

    @Flag(name: .long, help: "Machine-readable output: one JSON object per line.")
    var json = false

    @Option(name: .long, help: "Give up after this many seconds.")
    var timeout: Double = 5

    var socketPath: String { socket ?? defaultSocketPath() }

    /// Connects, turning failure into a clear message and exit code 3.
    func connect() async throws -> FluxClient {
        do {
            return try await withTimeout(self) {
                try await FluxClient.connect(socketPath: socketPath, name: "fluxctl")
            }
        } catch let error as ExitCode {
            throw error
        } catch {
            printError("fluxctl: cannot reach fluxd at \(socketPath): \(error)\n  start one with: fluxd --socket \(socketPath)")
            throw ExitCode(3)
        }
    }
}

/// Runs `body` or fails with exit code 4 after the timeout.
func withTimeout<T: Sendable>(_ options: GlobalOptions, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let seconds = options.timeout
    return try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            printError("fluxctl: timed out after \(seconds) s")
            throw ExitCode(4)
        }
        return value
    }
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Prints a line to stdout and flushes (streams are read line by line by scripts).
func emit(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// Any JSON value, for printing states and payloads whose type fluxctl does not know.
enum AnyJSON: Codable, Sendable, Equatable {
    case null, bool(Bool), number(Double), string(String), array([AnyJSON]), object([String: AnyJSON])

    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let n = try? c.decode(Double.self) { self = .number(n) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([AnyJSON].self) { self = .array(a) }
        else { self = .object(try c.decode([String: AnyJSON].self)) }
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .number(let n):
            if n == n.rounded(), abs(n) < 9_007_199_254_740_992 { try c.encode(Int64(n)) } else { try c.encode(n) }
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    /// Compact (one line) or pretty JSON text, keys sorted.
    func text(pretty: Bool) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes] : [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data("null".utf8), as: UTF8.self)
    }
}

/// Parses a JSON argument, pointing at the byte where it goes wrong.
func parseJSONArgument(_ text: String, what: String) throws -> [UInt8] {
    let bytes = Array(text.utf8)
    do {
        _ = try Envelope(body: Array("{\"v\":".utf8) + bytes + Array("}".utf8))
        return bytes
    } catch {
        if case .invalidJSON(let offset, let reason) = error {
            let at = max(0, offset - 5)
            printError("fluxctl: \(what) is not valid JSON at byte \(at): \(reason)\n  \(text)\n  \(String(repeating: " ", count: min(at, text.count)))^")
        } else {
            printError("fluxctl: \(what) is not valid JSON: \(error.message)")
        }
        throw ExitCode(2)
    }
}
