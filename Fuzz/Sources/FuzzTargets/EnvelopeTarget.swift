import Foundation
import FluxCore

/// Target b: the envelope scanner (`Envelope(body:)`) against Foundation's JSONSerialization on arbitrary bytes,
/// the coverage-guided form of Tests/FluxCoreTests/EnvelopeFuzzTests.swift (same verdicts, same exclusions):
/// - verdict: the scanner says "valid JSON" when it accepts or rejects with `notAnObject` / `duplicateKey`
///   (`bad-message` is only for valid JSON, SPEC §3), "invalid" on `invalidJSON`; Foundation (with
///   `.fragmentsAllowed`) must agree, except on the known differences E1-E4 and E6 (see `exclusion`);
/// - accepted: Foundation's top level is an object with the same keys; every top-level field's span, parsed
///   alone, is the value Foundation found for that key (compared re-serialized with sorted keys); string fields
///   decode to Foundation's string; the well-known keys' spans (`span(.op)` …) are the ones in `fields`; the typed
///   accessors do not crash and agree with the span's kind;
/// - `notAnObject`: Foundation's top level is not an object; `duplicateKey(k)`: `k` is a top-level key twice.
enum EnvelopeTarget {
    enum Verdict: Equatable { case valid, invalid }

    static func run(_ data: UnsafeBufferPointer<UInt8>) {
        let b = Array(data)
        if exclusion(b) != nil { return }
        let parsed: Any? = try? JSONSerialization.jsonObject(with: Data(b), options: .fragmentsAllowed)
        let theirs: Verdict = parsed == nil ? .invalid : .valid
        let env: Envelope
        do {
            env = try Envelope(body: b)
        } catch {
            switch error {
            case .invalidJSON(let offset, let reason):
                fuzzCheck(theirs == .invalid, "scanner: invalid JSON at \(offset) (\(reason)), Foundation: valid: \(show(b))")
                fuzzCheck(offset >= 0 && offset <= b.count, "error offset \(offset) outside the body (\(b.count))")
            case .notAnObject:
                fuzzCheck(theirs == .valid, "scanner: not an object (valid JSON), Foundation: invalid: \(show(b))")
                fuzzCheck(!(parsed is [String: Any]), "scanner: not an object, Foundation: an object: \(show(b))")
            case .duplicateKey(let key):
                fuzzCheck(theirs == .valid, "scanner: duplicate key \(key.debugDescription) (valid JSON), Foundation: invalid: \(show(b))")
                fuzzCheck(parsed is [String: Any], "scanner: duplicate key, Foundation: not an object: \(show(b))")
            }
            return
        }
        fuzzCheck(theirs == .valid, "scanner accepted, Foundation rejected: \(show(b))")
        guard let object = parsed as? [String: Any] else { fuzzFail("scanner accepted an object, Foundation parsed \(type(of: parsed!)): \(show(b))") }
        checkFields(env, object, b)
    }

