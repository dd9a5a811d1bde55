import Foundation
import Testing
@testable import FluxCore

/// protocol/vectors/envelope.json run through `Envelope(body:)`.
struct EnvelopeVectorTests {
    struct Case: Decodable, CustomTestStringConvertible {
        var name: String
        var body: String?
        var body_hex: String?
        var expect: String
        var keys: [String]?
        var raw: [String: String]?
        var testDescription: String { name }

        var bytes: [UInt8] {
            if let body { return Array(body.utf8) }
            if let body_hex { return FluxCoreTests.bytes(hex: body_hex) }
            preconditionFailure("case \(name) has no body")
        }
    }

    struct File: Decodable {
        var maxDepth: Int
        var cases: [Case]
    }

    static let file: File = {
        do { return try JSONDecoder().decode(File.self, from: ProtocolFiles.vectors("envelope.json")) }
        catch { fatalError("cannot read envelope.json: \(error)") }
    }()

    @Test func vectorFileIsComplete() {
        #expect(Self.file.maxDepth == 64)
        #expect(Self.file.cases.count >= 60)
        for expect in ["ok", "bad-json", "bad-message"] {
            #expect(Self.file.cases.contains { $0.expect == expect })
        }
    }

    @Test(arguments: file.cases)
    func vector(_ c: Case) {
        let body = c.bytes
        switch c.expect {
        case "ok":
            do {
                let env = try Envelope(body: body, maxDepth: Self.file.maxDepth)
                // Compare keys as bytes: Swift's String == treats canonically equivalent strings as equal,
                // JSON (RFC 8259 §8.3) compares names code unit by code unit.
                #expect(env.fields.map { Array($0.key.utf8) } == (c.keys ?? []).map { Array($0.utf8) })
                for (key, text) in c.raw ?? [:] {
                    let field = env.fields.first { Array($0.key.utf8) == Array(key.utf8) }
                    guard let field else { Issue.record("no field \(key)"); continue }
                    #expect(String(decoding: body[field.value.range], as: UTF8.self) == text, "value of \(key)")
                    #expect(env.raw(key).map { String(decoding: $0, as: UTF8.self) } == text, "raw(\(key))")
                }
            } catch {
                Issue.record("expected ok, got \(error.code.rawValue): \(error.message)")
            }
        default:
            do {
                let env = try Envelope(body: body, maxDepth: Self.file.maxDepth)
                Issue.record("expected \(c.expect), got ok with keys \(env.fields.map(\.key))")
            } catch {
                #expect(error.code.rawValue == c.expect, "\(error.message)")
            }
        }
    }

