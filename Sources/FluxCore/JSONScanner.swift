#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// The validating JSON scanner under `Envelope` (RFC 8259: grammar, UTF-8, escapes, surrogate pairs, depth), and
// decoding of the string tokens it validated.

/// Decodes a JSON string token (with its quotes) that the scanner has already validated.
func decodeJSONToken(_ token: UnsafeBufferPointer<UInt8>) -> String {
    guard token.count >= 2 else { return "" }
    let inner = UnsafeBufferPointer(rebasing: token[1..<(token.count - 1)])
    var i = 0
    while i < inner.count && inner[i] != UInt8(ascii: "\\") { i += 1 }
    if i == inner.count { return String(decoding: inner, as: UTF8.self) }
    return decodeEscaped(ArraySlice(inner))
}

/// Decodes a JSON string token (with its quotes) that the scanner has already validated.
public func decodeJSONString(_ token: ArraySlice<UInt8>) -> String {
    token.withUnsafeBufferPointer { decodeJSONToken($0) }
}

/// Decodes the inside of a validated JSON string that contains escapes.
private func decodeEscaped(_ inner: ArraySlice<UInt8>) -> String {
    var out: [UInt8] = []
    out.reserveCapacity(inner.count)
    var i = inner.startIndex
    while i < inner.endIndex {
        let c = inner[i]
        if c != UInt8(ascii: "\\") {
            out.append(c)
            i += 1
            continue
        }
        let e = inner[i + 1]
        i += 2
        switch e {
        case UInt8(ascii: "n"): out.append(0x0A)
        case UInt8(ascii: "t"): out.append(0x09)
        case UInt8(ascii: "r"): out.append(0x0D)
        case UInt8(ascii: "b"): out.append(0x08)
        case UInt8(ascii: "f"): out.append(0x0C)
        case UInt8(ascii: "u"):
            var scalar = hex4(inner, i)
            i += 4
            if scalar >= 0xD800 && scalar < 0xDC00, i + 1 < inner.endIndex, inner[i] == UInt8(ascii: "\\") {
                let low = hex4(inner, i + 2)
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                i += 6
            }
            appendUTF8(Unicode.Scalar(scalar) ?? "\u{FFFD}", to: &out)
        default: out.append(e) // \" \\ \/
        }
    }
    return String(decoding: out, as: UTF8.self)
}

private func hex4(_ s: ArraySlice<UInt8>, _ at: Int) -> UInt32 {
    var v: UInt32 = 0
    for k in 0..<4 { v = v << 4 | UInt32(hexValue(s[at + k]) ?? 0) }
    return v
}

private func hexValue(_ c: UInt8) -> UInt8? {
    switch c {
    case 48...57: return c - 48
    case 65...70: return c - 55
    case 97...102: return c - 87
    default: return nil
    }
}

private func appendUTF8(_ scalar: Unicode.Scalar, to out: inout [UInt8]) {
    for unit in String(Character(scalar)).utf8 { out.append(unit) }
}

/// A validating single-pass JSON scanner over raw bytes. It builds nothing: it checks the grammar (RFC 8259),
/// UTF-8 well-formedness, escapes and surrogate pairs, and the nesting depth, and reports where values are.
struct JSONScanner {
    let buf: UnsafeBufferPointer<UInt8>
    let maxDepth: Int
    var pos = 0

    init(_ buf: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.buf = buf
        self.maxDepth = maxDepth
    }

    @inline(__always) func peek() -> UInt8? { pos < buf.count ? buf[pos] : nil }

    func fail(_ reason: String) -> EnvelopeError { .invalidJSON(offset: pos, reason: reason) }

    /// Moves past whitespace. The common case, no whitespace, is one compare inlined where it is called; a run of
    /// whitespace goes to `skipWhitespaceRun`.
    @inline(__always) mutating func skipWhitespace() {
        guard pos < buf.count, buf[pos] <= 0x20 else { return }
        skipWhitespaceRun()
    }

    /// Skips whitespace from `pos`: eight spaces at a time while there are (indentation, numbers padded to a
    /// fixed width), then byte by byte.
    mutating func skipWhitespaceRun() {
        let n = buf.count
        guard let base = buf.baseAddress else { return }
        let raw = UnsafeRawPointer(base)
        var p = pos
        while p &+ 8 <= n && raw.loadUnaligned(fromByteOffset: p, as: UInt64.self) == 0x2020_2020_2020_2020 {
            p &+= 8
        }
        while p < n {
            switch base[p] {
            case 0x20, 0x0A, 0x0D, 0x09: p &+= 1
            default: pos = p; return
            }
        }
        pos = p
    }

