import Testing
@testable import FluxJSONValue

/// SPEC §16.1: numbers in a patch's `test` compare by exact decimal value, never through a binary float.
@Suite("FluxJSONValue: exact number equality")
struct JSONNumberTests {
    @Test("one value, many spellings", arguments: [
        ("1", "1.0"), ("1", "1e0"), ("1", "10e-1"), ("1", "0.1E1"), ("-0", "0"), ("0", "0.000e-7"), ("-0.0", "0e99"),
        ("1e400", "10e399"), ("100", "1e2"), ("123.4500", "1.2345e2"), ("-5e-3", "-0.005"),
        ("1e999999999999999999999", "10e999999999999999999998"), ("1e-999999999999999999999", "0.1e-999999999999999999998"),
        ("18446744073709551617", "18446744073709551617.0"),
    ])
    func equal(_ a: String, _ b: String) {
        #expect(JSONNumber.exactlyEqual(a, b))
        #expect(JSONNumber.exactlyEqual(b, a))
        #expect(JSONValue.number(a).jsonEquals(.number(b)))
    }

    @Test("different values stay different, however close", arguments: [
        ("9007199254740993", "9007199254740992"), ("0.1", "0.10000000000000001"), ("18446744073709551617", "18446744073709551616"),
        ("1", "-1"), ("1e400", "1e401"), ("1e999999999999999999999", "1e999999999999999999998"), ("-0", "1e-999"),
        ("1", "2"), ("12", "1.2"), ("0.5", "5"), ("1e-400", "0"),
    ])
    func unequal(_ a: String, _ b: String) {
        #expect(!JSONNumber.exactlyEqual(a, b))
        #expect(!JSONNumber.exactlyEqual(b, a))
    }

    @Test("agrees with Int64 and Double where those are exact")
    func agreesWithBinaryWhereExact() {
        var r = SplitMix(state: 7)
        for _ in 0..<2_000 {
            let x = Int64(r.below(2_000_001)) - 1_000_000, y = Int64(r.below(3)) - 1 + x
            let spellings = { (n: Int64) in ["\(n)", "\(n).0", "\(n)e0", "\(n)0e-1"] }
            let (a, b) = (r.pick(spellings(x)), r.pick(spellings(y)))
            #expect(JSONNumber.exactlyEqual(a, b) == (x == y), "\(a) vs \(b)")
        }
    }
}
