// JSONTree: fluxd's retained state as a tree that patches change in O(log n) per operation (SPEC §16.5). Arrays and
// object member lists are `SummedTree`s; objects with more than `JSONTree.indexThreshold` members also keep a hash
// index keyed by key *bytes* (SPEC §3.2: keys are compared code point by code point, never by Unicode
// equivalence; Swift's `String ==` and `String.hashValue` would make "\u00e9" and "e\u0301" one key). Scalars and
// keys are kept as the JSON text fluxd renders (SPEC §16.3's rendering), so rendering is a copy of bytes and the
// rendered size of any subtree is known in O(1): a patch's result is measured and depth-checked before it is
// accepted, and a `copy` shares the copied subtree (charged at its full size by the caller).
//
// JSONValue stays the general-purpose value (fluxctl, the SDKs); this type is what fluxd keeps and patches.

import FluxCore
import HashTreeCollections

/// A JSON value kept for patching: see the file's comment. Value semantics, copy on write per node.
public enum JSONTree: Sendable {
    /// `null`, `true`, `false`, a number as written, or a string as rendered JSON text (quotes included).
    case scalar(String)
    /// Elements in order.
    case array(SummedTree<JSONTree>)
    /// Members in the order they were added, and (above `indexThreshold` members) an index from key to member.
    case object(ObjectMembers)

    /// Objects with more members than this keep a hash index; smaller ones are searched member by member.
    public static let indexThreshold = 16

    /// The empty object.
    public static var emptyObject: JSONTree { .object(ObjectMembers()) }
}

/// A member of a `JSONTree` object: its key as rendered JSON text (quotes included), its value, and the stamp that
/// orders it (members added later get larger stamps; a replaced value keeps its member's).
public struct TreeMember: SummedItem, Sendable {
    public var seq: UInt64
    public var key: String
    public var value: JSONTree

    public var summedBytes: Int { TreeSummary.sum(key.utf8.count + 1, value.summedBytes) }
    public var summedHeight: Int { value.summedHeight }
    public var summedSeq: UInt64 { seq }
}

/// A key compared and hashed by its bytes (never by Unicode canonical equivalence).
public struct MemberKey: Hashable, Sendable {
    /// The key as rendered JSON text (a canonical rendering: equal keys have equal text).
    public var text: String

    public init(text: String) { self.text = text }

    public static func == (a: MemberKey, b: MemberKey) -> Bool { sameKey(a.text, b.text) }