    static func checkFields(_ env: Envelope, _ object: [String: Any], _ b: [UInt8]) {
        let fields = env.fields
        // Distinct keys as bytes (the scanner's rule); Foundation's dictionary compares Swift Strings, which merges
        // canonically equivalent keys ("é" and "e\u{301}"): E5, such keys are not compared.
        let asStrings = Dictionary(grouping: fields.map(\.key), by: { $0 })
        let merged = Set(asStrings.filter { $0.value.count > 1 }.keys)
        for (i, f) in fields.enumerated() {
            for g in fields[(i + 1)...] {
                fuzzCheck(Array(f.key.utf8) != Array(g.key.utf8), "accepted a duplicate key \(f.key.debugDescription): \(show(b))")
            }
        }
        if merged.isEmpty {
            fuzzCheck(object.count == fields.count, "scanner found \(fields.count) top-level fields, Foundation \(object.count): \(show(b))")
        }
        var previousEnd = 0
        for field in fields {
            let span = field.value
            fuzzCheck(span.range.lowerBound >= previousEnd && span.range.upperBound <= b.count && !span.range.isEmpty,
                      "span \(span.range) of \(field.key.debugDescription) out of order or outside the body: \(show(b))")
            previousEnd = span.range.upperBound
            if merged.contains(field.key) { continue }
            guard let inDoc = object[field.key] else { fuzzFail("Foundation has no key \(field.key.debugDescription): \(show(b))") }
            let valueBytes = Array(b[span.range])
            guard let alone = try? JSONSerialization.jsonObject(with: Data(valueBytes), options: .fragmentsAllowed) else {
                fuzzFail("the span of \(field.key.debugDescription) is not a JSON value alone: \(show(valueBytes)) in \(show(b))")
            }
            let opts: JSONSerialization.WritingOptions = [.sortedKeys, .fragmentsAllowed]
            let a = try? JSONSerialization.data(withJSONObject: alone, options: opts)
            let d = try? JSONSerialization.data(withJSONObject: inDoc, options: opts)
            fuzzCheck(a == d, "the span of \(field.key.debugDescription) holds another value than Foundation's: \(show(b))")
            let kind = span.kind
            switch kind {
            case .string:
                let s = decodeJSONString(b[span.range])
                fuzzCheck(Array(s.utf8) == Array(((alone as? String) ?? "\u{FFFF}<not a string>").utf8),
                          "string \(field.key.debugDescription) decodes to \(s.debugDescription), Foundation: \(String(describing: alone)): \(show(b))")
                fuzzCheck(env.string(field.key).value.map { Array($0.utf8) } == Array(s.utf8), "string(_:) disagrees with the span")
            case .object: fuzzCheck(alone is [String: Any], "kind object, Foundation \(type(of: alone))")
            case .array:
                fuzzCheck(alone is [Any], "kind array, Foundation \(type(of: alone))")
                _ = env.stringArray(field.key)
            case .number:
                if case .value(let v) = env.int(field.key) {
                    fuzzCheck(!valueBytes.contains(where: { $0 == UInt8(ascii: ".") || $0 | 0x20 == UInt8(ascii: "e") }),
                              "int(_:) read \(v) from a fraction or exponent: \(show(valueBytes))")
                    fuzzCheck(String(v) == String(decoding: valueBytes, as: UTF8.self) || valueBytes == Array("-0".utf8),
                              "int(_:) read \(v) from \(show(valueBytes))")
                }
            case .bool:
                fuzzCheck(env.bool(field.key).value == (valueBytes == Array("true".utf8)), "bool(_:) disagrees with \(show(valueBytes))")
            case .null:
                fuzzCheck(alone is NSNull, "kind null, Foundation \(type(of: alone))")
            }
            fuzzCheck(env.span(field.key) == span || merged.contains(field.key), "span(_:) of \(field.key.debugDescription) is not the field's span")
        }
        for key in EnvelopeKey.allCases {
            let fromFields = fields.first { $0.key == key.name && Array($0.key.utf8) == Array(key.name.utf8) }?.value
            fuzzCheck(env.span(key) == fromFields, "span(.\(key.name)) is \(String(describing: env.span(key))), fields say \(String(describing: fromFields))")
        }
        // isString compares the raw bytes (no escapes decoded).
        let opRaw = env.span(.op).flatMap { s in s.kind == .string ? Array(b[(s.range.lowerBound + 1)..<(s.range.upperBound - 1)]) : nil }
        fuzzCheck(env.isString(.op, "dispatch") == (opRaw == Array("dispatch".utf8)), "isString(.op, \"dispatch\") wrong for \(show(b))")
    }

    static func show(_ b: [UInt8]) -> String {
        let hex = b.prefix(256).map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
        return "\(b.count) bytes \(hex) \(String(decoding: b.prefix(256), as: UTF8.self).debugDescription)"
    }

    enum Exclusion: String { case encoding = "E1", trailingComma = "E2", hugeNumber = "E3", depth = "E4", byteOrderMark = "E6" }

    /// The known, legitimate differences between the protocol's JSON and Foundation's, exactly as in
    /// EnvelopeFuzzTests.exclusion (keep the two in step):
    /// - E1 encoding detection: Foundation guesses UTF-16/UTF-32 when the input starts with a byte order mark or has
    ///   a 0x00 byte among its first 4 bytes; the protocol is UTF-8 only and rejects;
    /// - E2 trailing commas: Foundation accepts `,` before `]` or `}`; RFC 8259 does not;
    /// - E3 huge numbers: Foundation rejects a number that overflows a Double; the protocol forwards numbers untouched;
    /// - E4 depth: the protocol rejects nesting deeper than 64 (SPEC §3); Foundation's limit is 512;
    /// - E6 a raw U+FEFF in a string (key or value): Foundation drops it at the start of the string and right
    ///   after an escape (CoreFoundation strips a leading byte order mark from each run between escapes); the
    ///   protocol keeps every byte.
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
}
