import FluxCore
import Foundation
import Glibc
import Testing

/// Issue 25's test matrix, generated from the protocol model's op list: one case per op fluxd receives
/// (`Op.allCases` with `isReceivedByDaemon`, host operations included). Each case starts a real durable fluxd with a
/// config file (one worker) on a temporary socket, connects a well-behaved client, and has an attacker send that op's
/// worst-case input (maximal sizes, counts, nesting, repetition: `worstCases`, sized for CI); it asserts the
/// documented answer or error code (SPEC §11), whether the attacker's connection survives or is closed as §11 says,
/// that fluxd is alive, and that the well-behaved client's `info` round trip is still answered. No timings.
///
/// A new op has no entry in `worstCases` and fails here, naming the op, until its worst case is written (and its
/// row in docs/limits.md's "Worst case per input", which scripts/check-op-matrix.py checks).
@Suite("Worst case per op, from the protocol model's op list", .serialized, .onDedicatedThreads)
struct OpMatrixTests {
    static let receivedOps = Op.allCases.filter { $0.isReceivedByDaemon }
    /// Under AddressSanitizer (FLUXBUS_ASAN) the floods of small frames are cut by this factor (fluxd is ~10x slower
    /// there); the sizes and limits are the same.
    static let cut = ProcessInfo.processInfo.environment["FLUXBUS_ASAN"] == nil ? 1 : 5

    /// The limits of the matrix's fluxd: small enough to be reached at CI size.
    static let maxFrame = 1 << 20
    static let maxSubscriptions = 256
    static let maxQueries = 128
    static let maxStoresPerConnection = 128
    static let maxBacklog = 4 << 20

    /// One case's bus: a durable fluxd with a config file, in a temporary directory removed by `cleanup()`.
    final class MatrixBus {
        let directory: TempDirectory
        let socketPath: String
        let configPath: String
        let fluxd: Fluxd

        static let config = """
            [fluxd]
            log_level = "warning"

            [workers.sleeper]
            command = "/bin/sleep"
            args = ["600"]
            socket_arg = false

            """

        init() throws {
            directory = try TempDirectory(prefix: "fluxopm")
            socketPath = directory.path + "/fluxd.sock"
            configPath = directory.path + "/fluxd.toml"
            do {
                try Self.config.write(toFile: configPath, atomically: true, encoding: .utf8)
                fluxd = try Fluxd(arguments: [
                    "--config", configPath,
                    "--max-subscriptions", "\(OpMatrixTests.maxSubscriptions)",
                    "--max-queries", "\(OpMatrixTests.maxQueries)",
                    "--max-stores-per-connection", "\(OpMatrixTests.maxStoresPerConnection)",
                    "--max-backlog", "\(OpMatrixTests.maxBacklog)",
                    "--queue-limit", "64", "--store-window", "64",
                ], socketPath: socketPath, dataDirectory: directory.path + "/data")
            } catch {
                directory.remove()
                throw error
            }
        }

        func cleanup() {
            fluxd.cleanup()
            directory.remove()
        }
    }

    typealias WorstCase = @Sendable (MatrixBus) throws -> Void

    /// Each op's worst-case input and what fluxd must answer to it.
    static let worstCases: [Op: WorstCase] = [
        .hello: hello, .register: register, .unregister: unregister, .dispatch: dispatch, .done: done,
        .reject: reject, .state: state, .patch: patch, .subscribe: subscribe, .unsubscribe: unsubscribe,
        .query: query, .unquery: unquery, .info: info, .get: get, .ping: ping, .pong: pong, .bye: bye,
        .workers: workers, .restartWorker: restartWorker, .stopWorker: stopWorker, .recover: recover,
        .history: history, .stateAt: stateAt, .reload: reload, .forget: forget,
    ]

    @Test("every op fluxd receives: its worst case is answered as documented, fluxd lives, another client is answered",
          arguments: OpMatrixTests.receivedOps)
    func worstCase(_ op: Op) throws {
        guard let attack = Self.worstCases[op] else {
            Issue.record("op \"\(op.rawValue)\" has no worst case in OpMatrixTests.worstCases: add its worst-case input (and its row in docs/limits.md's \"Worst case per input\")")
            return
        }
        let bus = try MatrixBus()
        defer { bus.cleanup() }
        do {
            try bus.fluxd.waitForReady()
            let client = try RawPeer.ready(bus.socketPath, name: "well-behaved")
            try Self.roundTrip(client, "before \(op.rawValue)")
            try attack(bus)
            #expect(bus.fluxd.process.isRunning, "fluxd exited after the worst case of \(op.rawValue):\n\(bus.fluxd.stderr)")
            try Self.roundTrip(client, "after \(op.rawValue)")
            // A new connection is welcomed too.
            try Self.roundTrip(try RawPeer.ready(bus.socketPath, name: "newcomer"), "a new connection after \(op.rawValue)")
        } catch {
            Issue.record("\(op.rawValue): \(error)\nfluxd:\n\(bus.fluxd.stderr)")
        }
    }

