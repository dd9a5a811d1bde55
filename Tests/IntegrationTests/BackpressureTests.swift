import FluxCore
import Foundation
import Glibc
import Testing

/// SPEC §8.5 "newest wins", §11 `slow-consumer`, §12 `maxBacklog`: a peer that does not read as fast as fluxd
/// produces frames for it costs fluxd bounded memory and never slows anyone else down.
@Suite("backpressure", .serialized, .onDedicatedThreads)
struct BackpressureTests {
    @Test("a subscriber that stops reading is sent only the newest snapshot; fluxd's memory stays bounded; others get every version")
    func slowSubscriberIsCoalesced() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            let store = try RawPeer.ready(path, role: "store", name: "big-store")
            try store.register("big", handles: ["big/*"], state: #"{"v":0}"#)
            let slow = try RawPeer.ready(path, name: "slow-subscriber")
            try slow.subscribe("big")
            let fast = try RawPeer.ready(path, name: "fast-subscriber")
            try fast.subscribe("big")
            let client = try RawPeer.ready(path, name: "writer")

            // 200 states of 256 KiB: 50 MiB that a queue-everything dispatcher would hold for the slow subscriber.
            let filler = String(repeating: "x", count: 256 * 1024)
            let count = 200
            for i in 1...count {
                try client.send(frame: #"{"op":"dispatch","type":"big/set","payload":\#(i)}"#)
                #expect(try store.expect("action").int("seq") == i)
                try store.send(frame: #"{"op":"done","store":"big","seq":\#(i),"state":{"v":\#(i),"fill":"\#(filler)"}}"#)
                let snapshot = try fast.expect("snapshot")
                #expect(snapshot.int("version") == i + 1, "the reading subscriber gets every version")
            }
            let peak = try peakRSS(of: bus.fluxd.pid)
            // Not under AddressSanitizer (scripts/asan.sh sets FLUXBUS_ASAN): its quarantine keeps freed memory
            // (here ~50 MiB of replaced snapshots) resident on purpose, so RSS says nothing about what fluxd holds.
            if ProcessInfo.processInfo.environment["FLUXBUS_ASAN"] == nil {
                #expect(peak < 40 << 20, "fluxd's peak RSS \(peak >> 20) MiB: the slow subscriber's snapshots were not all kept")
            }

            // Now the slow subscriber reads: a few snapshots, versions only growing, ending with the newest.
            let got = try slow.barrier("caught-up", timeout: .seconds(30))
            let versions = got.filter { $0.op == "snapshot" }.compactMap { $0.int("version") }
            #expect(got.allSatisfy { $0.op == "snapshot" }, "nothing but snapshots was queued for it")
            #expect(versions == versions.sorted() && Set(versions).count == versions.count, "versions only grow: \(versions)")
            #expect(versions.last == count + 1, "the newest snapshot is always sent: \(versions)")
            #expect(versions.count < 20, "intermediate versions were coalesced: got \(versions.count) of \(count)")
            // It is a subscriber like any other again: the next snapshot arrives at once.
            try client.send(frame: #"{"op":"dispatch","type":"big/set","payload":0}"#)
            try store.expect("action")
            try store.send(frame: #"{"op":"done","store":"big","seq":\#(count + 1),"state":{"v":"last"}}"#)
            #expect(try slow.expect("snapshot").int("version") == count + 2)
            #expect(try fast.expect("snapshot").int("version") == count + 2)
        }
    }

    @Test("a peer with more than maxBacklog bytes unread gets slow-consumer and is closed; others carry on")
    func slowConsumerIsClosed() throws {
        try withBusBlocking(["--max-frame", "262144", "--max-backlog", "1048576"]) { bus in
            let path = bus.socketPath
            let store = try RawPeer.ready(path, role: "store", name: "blob-store")
            let blob = String(repeating: "y", count: 200 * 1024)
            try store.register("blob", handles: ["blob/*"], state: #"{"b":"\#(blob)"}"#)
            let healthy = try RawPeer.ready(path, name: "healthy")
            try healthy.subscribe("blob")
            let greedy = try RawPeer(connectingTo: path)
            let welcome = try greedy.handshake(role: "client", name: "greedy")
            #expect((welcome["limits"] as? [String: Any])?["maxBacklog"] as? Int == 1_048_576)

            // 20 `get`s of a 200 KiB state asked for at once: 4 MiB of replies that cannot be coalesced.
            var gets: [UInt8] = []
            for i in 1...20 { gets += encodeFrame(Array(#"{"op":"get","id":"g\#(i)","store":"blob"}"#.utf8)) }
            try greedy.send(gets)
            let messages = try greedy.readUntilEOF(timeout: .seconds(20))
            let last = messages.last ?? [:]
            #expect(last["op"] as? String == "error" && last["code"] as? String == "slow-consumer",
                    "the last frame before EOF is the slow-consumer error: \(last)")
            #expect(last["fatal"] as? Bool == true)
            #expect(messages.filter { $0["op"] as? String == "got" }.count < 20, "what could not be written was dropped")

            // Everyone else is untouched: a dispatch settles, the subscriber gets its snapshot, the error is counted.
            try healthy.send(frame: #"{"op":"dispatch","id":"h","type":"blob/set","settle":true}"#)
            try store.expect("action")
            try store.send(frame: #"{"op":"done","store":"blob","seq":1,"state":{"b":"small"}}"#)
            #expect(try healthy.expect("snapshot").int("version") == 2)
            #expect(try healthy.expect("settled").string("id") == "h")
            let info = try info(healthy)
            #expect((info["counters"]?["errors"] as? [String: Any])?["slow-consumer"] as? Int == 1)
        }
    }

    @Test("a slow consumer that never reads its error is cut off after the grace period")
    func slowConsumerThatNeverReadsIsCutOff() throws {
        try withBusBlocking(["--max-backlog", "2097152"]) { bus in
            let path = bus.socketPath
            let store = try RawPeer.ready(path, role: "store", name: "blob-store")
            let blob = String(repeating: "y", count: 900 * 1024)
            try store.register("blob", handles: ["blob/*"], state: #"{"b":"\#(blob)"}"#)
            let watcher = try RawPeer.ready(path, name: "watcher")
            let stuck = try RawPeer.ready(path, name: "stuck")
            // One reply far larger than a socket buffer, so a write stays in flight ...
            let before = try info(watcher)["counters"]?["bytesOut"] as? Int ?? 0
            try stuck.send(frame: #"{"op":"get","id":"g0","store":"blob"}"#)
            try waitFor("the first reply to be queued", in: watcher) { ($0["counters"]?["bytesOut"] as? Int ?? 0) > before + 900 * 1024 }
            // ... then more than the backlog allows behind it. The error waits behind the write nobody reads, until
            // fluxd cuts the connection.
            for i in 1...10 { try stuck.send(frame: #"{"op":"get","id":"g\#(i)","store":"blob"}"#) }
            try waitFor("the stuck client to be cut off", in: watcher) {
                ($0["peers"]?["client"] as? Int) == 1 && (($0["counters"]?["errors"] as? [String: Any])?["slow-consumer"] as? Int) == 1
            }
            let leftovers = try stuck.readUntilEOF(timeout: .seconds(20)).compactMap { $0["op"] as? String }
            #expect(!leftovers.contains("error"), "cut off, not closed after writing the error: \(leftovers)")
            #expect(leftovers.count <= 1, "at most the first reply: \(leftovers)")
        }
    }
}

/// `info` over a raw connection, as nested dictionaries.
private func info(_ peer: RawPeer) throws -> [String: [String: Any]] {
    try peer.send(frame: #"{"op":"info","id":"i"}"#)
    let m = try peer.read(until: "info") { $0.op == "info" }.match
    var out: [String: [String: Any]] = [:]
    for (key, value) in m.object { if let d = value as? [String: Any] { out[key] = d } }
    return out
}

/// Asks `info` until `predicate` holds (a deadline, not a sleep: each round trip is an event).
private func waitFor(_ what: String, in peer: RawPeer, timeout: Duration = .seconds(20),
                     _ predicate: ([String: [String: Any]]) -> Bool) throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if predicate(try info(peer)) { return }
        usleep(10_000)  // polling interval, not synchronisation: the predicate decides
    }
    throw HarnessError.timedOut(what)
}

/// The peak resident set size of a process (`VmHWM`), in bytes.
private func peakRSS(of pid: Int32) throws -> Int {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
          let kb = Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) else {
        throw HarnessError.unexpectedOutput("no VmHWM in /proc/\(pid)/status")
    }
    return kb * 1024
}
