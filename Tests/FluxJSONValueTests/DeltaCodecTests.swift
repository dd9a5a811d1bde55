import FluxJSONValue
import Foundation
import Testing

// Randomized differential tests of the SPEC §16 codecs: JSONDeltaEncoder against Foundation's JSONEncoder (the patch
// applied to the previous JSON gives the new JSON), JSONValueEncoder against JSONEncoder, JSONValueDecoder against
// JSONDecoder (same results on the same inputs), JSONIncrementalDecoder against a whole decode.

struct Item: Codable, Equatable, Sendable {
    var id: Int
    var name: String
    var done: Bool
    var score: Double
    var tags: [String]
    var note: String?
}

struct Inner: Codable, Equatable, Sendable {
    var v: Int
    var sub: TrackedArray<Int>
}

struct Model: Codable, Equatable, Sendable {
    var items: TrackedArray<Item> = []
    var plain: [Int] = []
    var meta: [String: Int] = [:]
    var title = ""
    var opt: Int?
    var inners: TrackedArray<Inner> = []
    var blob = Data()
    var small: Int8 = 0
    var ratio: Float = 0
}

/// JSON equality: numbers by value, objects regardless of member order (the last of a repeated key).
func jsonEqual(_ a: JSONValue, _ b: JSONValue) -> Bool {
    switch (a, b) {
    case (.number(let x), .number(let y)): return x == y || Double(x) == Double(y)
    case (.array(let x), .array(let y)): return x.count == y.count && zip(x, y).allSatisfy(jsonEqual)
    case (.object(let x), .object(let y)):
        var dx: [String: JSONValue] = [:], dy: [String: JSONValue] = [:]
        for m in x { dx[m.key] = m.value }
        for m in y { dy[m.key] = m.value }
        return dx.count == dy.count && dx.allSatisfy { k, v in dy[k].map { jsonEqual(v, $0) } ?? false }
    default: return a == b
    }
}

/// A test-only RFC 6902 apply of add / remove / replace (the operations JSONDeltaEncoder makes).
func testApply(_ ops: [JSONValue], to doc: JSONValue) throws -> JSONValue {
    struct Failure: Error { var what: String }
    func edit(_ v: inout JSONValue, _ tokens: ArraySlice<String>, _ op: String, _ value: JSONValue?) throws {
        guard let first = tokens.first else {
            guard op == "replace" || op == "add", let value else { throw Failure(what: "\(op) at the root") }
            v = value
            return
        }
        let rest = tokens.dropFirst()
        switch v {
        case .object(var members):
            let i = members.lastIndex { $0.key == first }
            if rest.isEmpty {
                switch op {
                case "add":
                    if let i { members[i].value = value! } else { members.append((first, value!)) }
                case "replace":
                    guard let i else { throw Failure(what: "replace of a missing member \(first)") }
                    members[i].value = value!
                default:
                    guard let i else { throw Failure(what: "remove of a missing member \(first)") }
                    members.remove(at: i)
                }
            } else {
                guard let i else { throw Failure(what: "no member \(first)") }
                try edit(&members[i].value, rest, op, value)
            }
            v = .object(members)
        case .array(var items):
            let i = first == "-" ? items.count : Int(first)!
            if rest.isEmpty {
                switch op {
                case "add":
                    guard i <= items.count else { throw Failure(what: "add at \(i) past \(items.count)") }
                    items.insert(value!, at: i)
                case "replace":
                    guard i < items.count else { throw Failure(what: "replace at \(i) of \(items.count)") }
                    items[i] = value!
                default:
                    guard i < items.count else { throw Failure(what: "remove at \(i) of \(items.count)") }
                    items.remove(at: i)
                }
            } else {
                guard i < items.count else { throw Failure(what: "no element \(i)") }
                try edit(&items[i], rest, op, value)
            }
            v = .array(items)
        default:
            throw Failure(what: "not a container at \(first)")
        }
    }
    var doc = doc
    for op in ops {
        let pointer = try JSONPointer(parsing: op["path"]!.stringValue!)
        try edit(&doc, pointer.tokens[...], op["op"]!.stringValue!, op["value"])
    }
    return doc
}

