import FluxCore
@testable import FluxTransport
import Glibc
import Testing

/// A frame marked for coalescing, whose text names it.
private func snapshot(_ name: String, _ coalescing: Coalescing) -> Frame {
    var builder = FrameBuilder(op: "snapshot")
    builder.string("name", name)
    return builder.finish(coalescing: coalescing)
}

private func snapshotText(_ name: String) -> String { #"{"op":"snapshot","name":"\#(name)"}"# }

@Suite("Connection: writes")
struct ConnectionWriteTests {
    @Test("frames queued in one loop iteration go out in one write, intact and in order")
    func coalescedWrite() throws {
        // SOCK_SEQPACKET keeps the boundaries of writes: one record per writev, one record per recv.
        let pair = try SocketPair(type: SOCK_SEQPACKET)
        let texts = (0..<100).map { "frame \($0)" }
        for text in texts { #expect(pair.connection.send(frame(text))) }
        let total = texts.reduce(0) { $0 + 4 + $1.utf8.count }
        #expect(pair.connection.queuedBytes == total)
        #expect(pair.connection.accountableBytes == 0, "frames queued within an iteration are not accounted")

        pair.runOnce()

        #expect(pair.connection.queuedBytes == 0)
        guard case .bytes(let record) = pair.peerRead() else {
            Issue.record("nothing was written")
            return try pair.finish()
        }
        #expect(record.count == total, "one record holds every frame")
        #expect(pair.peerRead() == .nothing, "a second write")
        var decoder = FrameDecoder(maxFrame: .max)
        decoder.append(record)
        var decoded: [String] = []
        while case .frame(let body)? = decoder.next() { decoded.append(String(decoding: body, as: UTF8.self)) }
        #expect(decoded == texts)
        #expect(pair.recorder.accountingReports.isEmpty, "the kernel took everything: no write in flight")
        try pair.finish()
    }

    @Test("a write takes at most maxFramesPerWrite frames; the rest goes out in the following iterations without waiting for an event, intact and in order")
    func writesAreBounded() throws {
        let pair = try SocketPair(type: SOCK_SEQPACKET)
        let per = Connection.maxFramesPerWrite
        let texts = (0..<(2 * per + 10)).map { "f\($0)" }
        for text in texts { pair.connection.send(frame(text)) }
        var decoded: [String] = []
        var records: [Int] = []
        for _ in 0..<3 {
            pair.runOnce()  // (would block if the rest waited for an event: the idle handle keeps it from blocking)
            guard case .bytes(let record) = pair.peerRead() else { break }
            var decoder = FrameDecoder(maxFrame: .max)
            decoder.append(record)
            var n = 0
            while case .frame(let body)? = decoder.next() { decoded.append(String(decoding: body, as: UTF8.self)); n += 1 }
            records.append(n)
        }
        #expect(records == [per, per, 10])
        #expect(decoded.count == texts.count && decoded == texts, "in order, none lost")
        #expect(pair.connection.queuedBytes == 0)
        try pair.finish()
    }

    @Test("frames queued in different loop iterations go out in one write per iteration")
    func oneWritePerIteration() throws {
        let pair = try SocketPair(type: SOCK_SEQPACKET)
        pair.connection.send(frame("first"))
        pair.connection.send(frame("second"))
        pair.runOnce()
        pair.connection.send(frame("third"))
        pair.runOnce()
        #expect(pair.peerRead() == .bytes(encodeFrame(Array("first".utf8)) + encodeFrame(Array("second".utf8))))
        #expect(pair.peerRead() == .bytes(encodeFrame(Array("third".utf8))))
        #expect(pair.peerRead() == .nothing)
        try pair.finish()
    }

    @Test("partial writes: a backlog the kernel takes in pieces drains intact and in order to a slow reader; the accounting goes back to 0 and is reported")
    func partialWritesDrain() throws {
        let pair = try SocketPair(sendBuffer: 4096)
        pair.recorder.chargesReports = true
        let size = 8192, count = 64
        for i in 0..<count { pair.connection.send(bigFrame("frame \(i) ", size: size)) }
        let total = count * (size + 4)
        #expect(pair.connection.queuedBytes == total)

        pair.runOnce()

        let inFlight = pair.connection.queuedBytes
        #expect(inFlight > 0 && inFlight < total, "the kernel took part of the write, the rest is in flight")
        #expect(pair.connection.accountableBytes == inFlight, "a write in flight is accounted")
        #expect(pair.recorder.accountingReports == [inFlight], "the start of the write was reported")

        // Queued while the write is in flight: waits behind it, accounted at once.
        #expect(pair.connection.send(bigFrame("late", size: 100)))
        #expect(pair.connection.queuedBytes == inFlight + 104)
        #expect(pair.connection.accountableBytes == inFlight + 104)

        try pair.run(until: "the peer read every frame", step: { try pair.readFrames(max: 4096) }) {
            pair.peerFrames.count == count + 1
        }
        #expect(pair.peerFrames == (0..<count).map { bigText("frame \($0) ", size: size) } + [bigText("late", size: 100)])
        #expect(pair.peerBytesRead == total + 104)
        #expect(pair.connection.queuedBytes == 0)
        #expect(pair.connection.accountableBytes == 0)
        #expect(pair.recorder.accountingReports == [inFlight, 0],
                "the start of the write the kernel did not take at once, and its completion")
        try pair.finish()
    }

    @Test("backpressure: while the peer does not read, queued bytes grow; discardQueued drops what is unwritten and the write in flight completes")
    func backpressureAndDiscard() throws {
        let pair = try SocketPair(sendBuffer: 4096)
        let size = 8192
        for i in 0..<16 { pair.connection.send(bigFrame("first \(i) ", size: size)) }
        pair.runOnce()
        let inFlight = pair.connection.queuedBytes
        #expect(inFlight > 0)

        var expected = inFlight
        for round in 0..<5 {
            for i in 0..<10 {
                pair.connection.send(bigFrame("round \(round) \(i) ", size: size))
                expected += size + 4
            }
            pair.runOnce()
            #expect(pair.connection.queuedBytes == expected, "nothing is written while the peer does not read")
            #expect(pair.connection.accountableBytes == expected)
        }

        pair.connection.discardQueued()
        #expect(pair.connection.queuedBytes == inFlight, "only the write in flight is left")
        #expect(pair.connection.accountableBytes == inFlight)
        // What is sent after the discard goes out right after the write in flight.
        pair.connection.send(frame("after the discard"))

        try pair.run(until: "the peer read the write in flight and the frame after it",
                     step: { try pair.readFrames(max: 16384) }) { pair.peerFrames.count == 17 }
        #expect(pair.peerFrames == (0..<16).map { bigText("first \($0) ", size: size) } + ["after the discard"])
        pair.runOnce()
        #expect(try pair.readFrames() == 0, "nothing of the discarded frames arrives")
        #expect(pair.connection.queuedBytes == 0)
        try pair.finish()
    }

    @Test("while a write is in flight, a newest-wins frame replaces the queued one with its key in place; a fence keeps what is before it")
    func newestWinsWhileBehind() throws {
        let pair = try SocketPair(sendBuffer: 4096)
        let size = 8192
        for i in 0..<16 { pair.connection.send(bigFrame("backlog \(i) ", size: size)) }
        pair.runOnce()
        #expect(pair.connection.queuedBytes > 0)

        pair.connection.send(snapshot("a1", .newestWins(key: 7)))
        pair.connection.send(frame("other"))
        pair.connection.send(snapshot("a2", .newestWins(key: 7)))
        pair.connection.send(snapshot("b1", .newestWins(key: 8)))
        pair.connection.send(snapshot("a3", .newestWins(key: 7)))
        pair.connection.send(snapshot("fence a", .fence(key: 7)))
        pair.connection.send(snapshot("a4", .newestWins(key: 7)))
        pair.connection.send(snapshot("a5", .newestWins(key: 7)))

        try pair.run(until: "the peer read the backlog and what was queued behind it",
                     step: { try pair.readFrames(max: 16384) }) { pair.peerFrames.count == 16 + 5 }
        #expect(Array(pair.peerFrames.dropFirst(16)) == [
            snapshotText("a3"), "other", snapshotText("b1"), snapshotText("fence a"), snapshotText("a5"),
        ])
        try pair.finish()
    }

    @Test("a peer that keeps up gets every newest-wins frame (nothing is coalesced without a write in flight)")
    func noCoalescingWhenNotBehind() throws {
        let pair = try SocketPair()
        for name in ["v1", "v2", "v3"] { pair.connection.send(snapshot(name, .newestWins(key: 7))) }
        try pair.run(until: "the peer read three frames", step: { try pair.readFrames() }) { pair.peerFrames.count == 3 }
        #expect(pair.peerFrames == ["v1", "v2", "v3"].map(snapshotText))
        try pair.finish()
    }
}