    /// Scans a whole document whose top level must be an object; collects top-level fields.
    mutating func scanDocument(others topLevel: inout [TopLevelField], known: inout KnownFields) throws(EnvelopeError) {
        skipWhitespace()
        guard let c = peek() else { throw fail("empty document") }
        if c != UInt8(ascii: "{") {
            _ = try scanValue(depth: 1)
            skipWhitespace()
            guard pos == buf.count else { throw fail("trailing bytes after the value") }
            throw .notAnObject
        }
        pos += 1
        var duplicate: TopLevelField? = nil
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            pos += 1
        } else {
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                let keyStart = pos
                let escaped = skipPlainString() ? false : try scanString()
                let keyRange = (keyStart + 1)..<(pos - 1)
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { throw fail("expected ':'") }
                pos += 1
                skipWhitespace()
                let valueStart = pos
                let span = peek() == UInt8(ascii: "\"") && skipPlainString()
                    ? JSONSpan(kind: .string, range: valueStart..<pos) : try scanValue(depth: 2)
                let field = TopLevelField(key: keyRange, escaped: escaped, value: span)
                let key: EnvelopeKey?
                if escaped {
                    var decoded = Array(field.decodedKey(buf).utf8)
                    key = decoded.withUnsafeMutableBufferPointer { EnvelopeKey.lookup(UnsafeBufferPointer($0)) }
                } else {
                    key = EnvelopeKey.lookup(UnsafeBufferPointer(rebasing: buf[keyRange]))
                }
                if let key {
                    // Well-known keys go to their slot; a duplicate is one whose slot is already taken.
                    if known.has(key) {
                        if duplicate == nil { duplicate = field }
                    } else {
                        known.set(key, span)
                    }
                } else {
                    if duplicate == nil {
                        for existing in topLevel where existing.keyEquals(field, in: buf) {
                            duplicate = field
                            break
                        }
                    }
                    topLevel.append(field)
                }
                skipWhitespace()
                guard let sep = peek() else { throw fail("unterminated object") }
                if sep == UInt8(ascii: ",") { pos += 1; continue }
                if sep == UInt8(ascii: "}") { pos += 1; break }
                throw fail("expected ',' or '}'")
            }
        }
        skipWhitespace()
        guard pos == buf.count else { throw fail("trailing bytes after the object") }
        if let duplicate { throw .duplicateKey(duplicate.decodedKey(buf)) }
    }

    @inline(__always)
    mutating func scanValue(depth: Int) throws(EnvelopeError) -> JSONSpan {
        guard let c = peek() else { throw fail("expected a value") }
        let begin = pos
        switch c {
        case UInt8(ascii: "{"):
            try scanContainer(close: UInt8(ascii: "}"), isObject: true, depth: depth)
            return JSONSpan(kind: .object, range: begin..<pos)
        case UInt8(ascii: "["):
            try scanContainer(close: UInt8(ascii: "]"), isObject: false, depth: depth)
            return JSONSpan(kind: .array, range: begin..<pos)
        case UInt8(ascii: "\""):
            if !skipPlainString() { try scanString() }
            return JSONSpan(kind: .string, range: begin..<pos)
        case UInt8(ascii: "t"):
            try literal("true")
            return JSONSpan(kind: .bool, range: begin..<pos)
        case UInt8(ascii: "f"):
            try literal("false")
            return JSONSpan(kind: .bool, range: begin..<pos)
        case UInt8(ascii: "n"):
            try literal("null")
            return JSONSpan(kind: .null, range: begin..<pos)
        case UInt8(ascii: "-"), 48...57:
            try scanNumber()
            return JSONSpan(kind: .number, range: begin..<pos)
        default:
            throw fail("unexpected byte 0x\(String(c, radix: 16))")
        }
    }

    mutating func scanContainer(close: UInt8, isObject: Bool, depth: Int) throws(EnvelopeError) {
        guard depth <= maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
        pos += 1
        skipWhitespace()
        if peek() == close { pos += 1; return }
        while true {
            skipWhitespace()
            if isObject {
                guard peek() == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                if !skipPlainString() { try scanString() }
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { throw fail("expected ':'") }
                pos += 1
                skipWhitespace()
            }
            if !(peek() == UInt8(ascii: "\"") && skipPlainString()) { _ = try scanValue(depth: depth + 1) }
            skipWhitespace()
            guard let sep = peek() else { throw fail("unterminated \(isObject ? "object" : "array")") }
            if sep == UInt8(ascii: ",") { pos += 1; continue }
            if sep == close { pos += 1; return }
            throw fail(isObject ? "expected ',' or '}'" : "expected ',' or ']'")
        }
    }

    mutating func literal(_ word: StaticString) throws(EnvelopeError) {
        let n = word.utf8CodeUnitCount
        guard pos + n <= buf.count else { throw fail("truncated literal") }
        let w = word.utf8Start
        for k in 0..<n where buf[pos + k] != w[k] { throw fail("invalid literal") }
        pos += n
    }

    mutating func scanNumber() throws(EnvelopeError) {
        if peek() == UInt8(ascii: "-") { pos += 1 }
        guard let first = peek(), first >= 48 && first <= 57 else { throw fail("expected a digit") }
        if first == 48 {
            pos += 1
        } else {
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            pos += 1
            guard let d = peek(), d >= 48 && d <= 57 else { throw fail("expected a digit after '.'") }
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
        if let e = peek(), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            pos += 1
            if let s = peek(), s == UInt8(ascii: "+") || s == UInt8(ascii: "-") { pos += 1 }
            guard let d = peek(), d >= 48 && d <= 57 else { throw fail("expected a digit in the exponent") }
            while let d = peek(), d >= 48 && d <= 57 { pos += 1 }
        }
    }

    /// Moves past the string token at `pos` (its opening quote) if it is plain printable ASCII without escapes,
    /// the common case, and says whether it did; otherwise `scanString` must scan it (escapes, non-ASCII and
    /// control bytes, errors). Not throwing, so it is inlined where it is called: no call per string.
    @inline(__always)
    mutating func skipPlainString() -> Bool {
        guard let base = buf.baseAddress else { return false }
        let end = JSONScanner.plainStringEnd(base, pos, buf.count)
        guard end >= 0 else { return false }
        pos = end
        return true
    }

    /// Where the string token at `i` (its opening quote) ends, the index after its closing quote, if it is plain
    /// printable ASCII without escapes; -1 otherwise.
    @inline(__always)
    static func plainStringEnd(_ b: UnsafePointer<UInt8>, _ i: Int, _ n: Int) -> Int {
        var (p, found) = skipPlainWords(b, from: i &+ 1, n)
        if found { return b[p] == UInt8(ascii: "\"") ? p &+ 1 : -1 }
        while p < n {
            let c = b[p]
            if c == UInt8(ascii: "\"") { return p &+ 1 }
            guard c &- 0x20 < 0x60, c != UInt8(ascii: "\\") else { return -1 }
            p &+= 1
        }
        return -1
    }

    /// Skips plain printable ASCII (no quote, backslash, control or non-ASCII byte) from `p`, eight bytes at a
    /// time: the index of the first such byte (`found`), or of the first byte of the last, partial word. The
    /// lowest byte flagged in `special` is the first hit (the borrow of these tests can only flag bytes above a
    /// true hit), so it is found without a second pass.
    @inline(__always)
    static func skipPlainWords(_ b: UnsafePointer<UInt8>, from start: Int, _ n: Int) -> (index: Int, found: Bool) {
        var p = start
        let raw = UnsafeRawPointer(b)
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        while p &+ 8 <= n {
            let w = raw.loadUnaligned(fromByteOffset: p, as: UInt64.self)
            let quote = w ^ (ones &* 0x22)
            let backslash = w ^ (ones &* 0x5C)
            let control = (w &- ones &* 0x20) & ~w
            let special = (control | ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash) | w) & highs
            if special != 0 {
                return (p &+ special.trailingZeroBitCount &>> 3, true)  // little-endian: lowest bits = first byte
            }
            p &+= 8
        }
        return (p, false)
    }

    /// Scans a string token starting at the opening quote; validates escapes and UTF-8. Returns whether the
    /// string contains a backslash escape.
    @discardableResult @inline(__always)
    mutating func scanString() throws(EnvelopeError) -> Bool {
        var escaped = false
        pos += 1
        let count = buf.count
        while pos < count {
            // Runs of plain printable ASCII (no quote, no backslash): the common case, eight bytes at a time.
            var p = pos
            var found = false
            if let base = buf.baseAddress { (p, found) = JSONScanner.skipPlainWords(base, from: p, count) }
            if !found {
                while p < count {
                    let b = buf[p]
                    guard b &- 0x20 < 0x60, b != UInt8(ascii: "\""), b != UInt8(ascii: "\\") else { break }
                    p += 1
                }
            }
            pos = p
            guard p < count else { break }
            let c = buf[p]
            if c == UInt8(ascii: "\"") { pos += 1; return escaped }
            if c == UInt8(ascii: "\\") {
                escaped = true
                pos += 1
                guard let e = peek() else { break }
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    pos += 1
                case UInt8(ascii: "u"):
                    pos += 1
                    let unit = try hexQuad()
                    if unit >= 0xD800 && unit < 0xDC00 {
                        guard pos + 1 < buf.count, buf[pos] == UInt8(ascii: "\\"), buf[pos + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired high surrogate") }
                        pos += 2
                        let low = try hexQuad()
                        guard low >= 0xDC00 && low < 0xE000 else { throw fail("invalid low surrogate") }
                    } else if unit >= 0xDC00 && unit < 0xE000 {
                        throw fail("unpaired low surrogate")
                    }
                default:
                    throw fail("invalid escape")
                }
                continue
            }
            if c < 0x20 { throw fail("control character in string") }
            if c < 0x80 { pos += 1; continue }
            try scanUTF8Sequence(lead: c)
        }
        throw fail("unterminated string")
    }

    mutating func hexQuad() throws(EnvelopeError) -> UInt32 {
        guard pos + 4 <= buf.count else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for k in 0..<4 {
            guard let h = hexValue(buf[pos + k]) else { throw fail("invalid \\u escape") }
            v = v << 4 | UInt32(h)
        }
        pos += 4
        return v
    }

    /// Validates one multi-byte UTF-8 sequence (no overlongs, no surrogates, at most U+10FFFF).
    mutating func scanUTF8Sequence(lead: UInt8) throws(EnvelopeError) {
        let need: Int
        var lo: UInt8 = 0x80, hi: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: need = 1
        case 0xE0: need = 2; lo = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: need = 2
        case 0xED: need = 2; hi = 0x9F
        case 0xF0: need = 3; lo = 0x90
        case 0xF1...0xF3: need = 3
        case 0xF4: need = 3; hi = 0x8F
        default: throw fail("invalid UTF-8")
        }
        guard pos + need < buf.count else { throw fail("truncated UTF-8") }
        let second = buf[pos + 1]
        guard second >= lo && second <= hi else { throw fail("invalid UTF-8") }
        for k in 2...max(2, need) where k <= need {
            let b = buf[pos + k]
            guard b >= 0x80 && b <= 0xBF else { throw fail("invalid UTF-8") }
        }
        pos += need + 1
    }
}

