// Encoding Swift values to JSONValue the way FluxClient's `FluxJSON.encode` (Foundation's JSONEncoder with sorted
// keys and default strategies) encodes them, as values: `Data` as base64, `URL` as its absolute string, `Decimal`
// as a number, `Date` as its seconds since 2001 (deferred to `Date`), non-finite floating point numbers refused.
// The walk is also what `JSONDeltaEncoder` uses: there a `TrackedArray` is not encoded but recorded as a tracked
// node, which the delta encoder describes by its log.

import Foundation

/// What a walk makes: plain JSON, with tracked arrays left as nodes (when tracking). (Not `indirect`: the recursion
/// goes through arrays, and an indirect case would box every leaf.)
enum EncodedNode {
    case value(JSONValue)
    /// Members sorted by key.
    case object([(key: String, node: EncodedNode)])
    case array([EncodedNode])
    case tracked(TrackedNode)

    /// The whole JSON as compact bytes (tracked arrays encoded in full), written straight from the nodes.
    func appendCompact(to out: inout [UInt8]) throws {
        switch self {
        case .value(let v): v.appendCompact(to: &out)
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (n, member) in members.enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.appendQuoted(member.key, to: &out)
                out.append(UInt8(ascii: ":"))
                try member.node.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (n, item) in items.enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                try item.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .tracked(let t): try t.materialize().appendCompact(to: &out)
        }
    }

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

/// A tracked array met by a walk: its stamp, and how to encode it whole or describe its changes since a stamp. (A
/// class: a node holds one reference, and every other node stays small.)
final class TrackedNode {
    enum Change {
        case set(Int, JSONValue)
        case insert(Int, JSONValue)
        case remove(Int)
    }
    let stamp: UInt64
    let materialize: () throws -> JSONValue
    /// The changes since the content named by a stamp, encoded; nil when the log does not reach back to it.
    let changes: (UInt64) throws -> [Change]?

    init(stamp: UInt64, materialize: @escaping () throws -> JSONValue,
         changes: @escaping (UInt64) throws -> [Change]?) {
        self.stamp = stamp
        self.materialize = materialize
        self.changes = changes
    }
}

/// The encoder a walk hands to `encode(to:)`: builds an `EncodedNode`. A walker is also the builder of the object or
/// array encoded into it (its members or elements; a nested container is a walker of its own), so encoding a struct
/// of scalars makes one walker, one array of members and the container box Swift's Codable needs.
///
/// Its coding path is made only when something asks for it (an error, a nested value that is not a plain number
/// or string): a walk over a state of scalars builds no path arrays.
final class ValueWalker: Encoder {
    enum Kind {
        case none
        case node(EncodedNode)
        case object
        case array
    }

    /// The path of the value that contains this one, and this value's key in it (nil at the root).
    let parentPath: [any CodingKey]
    let key: (any CodingKey)?
    @exclusivity(unchecked) private var path: [any CodingKey]?
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    /// Whether tracked arrays are recorded as tracked nodes (delta encoding) rather than encoded.
    let tracking: Bool
    // Unchecked: a walker is used by one walk on one thread (dynamic exclusivity checks were 1% of a store's CPU).
    @exclusivity(unchecked) var kind = Kind.none
    /// An object's members in the order they came (a later value for a key replaces an earlier one, as in a
    /// dictionary), or an array's elements (keys unused). A member that is a nested container or encoder holds a
    /// placeholder here until `result()`, and its walker is in `nested`.
    @exclusivity(unchecked) var members: [(key: String, node: EncodedNode)] = []
    @exclusivity(unchecked) var nested: [(index: Int, walker: ValueWalker)] = []

    init(parentPath: [any CodingKey], key: (any CodingKey)?, tracking: Bool) {
        self.parentPath = parentPath
        self.key = key
        self.tracking = tracking
    }

    var codingPath: [any CodingKey] {
        if let path { return path }
        let made = key.map { parentPath + [$0] } ?? parentPath
        path = made
        return made
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .object = kind {} else {
            kind = .object
            members = []
            members.reserveCapacity(4)  // a struct's few fields without growing the array on the way
            nested = []
        }
        return KeyedEncodingContainer(KeyedWalkerContainer<Key>(owner: self))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .array = kind {} else {
            kind = .array
            members = []
            nested = []
        }
        return UnkeyedWalkerContainer(owner: self)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleWalkerContainer(walker: self) }

    @inline(__always)
    func put(_ key: String, _ node: EncodedNode) { members.append((key, node)) }

    /// A walker for a nested container or encoder at `key` (an object's member, or the next element).
    func putNested(_ key: String, codingKey: any CodingKey) -> ValueWalker {
        let w = ValueWalker(parentPath: codingPath, key: codingKey, tracking: tracking)
        nested.append((members.count, w))
        members.append((key, .value(.null)))
        return w
    }

    /// The nested walker put last for `key` (to add to a nested container asked for twice).
    func existingNested(_ key: String) -> ValueWalker? {
        guard let i = members.lastIndex(where: { $0.key == key }) else { return nil }
        return nested.last { $0.index == i }?.walker
    }

