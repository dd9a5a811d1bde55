import FluxClient
import FluxCore
import FluxJSONValue
import FluxStore
import FluxTesting
import Foundation
import Synchronization
import Testing

// SPEC §16 in the Swift SDKs, against a scripted fluxd 0.4 (its welcome announces `deltaHistory`).

func welcome16(epoch: String = "e1", peer: Int = 7) -> String {
    #"{"op":"welcome","protocol":1,"server":"fake/0.4","peer":\#(peer),"limits":{"maxFrame":1048576,"deltaHistory":1048576},"epoch":"\#(epoch)","durability":"batch"}"#
}

struct TrackedTodos: Codable, Equatable, Sendable {
    var todos: TrackedArray<Todo> = []
    var nextID = 1
}

struct ToggleByID: Codable, Sendable { var id: Int }

@Suite("SPEC §16 in the SDKs (scripted fluxd 0.4)")
struct DeltaSDKTests {
    @Test("a store answers with patch + base (version + 1 per patch); after patch-failed it registers again, publishes its own encoding when the adopted bytes differ, and sends the next change whole")
    func storePatches() async throws {
        let fluxd = ScriptedConnector()
        let initial = TrackedTodos(todos: [Todo(id: 1, title: "a"), Todo(id: 2, title: "b")], nextID: 3)
        let store = FluxStore<TrackedTodos>(name: "todos", initial: initial, handles: ["todo/*"], wholeStateLimit: 0)
        store.on("todo/toggle", as: ToggleByID.self) { state, action, _ in
            guard let i = state.todos.firstIndex(where: { $0.id == action.id }) else {
                throw StoreRejection(code: "todo/not-found", message: "no \(action.id)")
            }
            state.todos[i].done.toggle()
        }
        store.on("todo/noop") { _, _ in }
        let task = Task { try await store.run(peerName: "todo-store", reconnect: fastReconnect, connector: fluxd.connector) }
        defer { task.cancel() }
        let first = try await fluxd.connection(0)
        let hello = try await first.nextSent(op: "hello")
        let session = try #require(hello.str("session"))
        first.reply(welcome16())
        let register = try await first.nextSent(op: "register")
        let stateText = try #require(register.rawText("state"))
        first.reply(#"{"op":"registered","store":"todos","version":1,"seq":0,"resumed":false}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":\#(stateText)}"#)
        first.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        try await withTimeout(.seconds(5), "ready") { try await store.ready() }
        #expect(first.sent.filter { $0.contains(#""op":"state""#) }.isEmpty, "the adopted bytes are the store's own: nothing to publish")

        first.reply(#"{"op":"action","store":"todos","seq":1,"type":"todo/toggle","origin":3,"payload":{"id":2}}"#)
        let done1 = try await first.nextSent(op: "done")
        #expect(done1.raw("state") == nil)
        #expect(done1.num("base") == 1)
        let patch1 = try JSONPatch(parsing: try #require(done1.raw("patch")))
        #expect(patch1.operations == [.replace(path: try JSONPointer(parsing: "/todos/1"),
                                               value: try JSONValue(parsing: #"{"done":true,"id":2,"title":"b"}"#))])
        first.reply(#"{"op":"action","store":"todos","seq":2,"type":"todo/noop","origin":3,"payload":null}"#)
        let done2 = try await first.nextSent(op: "done")
        #expect(done2.raw("patch") == nil && done2.raw("state") == nil, "unchanged: no patch, no version")
        first.reply(#"{"op":"action","store":"todos","seq":3,"type":"todo/toggle","origin":3,"payload":{"id":1}}"#)
        let done3 = try await first.nextSent(op: "done")
        #expect(done3.num("base") == 2)

        // fluxd could not apply it: patch-failed, and it closes the connection.
        first.reply(#"{"op":"error","code":"patch-failed","ref":"todos","message":"base 2 is not the retained version 3","fatal":false}"#)
        first.drop()
        let second = try await welcomeAgain16(fluxd, 1, session: session)
        _ = try await second.nextSent(op: "register")
        second.reply(#"{"op":"registered","store":"todos","version":3,"seq":1,"resumed":true}"#)
        // The retained state in bytes of its own (fluxd's rendering: members in another order).
        second.reply(#"{"op":"snapshot","store":"todos","version":3,"seq":1,"state":{"nextID":3,"todos":[{"id":1,"title":"a","done":false},{"id":2,"title":"b","done":true}]}}"#)
        second.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        second.reply(#"{"op":"action","store":"todos","seq":3,"type":"todo/toggle","origin":3,"redelivered":true,"payload":{"id":1}}"#)
        // After patch-failed the next change goes whole (no `state` publication first: it is whole anyway).
        let redone = try await second.nextSent(op: "done")
        #expect(redone.num("seq") == 3)
        #expect(redone.raw("patch") == nil)
        let whole = try JSONValue(parsing: try #require(redone.raw("state")))
        #expect(whole == (try JSONValueEncoder().encode(store.state)))
        // Then patches again, without a base (the version a whole state made is not known to the store).
        second.reply(#"{"op":"action","store":"todos","seq":4,"type":"todo/toggle","origin":3,"payload":{"id":2}}"#)
        let done4 = try await second.nextSent(op: "done")
        #expect(done4.raw("patch") != nil && done4.num("base") == nil)
        task.cancel()
        _ = try await second.nextSent(op: "bye")
        second.close()
    }

    @Test("a small state goes whole (as the patches would make it), a state grown past wholeStateLimit as patches")
    func smallStatesWhole() async throws {
        let fluxd = ScriptedConnector()
        let store = FluxStore<TrackedTodos>(name: "todos", initial: TrackedTodos(), handles: ["todo/*"], wholeStateLimit: 200)
        store.on("todo/add", as: ToggleByID.self) { state, action, _ in
            state.todos.append(Todo(id: action.id, title: "todo \(action.id) with a title long enough"))
            state.nextID = action.id + 1
        }
        store.on("todo/toggle", as: ToggleByID.self) { state, action, _ in
            if let i = state.todos.firstIndex(where: { $0.id == action.id }) { state.todos[i].done.toggle() }
        }
        let task = Task { try await store.run(peerName: "todo-store", reconnect: fastReconnect, connector: fluxd.connector) }
        defer { task.cancel() }
        let c = try await fluxd.connection(0)
        _ = try await c.nextSent(op: "hello")
        c.reply(welcome16())
        let register = try await c.nextSent(op: "register")
        let stateText = try #require(register.rawText("state"))
        c.reply(#"{"op":"registered","store":"todos","version":1,"seq":0,"resumed":false}"#)
        c.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":\#(stateText)}"#)
        c.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        try await withTimeout(.seconds(5), "ready") { try await store.ready() }
        // What fluxd would retain, kept by applying what the store sends.
        var retained = try JSONValue(parsing: stateText)
        var sizes: [Int] = []
        var kinds: [String] = []
        for seq in 1...6 {
            let type = seq == 6 ? "todo/toggle" : "todo/add"
            let id = seq == 6 ? 1 : seq
            c.reply(#"{"op":"action","store":"todos","seq":\#(seq),"type":"\#(type)","origin":3,"payload":{"id":\#(id)}}"#)
            let done = try await c.nextSent(op: "done")
            if let state = done.raw("state") {
                retained = try JSONValue(parsing: state)
                sizes.append(state.count)
                kinds.append("state")
            } else {
                try retained.apply(try JSONPatch(parsing: try #require(done.raw("patch"))))
                kinds.append("patch")
            }
            #expect(retained == (try JSONValueEncoder().encode(store.state)), "after seq \(seq)")
        }
        // Whole while the state sent before was at most 200 bytes, then patches (it grew past the limit).
        #expect(kinds.first == "state" && kinds.last == "patch", "\(kinds)")
        let firstPatch = try #require(kinds.firstIndex(of: "patch"))
        #expect(kinds[..<firstPatch].allSatisfy { $0 == "state" } && kinds[firstPatch...].allSatisfy { $0 == "patch" }, "\(kinds)")
        #expect(sizes.dropLast().allSatisfy { $0 <= 200 } && sizes.last! > 200, "sizes of the whole states: \(sizes)")
        task.cancel()
    }

    @Test("a store adopting bytes other than its own encoding publishes its encoding first, then patches from version + 1")
    func storeNormalizes() async throws {
        let fluxd = ScriptedConnector()
        let store = FluxStore<TrackedTodos>(name: "todos", initial: TrackedTodos(), handles: ["todo/*"], wholeStateLimit: 0)
        store.on("todo/toggle", as: ToggleByID.self) { state, action, _ in
            if let i = state.todos.firstIndex(where: { $0.id == action.id }) { state.todos[i].done.toggle() }
        }
        let task = Task { try await store.run(peerName: "todo-store", reconnect: fastReconnect, connector: fluxd.connector) }
        defer { task.cancel() }
        let c = try await fluxd.connection(0)
        _ = try await c.nextSent(op: "hello")
        c.reply(welcome16())
        _ = try await c.nextSent(op: "register")
        c.reply(#"{"op":"registered","store":"todos","version":7,"seq":9,"resumed":true}"#)
        c.reply(#"{"op":"snapshot","store":"todos","version":7,"seq":9,"state":{"todos":[{"id":1,"title":"a","done":false,"extra":1}],"nextID":2}}"#)
        c.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        let state = try await c.nextSent(op: "state")
        #expect(try JSONValue(parsing: try #require(state.raw("state"))) == (try JSONValueEncoder().encode(store.state)))
        c.reply(#"{"op":"action","store":"todos","seq":10,"type":"todo/toggle","origin":3,"payload":{"id":1}}"#)
        let done = try await c.nextSent(op: "done")
        #expect(done.num("base") == 8)
        #expect(done.rawText("patch") == #"[{"op":"replace","path":"/todos/0","value":{"done":true,"id":1,"title":"a"}}]"#)
        task.cancel()
        _ = try await c.nextSent(op: "bye")
        c.close()
    }

    @Test("a subscription asks for deltas, applies them to the state it holds, resyncs on a gap, and resumes from its version after a reconnection")
    func subscriptionDeltas() async throws {
        let fluxd = ScriptedConnector()
        async let connecting = FluxClient.connect(name: "view", requestTimeout: .seconds(30), reconnect: fastReconnect,
                                                  connector: fluxd.connector)
        let first = try await fluxd.connection(0)
        let hello = try await first.nextSent(op: "hello")
        let session = try #require(hello.str("session"))
        first.reply(welcome16())
        let client = try await connecting
        defer { Task { await client.close() } }
        let sub = client.subscribe(store: "todos", as: TrackedTodos.self)
        var it = sub.makeAsyncIterator()
        let subscribe = try await first.nextSent(op: "subscribe")
        #expect(subscribe.bool("deltas").value == true && subscribe.num("from") == nil)
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":1,"deltas":true}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"todos":[{"id":1,"title":"a","done":false},{"id":2,"title":"b","done":false}],"nextID":3}}"#)
        #expect(try await it.next() == .subscribed(.up))
        guard case .snapshot(let s1)? = try await it.next() else { Issue.record("no snapshot"); return }
        #expect(s1.version == 1 && s1.state.todos.map(\.done) == [false, false])

        first.reply(#"{"op":"delta","store":"todos","from":1,"version":2,"seq":5,"patch":[{"op":"replace","path":"/todos/1/done","value":true}]}"#)
        first.reply(#"{"op":"delta","store":"todos","from":2,"version":3,"seq":6,"patch":[{"op":"add","path":"/todos/-","value":{"id":3,"title":"c","done":false}},{"op":"replace","path":"/nextID","value":4}]}"#)
        // The consumer read neither before both came: newest wins (SPEC §8.5), the two deltas merged into one step.
        guard case .snapshot(let s3)? = try await it.next() else { Issue.record("no delta"); return }
        #expect(s3.version == 3 && s3.seq == 6 && s3.state == TrackedTodos(
            todos: [Todo(id: 1, title: "a"), Todo(id: 2, title: "b", done: true), Todo(id: 3, title: "c")], nextID: 4))

        // A delta from a version the subscription does not hold: it asks for the whole state again.
        first.reply(#"{"op":"delta","store":"todos","from":5,"version":6,"seq":9,"patch":[{"op":"remove","path":"/todos/0"}]}"#)
        let again = try await first.nextSent(op: "subscribe")
        #expect(again.num("from") == nil)
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":6,"deltas":true}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":6,"seq":9,"state":{"todos":[{"id":2,"title":"b","done":true}],"nextID":4}}"#)
        var resynced: Snapshot<TrackedTodos>?
        while resynced == nil {
            if case .snapshot(let s)? = try await it.next() { resynced = s }
        }
        #expect(resynced?.version == 6 && resynced?.state.todos.map(\.id) == [2])

        // Reconnected within the epoch: subscribes again from the version it holds.
        first.drop()
        let second = try await welcomeAgain16(fluxd, 1, session: session)
        let resume = try await second.nextSent(op: "subscribe")
        #expect(resume.bool("deltas").value == true && resume.num("from") == 6)
        second.reply(#"{"op":"subscribed","store":"todos","status":"up","version":7,"deltas":true}"#)
        second.reply(#"{"op":"delta","store":"todos","from":6,"version":7,"seq":10,"patch":[{"op":"replace","path":"/todos/0/title","value":"B"}]}"#)
        var resumed: Snapshot<TrackedTodos>?
        while resumed == nil {
            if case .snapshot(let s)? = try await it.next() { resumed = s }
        }
        #expect(resumed?.version == 7 && resumed?.state.todos.first?.title == "B")
    }

    @Test("callback subscribers (tools, followed stores) get whole states made from deltas")
    func callbackWholeStates() async throws {
        let fake = ScriptedConnection()
        async let connecting = FluxClient.connect(over: fake, name: "tool")
        _ = try await fake.nextSent(op: "hello")
        fake.reply(welcome16())
        let client = try await connecting
        let states = Recorder<String>()
        _ = client.addSubscriber(store: "s", deliver: { event in
            if case .snapshot(let raw) = event { states.append("\(raw.version):" + String(decoding: raw.state, as: UTF8.self)) }
        }, end: { _ in })
        _ = try await fake.nextSent(op: "subscribe")
        fake.reply(#"{"op":"subscribed","store":"s","status":"up","version":1}"#)
        fake.reply(#"{"op":"snapshot","store":"s","version":1,"seq":0,"state":{"a":[1,2]}}"#)
        fake.reply(#"{"op":"delta","store":"s","from":1,"version":2,"seq":3,"patch":[{"op":"add","path":"/a/1","value":9}]}"#)
        let seen = try await states.wait { $0.count == 2 }
        #expect(seen == [#"1:{"a":[1,2]}"#, #"2:{"a":[1,9,2]}"#])
        await client.close()
    }
}

func welcomeAgain16(_ fluxd: ScriptedConnector, _ index: Int, session: String) async throws -> ScriptedConnection {
    let connection = try await fluxd.connection(index)
    let hello = try await connection.nextSent(op: "hello")
    #expect(hello.str("session") == session)
    connection.reply(welcome16(peer: 8 + index))
    return connection
}

/// A state of 60 todos, each with a long title: ~5 KB of JSON, over twice the 2,048-byte frames of `welcomeSmall`.
struct BigTodos: Codable, Equatable, Sendable {
    var items: [String] = (0..<60).map { "todo number \($0) with a title long enough to take room" }
}

func welcomeSmall(peer: Int = 7) -> String {
    #"{"op":"welcome","protocol":1,"server":"fake/0.4","peer":\#(peer),"limits":{"maxFrame":2048,"deltaHistory":1048576},"epoch":"e1","durability":"batch"}"#
}

@Suite("SPEC §16.6: a store whose state is larger than a frame (scripted fluxd)")
struct LargeStateStoreTests {
    @Test("registers without state, publishes it in pieces when fluxd has none, and goes on from the piece fluxd took last after a cut")
    func piecesAndResume() async throws {
        let fluxd = ScriptedConnector()
        let store = FluxStore<BigTodos>(name: "big", initial: BigTodos(), handles: ["big/*"])
        store.on("big/noop") { _, _ in }
        let task = Task { try await store.run(peerName: "big-store", reconnect: fastReconnect, connector: fluxd.connector) }
        defer { task.cancel() }
        let first = try await fluxd.connection(0)
        let hello = try await first.nextSent(op: "hello")
        let session = try #require(hello.str("session"))
        first.reply(welcomeSmall())
        let register = try await first.nextSent(op: "register")
        #expect(register.raw("state") == nil, "a register frame with the state would be over maxFrame")
        first.reply(#"{"op":"registered","store":"big","version":0,"seq":0,"resumed":false}"#)
        // The root, then patches, each frame within maxFrame, base 1, 2, ...
        let root = try await first.nextSent(op: "state")
        #expect(root.rawText("state") == "{}")
        var rebuilt = try JSONValue(parsing: "{}")
        var patches: [JSONPatch] = []
        while rebuilt != (try JSONValueEncoder().encode(BigTodos())) {
            let piece = try await first.nextSent(op: "patch")
            #expect(piece.body.count <= 2048)
            #expect(piece.num("base") == patches.count + 1)
            let patch = try JSONPatch(parsing: try #require(piece.raw("patch")))
            try rebuilt.apply(patch)
            patches.append(patch)
        }
        #expect(patches.count >= 2)
        first.reply(#"{"op":"queries","store":"big","queries":[]}"#)
        try await withTimeout(.seconds(5), "ready") { try await store.ready() }

        // Cut after fluxd took the root and the first patch (version 2): the store goes on from there.
        first.drop()
        let second = try await fluxd.connection(1)
        #expect(try await second.nextSent(op: "hello").str("session") == session)
        second.reply(welcomeSmall(peer: 9))
        _ = try await second.nextSent(op: "register")
        var partial = try JSONValue(parsing: "{}")
        try partial.apply(patches[0])
        second.reply(#"{"op":"registered","store":"big","version":2,"seq":0,"resumed":true}"#)
        second.reply(#"{"op":"snapshot","store":"big","version":2,"seq":0,"state":\#(partial.compact)}"#)
        let next = try await second.nextSent(op: "patch")
        #expect(next.num("base") == 2, "the piece after the one fluxd took last")
        #expect((try JSONPatch(parsing: try #require(next.raw("patch")))) == patches[1])
        #expect(store.state == BigTodos(), "the store kept its own state (not fluxd's partial one)")
        withExtendedLifetime(task) {}
    }
}

/// A todo that counts its decodes (`FollowDecodeCountTests`).
private let followedTodoDecodes = Atomic<Int>(0)
private struct CountedTodo: Decodable, Equatable, Sendable {
    var id: Int
    var done: Bool
    enum CodingKeys: String, CodingKey { case id, done }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(Int.self, forKey: .id)
        done = try c.decode(Bool.self, forKey: .done)
        followedTodoDecodes.add(1, ordering: .relaxed)
    }
}
private struct FollowedTodos: Decodable, Sendable {
    var todos: TrackedArray<CountedTodo>
}

@Suite("A store following another one decodes its changes incrementally (issue 26: the tour's stats-store)")
struct FollowDecodeCountTests {
    @Test("300 todos added one action at a time, then a toggle: the follower decodes each todo about once (a whole decode per action would be ~45,000), and its counts are right")
    func followDecodesOnlyWhatChanged() async throws {
        struct Counts: Codable, Equatable, Sendable { var total = 0; var done = 0 }
        let todos = FluxStore<TrackedTodos>(name: "todos", initial: TrackedTodos(), handles: ["todo/*"])
        todos.on("todo/add") { state, _ in
            state.todos.append(Todo(id: state.nextID, title: "todo \(state.nextID)"))
            state.nextID += 1
        }
        todos.on("todo/toggle", as: ToggleByID.self) { state, toggle, _ in
            if let i = state.todos.firstIndex(where: { $0.id == toggle.id }) { state.todos[i].done.toggle() }
        }
        let stats = FluxStore<Counts>(name: "stats", initial: Counts(), handles: ["todo/*"], waitFor: ["todos"])
        stats.follow("todos", as: FollowedTodos.self)
        stats.on("todo/*") { state, ctx in
            guard let followed = ctx.latest("todos", as: FollowedTodos.self) else { return }
            state = Counts(total: followed.state.todos.count, done: followed.state.todos.count { $0.done })
        }
        let bus = InMemoryBus()
        let todosRun = try await bus.start(todos)
        let statsRun = try await bus.start(stats)
        let client = try await bus.client()
        let before = followedTodoDecodes.load(ordering: .relaxed)
        for _ in 0..<300 { _ = try await client.dispatchAndSettle(type: "todo/add") }
        #expect(try await client.dispatchAndSettle(type: "todo/toggle", payload: ToggleByID(id: 7)).allDone)
        #expect(try await client.get(store: "stats", as: Counts.self).state == Counts(total: 300, done: 1))
        let decodes = followedTodoDecodes.load(ordering: .relaxed) - before
        #expect(decodes >= 300 && decodes < 1_000, "the follower decoded \(decodes) todos for 301 changes")
        try await statsRun.stop()
        try await todosRun.stop()
    }
}