func touches(_ ops: [JSONValue]) throws -> [JSONPatchTouch] {
    try ops.map { op in
        JSONPatchTouch(kind: JSONPatchTouch.Kind(rawValue: op["op"]!.stringValue!)!,
                       path: try JSONPointer(parsing: op["path"]!.stringValue!), value: op["value"])
    }
}

func foundationJSON<T: Encodable>(_ value: T) throws -> JSONValue {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return try JSONValue(parsing: Array(try encoder.encode(value)))
}

struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E3779B97F4A7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) &* 0x94D049BB133111EB
        return z ^ (z >> 31)
    }
}

func randomItem(_ id: Int, _ g: inout SplitMix) -> Item {
    let names = ["a", "b/c", "~x", "é😀", "quote\"d", "tab\t", "", "long title of a todo item"]
    return Item(id: id, name: names.randomElement(using: &g)!, done: Bool.random(using: &g),
                score: [0, 1, -0.5, 1e-7, 3.25, 1e300, 0.1].randomElement(using: &g)!,
                tags: (0..<Int.random(in: 0...2, using: &g)).map { "t\($0)" },
                note: Bool.random(using: &g) ? nil : "n\(id)")
}

/// One random change of the model (or several, in one step).
func mutate(_ m: inout Model, history: [Model], _ g: inout SplitMix, nextID: inout Int) {
    switch Int.random(in: 0..<20, using: &g) {
    case 0...5 where !m.items.isEmpty:
        let i = Int.random(in: 0..<m.items.count, using: &g)
        switch Int.random(in: 0..<4, using: &g) {
        case 0: m.items[i].done.toggle()
        case 1: m.items[i].name += "!"
        case 2: m.items[i].note = nil
        default: m.items[i] = randomItem(m.items[i].id, &g)
        }
    case 6...8:
        nextID += 1
        m.items.append(randomItem(nextID, &g))
    case 9:
        nextID += 1
        m.items.insert(randomItem(nextID, &g), at: Int.random(in: 0...m.items.count, using: &g))
    case 10 where !m.items.isEmpty:
        m.items.remove(at: Int.random(in: 0..<m.items.count, using: &g))
    case 11:
        m.items.removeAll { $0.done }
    case 12:
        // Many changes in one step: past the log's reach.
        for _ in 0..<Int.random(in: 100...300, using: &g) {
            nextID += 1
            m.items.append(randomItem(nextID, &g))
        }
    case 13:
        // A value from the past (a forked history): its log does not lead to what was encoded last.
        if let old = history.randomElement(using: &g) { m.items = old.items }
    case 14:
        m.plain = (0..<Int.random(in: 0...4, using: &g)).map { _ in Int.random(in: -5...5, using: &g) }
    case 15:
        m.meta["k\(Int.random(in: 0...3, using: &g))"] = Bool.random(using: &g) ? Int.random(in: 0...9, using: &g) : nil
        if Bool.random(using: &g) { m.meta = m.meta.filter { $0.value % 2 == 0 } }
    case 16:
        m.title = ["", "t", "x/y", "~"].randomElement(using: &g)!
        m.opt = Bool.random(using: &g) ? nil : Int.random(in: 0...3, using: &g)
        m.small = Int8.random(in: -128...127, using: &g)
        m.ratio = [0, 0.1, 2.5, -1].randomElement(using: &g)!
    case 17:
        if m.inners.isEmpty || Bool.random(using: &g) {
            m.inners.append(Inner(v: Int.random(in: 0...9, using: &g), sub: [1, 2]))
        } else {
            let i = Int.random(in: 0..<m.inners.count, using: &g)
            m.inners[i].sub.append(Int.random(in: 0...9, using: &g))
            if Bool.random(using: &g), !m.inners[i].sub.isEmpty { m.inners[i].sub.remove(at: 0) }
        }
    case 18:
        m.blob = Data((0..<Int.random(in: 0...5, using: &g)).map { _ in UInt8.random(in: 0...255, using: &g) })
    default:
        // Several element changes in one step.
        for _ in 0..<3 where !m.items.isEmpty {
            let i = Int.random(in: 0..<m.items.count, using: &g)
            m.items[i].done.toggle()
            if Bool.random(using: &g) { m.items.remove(at: i) }
        }
    }
}