    // MARK: - Helpers

    static func roundTrip(_ peer: RawPeer, _ what: String) throws {
        try peer.send(frame: #"{"op":"info","id":"wb"}"#)
        let reply = try peer.read(until: "info \(what)", timeout: .seconds(30)) { $0.op == "info" || $0.op == "error" }.match
        #expect(reply.op == "info" && reply.string("id") == "wb", "\(what): \(reply.text.prefix(300))")
    }

    static func frame(_ json: String) -> [UInt8] { encodeFrame(Array(json.utf8)) }

    /// `prefix` + `"pad":"xxx…"` + `suffix`, with as many x as make the body exactly `bytes` long.
    static func padded(_ prefix: String, _ suffix: String, to bytes: Int = maxFrame) -> String {
        let fixed = prefix.utf8.count + #""pad":"""#.utf8.count + suffix.utf8.count
        return prefix + #""pad":""# + String(repeating: "x", count: bytes - fixed) + #"""# + suffix
    }

    /// Reads `count` messages (throws on EOF or timeout).
    static func messages(_ peer: RawPeer, _ count: Int, _ what: String) throws -> [Message] {
        var out: [Message] = []
        out.reserveCapacity(count)
        for i in 0..<count {
            do { out.append(try peer.message(timeout: .seconds(30))) } catch {
                throw HarnessError.unexpectedOutput("\(what): message \(i + 1) of \(count): \(error)")
            }
        }
        return out
    }

    /// `count` pipelined replies with the op `op`, read as they come: all of them, or (when they outgrow
    /// `maxBacklog` faster than the peer reads) those sent before `slow-consumer`, after which the connection ends.
    static func repliesOrCut(_ peer: RawPeer, _ count: Int, _ op: String,
                             sourceLocation: SourceLocation = #_sourceLocation) throws -> [Message] {
        var replies: [Message] = []
        while replies.count < count {
            let m = try peer.message(timeout: .seconds(30))
            if m.op == "error" {
                #expect(m.string("code") == "slow-consumer" && m.bool("fatal") == true, "after \(replies.count) \(op) replies: \(m)",
                        sourceLocation: sourceLocation)
                #expect(try peer.next(timeout: .seconds(20)) == .eof, "closed after slow-consumer", sourceLocation: sourceLocation)
                return replies
            }
            #expect(m.op == op, "reply \(replies.count + 1): \(m.text.prefix(200))", sourceLocation: sourceLocation)
            replies.append(m)
        }
        return replies
    }

    static func codes(_ messages: [Message]) -> [String: Int] {
        var out: [String: Int] = [:]
        for m in messages { out[m.op == "error" ? "error " + (m.string("code") ?? "?") : m.op ?? "?", default: 0] += 1 }
        return out
    }

    /// The connection survives: a ping is answered, and nothing else came before its pong.
    static func survives(_ peer: RawPeer, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let before = try peer.barrier("alive-\(what)")
        #expect(before.isEmpty, "\(what): \(before.map { $0.text.prefix(200) })", sourceLocation: sourceLocation)
    }

    /// The next message is an `error` with `code` (and `fatal` as given), then (when fatal) the connection ends.
    static func refused(_ peer: RawPeer, _ code: String, fatal: Bool, _ what: String,
                        sourceLocation: SourceLocation = #_sourceLocation) throws {
        let m = try peer.message(timeout: .seconds(30))
        #expect(m.op == "error" && m.string("code") == code && m.bool("fatal") == fatal,
                "\(what): expected error \(code) (fatal \(fatal)), got \(m.text.prefix(300))", sourceLocation: sourceLocation)
        if fatal { #expect(try peer.next(timeout: .seconds(20)) == .eof, "\(what): closed after it", sourceLocation: sourceLocation) }
    }