    /// Each span's kind matches its first byte, and spans lie inside the body in order.
    @Test func spanKinds() throws {
        let body = Array(#"{"s":"x","n":-1.5,"t":true,"f":false,"z":null,"a":[1],"o":{"k":1}}"#.utf8)
        let env = try Envelope(body: body)
        let kinds = env.fields.map(\.value.kind)
        #expect(kinds == [.string, .number, .bool, .bool, .null, .array, .object])
        var last = 0
        for f in env.fields {
            #expect(f.value.range.lowerBound >= last)
            last = f.value.range.upperBound
        }
        #expect(env.string("s") == .value("x"))
        #expect(env.string("n") == .wrongType)
        #expect(env.string("missing") == .absent)
        #expect(env.int("n") == .wrongType)
        #expect(env.bool("t") == .value(true))
        #expect(env.bool("f") == .value(false))
        #expect(env.has("z"))
        #expect(!env.has("Z"))
    }

    /// Strings of every length up to past two scan words, with an escape, a non-ASCII character, a control byte,
    /// an invalid byte or no closing quote at every position, as a value, a key and a nested value: the scanner's
    /// plain-ASCII fast path and its full scan agree on validity and on where the string ends.
    @Test func stringsAtEveryLengthAndPosition() throws {
        let inserts: [(bytes: [UInt8], valid: Bool)] = [
            ([], true), (Array(#"\n"#.utf8), true), (Array(#"\u00e9"#.utf8), true), ([0xC3, 0xA9], true),
            ([0x1F], false), ([0xFF], false), ([0xC3], false), (Array(#"\x"#.utf8), false),
        ]
        for length in 0...20 {
            for at in 0...length {
                for insert in inserts {
                    var text = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    text.insert(contentsOf: insert.bytes, at: at)
                    let token = [UInt8(ascii: "\"")] + text + [UInt8(ascii: "\"")]
                    let asValue = Array(#"{"op":"x","k":"#.utf8) + token + Array("}".utf8)
                    let asKey = Array("{".utf8) + token + Array(#":1,"op":"x"}"#.utf8)
                    let nested = Array(#"{"p":{"#.utf8) + token + Array(#":["#.utf8) + token + Array(#"]},"op":"x"}"#.utf8)
                    for body in [asValue, asKey, nested] {
                        let env = try? Envelope(body: body)
                        #expect((env != nil) == insert.valid, "\(String(decoding: body, as: UTF8.self))")
                    }
                    if insert.valid {
                        #expect(try Envelope(body: asValue).raw("k").map { Array($0) } == token)
                        #expect(try Envelope(body: nested).raw("p").map { Array($0) }
                                == Array("{".utf8) + token + Array(":[".utf8) + token + Array("]}".utf8))
                    }
                    // No closing quote: the body ends inside the string.
                    let open = Array(#"{"op":"x","k":"#.utf8) + [UInt8(ascii: "\"")] + text
                    #expect((try? Envelope(body: open)) == nil)
                }
            }
        }
    }

    /// Whitespace runs of every length up to 20, of spaces with a tab, newline, carriage return or an invalid byte
    /// at every position, between every pair of tokens: valid runs are skipped wherever they are (eight spaces at a
    /// time or byte by byte), and a non-whitespace byte in a run is an error at its offset.
    @Test func whitespaceRunsAtEveryLengthAndPosition() throws {
        let others: [(byte: UInt8?, valid: Bool)] = [(nil, true), (0x09, true), (0x0A, true), (0x0D, true),
                                                     (0x0B, false), (0x00, false), (0xA0, false)]
        for length in 0...20 {
            for at in 0...length {
                for other in others {
                    var ws = [UInt8](repeating: 0x20, count: length)
                    if let byte = other.byte { ws.insert(byte, at: at) }
                    let w = String(decoding: ws, as: UTF8.self)
                    let bodies = [
                        "\(w){\(w)\"op\"\(w):\(w)\"x\"\(w),\(w)\"seq\"\(w):\(w)12\(w),\(w)\"p\"\(w):\(w)[\(w)1\(w),\(w){\(w)\"a\"\(w):\(w)true\(w)}\(w)]\(w)}\(w)",
                        "{\"op\":\"x\",\"seq\":12\(w)}",
                        "{\"op\":\"x\",\"p\":[1\(w)]}",
                    ]
                    for text in bodies {
                        let body = Array(text.utf8)
                        if other.valid {
                            let env = try Envelope(body: body)
                            #expect(env.isString(.op, "x"), "\(text.debugDescription)")
                        } else {
                            #expect(throws: EnvelopeError.self, "\(text.debugDescription)") { try Envelope(body: body) }
                        }
                    }
                    if other.valid {
                        let env = try Envelope(body: Array(bodies[0].utf8))
                        #expect(env.int(.seq) == .value(12))
                        #expect(env.raw("p").map { String(decoding: $0, as: UTF8.self) }
                                == "[\(w)1\(w),\(w){\(w)\"a\"\(w):\(w)true\(w)}\(w)]")
                    } else if let byte = other.byte {
                        // The offending byte is reported where it is (in the run before "op").
                        let body = Array("{\(w)\"op\":\"x\"}".utf8)
                        let offset = 1 + at
                        if byte < 0x80 {
                            #expect(throws: EnvelopeError.invalidJSON(offset: offset, reason: "expected a string key")) {
                                try Envelope(body: body)
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every well-known key is recognised (written plainly or escaped) and found by its `EnvelopeKey`; keys that
    /// differ from one only by a byte more, a byte less, a trailing NUL or case are not it.
    @Test func wellKnownKeys() throws {
        for (i, key) in EnvelopeKey.allCases.enumerated() {
            let plain = try Envelope(body: Array(#"{"\#(key.name)":\#(i),"x":0}"#.utf8))
            #expect(plain.int(key) == .value(Int64(i)), "\(key.name)")
            #expect(plain.int(key.name) == .value(Int64(i)))
            let first = key.name.unicodeScalars.first!.value
            let escapedName = "\\u00" + String(first, radix: 16) + key.name.dropFirst()
            let escaped = try Envelope(body: Array(#"{"\#(escapedName)":\#(i)}"#.utf8))
            #expect(escaped.int(key) == .value(Int64(i)), "\(escapedName)")
            for other in [key.name + "\\u0000", key.name + "s", String(key.name.dropLast()), key.name.uppercased()] {
                let env = try Envelope(body: Array(#"{"\#(other)":\#(i)}"#.utf8))
                #expect(env.span(key) == nil, "\(other) taken for \(key.name)")
                #expect(env.fields.count == 1)
            }
        }
        #expect(throws: EnvelopeError.duplicateKey("op")) { try Envelope(body: Array(#"{"op":1,"\u006fp":2}"#.utf8)) }
    }

    @Test func typedAccessors() throws {
        let body = Array(#"{"op":"register","store":"todos","handles":["todo/*", "x\u002fy"],"seq":42,"neg":-7,"big":9223372036854775808,"frac":1.0,"exp":1e2,"mixed":["a",1],"empty":[]}"#.utf8)
        let env = try Envelope(body: body)
        #expect(env.string("op").value == "register")
        #expect(env.stringArray("handles") == .value(["todo/*", "x/y"]))
        #expect(env.stringArray("empty") == .value([]))
        #expect(env.stringArray("mixed") == .wrongType)
        #expect(env.stringArray("store") == .wrongType)
        #expect(env.int("seq") == .value(42))
        #expect(env.int("neg") == .value(-7))
        #expect(env.int("big") == .wrongType)
        #expect(env.int("frac") == .wrongType)
        #expect(env.int("exp") == .wrongType)
        #expect(env.int("nope") == .absent)
    }

    @Test func errorCodesAndMessages() {
        #expect(EnvelopeError.invalidJSON(offset: 3, reason: "x").code == .badJSON)
        #expect(EnvelopeError.notAnObject.code == .badMessage)
        #expect(EnvelopeError.duplicateKey("op").code == .badMessage)
        #expect(EnvelopeError.duplicateKey("op").message.contains("op"))
        #expect(EnvelopeError.invalidJSON(offset: 3, reason: "x").message.contains("3"))
    }

    /// The error codes of protocol 1 and which of them close the connection (SPEC.md §11). Frozen: changing
    /// any of these is a protocol change; a new code is allowed growth (receivers treat unknown codes as generic,
    /// §13) and is added here with the fluxd release that sends it.
    @Test func errorCodeTableIsFrozen() {
        let expected: [String: Bool] = [
            "bad-frame": false, "too-large": true, "bad-json": false, "bad-message": false, "unknown-op": false,
            "handshake-required": true, "unsupported-version": true, "timeout": true, "forbidden": false,
            "name-taken": false, "cycle": false, "unknown-store": false, "no-handler": false, "overloaded": false,
            "store-unavailable": false, "shutting-down": false, "unknown-worker": false,
            "slow-consumer": true,  // since fluxd 0.1.1
            // since fluxd 0.2.0 (isolation limits, heartbeats)
            "limit-exceeded": false, "too-many-connections": true, "memory-budget": false, "unresponsive": true,
            // since fluxd 0.3.0 (the journal, SPEC §15)
            "disk-full": false, "journal-failed": false, "not-retained": false,
            // since fluxd 0.4.0 (patches, SPEC §16)
            "patch-failed": true,
            // since fluxd 0.4.0 (config reload, SPEC §8.11)
            "reload-refused": false,
            "outcome-quota": false,
            "disk-quota": false,
            // since fluxd 0.4.0 (forget, SPEC §10)
            "store-is-up": false,
        ]
        #expect(ErrorCode.allCases.count == expected.count)
        for code in ErrorCode.allCases {
            #expect(expected[code.rawValue] == code.isFatal, "\(code.rawValue)")
        }
    }
}
