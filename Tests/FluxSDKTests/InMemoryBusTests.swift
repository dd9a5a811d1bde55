import FluxClient
import FluxCore
import FluxRouter
import FluxStore
import FluxTesting
import Foundation
import Synchronization
import Testing

/// End-to-end through the real router, in memory.
@Suite("InMemoryBus with the real router")
struct InMemoryBusTests {
    @Test("host operations reach the handlers registered on the bus, through the same core as fluxd's")
    func hostOperationsThroughTheCore() async throws {
        let bus = InMemoryBus()
        let client = try await bus.client(name: "operator")
        do {
            _ = try await client.workers(timeout: .seconds(5))
            Issue.record("a bus without a workers handler answered")
        } catch {
            #expect(error.code == .unknownOp)
        }
        bus.handleHostOperation(.workers) { request in
            var b = FrameBuilder(op: "workers")
            b.string("id", request.id ?? "")
            b.raw("workers", Array(#"[{"name":"todo","state":"running","pid":7,"restarts":0,"uptime_ms":5,"last_exit":null,"stores":["todos"]}]"#.utf8))
            return .reply(b.finish())
        }
        bus.handleHostOperation(.restartWorker) { _ in .error(.unknownWorker, "no worker named \"nope\"") }
        let workers = try await client.workers(timeout: .seconds(5))
        #expect(workers.map(\.name) == ["todo"])
        #expect(workers.first?.pid == 7)
        do {
            _ = try await client.restartWorker("nope", timeout: .seconds(5))
            Issue.record("restart of an unknown worker answered")
        } catch {
            #expect(error.code == .unknownWorker)
        }
    }

    @Test func dispatchSettlesAndSubscribersReadTheirWrites() async throws {
        let bus = InMemoryBus()
        let running = try await bus.start(makeTodoStore())
        let client = try await bus.client(name: "view")
        #expect(client.welcome.peer > 0)
        let events = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        try await events.wait { $0.contains { $0.snapshot?.version == 1 } }

        let settlement = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "milk"))
        #expect(settlement.seq >= 1)
        #expect(settlement["todos"] == .done(version: 2))
        // The recorder's task takes the snapshot from the subscription in its own time (that it is in the buffer
        // when settled arrives, R5, is the "read your writes" test's).
        let latest = try await events.wait { $0.contains { $0.snapshot?.version == 2 } }.compactMap(\.snapshot).last
        #expect(latest?.version == 2)
        #expect(latest?.seq == settlement.seq)
        #expect(latest?.state.todos.map(\.title) == ["milk"])

        let rejected = try await client.dispatchAndSettle(type: "todo/delete", payload: DeleteTodo(id: 42))
        #expect(rejected["todos"] == .rejected(code: "todo/not-found", message: "no todo 42"))
        let unchanged = try await client.dispatchAndSettle(type: "todo/touch")
        #expect(unchanged["todos"] == .done(version: 2))
        let got = try await client.get(store: "todos", as: TodoState.self)
        #expect(got.version == 2)
        #expect(got.state.todos.count == 1)

        try await running.stop()
    }

    @Test func noHandlerIsATypedError() async throws {
        let bus = InMemoryBus()
        let client = try await bus.client()
        do {
            _ = try await client.dispatchAndSettle(type: "nobody/home")
            Issue.record("expected no-handler")
        } catch {
            #expect(error.code == .noHandler)
        }
        let errors = Recorder(client.errors)
        let id = try client.dispatch(type: "nobody/home")
        let seen = try await errors.wait(count: 1)
        guard case .server(let e) = seen[0] else { Issue.record("\(seen[0])"); return }
        #expect(e.code == .noHandler)
        #expect(e.ref == id)
    }

