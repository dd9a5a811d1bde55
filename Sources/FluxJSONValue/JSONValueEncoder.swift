// Encoding Swift values to JSONValue the way FluxClient's `FluxJSON.encode` (Foundation's JSONEncoder with sorted
// keys and default strategies) encodes them, as values: `Data` as base64, `URL` as its absolute string, `Decimal`
// as a number, `Date` as its seconds since 2001 (deferred to `Date`), non-finite floating point numbers refused.
// The walk is also what `JSONDeltaEncoder` uses: there a `TrackedArray` is not encoded but recorded as a tracked
// node, which the delta encoder describes by its log.

import Foundation

/// What a walk makes: plain JSON, with tracked arrays left as nodes (when tracking).
indirect enum EncodedNode {
    case value(JSONValue)
    /// Members sorted by key.
    case object([(key: String, node: EncodedNode)])
    case array([EncodedNode])
    case tracked(TrackedNode)

    /// The whole JSON (tracked arrays encoded in full).
    func materialize() throws -> JSONValue {
        switch self {
        case .value(let v): return v
        case .object(let members): return .object(try members.map { ($0.key, try $0.node.materialize()) })
        case .array(let items): return .array(try items.map { try $0.materialize() })
        case .tracked(let t): return try t.materialize()
        }
    }
}

/// A tracked array met by a walk: its stamp, and how to encode it whole or describe its changes since a stamp.
struct TrackedNode {
    enum Change {
        case set(Int, JSONValue)
        case insert(Int, JSONValue)
        case remove(Int)
    }
    var stamp: UInt64
    var materialize: () throws -> JSONValue
    /// The changes since the content named by a stamp, encoded; nil when the log does not reach back to it.
    var changes: (UInt64) throws -> [Change]?
}

/// The encoder a walk hands to `encode(to:)`: builds an `EncodedNode`.
final class ValueWalker: Encoder {
    enum Slot {
        case none
        case node(EncodedNode)
        case object(ObjectBuilder)
        case array(ArrayBuilder)
    }

    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    /// Whether tracked arrays are recorded as tracked nodes (delta encoding) rather than encoded.
    let tracking: Bool
    var slot = Slot.none

