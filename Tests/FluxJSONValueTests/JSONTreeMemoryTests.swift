#if canImport(Glibc)
import CFluxSys
import XCTest
@testable import FluxJSONValue

/// Router.treeOverhead (8) is what fluxd charges per rendered byte of a state it keeps as a JSONTree (SPEC §16.5),
/// for the tree and the rendering kept beside it (1 byte per byte): the heap a tree of the todo state really takes,
/// measured with glibc's allocator statistics, must stay below 7 per byte, or the memory budget would under-count
/// what a store holds in fluxd. (Measured: 6.7-6.8.)
/// (XCTest, not Swift Testing: XCTest runs its cases one at a time, so no other test allocates meanwhile.)
final class JSONTreeMemoryTests: XCTestCase {
    static func todos(_ n: Int) -> [UInt8] {
        var text = #"{"todos":["#
        for i in 0..<n {
            if i > 0 { text += "," }
            text += #"{"id":\#(i + 1),"title":"buy milk number \#(i)","done":\#(i % 3 == 0)}"#
        }
        return Array((text + #"],"nextID":\#(n + 1)}"#).utf8)
    }

    static func heap() -> Int { Int(cfluxsys_heap_in_use()) }

    /// A tree of 20,000 todos takes less heap than 7 times its rendered bytes, after patches too.
    func testTodoStateOverhead() throws {
        let bytes = Self.todos(20_000)
        let before = Self.heap()
        var tree = JSONTree(scanned: bytes[...])
        let parsed = Self.heap() - before
        if parsed <= 0 { throw XCTSkip("this allocator gives no statistics (AddressSanitizer's)") }
        // A thousand patches that insert, replace and remove (the nodes they copy are freed with the old roots).
        for i in 0..<1_000 {
            try tree.apply(JSONPatch(operations: [
                .add(path: JSONPointer(tokens: ["todos", String(i * 7)]), value: .object([("id", .number("\(i)")), ("title", .string("new")), ("done", .bool(false))])),
                .replace(path: JSONPointer(tokens: ["todos", String(i * 3), "done"]), value: .bool(true)),
                .remove(path: JSONPointer(tokens: ["todos", String(i * 5 + 1)])),
            ]))
        }
        let patched = Self.heap() - before
        let ratioParsed = Double(parsed) / Double(bytes.count)
        let ratioPatched = Double(patched) / Double(tree.byteCount)
        print("JSONTree heap: \(parsed) bytes for \(bytes.count) rendered (\(ratioParsed)x); after 1,000 patches \(patched) for \(tree.byteCount) (\(ratioPatched)x)")
        XCTAssertLessThan(ratioParsed, 7, "parsed")
        XCTAssertLessThan(ratioPatched, 7, "patched")
        withExtendedLifetime(tree) {}
    }
}
#endif