@Suite("FluxJSONValue: SPEC §16 codecs (randomized, against Foundation)")
struct DeltaCodecTests {
    @Test("JSONDeltaEncoder: the patch applied to the previous JSON is JSONEncoder's JSON of the new value; JSONValueEncoder matches JSONEncoder; the incremental decode matches the value")
    func deltaEncoderDifferential() throws {
        for seed in 1...5 as ClosedRange<UInt64> {
            var g = SplitMix(state: seed)
            var model = Model()
            var nextID = 0
            for _ in 0..<20 { nextID += 1; model.items.append(randomItem(nextID, &g)) }
            var delta = JSONDeltaEncoder()
            try delta.setBaseline(model)
            var json = try foundationJSON(model)
            let incremental = JSONIncrementalDecoder<Model>()
            #expect(try incremental.decode(json) == model)
            var history: [Model] = [model]
            var patchBytes = 0
            for step in 0..<150 {
                mutate(&model, history: history, &g, nextID: &nextID)
                let change = try #require(try delta.change(to: model))
                let expected = try foundationJSON(model)
                let applied = try testApply(change.operations, to: json)
                #expect(jsonEqual(applied, expected), "seed \(seed) step \(step): \(change.operations.map(\.compact))")
                #expect(jsonEqual(try JSONValueEncoder().encode(model), expected), "seed \(seed) step \(step)")
                if change.isEmpty { #expect(jsonEqual(json, expected)) }
                // The patch parses back as JSON.
                #expect(try JSONValue(parsing: change.bytes) == .array(change.operations))
                let decoded = try incremental.decode(applied, after: touches(change.operations))
                #expect(decoded == model, "seed \(seed) step \(step): incremental decode")
                delta.commit(change)
                json = applied
                patchBytes += change.bytes.count
                history.append(model)
                if history.count > 20 { history.removeFirst() }
            }
            #expect(patchBytes > 0)
        }
    }

    @Test("JSONDeltaEncoder: one toggled element of 10,000 is one replace of that element")
    func oneElement() throws {
        var model = Model()
        for i in 0..<10_000 { model.items.append(Item(id: i, name: "todo \(i)", done: false, score: 0, tags: [], note: nil)) }
        var delta = JSONDeltaEncoder()
        try delta.setBaseline(model)
        var copy = model
        copy.items[4321].done = true
        let change = try #require(try delta.change(to: copy))
        #expect(change.operations.count == 1)
        #expect(change.operations[0]["op"] == .string("replace"))
        #expect(change.operations[0]["path"] == .string("/items/4321"))
        #expect(change.bytes.count < 200)
        #expect(model.items[4321].done == false)  // The copy changed, not the original.
        delta.commit(change)
        #expect(try delta.change(to: copy)?.isEmpty == true)
    }

    @Test("TrackedArray behaves as Array under random operations (indices, chunks, equality, coding)")
    func trackedArrayAsArray() throws {
        var g = SplitMix(state: 99)
        var t = TrackedArray<Int>()
        var a: [Int] = []
        for step in 0..<5000 {
            switch Int.random(in: 0..<8, using: &g) {
            case 0, 1:
                let v = Int.random(in: 0...1000, using: &g)
                t.append(v); a.append(v)
            case 2:
                let i = Int.random(in: 0...a.count, using: &g), v = Int.random(in: 0...1000, using: &g)
                t.insert(v, at: i); a.insert(v, at: i)
            case 3 where !a.isEmpty:
                let i = Int.random(in: 0..<a.count, using: &g)
                #expect(t.remove(at: i) == a.remove(at: i))
            case 4 where !a.isEmpty:
                let i = Int.random(in: 0..<a.count, using: &g)
                t[i] += 1; a[i] += 1
            case 5:
                t.removeAll { $0 % 7 == 0 }; a.removeAll { $0 % 7 == 0 }
            case 6 where a.count > 4:
                let lo = Int.random(in: 0..<a.count - 2, using: &g)
                t.replaceSubrange(lo..<(lo + 2), with: [1, 2, 3]); a.replaceSubrange(lo..<(lo + 2), with: [1, 2, 3])
            default:
                let copy = t
                #expect(copy == t)
            }
            #expect(t.count == a.count)
            if step % 97 == 0 {
                #expect(Array(t) == a, "step \(step)")
                #expect(t.array == a)
                #expect(t == TrackedArray(a))
                #expect(t.firstIndex(where: { $0 > 500 }) == a.firstIndex(where: { $0 > 500 }))
                #expect(t.lastIndex(where: { $0 > 500 }) == a.lastIndex(where: { $0 > 500 }))
                #expect((0..<a.count).allSatisfy { t[$0] == a[$0] })
                let data = try JSONEncoder().encode(t)
                #expect(data == (try JSONEncoder().encode(a)))
                #expect(try JSONDecoder().decode(TrackedArray<Int>.self, from: data) == t)
            }
        }
    }

    @Test("JSONValueDecoder decodes what JSONDecoder decodes, and fails where it fails (random JSON)")
    func decoderDifferential() throws {
        var g = SplitMix(state: 7)
        let numbers = ["0", "-0", "1", "-1", "1.0", "1.5", "1e2", "1E-2", "-2.5e+3", "127", "128", "-129", "255", "256",
                       "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551615",
                       "1e400", "0.1", "3.4028236e38", "123456789012345678901234567890"]
        func scalar(_ g: inout SplitMix) -> String {
            switch Int.random(in: 0..<6, using: &g) {
            case 0: return numbers.randomElement(using: &g)!
            case 1: return ["true", "false", "null"].randomElement(using: &g)!
            case 2: return ["\"\"", "\"a\"", "\"AAEC\"", "\"=\"", "\"https://x.org/a b\"", "\"é\""].randomElement(using: &g)!
            case 3: return "[\(numbers.randomElement(using: &g)!),\(numbers.randomElement(using: &g)!)]"
            case 4: return "{}"
            default: return "[]"
            }
        }
        func item(_ g: inout SplitMix) -> String {
            var members: [String] = []
            for key in ["id", "name", "done", "score", "tags", "note"] where Int.random(in: 0..<8, using: &g) > 0 {
                let v: String
                switch (key, Int.random(in: 0..<3, using: &g)) {
                case ("id", 0): v = numbers.randomElement(using: &g)!
                case ("name", 0): v = "\"n\""
                case ("done", 0): v = "true"
                case ("score", 0): v = numbers.randomElement(using: &g)!
                case ("tags", 0): v = "[\"x\",\"y\"]"
                case ("note", 0): v = "null"
                default: v = scalar(&g)
                }
                members.append("\"\(key)\":\(v)")
            }
            return "{" + members.joined(separator: ",") + "}"
        }
        func check<T: Decodable & Equatable>(_ type: T.Type, _ text: String) throws {
            let viaFoundation = try? JSONDecoder().decode(T.self, from: Data(text.utf8))
            let viaValue = try? JSONValueDecoder().decode(T.self, from: try JSONValue(parsing: text))
            #expect(viaFoundation == viaValue, "\(T.self) from \(text): Foundation \(String(describing: viaFoundation)), JSONValueDecoder \(String(describing: viaValue))")
        }
        for _ in 0..<3000 {
            let s = scalar(&g)
            try check(Int.self, s); try check(Int8.self, s); try check(UInt8.self, s); try check(UInt64.self, s)
            try check(Int64.self, s); try check(Double.self, s); try check(Float.self, s); try check(Bool.self, s)
            try check(String.self, s); try check(Int?.self, s); try check([Int].self, s); try check([Double].self, s)
            try check(Data.self, s); try check(URL.self, s); try check(Decimal.self, s); try check([String: Int].self, s)
            let i = item(&g)
            try check(Item.self, i)
            try check([Item].self, "[\(i),\(item(&g))]")
            try check(TrackedArray<Item>.self, "[\(i)]")
            try check([String: Item].self, "{\"a\":\(i)}")
            try check([Int: Bool].self, "{\"1\":true,\"x\":false}")
        }
    }
}
