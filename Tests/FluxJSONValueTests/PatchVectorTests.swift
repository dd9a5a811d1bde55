import Foundation
import Testing
@testable import FluxJSONValue

/// protocol/vectors/patch.json (SPEC §16.1): the shared JSON Patch and JSON Pointer cases, run through
/// `JSONValue.apply(_:)` (the one implementation fluxd and the Swift SDKs use), `JSONPointer`, and `diffPatch`.
@Suite("FluxJSONValue: JSON Patch vectors")
struct PatchVectorTests {
    static let file: JSONValue = {
        let url = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("protocol/vectors/patch.json")
        do { return try JSONValue(parsing: Array(try Data(contentsOf: url)), maxDepth: 128) }
        catch { fatalError("cannot read protocol/vectors/patch.json: \(error)") }
    }()

    static func cases(_ section: String) -> [JSONValue] { file[section]?.arrayValue ?? [] }

    @Test("the file has every section and every error category")
    func fileIsComplete() {
        #expect(Self.cases("apply").count >= 100)
        #expect(Self.cases("pointers").count >= 20)
        #expect(Self.cases("diffs").count >= 20)
        let categories = Set(Self.cases("apply").compactMap { $0["error"]?.stringValue })
        for kind in ["invalid-op", "invalid-pointer", "not-found", "index", "move-into-child", "test-failed", "too-deep"] {
            #expect(categories.contains(kind), "no apply case of category \(kind)")
        }
    }

