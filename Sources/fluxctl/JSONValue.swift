// JSON as fluxctl sees it: any value, keys kept in the order the sender wrote them and numbers kept as their exact
// text (a state printed by fluxctl shows the bytes the store sent, reformatted, never rounded). Includes the parser
// that says where bad JSON goes wrong, compact/pretty printers, RFC 6901 pointers and a path-level diff.

/// Any JSON value. Object members keep their order; numbers keep their text.
enum JSONValue: Equatable, Sendable {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([(key: String, value: JSONValue)])

    static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return x == y
        case (.string(let x), .string(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.key == $1.key && $0.value == $1.value }
        default: return false
        }
    }

    /// The member `key` of an object.
    subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members.last { $0.key == key }?.value }
        return nil
    }

    var stringValue: String? { if case .string(let s) = self { return s } else { return nil } }
    var intValue: Int? { if case .number(let n) = self { return Int(n) } else { return nil } }
    var boolValue: Bool? { if case .bool(let b) = self { return b } else { return nil } }
}

// MARK: Parsing

/// Where and why a JSON text is not valid.
struct JSONParseError: Error, Sendable {
    /// Byte offset of the offending byte (0-based).
    var offset: Int
    /// 1-based line and column (in bytes) of that byte.
    var line: Int
    var column: Int
    var reason: String
}

/// A strict RFC 8259 parser (the rules of SPEC §3.2: depth ≤ 64, no lone surrogates, no trailing bytes).
struct JSONParser {
    private let bytes: [UInt8]
    private var i = 0
    private var depth = 0

