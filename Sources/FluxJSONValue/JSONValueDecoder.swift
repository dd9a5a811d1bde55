// Decoding Swift values from a JSONValue tree the way Foundation's JSONDecoder (default strategies) decodes them
// from the same JSON text, and, for a client applying patches (SPEC §16), incrementally: a `TrackedArray` the patch
// did not touch is the earlier value again, and one whose elements it touched decodes only those elements.
// Guarded by a randomized differential test against JSONDecoder (FluxJSONValueTests).

import Foundation

/// What a patch operation touched, for `JSONIncrementalDecoder` (the parts of an RFC 6902 operation it needs).
public struct JSONPatchTouch: Sendable, Equatable {
    /// The operation.
    public enum Kind: String, Sendable { case add, remove, replace, move, copy, test }
    /// The operation.
    public var kind: Kind
    /// Its `path`.
    public var path: JSONPointer
    /// Its `from` (`move`, `copy`).
    public var from: JSONPointer?
    /// Its `value` (`add`, `replace`, `test`).
    public var value: JSONValue?

    /// A touch.
    public init(kind: Kind, path: JSONPointer, from: JSONPointer? = nil, value: JSONValue? = nil) {
        self.kind = kind
        self.path = path
        self.from = from
        self.value = value
    }
}

extension JSONPatch {
    /// What each operation touched (for `JSONIncrementalDecoder.decode(_:after:)`).
    public var touches: [JSONPatchTouch] {
        operations.map { op in
            switch op {
            case .add(let path, let value): JSONPatchTouch(kind: .add, path: path, value: value)
            case .remove(let path): JSONPatchTouch(kind: .remove, path: path)
            case .replace(let path, let value): JSONPatchTouch(kind: .replace, path: path, value: value)
            case .move(let from, let path): JSONPatchTouch(kind: .move, path: path, from: from)
            case .copy(let from, let path): JSONPatchTouch(kind: .copy, path: path, from: from)
            case .test(let path, let value): JSONPatchTouch(kind: .test, path: path, value: value)
            }
        }
    }
}

/// Decodes Swift values from `JSONValue` as Foundation's `JSONDecoder` (default strategies) decodes the same JSON
/// text: numbers into any integer type when they are whole and fit, `Data` from base64, `URL` from a string,
/// `Decimal` from a number, `Date` from seconds since 2001.
public struct JSONValueDecoder: Sendable {
    /// A decoder.
    public init() {}

    /// Decodes a `T` from `value`.
    public func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws -> T {
        try ValueReader(value: value, codingPath: [], context: nil).decodeValue(T.self)
    }
}

/// Decodes the successive states of a subscription: the first (and every resynchronised) state whole, each later one
/// after a patch reusing the earlier typed value where the patch did not reach: a `TrackedArray` the patch did not
/// touch is taken as it was, one whose elements it replaced, added or removed decodes only those elements (an
/// operation on the array itself, or a `move`/`copy` into it, decodes it whole). Untracked parts are decoded again.
public struct JSONIncrementalDecoder<T: Decodable> {
    let context = DecodeContext()

    /// A decoder that has decoded nothing yet.
    public init() {}

    /// Decodes `value` whole (and remembers its tracked arrays for the next `decode(_:after:)`).
    public func decode(_ value: JSONValue) throws -> T {
        try run(value, touches: nil)
    }

    /// Decodes `value`, the state after a patch whose operations touched `touches`, from the state decoded last
    /// (by `decode` or this).
    public func decode(_ value: JSONValue, after touches: [JSONPatchTouch]) throws -> T {
        try run(value, touches: context.previous.isEmpty ? nil : touches)
    }

    /// Forgets the earlier state (the next decode is whole).
    public func reset() { context.previous = [:] }

    private func run(_ value: JSONValue, touches: [JSONPatchTouch]?) throws -> T {
        context.touches = touches
        context.recorded = [:]
        context.freshDepth = 0
        do {
            let result = try ValueReader(value: value, codingPath: [], context: context).decodeValue(T.self)
            context.previous = context.recorded
            context.recorded = [:]
            return result
        } catch {
            context.previous = [:]
            context.recorded = [:]
            throw error
        }
    }
}


/// The shared state of one incremental decode.
final class DecodeContext {
    /// Tracked arrays of the last decoded state, by their place (reference tokens).
    var previous: [[String]: Any] = [:]
    /// Those of the state being decoded.
    var recorded: [[String]: Any] = [:]
    /// The patch's touches (nil: decode whole).
    var touches: [JSONPatchTouch]?
    /// Above 0 while decoding an element afresh (nothing inside it is reused).
    var freshDepth = 0
}

