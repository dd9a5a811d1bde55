import FluxClient
import FluxCore
import Foundation
import Testing

/// R4 snapshots: versioned per store and retained; a new subscriber gets the latest at once, then every newer one,
/// never an older or the same one again; a state that did not change is not a new version and is not sent.
@Suite("R4 snapshots")
struct SnapshotTests {
    @Test("a late subscriber gets subscribed, then the retained snapshot at once (before the pong of a ping sent with it)", .onDedicatedThreads)
    func retainedSnapshotOnSubscribe() throws {
        try withBusBlocking { bus in
            try bus.startBlocking("todo-store")
            let writer = try RawPeer.ready(bus.socketPath, name: "writer")
            var lastSeq = 0
            var lastVersion = 0
            for title in ["a", "b", "c"] {
                try writer.send(frame: #"{"op":"dispatch","id":"\#(title)","type":"todo/create","payload":{"title":"\#(title)"},"settle":true}"#)
                let settled = try writer.expect("settled")
                lastSeq = settled.int("seq") ?? -1
                lastVersion = settled.results["todos"]?["version"] as? Int ?? -1
            }
            #expect(lastVersion == 4)

            let late = try RawPeer.ready(bus.socketPath, name: "late")
            try late.send(encodeFrame(Array(#"{"op":"subscribe","store":"todos"}"#.utf8))
                          + encodeFrame(Array(#"{"op":"ping","id":"p"}"#.utf8)))
            let subscribed = try late.expect("subscribed")
            #expect(subscribed.string("store") == "todos")
            #expect(subscribed.string("status") == "up")
            #expect(subscribed.int("version") == lastVersion)
            let snapshot = try late.expect("snapshot")
            #expect(snapshot.int("version") == lastVersion)
            #expect(snapshot.int("seq") == lastSeq)
            #expect(try snapshot.state(as: TodoList.self).todos.map(\.title) == ["a", "b", "c"])
            #expect(try late.expect("pong").string("id") == "p")

            // A store nobody registered: subscribed (unknown), no snapshot.
            try late.send(encodeFrame(Array(#"{"op":"subscribe","store":"nobody"}"#.utf8))
                          + encodeFrame(Array(#"{"op":"ping","id":"q"}"#.utf8)))
            let unknown = try late.expect("subscribed")
            #expect(unknown.string("status") == "unknown")
            #expect(unknown.int("version") == 0, "SPEC §8.5: subscribed always carries version (0 = none)")
            #expect(try late.expect("pong").string("id") == "q")
        }
    }

    @Test("FluxClient: a new subscriber's first events are .subscribed(.up) and the current snapshot")
    func retainedSnapshotThroughTheClient() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            let writer = try await bus.connect("writer")
            var version = 0
            for title in ["x", "y"] {
                let s = try await withDeadline(.seconds(20), "create \(title)") {
                    try await writer.dispatchAndSettle(type: "todo/create", payload: Title(title: title))
                }
                if case .done(let v) = s["todos"] { version = v }
            }
            let reader = try await bus.connect("reader")
            let events = EventLog(reader.subscribe(store: "todos", as: TodoList.self))
            defer { events.cancel() }
            let seen = try await events.wait("subscribed + snapshot") { $0.count >= 2 }
            guard case .subscribed(.up) = seen[0] else {
                Issue.record("first event is not .subscribed(.up): \(seen[0])")
                return
            }
            let snapshot = try #require(seen[1].snapshot)
            #expect(snapshot.version == version)
            #expect(snapshot.state.todos.map(\.title) == ["x", "y"])
        }
    }

    @Test("a subscriber across 100 concurrent dispatches sees strictly increasing versions, no duplicate", .onDedicatedThreads)
    func noStaleNoDuplicate() throws {
        try withBusBlocking { bus in
            try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            let initial = try view.subscribe("todos")
            var versions: [Int] = [try #require(initial.last?.int("version"))]
            #expect(versions == [1])

            // Two writers, 50 creates each, pipelined on their own connections.
            let w1 = try RawPeer.ready(bus.socketPath, name: "w1")
            let w2 = try RawPeer.ready(bus.socketPath, name: "w2")
            var b1: [UInt8] = [], b2: [UInt8] = []
            for i in 0..<50 {
                b1 += encodeFrame(Array(#"{"op":"dispatch","type":"todo/create","payload":{"title":"w1-\#(i)"}}"#.utf8))
                b2 += encodeFrame(Array(#"{"op":"dispatch","type":"todo/create","payload":{"title":"w2-\#(i)"}}"#.utf8))
            }
            try w1.send(b1)
            try w2.send(b2)
            var lastState: TodoList?
            while lastState?.todos.count != 100 {
                let m = try view.message()
                #expect(m.op == "snapshot", "unexpected \(m)")
                guard m.op == "snapshot" else { continue }
                let v = try #require(m.int("version"))
                #expect(v > versions.last!, "version \(v) after \(versions.last!): stale or duplicate")
                versions.append(v)
                lastState = try m.state(as: TodoList.self)
            }
            #expect(versions.last == 101, "100 creates on top of the initial version 1")
            #expect(Set(versions).count == versions.count)
        }
    }

    @Test("no-ops make no snapshot and keep the version; the next real change makes exactly one snapshot, the next version, which get returns", .onDedicatedThreads)
    func noopsMakeNoSnapshot() throws {
        try withBusBlocking { bus in
            try bus.startBlocking("todo-store")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            #expect(try view.subscribe("todos").last?.int("version") == 1)
            try view.send(frame: #"{"op":"dispatch","id":"c","type":"todo/create","payload":{"title":"first"},"settle":true}"#)
            let (created, _) = try view.read(until: "settled c") { $0.op == "settled" }
            #expect(created.map { $0.op } == ["snapshot"])
            #expect(created.first?.int("version") == 2)

            // Real no-ops: clearing done todos when none is done, renaming to the same title, a rejected toggle.
            // R5 would put any snapshot they made before their settlement, so the frames before each `settled`
            // show whether one was sent.
            let noops = [
                #"{"op":"dispatch","id":"n1","type":"todo/clear-done","settle":true}"#,
                #"{"op":"dispatch","id":"n2","type":"todo/edit","payload":{"id":1,"title":"first"},"settle":true}"#,
                #"{"op":"dispatch","id":"n3","type":"todo/toggle","payload":{"id":999},"settle":true}"#,
            ]
            for (n, frame) in noops.enumerated() {
                try view.send(frame: frame)
                let (before, settled) = try view.read(until: "settled n\(n + 1)") { $0.op == "settled" }
                #expect(before.isEmpty, "no-op n\(n + 1) produced \(before)")
                let todos = try #require(settled.results["todos"])
                if n < 2 {
                    #expect(todos["status"] as? String == "done")
                    #expect(todos["version"] as? Int == 2, "a no-op leaves the version where it was")
                } else {
                    #expect(todos["status"] as? String == "rejected")
                }
            }
            // A real change right after: exactly one snapshot, the very next version.
            try view.send(frame: #"{"op":"dispatch","id":"t","type":"todo/toggle","payload":{"id":1},"settle":true}"#)
            let (before, settled) = try view.read(until: "settled t") { $0.op == "settled" }
            #expect(before.map { $0.op } == ["snapshot"])
            #expect(before.first?.int("version") == 3)
            #expect(settled.results["todos"]?["version"] as? Int == 3)
            // And the retained snapshot is that one (get agrees).
            try view.send(frame: #"{"op":"get","id":"g","store":"todos"}"#)
            let got = try view.expect("got")
            #expect(got.int("version") == 3)
            #expect(try got.state(as: TodoList.self).todos.first?.done == true)
        }
    }

    @Test("wire: a store answering or publishing a byte-identical state makes no new version and no snapshot; a changed one does", .onDedicatedThreads)
    func identicalStateIsNotANewVersion() throws {
        try withBusBlocking { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "store")
            try store.register("same", handles: ["same/*"], state: #"{"a":1,"b":[true,null]}"#)
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            #expect(try view.subscribe("same").last?.int("version") == 1)

            func roundTrip(_ id: String, answer: String) throws -> (before: [Message], settled: Message) {
                try view.send(frame: #"{"op":"dispatch","id":"\#(id)","type":"same/x","settle":true}"#)
                let seq = try #require(try store.expect("action").int("seq"))
                try store.send(frame: #"{"op":"done","store":"same","seq":\#(seq)\#(answer)}"#)
                let (before, settled) = try view.read(until: "settled \(id)") { $0.op == "settled" }
                return (before, settled)
            }
            // Same bytes: no new version, nothing sent to the subscriber; the settlement names the current version.
            let same = try roundTrip("s1", answer: #","state":{"a":1,"b":[true,null]}"#)
            #expect(same.before.isEmpty, "\(same.before)")
            #expect(same.settled.results["same"]?["version"] as? Int == 1)
            // No state at all: unchanged too.
            let none = try roundTrip("s2", answer: "")
            #expect(none.before.isEmpty)
            #expect(none.settled.results["same"]?["version"] as? Int == 1)
            // An unsolicited identical state: nothing either (the barrier shows it).
            try store.send(frame: #"{"op":"state","store":"same","state":{"a":1,"b":[true,null]}}"#)
            #expect(try store.barrier().isEmpty)
            #expect(try view.barrier().isEmpty)
            // Equal JSON but different bytes is a new version (fluxd compares bytes, it does not parse states).
            let spaced = try roundTrip("s3", answer: #","state":{"a":1, "b":[true,null]}"#)
            #expect(spaced.before.map { $0.int("version") } == [2])
            #expect(spaced.before.first?.text.hasSuffix(#""state":{"a":1, "b":[true,null]}}"#) == true, "state forwarded byte for byte")
            #expect(spaced.settled.results["same"]?["version"] as? Int == 2)
            // An unsolicited new state is the next version, with the seq of the last answered action.
            try store.send(frame: #"{"op":"state","store":"same","state":{"a":2}}"#)
            let pushed = try view.expect("snapshot")
            #expect(pushed.int("version") == 3)
            #expect(pushed.int("seq") == spaced.settled.int("seq"))
        }
    }

    @Test("a subscriber that does not read while 300 large snapshots are made still gets increasing versions, ending at the newest", .onDedicatedThreads)
    func slowSubscriberGetsTheNewest() throws {
        try withBusBlocking { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "store")
            try store.register("big", handles: ["big/*"], state: #"{"n":0}"#)
            let slow = try RawPeer.ready(bus.socketPath, name: "slow")
            #expect(try slow.subscribe("big").last?.int("version") == 1)
            let client = try RawPeer.ready(bus.socketPath, name: "client")
            var burst: [UInt8] = []
            for _ in 0..<300 { burst += encodeFrame(Array(#"{"op":"dispatch","type":"big/x"}"#.utf8)) }
            try client.send(burst)
            let pad = String(repeating: "x", count: 16_000)
            for n in 1...300 {
                let seq = try #require(try store.expect("action").int("seq"))
                try store.send(frame: #"{"op":"done","store":"big","seq":\#(seq),"state":{"n":\#(n),"pad":"\#(pad)"}}"#)
            }
            // About 5 MB of snapshots were produced while `slow` read nothing. Now it reads.
            var versions: [Int] = [1]
            var lastN = 0
            while lastN < 300 {
                let m = try slow.expect("snapshot")
                let v = try #require(m.int("version"))
                #expect(v > versions.last!, "version \(v) after \(versions.last!)")
                versions.append(v)
                lastN = (m["state"] as? [String: Any])?["n"] as? Int ?? -1
                #expect(lastN == v - 1, "the state must be the one of its version")
            }
            #expect(versions.last == 301)
            #expect(try slow.barrier().isEmpty)
        }
    }
}
