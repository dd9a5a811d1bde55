import FluxClient
import FluxCore
import FluxTesting
import Foundation
import Testing

// SPEC §16.4 path subscriptions in FluxClient, against a scripted fluxd 0.4 (`welcome16()`, DeltaTests.swift).

/// Connects over one scripted connection whose welcome is `welcome` (fluxd 0.4's unless given).
private func connect16(welcome: String = welcome16()) async throws -> (FluxClient, ScriptedConnection) {
    let fake = ScriptedConnection()
    async let connecting = FluxClient.connect(over: fake, name: "view")
    _ = try await fake.nextSent(op: "hello")
    fake.reply(welcome)
    return (try await connecting, fake)
}

@Suite("path subscriptions in FluxClient (scripted fluxd 0.4)", .timeLimit(.minutes(1)))
struct PathSubscriptionSDKTests {
    @Test("subscribed/unsubscribed with a path and subtree go to the path subscription they name, never to the whole-store one; store-down/up to both")
    func routing() async throws {
        let (client, fluxd) = try await connect16()
        defer { Task { await client.close() } }
        // Iterators, read only once the frames of each step arrived (the scripted connection hands each frame
        // over before `reply` returns): what waits for each consumer is then exactly determined.
        var whole = client.subscribeJSON(store: "todos").makeAsyncIterator()
        let wholeSubscribe = try await fluxd.nextSent(op: "subscribe")
        #expect(wholeSubscribe.raw("path") == nil && wholeSubscribe.bool("deltas").value == true)
        let second = try client.subscribe(store: "todos", path: "/todos/1", as: Todo.self)
        var todo = second.makeAsyncIterator()
        let pathSubscribe = try await fluxd.nextSent(op: "subscribe")
        #expect(pathSubscribe.text == #"{"op":"subscribe","store":"todos","path":"/todos/1"}"#, "no deltas, no from: a path subscription")
        var next = try client.subscribe(store: "todos", path: "/nextID", as: Int.self).makeAsyncIterator()
        _ = try await fluxd.nextSent(op: "subscribe")

        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":4,"deltas":true}"#)
        fluxd.reply(#"{"op":"snapshot","store":"todos","version":4,"seq":3,"state":{"todos":[{"id":1,"title":"a","done":false},{"id":2,"title":"b","done":false}],"nextID":3}}"#)
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":4,"path":"/todos/1"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/1","version":4,"seq":3,"exists":true,"value":{"id":2,"title":"b","done":false}}"#)
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"down","version":4,"path":"/nextID"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/nextID","version":4,"seq":3,"exists":true,"value":3}"#)
        // A path this client does not hold: nobody's.
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":4,"path":"/todos/0"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0","version":4,"seq":3,"exists":true,"value":{"id":1,"title":"a","done":false}}"#)
        #expect(try await whole.next() == .subscribed(.up))
        #expect(try await whole.next()?.snapshot?.version == 4)
        #expect(try await todo.next() == .subscribed(.up))
        #expect(try await todo.next() == .value(Subtree(store: "todos", path: "/todos/1", version: 4, seq: 3, exists: true,
                                                        value: Todo(id: 2, title: "b"))))
        #expect(try await next.next() == .subscribed(.down), "each path subscription has its own subscribed")
        #expect(try await next.next() == .value(Subtree(store: "todos", path: "/nextID", version: 4, seq: 3, exists: true, value: 3)))

        // Version 5 removed /todos/1: absent there; /nextID was not touched (fluxd sends it nothing).
        fluxd.reply(#"{"op":"delta","store":"todos","from":4,"version":5,"seq":4,"patch":[{"op":"remove","path":"/todos/1"}]}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/1","version":5,"seq":4,"exists":false}"#)
        fluxd.reply(#"{"op":"store-down","store":"todos","reason":"disconnected"}"#)
        fluxd.reply(#"{"op":"store-up","store":"todos","version":5}"#)
        let five = try await whole.next()?.snapshot
        #expect(five?.version == 5 && five?.state.description == #"{"todos":[{"id":1,"title":"a","done":false}],"nextID":3}"#)
        #expect(try await whole.next() == .storeDown(reason: "disconnected"), "no path subscription's subscribed or subtree came between")
        #expect(try await whole.next() == .storeUp(version: 5))
        #expect(try await todo.next() == .value(Subtree(store: "todos", path: "/todos/1", version: 5, seq: 4, exists: false, value: nil)))
        #expect(try await todo.next() == .storeDown(reason: "disconnected"))
        #expect(try await todo.next() == .storeUp(version: 5))
        #expect(second.status == SubscriptionStatus(store: "todos", status: .up, version: 5))
        #expect(try await next.next() == .storeDown(reason: "disconnected"), "nothing came for version 5's change")
        #expect(try await next.next() == .storeUp(version: 5))

        // Ending one path subscription sends `unsubscribe` with its path (and nothing for the others); frames for
        // it until `unsubscribed` are dropped.
        second.cancel()
        #expect(try await todo.next() == nil)
        let unsubscribe = try await fluxd.nextSent(op: "unsubscribe")
        #expect(unsubscribe.text == #"{"op":"unsubscribe","store":"todos","path":"/todos/1"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/1","version":6,"seq":5,"exists":true,"value":{"id":9,"title":"late","done":false}}"#)
        fluxd.reply(#"{"op":"unsubscribed","store":"todos","path":"/todos/1"}"#)
        // An `unsubscribed` with a path is not the whole-store subscription's: it stays, and goes on.
        fluxd.reply(#"{"op":"snapshot","store":"todos","version":6,"seq":5,"state":{"todos":[],"nextID":3}}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/nextID","version":7,"seq":6,"exists":true,"value":4}"#)
        #expect(try await whole.next()?.snapshot?.version == 6)
        #expect(try await next.next()?.subtree?.value == 4)
        #expect(!fluxd.sent.contains(#"{"op":"unsubscribe","store":"todos"}"#))
        #expect(fluxd.sent.filter { $0.contains(#""op":"unsubscribe""#) }.count == 1)
    }

    @Test("a slow consumer finds only the newest value waiting; status events are all kept; nextValue skips them and says why it timed out")
    func newestWins() async throws {
        let (client, fluxd) = try await connect16()
        defer { Task { await client.close() } }
        let sub = try client.subscribeJSON(store: "todos", path: "/todos/0/title")
        _ = try await fluxd.nextSent(op: "subscribe")
        // Nothing reads while these arrive (the scripted connection hands each frame over before `reply` returns).
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":1,"path":"/todos/0/title"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":1,"seq":1,"exists":true,"value":"a"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":2,"seq":2,"exists":true,"value":"b"}"#)
        fluxd.reply(#"{"op":"store-down","store":"todos","reason":"disconnected"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":3,"seq":3,"exists":true,"value":"c"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":4,"seq":4,"exists":false}"#)
        var it = sub.makeAsyncIterator()
        #expect(try await it.next() == .subscribed(.up))
        #expect(try await it.next()?.subtree?.version == 2, "version 1 was replaced by 2 while it waited")
        #expect(try await it.next() == .storeDown(reason: "disconnected"), "a status event keeps its place")
        let last = try await it.next()?.subtree
        #expect(last?.version == 4 && last?.exists == false && last?.value == nil)
        #expect(sub.status?.status == .down && sub.status?.version == 4)

        fluxd.reply(#"{"op":"store-up","store":"todos","version":5}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":5,"seq":5,"exists":true,"value":"e"}"#)
        let value = try await sub.nextValue(timeout: .seconds(5))
        #expect(value == Subtree(store: "todos", path: "/todos/0/title", version: 5, seq: 5, exists: true, value: RawJSON(Array(#""e""#.utf8))))
        do {
            _ = try await sub.nextValue(timeout: .milliseconds(50))
            Issue.record("no value was sent, yet nextValue returned")
        } catch {
            #expect(error == .timedOut("no change of store 'todos' touched /todos/0/title within 0.05 s"))
        }
    }

    @Test("a path and a fluxd are checked before anything is sent: RFC 6901 syntax, at most 1024 bytes, fluxd 0.4.0")
    func validation() async throws {
        let (client, fluxd) = try await connect16()
        defer { Task { await client.close() } }
        for bad in ["todos/1", "/a~2b", "/a~", String(repeating: "/x", count: 513)] {
            #expect(throws: FluxError.self, "\(bad.prefix(20))") { _ = try client.subscribeJSON(store: "todos", path: bad) }
        }
        #expect(throws: FluxError.invalidArgument("bad store name \"no store\"")) {
            _ = try client.subscribeJSON(store: "no store", path: "/a")
        }
        do {
            _ = try client.subscribeJSON(store: "todos", path: "/" + String(repeating: "x", count: 1024))
        } catch {
            #expect(error == .invalidArgument("a path subscription's JSON Pointer has at most 1024 bytes (this one has 1025)"))
        }
        #expect(fluxd.sent.count == 1, "only hello: \(fluxd.sent)")
        // The limits themselves are fine: 1024 bytes, "" (the whole state), escapes.
        let edge = try client.subscribeJSON(store: "todos", path: "/" + String(repeating: "x", count: 1023))
        let root = try client.subscribeJSON(store: "todos", path: "")
        let escaped = try client.subscribeJSON(store: "todos", path: "/a~1b/~0c/-/")
        for expected in ["/" + String(repeating: "x", count: 1023), "", "/a~1b/~0c/-/"] {
            #expect(try await fluxd.nextSent(op: "subscribe").str("path") == expected)
        }
        withExtendedLifetime((edge, root, escaped)) {}

        // A fluxd without §16 (no limits.deltaHistory): refused here, nothing sent.
        let (old, oldFluxd) = try await connect16(welcome: welcomeJSON)
        defer { Task { await old.close() } }
        do {
            _ = try old.subscribe(store: "todos", path: "/todos/0", as: Todo.self)
            Issue.record("a fluxd without path subscriptions was sent one")
        } catch {
            #expect(error == .invalidArgument("fake/1 has no path subscriptions (its welcome has no limits.deltaHistory): they need fluxd 0.4.0 or newer (SPEC §16.4); nothing was sent"))
        }
        #expect(oldFluxd.sent.count == 1, "only hello: \(oldFluxd.sent)")
    }

    @Test("two local subscriptions to one path share one wire subscription; the second starts from what it knows; a value that does not decode ends only its subscription")
    func sharedAndDecoding() async throws {
        let (client, fluxd) = try await connect16()
        defer { Task { await client.close() } }
        let first = Recorder(try client.subscribe(store: "todos", path: "/todos/0", as: Todo.self))
        _ = try await fluxd.nextSent(op: "subscribe")
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":2,"path":"/todos/0"}"#)
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0","version":2,"seq":1,"exists":true,"value":{"id":1,"title":"a","done":false}}"#)
        _ = try await first.wait(count: 2)
        let second = try client.subscribe(store: "todos", path: "/todos/0", as: Todo.self)
        var it = second.makeAsyncIterator()
        #expect(try await it.next() == .subscribed(.up))
        #expect(try await it.next()?.subtree?.value == Todo(id: 1, title: "a"))
        let asString = Recorder(try client.subscribe(store: "todos", path: "/todos/0", as: String.self))
        _ = try await asString.wait(count: 1)
        // A value that does not decode as String ends that subscription only; the others go on.
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/todos/0","version":3,"seq":2,"exists":true,"value":{"id":1,"title":"A","done":true}}"#)
        #expect(try await it.next()?.subtree?.value == Todo(id: 1, title: "A", done: true))
        let failure = try await asString.waitForEnd()
        #expect((failure as? FluxError).map { if case .coding = $0 { true } else { false } } == true, "\(String(describing: failure))")
        #expect(fluxd.sent.filter { $0.contains(#""op":"subscribe""#) }.count == 1)
        #expect(!fluxd.sent.contains { $0.contains(#""op":"unsubscribe""#) }, "the others still hold it")
        #expect(try await first.wait(count: 3).last?.subtree?.version == 3)
    }

    @Test("a refused path subscription (limit-exceeded, ref = the store) ends with the error")
    func refused() async throws {
        let (client, fluxd) = try await connect16()
        defer { Task { await client.close() } }
        let held = Recorder(try client.subscribeJSON(store: "todos", path: "/a"))
        _ = try await fluxd.nextSent(op: "subscribe")
        fluxd.reply(#"{"op":"subscribed","store":"todos","status":"up","version":0,"path":"/a"}"#)
        _ = try await held.wait(count: 1)
        let refused = try client.subscribeJSON(store: "todos", path: "/b")
        _ = try await fluxd.nextSent(op: "subscribe")
        fluxd.reply(#"{"op":"error","code":"limit-exceeded","ref":"todos","message":"this connection holds 1 subscriptions (maxSubscriptions 1)"}"#)
        do {
            _ = try await refused.nextValue(timeout: .seconds(5))
            Issue.record("a refused subscription went on")
        } catch {
            #expect(error.code == .limitExceeded)
        }
        // The confirmed one is untouched.
        fluxd.reply(#"{"op":"subtree","store":"todos","path":"/a","version":1,"seq":1,"exists":true,"value":1}"#)
        _ = try await held.wait(count: 2)
    }

    @Test("after a reconnection every path is subscribed again; a repeated value is not delivered twice; another fluxd history starts versions over; an unsubscribe while reconnecting is not sent")
    func reconnection() async throws {
        let fluxd = ScriptedConnector()
        async let connecting = FluxClient.connect(name: "view", requestTimeout: .seconds(30), reconnect: fastReconnect,
                                                  connector: fluxd.connector)
        let first = try await fluxd.connection(0)
        let session = try #require(try await first.nextSent(op: "hello").str("session"))
        first.reply(welcome16())
        let client = try await connecting
        defer { Task { await client.close() } }
        let whole = Recorder(client.subscribeJSON(store: "todos"))
        let title = try client.subscribeJSON(store: "todos", path: "/todos/0/title")
        let titles = Recorder(title)
        let dropped = try client.subscribeJSON(store: "todos", path: "/nextID")
        for _ in 0..<3 { _ = try await first.nextSent(op: "subscribe") }
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":3,"deltas":true}"#)
        first.reply(#"{"op":"snapshot","store":"todos","version":3,"seq":3,"state":{"todos":[{"title":"a"}],"nextID":2}}"#)
        first.reply(#"{"op":"subscribed","store":"todos","status":"up","version":3,"path":"/todos/0/title"}"#)
        first.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":3,"seq":3,"exists":true,"value":"a"}"#)
        _ = try await titles.wait(count: 2)

        first.drop()
        dropped.cancel()  // while reconnecting: nothing to send; it is not subscribed again
        let second = try await welcomeAgain16(fluxd, 1, session: session)
        let resubscribeWhole = try await second.nextSent(op: "subscribe")
        #expect(resubscribeWhole.raw("path") == nil && resubscribeWhole.num("from") == 3)
        let resubscribePath = try await second.nextSent(op: "subscribe")
        #expect(resubscribePath.text == #"{"op":"subscribe","store":"todos","path":"/todos/0/title"}"#)
        second.reply(#"{"op":"subscribed","store":"todos","status":"up","version":3,"deltas":true}"#)
        second.reply(#"{"op":"subscribed","store":"todos","status":"up","version":3,"path":"/todos/0/title"}"#)
        // The retained version's value again: held already, not delivered twice.
        second.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":3,"seq":3,"exists":true,"value":"a"}"#)
        second.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":4,"seq":4,"exists":true,"value":"b"}"#)
        let seen = try await titles.wait(count: 4)
        #expect(seen.map { $0.subtree?.version } == [nil, 3, nil, 4], "\(seen)")
        #expect(!second.sent.contains { $0.contains("/nextID") }, "\(second.sent)")

        // Another fluxd history (a new epoch): versions start over, so version 1 is news.
        second.drop()
        let third = try await fluxd.connection(2)
        #expect(try await third.nextSent(op: "hello").str("session") == session)
        third.reply(welcome16(epoch: "e2", peer: 11))
        _ = try await third.nextSent(op: "subscribe")
        #expect(try await third.nextSent(op: "subscribe").str("path") == "/todos/0/title")
        third.reply(#"{"op":"subscribed","store":"todos","status":"up","version":1,"path":"/todos/0/title"}"#)
        third.reply(#"{"op":"subtree","store":"todos","path":"/todos/0/title","version":1,"seq":1,"exists":false}"#)
        let after = try await titles.wait(count: 6)
        #expect(after.last == .value(Subtree(store: "todos", path: "/todos/0/title", version: 1, seq: 1, exists: false, value: nil)))
        #expect(title.status?.version == 1)
        withExtendedLifetime(whole) {}
    }

    @Test("after reconnecting to a fluxd without path subscriptions, they end with an error saying so")
    func reconnectedToOlderFluxd() async throws {
        let fluxd = ScriptedConnector()
        async let connecting = FluxClient.connect(name: "view", requestTimeout: .seconds(30), reconnect: fastReconnect,
                                                  connector: fluxd.connector)
        let first = try await fluxd.connection(0)
        _ = try await first.nextSent(op: "hello")
        first.reply(welcome16())
        let client = try await connecting
        defer { Task { await client.close() } }
        let values = Recorder(try client.subscribeJSON(store: "todos", path: "/a"))
        _ = try await first.nextSent(op: "subscribe")
        first.drop()
        let second = try await fluxd.connection(1)
        _ = try await second.nextSent(op: "hello")
        second.reply(welcomeJSON)
        let failure = try await values.waitForEnd()
        #expect((failure as? FluxError).map { if case .invalidArgument(let m) = $0 { m.contains("no path subscriptions") } else { false } } == true,
                "\(String(describing: failure))")
        #expect(!second.sent.contains { $0.contains(#""path""#) })
    }

    @Test("close() ends path subscriptions without error; a lost connection (no reconnection) with it")
    func endings() async throws {
        let (client, fluxd) = try await connect16()
        let closed = Recorder(try client.subscribeJSON(store: "todos", path: "/a"))
        _ = try await fluxd.nextSent(op: "subscribe")
        let closing = Task { await client.close() }
        _ = try await fluxd.nextSent(op: "bye")
        fluxd.close()
        await closing.value
        #expect(try await closed.waitForEnd() == nil)
        #expect(throws: FluxError.closed) { _ = try client.subscribeJSON(store: "todos", path: "/a") }

        let (other, otherFluxd) = try await connect16()
        let lost = Recorder(try other.subscribeJSON(store: "todos", path: "/a"))
        _ = try await otherFluxd.nextSent(op: "subscribe")
        otherFluxd.drop("gone")
        let failure = try await lost.waitForEnd()
        #expect(failure as? FluxError == .disconnected("gone"))
    }
}
