import CLibUV
import FluxCore
@testable import FluxTransport
import Glibc
import Logging
import Testing

@Suite("Connection: close, EOF and errors, each reported exactly once")
struct ConnectionCloseTests {
    @Test("the peer closes: its last frames arrive, then connectionClosed(peerClosed), once")
    func peerClosed() throws {
        let pair = try SocketPair()
        try pair.peerWrite(frame: "last words")
        pair.closePeer()
        try pair.run(until: "the close was reported") { !pair.recorder.closes.isEmpty }
        #expect(pair.recorder.texts == ["last words"])
        #expect(pair.recorder.closes == [.peerClosed])
        #expect(!pair.connection.send(frame("to nobody")), "a closed connection refuses frames")
        try pair.finish()
    }

    @Test("the peer shuts down only its writing side: what is queued still goes out, then the connection closes as peerClosed")
    func peerHalfClosed() throws {
        let pair = try SocketPair(sendBuffer: 4096)
        let size = 8192
        for i in 0..<16 { pair.connection.send(bigFrame("queued \(i) ", size: size)) }
        pair.runOnce()
        #expect(pair.connection.queuedBytes > 0, "a write is in flight")
        shutdown(pair.peer, Int32(SHUT_WR))
        try pair.run(until: "the peer read everything and the end of the stream",
                     step: { try pair.readFrames(max: 16384) }) { pair.peerSawEOF }
        #expect(pair.peerFrames == (0..<16).map { bigText("queued \($0) ", size: size) })
        #expect(pair.recorder.closes == [.peerClosed])
        try pair.finish()
    }

    @Test("the peer closes with frames unread: the read fails with ECONNRESET, reported once as an error")
    func peerResetRead() throws {
        let pair = try SocketPair()
        pair.connection.send(frame("never read"))
        pair.runOnce()
        pair.closePeer()
        try pair.run(until: "the close was reported") { !pair.recorder.closes.isEmpty }
        #expect(pair.recorder.closes == [.error(UVError(code: -ECONNRESET, operation: "read"))])
        for _ in 0..<3 { pair.runOnce() }
        #expect(pair.recorder.closes.count == 1)
        try pair.finish()
    }

    @Test("a write to a peer that is gone fails with EPIPE, reported once as an error (SIGPIPE ignored)")
    func writeToClosedPeer() throws {
        let pair = try SocketPair()
        pair.closePeer()
        pair.connection.send(frame("to a closed peer"))
        // The flush (before the loop polls) writes first, and fails; the end of stream is not reported again.
        try pair.run(until: "the close was reported") { !pair.recorder.closes.isEmpty }
        #expect(pair.recorder.closes == [.error(UVError(code: -EPIPE, operation: "write"))])
        for _ in 0..<3 { pair.runOnce() }
        #expect(pair.recorder.closes.count == 1)
        try pair.finish()
    }

    @Test("close(afterFlush: true) writes what was queued before closing; later frames are refused and nothing more is read")
    func closeAfterFlush() throws {
        let pair = try SocketPair()
        try pair.peerWrite(frame: "arrives after the close request")
        let texts = (0..<20).map { "queued \($0)" }
        for text in texts { pair.connection.send(frame(text)) }
        pair.connection.close(afterFlush: true)
        #expect(pair.connection.isClosing)
        #expect(!pair.connection.send(frame("too late")))
        try pair.run(until: "the peer read the end of the stream", step: { try pair.readFrames() }) { pair.peerSawEOF }
        #expect(pair.peerFrames == texts)
        #expect(pair.recorder.frames.isEmpty, "no frame is delivered once a close was requested")
        #expect(pair.recorder.closes == [.requested])
        try pair.finish()
    }

    @Test("close(afterFlush: true) waits for a slow peer; close(afterFlush: false) then cuts the drain short, reported once")
    func drainCutShort() throws {
        let pair = try SocketPair(sendBuffer: 4096)
        for i in 0..<16 { pair.connection.send(bigFrame("queued \(i) ", size: 8192)) }
        pair.runOnce()
        pair.connection.close(afterFlush: true)
        for _ in 0..<3 { pair.runOnce() }
        #expect(pair.recorder.closes.isEmpty, "still draining: the peer does not read")
        pair.connection.close(afterFlush: false)
        try pair.run(until: "the close was reported") { !pair.recorder.closes.isEmpty }
        #expect(pair.recorder.closes == [.requested])
        try pair.run(until: "the peer read the end of the stream", step: { try pair.readFrames(max: 16384) }) {
            pair.peerSawEOF
        }
        #expect(pair.peerFrames.count < 16, "the cut dropped what the kernel had not taken")
        try pair.finish()
    }

    @Test("close(afterFlush: false) drops what is queued; the first cause wins over a later end of stream")
    func closeNowDropsQueue() throws {
        let pair = try SocketPair()
        for i in 0..<5 { pair.connection.send(frame("dropped \(i)")) }
        pair.connection.close(afterFlush: false)
        pair.connection.close(afterFlush: true) // idempotent
        pair.closePeer()
        try pair.run(until: "the close was reported") { !pair.recorder.closes.isEmpty }
        for _ in 0..<3 { pair.runOnce() }
        #expect(pair.recorder.closes == [.requested])
        try pair.finish()
    }
}

@Suite("EventLoop: closing clean")
struct EventLoopTests {
    static let quiet = Logger(label: "FluxTransportTests") { _ in SwiftLogNoOpLogHandler() }

    @Test("a descriptor that cannot be adopted throws and leaves nothing open; the loop still runs to completion")
    func adoptingABadDescriptor() throws {
        let loop = try EventLoop(logger: Self.quiet)
        let recorder = Recorder()
        #expect(throws: TransportError.uv(UVError(code: -EBADF, operation: "uv_pipe_open"))) {
            _ = try Connection.adopting(descriptor: 1_000_000, loop: loop, maxFrame: 1024, delegate: recorder)
        }
        loop.stop()
        loop.run()
        #expect(recorder.closes.isEmpty, "a connection that never opened reports no close")
    }

    @Test("a loop on its own thread stops on a request from another thread: its owner closes its handles and run() returns")
    func loopThreadStopsOnRequest() throws {
        let thread = try EventLoop.startThread(logger: Self.quiet) { loop in
            let timer = LoopTimer(loop: loop) {}
            timer.start(after: 600_000) // keeps the loop running until the stop request
            loop.onStopRequest = { [unowned loop] in
                timer.close()
                loop.stop()
            }
        }
        thread.remote.requestStop()
        try thread.join()
    }

    @Test("a timer fires on the loop's clock, repeats, and once closed lets run() return")
    func timerLifecycle() throws {
        let loop = try EventLoop(logger: Self.quiet)
        var fired = 0
        var timer: LoopTimer?
        timer = LoopTimer(loop: loop) {
            fired += 1
            if fired == 3 {
                timer?.close()
                loop.stop()
            }
        }
        timer?.start(after: 1, repeat: 1)
        #expect(timer?.isRunning == true)
        loop.run()
        #expect(fired == 3)
        timer = nil
    }
}
