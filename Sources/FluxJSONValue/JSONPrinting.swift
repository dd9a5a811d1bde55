// Printing: compact one-line JSON (fluxctl's `--json` lines) and indented JSON with optional colours.

/// Colours for pretty JSON (empty strings when colours are off).
public struct JSONColors: Sendable {
    /// Escape sequences put before object keys, strings, numbers and literals (`true`, `false`, `null`), and after
    /// each of them.
    public var key, string, number, literal, reset: String

    public init(key: String = "", string: String = "", number: String = "", literal: String = "", reset: String = "") {
        self.key = key
        self.string = string
        self.number = number
        self.literal = literal
        self.reset = reset
    }

    /// No colours.
    public static let none = JSONColors()
}

extension JSONValue {
    /// One line, no spaces, members in their order.
    public var compact: String {
        var out = ""
        write(to: &out, indent: nil, level: 0, colors: .none)
        return out
    }

    /// `compact` as UTF-8 bytes (to splice into a frame).
    public var compactBytes: [UInt8] { Array(compact.utf8) }

    /// Indented by two spaces per level.
    public func pretty(colors: JSONColors = .none) -> String {
        var out = ""
        write(to: &out, indent: "  ", level: 0, colors: colors)
        return out
    }

    private func write(to out: inout String, indent: String?, level: Int, colors: JSONColors) {
        func newline(_ level: Int) {
            guard let indent else { return }
            out += "\n" + String(repeating: indent, count: level)
        }
        switch self {
        case .null: out += colors.literal + "null" + colors.reset
        case .bool(let b): out += colors.literal + (b ? "true" : "false") + colors.reset
        case .number(let n): out += colors.number + n + colors.reset
        case .string(let s): out += colors.string + JSONValue.quote(s) + colors.reset
        case .array(let items):
            if items.isEmpty { out += "[]"; return }
            out += "["
            for (n, item) in items.enumerated() {
                if n > 0 { out += "," }
                newline(level + 1)
                item.write(to: &out, indent: indent, level: level + 1, colors: colors)
            }
            newline(level)
            out += "]"
        case .object(let members):
            if members.isEmpty { out += "{}"; return }
            out += "{"
            for (n, member) in members.enumerated() {
                if n > 0 { out += "," }
                newline(level + 1)
                out += colors.key + JSONValue.quote(member.key) + colors.reset + (indent == nil ? ":" : ": ")
                member.value.write(to: &out, indent: indent, level: level + 1, colors: colors)
            }
            newline(level)
            out += "}"
        }
    }

    /// A JSON string literal for `s` (escapes `"`, `\` and control characters only).
    public static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}

