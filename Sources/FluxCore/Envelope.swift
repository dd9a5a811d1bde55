#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a frame body could not be read as a message envelope.
public enum EnvelopeError: Error, Equatable, Sendable {
    /// Not valid JSON: the byte offset and what was wrong there. Maps to `bad-json`.
    case invalidJSON(offset: Int, reason: String)
    /// Valid JSON, but the top-level value is not an object. Maps to `bad-message`.
    case notAnObject
    /// The top-level object has the same key twice. Maps to `bad-message`.
    case duplicateKey(String)

    /// The protocol error code this maps to.
    public var code: ErrorCode {
        switch self {
        case .invalidJSON: return .badJSON
        case .notAnObject, .duplicateKey: return .badMessage
        }
    }

    /// A one-line description for the peer.
    public var message: String {
        switch self {
        case .invalidJSON(let offset, let reason): return "invalid JSON at byte \(offset): \(reason)"
        case .notAnObject: return "a message must be a JSON object"
        case .duplicateKey(let key): return "duplicate key \"\(key)\""
        }
    }
}

/// The kind of a JSON value.
public enum JSONKind: UInt8, Sendable, Equatable {
    case object, array, string, number, bool, null
}

/// Where one JSON value sits inside a frame body.
public struct JSONSpan: Sendable, Equatable {
    public var kind: JSONKind
    /// Byte range of the value in the body (for strings: including the quotes).
    public var range: Range<Int>

    /// A value of `kind` at `range` of a body.
    @inlinable
    public init(kind: JSONKind, range: Range<Int>) {
        self.kind = kind
        self.range = range
    }
}

/// The top-level keys fluxd reads on its hot path. The scanner recognises them as it goes, so looking one up is
/// an index into a table, not a search comparing key bytes (`Envelope.span(_:)` with a `String` key maps the
/// string to one of these first, and searches only for other keys).
public enum EnvelopeKey: Int, CaseIterable, Sendable {
    case op, id, store, type, seq, state, payload, settle, cause, error

    /// The key as it is spelled on the wire.
    public var name: String {
        switch self {
        case .op: return "op"
        case .id: return "id"
        case .store: return "store"
        case .type: return "type"
        case .seq: return "seq"
        case .state: return "state"
        case .payload: return "payload"
        case .settle: return "settle"
        case .cause: return "cause"
        case .error: return "error"
        }
    }

    /// The key whose decoded bytes are `bytes`, if it is one of these.
    @inline(__always)
    static func lookup(_ bytes: UnsafeBufferPointer<UInt8>) -> EnvelopeKey? {
        @inline(__always) func eq(_ s: StaticString) -> Bool {
            memcmp(bytes.baseAddress!, s.utf8Start, s.utf8CodeUnitCount) == 0
        }
        switch bytes.count {
        case 2: return eq("op") ? .op : eq("id") ? .id : nil
        case 3: return eq("seq") ? .seq : nil
        case 4: return eq("type") ? .type : nil
        case 5: return eq("store") ? .store : eq("state") ? .state : eq("cause") ? .cause : eq("error") ? .error : nil
        case 6: return eq("settle") ? .settle : nil
        case 7: return eq("payload") ? .payload : nil
        default: return nil
        }
    }
}

/// A message's top-level object, read without building a tree: every byte of the body has been validated against
/// the JSON grammar, and each top-level field's value is known by its byte span. Nested values (payloads, states,
/// queries) are never decoded here; they are forwarded as the exact bytes the sender wrote.
///
/// This is how fluxd stays off Foundation's JSON on its hot path (docs/ARCHITECTURE.md, "Performance principles that shaped the hot path").
public struct Envelope: Sendable {
    /// The frame body the spans point into.
    public let body: [UInt8]
    /// Top-level fields whose keys are not `EnvelopeKey`s, by key byte range, in the order they appear (keys are
    /// decoded only on demand). Empty, and so never allocated, for the messages of the hot path.
    private var others: [TopLevelField]
    /// Where each `EnvelopeKey`'s value is (by raw value), inline: no allocation per message.
    @usableFromInline var known: KnownFields

