import FluxClient
import FluxCore
import Foundation
import Testing

/// R5: when a dispatch settles, every subscription the dispatcher holds on a store that answered `done` at version V
/// has already been sent a snapshot at V or newer — even while another client is writing to the same store.
@Suite("R5 read your writes")
struct ReadYourWritesTests {
    @Test("wire: the snapshot at or past the settled version (holding our write) arrives before settled, under concurrent writes", .onDedicatedThreads)
    func snapshotBeforeSettled() throws {
        try withBusBlocking { bus in
            try bus.startBlocking("todo-store")
            let noise = try RawPeer.ready(bus.socketPath, name: "noise")
            let view = try RawPeer.ready(bus.socketPath, name: "view")
            let initial = try view.subscribe("todos")
            var latest = try #require(initial.last?.int("version"))
            var latestState = try initial.last!.state(as: TodoList.self)

            // Another client keeps the store busy while we write.
            var burst: [UInt8] = []
            for i in 0..<100 {
                burst += encodeFrame(Array(#"{"op":"dispatch","type":"todo/create","payload":{"title":"noise-\#(i)"}}"#.utf8))
            }
            try noise.send(burst)

            for n in 0..<20 {
                try view.send(frame: #"{"op":"dispatch","id":"ryw-\#(n)","type":"todo/create","payload":{"title":"ryw-\#(n)"},"settle":true}"#)
                let (before, settled) = try view.read(until: "settled ryw-\(n)") { $0.op == "settled" }
                #expect(settled.string("id") == "ryw-\(n)")
                for m in before {
                    #expect(m.op == "snapshot", "unexpected \(m)")
                    let v = try #require(m.int("version"))
                    #expect(v > latest, "snapshot versions must increase: \(v) after \(latest)")
                    latest = v
                    latestState = try m.state(as: TodoList.self)
                }
                let result = try #require(settled.results["todos"])
                #expect(result["status"] as? String == "done")
                let version = try #require(result["version"] as? Int)
                #expect(latest >= version, "settled at version \(version) but the newest snapshot sent before it is \(latest)")
                #expect(latestState.todos.contains { $0.title == "ryw-\(n)" }, "our write is not in the snapshot sent before settled")
            }
        }
    }

    @Test("FluxClient: when dispatchAndSettle returns, a subscription already has the snapshot with that version buffered")
    func settledSubscriptionIsCurrent() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            let client = try await bus.connect("view")
            let noise = try await bus.connect("noise")
            // A long-lived subscription keeps the wire subscription in place across the probes below.
            let main = EventLog(client.subscribe(store: "todos", as: TodoList.self))
            defer { main.cancel() }
            try await main.wait("first todos snapshot") { $0.contains { $0.snapshot != nil } }

            let writer = Task {
                for i in 0..<100 { try noise.dispatch(type: "todo/create", payload: Title(title: "noise-\(i)")) }
            }
            defer { writer.cancel() }

            for n in 0..<10 {
                let probe = client.subscribe(store: "todos", as: TodoList.self)
                let title = "ryw-\(n)"
                let settlement = try await withDeadline(.seconds(20), "settle \(title)") {
                    try await client.dispatchAndSettle(type: "todo/create", payload: Title(title: title))
                }
                // End the probe at once: it yields what it had buffered by now, then finishes.
                probe.cancel()
                let events = try await withDeadline(.seconds(20), "drain the probe") {
                    var out: [StoreEvent<TodoList>] = []
                    for try await event in probe { out.append(event) }
                    return out
                }
                guard case .done(let version) = settlement["todos"] else {
                    Issue.record("\(title) did not settle done: \(settlement)")
                    continue
                }
                let snapshots = events.compactMap(\.snapshot)
                #expect(snapshots.contains { $0.version >= version && $0.state.todos.contains { $0.title == title } },
                        "no snapshot at or past version \(version) with \(title) was buffered when the settlement returned; got versions \(snapshots.map(\.version))")
            }
            try await writer.value
        }
    }
}
