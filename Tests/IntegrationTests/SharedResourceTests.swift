import FluxCore
import Foundation
import Glibc
import Synchronization
import Testing

/// Issue 25's shares of what all peers share, against a real durable fluxd whose socket another user (uid 4343,
/// through setpriv) may use: the journal's disk and the outcome window. Behaviour only, never time; the attacks at
/// full size are in Benchmarks/ATTACKS.md (`scripts/attack-bench.sh`, 14 and 15).
@Suite("Shares of the bus-wide resources: the journal's disk, the outcome window", .serialized, .onDedicatedThreads,
       .enabled(if: geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0, "needs root and setpriv"))
struct SharedResourceTests {
    static let other: UInt32 = 4343
    static let launcher = ["/usr/bin/setpriv", "--reuid=\(other)", "--regid=\(other)", "--clear-groups"]

    /// A durable fluxd on a socket every user may use, with `arguments` added; `body` gets the socket path.
    func withSharedBus(_ arguments: [String], _ body: (String, Fluxd) throws -> Void) throws {
        let tmp = try TempDirectory(prefix: "fluxshare")
        defer { tmp.remove() }
        #expect(chmod(tmp.path, 0o755) == 0)
        let path = tmp.path + "/fluxd.sock"
        let fluxd = try Fluxd(arguments: ["--socket-mode", "0666", "--data-dir", tmp.path + "/data"] + arguments, socketPath: path)
        defer { fluxd.cleanup() }
        _ = try fluxd.waitForReady()
        do { try body(path, fluxd) } catch {
            Issue.record("fluxd:\n\(fluxd.stderr)")
            throw error
        }
    }

    /// `fluxctl arguments` as the other user, to its end.
    func asOtherUser(_ arguments: [String], socket: String) throws -> FluxctlResult {
        let process = try FluxctlProcess(arguments, socket: socket, environment: ["FLUXBUS_SERVER_UID": "\(getuid())"],
                                         launcher: Self.launcher)
        defer { process.cleanup() }
        return try process.finishBlocking(timeout: .seconds(60))
    }

    /// A store of root's that answers `done` (without a state) to every action, on a thread of its own, until
    /// `stop` is called.
    final class AnsweringStore: @unchecked Sendable {
        // @unchecked: the peer is used by the answering thread only once started; `stopped` is atomic.
        private let peer: RawPeer
        private let stopped = Atomic<Bool>(false)
        private let finished = DispatchSemaphore(value: 0)
        let answered = Atomic<Int>(0)

        init(_ path: String, store: String, handles: [String]) throws {
            peer = try RawPeer.ready(path, role: "store", name: store)
            try peer.register(store, handles: handles)
            let thread = Thread { [self] in
                while !stopped.load(ordering: .acquiring) {
                    guard let m = try? peer.message(timeout: .milliseconds(100)) else { continue }
                    if m.op == "action", let seq = m.int("seq") {
                        try? peer.send(frame: #"{"op":"done","store":"\#(store)","seq":\#(seq)}"#)
                        answered.add(1, ordering: .relaxed)
                    }
                }
                finished.signal()
            }
            thread.start()
        }

        func stop() {
            stopped.store(true, ordering: .releasing)
            finished.wait()
        }
    }

    @Test("another user over its share of the journal's disk gets disk-quota for new work; root's dispatches go on and settle")
    func diskShare() throws {
        try withSharedBus(["--disk-per-user", "300000", "--checkpoint-bytes", "8000000"]) { path, _ in
            let store = try AnsweringStore(path, store: "big", handles: ["big/*"])
            defer { store.stop() }
            // Ten 60 KB actions of the other user: its journal records pass 300,000 bytes after about five.
            let payload = "\"" + String(repeating: "x", count: 60_000) + "\""
            let flood = try asOtherUser(["dispatch", "big/x", payload, "--count", "10", "--wait"], socket: path)
            #expect(flood.status != 0, "\(flood)")
            #expect(flood.stderr.contains("disk-quota"), "\(flood)")
            #expect(flood.stderr.contains("uid \(Self.other) holds"), "\(flood)")
            // Root's work is untouched: dispatched, answered, settled.
            let root = try RawPeer.ready(path, name: "root")
            for i in 0..<5 {
                try root.send(frame: #"{"op":"dispatch","id":"r\#(i)","type":"big/x","settle":true,"payload":\#(payload)}"#)
                let settled = try root.read(until: "settled r\(i)") { $0.op == "settled" || $0.op == "error" }.match
                #expect(settled.op == "settled", "\(settled)")
            }
        }
    }

    @Test("another user at its outcome quota gets outcome-quota (not sent); root's outcomes stay recoverable and its session dispatches go on")
    func outcomeQuota() throws {
        try withSharedBus(["--max-outcomes", "4"]) { path, _ in
            let store = try AnsweringStore(path, store: "todos", handles: ["todo/*"])
            defer { store.stop() }
            // Root settles one dispatch under its session first.
            let root = try RawPeer(connectingTo: path)
            try root.send(frame: #"{"op":"hello","protocol":1,"role":"client","session":"root-session"}"#)
            try root.expect("welcome")
            try root.send(frame: #"{"op":"dispatch","id":"first","type":"todo/x","settle":true}"#)
            #expect(try root.read(until: "settled first") { $0.op == "settled" }.match.string("id") == "first")
            // The other user's fluxctl dispatches ten, each under its session with settle: four are kept, the rest
            // refused.
            let flood = try asOtherUser(["dispatch", "todo/x", "{}", "--count", "10", "--wait", "--window", "1"], socket: path)
            #expect(flood.status != 0, "\(flood)")
            #expect(flood.stderr.contains("outcome-quota"), "\(flood)")
            // Root's outcome is still known, and root may dispatch under its session.
            try root.send(frame: #"{"op":"recover","id":"rc","ids":["first"]}"#)
            let recovered = try root.read(until: "recovered") { $0.op == "recovered" }.match
            #expect(recovered.objects("outcomes").first?["status"] as? String == "settled", "\(recovered)")
            for i in 0..<3 {  // (its own quota: 4, "first" included)
                try root.send(frame: #"{"op":"dispatch","id":"more\#(i)","type":"todo/x","settle":true}"#)
                let answer = try root.read(until: "settled more\(i)") { $0.op == "settled" || $0.op == "error" }.match
                #expect(answer.op == "settled", "\(answer)")
            }
        }
    }
}