    func recordTracked<E: Encodable>(_ array: TrackedArray<E>) {
        let tracking = self.tracking, path = codingPath
        let encodeElement: (E, Int) throws -> JSONValue = { e, i in
            try ValueWalker.encode(e, parentPath: path, key: IndexKey(i), tracking: tracking).materialize()
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
        kind = .node(.tracked(node))
    }

    /// What was encoded (an object when nothing was, as Foundation does for a nested value). Objects have their
    /// members sorted by key, the last value of a repeated key kept.
    func result() -> EncodedNode {
        switch kind {
        case .none: return .object([])
        case .node(let n): return n
        case .object, .array:
            for (i, w) in nested { members[i].node = w.result() }
            nested = []
            if case .array = kind { return .array(members.map(\.node)) }
            var ordered = true
            if members.count > 1 {
                for i in 1..<members.count where !(members[i - 1].key < members[i].key) {
                    ordered = false
                    break
                }
            }
            if ordered { return .object(members) }
            let order = members.indices.sorted { a, b in
                members[a].key < members[b].key || (members[a].key == members[b].key && a < b)
            }
            var out: [(key: String, node: EncodedNode)] = []
            out.reserveCapacity(members.count)
            for i in order {
                if let last = out.last, last.key == members[i].key {
                    out[out.count - 1] = members[i]
                } else {
                    out.append(members[i])
                }
            }
            return .object(out)
        }
    }

    /// Encodes one value at `codingPath`.
    static func encode<T: Encodable>(_ value: T, codingPath: [any CodingKey], tracking: Bool) throws -> EncodedNode {
        try encode(value, parentPath: codingPath, key: nil, tracking: tracking)
    }

    /// Encodes one value (the special cases of Foundation's JSONEncoder first, recognised as Foundation does: by the
    /// static type, which is a compare of two pointers where a dynamic cast per case was a call into the runtime).
    static func encode<T: Encodable>(_ value: T, parentPath: [any CodingKey], key: (any CodingKey)?,
                                     tracking: Bool) throws -> EncodedNode {
        if T.self == String.self { return .value(.string(unsafeBitCast(value, to: String.self))) }
        if T.self == Int.self { return .value(.number(String(unsafeBitCast(value, to: Int.self)))) }
        if T.self == Bool.self { return .value(.bool(unsafeBitCast(value, to: Bool.self))) }
        if T.self == Double.self {
            return .value(try number(unsafeBitCast(value, to: Double.self), key.map { parentPath + [$0] } ?? parentPath))
        }
        if T.self == Data.self { return .value(.string(unsafeBitCast(value, to: Data.self).base64EncodedString())) }
        if T.self == URL.self { return .value(.string(unsafeBitCast(value, to: URL.self).absoluteString)) }
        if T.self == Decimal.self { return .value(.number(unsafeBitCast(value, to: Decimal.self).description)) }
        let walker = ValueWalker(parentPath: parentPath, key: key, tracking: tracking)
        try value.encode(to: walker)
        return walker.result()
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

/// An array index as a coding key (its text made only when asked for).
struct IndexKey: CodingKey {
    let index: Int
    var stringValue: String { String(index) }
    var intValue: Int? { index }
    init(_ i: Int) { index = i }
    init?(stringValue: String) {
        guard let i = Int(stringValue) else { return nil }
        index = i
    }
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
    /// The walker of the object: it holds the members, and its path is this container's.
    let owner: ValueWalker
    var codingPath: [any CodingKey] { owner.codingPath }

    @inline(__always)
    func put(_ v: JSONValue, _ key: Key) { owner.put(key.stringValue, .value(v)) }

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
        owner.put(key.stringValue, try ValueWalker.encode(value, parentPath: owner.codingPath, key: key,
                                                           tracking: owner.tracking))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let w = owner.existingNested(key.stringValue) ?? owner.putNested(key.stringValue, codingKey: key)
        return w.container(keyedBy: NestedKey.self)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let w = owner.existingNested(key.stringValue) ?? owner.putNested(key.stringValue, codingKey: key)
        return w.unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { owner.putNested(SuperKey().stringValue, codingKey: SuperKey()) }

    mutating func superEncoder(forKey key: Key) -> any Encoder { owner.putNested(key.stringValue, codingKey: key) }
}

struct UnkeyedWalkerContainer: UnkeyedEncodingContainer {
    /// The walker of the array: it holds the elements, and its path is this container's.
    let owner: ValueWalker
    var codingPath: [any CodingKey] { owner.codingPath }
    var count: Int { owner.members.count }

    @inline(__always)
    func put(_ v: JSONValue) { owner.put("", .value(v)) }
    var nextPath: [any CodingKey] { codingPath + [IndexKey(count)] }

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
        owner.put("", try ValueWalker.encode(value, parentPath: owner.codingPath, key: IndexKey(count),
                                              tracking: owner.tracking))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        owner.putNested("", codingKey: IndexKey(count)).container(keyedBy: NestedKey.self)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        owner.putNested("", codingKey: IndexKey(count)).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { owner.putNested("", codingKey: IndexKey(count)) }
}

struct SingleWalkerContainer: SingleValueEncodingContainer {
    let walker: ValueWalker
    var codingPath: [any CodingKey] { walker.codingPath }

    func put(_ v: JSONValue) { walker.kind = .node(.value(v)) }

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
        walker.kind = .node(try ValueWalker.encode(value, parentPath: walker.parentPath, key: walker.key,
                                                   tracking: walker.tracking))
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
