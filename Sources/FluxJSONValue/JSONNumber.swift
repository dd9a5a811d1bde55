/// Exact equality of JSON numbers (SPEC §16.1): two numbers are equal when their decimal values are, whatever
/// their spelling — `1`, `1.0`, `1e0` and `10e-1` are one number, `-0` is `0` — and never through a binary
/// float, so `9007199254740993` is not `9007199254740992` and `0.10000000000000001` is not `0.1`. The work is
/// linear in the two texts: an exponent is compared as digits, never expanded (`1e999999999999999999999` costs
/// what its text costs).
public enum JSONNumber {
    /// Whether the JSON number texts `a` and `b` (RFC 8259 grammar) have the same decimal value. A text outside
    /// the grammar compares by its bytes.
    public static func exactlyEqual(_ a: String, _ b: String) -> Bool {
        if a == b { return true }
        guard let x = Decimal(a), let y = Decimal(b) else { return false }
        return x == y
    }

    /// A number as sign, significant digits (no leading or trailing zeros; empty for zero) and the decimal
    /// exponent of the last significant digit, the exponent kept as canonical decimal text when it is large.
    struct Decimal: Equatable {
        var negative: Bool
        var digits: [UInt8]
        var exponent: Exponent

        init?(_ text: String) {
            var bytes = Array(text.utf8)[...]
            negative = bytes.first == UInt8(ascii: "-")
            if negative { bytes = bytes.dropFirst() }
            var mantissa: [UInt8] = []
            var fractionDigits = 0
            var seenPoint = false
            var seenDigit = false
            while let c = bytes.first, c != UInt8(ascii: "e"), c != UInt8(ascii: "E") {
                bytes = bytes.dropFirst()
                if c == UInt8(ascii: ".") {
                    guard !seenPoint, seenDigit else { return nil }
                    seenPoint = true
                } else if c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") {
                    seenDigit = true
                    if seenPoint { fractionDigits += 1 }
                    if !(mantissa.isEmpty && c == UInt8(ascii: "0")) { mantissa.append(c) }
                } else {
                    return nil
                }
            }
            guard seenDigit else { return nil }
            var exponent = Exponent(negative: false, digits: [])
            if !bytes.isEmpty {
                bytes = bytes.dropFirst()  // e or E
                var expNegative = false
                if let sign = bytes.first, sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") {
                    expNegative = sign == UInt8(ascii: "-")
                    bytes = bytes.dropFirst()
                }
                guard !bytes.isEmpty, bytes.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
                exponent = Exponent(negative: expNegative, digits: Array(bytes.drop { $0 == UInt8(ascii: "0") }))
                if exponent.digits.isEmpty { exponent.negative = false }
            }
            var trailingZeros = 0
            while mantissa.last == UInt8(ascii: "0") { mantissa.removeLast(); trailingZeros += 1 }
            digits = mantissa
            if digits.isEmpty {  // zero: -0 = 0 = 0e5
                negative = false
                self.exponent = Exponent(negative: false, digits: [])
                return
            }
            self.exponent = exponent.adding(trailingZeros - fractionDigits)
        }
    }

    /// A signed decimal integer of any length, canonical (no leading zeros; zero is empty and not negative).
    struct Exponent: Equatable {
        var negative: Bool
        var digits: [UInt8]

        /// `self + n`, for an `n` the size of a text's length.
        func adding(_ n: Int) -> Exponent {
            if n == 0 { return self }
            let other = Exponent(negative: n < 0, digits: Array(String(n.magnitude).utf8))
            if negative == other.negative { return Exponent(negative: negative, digits: Self.sum(digits, other.digits)) }
            // Opposite signs: the larger magnitude minus the smaller, with the larger's sign.
            let (big, small, sign) = Self.less(digits, other.digits) ? (other.digits, digits, other.negative) : (digits, other.digits, negative)
            let difference = Self.difference(big, small)
            return Exponent(negative: difference.isEmpty ? false : sign, digits: difference)
        }

        private static func value(_ c: UInt8) -> Int { Int(c) - Int(UInt8(ascii: "0")) }

        /// Whether magnitude `a` < magnitude `b` (both canonical).
        private static func less(_ a: [UInt8], _ b: [UInt8]) -> Bool {
            a.count != b.count ? a.count < b.count : a.lexicographicallyPrecedes(b)
        }

        private static func sum(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            var carry = 0
            var i = a.count - 1, j = b.count - 1
            while i >= 0 || j >= 0 || carry > 0 {
                let s = (i >= 0 ? value(a[i]) : 0) + (j >= 0 ? value(b[j]) : 0) + carry
                out.append(UInt8(ascii: "0") + UInt8(s % 10))
                carry = s / 10
                i -= 1; j -= 1
            }
            return Array(out.reversed().drop { $0 == UInt8(ascii: "0") })
        }

        /// `a - b` for magnitudes with `a` ≥ `b`.
        private static func difference(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            var borrow = 0
            var i = a.count - 1, j = b.count - 1
            while i >= 0 {
                var d = value(a[i]) - (j >= 0 ? value(b[j]) : 0) - borrow
                borrow = d < 0 ? 1 : 0
                if d < 0 { d += 10 }
                out.append(UInt8(ascii: "0") + UInt8(d))
                i -= 1; j -= 1
            }
            return Array(out.reversed().drop { $0 == UInt8(ascii: "0") })
        }
    }
}
