import Foundation
import Testing
@testable import FluxCore

/// Differential fuzzing of the envelope scanner against Foundation's JSONSerialization (with `.fragmentsAllowed`)
/// as the reference parser: both must agree on whether the bytes are valid JSON.
///
/// The scanner's verdict "valid JSON" is: accepted, or rejected with `notAnObject` / `duplicateKey` (both are
/// `bad-message`, which SPEC.md §3 only gives to bytes that are valid JSON). `invalidJSON` (`bad-json`) is
/// "invalid".
///
/// Known, legitimate differences, excluded by a precise predicate on the input (each counted and reported):
/// - E1 encoding detection: Foundation guesses UTF-16/UTF-32 when the input starts with a byte order mark
///   (EF BB BF, FE FF, FF FE) or has a 0x00 byte among its first 4 bytes; the protocol is UTF-8 only and rejects.
/// - E2 trailing commas: Foundation accepts `,` followed by optional whitespace and `]` or `}` (outside strings);
///   RFC 8259 does not.
/// - E3 huge numbers: Foundation rejects a number literal whose value overflows a Double (e.g. 1e400); RFC 8259's
///   grammar accepts it and the protocol forwards numbers untouched.
/// - E4 depth: the protocol rejects nesting deeper than 64 (SPEC.md §3); Foundation's limit is 512.
/// - E6 a raw U+FEFF in a string (key or value): Foundation drops it at the start of the string and right after an
///   escape (it makes a string of each run between escapes, and CoreFoundation strips a leading byte order mark);
///   the protocol keeps every byte. (E5, keys equal as Swift strings, is
///   handled where keys are compared, in Fuzz/.)
/// Everything else must agree. Lone surrogate escapes, duplicate keys and invalid UTF-8 need no exclusion: on
/// those Foundation's validity verdict is the protocol's.
struct EnvelopeFuzzTests {
    enum Verdict: Equatable { case valid, invalid }

    static func scanner(_ b: [UInt8]) -> Verdict {
        do {
            _ = try Envelope(body: b)
            return .valid
        } catch {
            switch error {
            case .invalidJSON: return .invalid
            case .notAnObject, .duplicateKey: return .valid
            }
        }
    }

    static func foundation(_ b: [UInt8]) -> Verdict {
        (try? JSONSerialization.jsonObject(with: Data(b), options: .fragmentsAllowed)) == nil ? .invalid : .valid
    }

    enum Exclusion: String, CaseIterable { case encoding = "E1", trailingComma = "E2", hugeNumber = "E3", depth = "E4", byteOrderMark = "E6" }

    /// Which known difference (if any) applies to `b`. Strings are delimited by unescaped quotes.
    static func exclusion(_ b: [UInt8]) -> Exclusion? {
        if b.starts(with: [0xEF, 0xBB, 0xBF]) || b.starts(with: [0xFE, 0xFF]) || b.starts(with: [0xFF, 0xFE])
            || b.prefix(4).contains(0) {
            return .encoding
        }
        var inString = false
        var escaped = false
        var depth = 0
        var maxDepth = 0
        var lastSignificant: UInt8 = 0
        var i = 0
        var trailingComma = false
        var huge = false
        var bom = false
        while i < b.count {
            let c = b[i]
            if inString {
                if c == 0xEF, b[i...].starts(with: [0xEF, 0xBB, 0xBF]) { bom = true }
                if escaped { escaped = false } else if c == UInt8(ascii: "\\") { escaped = true }
                else if c == UInt8(ascii: "\"") { inString = false; lastSignificant = c }
                i += 1
                continue
            }
            switch c {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1; maxDepth = max(maxDepth, depth)
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if lastSignificant == UInt8(ascii: ",") { trailingComma = true }
                depth -= 1
            case UInt8(ascii: "-"), 48...57:
                var j = i
                while j < b.count, "+-.eE0123456789".utf8.contains(b[j]) { j += 1 }
                if let d = Double(String(decoding: b[i..<j], as: UTF8.self)), d.isInfinite { huge = true }
                lastSignificant = b[j - 1]
                i = j
                continue
            default: break
            }
            if c != 0x20 && c != 0x09 && c != 0x0A && c != 0x0D { lastSignificant = c }
            i += 1
        }
        if maxDepth > 64 { return .depth }
        if trailingComma { return .trailingComma }
        if huge { return .hugeNumber }
        if bom { return .byteOrderMark }
        return nil
    }

