import FluxClient
import FluxCore
import Foundation
import Testing

/// R3 waitFor: a store that waits for another receives an action they both handle only after the other answered it,
/// and (when it follows that store) after the snapshot that answer produced.
@Suite("R3 waitFor")
struct WaitForTests {
    @Test("todo-store + stats-store: every settlement has both results, and stats counted the todos version of the same settlement")
    func statsCountsTheSettledTodosVersion() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            _ = try await bus.start("stats-store")
            let client = try await bus.connect("view")

            let steps: [(String, any Encodable & Sendable)] = [
                ("todo/create", Title(title: "milk")),
                ("todo/create", Title(title: "eggs")),
                ("todo/create", Title(title: "bread")),
                ("todo/toggle", TodoID(id: 1)),
                ("todo/toggle", TodoID(id: 3)),
                ("todo/edit", EditPayload(id: 2, title: "more eggs")),
                ("todo/delete", TodoID(id: 2)),
                ("todo/clear-done", Optional<Int>.none),
                ("todo/create", Title(title: "jam")),
            ]
            for (type, payload) in steps {
                let settlement = try await withDeadline(.seconds(20), "settle \(type)") {
                    try await client.dispatchAndSettle(type: type, payloadJSON: FluxJSON.encode(payload))
                }
                #expect(settlement.results.map(\.store) == ["stats", "todos"], "\(type): \(settlement)")
                guard case .done(let todosVersion) = settlement["todos"], case .done(let statsVersion) = settlement["stats"] else {
                    Issue.record("\(type) did not settle done in both stores: \(settlement)")
                    continue
                }
                let stats = try await client.get(store: "stats", as: TodoStats.self)
                let todos = try await client.get(store: "todos", as: TodoList.self)
                #expect(stats.version == statsVersion, "\(type): one action, one stats version")
                #expect(todos.version == todosVersion)
                #expect(stats.state.lastSeq == settlement.seq, "\(type): stats handled this very action")
                #expect(stats.state.todosVersionSeen == todosVersion,
                        "\(type): stats computed from todos v\(stats.state.todosVersionSeen), but todos answered at v\(todosVersion)")
                #expect(stats.state.total == todos.state.todos.count)
                #expect(stats.state.done == todos.state.todos.filter(\.done).count)
                #expect(stats.state.open == todos.state.todos.filter { !$0.done }.count)
            }
            let final = try await client.get(store: "todos", as: TodoList.self)
            #expect(final.state.todos.map(\.title) == ["jam"])
        }
    }

    @Test("wire: the waiting store gets the action only after the other answered, after that answer's snapshot, one action at a time", .onDedicatedThreads)
    func waitingStoreIsHeldBack() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            let first = try RawPeer.ready(path, role: "store", name: "first")
            try first.register("wf-a", handles: ["wf/*"], state: #"{"n":0}"#)
            let second = try RawPeer.ready(path, role: "store", name: "second")
            try second.register("wf-b", handles: ["wf/*"], waitFor: ["wf-a"], state: #"{"seen":0}"#)
            try second.subscribe("wf-a")
            let client = try RawPeer.ready(path, name: "client")

            // Three actions, pipelined: wf-a may get all three (its window), wf-b none of them yet.
            try client.send(
                encodeFrame(Array(#"{"op":"dispatch","id":"a1","type":"wf/x","settle":true}"#.utf8))
                    + encodeFrame(Array(#"{"op":"dispatch","id":"a2","type":"wf/x","settle":true}"#.utf8))
                    + encodeFrame(Array(#"{"op":"dispatch","id":"a3","type":"wf/x","settle":true}"#.utf8)))
            var toFirst: [Int] = []
            for _ in 0..<3 { toFirst.append(try first.expect("action").int("seq") ?? -1) }
            #expect(toFirst == [1, 2, 3])
            // fluxd has handled all three dispatches (wf-a got them); the ping barrier shows wf-b got nothing.
            #expect(try second.barrier("held").isEmpty, "wf-b received something before wf-a answered")

            for seq in 1...3 {
                try first.send(frame: #"{"op":"done","store":"wf-a","seq":\#(seq),"state":{"n":\#(seq)}}"#)
                // wf-b, subscribed to wf-a: first the snapshot that answer made, then the action.
                let snapshot = try second.expect("snapshot")
                #expect(snapshot.string("store") == "wf-a")
                #expect(snapshot.int("seq") == seq)
                #expect((snapshot["state"] as? [String: Any])?["n"] as? Int == seq)
                let action = try second.expect("action")
                #expect(action.int("seq") == seq)
                // The next action is still held back: wf-a has not answered it.
                #expect(try second.barrier("after-\(seq)").isEmpty, "wf-b got more than action \(seq) before wf-a answered the next")
                try second.send(frame: #"{"op":"done","store":"wf-b","seq":\#(seq),"state":{"seen":\#(seq)}}"#)
                let settled = try client.expect("settled")
                #expect(settled.string("id") == "a\(seq)")
                #expect(settled.objects("results").map { $0["store"] as? String } == ["wf-a", "wf-b"])
                #expect(settled.objects("results").allSatisfy { $0["status"] as? String == "done" })
            }
        }
    }

    @Test("wire: a waiting store is released by a reject too, and the dispatcher sees both results", .onDedicatedThreads)
    func rejectReleasesTheWaiter() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            let first = try RawPeer.ready(path, role: "store", name: "first")
            try first.register("wf-a", handles: ["wf/*"])
            let second = try RawPeer.ready(path, role: "store", name: "second")
            try second.register("wf-b", handles: ["wf/*"], waitFor: ["wf-a"])
            let client = try RawPeer.ready(path, name: "client")
            try client.send(frame: #"{"op":"dispatch","id":"r1","type":"wf/x","settle":true}"#)
            let action = try first.expect("action")
            #expect(try second.barrier().isEmpty)
            try first.send(frame: #"{"op":"reject","store":"wf-a","seq":\#(action.int("seq")!),"error":{"code":"wf/nope","message":"no","extra":[1,2]}}"#)
            let held = try second.expect("action")
            #expect(held.int("seq") == action.int("seq"))
            try second.send(frame: #"{"op":"done","store":"wf-b","seq":\#(action.int("seq")!)}"#)
            let settled = try client.expect("settled")
            let results = settled.results
            #expect(results["wf-a"]?["status"] as? String == "rejected")
            // The store's error object is forwarded byte for byte, unknown members included.
            #expect(settled.text.contains(#""error":{"code":"wf/nope","message":"no","extra":[1,2]}"#))
            #expect(results["wf-b"]?["status"] as? String == "done")
        }
    }
}

struct EditPayload: Codable, Sendable {
    var id: Int
    var title: String
}
