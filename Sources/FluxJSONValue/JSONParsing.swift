import FluxCore

/// Where and why a JSON text is not valid (FluxCore's scanner's finding, with the line and column).
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Byte offset of the offending byte (0-based; the length of the text when it ended too early).
    public var offset: Int
    /// 1-based line of that byte.
    public var line: Int
    /// 1-based column (in bytes) of that byte.
    public var column: Int
    /// What is wrong there.
    public var reason: String

    public init(offset: Int, line: Int, column: Int, reason: String) {
        self.offset = offset
        self.line = line
        self.column = column
        self.reason = reason
    }

    public var description: String { "invalid JSON at line \(line) column \(column) (byte \(offset)): \(reason)" }
}

extension JSONValue {
    /// Parses a JSON text (any value at the top level, surrounding whitespace allowed).
    public init(parsing text: String) throws(JSONParseError) {
        try self.init(parsing: Array(text.utf8))
    }

    /// Parses JSON bytes. The grammar is FluxCore's (`Envelope(body:)`): RFC 8259, valid UTF-8, no lone
    /// surrogates, depth at most 64, nothing after the value.
    public init<Bytes: Collection>(parsing bytes: Bytes) throws(JSONParseError) where Bytes.Element == UInt8 {
        try self.init(parsing: bytes, maxDepth: 64)
    }

    /// Parses JSON bytes nested at most `maxDepth` deep (for files that hold deeper values as data, such as
    /// protocol/vectors/patch.json; anything that travels in a frame is bounded by 64).
    public init<Bytes: Collection>(parsing bytes: Bytes, maxDepth: Int) throws(JSONParseError) where Bytes.Element == UInt8 {
        let body = try JSONValue.validated(bytes, maxDepth: maxDepth)
        var reader = ValidJSONReader(bytes: body[...])
        self = reader.value()
    }

    /// The bytes, once FluxCore's scanner accepted them as one JSON value nested at most `maxDepth` deep.
    static func validated<Bytes: Collection>(_ bytes: Bytes, maxDepth: Int) throws(JSONParseError) -> [UInt8]
    where Bytes.Element == UInt8 {
        let body = Array(bytes)
        do {
            _ = try Envelope(body: body, maxDepth: maxDepth)
        } catch {
            switch error {
            case .invalidJSON(let offset, let reason):
                throw JSONParseError(in: body, offset: offset, reason: JSONValue.explain(reason, in: body, at: offset))
            case .notAnObject, .duplicateKey:
                break  // Valid JSON that is not a message: fine here.
            }
        }
        return body
    }

    /// The scanner's reason, with a hint for the mistakes people make typing JSON by hand.
    private static func explain(_ reason: String, in body: [UInt8], at offset: Int) -> String {
        if offset < body.count, body[offset] == UInt8(ascii: "'") { return "strings must use double quotes" }
        if offset >= body.count, !body.isEmpty { return "\(reason) (the text ends too early)" }
        return reason
    }
}

extension JSONParseError {
    init(in body: [UInt8], offset: Int, reason: String) {
        let at = min(max(offset, 0), body.count)
        var line = 1, column = 1
        for b in body[..<at] {
            if b == UInt8(ascii: "\n") { line += 1; column = 1 } else { column += 1 }
        }
        self.init(offset: at, line: line, column: column, reason: reason)
    }
}

/// Builds the tree from bytes FluxCore's scanner has already validated: no checks, no errors.
struct ValidJSONReader {
    let bytes: ArraySlice<UInt8>
    var i: Int
    let end: Int

    init(bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.i = bytes.startIndex
        self.end = bytes.endIndex
    }

    mutating func skipSpace() {
        while i < end, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }

    mutating func value() -> JSONValue {
        skipSpace()
        switch bytes[i] {
        case UInt8(ascii: "{"):
            i += 1
            var members: [(key: String, value: JSONValue)] = []
            skipSpace()
            if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(members) }
            while true {
                skipSpace()
                let key = string()
                skipSpace()
                i += 1  // ':'
                members.append((key, value()))
                skipSpace()
                let separator = bytes[i]
                i += 1
                if separator == UInt8(ascii: "}") { return .object(members) }
            }
        case UInt8(ascii: "["):
            i += 1
            var items: [JSONValue] = []
            skipSpace()
            if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            while true {
                items.append(value())
                skipSpace()
                let separator = bytes[i]
                i += 1
                if separator == UInt8(ascii: "]") { return .array(items) }
            }
        case UInt8(ascii: "\""):
            return .string(string())
        case UInt8(ascii: "t"):
            i += 4
            return .bool(true)
        case UInt8(ascii: "f"):
            i += 5
            return .bool(false)
        case UInt8(ascii: "n"):
            i += 4
            return .null
        default:
            let start = i
            while i < end, isNumberByte(bytes[i]) { i += 1 }
            return .number(String(decoding: bytes[start..<i], as: UTF8.self))
        }
    }

    func isNumberByte(_ c: UInt8) -> Bool {
        (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || c == UInt8(ascii: "-") || c == UInt8(ascii: "+")
            || c == UInt8(ascii: ".") || c == UInt8(ascii: "e") || c == UInt8(ascii: "E")
    }

    /// A string token at `i` (opening quote), decoded with FluxCore's decoder.
    mutating func string() -> String {
        decodeJSONString(stringToken())
    }

    /// The string token at `i` (opening quote), quotes included, as written; `i` moves past it.
    mutating func stringToken() -> ArraySlice<UInt8> {
        let start = i
        i += 1
        while bytes[i] != UInt8(ascii: "\"") {
            i += bytes[i] == UInt8(ascii: "\\") ? 2 : 1
        }
        i += 1
        return bytes[start..<i]
    }
}
