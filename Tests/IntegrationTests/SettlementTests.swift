import FluxClient
import FluxCore
import Foundation
import Testing

/// The answer reaches the dispatcher (guarantee 2, R6): a store's rejection comes back in the settlement with the
/// store's own code, and an action nobody handles is refused with `no-handler` instead of vanishing.
@Suite("settlements and refusals reach the dispatcher")
struct SettlementTests {
    @Test("todo/toggle of a missing id settles with todos rejected todo/not-found, stats done, and no new todos version")
    func rejectionReachesTheDispatcher() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            _ = try await bus.start("stats-store")
            let client = try await bus.connect("view")
            let created = try await withDeadline(.seconds(20), "create") {
                try await client.dispatchAndSettle(type: "todo/create", payload: Title(title: "milk"))
            }
            #expect(created.allDone)
            let before = try await client.get(store: "todos", as: TodoList.self)

            let toggle = try await withDeadline(.seconds(20), "toggle 999") {
                try await client.dispatchAndSettle(type: "todo/toggle", payload: TodoID(id: 999))
            }
            #expect(toggle.results.map(\.store) == ["stats", "todos"])
            guard case .rejected(let code, let message) = toggle["todos"] else {
                Issue.record("todos did not reject: \(toggle)")
                return
            }
            #expect(code == "todo/not-found")
            #expect(message.contains("999"))
            guard case .done = toggle["stats"] else {
                Issue.record("stats has no done result: \(toggle)")
                return
            }
            let after = try await client.get(store: "todos", as: TodoList.self)
            #expect(after.version == before.version, "a rejected action must not make a new version")
            #expect(after.state == before.state)

            let blank = try await withDeadline(.seconds(20), "create blank") {
                try await client.dispatchAndSettle(type: "todo/create", payload: Title(title: "   "))
            }
            guard case .rejected(let blankCode, _) = blank["todos"] else {
                Issue.record("a blank title was not rejected: \(blank)")
                return
            }
            #expect(blankCode == "todo/empty-title")
            #expect(try await client.get(store: "todos", as: TodoList.self).version == before.version)
        }
    }

    @Test("wire: no-handler with ref = the dispatch id, settle or not; no seq is used; nothing else is sent", .onDedicatedThreads)
    func noHandlerOnTheWire() throws {
        try withBusBlocking { bus in
            let store = try RawPeer.ready(bus.socketPath, role: "store", name: "store")
            try store.register("counted", handles: ["seq/*"])
            let client = try RawPeer.ready(bus.socketPath, name: "client")

            try client.send(frame: #"{"op":"dispatch","id":"one","type":"seq/a","settle":true}"#)
            let action1 = try store.expect("action")
            try store.send(frame: #"{"op":"done","store":"counted","seq":\#(action1.int("seq")!)}"#)
            let settled1 = try client.expect("settled")

            try client.send(frame: #"{"op":"dispatch","id":"nh-settle","type":"nobody/handles","settle":true}"#)
            let e1 = try client.expect("error")
            #expect(e1.string("code") == "no-handler")
            #expect(e1.string("ref") == "nh-settle")
            #expect(e1.bool("fatal") == false)
            try client.send(frame: #"{"op":"dispatch","id":"nh-fire","type":"nobody/handles","payload":{"x":1}}"#)
            let e2 = try client.expect("error")
            #expect(e2.string("code") == "no-handler")
            #expect(e2.string("ref") == "nh-fire")
            try client.send(frame: #"{"op":"dispatch","type":"nobody/handles"}"#)
            let e3 = try client.expect("error")
            #expect(e3.string("code") == "no-handler")
            #expect(e3.string("ref") == nil)
            // No settlement follows a refusal, and the store saw none of them.
            #expect(try client.barrier().isEmpty)
            #expect(try store.barrier().isEmpty)

            try client.send(frame: #"{"op":"dispatch","id":"two","type":"seq/b","settle":true}"#)
            let action2 = try store.expect("action")
            try store.send(frame: #"{"op":"done","store":"counted","seq":\#(action2.int("seq")!)}"#)
            let settled2 = try client.expect("settled")
            #expect(settled2.int("seq") == (settled1.int("seq") ?? 0) + 1, "a refused dispatch must not use a seq")
            #expect(action2.int("seq") == settled2.int("seq"))
        }
    }

    @Test("FluxClient: dispatchAndSettle throws no-handler; a fire-and-forget dispatch's no-handler arrives on errors with its id")
    func noHandlerThroughTheClient() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            let client = try await bus.connect("view")
            let errors = EventLog(client.errors)
            defer { errors.cancel() }
            let seqBefore = try await client.info().seq

            do {
                _ = try await withDeadline(.seconds(20), "settle nobody/handles") {
                    try await client.dispatchAndSettle(type: "nobody/handles")
                }
                Issue.record("dispatchAndSettle of an unhandled type did not throw")
            } catch let error as FluxError {
                #expect(error.code == .noHandler)
                if case .server(let server) = error { #expect(server.ref != nil && server.fatal == false) }
            }

            let id = try client.dispatch(type: "nobody/handles")
            let seen = try await errors.wait("no-handler for \(id) on errors") { items in
                items.contains { if case .server(let e) = $0 { e.ref == id } else { false } }
            }
            let error = seen.first { if case .server(let e) = $0 { e.ref == id } else { false } }
            #expect(error?.code == .noHandler)
            #expect(try await client.info().seq == seqBefore, "refused dispatches use no seq")
            // The connection is still fine for handled actions.
            let ok = try await withDeadline(.seconds(20), "create") {
                try await client.dispatchAndSettle(type: "todo/create", payload: Title(title: "after"))
            }
            #expect(ok.allDone)
            #expect(ok.seq == (seqBefore ?? 0) + 1)
        }
    }
}
