import Testing
@testable import FluxCore

/// `parseJSONInteger`'s unchecked path (up to 18 digits; of a slice, and of an array's range) against the checked
/// one and against Swift's own `Int64(_:)`, on edge cases and random literals.
struct IntegerParsingTests {
    static func reference(_ s: String) -> Int64? {
        // JSON's integers: an optional minus, then digits (the envelope scanner has already rejected leading zeros).
        guard !s.isEmpty, !s.hasPrefix("+"), s != "-" else { return nil }
        return Int64(s)
    }

    @Test func edgeCases() {
        for s in ["0", "-0", "7", "-7", "123456789012345678", "-123456789012345678", "999999999999999999",
                  "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
                  "99999999999999999999", "1.5", "1e3", "-", "", "12a", "-1.0", "- 1"] {
            let bytes = ArraySlice(Array(s.utf8))
            #expect(parseJSONInteger(bytes) == parseJSONIntegerChecked(bytes), "\(s)")
        }
        #expect(parseJSONInteger(ArraySlice(Array("-9223372036854775808".utf8))) == nil)  // as before: checked on the magnitude
        #expect(parseJSONInteger(ArraySlice(Array("9223372036854775807".utf8))) == Int64.max)
        #expect(parseJSONInteger(ArraySlice(Array("-12".utf8))) == -12)
        #expect(parseJSONInteger(ArraySlice(Array("-1.5".utf8))) == nil)
    }

    @Test func randomLiteralsAgree() {
        var rng = SeededRNG(seed: 27)
        let alphabet = Array("0123456789-.e".utf8)
        for _ in 0..<20_000 {
            let n = Int(rng.next() % 22)
            var b: [UInt8] = []
            for _ in 0..<n { b.append(rng.next() % 4 == 0 ? alphabet[Int(rng.next() % UInt64(alphabet.count))] : UInt8(48 + rng.next() % 10)) }
            let slice = ArraySlice(b)
            let got = parseJSONInteger(slice)
            #expect(got == parseJSONIntegerChecked(slice), "\(String(decoding: b, as: UTF8.self))")
            let framed = [UInt8(ascii: "[")] + b + [UInt8(ascii: "]")]
            #expect(parseJSONInteger(framed, 1..<(framed.count - 1)) == got)
            if let got { #expect(got == Self.reference(String(decoding: b, as: UTF8.self)) || b.first == UInt8(ascii: "-")) }
        }
    }
}
