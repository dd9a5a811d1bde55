import Foundation
import Testing
@testable import FluxCore

/// protocol/vectors/framing.json run through `FrameDecoder`, fed in every way a socket could deliver the bytes:
/// all at once, byte by byte, in two chunks split at every position, and in random chunks (many seeds). Every way
/// must give the same events and leave the same bytes pending (swift-nio's ByteToMessageDecoderVerifier,
/// nats-server's parser_test.go).
struct FramingVectorTests {
    struct Case: Decodable, CustomTestStringConvertible {
        struct Event: Decodable {
            var frame: String?
            var frame_hex: String?
            var empty: Bool?
            var tooLarge: UInt32?
        }
        var name: String
        var maxFrame: UInt32
        var input_hex: String
        var expect: [Event]
        var pending: Int
        var testDescription: String { name }

        var expected: [DecodedFrame] {
            expect.map { e in
                if let f = e.frame { return .frame(Array(f.utf8)) }
                if let h = e.frame_hex { return .frame(bytes(hex: h)) }
                if e.empty == true { return .empty }
                if let n = e.tooLarge { return .tooLarge(length: n) }
                preconditionFailure("malformed event in case \(name)")
            }
        }
    }

    struct File: Decodable { var cases: [Case] }

    static let cases: [Case] = {
        do { return try JSONDecoder().decode(File.self, from: ProtocolFiles.vectors("framing.json")).cases }
        catch { fatalError("cannot read framing.json: \(error)") }
    }()

    /// Feeds `chunks` in order, draining the decoder after each one: through `append` + `next()`, or in place
    /// through `next(from:at:)` (as a connection does) when `inPlace`.
    static func run(maxFrame: UInt32, chunks: [ArraySlice<UInt8>], inPlace: Bool = false) -> ([DecodedFrame], Int) {
        var decoder = FrameDecoder(maxFrame: maxFrame)
        var events: [DecodedFrame] = []
        for chunk in chunks {
            if inPlace {
                chunk.withUnsafeBytes { input in
                    var offset = 0
                    while let e = decoder.next(from: input, at: &offset) { events.append(e) }
                    #expect(offset == input.count, "in-place decoding must use or buffer the whole chunk")
                }
            } else {
                decoder.append(chunk)
                while let e = decoder.next() { events.append(e) }
            }
        }
        // Asking again with nothing new must not invent events.
        while let e = decoder.next() { events.append(e) }
        return (events, decoder.bufferedByteCount)
    }

    /// Both ways of feeding the decoder give the same events and leave the same bytes buffered.
    static func runBoth(maxFrame: UInt32, chunks: [ArraySlice<UInt8>]) -> ([DecodedFrame], Int) {
        let copied = run(maxFrame: maxFrame, chunks: chunks)
        let inPlace = run(maxFrame: maxFrame, chunks: chunks, inPlace: true)
        #expect(inPlace.0 == copied.0, "in-place events differ")
        #expect(inPlace.1 == copied.1, "in-place buffered bytes differ")
        return copied
    }

    @Test func vectorFileIsComplete() {
        #expect(Self.cases.count >= 10)
        let names = Self.cases.map(\.name)
        #expect(Set(names).count == names.count)
    }

    @Test(arguments: cases)
    func allAtOnce(_ c: Case) {
        let input = bytes(hex: c.input_hex)
        let (events, pending) = Self.runBoth(maxFrame: c.maxFrame, chunks: [input[...]])
        #expect(events == c.expected)
        #expect(pending == c.pending)
    }

    @Test(arguments: cases)
    func byteByByte(_ c: Case) {
        let input = bytes(hex: c.input_hex)
        let chunks = input.indices.map { input[$0..<($0 + 1)] }
        let (events, pending) = Self.runBoth(maxFrame: c.maxFrame, chunks: chunks)
        #expect(events == c.expected)
        #expect(pending == c.pending)
    }

