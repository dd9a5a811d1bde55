/// A JSON Pointer: `""` is the whole document, `/a/0/b~1c` the member `b/c` of element 0 of member `a`.
public struct JSONPointer: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// The reference tokens, unescaped (`["a", "b/c"]` for `/a/b~1c`).
    public var tokens: [String]

    /// A pointer made of these (unescaped) tokens.
    public init(tokens: [String]) { self.tokens = tokens }

    /// Token by token, by their bytes (SPEC §3.2: no Unicode equivalence; Swift's `String ==` would make "\u{e9}"
    /// and "e\u{301}" one token).
    public static func == (a: JSONPointer, b: JSONPointer) -> Bool {
        a.tokens.count == b.tokens.count && zip(a.tokens, b.tokens).allSatisfy { sameKey($0, $1) }
    }

    /// Hashes the tokens' bytes (consistent with `==`).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(tokens.count)
        for token in tokens {
            var token = token
            token.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
            hasher.combine(0xFF as UInt8)  // (never a UTF-8 byte: separates tokens)
        }
    }

    /// The pointer to the whole document (`""`).
    public static let root = JSONPointer(tokens: [])

    /// Parses a pointer; the error says what is wrong.
    public init(parsing text: String) throws(PointerError) {
        if text.isEmpty { tokens = []; return }
        guard text.hasPrefix("/") else { throw PointerError(message: "a JSON pointer is empty or starts with '/' (got \"\(text)\")") }
        // Byte by byte: '/', '~', '0' and '1' are ASCII, so splitting the UTF-8 bytes is splitting the text (and
        // much cheaper than walking it by Character).
        var result: [String] = []
        let utf8 = text.utf8
        var start = utf8.index(after: utf8.startIndex)
        while true {
            let stop = utf8[start...].firstIndex(of: UInt8(ascii: "/")) ?? utf8.endIndex
            let raw = utf8[start..<stop]
            if !raw.contains(UInt8(ascii: "~")) {
                result.append(String(Substring(raw)))
            } else {
                var token: [UInt8] = []
                var bytes = raw.makeIterator()
                while let c = bytes.next() {
                    guard c == UInt8(ascii: "~") else { token.append(c); continue }
                    switch bytes.next() {
                    case UInt8(ascii: "0"): token.append(UInt8(ascii: "~"))
                    case UInt8(ascii: "1"): token.append(UInt8(ascii: "/"))
                    default: throw PointerError(message: "'~' must be followed by 0 or 1 in a JSON pointer (\"\(text)\")")
                    }
                }
                result.append(String(decoding: token, as: UTF8.self))
            }
            if stop == utf8.endIndex { break }
            start = utf8.index(after: stop)
        }
        tokens = result
    }

    /// The pointer as text, `~` and `/` escaped as `~0` and `~1`.
    public var description: String {
        tokens.map { token in
            var escaped = "/"
            for c in token {
                switch c {
                case "~": escaped += "~0"
                case "/": escaped += "~1"
                default: escaped.append(c)
                }
            }
            return escaped
        }.joined()
    }

    /// This pointer with one more token.
    public func appending(_ token: String) -> JSONPointer { JSONPointer(tokens: tokens + [token]) }

    /// The value at this pointer, or an error naming the deepest part that exists.
    public func resolve(in root: JSONValue) throws(PointerError) -> JSONValue {
        var current = root
        var walked = JSONPointer(tokens: [])
        for token in tokens {
            let here = walked.tokens.isEmpty ? "the state" : "\(walked)"
            switch current {
            case .object(let members):
                guard let member = members.last(where: { sameKey($0.key, token) }) else {
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
public struct PointerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong, for a person.
    public var message: String

    public init(message: String) { self.message = message }

    public var description: String { message }
}