    @Test("a durable in-memory bus: frames wait for the journal (a full disk holds them all), and a bus restarted on what it wrote goes on from there")
    func durableBusHoldsFramesAndRestarts() async throws {
        let bus = InMemoryBus(durable: true)
        let running = try await bus.start(makeTodoStore())
        let client = try await bus.client()
        #expect(client.welcome.durability == "batch")
        let first = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "milk"))
        #expect(first["todos"] == .done(version: 2))

        bus.failJournalWrites(.diskFull)
        let held = Task { try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "eggs")) }
        // Accepted and journaled in memory, not written: the action's frame to the store waits.
        let deadline = ContinuousClock.now + .seconds(5)
        while bus.heldFrames == 0 && ContinuousClock.now < deadline { await Task.yield() }
        #expect(bus.heldFrames >= 1)
        #expect(!bus.journalRecords.contains { String(decoding: $0, as: UTF8.self).contains("eggs") })
        bus.failJournalWrites(nil)
        let second = try await held.value
        #expect(second["todos"] == .done(version: 3) && second.seq > first.seq)
        #expect(bus.journalRecords.contains { String(decoding: $0, as: UTF8.self).contains("eggs") })
        try await running.stop()

        // A restart on what was written: the state is kept (the new store process adopts it), seqs go on.
        let restarted = InMemoryBus(durable: true, restoring: bus.journalRecords)
        let store = makeTodoStore()
        let again = try await restarted.start(store)
        #expect(store.state.todos.map(\.title) == ["milk", "eggs"])
        let client2 = try await restarted.client()
        let third = try await client2.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "tea"))
        #expect(third.seq > second.seq && third["todos"] == .done(version: 4))
        try await again.stop()
    }

    @Test func storeCrashAndRestartResumesFromTheRetainedState() async throws {
        let bus = InMemoryBus()
        let store = makeTodoStore()
        let first = try await bus.start(store)
        let client = try await bus.client()
        _ = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "a"))
        let events = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        try await events.wait { $0.contains { $0.snapshot?.version == 2 } }

        await first.crash()
        try await events.wait { $0.contains { $0 == .storeDown(reason: "disconnected") } }
        // While it is down, actions are queued for it.
        let pending = Task { try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "b")) }

        let fresh = makeTodoStore() // a new process: starts from `initial`, must adopt the retained state
        let second = try await bus.start(fresh)
        let settled = try await pending.value
        #expect(settled["todos"] == .done(version: 3))
        #expect(fresh.state.todos.map(\.title) == ["a", "b"])
        try await events.wait { $0.contains { if case .storeUp = $0 { return true } else { return false } } }
        try await events.wait { $0.contains { $0.snapshot?.version == 3 } }
        try await second.stop()
    }

    @Test func queueTimeoutSettlesUnavailableWhenTimePasses() async throws {
        var config = RouterConfig()
        config.queueTimeout = 1000
        let bus = InMemoryBus(config: config)
        let running = try await bus.start(makeTodoStore())
        await running.crash()
        let client = try await bus.client()
        let pending = Task { try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "late")) }
        // Wait until fluxd has queued it (introspection), then let the clock run past the timeout.
        let probe = try await bus.client(name: "probe")
        try await waitUntil { (try await probe.info())[store: "todos"]?.queued == 1 }
        bus.advance(by: .milliseconds(1001))
        let settled = try await withTimeout { try await pending.value }
        guard case .unavailable(let code, _) = settled["todos"] else {
            Issue.record("expected unavailable, got \(String(describing: settled["todos"]))")
            return
        }
        #expect(code == "store-unavailable")
    }

    @Test func queryDrivenStoreFetchesForActiveQueries() async throws {
        struct SiteQuery: Codable, Equatable, Sendable { var site: Int }
        struct Comments: Codable, Equatable, Sendable {
            var bySite: [String: [String]] = [:]
            var active: [Int] = []
        }
        struct Fetched: Codable, Sendable { var site: Int; var comments: [String] }
        let store = FluxStore<Comments>(name: "comments", initial: Comments(), handles: ["comments/*"])
        store.onQueriesChanged(as: SiteQuery.self) { state, queries, ctx in
            state.active = queries.map(\.query.site).sorted()
            for q in queries where state.bySite["\(q.query.site)"] == nil {
                let site = q.query.site
                ctx.spawn { dispatcher in // the "network"
                    try dispatcher.dispatch("comments/fetched", payload: Fetched(site: site, comments: ["hi \(site)"]))
                }
            }
        }
        store.on("comments/fetched", as: Fetched.self) { state, fetched, ctx in
            state.bySite["\(fetched.site)"] = fetched.comments
        }
        let bus = InMemoryBus()
        let running = try await bus.start(store)
        let view = try await bus.client(name: "view")
        let other = try await bus.client(name: "other")
        let events = Recorder(view.subscribe(store: "comments", as: Comments.self).snapshots)

        var receipt: QueryReceipt? = try await view.query(store: "comments", SiteQuery(site: 7))
        let sameQuery = try await other.query(store: "comments", SiteQuery(site: 7))
        try await events.wait { $0.last?.state.bySite["7"] == ["hi 7"] && $0.last?.state.active == [7] }
        let info = try await view.info()
        #expect(info[store: "comments"]?.queries == 1) // deduplicated by fluxd (sorted-key encoding)

        receipt = nil
        sameQuery.cancel()
        try await events.wait { $0.last?.state.active == [] }
        #expect(store.state.bySite["7"] == ["hi 7"])
        _ = receipt
        try await running.stop()
    }

    @Test func waitForAndFollowLetAStoreReadAnotherStoresNewState() async throws {
        struct Stats: Codable, Equatable, Sendable { var count = 0; var todosVersion = 0 }
        let stats = FluxStore<Stats>(name: "stats", initial: Stats(), handles: ["todo/*"], waitFor: ["todos"])
        stats.follow("todos", as: TodoState.self)
        stats.on("todo/*") { state, ctx in
            guard let todos = ctx.latest("todos", as: TodoState.self) else { return }
            state.count = todos.state.todos.count
            state.todosVersion = todos.version
        }
        let bus = InMemoryBus()
        let todosRun = try await bus.start(makeTodoStore())
        let statsRun = try await bus.start(stats)
        let client = try await bus.client()
        let s = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "x"))
        #expect(s.results.map(\.store) == ["stats", "todos"])
        #expect(s["todos"] == .done(version: 2))
        #expect(s["stats"] == .done(version: 2))
        let snapshot = try await client.get(store: "stats", as: Stats.self)
        #expect(snapshot.state == Stats(count: 1, todosVersion: 2))
        try await statsRun.stop()
        try await todosRun.stop()
    }

    @Test func handshakeTimeoutFollowsTheBusClock() async throws {
        let bus = InMemoryBus()
        let raw = RawSession(connection: bus.connect())
        let frames = Recorder(raw.frames)
        #expect(bus.nextDeadline == 5000)
        bus.advance(by: .milliseconds(5000))
        let seen = try await frames.wait(count: 1)
        let error = try Envelope(body: seen[0])
        #expect(error.string("code").value == "timeout")
        #expect(try await frames.waitForEnd() != nil)
    }

    @Test func rawSessionSeesExactWireMessages() async throws {
        let bus = InMemoryBus()
        let raw = RawSession(connection: bus.connect())
        let frames = Recorder(raw.frames)
        try raw.send(json: #"{"op":"hello","protocol":1,"role":"client","name":"raw"}"#)
        try raw.send(json: #"{"op":"ping","id":"p-1"}"#)
        try raw.send(json: "{not json")
        let seen = try await frames.wait(count: 3)
        #expect(try Envelope(body: seen[0]).string("op").value == "welcome")
        #expect(String(decoding: seen[1], as: UTF8.self) == #"{"op":"pong","id":"p-1"}"#)
        #expect(try Envelope(body: seen[2]).string("code").value == "bad-json")
    }

    @Test func concurrentDispatchersGetOneGlobalOrder() async throws {
        struct Log: Codable, Equatable, Sendable { var seqs: [Int] = [] }
        let store = FluxStore<Log>(name: "log", initial: Log(), handles: ["log/*"])
        store.on("log/append") { state, ctx in state.seqs.append(ctx.seq) }
        let bus = InMemoryBus()
        let running = try await bus.start(store)
        let settled = try await withThrowingTaskGroup(of: [Int].self) { group in
            for c in 0..<4 {
                group.addTask {
                    let client = try await bus.client(name: "c\(c)")
                    var seqs: [Int] = []
                    for _ in 0..<50 {
                        let s = try await client.dispatchAndSettle(type: "log/append")
                        guard case .done = s["log"] else { throw FluxError.protocolViolation("not done: \(s)") }
                        seqs.append(s.seq)
                    }
                    return seqs
                }
            }
            var all: [Int] = []
            for try await seqs in group { all += seqs }
            return all
        }
        #expect(settled.count == 200)
        #expect(Set(settled).count == 200)
        #expect(store.state.seqs == settled.sorted()) // handled in seq order, each exactly once
        try await running.stop()
    }

    @Test func secondStoreWithATakenNameFailsToStart() async throws {
        let bus = InMemoryBus()
        let first = try await bus.start(makeTodoStore())
        do {
            _ = try await bus.start(makeTodoStore())
            Issue.record("name-taken expected")
        } catch let error as FluxError {
            #expect(error.code == .nameTaken)
        }
        try await first.stop()
    }
}

/// Polls an async condition until it holds, with a deadline (for state only visible through requests).
func waitUntil(timeout: Duration = .seconds(5), _ condition: @escaping @Sendable () async throws -> Bool) async throws {
    try await withTimeout(timeout, "condition") {
        while try await !condition() { await Task.yield() }
    }
}

@Suite("FluxClient.dispatchAccepted (SPEC §8.3 ack)")
struct DispatchAcceptedTests {
    @Test("returns the seq fluxd gave the action, or throws the refusal to the caller (no-handler)")
    func acceptedOrRefused() async throws {
        let bus = InMemoryBus()
        let todos = try await bus.start(makeTodoStore())
        let client = try await bus.client()
        let first = try await client.dispatchAccepted(type: "todo/add", payload: AddTodo(title: "x"))
        let second = try await client.dispatchAccepted(type: "todo/add", payload: AddTodo(title: "y"))
        #expect(first >= 1 && second == first + 1)
        do {
            try await client.dispatchAccepted(type: "nobody/handles", payloadJSON: nil)
            Issue.record("no error for a type no store handles")
        } catch {
            guard case .server(let e) = error else { Issue.record("not a server error: \(error)"); return }
            #expect(e.code == .noHandler)
        }
        try await todos.stop()
    }
}

@Suite("A settlement's timeout says what the action still waits for")
struct SettleTimeoutNoteTests {
    @Test("dispatchAndSettle to a store that is down: the timeout names the store, that it is down and its queue")
    func timeoutNamesTheDownStore() async throws {
        let bus = InMemoryBus()
        let todos = try await bus.start(makeTodoStore())
        try await todos.stop()  // down: fluxd queues its actions (queueTimeout)
        let client = try await bus.client()
        do {
            _ = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "x"), timeout: .milliseconds(200))
            Issue.record("settled while its store was down")
        } catch {
            guard case .timedOut(let message) = error else { Issue.record("not a timeout: \(error)"); return }
            #expect(message.contains(#"; still waiting for store "todos", which is down (1 action queued for it"#), "\(message)")
        }
    }
}