    public func hash(into hasher: inout Hasher) {
        var text = text
        text.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

/// An object's members: the ordered list, and the index from key to member stamp once the object is large.
public struct ObjectMembers: Sendable {
    public var list = SummedTree<TreeMember>()
    /// Nil while the object is small (searched member by member); else one entry per key. Boxed, so a small
    /// object's value stays two words (most of a state's objects are small).
    var index: KeyIndex?

    /// The hash index of a large object, shared by copies until one changes it.
    final class KeyIndex: @unchecked Sendable {
        var map: TreeDictionary<MemberKey, UInt64>
        init(_ map: TreeDictionary<MemberKey, UInt64>) { self.map = map }
    }

    public init() {}

    /// Members, in order; a repeated key keeps its last value, at its last place (SPEC §3.2: senders MUST NOT repeat
    /// keys; fluxd keeps what a parser that takes the last one sees).
    init(members: [(key: String, value: JSONTree)]) {
        var kept = members
        if members.count > 1 {
            var seen = Set<MemberKey>()
            var unique: [(key: String, value: JSONTree)] = []
            for member in members.reversed() where seen.insert(MemberKey(text: member.key)).inserted {
                unique.append(member)
            }
            if unique.count != members.count { kept = unique.reversed() }
        }
        var seq: UInt64 = 0
        list = SummedTree(kept.map { seq += 1; return TreeMember(seq: seq, key: $0.key, value: $0.value) })
        if kept.count > JSONTree.indexThreshold { buildIndex() }
    }

    public var count: Int { list.count }

    mutating func buildIndex() {
        var map = TreeDictionary<MemberKey, UInt64>()
        list.forEach { map[MemberKey(text: $0.key)] = $0.seq }
        index = KeyIndex(map)
    }

    /// Changes the index in place, copying the box (not the map, which shares its nodes) when it is shared.
    private mutating func changeIndex(_ body: (inout TreeDictionary<MemberKey, UInt64>) -> Void) {
        guard index != nil else { return }
        if !isKnownUniquelyReferenced(&index!) { index = KeyIndex(index!.map) }
        body(&index!.map)
    }

    /// The position of the member whose key is `key` (rendered text), or nil; `steps` counts the nodes visited.
    func position(of key: String, steps: inout Int) -> Int? {
        guard let index else {
            // Small: one leaf, searched from the end (the last of a repeated key, as everywhere).
            guard list.root.isLeaf else { return nil }
            steps += 1
            let items = list.root.items
            var i = items.count - 1
            while i >= 0 {
                if sameKey(items[i].key, key) { return i }
                i -= 1
            }
            return nil
        }
        steps += 1 + list.levels
        guard let seq = index.map[MemberKey(text: key)] else { return nil }
        return list.position(ofSeq: seq)
    }

    /// Adds a new member at the end.
    mutating func append(key: String, value: JSONTree) {
        let seq = list.summary.maxSeq + 1
        list.append(TreeMember(seq: seq, key: key, value: value))
        if index != nil {
            changeIndex { $0[MemberKey(text: key)] = seq }
        } else if list.count > JSONTree.indexThreshold {
            buildIndex()
        }
    }

    /// Removes the member at `position`.
    @discardableResult
    mutating func remove(at position: Int) -> TreeMember {
        let member = list.remove(at: position)
        changeIndex { $0[MemberKey(text: member.key)] = nil }
        return member
    }
}

extension JSONTree: SummedItem {
    /// Rendered size in bytes (O(1)).
    public var summedBytes: Int {
        switch self {
        case .scalar(let text): return text.utf8.count
        case .array(let items): return Self.containerBytes(items.summary)
        case .object(let members): return Self.containerBytes(members.list.summary)
        }
    }

    @inline(__always)
    static func containerBytes(_ s: TreeSummary) -> Int {
        TreeSummary.sum(s.bytes, 2 + max(0, s.count - 1))
    }

    /// Nesting levels as SPEC §3.2 counts them (each array or object a level, scalars none) (O(1)).
    public var summedHeight: Int {
        switch self {
        case .scalar: return 0
        case .array(let items): return 1 + items.summary.height
        case .object(let members): return 1 + members.list.summary.height
        }
    }

    public var summedSeq: UInt64 { 0 }

    /// The rendered size in bytes.
    public var byteCount: Int { summedBytes }
    /// The nesting depth (`{"a":[[1]]}` is 3, a scalar 0).
    public var depth: Int { summedHeight }
}

// MARK: - Building

extension JSONTree {
    /// The tree of bytes FluxCore's scanner has accepted as one JSON value (a field of a scanned frame, or a
    /// retained state). Precondition: `bytes` is valid JSON.
    public init(scanned bytes: ArraySlice<UInt8>) {
        var reader = ValidJSONReader(bytes: bytes)
        self = reader.tree()
    }

    /// The tree of JSON text, validated first (FluxCore's scanner, depth 64).
    public init<Bytes: Collection>(parsing bytes: Bytes) throws(JSONParseError) where Bytes.Element == UInt8 {
        // Validated by the one scanner, then read from the known-valid bytes.
        self.init(scanned: try JSONValue.validated(bytes, maxDepth: 64)[...])
    }

    /// The tree of a `JSONValue` (strings and keys rendered as fluxd renders them).
    public init(_ value: JSONValue) {
        switch value {
        case .null: self = .scalar("null")
        case .bool(let b): self = .scalar(b ? "true" : "false")
        case .number(let n): self = .scalar(n)
        case .string(let s): self = .scalar(Self.quoted(s))
        case .array(let items): self = .array(SummedTree(items.map(JSONTree.init)))
        case .object(let members):
            self = .object(ObjectMembers(members: members.map { (Self.quoted($0.key), JSONTree($0.value)) }))
        }
    }

    /// A string as fluxd renders it (JSON text, quotes included).
    public static func quoted(_ s: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count + 2)
        JSONValue.appendQuoted(s, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The value as a `JSONValue` (for tools and tests; fluxd renders with `appendCompact`).
    public var jsonValue: JSONValue {
        var reader = ValidJSONReader(bytes: compactBytes[...])
        return reader.value()
    }
}

extension ValidJSONReader {
    /// The value at `i` as a `JSONTree` (strings re-rendered as fluxd renders them, numbers as written).
    mutating func tree() -> JSONTree {
        skipSpace()
        switch bytes[i] {
        case UInt8(ascii: "{"):
            i += 1
            var members: [(key: String, value: JSONTree)] = []
            skipSpace()
            if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(ObjectMembers()) }
            while true {
                skipSpace()
                let key = renderedString()
                skipSpace()
                i += 1  // ':'
                members.append((key, tree()))
                skipSpace()
                let separator = bytes[i]
                i += 1
                if separator == UInt8(ascii: "}") { return .object(ObjectMembers(members: members)) }
            }
        case UInt8(ascii: "["):
            i += 1
            var items: [JSONTree] = []
            skipSpace()
            if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(SummedTree()) }
            while true {
                items.append(tree())
                skipSpace()
                let separator = bytes[i]
                i += 1
                if separator == UInt8(ascii: "]") { return .array(SummedTree(items)) }
            }
        case UInt8(ascii: "\""):
            return .scalar(renderedString())
        case UInt8(ascii: "t"):
            i += 4
            return .scalar("true")
        case UInt8(ascii: "f"):
            i += 5
            return .scalar("false")
        case UInt8(ascii: "n"):
            i += 4
            return .scalar("null")
        default:
            let start = i
            while i < end, isNumberByte(bytes[i]) { i += 1 }
            return .scalar(String(decoding: bytes[start..<i], as: UTF8.self))
        }
    }

    /// The string token at `i` as fluxd renders it: as written when it has no escape (a valid token without one is
    /// already canonical), else decoded and rendered again.
    mutating func renderedString() -> String {
        let token = stringToken()
        if !token.contains(UInt8(ascii: "\\")) { return String(decoding: token, as: UTF8.self) }
        return JSONTree.quoted(decodeJSONString(token))
    }
}

// MARK: - Rendering and reading

extension JSONTree {
    /// Appends the compact rendering (SPEC §16.3) to `out`: linear in what it writes.
    public func appendCompact(to out: inout [UInt8]) {
        switch self {
        case .scalar(let text):
            var text = text
            text.withUTF8 { out.append(contentsOf: $0) }
        case .array(let items):
            out.append(UInt8(ascii: "["))
            var first = true
            items.forEach { item in
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                item.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            var first = true
            members.list.forEach { member in
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                var key = member.key
                key.withUTF8 { out.append(contentsOf: $0) }
                out.append(UInt8(ascii: ":"))
                member.value.appendCompact(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// The compact rendering as bytes (allocated once, at its known size).
    public var compactBytes: [UInt8] {
        // Written through a cursor into storage of the size the summaries give (one copy per key and scalar, no
        // per-append capacity checks: 3-4x `appendCompact`'s speed on a state of small objects). Every write is
        // checked against the end; should the size ever disagree, the rendering is made the checked way.
        let size = byteCount
        var fits = true
        let bytes = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            var cursor = Cursor(start: buffer.baseAddress, end: buffer.baseAddress.map { $0 + size })
            fits = writeCompact(&cursor) && cursor.start.map { $0 == buffer.baseAddress! + size } ?? (size == 0)
            count = fits ? size : 0
        }
        if fits { return bytes }
        var out: [UInt8] = []
        out.reserveCapacity(size)
        appendCompact(to: &out)
        return out
    }

    /// Where the next byte of a rendering goes, and where its storage ends.
    struct Cursor {
        var start: UnsafeMutablePointer<UInt8>?
        let end: UnsafeMutablePointer<UInt8>?

        @inline(__always)
        mutating func put(_ byte: UInt8) -> Bool {
            guard let p = start, p < end! else { return false }
            p.pointee = byte
            start = p + 1
            return true
        }

        @inline(__always)
        mutating func put(_ text: String) -> Bool {
            // (Read in place: a native string's UTF-8 needs no copy of the string, nor a retain of it.)
            if let fits = text.utf8.withContiguousStorageIfAvailable({ put($0) }) { return fits }
            var text = text
            return text.withUTF8 { put($0) }
        }

        @inline(__always)
        mutating func put(_ utf8: UnsafeBufferPointer<UInt8>) -> Bool {
            guard let p = start, end! - p >= utf8.count else { return false }
            if let base = utf8.baseAddress { p.update(from: base, count: utf8.count) }
            start = p + utf8.count
            return true
        }
    }

    /// The compact rendering through `cursor`; false when it would pass the storage's end.
    func writeCompact(_ cursor: inout Cursor) -> Bool {
        switch self {
        case .scalar(let text):
            return cursor.put(text)
        case .array(let items):
            guard cursor.put(UInt8(ascii: "[")) else { return false }
            var first = true, fits = true
            items.forEach { item in
                guard fits else { return }
                if !first { fits = cursor.put(UInt8(ascii: ",")) }
                first = false
                fits = fits && item.writeCompact(&cursor)
            }
            return fits && cursor.put(UInt8(ascii: "]"))
        case .object(let members):
            guard cursor.put(UInt8(ascii: "{")) else { return false }
            var first = true, fits = true
            members.list.forEach { member in
                guard fits else { return }
                if !first { fits = cursor.put(UInt8(ascii: ",")) }
                first = false
                fits = fits && cursor.put(member.key) && cursor.put(UInt8(ascii: ":")) && member.value.writeCompact(&cursor)
            }
            return fits && cursor.put(UInt8(ascii: "}"))
        }
    }

    /// The value at `tokens` (a pointer's unescaped tokens), or nil when there is none. O(tokens · log n).
    public func value(at tokens: [String]) -> JSONTree? {
        var steps = 0
        return try? value(at: tokens[...], all: tokens, steps: &steps)
    }

    /// The value at `tokens`, or a `not-found` / `index` error as JSON Patch reports it.
    func value(at tokens: ArraySlice<String>, all: [String], steps: inout Int) throws(JSONPatchError) -> JSONTree {
        var current = self
        var k = all.count - tokens.count
        for token in tokens {
            switch current {
            case .object(let members):
                guard let p = members.position(of: Self.quoted(token), steps: &steps) else {
                    throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist")
                }
                current = members.list[p].value
            case .array(let items):
                steps += items.levels
                let index = try JSONTree.index(token, count: items.count, at: all, k)
                current = items[index]
            case .scalar:
                throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist: its parent is not an object or array")
            }
            k += 1
        }
        return current
    }

    /// An existing element's index: digits, no leading zero, below `count`.
    static func index(_ token: String, count: Int, at tokens: [String], _ k: Int) throws(JSONPatchError) -> Int {
        guard let index = JSONValue.arrayIndex(token) else {
            throw JSONPatchError(.index, "\(JSONPointer(tokens: Array(tokens[...k]))): \"\(token)\" is not an array index")
        }
        guard index < count else {
            throw JSONPatchError(.index, "\(JSONPointer(tokens: Array(tokens[...k]))): index \(index) is out of range (\(count) elements)")
        }
        return index
    }

    /// JSON equality with a patch's value (RFC 6902 §4.6, as `JSONValue.jsonEquals`): numbers by value, objects
    /// as sets of members, arrays in order. Costs at most what `expected` holds (each member looked up by key).
    func jsonEquals(_ expected: JSONValue, steps: inout Int) -> Bool {
        steps += 1
        switch (self, expected) {
        case (.scalar(let text), _):
            switch expected {
            case .array, .object: return false
            default:
                var reader = ValidJSONReader(bytes: Array(text.utf8)[...])
                return reader.value().jsonEquals(expected)
            }
        case (.array(let items), .array(let other)):
            guard items.count == other.count else { return false }
            var i = 0
            var equal = true
            items.forEach { item in
                if equal, !item.jsonEquals(other[i], steps: &steps) { equal = false }
                i += 1
            }
            return equal
        case (.object(let members), .object(let other)):
            // Distinct keys of `expected` (the last of a repeated one counts, as in `JSONValue.jsonEquals`).
            var seen = Set<MemberKey>()
            var distinct = 0
            for member in other.reversed() {
                let key = MemberKey(text: Self.quoted(member.key))
                guard seen.insert(key).inserted else { continue }
                distinct += 1
                guard distinct <= members.count,
                      let p = members.position(of: key.text, steps: &steps),
                      members.list[p].value.jsonEquals(member.value, steps: &steps) else { return false }
            }
            return distinct == members.count
        default:
            return false
        }
    }
}

extension SummedTree where Item == JSONTree {
    /// The elements as `JSONValue`s.
    public var values: [JSONValue] { array.map(\.jsonValue) }
}
