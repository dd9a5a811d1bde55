import FluxClient
import FluxCore
import FluxTesting
import Foundation
import Synchronization
import Testing

@Suite("FluxClient against a scripted fluxd")
struct ClientTests {
    @Test func handshakeSendsHelloAndExposesWelcome() async throws {
        let fake = ScriptedConnection()
        async let connecting = FluxClient.connect(over: fake, name: "todo-view", role: .monitor)
        let hello = try await fake.nextSent()
        #expect(hello.str("op") == "hello")
        #expect(hello.num("protocol") == 1)
        #expect(hello.str("role") == "monitor")
        #expect(hello.str("name") == "todo-view")
        fake.reply(welcomeJSON)
        let client = try await connecting
        #expect(client.welcome.peer == 7)
        #expect(client.welcome.server == "fake/1")
        #expect(client.welcome.limits.storeWindow == 64)
        #expect(client.welcome.limits.maxFrame == 1_048_576)
    }

    @Test func handshakeErrorIsThrownTyped() async throws {
        let fake = ScriptedConnection()
        async let connecting = FluxClient.connect(over: fake, name: "old")
        _ = try await fake.nextSent()
        fake.reply(#"{"op":"error","code":"unsupported-version","message":"no","supported":[1],"fatal":true}"#)
        do {
            _ = try await connecting
            Issue.record("connect should have failed")
        } catch let error as FluxError {
            #expect(error.code == .unsupportedVersion)
        }
        #expect(fake.isClosed)
    }

    @Test func settlementsAreMatchedByIdWhateverTheReplyOrder() async throws {
        let (client, fake) = try await connectScripted()
        async let first = client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "a"))
        let d1 = try await fake.nextSent()
        async let second = client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "b"))
        let d2 = try await fake.nextSent()
        #expect(d1.str("op") == "dispatch")
        #expect(d1.str("type") == "todo/add")
        #expect(d1.rawText("payload") == #"{"title":"a"}"#)
        #expect(d1.bool("settle").value == true)
        let id1 = try #require(d1.str("id"))
        let id2 = try #require(d2.str("id"))
        #expect(id1 != id2)
        // Answer the second first.
        fake.reply(#"{"op":"settled","id":"\#(id2)","seq":12,"results":[{"store":"stats","status":"rejected","error":{"code":"stats/full","message":"full"}},{"store":"todos","status":"done","version":4}]}"#)
        fake.reply(#"{"op":"settled","id":"\#(id1)","seq":11,"results":[{"store":"todos","status":"done","version":3},{"store":"x","status":"unavailable","error":{"code":"store-unavailable","message":"down"}}]}"#)
        let s1 = try await first
        let s2 = try await second
        #expect(s1.seq == 11)
        #expect(s1["todos"] == .done(version: 3))
        #expect(s1["x"] == .unavailable(code: "store-unavailable", message: "down"))
        #expect(!s1.allDone)
        #expect(s2.seq == 12)
        #expect(s2.results.map(\.store) == ["stats", "todos"])
        #expect(s2["stats"] == .rejected(code: "stats/full", message: "full"))
        #expect(s2["todos"] == .done(version: 4))
    }

    @Test func settledDispatchRefusedByFluxdThrowsTheCode() async throws {
        let (client, fake) = try await connectScripted()
        let settling = Task { try await client.dispatchAndSettle(type: "nobody/home", cause: 3) }
        let d = try await fake.nextSent()
        #expect(d.num("cause") == 3)
        #expect(!d.has("payload"))
        fake.reply(#"{"op":"error","code":"no-handler","ref":"\#(d.str("id")!)","message":"no store handles nobody/home"}"#)
        await #expect(throws: FluxError.server(ServerError(rawCode: "no-handler", message: "no store handles nobody/home", ref: d.str("id")))) {
            _ = try await settling.value
        }
    }

    @Test func fireAndForgetErrorsArriveOnTheErrorsStream() async throws {
        let (client, fake) = try await connectScripted()
        let errors = Recorder(client.errors)
        let id = try client.dispatch(type: "nobody/home")
        let d = try await fake.nextSent()
        #expect(d.str("id") == id)
        #expect(!d.has("settle"))
        fake.reply(#"{"op":"error","code":"no-handler","ref":"\#(id)","message":"none"}"#)
        let seen = try await errors.wait(count: 1)
        guard case .server(let e) = seen[0] else { Issue.record("not a server error: \(seen[0])"); return }
        #expect(e.code == .noHandler)
        #expect(e.ref == id)
    }

    @Test func invalidArgumentsAreRefusedWithoutSending() async throws {
        let (client, fake) = try await connectScripted()
        #expect(throws: FluxError.self) { try client.dispatch(type: "bad type with spaces") }
        #expect(throws: FluxError.self) { try client.dispatch(type: "ok", payloadJSON: Array("{nope".utf8)) }
        let marker = Task { try await client.ping() }  // a marker frame
        defer { marker.cancel() }
        let next = try await fake.nextSent()
        #expect(next.str("op") == "ping") // Nothing was sent before the marker.
    }

    @Test func subscriptionDecodesSnapshotsSkipsStaleOnesAndUnsubscribesOnBreak() async throws {
        let (client, fake) = try await connectScripted()
        let sub = client.subscribe(store: "todos", as: TodoState.self)
        let s = try await fake.nextSent()
        #expect(s.str("op") == "subscribe")
        #expect(s.str("store") == "todos")
        fake.reply(#"{"op":"subscribed","store":"todos","status":"up"}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":5,"state":{"todos":[{"id":1,"title":"a","done":false}],"nextID":2}}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":5,"state":{"todos":[],"nextID":1}}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":1,"state":{"todos":[],"nextID":1}}"#)
        fake.reply(#"{"op":"store-down","store":"todos","reason":"disconnected"}"#)
        fake.reply(#"{"op":"store-up","store":"todos","version":2}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":3,"seq":9,"state":{"todos":[],"nextID":2}}"#)
        var events: [StoreEvent<TodoState>] = []
        for try await event in sub {
            events.append(event)
            if events.count == 5 { break }
        }
        #expect(events[0] == .subscribed(.up))
        #expect(events[1] == .snapshot(Snapshot(store: "todos", version: 2, seq: 5,
                                                state: TodoState(todos: [Todo(id: 1, title: "a")], nextID: 2))))
        #expect(events[2] == .storeDown(reason: "disconnected"))
        #expect(events[3] == .storeUp(version: 2))
        #expect(events[4].snapshot?.version == 3)
        _ = consume sub
        let u = try await fake.nextSent()
        #expect(u.str("op") == "unsubscribe")
        #expect(u.str("store") == "todos")
    }

    @Test func localSubscriptionsShareOneWireSubscription() async throws {
        let (client, fake) = try await connectScripted()
        let a = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await fake.nextSent(op: "subscribe")
        fake.reply(#"{"op":"subscribed","store":"todos","status":"down"}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":4,"seq":8,"state":{"todos":[],"nextID":9}}"#)
        try await a.wait(count: 2)
        let bSub = client.subscribe(store: "todos", as: TodoState.self)
        let b = Recorder(bSub)
        // The newcomer is served from the client's cache, at once, without a second wire subscribe.
        let bEvents = try await b.wait(count: 2)
        #expect(bEvents[0] == .subscribed(.down))
        #expect(bEvents[1].snapshot?.state.nextID == 9)
        bSub.cancel()
        let bEnd = try await b.waitForEnd()
        #expect(bEnd == nil) // cancel() ends the sequence normally
        // `a` is still subscribed: no unsubscribe yet; a marker frame proves nothing else was sent.
        let marker = Task { try await client.ping() }  // a marker frame
        defer { marker.cancel() }
        #expect(try await fake.nextSent().str("op") == "ping")
        a.cancel()
        let u = try await fake.nextSent()
        #expect(u.str("op") == "unsubscribe")
    }

    @Test func framesOfAWithdrawnSubscriptionDoNotLeakIntoANewOne() async throws {
        let (client, fake) = try await connectScripted()
        let first = client.subscribe(store: "todos", as: TodoState.self)
        _ = try await fake.nextSent(op: "subscribe")
        first.cancel()
        _ = try await fake.nextSent(op: "unsubscribe")
        let second = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await fake.nextSent(op: "subscribe")
        // fluxd's view: the first subscription's frames, then unsubscribed, then the second's.
        fake.reply(#"{"op":"subscribed","store":"todos","status":"up"}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"todos":[],"nextID":1}}"#)
        fake.reply(#"{"op":"unsubscribed","store":"todos"}"#)
        fake.reply(#"{"op":"subscribed","store":"todos","status":"down"}"#)
        fake.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"todos":[],"nextID":1}}"#)
        let events = try await second.wait(count: 2)
        #expect(events[0] == .subscribed(.down))
        #expect(events[1].snapshot?.version == 1)
    }

    @Test func undecodableSnapshotFinishesTheSubscriptionWithACodingError() async throws {
        let (client, fake) = try await connectScripted()
        let events = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await fake.nextSent(op: "subscribe")
        fake.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"unexpected":true}}"#)
        let end = try await events.waitForEnd()
        guard let error = end, case FluxError.coding = error else {
            Issue.record("expected a coding error, got \(String(describing: end))")
            return
        }
        #expect(try await fake.nextSent().str("op") == "unsubscribe")
    }

    @Test func queryReceiptSendsUnqueryWhenReleased() async throws {
        let (client, fake) = try await connectScripted()
        struct CommentsQuery: Codable, Sendable { var site: Int; var page: Int }
        let responder = Task {
            let q = try await fake.nextSent()
            fake.reply(#"{"op":"query-ok","id":"\#(q.str("id") ?? "")"}"#)
            return q
        }
        var receipt: QueryReceipt? = try await client.query(store: "comments", CommentsQuery(site: 7, page: 2))
        let q = try await responder.value
        #expect(q.str("op") == "query")
        #expect(q.str("store") == "comments")
        #expect(q.rawText("query") == #"{"page":2,"site":7}"#) // sorted keys
        let id = try #require(q.str("id"))
        #expect(receipt?.id == id)
        receipt = nil
        let u = try await fake.nextSent()
        #expect(u.str("op") == "unquery")
        #expect(u.str("id") == id)
        _ = receipt
    }

    @Test func queryReceiptCancelIsIdempotent() async throws {
        let (client, fake) = try await connectScripted()
        async let querying = client.query(store: "comments", ["site": 1])
        let q = try await fake.nextSent()
        fake.reply(#"{"op":"query-ok","id":"\#(q.str("id")!)"}"#)
        let receipt = try await querying
        receipt.cancel()
        receipt.cancel()
        #expect(try await fake.nextSent().str("op") == "unquery")
        let marker = Task { try await client.ping() }  // a marker frame
        defer { marker.cancel() }
        #expect(try await fake.nextSent().str("op") == "ping")
        #expect(receipt.isCancelled)
    }

    @Test func droppedConnectionFailsPendingCallsAndStreams() async throws {
        let (client, fake) = try await connectScripted()
        let events = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await fake.nextSent(op: "subscribe")
        let settling = Task { try await client.dispatchAndSettle(type: "todo/add") }
        _ = try await fake.nextSent(op: "dispatch")
        fake.reply(#"{"op":"bye","reason":"shutdown"}"#)
        fake.drop()
        await #expect(throws: FluxError.disconnected("fluxd said bye (shutdown)")) { _ = try await settling.value }
        let end = try await events.waitForEnd()
        guard let error = end else { Issue.record("the stream should fail"); return }
        #expect(error as? FluxError == .disconnected("fluxd said bye (shutdown)"))
        #expect(client.isClosed)
        #expect(throws: FluxError.self) { try client.dispatch(type: "todo/add") }
    }

    @Test func getInfoAndPingDecodeTheirReplies() async throws {
        let (client, fake) = try await connectScripted()
        async let got = client.get(store: "todos", as: TodoState.self)
        let g = try await fake.nextSent()
        #expect(g.str("op") == "get")
        fake.reply(#"{"op":"got","id":"\#(g.str("id")!)","store":"todos","version":6,"seq":42,"state":{"todos":[],"nextID":5}}"#)
        let snapshot = try await got
        #expect(snapshot == Snapshot(store: "todos", version: 6, seq: 42, state: TodoState(todos: [], nextID: 5)))

        async let info = client.info()
        let i = try await fake.nextSent()
        #expect(i.str("op") == "info")
        fake.reply(#"{"op":"info","id":"\#(i.str("id")!)","seq":42,"stores":[{"name":"todos","status":"up","handles":["todo/*"],"waitFor":[],"version":6,"seq":42,"subscribers":2,"queued":0,"inflight":0,"queries":1,"owner":{"peer":3,"name":"w","pid":12,"uid":1000}}],"peers":{"client":2,"store":1,"monitor":0},"counters":{"framesIn":10,"errors":{"bad-json":1}}}"#)
        let busInfo = try await info
        #expect(busInfo.seq == 42)
        #expect(busInfo[store: "todos"]?.owner?.pid == 12)
        #expect(busInfo.peers?.store == 1)
        #expect(busInfo.counters?.errors?["bad-json"] == 1)

        async let pinging = client.ping()
        let p = try await fake.nextSent()
        #expect(p.str("op") == "ping")
        fake.reply(#"{"op":"pong","id":"\#(p.str("id")!)"}"#)
        #expect(try await pinging > .zero)

        async let missing = client.get(store: "nothing", as: TodoState.self)
        let m = try await fake.nextSent()
        fake.reply(#"{"op":"error","code":"unknown-store","ref":"\#(m.str("id")!)","message":"no snapshot"}"#)
        do {
            _ = try await missing
            Issue.record("get should fail")
        } catch let error as FluxError {
            #expect(error.code == .unknownStore)
        }
    }

    @Test func closeSaysByeAndFailsPendingCalls() async throws {
        let (client, fake) = try await connectScripted()
        let settling = Task { try await client.dispatchAndSettle(type: "todo/add") }
        _ = try await fake.nextSent(op: "dispatch")
        async let closing: Void = client.close()
        #expect(try await fake.nextSent().str("op") == "bye")
        fake.drop() // fluxd closes after bye
        await closing
        await #expect(throws: FluxError.closed) { _ = try await settling.value }
    }

    @Test func cancellingAnAwaitedCallThrowsCancellation() async throws {
        let (client, fake) = try await connectScripted()
        let settling = Task { try await client.dispatchAndSettle(type: "todo/add") }
        _ = try await fake.nextSent(op: "dispatch")
        settling.cancel()
        await #expect(throws: FluxError.cancelled) { _ = try await settling.value }
    }
}