    /// Top-level fields in the order they appear.
    public var fields: [(key: String, value: JSONSpan)] {
        var all: [(key: String, value: JSONSpan)] = body.withUnsafeBufferPointer { buf in
            others.map { (key: $0.decodedKey(buf), value: $0.value) }
        }
        for key in EnvelopeKey.allCases {
            if let span = known[key] { all.append((key: key.name, value: span)) }
        }
        return all.sorted { $0.value.range.lowerBound < $1.value.range.lowerBound }
    }

    /// Scans `body`. Throws when it is not valid JSON, not an object, or repeats a top-level key.
    public init(body: [UInt8], maxDepth: Int = 64) throws(EnvelopeError) {
        self.body = body
        var others: [TopLevelField] = []
        var known = KnownFields()
        let result: EnvelopeError? = body.withUnsafeBufferPointer { buf -> EnvelopeError? in
            var scanner = JSONScanner(buf, maxDepth: maxDepth)
            do {
                try scanner.scanDocument(others: &others, known: &known)
                return nil
            } catch let error as EnvelopeError {
                return error
            } catch {
                return .invalidJSON(offset: 0, reason: "\(error)")
            }
        }
        if let result { throw result }
        self.others = others
        self.known = known
    }

    /// The span of a top-level field (keys compare by their decoded UTF-8 bytes, with no Unicode normalisation).
    public func span(_ key: String) -> JSONSpan? {
        var key = key
        return key.withUTF8 { wanted in
            if let k = EnvelopeKey.lookup(wanted) { return span(k) }
            return body.withUnsafeBufferPointer { buf -> JSONSpan? in
                for entry in others where entry.keyEquals(wanted, in: buf) { return entry.value }
                return nil
            }
        }
    }

    /// The span of a well-known top-level field (a table lookup).
    @inlinable
    public func span(_ key: EnvelopeKey) -> JSONSpan? { known[key] }

    /// Whether a field is present (with any value, including null).
    public func has(_ key: String) -> Bool { span(key) != nil }

    /// The raw bytes of a field's value.
    public func raw(_ key: String) -> ArraySlice<UInt8>? { raw(at: span(key)) }

    /// The raw bytes of a well-known field's value.
    @inlinable
    public func raw(_ key: EnvelopeKey) -> ArraySlice<UInt8>? { raw(at: span(key)) }

    /// A string field's decoded value. `nil` when absent; `.failure` when present but not a string.
    public func string(_ key: String) -> FieldResult<String> { string(at: span(key)) }

    /// A well-known string field's decoded value.
    public func string(_ key: EnvelopeKey) -> FieldResult<String> { string(at: span(key)) }

    /// An integer field (JSON number without fraction or exponent, fitting in Int64).
    public func int(_ key: String) -> FieldResult<Int64> { int(at: span(key)) }

    /// A well-known integer field.
    public func int(_ key: EnvelopeKey) -> FieldResult<Int64> { int(at: span(key)) }

    /// A boolean field.
    public func bool(_ key: String) -> FieldResult<Bool> { bool(at: span(key)) }

    /// A well-known boolean field.
    public func bool(_ key: EnvelopeKey) -> FieldResult<Bool> { bool(at: span(key)) }

    /// Whether a well-known field is a string whose raw (undecoded) bytes are exactly `value`: a fast test for
    /// wire constants such as op names, which senders write without escapes. A value written with escapes does
    /// not match; decode it with `string(_:)` instead.
    @inlinable @inline(__always)
    public func isString(_ key: EnvelopeKey, _ value: StaticString) -> Bool {
        guard let s = span(key), s.kind == .string, s.range.count == value.utf8CodeUnitCount + 2 else { return false }
        return body.withUnsafeBufferPointer { buf in
            memcmp(buf.baseAddress! + s.range.lowerBound + 1, value.utf8Start, value.utf8CodeUnitCount) == 0
        }
    }

    // The value of a field found at `span`, whichever way it was looked up.

    @inlinable
    func raw(at span: JSONSpan?) -> ArraySlice<UInt8>? {
        guard let s = span else { return nil }
        return body[s.range]
    }

    func string(at span: JSONSpan?) -> FieldResult<String> {
        guard let s = span else { return .absent }
        guard s.kind == .string else { return .wrongType }
        return .value(body.withUnsafeBufferPointer { decodeJSONToken(UnsafeBufferPointer(rebasing: $0[s.range])) })
    }

