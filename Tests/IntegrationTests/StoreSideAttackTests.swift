import FluxCore
import Foundation
import Glibc
import Testing

/// Issue 24's attacks on the store-side surfaces, each against a real durable fluxd: what each must not achieve,
/// asserted as behaviour and as work counted by fluxd itself (`info.load.patchSteps`, `pathMatchSteps`,
/// `statesParsed`), never as time. Timings are in Benchmarks/ATTACKS.md (`scripts/attack-bench.sh`).
@Suite("Attacks on the store-side surfaces: patches, path subscriptions, restarts", .serialized, .onDedicatedThreads)
struct StoreSideAttackTests {
    /// Under AddressSanitizer (FLUXBUS_ASAN) the counts are cut by this factor (fluxd is ~10x slower there and the
    /// suite runs beside tests that wait for processes); the bounds are per operation either way.
    static let cut = ProcessInfo.processInfo.environment["FLUXBUS_ASAN"] == nil ? 1 : 5

    /// A durable fluxd in a temp directory, restartable on the same socket and data directory.
    final class DurableBus {
        let directory: TempDirectory
        let socketPath: String
        let dataDirectory: String
        var fluxd: Fluxd

        init() throws {
            directory = try TempDirectory(prefix: "fluxss")
            socketPath = directory.path + "/fluxd.sock"
            dataDirectory = directory.path + "/data"
            fluxd = try Fluxd(socketPath: socketPath, dataDirectory: dataDirectory)
            _ = try fluxd.waitForReady()
        }

        /// Stops fluxd (SIGTERM, or SIGKILL: a crash) and starts it again; returns how the old one exited.
        @discardableResult
        func restart(kill: Bool = false) throws -> Int32? {
            let status: Int32?
            if kill {
                fluxd.send(signal: SIGKILL)
                status = fluxd.waitForExit(timeout: .seconds(20))
            } else {
                status = fluxd.stop(timeout: .seconds(20))
            }
            fluxd.cleanup()
            fluxd = try Fluxd(socketPath: socketPath, dataDirectory: dataDirectory)
            _ = try fluxd.waitForReady(timeout: .seconds(60))
            return status
        }

        func cleanup() {
            fluxd.cleanup()
            directory.remove()
        }
    }

    func withDurableBus(_ body: (DurableBus) throws -> Void) throws {
        let bus = try DurableBus()
        defer { bus.cleanup() }
        do { try body(bus) } catch {
            Issue.record("fluxd:\n\(bus.fluxd.stderr)")
            throw error
        }
    }