/// The decoder handed to `init(from:)`: reads one `JSONValue`.
final class ValueReader: Decoder {
    let value: JSONValue
    let codingPath: [any CodingKey]
    let context: DecodeContext?
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(value: JSONValue, codingPath: [any CodingKey], context: DecodeContext?) {
        self.value = value
        self.codingPath = codingPath
        self.context = context
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else {
            throw DecodingError.typeMismatch([String: Any].self, .init(
                codingPath: codingPath, debugDescription: "Expected to decode Dictionary<String, Any> but found \(value.kindName) instead."))
        }
        return KeyedDecodingContainer(KeyedReaderContainer<Key>(reader: self, members: members))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let items) = value else {
            throw DecodingError.typeMismatch([Any].self, .init(
                codingPath: codingPath, debugDescription: "Expected to decode Array<Any> but found \(value.kindName) instead."))
        }
        return UnkeyedReaderContainer(reader: self, items: items)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { SingleReaderContainer(reader: self) }

    // MARK: Values

    func child(_ value: JSONValue, _ key: any CodingKey) -> ValueReader {
        ValueReader(value: value, codingPath: codingPath + [key], context: context)
    }

    /// Decodes a value of any type (Foundation's special cases first).
    func decodeValue<V: Decodable>(_ type: V.Type) throws -> V {
        if V.self == String.self { return try string() as! V }
        if V.self == Bool.self { return try bool() as! V }
        if V.self == Int.self { return try integer(Int.self) as! V }
        if V.self == Double.self { return try double() as! V }
        if V.self == Data.self {
            let s = try expectString(Data.self)
            guard let data = Data(base64Encoded: s) else {
                throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "Encountered Data is not valid Base64."))
            }
            return data as! V
        }
        if V.self == URL.self {
            let s = try expectString(URL.self)
            guard let url = URL(string: s) else {
                throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "Invalid URL string."))
            }
            return url as! V
        }
        if V.self == Decimal.self {
            guard case .number(let text) = value else { throw mismatch(Decimal.self) }
            guard let d = Decimal(string: text, locale: Locale(identifier: "en_US_POSIX")) else {
                throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "Parsed JSON number <\(text)> does not fit in Decimal."))
            }
            return d as! V
        }
        return try V(from: self)
    }

    var kindName: String { value.kindName }

    func mismatch(_ type: Any.Type) -> DecodingError {
        if case .null = value {
            return DecodingError.valueNotFound(type, .init(
                codingPath: codingPath, debugDescription: "Cannot get value of type \(type) -- found null value instead"))
        }
        return DecodingError.typeMismatch(type, .init(
            codingPath: codingPath, debugDescription: "Expected to decode \(type) but found \(value.kindName) instead."))
    }

    func expectString(_ type: Any.Type) throws -> String {
        guard case .string(let s) = value else { throw mismatch(type) }
        return s
    }

    func string() throws -> String { try expectString(String.self) }

    func bool() throws -> Bool {
        guard case .bool(let b) = value else { throw mismatch(Bool.self) }
        return b
    }

    func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        guard case .number(let text) = value else { throw mismatch(I.self) }
        if let i = I(text) { return i }
        // Not written as a plain integer (`1.0`, `1e2`), or out of range: whole values that fit are accepted.
        if let d = Double(text), let i = I(exactly: d) { return i }
        throw DecodingError.dataCorrupted(.init(
            codingPath: codingPath, debugDescription: "Parsed JSON number <\(text)> does not fit in \(I.self)."))
    }

    func double() throws -> Double {
        guard case .number(let text) = value else { throw mismatch(Double.self) }
        guard let d = Double(text), d.isFinite else {
            throw DecodingError.dataCorrupted(.init(
                codingPath: codingPath, debugDescription: "Parsed JSON number <\(text)> does not fit in Double."))
        }
        return d
    }

    func float() throws -> Float {
        guard case .number(let text) = value else { throw mismatch(Float.self) }
        guard let d = Double(text), d.isFinite, abs(d) <= Double(Float.greatestFiniteMagnitude) else {
            throw DecodingError.dataCorrupted(.init(
                codingPath: codingPath, debugDescription: "Parsed JSON number <\(text)> does not fit in Float."))
        }
        return Float(d)
    }

    // MARK: Tracked arrays

    /// The place of this value as reference tokens.
    var tokens: [String] { codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue } }

    func noteTracked<E>(_ array: TrackedArray<E>) {
        guard let context else { return }
        context.recorded[tokens] = array
    }

    /// With an earlier decoded array at this place and a patch that touched only some of its elements: that array
    /// with those elements decoded again; nil when it must be decoded whole.
    func decodeTracked<E: Decodable>(_ type: TrackedArray<E>.Type) throws -> TrackedArray<E>? {
        guard let context, let touches = context.touches, context.freshDepth == 0,
              case .array(let items) = value else { return nil }
        let here = tokens
        guard var array = context.previous[here] as? TrackedArray<E> else { return nil }
        /// Indices whose elements must be decoded again from the final value.
        var dirty: [Int] = []
        var changed = false
        func within(_ p: JSONPointer) -> Bool { p.tokens.count > here.count && p.tokens.starts(with: here) }
        func covers(_ p: JSONPointer) -> Bool { p.tokens.count <= here.count && here.starts(with: p.tokens) }
        for t in touches {
            if t.kind == .test { continue }
            if covers(t.path) { return nil }
            if let from = t.from, t.kind == .move, covers(from) || within(from) { return nil }
            guard within(t.path) else { continue }
            if t.kind == .move || t.kind == .copy { return nil }
            let token = t.path.tokens[here.count]
            let deeper = t.path.tokens.count > here.count + 1
            let index: Int
            if token == "-" && t.kind == .add && !deeper {
                index = array.count
            } else {
                guard let i = Int(token), i >= 0, String(i) == token else { return nil }
                index = i
            }
            if deeper {
                guard index < array.count else { return nil }
                if !dirty.contains(index) { dirty.append(index) }
                continue
            }
            switch t.kind {
            case .add:
                guard index <= array.count, let v = t.value else { return nil }
                array.insertWithoutLogging(try fresh(v, index, E.self), at: index)
                changed = true
                for k in dirty.indices where dirty[k] >= index { dirty[k] += 1 }
            case .remove:
                guard index < array.count else { return nil }
                _ = array.removeWithoutLogging(at: index)
                changed = true
                dirty.removeAll { $0 == index }
                for k in dirty.indices where dirty[k] > index { dirty[k] -= 1 }
            case .replace:
                guard index < array.count else { return nil }
                if !dirty.contains(index) { dirty.append(index) }
            case .move, .copy, .test:
                return nil
            }
        }
        guard array.count == items.count else { return nil }
        for i in dirty {
            let (k, o) = array.locate(i)
            array.chunks[k][o] = try fresh(items[i], i, E.self)
        }
        // A new content gets a new stamp (equality trusts equal stamps).
        if changed || !dirty.isEmpty { array.log.reset() }
        context.recorded[here] = array
        return array
    }

    /// An element decoded afresh (nothing inside it reused).
    private func fresh<E: Decodable>(_ v: JSONValue, _ index: Int, _ type: E.Type) throws -> E {
        guard let context else { return try child(v, IndexKey(index)).decodeValue(E.self) }
        context.freshDepth += 1
        defer { context.freshDepth -= 1 }
        return try child(v, IndexKey(index)).decodeValue(E.self)
    }
}

