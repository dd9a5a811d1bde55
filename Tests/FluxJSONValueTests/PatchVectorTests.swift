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