    static func copies(_ n: Int) -> String {
        "[" + (0..<n).map { #"{"op":"copy","from":"","path":"/k\#($0)"}"# }.joined(separator: ",") + "]"
    }

    // MARK: - The worst cases

    /// A `maxFrame` hello (a 128-byte name, a 256-byte session, an unknown field filling the frame); a second one on
    /// the ready connection; a hello with a 129-byte name (closed during the handshake).
    static let hello: WorstCase = { bus in
        let name = String(repeating: "n", count: Names.maxPeerNameBytes)
        let session = String(repeating: "s", count: Names.maxIDBytes)
        let big = padded(#"{"op":"hello","protocol":1,"role":"store","name":"\#(name)","session":"\#(session)","heartbeat":false,"#, "}")
        let attacker = try RawPeer(connectingTo: bus.socketPath)
        try attacker.send(frame(big))
        try attacker.expect("welcome")
        try attacker.send(frame(big))
        try refused(attacker, "bad-message", fatal: false, "a second hello")
        try survives(attacker, "after a second hello")
        let tooLong = try RawPeer(connectingTo: bus.socketPath)
        try tooLong.send(frame(#"{"op":"hello","protocol":1,"role":"client","name":"\#(name)n"}"#))
        try refused(tooLong, "bad-message", fatal: true, "a 129-byte name")
    }

    /// `maxStoresPerConnection` stores, each past the first 64 waiting for the 64 before it (`maxWaitFor` entries);
    /// one more store, and a `waitFor` of 65: `limit-exceeded`. The cycle check stays within stores + edges.
    static let register: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "layers")
        var batch: [UInt8] = []
        for i in 0..<maxStoresPerConnection {
            let waitFor = i < 64 ? [] : (i - 64..<i).map { "s\($0)" }
            batch += frame(#"{"op":"register","store":"s\#(i)","handles":["s\#(i)/*"],"waitFor":\#(jsonArray(waitFor))}"#)
        }
        try store.send(batch)
        let replies = try store.read(until: "registered s\(maxStoresPerConnection - 1)", timeout: .seconds(60)) {
            $0.op == "queries" && $0.string("store") == "s\(maxStoresPerConnection - 1)"
        }.before
        #expect(!replies.contains { $0.op == "error" }, "\(codes(replies))")
        try store.send(frame(#"{"op":"register","store":"one-more","handles":[]}"#))
        try refused(store, "limit-exceeded", fatal: false, "a store past maxStoresPerConnection")
        let other = try RawPeer.ready(bus.socketPath, role: "store", name: "wide")
        try other.send(frame(#"{"op":"register","store":"wide","handles":[],"waitFor":\#(jsonArray((0..<65).map { "s\($0)" }))}"#))
        try refused(other, "limit-exceeded", fatal: false, "a waitFor of 65")
        try survives(store, "register")
        let info = try infoReply(bus)
        let steps = (info["load"] as? [String: Any])?["maxCycleCheckSteps"] as? Int ?? .max
        let stores = maxStoresPerConnection, edges = (maxStoresPerConnection - 64) * 64
        #expect(steps <= stores + edges + 2, "the cycle check took \(steps) steps for \(stores) stores and \(edges) edges")
    }

    /// A store with a full queue and a subscriber unregisters; then unregisters what it no longer owns.
    static let unregister: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "leaving")
        try store.register("u", handles: ["u/*"])
        let subscriber = try RawPeer.ready(bus.socketPath, name: "watcher")
        try subscriber.subscribe("u")
        let dispatcher = try RawPeer.ready(bus.socketPath, name: "filler")
        var batch: [UInt8] = []
        for i in 0..<128 { batch += frame(#"{"op":"dispatch","type":"u/x","payload":\#(i)}"#) }
        try dispatcher.send(batch)
        _ = try dispatcher.barrier()
        try store.send(frame(#"{"op":"unregister","store":"u"}"#))
        try store.send(frame(#"{"op":"unregister","store":"u"}"#))
        let (_, second) = try store.read(until: "the second unregister's refusal") { $0.op == "error" }
        #expect(second.string("code") == "forbidden" && second.bool("fatal") == false, "\(second)")
        try survives(store, "unregister")
        let down = try subscriber.read(until: "store-down") { $0.op == "store-down" }.match
        #expect(down.string("store") == "u")
    }

    /// 300 dispatches of 16 KiB payloads with distinct action types, pipelined without reading, to a store whose
    /// window and queue hold 128: the rest `overloaded` (the connection survives); the accepted ones settle.
    static let dispatch: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "busy")
        try store.register("d", handles: ["d/*"])
        let attacker = try RawPeer.ready(bus.socketPath, name: "flooder")
        let payload = String(repeating: "p", count: 16 << 10)
        let sent = 300
        var batch: [UInt8] = []
        for i in 0..<sent {
            batch += frame(#"{"op":"dispatch","id":"a\#(i)","type":"d/t\#(i)","payload":"\#(payload)","settle":true}"#)
        }
        try attacker.send(batch)
        let refusals = try attacker.barrier("refusals")
        #expect(refusals.allSatisfy { $0.op == "error" && $0.string("code") == "overloaded" && $0.bool("fatal") == false },
                "\(codes(refusals))")
        let accepted = sent - refusals.count
        #expect(refusals.count > 0 && accepted >= 64, "accepted \(accepted) of \(sent)")
        for _ in 0..<accepted {
            let action = try store.expect("action")
            try store.send(frame(#"{"op":"done","store":"d","seq":\#(action.int("seq") ?? 0)}"#))
        }
        let settled = try messages(attacker, accepted, "settlements")
        #expect(settled.allSatisfy { $0.op == "settled" && $0.results["d"]?["status"] as? String == "done" }, "\(codes(settled))")
        try survives(attacker, "dispatch")
    }

    /// A `maxFrame` `done` with a state; an answer out of order (`bad-message`, survives); a `done.patch` copy bomb
    /// (`memory-budget`, the store's connection closed).
    static let done: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "answerer")
        try store.register("x", handles: ["x/*"])
        let client = try RawPeer.ready(bus.socketPath, name: "asker")
        try client.send(frame(#"{"op":"dispatch","id":"g1","type":"x/go","settle":true}"#))
        let seq = try store.expect("action").int("seq") ?? 0
        try store.send(frame(padded(#"{"op":"done","store":"x","seq":\#(seq),"state":{"#, "}}")))
        #expect(try client.expect("settled").results["x"]?["status"] as? String == "done")
        try client.send(frame(#"{"op":"dispatch","id":"g2","type":"x/go","settle":true}"#))
        let seq2 = try store.expect("action").int("seq") ?? 0
        try store.send(frame(#"{"op":"done","store":"x","seq":\#(seq2 + 7)}"#))
        try refused(store, "bad-message", fatal: false, "an answer out of order")
        try store.send(frame(#"{"op":"done","store":"x","seq":\#(seq2),"patch":\#(copies(40))}"#))
        try refused(store, "memory-budget", fatal: true, "a done.patch copy bomb")
    }

    /// 70 rejections with 256-byte codes and 8 KiB messages; then a 257-byte code (`bad-message`, survives).
    static let reject: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "rejecter")
        try store.register("r", handles: ["r/*"])
        let client = try RawPeer.ready(bus.socketPath, name: "rejected")
        let count = 70
        var batch: [UInt8] = []
        for i in 0..<count { batch += frame(#"{"op":"dispatch","id":"r\#(i)","type":"r/x","settle":true}"#) }
        try client.send(batch)
        let message = String(repeating: "m", count: 8 << 10)
        for i in 0..<count {
            let seq = try store.expect("action").int("seq") ?? 0
            let code = "c\(i)-" + String(repeating: "k", count: 256 - "c\(i)-".utf8.count)
            try store.send(frame(#"{"op":"reject","store":"r","seq":\#(seq),"error":{"code":"\#(code)","message":"\#(message)"}}"#))
        }
        let settled = try messages(client, count, "rejections")
        #expect(settled.allSatisfy { $0.results["r"]?["status"] as? String == "rejected" }, "\(codes(settled))")
        try store.send(frame(#"{"op":"reject","store":"r","seq":1,"error":{"code":"\#(String(repeating: "k", count: 257))"}}"#))
        try refused(store, "bad-message", fatal: false, "a 257-byte code")
        try survives(store, "reject")
    }

    /// 20 `maxFrame` states published back to back to a subscriber that reads only afterwards: it gets the newest.
    static let state: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "publisher")
        try store.register("st", handles: [])
        let subscriber = try RawPeer.ready(bus.socketPath, name: "late-reader")
        try subscriber.subscribe("st")
        var batch: [UInt8] = []
        for i in 0..<20 { batch += frame(padded(#"{"op":"state","store":"st","state":{"n":\#(i),"#, "}}")) }
        try store.send(batch)
        try survives(store, "state")
        let last = try subscriber.read(until: "the newest snapshot", timeout: .seconds(60)) {
            $0.op == "snapshot" && (($0["state"] as? [String: Any])?["n"] as? Int) == 19
        }
        #expect(!last.before.contains { $0.op == "error" })
    }

    /// A 40-copy patch (the state doubles per operation): `memory-budget`, the store closed; the state unchanged.
    static let patch: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "bomber")
        try store.register("p", handles: [], state: #"{"seed":"0123456789abcdef"}"#)
        try store.send(frame(#"{"op":"patch","store":"p","patch":\#(copies(40))}"#))
        try refused(store, "memory-budget", fatal: true, "a 40-copy patch")
        let getter = try RawPeer.ready(bus.socketPath, name: "getter")
        try getter.send(frame(#"{"op":"get","store":"p"}"#))
        let got = try getter.expect("got")
        #expect((got["state"] as? [String: Any])?["seed"] as? String == "0123456789abcdef" && got.int("version") == 1)
    }

    /// `maxSubscriptions` + 44 subscribes to made-up names (the rest `limit-exceeded`); a delta subscription from
    /// the largest version; a 1,024-byte path (subscribed) and a 1,025-byte one (`bad-message`).
    static let subscribe: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "subscriber")
        let sent = maxSubscriptions + 44
        var batch: [UInt8] = []
        for i in 0..<sent { batch += frame(#"{"op":"subscribe","store":"ghost-\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, sent, "subscribe replies")
        #expect(codes(replies) == ["subscribed": maxSubscriptions, "error limit-exceeded": 44], "\(codes(replies))")
        try survives(attacker, "subscribe")
        let other = try RawPeer.ready(bus.socketPath, name: "paths")
        try other.send(frame(#"{"op":"subscribe","store":"ghost-0","deltas":true,"from":\#(Names.maxInteger)}"#))
        #expect(try other.expect("subscribed").string("store") == "ghost-0")
        let path = "/" + String(repeating: "a", count: 1_023)
        try other.send(frame(#"{"op":"subscribe","store":"ghost-1","path":"\#(path)"}"#))
        #expect(try other.expect("subscribed").string("store") == "ghost-1")
        try other.send(frame(#"{"op":"subscribe","store":"ghost-1","path":"\#(path)a"}"#))
        try refused(other, "bad-message", fatal: false, "a 1,025-byte path")
        try survives(other, "path subscribe")
    }

    /// 1,000 unsubscribes of what was never subscribed (half with 1,024-byte paths): each answered, nothing held.
    static let unsubscribe: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "unsubscriber")
        let path = "/" + String(repeating: "b", count: 1_023)
        var batch: [UInt8] = []
        for i in 0..<1_000 {
            batch += frame(i % 2 == 0 ? #"{"op":"unsubscribe","store":"never-\#(i)"}"#
                                      : #"{"op":"unsubscribe","store":"never-\#(i)","path":"\#(path)"}"#)
        }
        try attacker.send(batch)
        let replies = try messages(attacker, 1_000, "unsubscribed")
        #expect(codes(replies) == ["unsubscribed": 1_000], "\(codes(replies))")
        try survives(attacker, "unsubscribe")
    }

    /// 200 queries of 8 KiB values: `maxQueries` / `maxQueryBytes` refuse the rest with `limit-exceeded`.
    static let query: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "querier")
        let value = String(repeating: "q", count: 8 << 10)
        var batch: [UInt8] = []
        for i in 0..<200 { batch += frame(#"{"op":"query","id":"q\#(i)","store":"qs","query":{"i":\#(i),"v":"\#(value)"}}"#) }
        try attacker.send(batch)
        let c = codes(try messages(attacker, 200, "query replies"))
        #expect((c["query-ok"] ?? 0) <= maxQueries && (c["error limit-exceeded"] ?? 0) > 0
                && (c["query-ok"] ?? 0) + (c["error limit-exceeded"] ?? 0) == 200, "\(c)")
        try survives(attacker, "query")
    }

    /// 500 unqueries of ids never queried: `bad-message` each, the connection survives.
    static let unquery: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "unquerier")
        let id = String(repeating: "i", count: 250)
        var batch: [UInt8] = []
        for i in 0..<500 { batch += frame(#"{"op":"unquery","id":"\#(id)\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 500, "unquery refusals")
        #expect(replies.allSatisfy { $0.string("code") == "bad-message" && $0.bool("fatal") == false }, "\(codes(replies))")
        try survives(attacker, "unquery")
    }

    /// 200 `info`s pipelined on a bus with 128 stores: answered, or the asker cut `slow-consumer` when the replies
    /// (64 KiB each) outgrow `maxBacklog` before it reads them.
    static let info: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "many")
        var batch: [UInt8] = []
        for i in 0..<maxStoresPerConnection { batch += frame(#"{"op":"register","store":"m\#(i)","handles":["m\#(i)/*"]}"#) }
        try store.send(batch)
        _ = try store.barrier("registered", timeout: .seconds(60))
        let attacker = try RawPeer.ready(bus.socketPath, name: "asker")
        batch = []
        for i in 0..<200 { batch += frame(#"{"op":"info","id":"i\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try repliesOrCut(attacker, 200, "info")
        #expect(replies.first?.objects("stores").count == maxStoresPerConnection)
    }

    /// 40 pipelined `get`s of a `maxFrame` state never read: cut at `maxBacklog` (`slow-consumer` or
    /// `memory-budget`), only this connection.
    static let get: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "big")
        try store.register("g", handles: [], state: "{}")
        try store.send(frame(padded(#"{"op":"state","store":"g","state":{"#, "}}")))
        try survives(store, "state of g")
        let attacker = try RawPeer.ready(bus.socketPath, name: "never-reads")
        var batch: [UInt8] = []
        for _ in 0..<40 { batch += frame(#"{"op":"get","store":"g"}"#) }
        try attacker.send(batch)
        let received = try attacker.readUntilEOF(timeout: .seconds(60))
        let last = received.last ?? [:]
        #expect(last["op"] as? String == "error" && ["slow-consumer", "memory-budget"].contains(last["code"] as? String ?? ""),
                "the last of \(received.count) frames: \(last["op"] ?? "none") \(last["code"] ?? "")")
        #expect(received.dropLast().allSatisfy { $0["op"] as? String == "got" })
        try survives(store, "get")
    }

    /// 20,000 pipelined pings: every pong, in order.
    static let ping: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "pinger")
        var batch: [UInt8] = []
        let count = 20_000 / cut
        for i in 0..<count { batch += frame(#"{"op":"ping","id":"p\#(i)"}"#) }
        try attacker.send(batch)
        for i in 0..<count {
            let pong = try attacker.expect("pong", timeout: .seconds(30))
            guard pong.string("id") == "p\(i)" else {
                Issue.record("pong \(i) out of order: \(pong)")
                return
            }
        }
    }

    /// 10,000 unsolicited pongs with 256-byte ids: no reply to any.
    static let pong: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "ponger")
        let id = String(repeating: "o", count: 256)
        var batch: [UInt8] = []
        for _ in 0..<(10_000 / cut) { batch += frame(#"{"op":"pong","id":"\#(id)"}"#) }
        try attacker.send(batch)
        try survives(attacker, "pong")
    }

    /// A connection holding `maxQueries` queries and `maxSubscriptions` subscriptions says `bye`: closed, all released.
    static let bye: WorstCase = { bus in
        let before = try memoryUsed(bus)
        let attacker = try RawPeer.ready(bus.socketPath, name: "leaver")
        var batch: [UInt8] = []
        for i in 0..<maxQueries { batch += frame(#"{"op":"query","id":"q\#(i)","store":"qb","query":\#(i)}"#) }
        for i in 0..<maxSubscriptions { batch += frame(#"{"op":"subscribe","store":"b-\#(i)"}"#) }
        batch += frame(#"{"op":"bye"}"#)
        try attacker.send(batch)
        let received = try attacker.readUntilEOF(timeout: .seconds(30))
        #expect(!received.contains { $0["op"] as? String == "error" }, "\(received.filter { $0["op"] as? String == "error" }.prefix(3))")
        #expect(received.count >= maxQueries + maxSubscriptions)
        #expect(try memoryUsed(bus) <= before + 65_536, "what the leaver held is released (the info connection's allowance at most)")
    }

    /// 200 pipelined `workers`.
    static let workers: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "lister")
        var batch: [UInt8] = []
        for i in 0..<200 { batch += frame(#"{"op":"workers","id":"w\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 200, "workers replies")
        #expect(codes(replies) == ["workers": 200], "\(codes(replies))")
        try survives(attacker, "workers")
    }

    /// 100 restarts of workers that do not exist (`unknown-worker`), then 5 of the real one, back to back.
    static let restartWorker: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "restarter")
        var batch: [UInt8] = []
        for i in 0..<100 { batch += frame(#"{"op":"restart-worker","id":"u\#(i)","name":"nope-\#(i)"}"#) }
        for i in 0..<5 { batch += frame(#"{"op":"restart-worker","id":"r\#(i)","name":"sleeper"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 105, "restart-worker replies")
        #expect(codes(replies) == ["error unknown-worker": 100, "worker": 5], "\(codes(replies))")
        try survives(attacker, "restart-worker")
    }

    /// 100 stops of workers that do not exist (`unknown-worker`), then the real one twice.
    static let stopWorker: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "stopper")
        var batch: [UInt8] = []
        for i in 0..<100 { batch += frame(#"{"op":"stop-worker","id":"u\#(i)","name":"nope-\#(i)"}"#) }
        for i in 0..<2 { batch += frame(#"{"op":"stop-worker","id":"s\#(i)","name":"sleeper"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 102, "stop-worker replies")
        #expect(codes(replies) == ["error unknown-worker": 100, "worker": 2], "\(codes(replies))")
        try survives(attacker, "stop-worker")
    }

    /// A `recover` of 4,096 ids of 200 bytes (the most one may name): one outcome each; 4,097 ids: `bad-message`.
    static let recover: WorstCase = { bus in
        let attacker = try RawPeer(connectingTo: bus.socketPath)
        try attacker.send(frame(#"{"op":"hello","protocol":1,"role":"client","name":"recoverer","session":"s1"}"#))
        try attacker.expect("welcome")
        let pad = String(repeating: "r", count: 195)
        let ids = (0..<4_096).map { String(format: "%05d", $0) + pad }
        try attacker.send(frame(#"{"op":"recover","id":"rc","ids":\#(jsonArray(ids))}"#))
        let recovered = try attacker.expect("recovered", timeout: .seconds(30))
        let outcomes = recovered.objects("outcomes")
        #expect(outcomes.count == 4_096 && outcomes.allSatisfy { $0["status"] as? String == "unknown" })
        try attacker.send(frame(#"{"op":"recover","ids":\#(jsonArray((0...4_096).map { "\($0)" }))}"#))
        try refused(attacker, "bad-message", fatal: false, "4,097 ids")
        try survives(attacker, "recover")
    }

    /// 20 pipelined pages of `history` (`limit` 1000) over 50 journaled actions with 16 KiB payloads: read off the
    /// loop, at most 4 outstanding per connection (SPEC §8.12): each answered with its page or refused `overloaded`
    /// (not fatal), at least the first 4 answered; `limit` 1001: `bad-message`.
    static let history: WorstCase = { bus in
        try journalActions(bus, store: "h", count: 50, payloadBytes: 16 << 10)
        let attacker = try RawPeer.ready(bus.socketPath, name: "historian")
        var batch: [UInt8] = []
        for i in 0..<20 { batch += frame(#"{"op":"history","id":"h\#(i)","limit":1000}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 20, "history replies")
        let pages = replies.filter { $0.op == "history" }
        #expect(pages.count >= 4 && pages.allSatisfy { $0.objects("entries").count >= 50 }, "\(codes(replies))")
        #expect(replies.allSatisfy { $0.op == "history" || ($0.string("code") == "overloaded" && $0.bool("fatal") == false) },
                "\(codes(replies))")
        let answered = Set(replies.compactMap { $0.string("id") ?? $0.string("ref") })
        #expect(answered == Set((0..<20).map { "h\($0)" }), "each request answered once")
        let other = try RawPeer.ready(bus.socketPath, name: "historian-2")
        try other.send(frame(#"{"op":"history","limit":1001}"#))
        try refused(other, "bad-message", fatal: false, "limit 1001")
        try survives(other, "history")
    }

    /// `state-at` each of 50 versions a patch made, pipelined; a version past the newest: `not-retained`.
    static let stateAt: WorstCase = { bus in
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "patcher")
        try store.register("sa", handles: [], state: #"{"n":0}"#)
        var batch: [UInt8] = []
        for i in 1...100 { batch += frame(#"{"op":"patch","store":"sa","patch":[{"op":"replace","path":"/n","value":\#(i)}]}"#) }
        try store.send(batch)
        try survives(store, "patches")
        let attacker = try RawPeer.ready(bus.socketPath, name: "archaeologist")
        batch = []
        for v in 1...50 { batch += frame(#"{"op":"state-at","id":"v\#(v)","store":"sa","version":\#(v * 2)}"#) }
        try attacker.send(batch)
        // Read off the loop, at most 4 outstanding per connection: each answered with its state or refused
        // `overloaded` (not fatal); the states come in the order asked.
        let replies = try messages(attacker, 50, "state-at replies")
        var lastVersion = 0
        for reply in replies {
            if reply.op == "error" {
                #expect(reply.string("code") == "overloaded" && reply.bool("fatal") == false, "\(reply.text.prefix(200))")
                continue
            }
            let v = Int(reply.string("id")?.dropFirst() ?? "") ?? 0
            #expect(reply.op == "state-at" && v > lastVersion / 2 && (reply["state"] as? [String: Any])?["n"] as? Int == v * 2 - 1,
                    "version \(v * 2): \(reply.text.prefix(200))")
            lastVersion = v * 2
        }
        #expect(replies.filter { $0.op == "state-at" }.count >= 4, "\(codes(replies))")
        try attacker.send(frame(#"{"op":"state-at","store":"sa","version":\#(Names.maxInteger)}"#))
        try refused(attacker, "not-retained", fatal: false, "a version never made")
        try survives(attacker, "state-at")
    }

    /// 20 pipelined reloads (read and parsed off the loop, at most 4 outstanding per connection: the rest refused
    /// `overloaded`, not fatal); the config file replaced by a FIFO nobody writes (refused without blocking fluxd);
    /// the file back.
    static let reload: WorstCase = { bus in
        let attacker = try RawPeer.ready(bus.socketPath, name: "reloader")
        var batch: [UInt8] = []
        for i in 0..<20 { batch += frame(#"{"op":"reload","id":"l\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 20, "reloaded")
        let counts = codes(replies)
        #expect((counts["reloaded"] ?? 0) >= 4 && (counts["reloaded"] ?? 0) + (counts["error overloaded"] ?? 0) == 20, "\(counts)")
        let saved = bus.configPath + ".saved"
        guard rename(bus.configPath, saved) == 0, mkfifo(bus.configPath, 0o600) == 0 else {
            throw HarnessError.system("replace the config with a FIFO", errno)
        }
        try attacker.send(frame(#"{"op":"reload","id":"fifo"}"#))
        try refused(attacker, "reload-refused", fatal: false, "a FIFO as the config file")
        unlink(bus.configPath)
        guard rename(saved, bus.configPath) == 0 else { throw HarnessError.system("restore the config", errno) }
        try attacker.send(frame(#"{"op":"reload","id":"back"}"#))
        #expect(try attacker.expect("reloaded").string("id") == "back")
    }

    /// `forget` of a down store at its worst: a 256 KiB retained state, 64 subscribers, a full queue (64 actions
    /// with settlement): one forget settles them all, tells every subscriber; then 200 forgets of names nobody
    /// registered, pipelined: `unknown-store` each. The work is one step per queued action and per subscriber.
    static let forget: WorstCase = { bus in
        do {
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "gone")
            _ = try store.register("f", handles: ["f/*"], state: "\"\(String(repeating: "s", count: 256 << 10))\"")
        }  // (the connection closes: the store is down)
        var subscribers: [RawPeer] = []
        for i in 0..<64 {
            let subscriber = try RawPeer.ready(bus.socketPath, name: "watcher\(i)")
            try subscriber.send(frame(#"{"op":"subscribe","store":"f"}"#))
            subscribers.append(subscriber)
        }
        let dispatcher = try RawPeer.ready(bus.socketPath, name: "filler")
        var batch: [UInt8] = []
        for i in 0..<64 { batch += frame(#"{"op":"dispatch","id":"q\#(i)","type":"f/x","payload":\#(i),"settle":true}"#) }
        try dispatcher.send(batch)
        _ = try dispatcher.barrier()
        let attacker = try RawPeer.ready(bus.socketPath, name: "forgetter")
        batch = frame(#"{"op":"forget","id":"f","store":"f"}"#)
        for i in 0..<200 { batch += frame(#"{"op":"forget","id":"n\#(i)","store":"nobody\#(i)"}"#) }
        try attacker.send(batch)
        let replies = try messages(attacker, 201, "forgotten and unknown-store")
        #expect(replies.first?.op == "forgotten" && replies.first?.int("gaveUp") == 64, "\(replies.first?.text ?? "")")
        #expect(codes(replies) == ["forgotten": 1, "error unknown-store": 200], "\(codes(replies))")
        try survives(attacker, "forget")
        let settled = try messages(dispatcher, 64, "the queued actions' settlements")
        #expect(settled.allSatisfy { $0.op == "settled" && $0.text.contains("store-unavailable") })
        for subscriber in subscribers {
            let down = try subscriber.read(until: "store-down forgotten") { $0.op == "store-down" && $0.string("reason") == "forgotten" }
            _ = down
        }
    }

    // MARK: - Support of the cases

    static func infoReply(_ bus: MatrixBus) throws -> Message {
        let peer = try RawPeer.ready(bus.socketPath, name: "info")
        try peer.send(frame(#"{"op":"info","id":"i"}"#))
        return try peer.read(until: "info") { $0.op == "info" }.match
    }

    static func memoryUsed(_ bus: MatrixBus) throws -> Int {
        (try infoReply(bus)["memory"] as? [String: Any])?["used"] as? Int ?? -1
    }

    /// `count` settled actions with payloads of `payloadBytes` through a store named `store`, journaled.
    static func journalActions(_ bus: MatrixBus, store name: String, count: Int, payloadBytes: Int) throws {
        let store = try RawPeer.ready(bus.socketPath, role: "store", name: "journaled")
        try store.register(name, handles: ["\(name)/*"])
        let client = try RawPeer.ready(bus.socketPath, name: "journaler")
        let payload = String(repeating: "j", count: payloadBytes)
        var batch: [UInt8] = []
        for i in 0..<count { batch += frame(#"{"op":"dispatch","id":"j\#(i)","type":"\#(name)/x","payload":"\#(payload)","settle":true}"#) }
        try client.send(batch)
        for _ in 0..<count {
            let seq = try store.expect("action").int("seq") ?? 0
            try store.send(frame(#"{"op":"done","store":"\#(name)","seq":\#(seq)}"#))
        }
        _ = try messages(client, count, "settlements of the journaled actions")
    }
}