    @Test(arguments: cases)
    func splitAtEveryBoundary(_ c: Case) {
        let input = bytes(hex: c.input_hex)
        for k in 0...input.count {
            let (events, pending) = Self.runBoth(maxFrame: c.maxFrame, chunks: [input[..<k], input[k...]])
            #expect(events == c.expected, "split at \(k)")
            #expect(pending == c.pending, "split at \(k)")
        }
    }

    @Test(arguments: cases)
    func randomSplits(_ c: Case) {
        let input = bytes(hex: c.input_hex)
        for seed in UInt64(1)...200 {
            var rng = SeededRNG(seed: seed)
            var chunks: [ArraySlice<UInt8>] = []
            var at = 0
            while at < input.count {
                // Mostly small chunks, sometimes empty ones, sometimes large ones.
                let n = rng.next() % 4 == 0 ? Int(rng.next() % UInt64(input.count + 1))
                                            : Int(rng.next() % 6)
                let end = min(input.count, at + n)
                chunks.append(input[at..<end])
                at = end
            }
            let (events, pending) = Self.runBoth(maxFrame: c.maxFrame, chunks: chunks)
            #expect(events == c.expected, "seed \(seed)")
            #expect(pending == c.pending, "seed \(seed)")
        }
    }

    /// The raw-pointer `append` behaves like the sequence one.
    @Test(arguments: cases)
    func rawPointerAppend(_ c: Case) {
        let input = bytes(hex: c.input_hex)
        var decoder = FrameDecoder(maxFrame: c.maxFrame)
        var events: [DecodedFrame] = []
        for i in input.indices {
            input[i...i].withUnsafeBytes { decoder.append($0) }
            while let e = decoder.next() { events.append(e) }
        }
        #expect(events == c.expected)
        #expect(decoder.bufferedByteCount == c.pending)
    }

    /// `encodeFrame` and `Frame(body:)` produce what the decoder reads back, with a big-endian prefix.
    @Test func encodeThenDecode() {
        var rng = SeededRNG(seed: 7)
        var stream: [UInt8] = []
        var bodies: [[UInt8]] = []
        for i in 0..<200 {
            let n = Int(rng.next() % 700) + 1
            let body = (0..<n).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            bodies.append(body)
            if i % 2 == 0 {
                stream += encodeFrame(body)
            } else {
                let f = Frame(body: body)
                stream += withExtendedLifetime(f) { Array(f.bytes) }
            }
        }
        let first = encodeFrame(bodies[0])
        let n = bodies[0].count
        #expect(Array(first[0..<4]) == [0, 0, UInt8(n >> 8), UInt8(n & 0xFF)])
        var decoder = FrameDecoder(maxFrame: 1024)
        var got: [[UInt8]] = []
        var at = 0
        while at < stream.count {
            let end = min(stream.count, at + Int(rng.next() % 900))
            decoder.append(stream[at..<end])
            at = end
            while let e = decoder.next() {
                guard case .frame(let b) = e else { Issue.record("unexpected \(e)"); return }
                got.append(b)
            }
        }
        #expect(got == bodies)
        #expect(decoder.bufferedByteCount == 0)
    }

    /// A long stream keeps working past the decoder's internal compaction threshold.
    @Test func longStreamCompaction() {
        let body = Array(#"{"op":"snapshot","store":"s","version":1,"seq":1,"state":"xxxxxxxxxxxxxxxxxxxxxxxx"}"#.utf8)
        let one = encodeFrame(body)
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var count = 0
        var carry: [UInt8] = []
        for _ in 0..<3000 {
            // Each chunk ends mid-frame so the buffer is never empty when compaction is considered.
            carry += one
            let cut = carry.count - 3
            decoder.append(carry[..<cut])
            carry = Array(carry[cut...])
            while let e = decoder.next() {
                #expect(e == .frame(body))
                count += 1
            }
        }
        decoder.append(carry)
        while decoder.next() != nil { count += 1 }
        #expect(count == 3000)
        #expect(decoder.bufferedByteCount == 0)
    }
}