extension JSONValue {
    /// How Foundation names this kind of value in decoding errors.
    var kindName: String {
        switch self {
        case .null: return "null"
        case .bool: return "bool"
        case .number: return "number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "a dictionary"
        }
    }
}

struct KeyedReaderContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let reader: ValueReader
    let members: [(key: String, value: JSONValue)]
    /// For large objects: key -> index of its last occurrence.
    let index: [String: Int]?
    var codingPath: [any CodingKey] { reader.codingPath }

    init(reader: ValueReader, members: [(key: String, value: JSONValue)]) {
        self.reader = reader
        self.members = members
        if members.count > 12 {
            var index: [String: Int] = [:]
            index.reserveCapacity(members.count)
            for (i, m) in members.enumerated() { index[m.key] = i }
            self.index = index
        } else {
            index = nil
        }
    }

    var allKeys: [Key] {
        var seen = Set<String>()
        return members.compactMap { m in seen.insert(m.key).inserted ? Key(stringValue: m.key) : nil }
    }

    func lookup(_ key: Key) -> JSONValue? {
        if let index { return index[key.stringValue].map { members[$0].value } }
        let name = key.stringValue
        return members.last { $0.key == name }?.value
    }

    func contains(_ key: Key) -> Bool { lookup(key) != nil }

    func required(_ key: Key) throws -> ValueReader {
        guard let v = lookup(key) else {
            throw DecodingError.keyNotFound(key, .init(
                codingPath: codingPath, debugDescription: "No value associated with key \(key) (\"\(key.stringValue)\")."))
        }
        return reader.child(v, key)
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard let v = lookup(key) else {
            throw DecodingError.keyNotFound(key, .init(
                codingPath: codingPath, debugDescription: "No value associated with key \(key) (\"\(key.stringValue)\")."))
        }
        return v.isNull
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try required(key).bool() }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try required(key).string() }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try required(key).double() }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try required(key).float() }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try required(key).integer(Int.self) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try required(key).integer(Int8.self) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try required(key).integer(Int16.self) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try required(key).integer(Int32.self) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try required(key).integer(Int64.self) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try required(key).integer(UInt.self) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try required(key).integer(UInt8.self) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try required(key).integer(UInt16.self) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try required(key).integer(UInt32.self) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try required(key).integer(UInt64.self) }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try required(key).decodeValue(T.self) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try required(key).container(keyedBy: NestedKey.self)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try required(key).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder { reader.child(lookup(Key(stringValue: "super")!) ?? .null, SuperKey()) }

    func superDecoder(forKey key: Key) throws -> any Decoder { reader.child(lookup(key) ?? .null, key) }
}