    static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(Array(text.utf8))
    }

    static func parse<Bytes: Collection>(_ bytes: Bytes) throws(JSONParseError) -> JSONValue where Bytes.Element == UInt8 {
        var p = JSONParser(bytes: Array(bytes))
        p.skipSpace()
        let value = try p.value()
        p.skipSpace()
        if p.i < p.bytes.count { throw p.error("unexpected text after the JSON value") }
        return value
    }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    private func error(_ reason: String, at offset: Int? = nil) -> JSONParseError {
        let at = min(offset ?? i, bytes.count)
        var line = 1, column = 1
        for b in bytes[..<at] {
            if b == UInt8(ascii: "\n") { line += 1; column = 1 } else { column += 1 }
        }
        return JSONParseError(offset: at, line: line, column: column, reason: reason)
    }

    private mutating func skipSpace() {
        while i < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i]) { i += 1 }
    }

    private mutating func value() throws(JSONParseError) -> JSONValue {
        guard i < bytes.count else { throw error("unexpected end of input, expected a value") }
        switch bytes[i] {
        case UInt8(ascii: "{"): return try object()
        case UInt8(ascii: "["): return try array()
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
        case UInt8(ascii: "'"): throw error("strings must use double quotes")
        default: throw error("expected a value (object, array, string, number, true, false or null)")
        }
    }

    private mutating func literal(_ word: String) throws(JSONParseError) {
        let w = Array(word.utf8)
        guard bytes.count - i >= w.count, Array(bytes[i..<i + w.count]) == w else { throw error("expected \(word)") }
        i += w.count
    }

    private mutating func enter() throws(JSONParseError) {
        depth += 1
        if depth > 64 { throw error("nested deeper than 64 levels") }
    }

    private mutating func object() throws(JSONParseError) -> JSONValue {
        try enter()
        i += 1
        var members: [(key: String, value: JSONValue)] = []
        skipSpace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
            i += 1
            depth -= 1
            return .object(members)
        }
        while true {
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else {
                throw error(i < bytes.count ? "expected a member name in double quotes" : "unexpected end of input in an object")
            }
            let key = try string()
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw error("expected ':' after the member name") }
            i += 1
            skipSpace()
            members.append((key, try value()))
            skipSpace()
            guard i < bytes.count else { throw error("unexpected end of input in an object, expected ',' or '}'") }
            if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
            if bytes[i] == UInt8(ascii: "}") { i += 1; break }
            throw error("expected ',' or '}' in an object")
        }
        depth -= 1
        return .object(members)
    }

    private mutating func array() throws(JSONParseError) -> JSONValue {
        try enter()
        i += 1
        var items: [JSONValue] = []
        skipSpace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
            i += 1
            depth -= 1
            return .array(items)
        }
        while true {
            skipSpace()
            items.append(try value())
            skipSpace()
            guard i < bytes.count else { throw error("unexpected end of input in an array, expected ',' or ']'") }
            if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
            if bytes[i] == UInt8(ascii: "]") { i += 1; break }
            throw error("expected ',' or ']' in an array")
        }
        depth -= 1
        return .array(items)
    }

    private mutating func number() throws(JSONParseError) -> String {
        let start = i
        func digits(_ p: inout JSONParser) -> Int {
            let s = p.i
            while p.i < p.bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(p.bytes[p.i]) { p.i += 1 }
            return p.i - s
        }
        if bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard i < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[i]) else { throw error("expected a digit") }
        if bytes[i] == UInt8(ascii: "0") {
            i += 1
            if i < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[i]) { throw error("numbers must not have leading zeros") }
        } else {
            _ = digits(&self)
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            i += 1
            if digits(&self) == 0 { throw error("expected a digit after '.'") }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            if digits(&self) == 0 { throw error("expected a digit in the exponent") }
        }
        return String(decoding: bytes[start..<i], as: UTF8.self)
    }

    private mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard bytes.count - i >= 4 else { throw error("\\u needs 4 hex digits") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[i]
            let d: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw error("\\u needs 4 hex digits")
            }
            v = v * 16 + d
            i += 1
        }
        return v
    }

    private mutating func string() throws(JSONParseError) -> String {
        i += 1 // opening quote
        var out: [UInt8] = []
        while true {
            guard i < bytes.count else { throw error("unterminated string") }
            let c = bytes[i]
            switch c {
            case UInt8(ascii: "\""):
                i += 1
                return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                i += 1
                guard i < bytes.count else { throw error("unterminated string") }
                let e = bytes[i]
                i += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    let escapeStart = i - 2
                    var scalar = try hex4()
                    if (0xDC00...0xDFFF).contains(scalar) { throw error("unpaired surrogate escape", at: escapeStart) }
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard bytes.count - i >= 6, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else {
                            throw error("unpaired surrogate escape", at: escapeStart)
                        }
                        i += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw error("unpaired surrogate escape", at: escapeStart) }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    out.append(contentsOf: Array(String(Character(Unicode.Scalar(scalar)!)).utf8))
                default:
                    throw error("invalid escape '\\\(Character(Unicode.Scalar(e)))'", at: i - 2)
                }
            case 0x00..<0x20:
                throw error("control character in a string (escape it)")
            default:
                // Validate UTF-8 sequence by sequence.
                let n: Int
                switch c {
                case 0x00..<0x80: n = 1
                case 0xC2...0xDF: n = 2
                case 0xE0...0xEF: n = 3
                case 0xF0...0xF4: n = 4
                default: throw error("invalid UTF-8")
                }
                guard bytes.count - i >= n else { throw error("invalid UTF-8") }
                let seq = Array(bytes[i..<i + n])
                if n > 1 {
                    guard String(validating: seq, as: UTF8.self) != nil else { throw error("invalid UTF-8") }
                }
                out.append(contentsOf: seq)
                i += n
            }
        }
    }
}

// MARK: Printing

/// Colours for pretty JSON (empty strings when colours are off).
struct JSONColors {
    var key = "", string = "", number = "", literal = "", reset = ""
    static let none = JSONColors()
}

extension JSONValue {
    /// One line, no spaces, members in their order.
    var compact: String {
        var out = ""
        write(to: &out, indent: nil, level: 0, colors: .none)
        return out
    }

