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

    /// The span of a well-known top-level field (a table lookup, inlined: a call passed the whole table in
    /// registers and spilled it, ~35 instructions a lookup, several lookups a frame; issue 27).
    @inlinable @inline(__always)
    public func span(_ key: EnvelopeKey) -> JSONSpan? { known[key] }

    /// Whether a field is present (with any value, including null).
    public func has(_ key: String) -> Bool { span(key) != nil }

    /// Whether the message has top-level fields other than the well-known ones (`EnvelopeKey`): when it has none,
    /// looking up any other key by name can be skipped (a hot-path `done` carries only well-known fields).
    public var hasOtherFields: Bool { !others.isEmpty }

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

    @inlinable @inline(__always)
    subscript(key: EnvelopeKey) -> JSONSpan? {
        let k = kinds[key.rawValue]
        guard k != 0 else { return nil }
        // (`set` stores a `JSONKind`'s raw value + 1: the cast needs no check.)
        return JSONSpan(kind: unsafeBitCast(k &- 1, to: JSONKind.self),
                        range: Range(uncheckedBounds: (Int(starts[key.rawValue]), Int(ends[key.rawValue]))))
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
