import FluxClient
import FluxJSONValue
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// How fluxctl writes to the terminal: colours only when stdout is a terminal (and `NO_COLOR` is unset), or when
/// `CLICOLOR_FORCE=1` asks for them anyway.
enum Terminal {
    static let colors: Bool = {
        let env = ProcessInfo.processInfo.environment
        if let force = env["CLICOLOR_FORCE"], force != "0", !force.isEmpty { return true }
        if env["NO_COLOR"].map({ !$0.isEmpty }) == true { return false }
        if env["TERM"] == "dumb" { return false }
        return isatty(STDOUT_FILENO) == 1
    }()
    static let stderrColors: Bool = {
        let env = ProcessInfo.processInfo.environment
        if let force = env["CLICOLOR_FORCE"], force != "0", !force.isEmpty { return true }
        if env["NO_COLOR"].map({ !$0.isEmpty }) == true { return false }
        return isatty(STDERR_FILENO) == 1 && env["TERM"] != "dumb"
    }()
    /// Whether stdout is a terminal (screen clearing for `stats --watch`).
    static let isTTY = isatty(STDOUT_FILENO) == 1

    static var jsonColors: JSONColors {
        colors ? JSONColors(key: "\u{1B}[34m", string: "\u{1B}[32m", number: "\u{1B}[36m", literal: "\u{1B}[35m", reset: "\u{1B}[0m") : .none
    }
}

/// SGR styles; each returns the text unchanged when colours are off.
enum Style {
    static func bold(_ s: String) -> String { wrap(s, "1") }
    static func dim(_ s: String) -> String { wrap(s, "2") }
    static func red(_ s: String) -> String { wrap(s, "31") }
    static func green(_ s: String) -> String { wrap(s, "32") }
    static func yellow(_ s: String) -> String { wrap(s, "33") }
    static func blue(_ s: String) -> String { wrap(s, "34") }
    static func magenta(_ s: String) -> String { wrap(s, "35") }
    static func cyan(_ s: String) -> String { wrap(s, "36") }
    private static func wrap(_ s: String, _ code: String) -> String {
        Terminal.colors && !s.isEmpty ? "\u{1B}[\(code)m\(s)\u{1B}[0m" : s
    }
}

/// Prints a line to stdout at once (streams are read line by line by scripts).
func emit(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Aligned columns: every column as wide as its widest cell, two spaces apart, the last one not padded. Cells are
/// measured without their colour codes. The header is bold on a terminal.
func table(_ header: [String], _ rows: [[String]]) -> [String] {
    func visible(_ s: String) -> Int {
        var n = 0
        var inEscape = false
        for c in s.unicodeScalars {
            if inEscape { if c == "m" { inEscape = false }; continue }
            if c == "\u{1B}" { inEscape = true; continue }
            n += 1
        }
        return n
    }
    let all = [header] + rows
    let widths = header.indices.map { i in all.map { visible($0[i]) }.max() ?? 0 }
    return all.enumerated().map { r, row in
        row.enumerated().map { i, cell in
            let text = r == 0 ? Style.bold(cell) : cell
            return i == row.count - 1 ? text : text + String(repeating: " ", count: widths[i] - visible(cell))
        }.joined(separator: "  ")
    }
}

/// A JSON object built field by field, in order (fluxctl's `--json` lines).
struct JSONLine {
    private var members: [(key: String, value: JSONValue)] = []

    init() {}

    mutating func add(_ key: String, _ value: JSONValue?) {
        if let value { members.append((key, value)) }
    }
    mutating func add(_ key: String, _ value: String?) { add(key, value.map(JSONValue.string)) }
    mutating func add(_ key: String, _ value: Int?) { add(key, value.map { JSONValue.number(String($0)) }) }
    mutating func add(_ key: String, _ value: Bool) { add(key, JSONValue.bool(value)) }

    var value: JSONValue { .object(members) }
    var text: String { value.compact }
}

extension Settlement {
    /// Whether every target store answered `done`.
    var ok: Bool { results.allSatisfy { if case .done = $0.status { return true } else { return false } } }
}

/// One result as a `--json` object: `{"store","status","version"}` or `{"store","status","code","message"}`.
func resultJSON(_ r: StoreResult) -> JSONValue {
    var line = JSONLine()
    line.add("store", r.store)
    switch r.status {
    case .done(let version):
        line.add("status", "done")
        line.add("version", version)
    case .rejected(let code, let message):
        line.add("status", "rejected")
        line.add("code", code)
        line.add("message", message)
    case .unavailable(let code, let message):
        line.add("status", "unavailable")
        line.add("code", code)
        line.add("message", message)
    }
    return line.value
}

/// One result as a table row: store, status (coloured), detail.
func resultRow(_ r: StoreResult) -> [String] {
    switch r.status {
    case .done(let version): return [r.store, Style.green("done"), "version \(version)"]
    case .rejected(let code, let message): return [r.store, Style.red("rejected"), "\(code): \(message)"]
    case .unavailable(let code, let message): return [r.store, Style.yellow("unavailable"), "\(code): \(message)"]
    }
}
