import FluxClient
import Foundation
import Testing

// SPEC §16.4 path subscriptions with real processes: fluxd, the todo example's todo-store (which publishes its
// changes as patches), FluxClient and fluxctl.

@Suite("path subscriptions (real fluxd, todo-store)", .timeLimit(.minutes(2)))
struct PathSubscriptionTests {
    /// Every change as a patch, however small the state (FluxStore sends states up to 1 KiB whole by default).
    static let patchesAlways = ["FLUXBUS_WHOLE_STATE_LIMIT": "0"]

    /// Dispatches and returns the version of `todos` the action made.
    private func todos(_ client: FluxClient, _ type: String, _ payload: some Encodable & Sendable) async throws -> Int {
        let settled = try await withDeadline(.seconds(20), type) {
            try await client.dispatchAndSettle(type: type, payload: payload).requireDone()
        }
        guard case .done(let version)? = settled["todos"] else { throw HarnessError.unexpectedOutput("\(settled)") }
        return version
    }

    @Test("a path subscriber through FluxClient is not woken by a change elsewhere, and is by an index shift; the whole-store subscription on the same connection goes on beside them")
    func notWokenElsewhere() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store", environment: Self.patchesAlways)
            // One connection dispatches and subscribes: when a dispatch settles, every value it touched is here
            // already (R5, SPEC §16.4), so "nothing waits" right after a settlement means nothing was sent.
            let client = try await bus.connect("view")
            for title in ["a", "b", "c"] { _ = try await todos(client, "todo/create", Title(title: title)) }
            let second = try client.subscribe(store: "todos", path: "/todos/1", as: TodoItem.self)
            let fourth = try client.subscribe(store: "todos", path: "/todos/3", as: TodoItem.self)
            let whole = EventLog(client.subscribe(store: "todos", as: TodoList.self).snapshots.map(\.version))
            defer { whole.cancel() }
            let first = try await second.nextValue(timeout: .seconds(20))
            #expect(first.version == 4 && first.exists && first.value?.title == "b", "\(first)")
            let none = try await fourth.nextValue(timeout: .seconds(20))
            #expect(none.version == 4 && !none.exists && none.value == nil, "\(none)")

            // Changes elsewhere: toggling todos #1 (/todos/0) and #3 (/todos/2), renaming #3.
            var elsewhere: [Int] = []
            elsewhere.append(try await todos(client, "todo/toggle", TodoID(id: 1)))
            elsewhere.append(try await todos(client, "todo/toggle", TodoID(id: 3)))
            elsewhere.append(try await todos(client, "todo/edit", EditTitle(id: 3, title: "C")))
            try await expectNothing(second, "/todos/1 after versions \(elsewhere)")
            try await expectNothing(fourth, "/todos/3 after versions \(elsewhere)")

            // Appending touches /todos/3 (it now exists) and not /todos/1.
            let appended = try await todos(client, "todo/create", Title(title: "d"))
            let d = try await fourth.nextValue(timeout: .seconds(20))
            #expect(d.version == appended && d.value?.title == "d", "\(d)")
            try await expectNothing(second, "/todos/1 after the append (version \(appended))")

            // Removing #1 (/todos/0) shifts every later element: /todos/1 is now #3, /todos/3 is gone.
            let removed = try await todos(client, "todo/delete", TodoID(id: 1))
            let shifted = try await second.nextValue(timeout: .seconds(20))
            #expect(shifted.version == removed && shifted.value == TodoItem(id: 3, title: "C", done: true, createdSeq: 3),
                    "\(shifted)")
            let gone = try await fourth.nextValue(timeout: .seconds(20))
            #expect(gone.version == removed && !gone.exists, "\(gone)")

            // Each value is the state's at that version (read back with get), and the whole-store subscription
            // held by the same connection went on beside the paths' (from the retained version to the last).
            let state = try await withDeadline(.seconds(20), "get") { try await client.get(store: "todos", as: TodoList.self) }
            #expect(state.version == removed && state.state.todos[1] == shifted.value)
            let versions = try await whole.wait("the whole-store subscription at the last version") { $0.last == removed }
            #expect(versions.first == 4 && zip(versions, versions.dropFirst()).allSatisfy { $0 < $1 }, "\(versions)")
            #expect(second.status?.status == .up)
        }
    }

    /// Nothing waits for `subscription` now (checked without waiting: what fluxd sent before the last settlement
    /// has been read into the subscription already).
    private func expectNothing(_ subscription: PathSubscription<TodoItem>, _ what: String) async throws {
        do {
            let value = try await subscription.nextValue(timeout: .zero)
            Issue.record("\(what): woken with \(value)")
        } catch {
            guard case .timedOut = error else { throw error }
        }
    }

    @Test("fluxctl watch todos --path /todos/1 --count 2 --json prints the subtree at the retained version and at the version that touched it, as SPEC §16.4 sends them; a change elsewhere prints nothing")
    func fluxctlWatchPath() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store", environment: Self.patchesAlways)
            let client = try await bus.connect("writer")
            _ = try await todos(client, "todo/create", Title(title: "milk"))
            _ = try await todos(client, "todo/create", Title(title: "eggs"))
            let json = try FluxctlProcess(["watch", "todos", "--path", "/todos/1", "--count", "2", "--json"], socket: bus.socketPath)
            defer { json.cleanup() }
            let human = try FluxctlProcess(["watch", "todos", "--path", "/todos/1", "--count", "2"], socket: bus.socketPath)
            defer { human.cleanup() }
            try await json.wait("the retained version's value") { $0.contains(#""version":3"#) }
            try await human.wait("the retained version's value") { $0.contains("version 3") && $0.hasSuffix("  }\n") }

            #expect(try await todos(client, "todo/toggle", TodoID(id: 1)) == 4)  // /todos/0: elsewhere
            #expect(try await todos(client, "todo/delete", TodoID(id: 1)) == 5)  // shifts /todos/1 away

            let j = try await json.finish()
            #expect(j.status == 0)
            #expect(j.stdout == #"""
                {"store":"todos","path":"/todos/1","version":3,"seq":2,"exists":true,"value":{"createdSeq":2,"done":false,"id":2,"title":"eggs"}}
                {"store":"todos","path":"/todos/1","version":5,"seq":4,"exists":false}

                """#, "\(j)")
            let h = try await human.finish()
            #expect(h.status == 0)
            #expect(h.stdout == """
                watching todos /todos/1 (up, version 3)
                todos /todos/1 version 3 (seq 2)
                  {
                    "createdSeq": 2,
                    "done": false,
                    "id": 2,
                    "title": "eggs"
                  }
                todos /todos/1 version 5 (seq 4 todo/delete)
                  absent

                """, "\(h)")

            // Bad input: not a pointer (exit 2), --full with --path (usage, 64); nothing waits for a value forever.
            let bad = try await bus.ctl("watch", "todos", "--path", "todos/1")
            #expect(bad.status == 2 && bad.stderr.contains("starts with '/'"), "\(bad)")
            let full = try await bus.ctl("watch", "todos", "--path", "/todos/0", "--full")
            #expect(full.status == 64, "\(full)")
            let quiet = try await bus.ctl("watch", "todos", "--path", "/todos/0", "--count", "2", "--timeout", "0.5")
            #expect(quiet.status == 4)
            #expect(quiet.stderr == "fluxctl: timed out after 0.5 s watching /todos/0 in todos\n", "\(quiet)")
        }
    }
}

private struct EditTitle: Codable, Sendable {
    var id: Int
    var title: String
}
