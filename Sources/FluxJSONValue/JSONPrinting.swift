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

    /// `compact` as UTF-8 bytes (to splice into a frame), written as bytes (no `String` in between).
    public var compactBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        appendCompact(to: &out)
        return out
    }

    /// Appends `compact`'s UTF-8 bytes to `out`.
    public func appendCompact(to out: inout [UInt8]) {
        switch self {
        case .null: JSONValue.append("null", to: &out)
        case .bool(let b): JSONValue.append(b ? "true" : "false", to: &out)
        case .number(let n): out.append(contentsOf: n.utf8)
        case .string(let s): JSONValue.appendQuoted(s, to: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (n, item) in items.enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                item.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (n, member) in members.enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.appendQuoted(member.key, to: &out)
                out.append(UInt8(ascii: ":"))
                member.value.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    @inline(__always)
    static func append(_ literal: StaticString, to out: inout [UInt8]) {
        out.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    /// Appends `quote(s)` as UTF-8 bytes.
    public static func appendQuoted(_ s: String, to out: inout [UInt8]) {
        var s = s
        s.withUTF8 { appendQuoted(bytes: $0, to: &out) }
    }

    /// Appends UTF-8 `bytes` as a JSON string literal, escaped as `quote` does: runs of bytes that need no escape are
    /// copied as they are.
    static func appendQuoted(bytes: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var start = 0
        // Eight bytes at a time while none of them needs an escape (a control byte, '"' or '\\'): the common case
        // of a long plain string.
        var i = 0
        if let base = bytes.baseAddress {
            let ones: UInt64 = 0x0101_0101_0101_0101, highs: UInt64 = 0x8080_8080_8080_8080
            while i + 8 <= bytes.count {
                let w = UInt64(littleEndian: UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self))
                let control = (w &- ones &* 0x20) & ~w & highs
                let q = w ^ (ones &* 0x22), b = w ^ (ones &* 0x5C)
                let quote = (q &- ones) & ~q & highs, backslash = (b &- ones) & ~b & highs
                if control | quote | backslash != 0 { break }
                i += 8
            }
        }
        for i in i..<bytes.count {
            let c = bytes[i]
            if c >= 0x20 && c != UInt8(ascii: "\"") && c != UInt8(ascii: "\\") { continue }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<i]))
            switch c {
            case UInt8(ascii: "\""): append("\\\"", to: &out)
            case UInt8(ascii: "\\"): append("\\\\", to: &out)
            case UInt8(ascii: "\n"): append("\\n", to: &out)
            case UInt8(ascii: "\r"): append("\\r", to: &out)
            case UInt8(ascii: "\t"): append("\\t", to: &out)
            case 0x08: append("\\b", to: &out)
            case 0x0C: append("\\f", to: &out)
            default:
                let hex: StaticString = "0123456789abcdef"
                append("\\u00", to: &out)
                out.append(hex.utf8Start[Int(c >> 4)])
                out.append(hex.utf8Start[Int(c & 0xF)])
            }
            start = i + 1
        }
        out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start...]))
        out.append(UInt8(ascii: "\""))
    }

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

