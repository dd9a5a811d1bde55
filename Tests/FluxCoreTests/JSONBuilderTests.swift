import FluxCore
import Testing

/// `JSONBuilder` writes integers without making a `String` (issue 25: `info` on a bus of 12,000 stores spent a
/// fifth of its time in generic integer formatting); the digits must be exactly `String(number)`'s.
@Suite struct JSONBuilderTests {
    @Test("integer fields and values of every width and sign are written as String(number) writes them")
    func integersAsDecimal() {
        let ints: [Int] = [0, 1, 9, 10, 99, 100, 12345, -1, -10, -987654321, Int.max, Int.min]
        let u64: [UInt64] = [0, 7, 10, 1_000_000, UInt64.max]
        var j = JSONBuilder()
        j.object { o in
            for (i, n) in ints.enumerated() { o.field(named: "i\(i)", n) }
            for n in ints { o.field("int", n) }
            for n in u64 { o.field("u64", n) }
            o.field("u32", UInt32.max)
            o.field("i32min", Int32.min)
            o.field("i32", Int32(-42))
            o.field("i8", Int8(-128))      // generic path
            o.field("u16", UInt16(65535))  // generic path
            o.array("values") { a in
                a.value(Int.min)
                a.value(UInt64.max)
                a.value(0)
            }
        }
        var expected = "{"
        expected += ints.enumerated().map { "\"i\($0.offset)\":\($0.element)" }.joined(separator: ",")
        expected += "," + ints.map { "\"int\":\($0)" }.joined(separator: ",")
        expected += "," + u64.map { "\"u64\":\($0)" }.joined(separator: ",")
        expected += ",\"u32\":4294967295,\"i32min\":-2147483648,\"i32\":-42,\"i8\":-128,\"u16\":65535"
        expected += ",\"values\":[\(Int.min),\(UInt64.max),0]}"
        #expect(String(decoding: j.bytes, as: UTF8.self) == expected)
    }

    @Test("booleans, null and nested containers keep their commas")
    func literalsAndNesting() {
        var j = JSONBuilder()
        j.object { o in
            o.field("t", true)
            o.field("f", false)
            o.nullField("n")
            o.object("o") { inner in inner.field("k", "v") }
            o.field("s", strings: ["a", "b\"c"])
        }
        #expect(String(decoding: j.bytes, as: UTF8.self) == #"{"t":true,"f":false,"n":null,"o":{"k":"v"},"s":["a","b\"c"]}"#)
    }
}
