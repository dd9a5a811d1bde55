import FluxClient
import FluxCore
import FluxStore
import FluxTesting
import Foundation
import Synchronization
import Testing

/// Plays fluxd's side for one store over a scripted connection.
struct StoreHarness: Sendable {
    let fake: ScriptedConnection
    let task: Task<Void, any Error>
    let register: Envelope

    /// Starts `store.run(on:)`, answers the handshake, reads `register`, answers `registered` (+ snapshot).
    static func start<S>(_ store: FluxStore<S>, retained: String? = nil, version: Int = 1) async throws -> StoreHarness {
        let fake = ScriptedConnection()
        let task = Task { try await store.run(on: fake) }
        let hello = try await fake.nextSent()
        #expect(hello.str("role") == "store")
        fake.reply(welcomeJSON)
        let register = try await fake.nextSent(op: "register")
        let state = retained ?? register.rawText("state")!
        fake.reply(#"{"op":"registered","store":"\#(store.name)","version":\#(version),"seq":0,"resumed":\#(retained != nil)}"#)
        fake.reply(#"{"op":"snapshot","store":"\#(store.name)","version":\#(version),"seq":0,"state":\#(state)}"#)
        try await withTimeout(.seconds(5), "ready") { try await store.ready() }
        return StoreHarness(fake: fake, task: task, register: register)
    }

    func action(_ seq: Int, _ type: String, _ payload: String? = nil, store: String = "todos", cause: Int? = nil) {
        var json = #"{"op":"action","store":"\#(store)","seq":\#(seq),"type":"\#(type)","origin":3"#
        if let cause { json += #","cause":\#(cause)"# }
        if let payload { json += #","payload":\#(payload)"# }
        fake.reply(json + "}")
    }

    func next() async throws -> Envelope { try await fake.nextSent() }
}

func makeTodoStore() -> FluxStore<TodoState> {
    let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"], waitFor: ["auth"])
    store.on("todo/add", as: AddTodo.self) { state, action, ctx in
        guard !action.title.isEmpty else { throw StoreRejection(code: "todo/empty", message: "title is empty") }
        state.todos.append(Todo(id: state.nextID, title: action.title))
        state.nextID += 1
    }
    store.on("todo/delete", as: DeleteTodo.self) { state, action, ctx in
        // Mutates first, then refuses: the rollback must undo the mutation.
        state.nextID += 100
        guard let index = state.todos.firstIndex(where: { $0.id == action.id }) else {
            throw StoreRejection(code: "todo/not-found", message: "no todo \(action.id)")
        }
        state.todos.remove(at: index)
    }
    store.on("todo/touch") { state, ctx in
        state.nextID += 0 // no change
    }
    store.on("todo/explode") { state, ctx in
        state.todos = []
        struct Boom: Error {}
        throw Boom()
    }
    return store
}

@Suite("FluxStore against a scripted fluxd")
struct StoreTests {
    @Test func registersWithSortedInitialStateHandlesAndWaitFor() async throws {
        let h = try await StoreHarness.start(makeTodoStore())
        #expect(h.register.str("store") == "todos")
        #expect(h.register.stringArray("handles").value == ["todo/*"])
        #expect(h.register.stringArray("waitFor").value == ["auth"])
        #expect(h.register.rawText("state") == #"{"nextID":1,"todos":[]}"#)
        h.task.cancel()
    }

    @Test func adoptsTheRetainedSnapshotOnRegistration() async throws {
        let store = makeTodoStore()
        let h = try await StoreHarness.start(store, retained: #"{"nextID":8,"todos":[{"id":7,"title":"kept","done":false}]}"#, version: 5)
        #expect(store.state.nextID == 8)
        h.action(1, "todo/add", #"{"title":"new"}"#)
        let done = try await h.next()
        #expect(done.str("op") == "done")
        #expect(done.rawText("state") == #"{"nextID":9,"todos":[{"done":false,"id":7,"title":"kept"},{"done":false,"id":8,"title":"new"}]}"#)
        h.task.cancel()
    }

    @Test func doneCarriesStateOnlyWhenItChanged() async throws {
        let store = makeTodoStore()
        let h = try await StoreHarness.start(store)
        h.action(1, "todo/add", #"{"title":"a"}"#)
        h.action(2, "todo/touch")
        h.action(3, "todo/unhandled-but-matching")
        let d1 = try await h.next()
        let d2 = try await h.next()
        let d3 = try await h.next()
        #expect(d1.str("op") == "done")
        #expect(d1.num("seq") == 1)
        #expect(d1.str("store") == "todos")
        #expect(d1.has("state"))
        #expect(d2.str("op") == "done")
        #expect(d2.num("seq") == 2)
        #expect(!d2.has("state"))
        // Matches todo/* but no handler: rejected (see unhandledActionsAreRejectedNamingTheHandledTypes).
        #expect(d3.str("op") == "reject")
        #expect(d3.num("seq") == 3)
        #expect(store.state.todos.map(\.title) == ["a"])
        h.task.cancel()
    }

    @Test func throwingHandlerRollsBackAndRejects() async throws {
        let store = makeTodoStore()
        let h = try await StoreHarness.start(store)
        h.action(1, "todo/add", #"{"title":"a"}"#)
        h.action(2, "todo/delete", #"{"id":99}"#)
        h.action(3, "todo/explode")
        h.action(4, "todo/add", #"{"title":"b"}"#)
        _ = try await h.next()
        let reject = try await h.next()
        #expect(reject.str("op") == "reject")
        #expect(reject.num("seq") == 2)
        #expect(reject.rawText("error") == #"{"code":"todo/not-found","message":"no todo 99"}"#)
        let explode = try await h.next()
        #expect(explode.str("op") == "reject")
        let err = try Envelope(body: Array(explode.raw("error")!))
        #expect(err.str("code") == StoreRejection.errorCode)
        let d4 = try await h.next()
        // nextID 3 proves the +100 of the rejected delete was rolled back, and the todo list survived explode.
        #expect(d4.rawText("state") == #"{"nextID":3,"todos":[{"done":false,"id":1,"title":"a"},{"done":false,"id":2,"title":"b"}]}"#)
        h.task.cancel()
    }

    @Test func undecodablePayloadIsRejectedAsBadPayload() async throws {
        let h = try await StoreHarness.start(makeTodoStore())
        h.action(1, "todo/add", #"{"titel":"typo"}"#)
        h.action(2, "todo/add") // no payload at all
        for seq in [1, 2] {
            let r = try await h.next()
            #expect(r.str("op") == "reject")
            #expect(r.num("seq") == seq)
            #expect(try Envelope(body: Array(r.raw("error")!)).str("code") == "store/bad-payload")
        }
        h.task.cancel()
    }

    @Test func followUpDispatchesCarryCauseAndLeaveAfterTheAnswer() async throws {
        let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"], unhandled: .ignore)
        store.on("todo/add", as: AddTodo.self) { state, action, ctx in
            try ctx.dispatch("stats/recount", payload: ["added": action.title])
            state.todos.append(Todo(id: 1, title: action.title))
            if action.title == "bad" { throw StoreRejection(code: "todo/bad", message: "bad") }
        }
        let h = try await StoreHarness.start(store)
        h.action(41, "todo/add", #"{"title":"x"}"#, cause: 40)
        let done = try await h.next()
        #expect(done.str("op") == "done")
        let follow = try await h.next()
        #expect(follow.str("op") == "dispatch")
        #expect(follow.str("type") == "stats/recount")
        #expect(follow.num("cause") == 41)
        #expect(follow.rawText("payload") == #"{"added":"x"}"#)
        // A rejected handler's follow-ups are discarded with its state changes.
        h.action(42, "todo/add", #"{"title":"bad"}"#)
        #expect(try await h.next().str("op") == "reject")
        h.action(43, "todo/other")
        let after = try await h.next()
        #expect(after.str("op") == "done")
        #expect(after.num("seq") == 43)
        h.task.cancel()
    }

    @Test func spawnedWorkRunsWithoutBlockingAndDispatchesWithCause() async throws {
        let gate = AsyncStream.makeStream(of: Void.self)
        let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"])
        store.on("todo/fetch") { state, ctx in
            ctx.spawn { dispatcher in
                for await _ in gate.stream { break } // the "network" answers when the test says so
                try dispatcher.dispatch("todo/fetched", payload: AddTodo(title: "from network"))
            }
        }
        store.on("todo/fetched", as: AddTodo.self) { state, action, ctx in
            state.todos.append(Todo(id: 9, title: action.title))
        }
        let h = try await StoreHarness.start(store)
        h.action(5, "todo/fetch")
        #expect(try await h.next().num("seq") == 5)
        // The fetch is still pending, yet the store handles the next action.
        h.action(6, "todo/other")
        #expect(try await h.next().num("seq") == 6)
        gate.continuation.yield()
        let dispatched = try await h.next()
        #expect(dispatched.str("type") == "todo/fetched")
        #expect(dispatched.num("cause") == 5)
        h.action(7, "todo/fetched", dispatched.rawText("payload"), cause: 5)
        let done = try await h.next()
        #expect(done.rawText("state")?.contains("from network") == true)
        h.task.cancel()
    }

    @Test func queriesHandlerGetsDecodedQueriesAndPublishesState() async throws {
        struct CommentsState: Codable, Equatable, Sendable { var loading: [Int] = [] }
        struct SiteQuery: Codable, Equatable, Sendable { var site: Int }
        let store = FluxStore<CommentsState>(name: "comments", initial: CommentsState(), handles: ["comments/*"])
        let seen = Recorder<[ActiveQuery<SiteQuery>]>()
        let errors = Recorder<String>()
        store.onError { errors.append("\($0)") }
        store.onQueriesChanged(as: SiteQuery.self) { state, queries, ctx in
            seen.append(queries)
            state.loading = queries.map(\.query.site).sorted()
            for q in queries { try ctx.dispatch("comments/fetch", payload: q.query) }
        }
        let h = try await StoreHarness.start(store)
        h.fake.reply(#"{"op":"queries","store":"comments","queries":[{"query":{"site":7},"count":2},{"query":{"nope":1},"count":1},{"query":{"site":3},"count":1}]}"#)
        let queries = try await seen.wait(count: 1)[0]
        // In the order of the queries' bytes, as fluxd sends them (SPEC §8.6).
        #expect(queries == [ActiveQuery(query: SiteQuery(site: 3), count: 1), ActiveQuery(query: SiteQuery(site: 7), count: 2)])
        #expect(try await errors.wait(count: 1)[0].contains("does not decode as SiteQuery"))
        let published = try await h.next()
        #expect(published.str("op") == "state")
        #expect(published.rawText("state") == #"{"loading":[3,7]}"#)
        let f1 = try await h.next()
        #expect(f1.str("type") == "comments/fetch")
        #expect(!f1.has("cause"))
        _ = try await h.next()
        // The same set again changes nothing: no `state` message (the next frame is the follow-ups only).
        h.fake.reply(#"{"op":"queries","store":"comments","queries":[{"query":{"site":3},"count":1},{"query":{"site":7},"count":1}]}"#)
        #expect(try await h.next().str("op") == "dispatch")
        h.task.cancel()
    }

    /// FluxStore registers with `queryDeltas` and applies `queries-changed` to the set it holds: the handler sees
    /// the whole active set, as with `queries`.
    @Test func queryDeltasAreAppliedToTheActiveSet() async throws {
        struct SiteQuery: Codable, Equatable, Sendable { var site: Int }
        let store = FluxStore<[Int]>(name: "comments", initial: [], handles: ["comments/*"])
        let seen = Recorder<[ActiveQuery<SiteQuery>]>()
        store.onQueriesChanged(as: SiteQuery.self) { _, queries, _ in seen.append(queries) }
        let fake = ScriptedConnection()
        let task = Task { try await store.run(on: fake) }
        _ = try await fake.nextSent()
        fake.reply(welcomeJSON)
        let register = try await fake.nextSent(op: "register")
        #expect(register.bool("queryDeltas").value == true)
        fake.reply(#"{"op":"registered","store":"comments","version":0,"seq":0,"resumed":false}"#)
        fake.reply(#"{"op":"queries","store":"comments","queries":[{"query":{"site":7},"count":1}]}"#)
        fake.reply(#"{"op":"queries-changed","store":"comments","changes":[{"query":{"site":3},"count":1}]}"#)
        fake.reply(#"{"op":"queries-changed","store":"comments","changes":[{"query":{"site":3},"count":2},{"query":{"site":7},"count":0}]}"#)
        let sets = try await seen.wait(count: 3)
        #expect(sets[0] == [ActiveQuery(query: SiteQuery(site: 7), count: 1)])
        #expect(sets[1] == [ActiveQuery(query: SiteQuery(site: 3), count: 1), ActiveQuery(query: SiteQuery(site: 7), count: 1)])
        #expect(sets[2] == [ActiveQuery(query: SiteQuery(site: 3), count: 2)])
        task.cancel()
    }

    @Test func registrationRefusalMakesRunAndReadyThrow() async throws {
        let store = makeTodoStore()
        let fake = ScriptedConnection()
        let task = Task { try await store.run(on: fake) }
        _ = try await fake.nextSent()
        fake.reply(welcomeJSON)
        _ = try await fake.nextSent(op: "register")
        fake.reply(#"{"op":"error","code":"name-taken","ref":"todos","message":"taken"}"#)
        #expect(try await fake.nextSent().str("op") == "bye")
        fake.drop()
        do {
            try await withTimeout { try await store.ready() }
            Issue.record("ready should throw")
        } catch let error as FluxError {
            #expect(error.code == .nameTaken)
        }
        await #expect(throws: FluxError.self) { try await task.value }
    }

    @Test func cancellingRunUnregistersAndSaysBye() async throws {
        let h = try await StoreHarness.start(makeTodoStore())
        h.task.cancel()
        let unregister = try await h.next()
        #expect(unregister.str("op") == "unregister")
        #expect(unregister.str("store") == "todos")
        #expect(try await h.next().str("op") == "bye")
        h.fake.drop()
        try await h.task.value
    }

    @Test func droppedConnectionMakesRunThrow() async throws {
        let h = try await StoreHarness.start(makeTodoStore())
        h.fake.drop("gone")
        await #expect(throws: FluxError.disconnected("gone")) { try await h.task.value }
    }

    @Test func followedSnapshotsAreSeenInOrderWithActions() async throws {
        struct Stats: Codable, Equatable, Sendable { var seenTodos = 0; var lastVersion = 0 }
        let store = FluxStore<Stats>(name: "stats", initial: Stats(), handles: ["todo/*"], waitFor: ["todos"])
        store.follow("todos", as: TodoState.self)
        store.on("todo/*") { state, ctx in
            let todos = ctx.latest("todos", as: TodoState.self)
            state.seenTodos = todos?.state.todos.count ?? -1
            state.lastVersion = todos?.version ?? -1
        }
        let fake = ScriptedConnection()
        let task = Task { try await store.run(on: fake) }
        _ = try await fake.nextSent()
        fake.reply(welcomeJSON)
        let subscribe = try await fake.nextSent()
        #expect(subscribe.str("op") == "subscribe") // before register, so R3 holds from the first action
        #expect(subscribe.str("store") == "todos")
        _ = try await fake.nextSent(op: "register")
        fake.reply(#"{"op":"subscribed","store":"todos","status":"up"}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"todos":[],"nextID":1}}"#)
        fake.reply(#"{"op":"registered","store":"stats","version":1,"seq":0,"resumed":false}"#)
        fake.reply(#"{"op":"snapshot","store":"stats","version":1,"seq":0,"state":{"seenTodos":0,"lastVersion":0}}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":1,"state":{"todos":[{"id":1,"title":"a","done":false}],"nextID":2}}"#)
        fake.reply(#"{"op":"action","store":"stats","seq":1,"type":"todo/add","origin":3}"#)
        let done = try await fake.nextSent()
        #expect(done.rawText("state") == #"{"lastVersion":2,"seenTodos":1}"#)
        task.cancel()
    }
}
