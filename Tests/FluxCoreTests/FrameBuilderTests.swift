import Foundation
import Testing
@testable import FluxCore

struct FrameBuilderTests {
    /// The length prefix of a built frame, read big-endian.
    static func prefix(_ f: Frame) -> Int {
        Int(f.bytes[0]) << 24 | Int(f.bytes[1]) << 16 | Int(f.bytes[2]) << 8 | Int(f.bytes[3])
    }

    @Test func simpleFrame() throws {
        var b = FrameBuilder(op: "pong")
        b.string("id", "p-1")
        let f = b.finish()
        #expect(f.text == #"{"op":"pong","id":"p-1"}"#)
        #expect(Self.prefix(f) == f.body.count)
        #expect(f.bytes.count == f.body.count + 4)
        #expect(f.bodyArray == Array(f.text.utf8))
    }

    @Test func everyFieldKind() throws {
        var b = FrameBuilder(op: "snapshot", capacity: 8)
        b.constant("status", "up")
        b.string("store", "todos")
        b.int("version", 6)
        b.int("zero", 0)
        b.int("neg", -42)
        b.int("max", Int64.max)
        b.int("u32", UInt32.max)
        b.bool("t", true)
        b.bool("f", false)
        b.strings("handles", ["todo/*", "a\"b"])
        b.strings("none", [])
        b.raw("state", Array(#"{"items":[1,2,{"x":null}]}"#.utf8))
        b.key("results")
        b.rawBytes(Array("[".utf8))
        b.stringValue("x\ny")
        b.rawBytes(Array(",".utf8))
        b.intValue(7)
        b.rawBytes(Array("]".utf8))
        let f = b.finish()
        #expect(Self.prefix(f) == f.body.count)
        let env = try Envelope(body: f.bodyArray)
        #expect(env.fields.map(\.key) == ["op", "status", "store", "version", "zero", "neg", "max", "u32", "t", "f",
                                          "handles", "none", "state", "results"])
        #expect(env.string("op") == .value("snapshot"))
        #expect(env.string("status") == .value("up"))
        #expect(env.int("version") == .value(6))
        #expect(env.int("zero") == .value(0))
        #expect(env.int("neg") == .value(-42))
        #expect(env.int("max") == .value(Int64.max))
        #expect(env.int("u32") == .value(Int64(UInt32.max)))
        #expect(env.bool("t") == .value(true))
        #expect(env.bool("f") == .value(false))
        #expect(env.stringArray("handles") == .value(["todo/*", "a\"b"]))
        #expect(env.stringArray("none") == .value([]))
        #expect(env.raw("state").map { Array($0) } == Array(#"{"items":[1,2,{"x":null}]}"#.utf8))
        #expect(env.raw("results").map { String(decoding: $0, as: UTF8.self) } == #"["x\ny",7]"#)
        // And Foundation agrees it is valid JSON.
        #expect((try? JSONSerialization.jsonObject(with: Data(f.bodyArray))) != nil)
    }

    /// Integers are written exactly as Swift spells them, at every digit count and both ends of the ranges.
    @Test func integersAtEveryLength() throws {
        var values: [UInt64] = [0, UInt64.max, UInt64.max - 1, UInt64(Int64.max), UInt64(Int64.max) + 1]
        var power: UInt64 = 1
        for _ in 0..<19 {
            values += [power - 1, power, power + 1, power * 5 + 3]
            power *= 10
        }
        values += [power - 1, power, power + 1]  // 10^19: 20 digits
        for v in values {
            var b = FrameBuilder(op: "t")
            b.int("u", v)
            #expect(b.finish().text == #"{"op":"t","u":\#(v)}"#)
        }
        for v: Int64 in [-1, -9, -10, -99, -100, -12345678901, Int64.min, Int64.min + 1, Int64.max] {
            var b = FrameBuilder(op: "t")
            b.int("i", v)
            #expect(b.finish().text == #"{"op":"t","i":\#(v)}"#)
        }
    }

    /// Every string survives appendEscaped -> Envelope scan -> decodeJSONString, and Foundation reads the same.
    @Test func escapingRoundTrips() throws {
        var samples: [String] = ["", "plain", "\"", "\\", "/", "\"\\\"", "\n\r\t", "\u{08}\u{0C}", "\u{00}", "\u{1F}",
                                 "\u{7F}", "é", "e\u{301}", "€", "😀", "\u{10FFFF}", "\u{FFFD}", "\u{2028}\u{2029}",
                                 "mixed \"quotes\" and \\back\\slashes\\ and\u{01}controls 😀"]
        for c in 0..<0x20 { samples.append("<\(Character(Unicode.Scalar(UInt8(c))))>") }
        var rng = SeededRNG(seed: 99)
        for _ in 0..<500 { samples.append(EnvelopeFuzzTests.randomString(&rng)) }
        for s in samples {
            var b = FrameBuilder(op: "error")
            b.string("message", s)
            let f = b.finish()
            let env = try Envelope(body: f.bodyArray)
            let token = try #require(env.raw("message"))
            #expect(Array(decodeJSONString(token).utf8) == Array(s.utf8), "\(s.debugDescription)")
            #expect(!token.dropFirst().dropLast().contains { $0 < 0x20 }, "raw control char for \(s.debugDescription)")
            let obj = try #require(try JSONSerialization.jsonObject(with: Data(f.bodyArray)) as? [String: Any])
            #expect((obj["message"] as? String).map { Array($0.utf8) } == Array(s.utf8))
        }
    }

