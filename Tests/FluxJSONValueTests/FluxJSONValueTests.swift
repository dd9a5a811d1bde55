import FluxJSONValue
import Testing

@Suite("FluxJSONValue: parsing")
struct JSONParsingTests {
    @Test("every kind of value; members keep their order, duplicates and numbers keep their text")
    func parsesValues() throws {
        let v = try JSONValue(parsing: #" {"b":1,"a":[true,false,null,-0.50,1e300,12345678901234567890],"s":"x\"\\\/\n\u00e9\ud83d\ude00","b":2} "#)
        guard case .object(let members) = v else { Issue.record("not an object: \(v)"); return }
        #expect(members.map(\.key) == ["b", "a", "s", "b"])
        #expect(v["b"] == .number("2"))  // the last of a repeated key
        #expect(v["a"] == .array([.bool(true), .bool(false), .null, .number("-0.50"), .number("1e300"),
                                  .number("12345678901234567890")]))
        #expect(v["s"]?.stringValue == "x\"\\/\né😀")
        #expect(v["a"]?[3] == .number("-0.50"))
        #expect(v["a"]?[9] == nil)
        #expect(try JSONValue(parsing: "42") == .number("42"))
        #expect(try JSONValue(parsing: "\"top\"") == .string("top"))
        #expect(try JSONValue(parsing: "[]") == .array([]))
        #expect(try JSONValue(parsing: "{}") == .object([]))
        #expect(try JSONValue(parsing: " [ 1 , { \"k\" : [ ] } ] ") == .array([.number("1"), .object([(key: "k", value: .array([]))])]))
    }

    @Test("printing: compact keeps order and text; pretty indents; quote escapes control characters")
    func prints() throws {
        let text = #"{"z":{"y":[1,2.50,"a\tb"],"e":{}},"a":null}"#
        let v = try JSONValue(parsing: text)
        #expect(v.compact == text)
        #expect(v.pretty() == """
            {
              "z": {
                "y": [
                  1,
                  2.50,
                  "a\\tb"
                ],
                "e": {}
              },
              "a": null
            }
            """)
        #expect(JSONValue.quote("a\u{01}\"\\") == #""a\u0001\"\\""#)
        #expect(try JSONValue(parsing: JSONValue.string("\u{1F}é\n").compact) == .string("\u{1F}é\n"))
    }

    @Test("invalid input: where it goes wrong (line, column, byte) and why", arguments: [
        (#"{"title":"milk",}"#, 1, 17, 16, "expected a string key"),
        ("{site:1}", 1, 2, 1, "expected a string key"),
        ("['x']", 1, 2, 1, "strings must use double quotes"),
        ("[1,\n 2,\n x]", 3, 2, 9, "unexpected byte 0x78"),
        ("{\"a\":1} 2", 1, 9, 8, "trailing bytes after the object"),
        ("1 2", 1, 3, 2, "trailing bytes after the value"),
        ("[1,2", 1, 5, 4, "unterminated array (the text ends too early)"),
        ("", 1, 1, 0, "empty document"),
        ("\"\\x\"", 1, 3, 2, "invalid escape"),
        ("\"\\udc00\"", 1, 8, 7, "unpaired low surrogate"),
        ("01", 1, 2, 1, "trailing bytes after the value"),
    ])
    func reportsErrors(text: String, line: Int, column: Int, offset: Int, reason: String) {
        do {
            let v = try JSONValue(parsing: text)
            Issue.record("parsed \(text) as \(v)")
        } catch {
            #expect(error.line == line, "\(text): \(error)")
            #expect(error.column == column, "\(text): \(error)")
            #expect(error.offset == offset, "\(text): \(error)")
            #expect(error.reason == reason, "\(text): \(error)")
        }
    }

    @Test("invalid UTF-8 and nesting deeper than 64 are refused; 64 levels are fine")
    func limits() throws {
        #expect(throws: JSONParseError.self) { try JSONValue(parsing: [UInt8(ascii: "\""), 0xC3, UInt8(ascii: "\"")]) }
        #expect(throws: JSONParseError.self) { try JSONValue(parsing: String(repeating: "[", count: 65) + String(repeating: "]", count: 65)) }
        let deep = try JSONValue(parsing: String(repeating: "[", count: 64) + String(repeating: "]", count: 64))
        #expect(deep.arrayValue?.count == 1)
    }
}

@Suite("FluxJSONValue: RFC 6901 pointers")
struct JSONPointerTests {
    let doc = try! JSONValue(parsing: #"{"todos":[{"title":"milk"},{"title":"eggs"}],"a/b":{"m~n":7},"":{"":"empty keys"}}"#)

    @Test("parse and print: ~0 and ~1 escapes, the root, empty tokens")
    func parsing() throws {
        #expect(try JSONPointer(parsing: "").tokens == [])
        #expect(try JSONPointer(parsing: "/a~1b/m~0n").tokens == ["a/b", "m~n"])
        #expect(try JSONPointer(parsing: "/").tokens == [""])
        #expect(try JSONPointer(parsing: "/~01").tokens == ["~1"])  // ~0 first, then the 1 is literal
        #expect(JSONPointer(tokens: ["a/b", "m~n"]).description == "/a~1b/m~0n")
        #expect(JSONPointer.root.appending("x").description == "/x")
    }

    @Test("get: members, array indices, escaped keys, empty keys, the whole document")
    func get() throws {
        #expect(try JSONPointer(parsing: "/todos/1/title").resolve(in: doc) == .string("eggs"))
        #expect(try JSONPointer(parsing: "/a~1b/m~0n").resolve(in: doc) == .number("7"))
        #expect(try JSONPointer(parsing: "//").resolve(in: doc) == .string("empty keys"))
        #expect(try JSONPointer(parsing: "").resolve(in: doc) == doc)
    }

    @Test("errors say what is wrong and what exists", arguments: [
        ("todos/0", "a JSON pointer is empty or starts with '/' (got \"todos/0\")"),
        ("/a~2", "'~' must be followed by 0 or 1 in a JSON pointer (\"/a~2\")"),
        ("/todos/7", "/todos/7 does not exist: /todos has 2 elements"),
        ("/todos/01", "/todos/01 does not exist: /todos is an array, \"01\" is not an index"),
        ("/todos/-", "/todos/- does not exist: /todos is an array, \"-\" is not an index"),
        ("/nope", "/nope does not exist: the state has no member \"nope\" (members: todos, a/b, )"),
        ("/todos/0/title/x", "/todos/0/title/x does not exist: /todos/0/title is not an object or array"),
    ])
    func errors(pointer: String, message: String) {
        do {
            let value = try JSONPointer(parsing: pointer).resolve(in: doc)
            Issue.record("\(pointer) resolved to \(value)")
        } catch {
            #expect(error.message == message)
        }
    }
}

@Suite("FluxJSONValue: diff")
struct JSONDiffTests {
    private func changes(_ a: String, _ b: String) throws -> [String] {
        try JSONValue(parsing: a).changes(to: JSONValue(parsing: b)).map { c in
            "\(c.kind.rawValue) \(c.path) \(c.old?.compact ?? "-") \(c.new?.compact ?? "-")"
        }
    }

    @Test("equal values: no change; scalars and kinds: replace at the path")
    func replaces() throws {
        #expect(try changes(#"{"a":[1,{"b":2}]}"#, #"{"a":[1,{"b":2}]}"#) == [])
        #expect(try changes("1", "2") == ["replace  1 2"])
        #expect(try changes(#"{"a":{"b":1}}"#, #"{"a":{"b":"1"}}"#) == [#"replace /a/b 1 "1""#])
        #expect(try changes(#"{"a":[1]}"#, #"{"a":{"0":1}}"#) == [#"replace /a [1] {"0":1}"#])
        // Numbers compare by their text.
        #expect(try changes("1.0", "1") == ["replace  1.0 1"])
    }

    @Test("objects member by member; keys with / and ~ are escaped in paths")
    func objects() throws {
        #expect(try changes(#"{"a":1,"b":2,"c/d":3}"#, #"{"b":5,"c/d":3,"e~":4}"#) == [
            "remove /a 1 -", "replace /b 2 5", "add /e~0 - 4",
        ])
    }

    @Test("arrays by common prefix and suffix: an insertion is one add; removals from the highest index down")
    func arrays() throws {
        #expect(try changes("[1,2,3]", "[1,9,2,3]") == ["add /1 - 9"])
        #expect(try changes("[1,2,3,4]", "[1,4]") == ["remove /2 3 -", "remove /1 2 -"])
        #expect(try changes("[1,2,3]", "[1,5,3]") == ["replace /1 2 5"])
        #expect(try changes(#"[{"t":"a"},{"t":"b"}]"#, #"[{"t":"a"},{"t":"c"},{"t":"d"}]"#) == [
            #"replace /1/t "b" "c""#, #"add /2 - {"t":"d"}"#,
        ])
        #expect(try changes("[]", "[1,2]") == ["add /0 - 1", "add /1 - 2"])
    }
}

@Suite("FluxJSONValue: string escaping")
struct StringEscapingTests {
    /// The escaping written out byte by byte, as RFC 8259 §7 asks for it (the reference for the word-at-a-time scan).
    static func reference(_ s: String) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "\"")]
        for c in s.utf8 {
            switch c {
            case UInt8(ascii: "\""): out += Array("\\\"".utf8)
            case UInt8(ascii: "\\"): out += Array("\\\\".utf8)
            case 0x0A: out += Array("\\n".utf8)
            case 0x0D: out += Array("\\r".utf8)
            case 0x09: out += Array("\\t".utf8)
            case 0x08: out += Array("\\b".utf8)
            case 0x0C: out += Array("\\f".utf8)
            case 0..<0x20: out += Array(String(format: "\\u%04x", Int(c)).utf8)
            default: out.append(c)
            }
        }
        out.append(UInt8(ascii: "\""))
        return out
    }

    @Test("every string prints as the byte-by-byte reference escapes it and parses back to itself (20,000 random strings of 0-40 characters, escapes at every offset)")
    func randomStrings() throws {
        var rng = SystemRandomNumberGenerator()
        let pieces: [String] = ["a", "s", "\"", "\\", "\n", "\u{1}", "\u{1F}", " ", "~", "\u{7F}", "é", "€", "😀", "/", "\t", "\u{0}"]
        for _ in 0..<20_000 {
            let n = Int.random(in: 0...40, using: &rng)
            let plainBias = Int.random(in: 0...3, using: &rng)
            var s = ""
            for _ in 0..<n { s += Int.random(in: 0...plainBias, using: &rng) > 0 ? "x" : pieces.randomElement(using: &rng)! }
            let printed = JSONValue.string(s).compactBytes
            #expect(printed == Self.reference(s), "\(Array(s.utf8))")
            #expect(try JSONValue(parsing: printed) == .string(s))
        }
    }
}
