import FluxCore
import Testing

/// `bytesPrecede` orders byte strings exactly as `lexicographicallyPrecedes` does (it is its `memcmp` shortcut).
struct BytesTests {
    @Test func bytesPrecedeAgreesWithLexicographicOrder() {
        var generator = SystemRandomNumberGenerator()
        let alphabet: [UInt8] = [0, 1, 0x7f, 0x80, 0xff]
        var samples: [[UInt8]] = [[]]
        for _ in 0..<300 {
            let count = Int.random(in: 0...6, using: &generator)
            samples.append((0..<count).map { _ in alphabet.randomElement(using: &generator)! })
        }
        for a in samples {
            for b in samples.prefix(60) {
                #expect(bytesPrecede(a, b) == a.lexicographicallyPrecedes(b), "\(a) vs \(b)")
            }
        }
    }
}