    static func load(_ path: String) throws -> [String: Any] {
        let peer = try RawPeer.ready(path, name: "info")
        try peer.send(frame: #"{"op":"info","id":"i"}"#)
        return try peer.read(until: "info") { $0.op == "info" }.match["load"] as? [String: Any] ?? [:]
    }

    static func state(_ path: String, _ store: String) throws -> Message {
        let peer = try RawPeer.ready(path, name: "get")
        try peer.send(frame: #"{"op":"get","store":"\#(store)"}"#)
        return try peer.read(until: "got") { $0.op == "got" }.match
    }

    /// The `state` of a `got`, as its JSON text.
    static func stateText(_ got: Message) throws -> String {
        let data = try JSONSerialization.data(withJSONObject: try #require(got["state"]), options: [.fragmentsAllowed, .sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }

    static func copies(_ n: Int) -> String {
        "[" + (0..<n).map { #"{"op":"copy","from":"","path":"/k\#($0)"}"# }.joined(separator: ",") + "]"
    }

    @Test("1. a 40-copy patch is refused memory-budget at the copy that passes the room, cheaply; a 16-copy one is kept, charged in full, and survives a stop and a restart")
    func copyBomb() throws {
        try withDurableBus { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "bomber")
            try store.register("s", handles: [], state: #"{"seed":"0123456789abcdef"}"#)
            try store.send(frame: #"{"op":"patch","store":"s","patch":\#(Self.copies(40))}"#)
            let refusal = try store.read(until: "the refusal") { $0.op == "error" }.match
            #expect(refusal.string("code") == "memory-budget", "\(refusal)")
            #expect(try store.next(timeout: .seconds(20)) == .eof, "SPEC §16.2: the store's connection is closed")
            let load = try Self.load(bus.socketPath)
            #expect((load["patchSteps"] as? Int ?? .max) < 40 * 30, "\(load)")
            #expect(try Self.stateText(Self.state(bus.socketPath, "s")) == #"{"seed":"0123456789abcdef"}"#)

            // 16 copies fit: kept, and a stop (which writes a checkpoint of the 1.7 MB state) and a restart keep it.
            let again = try RawPeer.ready(bus.socketPath, role: "store", name: "copier")
            try again.register("s", handles: [])
            try again.send(frame: #"{"op":"patch","store":"s","patch":\#(Self.copies(16))}"#)
            _ = try again.barrier()
            let before = try Self.state(bus.socketPath, "s")
            #expect(before.body.count > 27 << 16)
            #expect(try bus.restart() == 0, "fluxd stopped cleanly with a large patched state:\n\(bus.fluxd.stderr)")
            let after = try Self.state(bus.socketPath, "s")
            #expect(after.int("version") == before.int("version"))
            #expect(try Self.stateText(after) == Self.stateText(before))
        }
    }

    @Test("2. quadratic patches: keys into a large object and inserts at the front cost a few node visits each")
    func largePatches() throws {
        try withDurableBus { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "big")
            try store.register("s", handles: [], state: #"{"o":{},"a":[]}"#)
            let batches = 6, perBatch = 5_000 / Self.cut
            for b in 0..<batches {
                let ops = (0..<perBatch).map { #"{"op":"add","path":"/o/key-\#(b)-\#($0)","value":\#($0)}"# }
                try store.send(frame: #"{"op":"patch","store":"s","patch":[\#(ops.joined(separator: ","))]}"#)
                let front = (0..<perBatch).map { #"{"op":"add","path":"/a/0","value":\#($0)}"# }
                try store.send(frame: #"{"op":"patch","store":"s","patch":[\#(front.joined(separator: ","))]}"#)
                _ = try store.barrier("b\(b)")
            }
            let load = try Self.load(bus.socketPath)
            let operations = 2 * batches * perBatch
            #expect((load["patchSteps"] as? Int ?? .max) <= operations * 10, "\(load["patchSteps"] ?? "?") steps for \(operations) operations")
            // Each patch of 32 KiB or more was applied away from the loop while only this store's frames waited.
            #expect(load["preparations"] as? Int == 2 * batches, "\(load)")
            let got = try Self.state(bus.socketPath, "s")
            let state = try #require(got["state"] as? [String: Any])
            #expect((state["o"] as? [String: Any])?.count == batches * perBatch)
            #expect((state["a"] as? [Any])?.count == batches * perBatch)
        }
    }

    @Test("3. 2,000 path subscribes to a whole-state store parse it once; a patch touching none of 10,000 path subscriptions visits a few index nodes per operation")
    func pathSubscriptions() throws {
        try withDurableBus { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "whole")
            let todos = (0..<3_000).map { #"{"id":\#($0),"title":"todo \#($0)"}"# }.joined(separator: ",")
            try store.register("w", handles: [], state: #"{"todos":[\#(todos)]}"#)
            let loadBefore = try Self.load(bus.socketPath)
            let parsedBefore = loadBefore["statesParsed"] as? Int ?? -1
            let client = try RawPeer.ready(bus.socketPath, name: "subscriber")
            for i in 0..<2_000 {
                try client.send(frame: #"{"op":"subscribe","store":"w","path":"/todos/\#(i % 100)/title"}"#)
            }
            _ = try client.barrier()
            let loadAfter = try Self.load(bus.socketPath)
            #expect(loadAfter["statesParsed"] as? Int == parsedBefore + 1)
            // The ~100 KB state was parsed away from the loop, once.
            #expect(loadAfter["preparations"] as? Int == (loadBefore["preparations"] as? Int ?? -1) + 1, "\(loadAfter)")

            // 10,000 path subscriptions on a patching store, over three connections (4,096 each at most).
            try store.register("p", handles: [], state: #"{"todos":[\#(todos)],"other":{}}"#)
            var subscribers: [RawPeer] = []
            for c in 0..<3 {
                let peer = try RawPeer.ready(bus.socketPath, name: "paths\(c)")
                for i in (c * 3_334)..<min(10_000, (c + 1) * 3_334) {
                    try peer.send(frame: #"{"op":"subscribe","store":"p","path":"/todos/\#(i % 3_000)/title/\#(i / 3_000)"}"#)
                }
                _ = try peer.barrier("subs\(c)", timeout: .seconds(60))
                subscribers.append(peer)
            }
            let matchBefore = try Self.load(bus.socketPath)["pathMatchSteps"] as? Int ?? -1
            let far = (0..<2_000).map { #"{"op":"add","path":"/other/k\#($0)","value":1}"# }.joined(separator: ",")
            try store.send(frame: #"{"op":"patch","store":"p","patch":[\#(far)]}"#)
            _ = try store.barrier("far")
            let matched = (try Self.load(bus.socketPath)["pathMatchSteps"] as? Int ?? .max) - matchBefore
            #expect(matched <= 2 * 2_000 + 16, "\(matched) index nodes for 2,000 operations touching no subscription")
            for peer in subscribers {
                try peer.send(frame: #"{"op":"ping","id":"after"}"#)
                let (before, _) = try peer.read(until: "pong") { $0.op == "pong" }
                #expect(!before.contains { $0.op == "subtree" }, "a subscriber was sent a subtree the patch did not touch")
            }
        }
    }

    @Test("4. a restart after 10,000 journaled patches replays them in a few node visits each")
    func restartAfterManyPatches() throws {
        try withDurableBus { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "patcher")
            try store.register("r", handles: [], state: #"{"n":0,"list":[]}"#)
            let patches = 10_000 / Self.cut
            for i in 1...patches {
                try store.send(frame: #"{"op":"patch","store":"r","patch":[{"op":"replace","path":"/n","value":\#(i)},{"op":"add","path":"/list/0","value":\#(i % 10)}]}"#)
                if i % 500 == 0 { _ = try store.barrier("p\(i)") }
            }
            try bus.restart(kill: true)  // (a crash: the patches are in the journal, not in a checkpoint)
            let got = try Self.state(bus.socketPath, "r")
            #expect(got.int("version") == patches + 1)
            let state = try #require(got["state"] as? [String: Any])
            #expect(state["n"] as? Int == patches)
            #expect((state["list"] as? [Any])?.count == patches)
            let load = try Self.load(bus.socketPath)
            #expect((load["patchSteps"] as? Int ?? .max) <= patches * 2 * 8, "replaying \(patches) patches took \(load["patchSteps"] ?? "?") steps")
        }
    }

    @Test("6. keys that are canonically equivalent are two keys: a move between them moves, and a delta subscriber agrees with fluxd")
    func equivalentKeys() throws {
        try withDurableBus { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "keys")
            try store.register("k", handles: [], state: #"{"\u00e9":{"x":1},"e\u0301":{}}"#)
            let client = try RawPeer.ready(bus.socketPath, name: "delta")
            try client.send(frame: #"{"op":"subscribe","store":"k","deltas":true}"#)
            _ = try client.expect("subscribed")
            _ = try client.expect("snapshot")
            try store.send(frame: #"{"op":"patch","store":"k","patch":[{"op":"move","from":"/\u00e9","path":"/e\u0301/y"}]}"#)
            let delta = try client.expect("delta")
            #expect(delta.int("version") == 2)
            let got = try Self.state(bus.socketPath, "k")
            #expect(String(decoding: got.body, as: UTF8.self).contains("\"state\":{\"e\u{301}\":{\"y\":{\"x\":1}}}"), "\(got)")
            _ = try store.barrier("still open")  // not cut with patch-failed
        }
    }
}
