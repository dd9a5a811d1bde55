import FluxCore

/// Target a: `FrameDecoder` fed one byte stream in chunks split at points the input chooses, each chunk through
/// one of its three entry points (append + next, append(raw) + next, next(from:at:) in place), with or without
/// draining in between. Checked against a reference decode of the whole stream written here from SPEC §2 (and
/// against the decoder fed the stream in one piece):
/// - the same frames, in the same order: bodies, empty frames, and at most one `tooLarge` (with its length), after
///   which nothing more;
/// - `next(from:at:)` returns nil only once it has used the whole input (`offset == input.count`);
/// - what stays buffered is exactly the unfinished tail (nothing once poisoned).
///
/// Input layout: byte 0 = maxFrame choice (low 3 bits) and repeat count (high 5 bits: the stream is repeated so
/// that long streams reach the decoder's compaction of consumed bytes); byte 1 = number of split bytes n (0-31);
/// then n split bytes (chunk length in the low 6 bits, entry point in the high 2 bits; used in turn, cyclically);
/// the rest is the stream.
enum FrameDecoderTarget {
    static let maxFrames: [UInt32] = [1, 3, 4, 16, 255, 1024, 65_536, 1_048_576]

    static func run(_ data: UnsafeBufferPointer<UInt8>) {
        var r = ByteReader(data)
        let b0 = r.byte()
        let maxFrame = maxFrames[Int(b0 & 7)]
        let repeatsWanted = Int(b0 >> 3) == 31 ? 200 : 1 + Int(b0 >> 3) / 8  // mostly 1-4; 31: 200 copies
        let nSplits = Int(r.byte() & 31)
        var splits: [UInt8] = []
        for _ in 0..<nSplits { splits.append(r.byte()) }
        let piece = Array(data[min(r.pos, data.count)...])
        // At most ~96 KiB in all: enough to pass the decoder's 64 KiB compaction, cheap enough to stay fast.
        let repeats = min(repeatsWanted, max(1, 98_304 / max(piece.count, 1)))
        var stream: [UInt8] = []
        stream.reserveCapacity(piece.count * repeats)
        for _ in 0..<repeats { stream.append(contentsOf: piece) }

        let (expected, expectedTail) = referenceDecode(stream, maxFrame: maxFrame)

        // The decoder fed the whole stream at once.
        var whole = FrameDecoder(maxFrame: maxFrame)
        whole.append(stream)
        var wholeFrames: [DecodedFrame] = []
        while let f = whole.next() { wholeFrames.append(f) }
        fuzzCheck(wholeFrames == expected, "decoder fed in one piece: \(describe(wholeFrames)) != reference \(describe(expected))")
        fuzzCheck(whole.bufferedByteCount == expectedTail, "one piece: \(whole.bufferedByteCount) bytes buffered, \(expectedTail) expected")

        // The decoder fed in chunks.
        var decoder = FrameDecoder(maxFrame: maxFrame)
        var got: [DecodedFrame] = []
        var at = 0
        var k = 0
        var emptyRun = 0
        while at < stream.count {
            let s = splits.isEmpty ? UInt8(0xFF) : splits[k % splits.count]
            k += 1
            // Chunks of 0-62 bytes, 63: 4063 bytes; no splits: the whole stream through next(from:at:).
            var length = min(stream.count - at, splits.isEmpty ? stream.count : Int(s & 63) + (s & 63 == 63 ? 4000 : 0))
            if length == 0 {  // empty chunks are fed too, but a run of them as long as the split list moves on
                emptyRun += 1
                if emptyRun > splits.count { length = 1; emptyRun = 0 }
            }
            let chunk = stream[at..<(at + length)]
            at += length
            switch s >> 6 {
            case 0:
                decoder.append(chunk)
                while let f = decoder.next() { got.append(f) }
            case 1:
                chunk.withUnsafeBytes { decoder.append($0) }
                while let f = decoder.next() { got.append(f) }
            case 2:
                decoder.append(chunk)  // not drained now: the next chunk's entry point finds the frames first
            default:
                chunk.withUnsafeBytes { input in
                    var offset = 0
                    while let f = decoder.next(from: input, at: &offset) {
                        got.append(f)
                        fuzzCheck(offset <= input.count, "offset \(offset) past the input (\(input.count))")
                    }
                    fuzzCheck(offset == input.count, "next(from:at:) returned nil at offset \(offset) of \(input.count)")
                }
            }
            if got.count > expected.count { break }
        }
        while let f = decoder.next() { got.append(f) }
        fuzzCheck(got == expected, "chunked decode \(describe(got)) != reference \(describe(expected))")
        fuzzCheck(decoder.bufferedByteCount == expectedTail, "chunked: \(decoder.bufferedByteCount) bytes buffered, \(expectedTail) expected")
    }

    /// SPEC §2 read directly: 4-byte big-endian length, then the body; length 0 is an empty frame; a length above
    /// maxFrame poisons the stream. Returns the frames and how many bytes of an unfinished frame remain.
    static func referenceDecode(_ s: [UInt8], maxFrame: UInt32) -> ([DecodedFrame], Int) {
        var out: [DecodedFrame] = []
        var i = 0
        while s.count - i >= 4 {
            let n = UInt32(s[i]) << 24 | UInt32(s[i + 1]) << 16 | UInt32(s[i + 2]) << 8 | UInt32(s[i + 3])
            if n > maxFrame { out.append(.tooLarge(length: n)); return (out, 0) }
            if n == 0 { out.append(.empty); i += 4; continue }
            guard s.count - i - 4 >= Int(n) else { break }
            out.append(.frame(Array(s[(i + 4)..<(i + 4 + Int(n))])))
            i += 4 + Int(n)
        }
        return (out, s.count - i)
    }

    static func describe(_ frames: [DecodedFrame]) -> String {
        let parts = frames.prefix(8).map { f -> String in
            switch f {
            case .frame(let b): return "frame(\(b.count))"
            case .empty: return "empty"
            case .tooLarge(let n): return "tooLarge(\(n))"
            }
        }
        return "[" + parts.joined(separator: ", ") + (frames.count > 8 ? ", … \(frames.count) in all" : "") + "]"
    }
}