    func int(at span: JSONSpan?) -> FieldResult<Int64> {
        guard let s = span else { return .absent }
        guard s.kind == .number, let v = parseJSONInteger(body[s.range]) else { return .wrongType }
        return .value(v)
    }

    func bool(at span: JSONSpan?) -> FieldResult<Bool> {
        guard let s = span else { return .absent }
        guard s.kind == .bool else { return .wrongType }
        return .value(body[s.range.lowerBound] == UInt8(ascii: "t"))
    }

    /// An array-of-strings field.
    public func stringArray(_ key: String) -> FieldResult<[String]> {
        guard let s = span(key) else { return .absent }
        guard s.kind == .array else { return .wrongType }
        var items: [String] = []
        var ok = true
        body.withUnsafeBufferPointer { buf in
            var scanner = JSONScanner(buf, maxDepth: 64)
            scanner.pos = s.range.lowerBound + 1
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "]") { return }
            while true {
                scanner.skipWhitespace()
                let begin = scanner.pos
                guard scanner.peek() == UInt8(ascii: "\""), (try? scanner.scanString()) != nil else {
                    ok = false
                    return
                }
                items.append(decodeJSONToken(UnsafeBufferPointer(rebasing: buf[begin..<scanner.pos])))
                scanner.skipWhitespace()
                if scanner.peek() == UInt8(ascii: ",") { scanner.pos += 1; continue }
                return
            }
        }
        return ok ? .value(items) : .wrongType
    }
}

/// The outcome of reading one field of an envelope.
public enum FieldResult<Value: Sendable>: Sendable {
    case absent
    case wrongType
    case value(Value)

    /// The value, or nil when absent or ill-typed.
    public var value: Value? {
        if case .value(let v) = self { return v }
        return nil
    }
}

extension FieldResult: Equatable where Value: Equatable {}

/// Parses a JSON integer literal; nil for fractions, exponents or overflow.
public func parseJSONInteger(_ bytes: ArraySlice<UInt8>) -> Int64? {
    var i = bytes.startIndex
    var negative = false
    if i < bytes.endIndex && bytes[i] == UInt8(ascii: "-") { negative = true; i += 1 }
    guard i < bytes.endIndex else { return nil }
    var value: Int64 = 0
    while i < bytes.endIndex {
        let c = bytes[i]
        guard c >= 48 && c <= 57 else { return nil }
        let (m, o1) = value.multipliedReportingOverflow(by: 10)
        let (a, o2) = m.addingReportingOverflow(Int64(c - 48))
        if o1 || o2 { return nil }
        value = a
        i += 1
    }
    return negative ? -value : value
}

/// The value spans of the `EnvelopeKey` fields of one message, in a fixed inline table (lane = key's raw value).
@usableFromInline
struct KnownFields: Sendable {
    @usableFromInline var starts = SIMD16<UInt32>()
    @usableFromInline var ends = SIMD16<UInt32>()
    /// `JSONKind.rawValue + 1`; 0 where the key is absent.
    @usableFromInline var kinds = SIMD16<UInt8>()

    init() {}

    /// Whether `key` was seen.
    @inline(__always)
    func has(_ key: EnvelopeKey) -> Bool { kinds[key.rawValue] != 0 }

    @inlinable
    subscript(key: EnvelopeKey) -> JSONSpan? {
        let k = kinds[key.rawValue]
        guard k != 0 else { return nil }
        return JSONSpan(kind: JSONKind(rawValue: k &- 1)!,
                        range: Int(starts[key.rawValue])..<Int(ends[key.rawValue]))
    }

    /// Records `key`'s value (frame bodies are shorter than 4 GiB: `maxFrame` is a `UInt32`).
    @inline(__always)
    mutating func set(_ key: EnvelopeKey, _ span: JSONSpan) {
        starts[key.rawValue] = UInt32(truncatingIfNeeded: span.range.lowerBound)
        ends[key.rawValue] = UInt32(truncatingIfNeeded: span.range.upperBound)
        kinds[key.rawValue] = span.kind.rawValue &+ 1
    }
}

/// One top-level field as the scanner found it: the key's bytes (between the quotes) and the value's span.
struct TopLevelField {
    /// Byte range of the key's raw (still escaped) bytes, without the quotes.
    var key: Range<Int>
    /// Whether the key contains a backslash escape (its decoded bytes differ from its raw bytes).
    var escaped: Bool
    var value: JSONSpan