    static let seeds: [String] = [
        #"{"op":"hello","protocol":1,"role":"client","name":"todo-view"}"#,
        #"{"op":"dispatch","id":"c-1","type":"todo/add","payload":{"title":"milk \"2%\"","tags":["a","b"],"n":[1,-2.5e3,0.125]},"settle":true,"cause":41}"#,
        #"{"op":"done","store":"todos","seq":42,"state":{"items":[{"id":1,"t":"\u00e9\ud83d\ude00\n"}],"ok":true,"none":null}}"#,
        #"{"op":"reject","store":"todos","seq":42,"error":{"code":"todo/not-found","message":"no such item: caf\u00e9 😀"}}"#,
        #"{"op":"settled","id":"c-1","seq":42,"results":[{"store":"stats","status":"rejected","error":{"code":"x"}},{"store":"todos","status":"done","version":6}]}"#,
        #"{"op":"query","id":"q-1","store":"comments","query":{"site":7,"tags":[],"deep":[[[{}]]]}}"#,
        #" { "op" : "ping" , "id" : "p" } "#,
        #"{"op":"ping","op":"pong","id":"x"}"#,
        #"{"a":"\\\/\b\f\r\t","b":-0,"c":1E+2,"d":false}"#,
        "[1,\"two\",{\"three\":3.0e-1}]",
        "\"just a string\"",
        "{}",
    ]