struct UnkeyedReaderContainer: UnkeyedDecodingContainer {
    let reader: ValueReader
    let items: [JSONValue]
    var currentIndex = 0
    var codingPath: [any CodingKey] { reader.codingPath }
    var count: Int? { items.count }
    var isAtEnd: Bool { currentIndex >= items.count }

    init(reader: ValueReader, items: [JSONValue]) {
        self.reader = reader
        self.items = items
    }

    mutating func next(_ type: Any.Type) throws -> ValueReader {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(type, .init(
                codingPath: codingPath + [IndexKey(currentIndex)], debugDescription: "Unkeyed container is at end."))
        }
        defer { currentIndex += 1 }
        return reader.child(items[currentIndex], IndexKey(currentIndex))
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(Any?.self, .init(
                codingPath: codingPath + [IndexKey(currentIndex)], debugDescription: "Unkeyed container is at end."))
        }
        if items[currentIndex].isNull {
            currentIndex += 1
            return true
        }
        return false
    }

    mutating func decode(_ type: Bool.Type) throws -> Bool { try next(type).bool() }
    mutating func decode(_ type: String.Type) throws -> String { try next(type).string() }
    mutating func decode(_ type: Double.Type) throws -> Double { try next(type).double() }
    mutating func decode(_ type: Float.Type) throws -> Float { try next(type).float() }
    mutating func decode(_ type: Int.Type) throws -> Int { try next(type).integer(Int.self) }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try next(type).integer(Int8.self) }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try next(type).integer(Int16.self) }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try next(type).integer(Int32.self) }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try next(type).integer(Int64.self) }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try next(type).integer(UInt.self) }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try next(type).integer(UInt8.self) }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try next(type).integer(UInt16.self) }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try next(type).integer(UInt32.self) }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try next(type).integer(UInt64.self) }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try next(type).decodeValue(T.self) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next([String: Any].self).container(keyedBy: NestedKey.self)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try next([Any].self).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder { try next(Any.self) }
}

struct SingleReaderContainer: SingleValueDecodingContainer {
    let reader: ValueReader
    var codingPath: [any CodingKey] { reader.codingPath }

    func decodeNil() -> Bool { reader.value.isNull }
    func decode(_ type: Bool.Type) throws -> Bool { try reader.bool() }
    func decode(_ type: String.Type) throws -> String { try reader.string() }
    func decode(_ type: Double.Type) throws -> Double { try reader.double() }
    func decode(_ type: Float.Type) throws -> Float { try reader.float() }
    func decode(_ type: Int.Type) throws -> Int { try reader.integer(Int.self) }
    func decode(_ type: Int8.Type) throws -> Int8 { try reader.integer(Int8.self) }
    func decode(_ type: Int16.Type) throws -> Int16 { try reader.integer(Int16.self) }
    func decode(_ type: Int32.Type) throws -> Int32 { try reader.integer(Int32.self) }
    func decode(_ type: Int64.Type) throws -> Int64 { try reader.integer(Int64.self) }
    func decode(_ type: UInt.Type) throws -> UInt { try reader.integer(UInt.self) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try reader.integer(UInt8.self) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try reader.integer(UInt16.self) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try reader.integer(UInt32.self) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try reader.integer(UInt64.self) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try reader.decodeValue(T.self) }
}