    /// Indented by two spaces per level.
    func pretty(colors: JSONColors = .none) -> String {
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
    static func quote(_ s: String) -> String {
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

// MARK: JSON Pointer (RFC 6901)

/// A JSON Pointer: `""` is the whole document, `/a/0/b~1c` the member `b/c` of element 0 of member `a`.
struct JSONPointer: Sendable, CustomStringConvertible {
    var tokens: [String]

    init(tokens: [String]) { self.tokens = tokens }

    /// Parses a pointer; the error says what is wrong.
    init(parsing text: String) throws(PointerError) {
        if text.isEmpty { tokens = []; return }
        guard text.hasPrefix("/") else { throw PointerError(message: "a JSON pointer is empty or starts with '/' (got \"\(text)\")") }
        var result: [String] = []
        for raw in text.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            var token = ""
            var chars = raw.makeIterator()
            while let c = chars.next() {
                guard c == "~" else { token.append(c); continue }
                switch chars.next() {
                case "0": token.append("~")
                case "1": token.append("/")
                default: throw PointerError(message: "'~' must be followed by 0 or 1 in a JSON pointer (\"\(text)\")")
                }
            }
            result.append(token)
        }
        tokens = result
    }

    var description: String {
        tokens.map { "/" + $0.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1") }.joined()
    }

    func appending(_ token: String) -> JSONPointer { JSONPointer(tokens: tokens + [token]) }

    /// The value at this pointer, or an error naming the deepest part that exists.
    func resolve(in root: JSONValue) throws(PointerError) -> JSONValue {
        var current = root
        var walked = JSONPointer(tokens: [])
        for token in tokens {
            let here = walked.tokens.isEmpty ? "the state" : "\(walked)"
            switch current {
            case .object(let members):
                guard let member = members.last(where: { $0.key == token }) else {
                    let keys = members.map(\.key)
                    throw PointerError(message: "\(walked.appending(token)) does not exist: \(here) has no member \"\(token)\""
                        + (keys.isEmpty ? " (it is empty)" : " (members: \(keys.joined(separator: ", ")))"))
                }
                current = member.value
            case .array(let items):
                guard let index = Int(token), token == String(index), index >= 0 else {
                    throw PointerError(message: "\(walked.appending(token)) does not exist: \(here) is an array, \"\(token)\" is not an index")
                }
                guard index < items.count else {
                    throw PointerError(message: "\(walked.appending(token)) does not exist: \(here) has \(items.count) element\(items.count == 1 ? "" : "s")")
                }
                current = items[index]
            default:
                throw PointerError(message: "\(walked.appending(token)) does not exist: \(here) is not an object or array")
            }
            walked = walked.appending(token)
        }
        return current
    }
}

/// A bad or unresolvable JSON pointer.
struct PointerError: Error, Sendable { var message: String }

// MARK: Diff

/// One path-level change between two JSON values.
struct JSONChange: Sendable {
    enum Kind: String, Sendable { case add, remove, replace }
    var kind: Kind
    var path: JSONPointer
    var old: JSONValue?
    var new: JSONValue?
}

/// The changes that turn `old` into `new`: objects member by member; arrays by their common prefix and suffix, so
/// one inserted or removed element is one `add` or `remove`; anything else is a `replace` at the deepest path.
func diff(_ old: JSONValue, _ new: JSONValue, at path: JSONPointer = JSONPointer(tokens: [])) -> [JSONChange] {
    if old == new { return [] }
    switch (old, new) {
    case (.object(let a), .object(let b)):
        var changes: [JSONChange] = []
        for member in a {
            if let other = b.last(where: { $0.key == member.key }) {
                changes += diff(member.value, other.value, at: path.appending(member.key))
            } else {
                changes.append(JSONChange(kind: .remove, path: path.appending(member.key), old: member.value))
            }
        }
        for member in b where !a.contains(where: { $0.key == member.key }) {
            changes.append(JSONChange(kind: .add, path: path.appending(member.key), new: member.value))
        }
        return changes
    case (.array(let a), .array(let b)):
        var prefix = 0
        while prefix < min(a.count, b.count), a[prefix] == b[prefix] { prefix += 1 }
        var suffix = 0
        while suffix < min(a.count, b.count) - prefix, a[a.count - 1 - suffix] == b[b.count - 1 - suffix] { suffix += 1 }
        let oldMiddle = Array(a[prefix..<(a.count - suffix)])
        let newMiddle = Array(b[prefix..<(b.count - suffix)])
        var changes: [JSONChange] = []
        let common = min(oldMiddle.count, newMiddle.count)
        for k in 0..<common {
            changes += diff(oldMiddle[k], newMiddle[k], at: path.appending(String(prefix + k)))
        }
        // Removals from the highest index down, so applying them in order keeps the indices right.
        for k in stride(from: oldMiddle.count - 1, through: common, by: -1) {
            changes.append(JSONChange(kind: .remove, path: path.appending(String(prefix + k)), old: oldMiddle[k]))
        }
        for k in common..<max(common, newMiddle.count) {
            changes.append(JSONChange(kind: .add, path: path.appending(String(prefix + k)), new: newMiddle[k]))
        }
        return changes
    default:
        return [JSONChange(kind: .replace, path: path, old: old, new: new)]
    }
}