    @Test func appendEscapedSpelling() {
        var out: [UInt8] = []
        appendEscaped("a\"b\\c\nd\re\tf\u{01}g\u{1F}h/", to: &out)
        #expect(String(decoding: out, as: UTF8.self) == #""a\"b\\c\nd\re\tf\u0001g\u001fh/""#)
    }

    @Test func decodeJSONStringEscapes() {
        func d(_ s: String) -> String { decodeJSONString(Array(s.utf8)[...]) }
        #expect(d(#""""#) == "")
        #expect(d(#""\"\\\/\b\f\n\r\t""#) == "\"\\/\u{08}\u{0C}\n\r\t")
        #expect(d(#""\u0041\u00e9\u00E9\u20ac""#) == "Aéé€")
        #expect(d(#""\ud83d\ude00""#) == "😀")
        #expect(d(#""\uD83D\uDE00x""#) == "😀x")
        #expect(d(#""\u0000""#) == "\u{0}")
        #expect(d(#""raw é €""#) == "raw é €")
    }

    @Test func frameFromBodyAndEncodeFrame() {
        let body = Array(#"{"op":"ping"}"#.utf8)
        let f = Frame(body: body)
        let all = withExtendedLifetime(f) { Array(f.bytes) }
        #expect(all == [0, 0, 0, UInt8(body.count)] + body)
        #expect(encodeFrame(body) == all)
        #expect(encodeFrame([UInt8]()) == [0, 0, 0, 0])
        let big = [UInt8](repeating: 0x20, count: 0x01_02_03)
        #expect(Array(encodeFrame(big).prefix(4)) == [0x00, 0x01, 0x02, 0x03])
    }

    @Test func protocolVersion() {
        #expect(fluxProtocolVersion == 1)
    }
}

struct NamesTests {
    @Test func storeNames() {
        for ok in ["todos", "a", "A-Z_0.9:x/y", String(repeating: "s", count: 128), "...", "-", "/"] {
            #expect(Names.isValidStore(ok), "\(ok)")
        }
        for bad in ["", String(repeating: "s", count: 129), "to dos", "todo*", "é", "a\u{0}", "a\"b", "a\\b", "a,b",
                    "a+b", "a@b", "a\n"] {
            #expect(!Names.isValidStore(bad), "\(bad.debugDescription)")
        }
    }

    @Test func actionTypes() {
        #expect(Names.isValidType("todo/add"))
        #expect(Names.isValidType(String(repeating: "t", count: 256)))
        #expect(!Names.isValidType(String(repeating: "t", count: 257)))
        #expect(!Names.isValidType(""))
        #expect(!Names.isValidType("todo/*"))
        #expect(!Names.isValidType("*"))
        #expect(!Names.isValidType("todo add"))
    }

    @Test func patterns() {
        for ok in ["*", "todo/*", "todo/add", "t*", String(repeating: "p", count: 255) + "*",
                   String(repeating: "p", count: 256)] {
            #expect(Names.isValidPattern(ok), "\(ok)")
        }
        for bad in ["", "**", "*todo", "to*do", "todo/**", "todo/*/x", String(repeating: "p", count: 256) + "*",
                    String(repeating: "p", count: 257), "a b*", "é*"] {
            #expect(!Names.isValidPattern(bad), "\(bad.debugDescription)")
        }
    }

    @Test func matching() {
        #expect(Names.matches(pattern: "todo/add", type: "todo/add"))
        #expect(!Names.matches(pattern: "todo/add", type: "todo/addx"))
        #expect(!Names.matches(pattern: "todo/add", type: "todo/ad"))
        #expect(Names.matches(pattern: "todo/*", type: "todo/add"))
        #expect(Names.matches(pattern: "todo/*", type: "todo/x/y"))
        #expect(Names.matches(pattern: "todo/*", type: "todo/"))
        #expect(!Names.matches(pattern: "todo/*", type: "todo"))
        #expect(!Names.matches(pattern: "todo/*", type: "todos/add"))
        #expect(Names.matches(pattern: "todo*", type: "todos/add"))
        #expect(Names.matches(pattern: "todo*", type: "todo"))
        #expect(Names.matches(pattern: "*", type: "anything"))
        #expect(Names.matches(pattern: "*", type: "a"))
        #expect(!Names.matches(pattern: "Todo/*", type: "todo/add"))
    }

    /// The pattern rules as SPEC.md §5 states them, checked against `Names` on generated names.
    @Test func matchingAgreesWithDefinition() {
        var rng = SeededRNG(seed: 5)
        let alphabet = Array("ab/.".utf8)
        func name(_ max: Int) -> String {
            let n = 1 + Int(rng.next() % UInt64(max))
            return String(decoding: (0..<n).map { _ in alphabet[Int(rng.next() % 4)] }, as: UTF8.self)
        }
        for _ in 0..<5_000 {
            let type = name(6)
            let prefix = rng.next() % 5 == 0 ? "" : name(4)
            let star = rng.next() % 2 == 0
            let pattern = star ? prefix + "*" : (prefix.isEmpty ? "a" : prefix)
            let expected = star ? type.utf8.starts(with: prefix.utf8) : type == pattern
            #expect(Names.isValidPattern(pattern))
            #expect(Names.matches(pattern: pattern, type: type) == expected, "\(pattern) vs \(type)")
        }
    }
}