    /// The key as a `String`.
    func decodedKey(_ body: UnsafeBufferPointer<UInt8>) -> String {
        decodeJSONToken(UnsafeBufferPointer(rebasing: body[(key.lowerBound - 1)..<(key.upperBound + 1)]))
    }

    /// Whether the decoded key equals `wanted` byte for byte.
    @inline(__always)
    func keyEquals(_ wanted: UnsafeBufferPointer<UInt8>, in body: UnsafeBufferPointer<UInt8>) -> Bool {
        if escaped { return decodedKey(body).utf8.elementsEqual(wanted) }
        return bytesEqual(body, key, wanted)
    }

    /// Whether two keys of the same body decode to the same bytes.
    func keyEquals(_ other: TopLevelField, in body: UnsafeBufferPointer<UInt8>) -> Bool {
        if !escaped && !other.escaped {
            return bytesEqual(body, key, UnsafeBufferPointer(rebasing: body[other.key]))
        }
        return decodedKey(body).utf8.elementsEqual(other.decodedKey(body).utf8)
    }
}

@inline(__always)
private func bytesEqual(_ body: UnsafeBufferPointer<UInt8>, _ range: Range<Int>, _ other: UnsafeBufferPointer<UInt8>) -> Bool {
    let n = range.count
    guard n == other.count else { return false }
    var i = 0
    var j = range.lowerBound
    while i < n {
        if body[j] != other[i] { return false }
        i += 1
        j += 1
    }
    return true
}

/// Decodes a JSON string token (with its quotes) that the scanner has already validated.
func decodeJSONToken(_ token: UnsafeBufferPointer<UInt8>) -> String {
    guard token.count >= 2 else { return "" }
    let inner = UnsafeBufferPointer(rebasing: token[1..<(token.count - 1)])
    var i = 0
    while i < inner.count && inner[i] != UInt8(ascii: "\\") { i += 1 }
    if i == inner.count { return String(decoding: inner, as: UTF8.self) }
    return decodeEscaped(ArraySlice(inner))
}

/// Decodes a JSON string token (with its quotes) that the scanner has already validated.
public func decodeJSONString(_ token: ArraySlice<UInt8>) -> String {
    token.withUnsafeBufferPointer { decodeJSONToken($0) }
}

/// Decodes the inside of a validated JSON string that contains escapes.
private func decodeEscaped(_ inner: ArraySlice<UInt8>) -> String {
    var out: [UInt8] = []
    out.reserveCapacity(inner.count)
    var i = inner.startIndex
    while i < inner.endIndex {
        let c = inner[i]
        if c != UInt8(ascii: "\\") {
            out.append(c)
            i += 1
            continue
        }
        let e = inner[i + 1]
        i += 2
        switch e {
        case UInt8(ascii: "n"): out.append(0x0A)
        case UInt8(ascii: "t"): out.append(0x09)
        case UInt8(ascii: "r"): out.append(0x0D)
        case UInt8(ascii: "b"): out.append(0x08)
        case UInt8(ascii: "f"): out.append(0x0C)
        case UInt8(ascii: "u"):
            var scalar = hex4(inner, i)
            i += 4
            if scalar >= 0xD800 && scalar < 0xDC00, i + 1 < inner.endIndex, inner[i] == UInt8(ascii: "\\") {
                let low = hex4(inner, i + 2)
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                i += 6
            }
            appendUTF8(Unicode.Scalar(scalar) ?? "\u{FFFD}", to: &out)
        default: out.append(e) // \" \\ \/
        }
    }
    return String(decoding: out, as: UTF8.self)
}

private func hex4(_ s: ArraySlice<UInt8>, _ at: Int) -> UInt32 {
    var v: UInt32 = 0
    for k in 0..<4 { v = v << 4 | UInt32(hexValue(s[at + k]) ?? 0) }
    return v
}

private func hexValue(_ c: UInt8) -> UInt8? {
    switch c {
    case 48...57: return c - 48
    case 65...70: return c - 55
    case 97...102: return c - 87
    default: return nil
    }
}

private func appendUTF8(_ scalar: Unicode.Scalar, to out: inout [UInt8]) {
    for unit in String(Character(scalar)).utf8 { out.append(unit) }
}

