import FluxClient
import FluxCore
import FluxStore
import FluxTesting
import Foundation
import Synchronization
import Testing

/// Reconnection without waiting: 1 ms, then 2, 4, … up to 20 ms, no jitter.
let fastReconnect = ReconnectPolicy(initialDelay: .milliseconds(1), maxDelay: .milliseconds(20), jitter: 0)

func welcome(epoch: String?, peer: Int = 7) -> String {
    let epochField = epoch.map { #","epoch":"\#($0)","durability":"batch""# } ?? ""
    return #"{"op":"welcome","protocol":1,"server":"fake/0.3","peer":\#(peer),"limits":{"maxFrame":1048576}\#(epochField)}"#
}

/// Connects a reconnecting client through `fluxd`, playing the first handshake (epoch `epoch`).
func connectReconnecting(_ fluxd: ScriptedConnector, epoch: String? = "e1", role: Role = .client,
                         policy: ReconnectPolicy = fastReconnect) async throws -> (FluxClient, ScriptedConnection) {
    async let connecting = FluxClient.connect(name: "rc", role: role, requestTimeout: .seconds(30), reconnect: policy,
                                              connector: fluxd.connector)
    let first = try await fluxd.connection(0)
    let hello = try await first.nextSent(op: "hello")
    #expect(hello.str("session")?.isEmpty == false)
    first.reply(welcome(epoch: epoch))
    return (try await connecting, first)
}

/// Answers the hello of connection `index` (checking it carries `session`).
func welcomeAgain(_ fluxd: ScriptedConnector, _ index: Int, session: String, epoch: String? = "e1") async throws -> ScriptedConnection {
    let connection = try await fluxd.connection(index)
    let hello = try await connection.nextSent(op: "hello")
    #expect(hello.str("session") == session, "the same session on every connection")
    connection.reply(welcome(epoch: epoch, peer: 8 + index))
    return connection
}

@Suite("Reconnection against a scripted fluxd")
struct ReconnectTests {
    @Test("backoff: 50 ms doubling up to 2 s, jitter only shortens")
    func backoff() {
        let plain = ReconnectPolicy(jitter: 0)
        #expect(plain.delay(forAttempt: 1) == .milliseconds(50))
        #expect(plain.delay(forAttempt: 2) == .milliseconds(100))
        #expect(plain.delay(forAttempt: 6) == .milliseconds(1600))
        #expect(plain.delay(forAttempt: 7) == .seconds(2))
        #expect(plain.delay(forAttempt: 100) == .seconds(2))
        for attempt in 1...10 {
            let d = ReconnectPolicy.default.delay(forAttempt: attempt)
            #expect(d <= plain.delay(forAttempt: attempt) && d >= plain.delay(forAttempt: attempt) * 0.75)
        }
        #expect(!ReconnectPolicy.disabled.enabled)
    }

    @Test("connections lost right after their welcome, again and again (a refused registration), back off (SPEC §16.6)")
    func quickLossesBackOff() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let events = Recorder(client.connectivityEvents())
        first.drop("refused")
        for index in 1...4 {
            let connection = try await welcomeAgain(fluxd, index, session: client.session)
            _ = try await events.wait { $0.filter { $0 == .reconnected(epochChanged: false) }.count == index }
            connection.drop("refused")
        }
        _ = try await welcomeAgain(fluxd, 5, session: client.session)
        let all = try await events.wait { $0.filter { $0 == .reconnected(epochChanged: false) }.count == 5 }
        let delays = all.compactMap { event -> Duration? in
            if case .reconnecting(_, let delay) = event { return delay } else { return nil }
        }
        #expect(delays.count == 5)
        // The first loss is a restart like any other (the policy's 1 ms); from the second in a row, at least half
        // of 100 ms doubling (SPEC §16.6), whatever the policy says.
        #expect(delays.first == .milliseconds(1))
        for (n, delay) in delays.dropFirst().enumerated() {
            #expect(delay >= .milliseconds(50 << n), "reconnection \(n + 2) waited \(delay)")
        }
        await client.close()
        _ = try await events.waitForEnd()
    }

    @Test("a dropped connection is made again: events, same session, resubscribed, no version twice")
    func resubscribesWithoutRepeatingAVersion() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let events = Recorder(client.connectivityEvents())
        let sub = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await first.nextSent(op: "subscribe")
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":2}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":4,"state":{"todos":[],"nextID":2}}"#)
        _ = try await sub.wait { $0.contains { $0.snapshot?.version == 2 } }

        first.drop("fluxd went away")
        #expect(!client.isConnected && !client.isClosed)
        let second = try await welcomeAgain(fluxd, 1, session: client.session)
        let resubscribe = try await second.nextSent(op: "subscribe")
        #expect(resubscribe.str("store") == "todos")
        // fluxd answers the subscription with its retained snapshot (version 2, delivered already), then a new one.
        second.reply(#"{"op":"subscribed","store":"todos","status":"up","version":2}"#)
        second.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":4,"state":{"todos":[],"nextID":2}}"#)
        second.reply(#"{"op":"snapshot","store":"todos","version":3,"seq":9,"state":{"todos":[],"nextID":3}}"#)
        let seen = try await sub.wait { $0.contains { $0.snapshot?.version == 3 } }
        #expect(seen.compactMap { $0.snapshot?.version } == [2, 3], "no version is delivered twice")

        let all = try await events.wait { $0.contains(.reconnected(epochChanged: false)) }
        #expect(all.first == .disconnected(reason: .disconnected("fluxd went away")))
        #expect(all.contains(.reconnecting(attempt: 1, delay: .milliseconds(1))))
        #expect(client.isConnected)
        #expect(client.welcome.peer == 9 && client.welcome.epoch == "e1")
        await client.close()
        _ = try await events.waitForEnd()
    }

    @Test("another epoch: versions start over (the next snapshot is delivered whatever its version)")
    func anotherEpochStartsOver() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let events = Recorder(client.connectivityEvents())
        let sub = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await first.nextSent(op: "subscribe")
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":5}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":5,"seq":4,"state":{"todos":[],"nextID":2}}"#)
        _ = try await sub.wait { $0.contains { $0.snapshot?.version == 5 } }

        first.drop()
        let second = try await welcomeAgain(fluxd, 1, session: client.session, epoch: "e2")
        _ = try await second.nextSent(op: "subscribe")
        second.reply(#"{"op":"subscribed","store":"todos","status":"up","version":1}"#)
        second.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":1,"state":{"todos":[],"nextID":1}}"#)
        let seen = try await sub.wait { $0.contains { $0.snapshot?.version == 1 } }
        #expect(seen.compactMap { $0.snapshot?.version } == [5, 1])
        _ = try await events.wait { $0.contains(.reconnected(epochChanged: true)) }
        await client.close()
    }

    @Test("awaited settlements are recovered: settled completes, pending waits for settled, unknown is notSent")
    func settlementsAreRecovered() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let a = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: Array(#"{"title":"a"}"#.utf8))
        let b = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: Array(#"{"title":"b"}"#.utf8))
        let c = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: Array(#"{"title":"c"}"#.utf8))
        for _ in 0..<3 { _ = try await first.nextSent(op: "dispatch") }
        let info = Task { try await client.info() }
        _ = try await first.nextSent(op: "info")

        first.drop()
        // A request other than a settled dispatch cannot be recovered: it fails at once.
        await #expect(throws: FluxError.self) { try await info.value }
        let second = try await welcomeAgain(fluxd, 1, session: client.session)
        let recover = try await second.nextSent(op: "recover")
        #expect(Set(recover.stringArray("ids").value ?? []) == [a.id, b.id, c.id])
        let recoverID = try #require(recover.str("id"))
        second.reply(#"{"op":"recovered","id":"\#(recoverID)","outcomes":[{"id":"\#(a.id)","status":"settled","seq":41,"results":[{"store":"todos","status":"done","version":6}]},{"id":"\#(b.id)","status":"pending","seq":42},{"id":"\#(c.id)","status":"unknown"}]}"#)

        let settledA = try await a.settlement()
        #expect(settledA == Settlement(id: a.id, seq: 41, results: [StoreResult(store: "todos", status: .done(version: 6))]))
        do {
            _ = try await c.settlement()
            Issue.record("an unknown dispatch must fail")
        } catch {
            guard case .notSent = error else { throw error }
        }
        second.reply(#"{"op":"settled","id":"\#(b.id)","seq":42,"results":[{"store":"todos","status":"done","version":7}]}"#)
        #expect(try await b.settlement().seq == 42)

        // Ids continue from one counter across connections.
        let next = try client.dispatch(type: "todo/touch")
        let numbers = [a.id, b.id, c.id, next].map { Int($0.split(separator: "#").last!)! }
        #expect(numbers == numbers.sorted() && Set(numbers).count == 4)
        await client.close()
    }

    @Test("a fluxd that cannot recover (unknown-op), or another epoch: the outcome is unknown")
    func unrecoverableSettlementsFailAsOutcomeUnknown() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let a = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: nil)
        _ = try await first.nextSent(op: "dispatch")
        first.drop()
        let second = try await welcomeAgain(fluxd, 1, session: client.session)
        let recover = try await second.nextSent(op: "recover")
        second.reply(#"{"op":"error","code":"unknown-op","message":"no recover here","ref":"\#(recover.str("id")!)","fatal":false}"#)
        do {
            _ = try await a.settlement()
            Issue.record("must fail")
        } catch {
            guard case .disconnected(let why) = error, why.contains("outcome is unknown") else { throw error }
        }

        let b = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: nil)
        _ = try await second.nextSent(op: "dispatch")
        second.drop()
        let third = try await welcomeAgain(fluxd, 2, session: client.session, epoch: "e2")
        do {
            _ = try await b.settlement()
            Issue.record("must fail")
        } catch {
            guard case .disconnected(let why) = error, why.contains("outcome is unknown") else { throw error }
        }
        #expect(!third.sent.contains { $0.contains(#""op":"recover""#) }, "nothing to ask another history")
        await client.close()
    }

    @Test("calls made while reconnecting wait for the connection and are sent after the resubscription")
    func callsWhileReconnectingWait() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let sub = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await first.nextSent(op: "subscribe")
        first.drop()
        // The client is reconnecting: fluxd has not answered the next hello yet.
        let second = try await fluxd.connection(1)
        _ = try await second.nextSent(op: "hello")
        let settling = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: Array(#"{"title":"x"}"#.utf8))
        let fired = try client.dispatch(type: "todo/touch")
        let unsent = Task { try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "late"), timeout: .milliseconds(50)) }
        do {
            _ = try await unsent.value
            Issue.record("must fail")
        } catch let error as FluxError {
            guard case .notSent = error else { throw error }
        }
        #expect(second.sent.count == 1, "nothing but hello before welcome")

        second.reply(welcome(epoch: "e1"))
        #expect(try await second.nextSent().str("op") == "subscribe")
        let dispatched = try await second.nextSent()
        #expect(dispatched.str("op") == "dispatch" && dispatched.str("type") == "todo/add")
        #expect(try await second.nextSent().str("id") == fired)
        second.reply(#"{"op":"settled","id":"\#(dispatched.str("id")!)","seq":3,"results":[]}"#)
        #expect(try await settling.settlement().seq == 3)
        #expect(!second.sent.contains { $0.contains("late") }, "a dispatch that timed out unsent is never sent")
        withExtendedLifetime(sub) {}
        await client.close()
    }

    @Test("live queries are declared again with their ids; withdrawn ones are not")
    func queriesAreDeclaredAgain() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let declaring = Task { try await client.query(store: "comments", queryJSON: Array(#"{"site":7}"#.utf8)) }
        let q = try await first.nextSent(op: "query")
        first.reply(#"{"op":"query-ok","id":"\#(q.str("id")!)"}"#)
        let receipt = try await declaring.value
        let withdrawn = Task { try await client.query(store: "comments", queryJSON: Array(#"{"site":8}"#.utf8)) }
        let q2 = try await first.nextSent(op: "query")
        first.reply(#"{"op":"query-ok","id":"\#(q2.str("id")!)"}"#)
        try await withdrawn.value.cancel()
        _ = try await first.nextSent(op: "unquery")

        first.drop()
        let second = try await welcomeAgain(fluxd, 1, session: client.session)
        let again = try await second.nextSent(op: "query")
        #expect(again.str("id") == receipt.id && again.rawText("query") == #"{"site":7}"#)
        let pinging = Task { try await client.ping() }
        let ping = try await second.nextSent()
        #expect(ping.str("op") == "ping", "the withdrawn query is not declared again")
        second.reply(#"{"op":"pong","id":"\#(ping.str("id")!)"}"#)
        _ = try await pinging.value
        withExtendedLifetime(receipt) {}
        await client.close()
    }

    @Test("giving up ends the client: events, subscriptions and unsent dispatches are told")
    func givingUpEndsTheClient() async throws {
        let fluxd = ScriptedConnector()
        let policy = ReconnectPolicy(initialDelay: .milliseconds(1), maxDelay: .milliseconds(2), jitter: 0, maxAttempts: 3)
        let (client, first) = try await connectReconnecting(fluxd, policy: policy)
        let events = Recorder(client.connectivityEvents())
        let sub = Recorder(client.subscribe(store: "todos", as: TodoState.self))
        _ = try await first.nextSent(op: "subscribe")
        fluxd.refuse(next: 10)
        first.drop()
        let settling = Task { try await client.dispatchAndSettle(type: "todo/add", payloadJSON: nil, timeout: .seconds(5)) }
        let all = try await events.wait { $0.contains { if case .gaveUp = $0 { return true } else { return false } } }
        #expect(all.filter { if case .reconnecting = $0 { return true } else { return false } }.count == 3)
        #expect(fluxd.attempts == 4)
        _ = try await events.waitForEnd()
        #expect(client.isClosed)
        #expect(try await sub.waitForEnd() != nil, "the subscription ends with the error")
        do {
            _ = try await settling.value
            // The dispatch may have come before the client ended (then it was held, and is notSent) or after.
        } catch let error as FluxError {
            switch error {
            case .notSent, .disconnected: break
            default: Issue.record("unexpected \(error)")
            }
        }
        #expect(throws: FluxError.self) { try client.dispatch(type: "todo/touch") }
    }

    @Test("reconnection off: a dropped connection ends the client, as before")
    func disabledEndsTheClient() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd, policy: .disabled)
        let a = try client.beginDispatchAndSettle(type: "todo/add", payloadJSON: nil)
        first.drop()
        #expect(client.isClosed)
        await #expect(throws: FluxError.disconnected("fluxd closed the connection")) { try await a.settlement() }
        #expect(fluxd.attempts == 1)
    }

    @Test("fluxd's bye restart: the client reconnects; close() while reconnecting stops it")
    func byeThenCloseWhileReconnecting() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd)
        let events = Recorder(client.connectivityEvents())
        fluxd.refuse(next: 1_000_000)
        first.reply(#"{"op":"bye","reason":"restart"}"#)
        first.drop()
        let seen = try await events.wait { $0.contains { if case .reconnecting(2, _) = $0 { return true } else { return false } } }
        #expect(seen.first == .disconnected(reason: .disconnected("fluxd said bye (restart)")))
        await client.close()
        #expect(client.isClosed)
        _ = try await events.waitForEnd()
        await #expect(throws: FluxError.closed) { try await client.ping() }
    }
}

@Suite("FluxStore reconnection against a scripted fluxd")
struct StoreReconnectTests {
    @Test("re-registers, adopts the retained snapshot over newer memory (rule 1), skips what it holds (rule 2)")
    func reRegistersAdoptsAndSkips() async throws {
        let fluxd = ScriptedConnector()
        let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"])
        let calls = Mutex<[Int]>([])
        store.on("todo/add", as: AddTodo.self) { state, action, ctx in
            calls.withLock { $0.append(ctx.seq) }
            state.todos.append(Todo(id: state.nextID, title: action.title))
            state.nextID += 1
        }
        let events = Recorder(store.connectivityEvents())
        let task = Task { try await store.run(peerName: "todo-store", reconnect: fastReconnect, connector: fluxd.connector) }
        let first = try await fluxd.connection(0)
        let hello = try await first.nextSent(op: "hello")
        let session = try #require(hello.str("session"))
        first.reply(welcome(epoch: "e1"))
        _ = try await first.nextSent(op: "register")
        first.reply(#"{"op":"registered","store":"todos","version":1,"seq":0,"resumed":false}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":1,"seq":0,"state":{"todos":[],"nextID":1}}"#)
        first.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        try await withTimeout(.seconds(5), "ready") { try await store.ready() }
        first.reply(#"{"op":"action","store":"todos","seq":5,"type":"todo/add","origin":3,"payload":{"title":"a"}}"#)
        first.reply(#"{"op":"action","store":"todos","seq":6,"type":"todo/add","origin":3,"payload":{"title":"b"}}"#)
        _ = try await first.nextSent(op: "done")
        _ = try await first.nextSent(op: "done")
        #expect(store.state.todos.map(\.title) == ["a", "b"])

        // fluxd restarts having recorded the state after seq 5 but not the answer to 6.
        first.reply(#"{"op":"bye","reason":"restart"}"#)
        first.drop()
        let second = try await welcomeAgain(fluxd, 1, session: session)
        let register = try await second.nextSent(op: "register")
        #expect(register.str("store") == "todos")
        // Its state in memory goes with it, for a fluxd that retains none (an ephemeral one that restarted).
        #expect(register.rawText("state")?.contains(#""title":"b""#) == true)
        second.reply(#"{"op":"registered","store":"todos","version":2,"seq":5,"resumed":true}"#)
        second.reply(#"{"op":"snapshot","store":"todos","version":2,"seq":5,"state":{"todos":[{"id":1,"title":"a","done":false}],"nextID":2}}"#)
        second.reply(#"{"op":"queries","store":"todos","queries":[]}"#)
        // Seq 5 is in the adopted snapshot (a crash between its state and its result): done, no handler, no state.
        second.reply(#"{"op":"action","store":"todos","seq":5,"type":"todo/add","origin":3,"redelivered":true,"payload":{"title":"a"}}"#)
        second.reply(#"{"op":"action","store":"todos","seq":6,"type":"todo/add","origin":3,"redelivered":true,"payload":{"title":"b"}}"#)
        let skipped = try await second.nextSent(op: "done")
        #expect(skipped.num("seq") == 5 && skipped.raw("state") == nil)
        let redone = try await second.nextSent(op: "done")
        #expect(redone.num("seq") == 6)
        #expect(redone.rawText("state")?.contains(#""title":"b""#) == true)
        #expect(calls.withLock { $0 } == [5, 6, 6], "seq 5 applied once; 6 again after the rewind")
        #expect(store.state == TodoState(todos: [Todo(id: 1, title: "a"), Todo(id: 2, title: "b")], nextID: 3))
        #expect(second.sent.filter { $0.contains(#""op":"register""#) }.count == 1, "registered once per connection")

        _ = try await events.wait { $0.contains(.reconnected(epochChanged: false)) }
        task.cancel()
        _ = try await second.nextSent(op: "bye")
        second.close()
        try await task.value
        _ = try await events.waitForEnd()
    }

    @Test("a store's answers go on the connection it registered on only, never on the next one")
    func answersStayOnTheirConnection() async throws {
        let fluxd = ScriptedConnector()
        let (client, first) = try await connectReconnecting(fluxd, role: .store)
        let events = Recorder(client.connectivityEvents())
        #expect(client.generation == 0)
        var done = FrameBuilder(op: "done")
        done.string("store", "todos")
        done.int("seq", 1)
        let answer = done.finish()
        try client.send(frame: answer, generation: 0)
        #expect(try await first.nextSent(op: "done").num("seq") == 1)
        first.drop()
        #expect(throws: FluxError.self, "not while reconnecting") { try client.queue(frame: answer, generation: 0) }
        let second = try await welcomeAgain(fluxd, 1, session: client.session)
        _ = try await events.wait { $0.contains(.reconnected(epochChanged: false)) }
        #expect(client.generation == 1)
        #expect(throws: FluxError.self, "not on the next connection") { try client.send(frame: answer, generation: 0) }
        try client.send(frame: answer, generation: 1)
        #expect(try await second.nextSent(op: "done").num("seq") == 1)
        #expect(second.sent.filter { $0.contains(#""op":"done""#) }.count == 1)
        await client.close()
    }
}