    @Test("apply: results equal the expected documents; failures leave the document as it was")
    func apply() throws {
        var failures: [String] = []
        for c in Self.cases("apply") {
            let comment = c["comment"]?.stringValue ?? "?"
            let doc = try #require(c["doc"])
            var value = doc
            do {
                let patch = try JSONPatch(try #require(c["patch"]))
                if let bytes = c["patch"]?.compactBytes, (try? JSONPatch(scanned: bytes[...])) != patch {
                    failures.append("\(comment): JSONPatch(scanned:) read the patch otherwise")
                }
                try value.apply(patch)
                if let expected = c["expected"] {
                    if !value.jsonEquals(expected) { failures.append("\(comment): got \(value.compact), expected \(expected.compact)") }
                } else {
                    failures.append("\(comment): applied (\(value.compact)), expected error \(c["error"]?.compact ?? "?")")
                }
            } catch let error as JSONPatchError {
                if c["expected"] != nil {
                    failures.append("\(comment): failed (\(error)), expected \(c["expected"]!.compact)")
                } else if value != doc {
                    failures.append("\(comment): failed but changed the document to \(value.compact)")
                } else if let kind = c["error"]?.stringValue, kind != error.kind.rawValue {
                    failures.append("\(comment): failed as \(error.kind.rawValue), the vectors say \(kind) (\(error))")
                }
            }
        }
        #expect(failures.isEmpty, Comment(rawValue: "\(failures.count) cases:\n" + failures.joined(separator: "\n")))
    }

    @Test("pointers: resolve to the expected value, or fail")
    func pointers() throws {
        var failures: [String] = []
        for c in Self.cases("pointers") {
            let comment = c["comment"]?.stringValue ?? "?"
            let doc = try #require(c["doc"])
            let text = try #require(c["pointer"]?.stringValue)
            do {
                let pointer = try JSONPointer(parsing: text)
                let found = try doc.value(at: pointer.tokens)
                if let expected = c["value"] {
                    if !found.jsonEquals(expected) { failures.append("\(comment): got \(found.compact)") }
                } else {
                    failures.append("\(comment): resolved to \(found.compact), expected an error")
                }
                if pointer.description != text { failures.append("\(comment): written back as \(pointer)") }
            } catch {
                if c["value"] != nil { failures.append("\(comment): failed (\(error))") }
            }
        }
        #expect(failures.isEmpty, Comment(rawValue: "\(failures.count) cases:\n" + failures.joined(separator: "\n")))
    }

    @Test("diffs: applying diffPatch(from, to) to from gives to")
    func diffs() throws {
        var failures: [String] = []
        for c in Self.cases("diffs") {
            let comment = c["comment"]?.stringValue ?? "?"
            let from = try #require(c["from"]), to = try #require(c["to"])
            let patch = from.diffPatch(to: to)
            do {
                let result = try from.applying(patch)
                if !result.jsonEquals(to) { failures.append("\(comment): got \(result.compact)") }
                if from == to && !patch.isEmpty { failures.append("\(comment): equal documents gave \(patch.json.compact)") }
            } catch {
                failures.append("\(comment): the diff \(patch.json.compact) does not apply: \(error)")
            }
        }
        #expect(failures.isEmpty, Comment(rawValue: "\(failures.count) cases:\n" + failures.joined(separator: "\n")))
    }
}

@Suite("FluxJSONValue: JSON Patch")
struct JSONPatchTests {
    @Test("a change deep in a large array applies in place, and a failing patch leaves the value as it was")
    func inPlaceAndAtomic() throws {
        var todos: [JSONValue] = []
        for i in 0..<1000 {
            todos.append(.object([("id", .number("\(i)")), ("title", .string("t\(i)")), ("done", .bool(false))]))
        }
        var state = JSONValue.object([("todos", .array(todos)), ("nextID", .number("1000"))])
        let before = state
        try state.apply(JSONPatch(parsing: Array(#"[{"op":"replace","path":"/todos/500/done","value":true}]"#.utf8)))
        #expect(state["todos"]?[500]?["done"] == .bool(true))
        #expect(before["todos"]?[500]?["done"] == .bool(false), "the copy taken before is unchanged (value semantics)")
        let after = state
        #expect(throws: JSONPatchError.self) {
            try state.apply(JSONPatch(parsing: Array(#"[{"op":"remove","path":"/todos/0"},{"op":"add","path":"/x","value":1},{"op":"test","path":"/nextID","value":7}]"#.utf8)))
        }
        #expect(state == after)
        #expect(state["todos"]?.arrayValue?.count == 1000)
    }

    @Test("errors name the failing operation and its category")
    func errors() throws {
        var v = try JSONValue(parsing: #"{"a":[1,2]}"#)
        do {
            try v.apply(JSONPatch(parsing: Array(#"[{"op":"add","path":"/a/-","value":3},{"op":"replace","path":"/a/01","value":0}]"#.utf8)))
            Issue.record("applied")
        } catch {
            #expect(error.kind == .index)
            #expect(error.operation == 1)
        }
        #expect(v == (try JSONValue(parsing: #"{"a":[1,2]}"#)))
        #expect(throws: JSONPatchError(.invalidOp, "a patch is a JSON array of operations")) { try JSONPatch(parsing: Array("{}".utf8)) }
    }
}

/// `JSONPatch(scanned:)` (fluxd's and the client's reader: straight from a scanned frame's bytes) against
/// `JSONPatch(parsing:)` (the bytes parsed into a `JSONValue`, then read as operations): the same operations or the
/// same error, for random operation lists written with random spacing, escapes, repeated and unknown members.
@Suite("FluxJSONValue: JSON Patch read from scanned bytes")
struct ScannedPatchTests {
    typealias Rng = SplitMix

    static func space(_ r: inout Rng) -> String { r.pick(["", "", "", " ", "\n ", "\t"]) }

    static func key(_ name: String, _ r: inout Rng) -> String {
        // Now and then with an escape (the same key to a JSON reader).
        if r.below(6) == 0, let first = name.unicodeScalars.first {
            let hex: String = String(first.value, radix: 16)
            let rest: String = String(name.dropFirst())
            return "\"\\u00\(hex)\(rest)\""
        }
        return "\"\(name)\""
    }

    static func value(_ r: inout Rng, depth: Int = 0) -> String {
        switch r.below(depth > 2 ? 5 : 7) {
        case 0: return "null"
        case 1: return r.pick(["true", "false"])
        case 2: return r.pick(["0", "-1.5", "12345678901234567890", "1e3"])
        case 3: return r.pick(["\"x\"", "\"\"", "\"a\\\"b\"", "\"\\u00e9t\\u00e9\"", "\"/todos/1\""])
        case 4: return r.pick(["[]", "{}"])
        case 5:
            var items: [String] = []
            for _ in 0..<r.below(3) {
                let s = space(&r), v = value(&r, depth: depth + 1)
                items.append(s + v)
            }
            return "[" + items.joined(separator: ",") + "]"
        default:
            var members: [String] = []
            for _ in 0..<r.below(3) {
                let k = key(r.pick(["a", "b", "op", "~"]), &r), v = value(&r, depth: depth + 1)
                members.append(k + ":" + v)
            }
            return "{" + members.joined(separator: ",") + "}"
        }
    }

    static func pointer(_ r: inout Rng) -> String {
        r.pick(["\"\"", "\"/\"", "\"/a\"", "\"/a/0\"", "\"/a/-\"", "\"/a~1b\"", "\"/m~0n\"", "\"/x~2\"", "\"a\"",
                "\"/a/b/c\"", "\"/\\u00e9\"", "\"/~\"", "\"//\"", "1", "null", "[\"/a\"]"])
    }

    static func operation(_ r: inout Rng) -> String {
        if r.below(20) == 0 { return value(&r) }  // not an object at all
        var members: [String] = []
        for _ in 0..<r.below(6) + 1 {
            let name = r.pick(["op", "op", "path", "path", "from", "value", "value", "extra", "opx", "Op"])
            let v: String
            switch name {
            case "op": v = r.pick(["\"add\"", "\"remove\"", "\"replace\"", "\"move\"", "\"copy\"", "\"test\"", "\"nope\"", "1", "\"\\u0061dd\""])
            case "path", "from": v = pointer(&r)
            default: v = value(&r)
            }
            let s1 = space(&r), k = key(name, &r), s2 = space(&r), s3 = space(&r), s4 = space(&r)
            members.append(s1 + k + s2 + ":" + s3 + v + s4)
        }
        return "{" + members.joined(separator: ",") + "}"
    }

    @Test("the same operations or the same error as JSONPatch(parsing:), for 20,000 random patches")
    func differential() throws {
        var r = Rng(state: 16)
        var checked = 0
        for _ in 0..<20_000 {
            var text: String
            if r.below(30) == 0 {
                text = Self.value(&r)
            } else {
                var items: [String] = []
                for _ in 0..<r.below(4) {
                    let before = Self.space(&r), item = Self.operation(&r), after = Self.space(&r)
                    items.append(before + item + after)
                }
                let lead = Self.space(&r), trail = Self.space(&r)
                text = lead + "[" + items.joined(separator: ",") + "]" + trail
            }
            let bytes = Array(text.utf8)
            guard (try? JSONValue(parsing: bytes)) != nil else { continue }  // the generator's few invalid texts
            checked += 1
            let reference = Result { () throws(JSONPatchError) in try JSONPatch(parsing: bytes) }
            let scanned = Result { () throws(JSONPatchError) in try JSONPatch(scanned: bytes[...]) }
            switch (reference, scanned) {
            case (.success(let a), .success(let b)): #expect(a == b, "\(text)")
            case (.failure(let a), .failure(let b)): #expect(a == b, "\(text)")
            default: Issue.record("\(text): JSONPatch(parsing:) \(reference), JSONPatch(scanned:) \(scanned)")
            }
        }
        #expect(checked > 15_000)
    }

    @Test("a slice in the middle of a frame is read where it is (indices not from zero)")
    func slice() throws {
        let frame = Array(#"{"op":"done","patch":[{"op":"replace","path":"/todos/3/done","value":true}],"seq":1}"#.utf8)
        let start = frame.firstIndex(of: UInt8(ascii: "["))!, end = frame.lastIndex(of: UInt8(ascii: "]"))! + 1
        let patch = try JSONPatch(scanned: frame[start..<end])
        #expect(patch == JSONPatch(operations: [.replace(path: JSONPointer(tokens: ["todos", "3", "done"]), value: .bool(true))]))
    }
}

extension SplitMix {
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
    mutating func pick<T>(_ items: [T]) -> T { items[below(items.count)] }
}