/// A validating single-pass JSON scanner over raw bytes. It builds nothing: it checks the grammar (RFC 8259),
/// UTF-8 well-formedness, escapes and surrogate pairs, and the nesting depth, and reports where values are.
struct JSONScanner {
    let buf: UnsafeBufferPointer<UInt8>
    let maxDepth: Int
    var pos = 0

    init(_ buf: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.buf = buf
        self.maxDepth = maxDepth
    }

    @inline(__always) func peek() -> UInt8? { pos < buf.count ? buf[pos] : nil }

    func fail(_ reason: String) -> EnvelopeError { .invalidJSON(offset: pos, reason: reason) }

    /// Moves past whitespace. The common case, no whitespace, is one compare inlined where it is called; a run of
    /// whitespace goes to `skipWhitespaceRun`.
    @inline(__always) mutating func skipWhitespace() {
        guard pos < buf.count, buf[pos] <= 0x20 else { return }
        skipWhitespaceRun()
    }

    /// Skips whitespace from `pos`: eight spaces at a time while there are (indentation, numbers padded to a
    /// fixed width), then byte by byte.
    mutating func skipWhitespaceRun() {
        let n = buf.count
        guard let base = buf.baseAddress else { return }
        let raw = UnsafeRawPointer(base)
        var p = pos
        while p &+ 8 <= n && raw.loadUnaligned(fromByteOffset: p, as: UInt64.self) == 0x2020_2020_2020_2020 {
            p &+= 8
        }
        while p < n {
            switch base[p] {
            case 0x20, 0x0A, 0x0D, 0x09: p &+= 1
            default: pos = p; return
            }
        }
        pos = p
    }

