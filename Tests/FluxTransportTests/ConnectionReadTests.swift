import FluxCore
@testable import FluxTransport
import Glibc
import Testing

@Suite("Connection: reads and frame decoding")
struct ConnectionReadTests {
    @Test("a frame delivered one byte at a time: each byte is held and accounted, the frame arrives once complete")
    func oneByteAtATime() throws {
        let pair = try SocketPair()
        pair.recorder.chargesReports = true
        let text = #"{"op":"ping","id":"1"}"#
        let bytes = encodeFrame(Array(text.utf8))
        for (i, byte) in bytes.enumerated() {
            try pair.peerWrite([byte])
            if i < bytes.count - 1 {
                try pair.run(until: "byte \(i) was read") { pair.connection.accountableBytes == i + 1 }
                #expect(pair.recorder.frames.isEmpty)
            } else {
                try pair.run(until: "the frame was complete") { !pair.recorder.frames.isEmpty }
            }
        }
        #expect(pair.recorder.texts == [text])
        #expect(pair.connection.accountableBytes == 0)
        #expect(pair.recorder.accountingReports == Array(1..<bytes.count) + [0],
                "each unfinished read reported, and the end of the frame")
        try pair.finish()
    }

    @Test("frames split across reads at every kind of boundary arrive whole and in order, an empty one in between")
    func splitAcrossReads() throws {
        let pair = try SocketPair()
        let texts = ["first", #"{"op":"x"}"#, "third frame", "4"]
        var stream: [UInt8] = []
        for (i, text) in texts.enumerated() {
            stream += encodeFrame(Array(text.utf8))
            if i == 1 { stream += [0, 0, 0, 0] } // an empty frame
        }
        // Chunks of 3 bytes: headers and bodies are cut everywhere.
        var offset = 0
        while offset < stream.count {
            let end = min(offset + 3, stream.count)
            try pair.peerWrite(Array(stream[offset..<end]))
            try pair.run(until: "bytes up to \(end) were read") { pair.peerUnread == 0 }
            offset = end
        }
        #expect(pair.recorder.texts == ["first", #"{"op":"x"}"#, "<empty>", "third frame", "4"])
        #expect(pair.connection.accountableBytes == 0)
        #expect(!pair.connection.isClosing, "an empty frame leaves the stream in sync")
        try pair.finish()
    }

    @Test("a frame larger than the loop's 64 KiB read buffer arrives whole, over several reads")
    func frameLargerThanTheReadBuffer() throws {
        let pair = try SocketPair()
        let body = bigText("large ", size: 3 * EventLoop.readBufferSize + 17)
        var remaining = encodeFrame(Array(body.utf8))[...]
        try pair.run(until: "the large frame arrived", step: {
            guard !remaining.isEmpty else { return }
            let n = remaining.withUnsafeBytes { send(pair.peer, $0.baseAddress, min($0.count, 32768), Int32(MSG_NOSIGNAL)) }
            if n > 0 { remaining = remaining.dropFirst(n) }
        }) { !pair.recorder.frames.isEmpty }
        #expect(pair.recorder.texts == [body])
        #expect(pair.connection.accountableBytes == 0)
        try pair.finish()
    }

    @Test("a frame at the size limit is delivered; one over it is reported too large, and nothing after it")
    func tooLargeFrame() throws {
        let pair = try SocketPair(maxFrame: 64)
        let atLimit = String(repeating: "a", count: 64)
        let overLimit = String(repeating: "b", count: 65)
        try pair.peerWrite(frame: atLimit)
        try pair.peerWrite(frame: overLimit)
        try pair.peerWrite(frame: "after")
        try pair.run(until: "two frames were decoded") { pair.recorder.frames.count == 2 }
        #expect(pair.recorder.frames == [.frame(Array(atLimit.utf8)), .tooLarge(length: 65)])
        // The stream cannot be trusted any more: more bytes yield nothing (the owner closes the connection).
        try pair.peerWrite(frame: "later")
        try pair.run(until: "the later bytes were read") { pair.peerUnread == 0 }
        #expect(pair.recorder.frames.count == 2)
        #expect(!pair.connection.isClosing, "closing is the owner's decision")
        try pair.finish()
    }

    @Test("an empty frame is reported as such and the frames after it still arrive")
    func emptyFrame() throws {
        let pair = try SocketPair()
        try pair.peerWrite([0, 0, 0, 0] + encodeFrame(Array("next".utf8)))
        try pair.run(until: "two frames were decoded") { pair.recorder.frames.count == 2 }
        #expect(pair.recorder.frames == [.empty, .frame(Array("next".utf8))])
        try pair.finish()
    }

    @Test("a pipelined flood is served in turns of framesPerTurn frames, one turn per loop iteration, in order")
    func floodServedInTurns() throws {
        let pair = try SocketPair()
        pair.loop.turnNanoseconds = .max  // (turns by count only: under ASan 0.25 ms is fewer frames)
        let count = 2000
        var stream: [UInt8] = []
        for i in 0..<count { stream += encodeFrame(Array("\(i)".utf8)) }
        #expect(stream.count < EventLoop.readBufferSize, "the whole flood fits in one read")
        try pair.peerWrite(stream)

        let turn = Connection.framesPerTurn
        var seen: [Int] = []
        for _ in 0..<((count + turn - 1) / turn) {
            pair.runOnce()
            seen.append(pair.recorder.frames.count)
        }
        #expect(seen == [turn, 2 * turn, 3 * turn, count])
        #expect(pair.recorder.texts == (0..<count).map { "\($0)" })
        try pair.finish()
    }

    @Test("a turn also ends once it has handled frames for turnNanoseconds (from the read's start, checked every turnCheckEvery frames)")
    func turnsEndByTime() throws {
        let pair = try SocketPair()
        pair.loop.turnNanoseconds = 0  // every turn is over at its first check: turnCheckEvery frames
        let count = 200
        var stream: [UInt8] = []
        for i in 0..<count { stream += encodeFrame(Array("\(i)".utf8)) }
        try pair.peerWrite(stream)
        let every = Connection.turnCheckEvery
        var seen: [Int] = []
        for _ in 0..<(count / every) {
            pair.runOnce()
            seen.append(pair.recorder.frames.count)
        }
        #expect(seen == Array(stride(from: every, through: count, by: every)))
        #expect(pair.recorder.texts == (0..<count).map { "\($0)" })
        // Reading resumed after the last turn.
        try pair.peerWrite(frame: "more")
        try pair.run(until: "the next frame arrived") { pair.recorder.frames.count == count + 1 }
        try pair.finish()
    }
}
