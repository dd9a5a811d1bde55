import FluxJSONValue
import Foundation
import Testing

// The byte writers behind the store's patches (issue 16, the SDK's cost for a small state): `compactBytes` written as
// bytes, the delta encoder writing its patch while it compares (pointer escaping, JSON string escaping), and the
// walker's objects (members out of key order, a key written twice, nested containers, super encoders) against
// Foundation's JSONEncoder.

/// Keys that need escaping in a JSON Pointer (`~`, `/`), in a JSON string (`"`, `\`, control characters), or are
/// not ASCII, or are empty.
let awkwardKeys = ["", "a/b", "t~x", "~1", "/~0/", "q\"k", "back\\slash", "ctl\u{1}x", "tab\tnl\n", "é", "e\u{301}",
                   "日本", "🙂", "del\u{7F}", "plain"]

struct Awkward: Codable, Equatable {
    var map: [String: String] = [:]
    var nested: [String: [String: Int]] = [:]
    var list: [String] = []
}

/// Writes its members out of key order, one key twice (the later value counts), a nested container asked for twice
/// under one key, a nested unkeyed container and a super encoder.
struct Unordered: Encodable {
    var z: Int
    var a: String
    var inner: Int

    enum Keys: String, CodingKey { case z, a, m, inner, list, parent }
    enum InnerKeys: String, CodingKey { case x, y }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(z, forKey: .z)
        try c.encode("first", forKey: .a)
        try c.encode(a, forKey: .a)
        try c.encode(true, forKey: .m)
        var n1 = c.nestedContainer(keyedBy: InnerKeys.self, forKey: .inner)
        try n1.encode(inner, forKey: .y)
        var n2 = c.nestedContainer(keyedBy: InnerKeys.self, forKey: .inner)
        try n2.encode(inner + 1, forKey: .x)
        var l = c.nestedUnkeyedContainer(forKey: .list)
        try l.encode(z)
        var ln = l.nestedContainer(keyedBy: InnerKeys.self)
        try ln.encode(a, forKey: .x)
        try l.encodeNil()
        let parent = c.superEncoder(forKey: .parent)
        var pc = parent.singleValueContainer()
        try pc.encode(inner * 2)
    }
}

@Suite("FluxJSONValue: the byte writers of the store's patches")
struct DeltaWriterTests {
    @Test("compactBytes is compact's UTF-8, byte for byte (every control character, quotes, backslashes, non-ASCII)")
    func compactBytesMatchCompact() throws {
        var strings = awkwardKeys
        strings.append(String(decoding: (0..<128).map { UInt8($0) }, as: UTF8.self))
        var g = SplitMix(state: 7)
        for _ in 0..<200 {
            let scalars = (0..<Int.random(in: 0...12, using: &g)).map { _ -> Character in
                let pick = Int.random(in: 0...3, using: &g)
                let v: UInt32 = pick == 0 ? UInt32.random(in: 0...0x1F, using: &g)
                    : pick == 1 ? UInt32.random(in: 0x20...0x7F, using: &g)
                    : pick == 2 ? UInt32.random(in: 0xA0...0x2FFF, using: &g) : UInt32.random(in: 0x1F300...0x1F64F, using: &g)
                return Character(Unicode.Scalar(v)!)
            }
            strings.append(String(scalars))
        }
        for s in strings {
            let value = JSONValue.object([(s, .array([.string(s), .number("1.5"), .bool(true), .null, .object([])]))])
            #expect(value.compactBytes == Array(value.compact.utf8), "\(s.debugDescription)")
            // And it reads back as the same value.
            #expect(try JSONValue(parsing: value.compactBytes) == value)
        }
    }

    @Test("JSONDeltaEncoder: keys that need escaping, in the pointer and in the JSON string, apply to the previous JSON")
    func awkwardKeysDifferential() throws {
        var g = SplitMix(state: 11)
        var model = Awkward()
        var delta = JSONDeltaEncoder()
        try delta.setBaseline(model)
        var json = try foundationJSON(model)
        for step in 0..<300 {
            let key = awkwardKeys[Int.random(in: 0..<awkwardKeys.count, using: &g)]
            let other = awkwardKeys[Int.random(in: 0..<awkwardKeys.count, using: &g)]
            switch Int.random(in: 0...5, using: &g) {
            case 0: model.map[key] = other
            case 1: model.map[key] = nil
            case 2: model.nested[key, default: [:]][other] = Int.random(in: 0...3, using: &g)
            case 3: model.nested[key]?[other] = nil
            case 4: model.list.append(key)
            default: if !model.list.isEmpty { model.list.remove(at: Int.random(in: 0..<model.list.count, using: &g)) }
            }
            let change = try #require(try delta.change(to: model))
            let expected = try foundationJSON(model)
            let applied = try testApply(change.operations, to: json)
            #expect(jsonEqual(applied, expected), "step \(step): \(String(decoding: change.bytes, as: UTF8.self))")
            #expect(change.operations.count == change.count)
            #expect(change.isEmpty == (change.count == 0))
            if change.isEmpty { #expect(jsonEqual(json, expected)) }
            delta.commit(change)
            json = applied
        }
    }

    @Test("the walker's objects: members out of key order, a key written twice, nested containers and super encoders, as Foundation writes them")
    func unorderedMembers() throws {
        for (z, a, inner) in [(3, "b", 1), (-1, "é\"\\", 40), (0, "", 0)] {
            let value = Unordered(z: z, a: a, inner: inner)
            #expect(jsonEqual(try JSONValueEncoder().encode(value), try foundationJSON(value)))
            // The delta encoder sees the same tree: a change of one member is one replace.
            var delta = JSONDeltaEncoder()
            try delta.setBaseline(value)
            let change = try #require(try delta.change(to: Unordered(z: z, a: a + "!", inner: inner)))
            #expect(change.count == 2, "\(String(decoding: change.bytes, as: UTF8.self))")  // /a and /list/1/x
            #expect(try delta.change(to: value)?.isEmpty == true)
        }
    }
}
