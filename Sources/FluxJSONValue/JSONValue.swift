// FluxJSONValue: JSON as a tool sees it. Any value, object members kept in the order the sender wrote them and
// numbers kept as their exact text, so a state printed by fluxctl shows the bytes the store sent, reformatted,
// never reordered or rounded; compact and pretty printers; RFC 6901 pointers; a path-level diff (JSON Patch
// operations plus the old values). fluxctl's `state`, `watch` and `--json` output use it, and the large-state
// work will build its patches on it.
//
// Why not Foundation's JSONSerialization: it parses into `NSDictionary`/`NSNumber`, which loses the member order
// (a Python or Node store's state would print in hash order and `watch` diffs would list changes in a random
// order) and rewrites numbers (`1.0` becomes `1`, `12345678901234567890` is rounded). So this module builds its own
// tree. It does not have a JSON grammar of its own, though: every text is first validated by FluxCore's envelope
// scanner (`Envelope(body:)`, the one fluxd checks frames with: RFC 8259, UTF-8, escapes, surrogate pairs, depth
// 64, no trailing bytes), which also says where invalid input goes wrong; the tree is then read from bytes known
// to be valid, which needs no error handling at all.

import FluxCore
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Any JSON value. Object members keep their order (and duplicates: `subscript(key)` returns the last one, as
/// most parsers do); numbers keep their text.
public enum JSONValue: Equatable, Sendable {
    case null
    case bool(Bool)
    /// A number as its JSON text (`1`, `-0.5`, `1e300`).
    case number(String)
    case string(String)
    case array([JSONValue])
    /// Members in their order.
    case object([(key: String, value: JSONValue)])

    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return x == y
        case (.string(let x), .string(let y)): return sameKey(x, y)
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { sameKey($0.key, $1.key) && $0.value == $1.value }
        default: return false
        }
    }

    /// The member `key` of an object (the last one if the key repeats); nil for other values.
    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members.last { sameKey($0.key, key) }?.value }
        return nil
    }

    /// The element at `index` of an array; nil for other values or out of range.
    public subscript(index: Int) -> JSONValue? {
        if case .array(let items) = self, items.indices.contains(index) { return items[index] }
        return nil
    }

    /// The string, when this is one.
    public var stringValue: String? { if case .string(let s) = self { return s } else { return nil } }
    /// The number as an `Int`, when this is a number written as an integer that fits.
    public var intValue: Int? { if case .number(let n) = self { return Int(n) } else { return nil } }
    /// The boolean, when this is one.
    public var boolValue: Bool? { if case .bool(let b) = self { return b } else { return nil } }
    /// The elements, when this is an array.
    public var arrayValue: [JSONValue]? { if case .array(let items) = self { return items } else { return nil } }
    /// The members, when this is an object.
    public var objectValue: [(key: String, value: JSONValue)]? {
        if case .object(let members) = self { return members } else { return nil }
    }
    /// Whether this is `null`.
    public var isNull: Bool { if case .null = self { return true } else { return false } }
}

/// Whether two keys (or strings) are the same JSON text: compared by their Unicode scalars (UTF-8 bytes), not by
/// Swift's canonical equivalence, under which "é" and "e" + U+0301 are equal although JSON has them as two
/// different keys.
/// (Native strings are compared as contiguous bytes: the generic `elementsEqual` over two `UTF8View`s went byte by
/// byte through index arithmetic, and the delta encoder compares every string of a state on every change.)
@inline(__always)
public func sameKey(_ a: String, _ b: String) -> Bool {
    let x = a.utf8, y = b.utf8
    guard x.count == y.count else { return false }
    let fast = x.withContiguousStorageIfAvailable { p in
        y.withContiguousStorageIfAvailable { q in
            p.count == 0 || memcmp(p.baseAddress!, q.baseAddress!, p.count) == 0
        }
    }
    if let fast, let result = fast { return result }
    return x.elementsEqual(y)
}
