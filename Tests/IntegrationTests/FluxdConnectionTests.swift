import FluxCore
import Foundation
import Glibc
import Testing

/// fluxd's transport and wiring seen from a raw socket peer: frames in, frames out, closes, timers.
@Suite("fluxd connections", .onDedicatedThreads)
struct FluxdConnectionTests {
    @Test("hello gets a welcome; peer ids count up from 1")
    func welcome() throws {
        try withFluxd { fluxd in
            let first = try RawPeer(connectingTo: fluxd.socketPath)
            let welcome = try first.handshake()
            #expect(welcome["op"] as? String == "welcome")
            #expect(welcome["peer"] as? Int == 1)
            let second = try RawPeer(connectingTo: fluxd.socketPath)
            #expect(try second.handshake()["peer"] as? Int == 2)
        }
    }

    @Test("the peer's credentials are read from the socket (SO_PEERCRED)")
    func credentials() throws {
        try withFluxd(["--log-level", "debug"]) { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            #expect(fluxd.stderr.contains("pid=\(getpid())"))
            #expect(fluxd.stderr.contains("uid=\(getuid())"))
        }
    }

    @Test("shutdown says bye to connected peers, closes them, and fluxd exits 0")
    func shutdownSaysBye() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            fluxd.send(signal: SIGTERM)
            let messages = try peer.readUntilEOF()
            #expect(messages.count == 1)
            #expect(messages.first?["op"] as? String == "bye")
            #expect(messages.first?["reason"] as? String == "shutdown")
            #expect(fluxd.waitForExit(timeout: .seconds(20)) == 0)
        }
    }

    @Test("a frame split byte by byte, one write per byte, is answered")
    func frameSplitByteByByte() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            for byte in encodeFrame(Array(#"{"op":"hello","protocol":1,"role":"client"}"#.utf8)) {
                try peer.send([byte])
            }
            #expect(try peer.nextMessage()["op"] as? String == "welcome")
        }
    }

    @Test("500 frames pipelined in one write are all answered, in order")
    func pipelinedFrames() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            var burst: [UInt8] = []
            for i in 0..<500 { burst += encodeFrame(Array(#"{"op":"ping","id":"p\#(i)"}"#.utf8)) }
            try peer.send(burst)
            for i in 0..<500 {
                let pong = try peer.nextMessage()
                #expect(pong["op"] as? String == "pong" && pong["id"] as? String == "p\(i)")
            }
        }
    }

    @Test("a frame larger than the read buffer arrives whole")
    func largeFrame() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            let payload = "\"" + String(repeating: "x", count: 300_000) + "\""
            try peer.send(frame: #"{"op":"dispatch","id":"big","type":"nobody/handles","payload":\#(payload)}"#)
            let error = try peer.nextMessage()
            #expect(error["op"] as? String == "error")
            #expect(error["code"] as? String == "no-handler")
            #expect(error["ref"] as? String == "big")
        }
    }

    @Test("an empty frame gets bad-frame and the connection survives")
    func emptyFrame() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            try peer.send([0, 0, 0, 0])
            #expect(try peer.nextMessage()["code"] as? String == "bad-frame")
            try peer.send(frame: #"{"op":"ping","id":"still-here"}"#)
            #expect(try peer.nextMessage()["id"] as? String == "still-here")
        }
    }

    @Test("an oversized frame gets too-large, then the connection is closed")
    func oversizedFrame() throws {
        try withFluxd(["--max-frame", "1024"]) { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            try peer.send([0, 0, 0x13, 0x88] + [UInt8](repeating: 0x20, count: 100)) // announces 5000 bytes
            let messages = try peer.readUntilEOF()
            #expect(messages.map { $0["code"] as? String } == ["too-large"])
            // Other peers are unaffected.
            let other = try RawPeer(connectingTo: fluxd.socketPath)
            #expect(try other.handshake()["op"] as? String == "welcome")
        }
    }

    @Test("no hello within the handshake timeout: timeout error, then closed (the deadline timer fires)")
    func handshakeTimeout() throws {
        try withFluxd(["--handshake-timeout", "300"]) { fluxd in
            let started = ContinuousClock.now
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            let messages = try peer.readUntilEOF(timeout: .seconds(10))
            let elapsed = ContinuousClock.now - started
            #expect(messages.map { $0["code"] as? String } == ["timeout"])
            #expect(elapsed >= .milliseconds(250))
        }
    }

    @Test("a peer that hangs up mid-frame does not disturb fluxd")
    func hangUpMidFrame() throws {
        try withFluxd { fluxd in
            do {
                let peer = try RawPeer(connectingTo: fluxd.socketPath)
                _ = try peer.handshake()
                try peer.send([0, 0, 0, 50] + Array(#"{"op":"pi"#.utf8))
            }
            let other = try RawPeer(connectingTo: fluxd.socketPath)
            #expect(try other.handshake()["peer"] as? Int == 2)
            try other.send(frame: #"{"op":"ping","id":"x"}"#)
            #expect(try other.nextMessage()["op"] as? String == "pong")
            #expect(fluxd.stop() == 0)
        }
    }

    @Test("shutdown waits at most the grace period for a peer that never reads")
    func shutdownGraceBound() throws {
        try withFluxd { fluxd in
            let peer = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try peer.handshake()
            // Far more pongs than the socket buffers hold: fluxd keeps them queued because we never read.
            var burst: [UInt8] = []
            for i in 0..<60_000 { burst += encodeFrame(Array(#"{"op":"ping","id":"\#(i)"}"#.utf8)) }
            try peer.send(burst) // returns once fluxd has read nearly all of it
            let started = ContinuousClock.now
            fluxd.send(signal: SIGTERM)
            let status = fluxd.waitForExit(timeout: .seconds(20))
            let elapsed = ContinuousClock.now - started
            #expect(status == 0)
            #expect(fluxd.exitedNormally)
            #expect(elapsed >= .milliseconds(1500), "fluxd should have waited for the peer to drain")
            #expect(fluxd.stderr.contains("grace period over"))
            #expect(fileMode(fluxd.socketPath) == nil)
        }
    }

    @Test("a peer that closes with frames still queued for it does not hurt fluxd (SIGPIPE ignored)")
    func closeWithWritesPending() throws {
        try withFluxd { fluxd in
            do {
                let peer = try RawPeer(connectingTo: fluxd.socketPath)
                _ = try peer.handshake()
                var burst: [UInt8] = []
                for i in 0..<60_000 { burst += encodeFrame(Array(#"{"op":"ping","id":"\#(i)"}"#.utf8)) }
                try peer.send(burst)
            } // closed without reading a single pong
            let other = try RawPeer(connectingTo: fluxd.socketPath)
            _ = try other.handshake()
            try other.send(frame: #"{"op":"ping","id":"after"}"#)
            #expect(try other.nextMessage()["id"] as? String == "after")
            #expect(fluxd.stop() == 0)
            #expect(fluxd.exitedNormally)
        }
    }
}