    static let inserts: [[UInt8]] = [
        [0x22], [0x5C], Array(#"\u"#.utf8), Array(#"\ud800"#.utf8), Array(#"\udc00"#.utf8), [0x80], [0xBF], [0xC0],
        [0xC3], [0xE2], [0xED], [0xED, 0xA0, 0x80], [0xF0], [0xF4, 0x90], [0xFF], [0x00], [0x01], [0x1F], [0x7F],
        Array("{".utf8), Array("}".utf8), Array("[".utf8), Array("]".utf8), Array(",".utf8), Array(":".utf8),
        Array("0".utf8), Array("-".utf8), Array(".".utf8), Array("e".utf8), Array("1e999".utf8), Array(" ".utf8),
        Array("\n".utf8), Array("true".utf8), Array("nul".utf8), Array("\"\"".utf8), Array("é".utf8),
    ]

    static func mutate(_ input: [UInt8], _ rng: inout SeededRNG) -> [UInt8] {
        var b = input
        let rounds = 1 + Int(rng.next() % 3)
        for _ in 0..<rounds {
            let at = b.isEmpty ? 0 : Int(rng.next() % UInt64(b.count))
            switch rng.next() % 7 {
            case 0 where !b.isEmpty: b[at] = UInt8(truncatingIfNeeded: rng.next())
            case 1 where !b.isEmpty: b[at] ^= 1 << UInt8(rng.next() % 8)
            case 2 where !b.isEmpty: b.remove(at: at)
            case 3: b = Array(b[..<at])
            case 4 where !b.isEmpty:
                let end = min(b.count, at + 1 + Int(rng.next() % 8))
                b.insert(contentsOf: Array(b[at..<end]), at: at)
            default: b.insert(contentsOf: inserts[Int(rng.next() % UInt64(inserts.count))], at: at)
            }
        }
        return b
    }

    @Test func differentialMutations() {
        var rng = SeededRNG(seed: 20_250_101)
        var compared = 0
        var excluded: [Exclusion: Int] = [:]
        var verdicts: [Verdict: Int] = [:]
        var mismatches: [String] = []
        // Inputs where the scanner stopped at a duplicate top-level key although the rest is not valid JSON
        // (FluxCore bug: SPEC.md §3 gives bad-json precedence over bad-message). Reported separately so any
        // other disagreement stays visible.
        var duplicateKeyFirst: [String] = []
        let corpus = Self.seeds.map { Array($0.utf8) }
        for i in 0..<150_000 {
            let input = Self.mutate(corpus[i % corpus.count], &rng)
            if let e = Self.exclusion(input) { excluded[e, default: 0] += 1; continue }
            let ours = Self.scanner(input)
            let theirs = Self.foundation(input)
            compared += 1
            verdicts[ours, default: 0] += 1
            if ours != theirs {
                let what: String
                var isDuplicate = false
                do { _ = try Envelope(body: input); what = "ok" } catch {
                    what = error.message
                    if case .duplicateKey = error { isDuplicate = true }
                }
                if isDuplicate && theirs == .invalid {
                    duplicateKeyFirst.append("\(hex(input)) \(String(decoding: input, as: UTF8.self).debugDescription)")
                    continue
                }
                mismatches.append("scanner \(ours) (\(what)), Foundation \(theirs): \(hex(input)) \(String(decoding: input, as: UTF8.self).debugDescription)")
            }
        }
        // The mutations must exercise both verdicts and stay mostly comparable.
        #expect(compared > 120_000)
        #expect(verdicts[.valid, default: 0] > 5_000)
        #expect(verdicts[.invalid, default: 0] > 40_000)
        if !mismatches.isEmpty {
            Issue.record("""
                \(mismatches.count) of \(compared) inputs where the scanner and Foundation disagree \
                (excluded: \(excluded.map { "\($0.key.rawValue)=\($0.value)" }.sorted())); first ones:
                \(mismatches.prefix(8).joined(separator: "\n"))
                """)
        }
        if !duplicateKeyFirst.isEmpty {
            Issue.record("""
                FluxCore bug: \(duplicateKeyFirst.count) invalid JSON inputs classified duplicateKey (bad-message) \
                instead of invalidJSON (bad-json); first ones:
                \(duplicateKeyFirst.prefix(3).joined(separator: "\n"))
                """)
        }
    }

    /// The exclusion predicates do what they say (so they cannot silently swallow real differences).
    @Test func exclusionPredicates() {
        func ex(_ s: String) -> Exclusion? { Self.exclusion(Array(s.utf8)) }
        #expect(ex(#"{"a":[1,]}"#) == .trailingComma)
        #expect(ex(#"{"a":1 , }"#) == .trailingComma)
        #expect(ex(#"{"a":",]"}"#) == nil)
        #expect(ex(#"{"a":"\",]"}"#) == nil)
        #expect(ex(#"{"a":1e400}"#) == .hugeNumber)
        #expect(ex(#"{"a":1e300}"#) == nil)
        #expect(ex(#"{"a":"1e400"}"#) == nil)
        #expect(ex(String(repeating: "[", count: 65)) == .depth)
        #expect(ex(String(repeating: "[", count: 64)) == nil)
        #expect(Self.exclusion([0xEF, 0xBB, 0xBF, 0x7B, 0x7D]) == .encoding)
        #expect(Self.exclusion([0x7B, 0x00, 0x7D, 0x00]) == .encoding)
        #expect(Self.exclusion([0x7B, 0x7D, 0x20, 0x20, 0x00]) == nil)
        #expect(ex("{\"\u{FEFF}a\":1}") == .byteOrderMark)
        #expect(ex("{\"a\":[\"\u{FEFF}x\"]}") == .byteOrderMark)
        #expect(ex("{\"a\\n\u{FEFF}\":1}") == .byteOrderMark)
        #expect(ex("{\"a\":1}\u{FEFF}") == nil)
        #expect(ex(#"{"\ufeffa":1}"#) == nil)
        // And the differences really exist in this Foundation (if one disappears, its exclusion can go).
        #expect(Self.foundation(Array(#"{"a":[1,]}"#.utf8)) == .valid)
        #expect(Self.foundation(Array(#"{"a":1e400}"#.utf8)) == .invalid)
        #expect(Self.scanner(Array(#"{"a":1e400}"#.utf8)) == .valid)
        #expect(Self.scanner(Array(#"{"a":[1,]}"#.utf8)) == .invalid)
        let bom = try? JSONSerialization.jsonObject(with: Data("{\"\u{FEFF}a\":1}".utf8)) as? [String: Any]
        #expect(bom?.keys.first == "a")
        let afterEscape = try? JSONSerialization.jsonObject(with: Data("{\"a\\n\u{FEFF}b\":1}".utf8)) as? [String: Any]
        #expect(afterEscape?.keys.first == "a\nb")
    }

    // MARK: valid documents: both accept, and the scanner's spans hold the values Foundation sees

    static func randomString(_ rng: inout SeededRNG) -> String {
        let pieces: [String] = ["a", "Z", "0", " ", "é", "€", "😀", "\u{7F}", "\u{80}", "\u{7FF}", "\u{800}",
                                "\u{FFFF}", "\u{10000}", "\u{10FFFF}", "\"", "\\", "/", "\n", "\t", "\u{01}"]
        let n = Int(rng.next() % 8)
        return (0..<n).map { _ in pieces[Int(rng.next() % UInt64(pieces.count))] }.joined()
    }

    /// A JSON string literal with a random mix of raw characters and escapes.
    static func literal(_ s: String, _ rng: inout SeededRNG) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            let v = scalar.value
            let escape = v < 0x20 || v == 0x22 || v == 0x5C || rng.next() % 4 == 0
            if !escape { out.unicodeScalars.append(scalar); continue }
            switch v {
            case 0x22: out += "\\\""
            case 0x5C: out += "\\\\"
            case 0x0A where rng.next() % 2 == 0: out += "\\n"
            case 0x2F where rng.next() % 2 == 0: out += "\\/"
            case 0x10000...:
                let u = v - 0x10000
                out += String(format: "\\u%04x\\u%04X", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF))
            default: out += String(format: rng.next() % 2 == 0 ? "\\u%04x" : "\\u%04X", v)
            }
        }
        return out + "\""
    }

    static func randomValue(_ rng: inout SeededRNG, depth: Int) -> String {
        let ws = [" ", "", "", "\n", "\t", "\r\n"]
        func w() -> String { ws[Int(rng.next() % UInt64(ws.count))] }
        switch rng.next() % (depth > 5 ? 4 : 6) {
        case 0: return literal(randomString(&rng), &rng)
        case 1:
            let numbers = ["0", "-0", "1", "-12", "3.25", "1e3", "1E-3", "-2.5e+10", "123456789012345678901234567890",
                           "0.000001", "1e-400"]
            return numbers[Int(rng.next() % UInt64(numbers.count))]
        case 2: return ["true", "false", "null"][Int(rng.next() % 3)]
        case 3: return literal(randomString(&rng), &rng)
        case 4:
            let n = Int(rng.next() % 4)
            return "[" + w() + (0..<n).map { _ in randomValue(&rng, depth: depth + 1) }.joined(separator: w() + "," + w()) + w() + "]"
        default:
            let n = Int(rng.next() % 4)
            return "{" + w() + (0..<n).map { k in "\"k\(k)\"" + w() + ":" + w() + randomValue(&rng, depth: depth + 1) }
                .joined(separator: "," + w()) + w() + "}"
        }
    }

    @Test func randomValidDocuments() throws {
        var rng = SeededRNG(seed: 42)
        for _ in 0..<3_000 {
            let n = Int(rng.next() % 6)
            var keys: [String] = []
            while keys.count < n {
                let k = "k" + Self.randomString(&rng)
                if !keys.contains(where: { Array($0.utf8) == Array(k.utf8) }) { keys.append(k) }
            }
            let text = " {" + keys.map { Self.literal($0, &rng) + ":" + Self.randomValue(&rng, depth: 2) }
                .joined(separator: " ,") + "} "
            let b = Array(text.utf8)
            let env: Envelope
            do { env = try Envelope(body: b) } catch {
                Issue.record("rejected valid JSON (\(error.message)): \(text.debugDescription)")
                continue
            }
            let ref = try #require(try JSONSerialization.jsonObject(with: Data(b)) as? [String: Any])
            #expect(env.fields.map { Array($0.key.utf8) } == keys.map { Array($0.utf8) })
            #expect(ref.count == keys.count)
            for field in env.fields {
                let valueBytes = Data(b[field.value.range])
                let alone = try JSONSerialization.jsonObject(with: valueBytes, options: .fragmentsAllowed)
                let inDoc = try #require(ref[field.key])
                let opts: JSONSerialization.WritingOptions = [.sortedKeys, .fragmentsAllowed]
                let a = try JSONSerialization.data(withJSONObject: alone, options: opts)
                let d = try JSONSerialization.data(withJSONObject: inDoc, options: opts)
                #expect(a == d, "\(field.key.debugDescription) in \(text.debugDescription)")
                if field.value.kind == .string {
                    #expect(decodeJSONString(b[field.value.range]) == (alone as? String))
                }
            }
        }
    }
}