    init(codingPath: [any CodingKey], tracking: Bool) {
        self.codingPath = codingPath
        self.tracking = tracking
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        let builder: ObjectBuilder
        if case .object(let b) = slot {
            builder = b
        } else {
            builder = ObjectBuilder()
            slot = .object(builder)
        }
        return KeyedEncodingContainer(KeyedWalkerContainer<Key>(walker: self, builder: builder, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        let builder: ArrayBuilder
        if case .array(let b) = slot {
            builder = b
        } else {
            builder = ArrayBuilder()
            slot = .array(builder)
        }
        return UnkeyedWalkerContainer(walker: self, builder: builder, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleWalkerContainer(walker: self) }

    func recordTracked<E: Encodable>(_ array: TrackedArray<E>) {
        let tracking = self.tracking, path = codingPath
        let encodeElement: (E, Int) throws -> JSONValue = { e, i in
            try ValueWalker.encode(e, codingPath: path + [IndexKey(i)], tracking: tracking).materialize()
        }
        let node = TrackedNode(
            stamp: array.stamp,
            materialize: {
                var items: [JSONValue] = []
                items.reserveCapacity(array.count)
                for (i, e) in array.enumerated() { items.append(try encodeElement(e, i)) }
                return .array(items)
            },
            changes: { since in
                guard let entries = array.log.changes(since: since) else { return nil }
                var out: [TrackedNode.Change] = []
                out.reserveCapacity(entries.count)
                var pendingSet: (index: Int, element: E)?
                for entry in entries {
                    // Several sets of one element in a row: only the last counts.
                    if case .set(let i, let e) = entry.kind {
                        if let p = pendingSet, p.index != i { out.append(.set(p.index, try encodeElement(p.element, p.index))) }
                        pendingSet = (i, e)
                        continue
                    }
                    if let p = pendingSet {
                        out.append(.set(p.index, try encodeElement(p.element, p.index)))
                        pendingSet = nil
                    }
                    switch entry.kind {
                    case .insert(let i, let e): out.append(.insert(i, try encodeElement(e, i)))
                    case .remove(let i): out.append(.remove(i))
                    case .set: break
                    }
                }
                if let p = pendingSet { out.append(.set(p.index, try encodeElement(p.element, p.index))) }
                return out
            })
        slot = .node(.tracked(node))
    }

    /// What was encoded (an object when nothing was, as Foundation does for a nested value).
    func result() -> EncodedNode {
        switch slot {
        case .none: return .object([])
        case .node(let n): return n
        case .object(let b): return b.result()
        case .array(let b): return b.result()
        }
    }

    /// Encodes one value (the special cases of Foundation's JSONEncoder first).
    static func encode<T: Encodable>(_ value: T, codingPath: [any CodingKey], tracking: Bool) throws -> EncodedNode {
        switch value {
        case let s as String: return .value(.string(s))
        case let b as Bool: return .value(.bool(b))
        case let i as Int: return .value(.number(String(i)))
        case let d as Double: return .value(try number(d, codingPath))
        case let data as Data: return .value(.string(data.base64EncodedString()))
        case let url as URL: return .value(.string(url.absoluteString))
        case let decimal as Decimal: return .value(.number(decimal.description))
        default:
            let walker = ValueWalker(codingPath: codingPath, tracking: tracking)
            try value.encode(to: walker)
            return walker.result()
        }
    }

    static func number(_ d: Double, _ codingPath: [any CodingKey]) throws -> JSONValue {
        guard d.isFinite else {
            throw EncodingError.invalidValue(d, EncodingError.Context(
                codingPath: codingPath, debugDescription: "Unable to encode Double.\(d) directly in JSON."))
        }
        var text = d.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        return .number(text)
    }

    static func number(_ f: Float, _ codingPath: [any CodingKey]) throws -> JSONValue {
        guard f.isFinite else {
            throw EncodingError.invalidValue(f, EncodingError.Context(
                codingPath: codingPath, debugDescription: "Unable to encode Float.\(f) directly in JSON."))
        }
        var text = f.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        return .number(text)
    }
}

/// Members of an object being encoded (a later value for a key replaces an earlier one).
final class ObjectBuilder {
    enum Member {
        case node(EncodedNode)
        case object(ObjectBuilder)
        case array(ArrayBuilder)
        case walker(ValueWalker)
    }
    var members: [String: Member] = [:]

    func result() -> EncodedNode {
        .object(members.keys.sorted().map { key in
            switch members[key]! {
            case .node(let n): return (key, n)
            case .object(let b): return (key, b.result())
            case .array(let b): return (key, b.result())
            case .walker(let w): return (key, w.result())
            }
        })
    }
}

/// Elements of an array being encoded.
final class ArrayBuilder {
    var items: [ObjectBuilder.Member] = []

    func result() -> EncodedNode {
        .array(items.map { item in
            switch item {
            case .node(let n): return n
            case .object(let b): return b.result()
            case .array(let b): return b.result()
            case .walker(let w): return w.result()
            }
        })
    }
}

/// An array index as a coding key.
struct IndexKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(_ i: Int) { stringValue = String(i); intValue = i }
    init?(stringValue: String) { self.stringValue = stringValue; intValue = Int(stringValue) }
    init?(intValue: Int) { self.init(intValue) }
}

/// The key `super`, for `superEncoder()` / `superDecoder()`.
struct SuperKey: CodingKey {
    var stringValue: String { "super" }
    var intValue: Int? { nil }
    init() {}
    init?(stringValue: String) {}
    init?(intValue: Int) { nil }
}

struct KeyedWalkerContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let walker: ValueWalker
    let builder: ObjectBuilder
    let codingPath: [any CodingKey]

    func put(_ v: JSONValue, _ key: Key) { builder.members[key.stringValue] = .node(.value(v)) }

    mutating func encodeNil(forKey key: Key) throws { put(.null, key) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { put(.bool(value), key) }
    mutating func encode(_ value: String, forKey key: Key) throws { put(.string(value), key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { put(try ValueWalker.number(value, codingPath + [key]), key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { put(try ValueWalker.number(value, codingPath + [key]), key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { put(.number(String(value)), key) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        builder.members[key.stringValue] = .node(try ValueWalker.encode(value, codingPath: codingPath + [key], tracking: walker.tracking))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let b: ObjectBuilder
        if case .object(let existing)? = builder.members[key.stringValue] { b = existing } else {
            b = ObjectBuilder()
            builder.members[key.stringValue] = .object(b)
        }
        return KeyedEncodingContainer(KeyedWalkerContainer<NestedKey>(walker: walker, builder: b, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let b: ArrayBuilder
        if case .array(let existing)? = builder.members[key.stringValue] { b = existing } else {
            b = ArrayBuilder()
            builder.members[key.stringValue] = .array(b)
        }
        return UnkeyedWalkerContainer(walker: walker, builder: b, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder { superEncoder(key: SuperKey().stringValue, codingKey: SuperKey()) }

    mutating func superEncoder(forKey key: Key) -> any Encoder { superEncoder(key: key.stringValue, codingKey: key) }

    private func superEncoder(key: String, codingKey: any CodingKey) -> any Encoder {
        let w = ValueWalker(codingPath: codingPath + [codingKey], tracking: walker.tracking)
        builder.members[key] = .walker(w)
        return w
    }
}

struct UnkeyedWalkerContainer: UnkeyedEncodingContainer {
    let walker: ValueWalker
    let builder: ArrayBuilder
    let codingPath: [any CodingKey]
    var count: Int { builder.items.count }

    func put(_ v: JSONValue) { builder.items.append(.node(.value(v))) }
    var nextPath: [any CodingKey] { codingPath + [IndexKey(builder.items.count)] }

    mutating func encodeNil() throws { put(.null) }
    mutating func encode(_ value: Bool) throws { put(.bool(value)) }
    mutating func encode(_ value: String) throws { put(.string(value)) }
    mutating func encode(_ value: Double) throws { put(try ValueWalker.number(value, nextPath)) }
    mutating func encode(_ value: Float) throws { put(try ValueWalker.number(value, nextPath)) }
    mutating func encode(_ value: Int) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int8) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int16) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int32) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int64) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt8) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt16) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt32) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt64) throws { put(.number(String(value))) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        builder.items.append(.node(try ValueWalker.encode(value, codingPath: nextPath, tracking: walker.tracking)))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let path = nextPath
        let b = ObjectBuilder()
        builder.items.append(.object(b))
        return KeyedEncodingContainer(KeyedWalkerContainer<NestedKey>(walker: walker, builder: b, codingPath: path))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = nextPath
        let b = ArrayBuilder()
        builder.items.append(.array(b))
        return UnkeyedWalkerContainer(walker: walker, builder: b, codingPath: path)
    }

    mutating func superEncoder() -> any Encoder {
        let w = ValueWalker(codingPath: nextPath, tracking: walker.tracking)
        builder.items.append(.walker(w))
        return w
    }
}

struct SingleWalkerContainer: SingleValueEncodingContainer {
    let walker: ValueWalker
    var codingPath: [any CodingKey] { walker.codingPath }

    func put(_ v: JSONValue) { walker.slot = .node(.value(v)) }

    mutating func encodeNil() throws { put(.null) }
    mutating func encode(_ value: Bool) throws { put(.bool(value)) }
    mutating func encode(_ value: String) throws { put(.string(value)) }
    mutating func encode(_ value: Double) throws { put(try ValueWalker.number(value, codingPath)) }
    mutating func encode(_ value: Float) throws { put(try ValueWalker.number(value, codingPath)) }
    mutating func encode(_ value: Int) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int8) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int16) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int32) throws { put(.number(String(value))) }
    mutating func encode(_ value: Int64) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt8) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt16) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt32) throws { put(.number(String(value))) }
    mutating func encode(_ value: UInt64) throws { put(.number(String(value))) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        walker.slot = .node(try ValueWalker.encode(value, codingPath: codingPath, tracking: walker.tracking))
    }
}

/// Encodes Swift values to `JSONValue` as `FluxJSON.encode` (Foundation's JSONEncoder, sorted keys) would, compared
/// as JSON values: objects with sorted members, `Data` as base64, `URL` as its absolute string, `Decimal` as a
/// number, `Date` as seconds since 2001, non-finite numbers refused. Numbers are written as Swift prints them.
public struct JSONValueEncoder: Sendable {
    /// An encoder.
    public init() {}

    /// `value` as a JSON value (a `TrackedArray` as the array of its elements).
    public func encode<T: Encodable>(_ value: T) throws -> JSONValue {
        try ValueWalker.encode(value, codingPath: [], tracking: false).materialize()
    }
}
