import FluxClient
import FluxCore
import Foundation
import Glibc
import Testing

/// §10 stores that go down (R6 nothing silently lost): subscribers are told, pending actions wait in a queue for
/// `queueTimeout` and are then settled `unavailable`, or are applied exactly once, in order, by the restarted store,
/// which resumes from the retained snapshot.
@Suite("§10 stores that go down", .onDedicatedThreads)
struct StoreDownTests {
    /// A bus with todo-store holding todos "a" and "b", and a view subscribed to todos; todo-store is SIGKILLed.
    /// `body` gets the view with the `store-down` frame not yet read.
    func withCrashedTodoStore(_ body: (RawPeer) throws -> Void) throws {
        try withBusBlocking(["--queue-timeout", "500"]) { bus in
            let store = try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            try view.subscribe("todos")
            for title in ["a", "b"] {
                try view.send(frame: #"{"op":"dispatch","id":"\#(title)","type":"todo/create","payload":{"title":"\#(title)"},"settle":true}"#)
                _ = try view.read(until: "settled \(title)") { $0.op == "settled" }
            }
            try store.crash()
            try body(view)
        }
    }

    @Test("todo-store SIGKILLed: subscribers get store-down, reason disconnected")
    func subscribersAreToldTheStoreWentDown() throws {
        try withCrashedTodoStore { view in
            let down = try view.expect("store-down")
            #expect(down.string("store") == "todos")
            #expect(down.string("reason") == "disconnected")
        }
    }

    @Test("todo-store down: a settled dispatch gets store-unavailable after the 500 ms queue timeout; the retained snapshot is untouched and the queue empty again")
    func dispatchToADownStoreTimesOut() throws {
        try withCrashedTodoStore { view in
            try view.expect("store-down")
            let started = ContinuousClock.now
            try view.send(frame: #"{"op":"dispatch","id":"lost","type":"todo/create","payload":{"title":"lost"},"settle":true}"#)
            let (before, settled) = try view.read(until: "settled lost") { $0.op == "settled" }
            let elapsed = ContinuousClock.now - started
            #expect(before.isEmpty, "nothing but the settlement was expected: \(before)")
            #expect(settled.string("id") == "lost")
            let result = try #require(settled.results["todos"])
            #expect(result["status"] as? String == "unavailable")
            #expect((result["error"] as? [String: Any])?["code"] as? String == "store-unavailable")
            #expect(elapsed >= .milliseconds(450), "gave up after \(elapsed), before the 500 ms queue timeout")
            #expect(elapsed < .seconds(10))

            // The retained snapshot is untouched and the queue is empty again.
            try view.send(frame: #"{"op":"get","id":"g","store":"todos"}"#)
            #expect(try view.expect("got").state(as: TodoList.self).todos.map(\.title) == ["a", "b"])
            try view.send(frame: #"{"op":"info","id":"i"}"#)
            let info = try view.expect("info")
            let todos = info.objects("stores").first { $0["name"] as? String == "todos" }
            #expect(todos?["status"] as? String == "down")
            #expect(todos?["queued"] as? Int == 0)
        }
    }

    @Test("stats-store waits for todos: while todo-store is down, stats gets the action once todos gave up (unavailable after 500 ms)")
    func waiterOfADownStoreGetsTheActionAfterTheTimeout() throws {
        try withBusBlocking(["--queue-timeout", "500"]) { bus in
            let todoStore = try bus.startBlocking("todo-store")
            try bus.startBlocking("stats-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            try view.subscribe("todos")
            try view.send(frame: #"{"op":"dispatch","id":"a","type":"todo/create","payload":{"title":"a"},"settle":true}"#)
            let first = try view.read(until: "settled a") { $0.op == "settled" }.match
            let todosVersion = try #require(first.results["todos"]?["version"] as? Int)
            #expect(first.results["stats"]?["status"] as? String == "done")

            try todoStore.crash()
            #expect(try view.expect("store-down").string("reason") == "disconnected")

            let started = ContinuousClock.now
            try view.send(frame: #"{"op":"dispatch","id":"b","type":"todo/create","payload":{"title":"b"},"settle":true}"#)
            let settled = try view.expect("settled")
            let elapsed = ContinuousClock.now - started
            #expect(settled.results["todos"]?["status"] as? String == "unavailable")
            #expect((settled.results["todos"]?["error"] as? [String: Any])?["code"] as? String == "store-unavailable")
            #expect(settled.results["stats"]?["status"] as? String == "done", "stats must get the action once todos' result is final")
            #expect(elapsed >= .milliseconds(450))

            try view.send(frame: #"{"op":"get","id":"g","store":"stats"}"#)
            let stats = try view.expect("got").state(as: TodoStats.self)
            #expect(stats.lastSeq == settled.int("seq"))
            #expect(stats.todosVersionSeen == todosVersion, "todos made no new version while down")
            #expect(stats.total == 1)
        }
    }

    @Test("fluxd shutting down settles pending actions as shutting-down, tells subscribers store-down shutdown, then says bye")
    func shutdownSettlesPendingActions() throws {
        try withBusBlocking(["--queue-timeout", "10000"]) { bus in
            let path = bus.socketPath
            let holder = try RawPeer.ready(path, role: "store", name: "holder")
            try holder.register("held", handles: ["held/*"], state: #"{"v":0}"#)
            let client = try RawPeer.ready(path, name: "client")
            try client.subscribe("held")
            var gone: RawPeer? = try RawPeer.ready(path, role: "store", name: "gone")
            try gone!.register("gone", handles: ["gone/*"])
            try client.subscribe("gone")
            gone = nil // hangs up: "gone" is down, its actions queue
            #expect(try client.expect("store-down").string("store") == "gone")
            try client.send(frame: #"{"op":"dispatch","id":"h1","type":"held/x","settle":true}"#)
            #expect(try holder.expect("action").int("seq") == 1) // delivered, never answered
            try client.send(frame: #"{"op":"dispatch","id":"g1","type":"gone/x","settle":true}"#)
            #expect(try client.barrier().isEmpty, "both actions are pending")

            bus.fluxd.send(signal: SIGTERM)
            let frames = try client.readUntilEOF(timeout: .seconds(20))
            let ops = frames.map { ($0["op"] as? String ?? "?") + "/" + ($0["id"] as? String ?? $0["store"] as? String ?? $0["reason"] as? String ?? "") }
            #expect(ops == ["settled/h1", "settled/g1", "store-down/held", "bye/shutdown"])
            for f in frames where f["op"] as? String == "settled" {
                let result = (f["results"] as? [[String: Any]])?.first
                #expect(result?["status"] as? String == "unavailable")
                #expect((result?["error"] as? [String: Any])?["code"] as? String == "shutting-down")
            }
            #expect(frames.first { $0["op"] as? String == "store-down" }?["reason"] as? String == "shutdown")
            #expect(bus.fluxd.waitForExit(timeout: .seconds(20)) == 0)
        }
    }

    @Test("5 actions dispatched while todo-store is down are applied exactly once, in order, after it restarts from the retained snapshot")
    func queuedActionsSurviveARestart() throws {
        try withBusBlocking(["--queue-timeout", "10000"]) { bus in
            let store = try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            try view.subscribe("todos")
            var beforeSeqs: [Int] = []
            for i in 1...3 {
                try view.send(frame: #"{"op":"dispatch","id":"b\#(i)","type":"todo/create","payload":{"title":"before-\#(i)"},"settle":true}"#)
                beforeSeqs.append(try view.read(until: "settled b\(i)") { $0.op == "settled" }.match.int("seq") ?? -1)
            }
            try view.send(frame: #"{"op":"get","id":"g","store":"todos"}"#)
            let versionAtKill = try #require(try view.expect("got").int("version"))

            try store.crash()
            #expect(try view.expect("store-down").string("reason") == "disconnected")

            var burst: [UInt8] = []
            for i in 1...5 {
                burst += encodeFrame(Array(#"{"op":"dispatch","id":"q\#(i)","type":"todo/create","payload":{"title":"queued-\#(i)"},"settle":true}"#.utf8))
            }
            try view.send(burst)
            // Barrier: fluxd accepted all five (info comes after them) and holds them in the down store's queue.
            try view.send(frame: #"{"op":"info","id":"i"}"#)
            let (early, info) = try view.read(until: "info") { $0.op == "info" }
            #expect(early.isEmpty, "nothing may settle while the store is down: \(early)")
            let entry = info.objects("stores").first { $0["name"] as? String == "todos" }
            #expect(entry?["status"] as? String == "down")
            #expect(entry?["queued"] as? Int == 5)

            try bus.startBlocking("todo-store")
            // The view hears store-up (at the retained version), then one snapshot and one settlement per action.
            var frames: [Message] = []
            var settled: [Message] = []
            while settled.count < 5 {
                let m = try view.message()
                frames.append(m)
                if m.op == "settled" { settled.append(m) }
            }
            let up = try #require(frames.first)
            #expect(up.op == "store-up", "store-up must come first: \(frames.map { $0.op ?? "?" })")
            #expect(up.int("version") == versionAtKill)
            let snapshotVersions = frames.filter { $0.op == "snapshot" }.compactMap { $0.int("version") }
            #expect(snapshotVersions == Array((versionAtKill + 1)...(versionAtKill + 5)))
            #expect(settled.map { $0.string("id") } == ["q1", "q2", "q3", "q4", "q5"])
            var queuedSeqs: [Int] = []
            for s in settled {
                let r = s.results["todos"]
                #expect(r?["status"] as? String == "done", "\(s)")
                queuedSeqs.append(s.int("seq") ?? -1)
            }
            #expect(zip(queuedSeqs, queuedSeqs.dropFirst()).allSatisfy { $0 < $1 })

            try view.send(frame: #"{"op":"get","id":"g2","store":"todos"}"#)
            let got = try view.expect("got")
            #expect(got.int("version") == versionAtKill + 5)
            let todos = try got.state(as: TodoList.self).todos
            #expect(todos.map(\.title) == ["before-1", "before-2", "before-3", "queued-1", "queued-2", "queued-3", "queued-4", "queued-5"],
                    "the restarted store must resume from the retained todos and apply the queue exactly once, in order")
            #expect(todos.map(\.createdSeq) == beforeSeqs + queuedSeqs)
            #expect(Set(todos.map(\.id)).count == todos.count, "ids continue from the retained nextID")
            // Nothing more comes: no duplicate application, no second settlement.
            #expect(try view.barrier().isEmpty)
        }
    }

    @Test("a restarted todo-store resumes from the retained snapshot when nothing was queued: same bytes, same version, no new snapshot")
    func restartWithNothingQueued() throws {
        try withBusBlocking { bus in
            let store = try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            try view.subscribe("todos")
            for (i, title) in ["keep", "these"].enumerated() {
                try view.send(frame: #"{"op":"dispatch","id":"c\#(i)","type":"todo/create","payload":{"title":"\#(title)"},"settle":true}"#)
                _ = try view.read(until: "settled c\(i)") { $0.op == "settled" }
            }
            try view.send(frame: #"{"op":"dispatch","id":"t","type":"todo/toggle","payload":{"id":2},"settle":true}"#)
            _ = try view.read(until: "settled t") { $0.op == "settled" }
            try view.send(frame: #"{"op":"get","id":"same","store":"todos"}"#)
            let before = try view.expect("got")

            let admin = try RawPeer.ready(bus.socketPath, role: "monitor", name: "admin")
            #expect(try ownerPID(admin) == store.pid, "info names the owning process (SO_PEERCRED)")

            try store.crash()
            #expect(try view.expect("store-down").string("reason") == "disconnected")
            // While it is down, a new subscriber still gets the retained snapshot, with status down.
            let late = try RawPeer.ready(bus.socketPath, name: "late")
            let whileDown = try late.subscribe("todos")
            #expect(whileDown.first?.string("status") == "down")
            #expect(whileDown.last?.int("version") == before.int("version"))
            #expect(whileDown.last?["state"] as? NSDictionary == before["state"] as? NSDictionary)

            let restarted = try bus.startBlocking("todo-store")
            #expect(try ownerPID(admin) == restarted.pid)
            #expect(try late.barrier().map { $0.op } == ["store-up"])
            // The restarted store printed its ready line after adopting the snapshot; everything fluxd sent the view
            // because of the restart came before this barrier's pong.
            let restartFrames = try view.barrier()
            #expect(restartFrames.map { $0.op } == ["store-up"], "expected only store-up, got \(restartFrames)")
            #expect(restartFrames.first?.int("version") == before.int("version"))

            try view.send(frame: #"{"op":"get","id":"same","store":"todos"}"#)
            let after = try view.expect("got")
            #expect(after.body == before.body, "retained snapshot changed across the restart:\n\(before)\n\(after)")

            // The restarted store works on that state: toggling todo 2 back makes exactly the next version.
            try view.send(frame: #"{"op":"dispatch","id":"t2","type":"todo/toggle","payload":{"id":2},"settle":true}"#)
            let (snaps, settled) = try view.read(until: "settled t2") { $0.op == "settled" }
            #expect(snaps.compactMap { $0.int("version") } == [(before.int("version") ?? 0) + 1])
            #expect(try snaps.last?.state(as: TodoList.self).todos.map(\.done) == [false, false])
            #expect(settled.results["todos"]?["status"] as? String == "done")
        }
    }

    @Test("wire: an action delivered to a store that dies unanswered is redelivered (marked) to the next owner and settles once")
    func inFlightActionIsRedelivered() throws {
        try withBusBlocking(["--queue-timeout", "10000"]) { bus in
            let client = try RawPeer.ready(bus.socketPath, name: "client")
            try client.subscribe("flaky")
            do {
                let first = try RawPeer.ready(bus.socketPath, role: "store", name: "first")
                try first.register("flaky", handles: ["flaky/*"], state: #"{"n":0}"#)
                #expect(try client.read(until: "store-up") { $0.op == "store-up" }.before.isEmpty)
                #expect(try client.expect("snapshot").int("version") == 1)
                try client.send(frame: #"{"op":"dispatch","id":"x","type":"flaky/go","settle":true}"#)
                let action = try first.expect("action")
                #expect(action["redelivered"] == nil)
            } // the first owner closes without answering
            #expect(try client.read(until: "store-down") { $0.op == "store-down" }.before.isEmpty)

            let second = try RawPeer.ready(bus.socketPath, role: "store", name: "second")
            let registration = try second.register("flaky", handles: ["flaky/*"], state: #"{"n":999}"#)
            #expect(registration.first?.bool("resumed") == true)
            #expect(registration.contains { $0.op == "snapshot" && ($0["state"] as? [String: Any])?["n"] as? Int == 0 },
                    "the retained state wins over the new initial state")
            let again = try second.expect("action")
            #expect(again.int("seq") == 1)
            #expect(again.bool("redelivered") == true)
            try second.send(frame: #"{"op":"done","store":"flaky","seq":1,"state":{"n":1}}"#)
            let (before, settled) = try client.read(until: "settled x") { $0.op == "settled" }
            #expect(before.map { $0.op } == ["store-up", "snapshot"])
            #expect(settled.results["flaky"]?["status"] as? String == "done")
            #expect(try client.barrier().isEmpty, "settled exactly once")
            #expect(try second.barrier().isEmpty, "delivered exactly once more")
        }
    }

    @Test("todo-store stopped with SIGTERM unregisters: subscribers get store-down reason unregistered")
    func gracefulStopUnregisters() throws {
        try withBusBlocking { bus in
            let store = try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            try view.subscribe("todos")
            store.send(signal: SIGTERM)
            let down = try view.expect("store-down")
            #expect(down.string("reason") == "unregistered")
            #expect(store.waitForExit(timeout: .seconds(20)) == 0)
        }
    }

    /// The pid of the process owning `todos`, from `info`.
    private func ownerPID(_ peer: RawPeer) throws -> Int32? {
        try peer.send(frame: #"{"op":"info","id":"owner"}"#)
        let info = try peer.read(until: "info") { $0.op == "info" }.match
        let todos = info.objects("stores").first { $0["name"] as? String == "todos" }
        return ((todos?["owner"] as? [String: Any])?["pid"] as? Int).map { Int32($0) }
    }
}
