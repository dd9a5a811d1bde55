import Testing
@testable import FluxCore

/// Defects found in FluxCore by the conformance vectors and the differential fuzz test. These tests state the
/// behaviour SPEC.md requires and fail until FluxCore is fixed (the protocol owner does not edit FluxCore).
struct FluxCoreBugTests {
    /// B1: JSON object names are compared code unit by code unit (RFC 8259 §8.3), but the duplicate-key check
    /// compares Swift `String`s, which are equal under Unicode canonical equivalence: `"\u00e9"` (é) and
    /// `"e\u0301"` (e + combining acute) are reported as a duplicate key. `Envelope.span(_:)` has the same
    /// problem (looking up one finds the other). Fix: compare the keys' UTF-8 bytes (`key.utf8.elementsEqual`).
    @Test func canonicallyEquivalentKeysAreDistinct() throws {
        let body = Array(#"{"\u00e9":1,"e\u0301":2}"#.utf8)
        let env = try Envelope(body: body)
        #expect(env.fields.count == 2)
        #expect(env.raw("e\u{301}").map { Array($0) } == Array("2".utf8))
    }

    /// B2: the scanner reports a duplicate top-level key as soon as it sees it, before checking that the rest of
    /// the body is valid JSON, so an invalid body is answered `bad-message` instead of `bad-json` (SPEC.md §3: the
    /// JSON check comes first). Fix: remember the first duplicate and throw it only after the whole document
    /// scanned cleanly.
    @Test(arguments: [#"{"op":"a","op":"b",}"#, #"{"op":"a","op":"b""#, #"{"op":"a","op":"b"}x"#,
                      #"{"op":"a","op":"b","s":"\x"}"#])
    func invalidJSONWinsOverDuplicateKey(_ text: String) {
        do {
            _ = try Envelope(body: Array(text.utf8))
            Issue.record("accepted")
        } catch {
            #expect(error.code == .badJSON, "\(error.message)")
        }
    }
}