    /// Scans a whole document whose top level must be an object; collects top-level fields.
    mutating func scanDocument(others topLevel: inout [TopLevelField], known: inout KnownFields) throws(EnvelopeError) {
        skipWhitespace()
        guard let c = peek() else { throw fail("empty document") }
        if c != UInt8(ascii: "{") {
            _ = try scanValue(depth: 1)
            skipWhitespace()
            guard pos == buf.count else { throw fail("trailing bytes after the value") }
            throw .notAnObject
        }
        pos += 1
        var duplicate: TopLevelField? = nil
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            pos += 1
        } else {
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                let keyStart = pos
                let escaped = skipPlainString() ? false : try scanString()
                let keyRange = (keyStart + 1)..<(pos - 1)
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { throw fail("expected ':'") }
                pos += 1
                skipWhitespace()
                let valueStart = pos
                let span = peek() == UInt8(ascii: "\"") && skipPlainString()
                    ? JSONSpan(kind: .string, range: valueStart..<pos) : try scanValue(depth: 2)
                let field = TopLevelField(key: keyRange, escaped: escaped, value: span)
                let key: EnvelopeKey?
                if escaped {
                    var decoded = Array(field.decodedKey(buf).utf8)
                    key = decoded.withUnsafeMutableBufferPointer { EnvelopeKey.lookup(UnsafeBufferPointer($0)) }
                } else {
                    key = EnvelopeKey.lookup(UnsafeBufferPointer(rebasing: buf[keyRange]))
                }
                if let key {
                    // Well-known keys go to their slot; a duplicate is one whose slot is already taken.
                    if known.has(key) {
                        if duplicate == nil { duplicate = field }
                    } else {
                        known.set(key, span)
                    }
                } else {
                    if duplicate == nil {
                        for existing in topLevel where existing.keyEquals(field, in: buf) {
                            duplicate = field
                            break
                        }
                    }
                    topLevel.append(field)
                }
                skipWhitespace()
                guard let sep = peek() else { throw fail("unterminated object") }
                if sep == UInt8(ascii: ",") { pos += 1; continue }
                if sep == UInt8(ascii: "}") { pos += 1; break }
                throw fail("expected ',' or '}'")
            }
        }
        skipWhitespace()
        guard pos == buf.count else { throw fail("trailing bytes after the object") }
        if let duplicate { throw .duplicateKey(duplicate.decodedKey(buf)) }
    }

    @inline(__always)
    mutating func scanValue(depth: Int) throws(EnvelopeError) -> JSONSpan {
        guard let c = peek() else { throw fail("expected a value") }
        let begin = pos
        switch c {
        case UInt8(ascii: "{"):
            try scanContainer(close: UInt8(ascii: "}"), isObject: true, depth: depth)
            return JSONSpan(kind: .object, range: begin..<pos)
        case UInt8(ascii: "["):
            try scanContainer(close: UInt8(ascii: "]"), isObject: false, depth: depth)
            return JSONSpan(kind: .array, range: begin..<pos)
        case UInt8(ascii: "\""):
            if !skipPlainString() { try scanString() }
            return JSONSpan(kind: .string, range: begin..<pos)
        case UInt8(ascii: "t"):
            try literal("true")
            return JSONSpan(kind: .bool, range: begin..<pos)
        case UInt8(ascii: "f"):
            try literal("false")
            return JSONSpan(kind: .bool, range: begin..<pos)
        case UInt8(ascii: "n"):
            try literal("null")
            return JSONSpan(kind: .null, range: begin..<pos)
        case UInt8(ascii: "-"), 48...57:
            try scanNumber()
            return JSONSpan(kind: .number, range: begin..<pos)
        default:
            throw fail("unexpected byte 0x\(String(c, radix: 16))")
        }
    }

    mutating func scanContainer(close: UInt8, isObject: Bool, depth: Int) throws(EnvelopeError) {
        guard depth <= maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
        pos += 1
        skipWhitespace()
        if peek() == close { pos += 1; return }
        while true {
            skipWhitespace()
            if isObject {
                guard peek() == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                if !skipPlainString() { try scanString() }
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { throw fail("expected ':'") }
                pos += 1
                skipWhitespace()
            }
            if !(peek() == UInt8(ascii: "\"") && skipPlainString()) { _ = try scanValue(depth: depth + 1) }
            skipWhitespace()
            guard let sep = peek() else { throw fail("unterminated \(isObject ? "object" : "array")") }
            if sep == UInt8(ascii: ",") { pos += 1; continue }
            if sep == close { pos += 1; return }
            throw fail(isObject ? "expected ',' or '}'" : "expected ',' or ']'")
        }
    }

    mutating func literal(_ word: StaticString) throws(EnvelopeError) {
        let n = word.utf8CodeUnitCount
        guard pos + n <= buf.count else { throw fail("truncated literal") }
        let w = word.utf8Start
        for k in 0..<n where buf[pos + k] != w[k] { throw fail("invalid literal") }
        pos += n
    }

    mutating func scanNumber() throws(EnvelopeError) {
        if peek() == UInt8(ascii: "-") { pos += 1 }
        guard let first = peek(), first >= 48 && first <= 57 else { throw fail("expected a digit") }
        if first == 48 {
            pos += 1
        } else {
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            pos += 1
            guard let d = peek(), d >= 48 && d <= 57 else { throw fail("expected a digit after '.'") }
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
        if let e = peek(), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            pos += 1
            if let s = peek(), s == UInt8(ascii: "+") || s == UInt8(ascii: "-") { pos += 1 }
            guard let d = peek(), d >= 48 && d <= 57 else { throw fail("expected a digit in the exponent") }
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
    }

    /// Moves past the string token at `pos` (its opening quote) if it is plain printable ASCII without escapes,
    /// the common case, and says whether it did; otherwise `scanString` must scan it (escapes, non-ASCII and
    /// control bytes, errors). Not throwing, so it is inlined where it is called: no call per string.
    @inline(__always)
    mutating func skipPlainString() -> Bool {
        guard let base = buf.baseAddress else { return false }
        let end = JSONScanner.plainStringEnd(base, pos, buf.count)
        guard end >= 0 else { return false }
        pos = end
        return true
    }

    /// Where the string token at `i` (its opening quote) ends, the index after its closing quote, if it is plain
    /// printable ASCII without escapes; -1 otherwise.
    @inline(__always)
    static func plainStringEnd(_ b: UnsafePointer<UInt8>, _ i: Int, _ n: Int) -> Int {
        var (p, found) = skipPlainWords(b, from: i &+ 1, n)
        if found { return b[p] == UInt8(ascii: "\"") ? p &+ 1 : -1 }
        while p < n {
            let c = b[p]
            if c == UInt8(ascii: "\"") { return p &+ 1 }
            guard c &- 0x20 < 0x60, c != UInt8(ascii: "\\") else { return -1 }
            p &+= 1
        }
        return -1
    }

    /// Skips plain printable ASCII (no quote, backslash, control or non-ASCII byte) from `p`, eight bytes at a
    /// time: the index of the first such byte (`found`), or of the first byte of the last, partial word. The
    /// lowest byte flagged in `special` is the first hit (the borrow of these tests can only flag bytes above a
    /// true hit), so it is found without a second pass.
    @inline(__always)
    static func skipPlainWords(_ b: UnsafePointer<UInt8>, from start: Int, _ n: Int) -> (index: Int, found: Bool) {
        var p = start
        let raw = UnsafeRawPointer(b)
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        while p &+ 8 <= n {
            let w = raw.loadUnaligned(fromByteOffset: p, as: UInt64.self)
            let quote = w ^ (ones &* 0x22)
            let backslash = w ^ (ones &* 0x5C)
            let control = (w &- ones &* 0x20) & ~w
            let special = (control | ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash) | w) & highs
            if special != 0 {
                return (p &+ special.trailingZeroBitCount &>> 3, true)  // little-endian: lowest bits = first byte
            }
            p &+= 8
        }
        return (p, false)
    }

    /// Scans a string token starting at the opening quote; validates escapes and UTF-8. Returns whether the
    /// string contains a backslash escape.
    @discardableResult @inline(__always)
    mutating func scanString() throws(EnvelopeError) -> Bool {
        var escaped = false
        pos += 1
        let count = buf.count
        while pos < count {
            // Runs of plain printable ASCII (no quote, no backslash): the common case, eight bytes at a time.
            var p = pos
            var found = false
            if let base = buf.baseAddress { (p, found) = JSONScanner.skipPlainWords(base, from: p, count) }
            if !found {
                while p < count {
                    let b = buf[p]
                    guard b &- 0x20 < 0x60, b != UInt8(ascii: "\""), b != UInt8(ascii: "\\") else { break }
                    p += 1
                }
            }
            pos = p
            guard p < count else { break }
            let c = buf[p]
            if c == UInt8(ascii: "\"") { pos += 1; return escaped }
            if c == UInt8(ascii: "\\") {
                escaped = true
                pos += 1
                guard let e = peek() else { break }
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    pos += 1
                case UInt8(ascii: "u"):
                    pos += 1
                    let unit = try hexQuad()
                    if unit >= 0xD800 && unit < 0xDC00 {
                        guard pos + 1 < buf.count, buf[pos] == UInt8(ascii: "\\"), buf[pos + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired high surrogate") }
                        pos += 2
                        let low = try hexQuad()
                        guard low >= 0xDC00 && low < 0xE000 else { throw fail("invalid low surrogate") }
                    } else if unit >= 0xDC00 && unit < 0xE000 {
                        throw fail("unpaired low surrogate")
                    }
                default:
                    throw fail("invalid escape")
                }
                continue
            }
            if c < 0x20 { throw fail("control character in string") }
            if c < 0x80 { pos += 1; continue }
            try scanUTF8Sequence(lead: c)
        }
        throw fail("unterminated string")
    }

    mutating func hexQuad() throws(EnvelopeError) -> UInt32 {
        guard pos + 4 <= buf.count else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for k in 0..<4 {
            guard let h = hexValue(buf[pos + k]) else { throw fail("invalid \\u escape") }
            v = v << 4 | UInt32(h)
        }
        pos += 4
        return v
    }

    /// Validates one multi-byte UTF-8 sequence (no overlongs, no surrogates, at most U+10FFFF).
    mutating func scanUTF8Sequence(lead: UInt8) throws(EnvelopeError) {
        let need: Int
        var lo: UInt8 = 0x80, hi: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: need = 1
        case 0xE0: need = 2; lo = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: need = 2
        case 0xED: need = 2; hi = 0x9F
        case 0xF0: need = 3; lo = 0x90
        case 0xF1...0xF3: need = 3
        case 0xF4: need = 3; hi = 0x8F
        default: throw fail("invalid UTF-8")
        }
        guard pos + need < buf.count else { throw fail("truncated UTF-8") }
        let second = buf[pos + 1]
        guard second >= lo && second <= hi else { throw fail("invalid UTF-8") }
        for k in 2...max(2, need) where k <= need {
            let b = buf[pos + k]
            guard b >= 0x80 && b <= 0xBF else { throw fail("invalid UTF-8") }
        }
        pos += need + 1
    }
}