/// The elements of a JSON array, validated by the same scanner as every frame: each element's kind and bytes
/// (nested values untouched). Nil when `json` is not one valid JSON array (surrounding whitespace allowed).
public func jsonArrayElements(_ json: ArraySlice<UInt8>, maxDepth: Int = 64) -> [(kind: JSONKind, bytes: ArraySlice<UInt8>)]? {
    let bytes = Array(json)
    return bytes.withUnsafeBufferPointer { buf -> [(kind: JSONKind, bytes: ArraySlice<UInt8>)]? in
        var scanner = JSONScanner(buf, maxDepth: maxDepth)
        var spans: [JSONSpan] = []
        do throws(EnvelopeError) {
            scanner.skipWhitespace()
            guard scanner.peek() == UInt8(ascii: "[") else { return nil }
            scanner.pos += 1
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "]") {
                scanner.pos += 1
            } else {
                while true {
                    scanner.skipWhitespace()
                    spans.append(try scanner.scanValue(depth: 2))
                    scanner.skipWhitespace()
                    guard let c = scanner.peek() else { return nil }
                    scanner.pos += 1
                    if c == UInt8(ascii: "]") { break }
                    guard c == UInt8(ascii: ",") else { return nil }
                }
            }
            scanner.skipWhitespace()
            guard scanner.pos == buf.count else { return nil }
        } catch {
            return nil
        }
        let base = json.startIndex
        return spans.map { (kind: $0.kind, bytes: json[(base + $0.range.lowerBound)..<(base + $0.range.upperBound)]) }
    }
}
