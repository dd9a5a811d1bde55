import FluxCore
@testable import FluxRouter
import Testing

@Suite("Handshake")
struct HandshakeTests {
    @Test func welcomeCarriesPeerIdAndLimits() {
        let bus = TestBus { $0.maxFrame = 4096; $0.queueLimit = 7 }
        bus.connect(5)
        bus.send(5, #"{"op":"hello","protocol":1,"role":"client","name":"view"}"#)
        let got = bus.take(5)
        #expect(got.count == 1)
        #expect(got[0].op == "welcome")
        #expect(got[0].num("peer") == 5)
        #expect(got[0].num("protocol") == 1)
        let limits = try! Envelope(body: Array(got[0].raw("limits")!))
        #expect(limits.num("maxFrame") == 4096)
        #expect(limits.num("queueLimit") == 7)
    }

    @Test func unsupportedVersionIsRefusedAndClosed() {
        let bus = TestBus()
        bus.connect(1)
        bus.send(1, #"{"op":"hello","protocol":2,"role":"client"}"#)
        let got = bus.take(1)
        #expect(got.map(\.op) == ["error"])
        #expect(got[0].str("code") == "unsupported-version")
        #expect(got[0].rawText("supported") == "[1]")
        #expect(bus.closedPeers.contains(1))
    }

    @Test func firstFrameMustBeHello() {
        let bus = TestBus()
        bus.connect(1)
        bus.send(1, #"{"op":"ping","id":"x"}"#)
        #expect(bus.take(1).map { $0.str("code") } == ["handshake-required"])
        #expect(bus.closedPeers.contains(1))
    }

    @Test func garbageBeforeHelloClosesWithHandshakeRequired() {
        let bus = TestBus()
        bus.connect(1)
        bus.send(1, "not json")
        #expect(bus.take(1).map { $0.str("code") } == ["handshake-required"])
        #expect(bus.closedPeers.contains(1))
    }

    @Test func handshakeTimesOut() {
        let bus = TestBus { $0.handshakeTimeout = 100 }
        bus.connect(1)
        bus.join(2, role: "client")
        #expect(bus.router.nextDeadline == bus.now + 100)
        bus.advance(99)
        #expect(!bus.closedPeers.contains(1))
        bus.advance(1)
        #expect(bus.take(1).map { $0.str("code") } == ["timeout"])
        #expect(bus.closedPeers.contains(1))
        #expect(!bus.closedPeers.contains(2))
    }

    @Test func badRoleIsRefused() {
        let bus = TestBus()
        bus.connect(1)
        bus.send(1, #"{"op":"hello","protocol":1,"role":"admin"}"#)
        #expect(bus.take(1).map { $0.str("code") } == ["bad-message"])
        #expect(bus.closedPeers.contains(1))
    }
}

@Suite("Bad input")
struct BadInputTests {
    /// Each bad input gets its code; the connection survives unless the code is fatal; another peer is untouched.
    @Test(arguments: [
        ("{\"op\":\"ping\",", "bad-json", false),
        ("[1,2,3]", "bad-message", false),
        ("{\"op\":\"ping\",\"op\":\"ping\"}", "bad-message", false),
        ("{\"id\":\"x\"}", "bad-message", false),
        ("{\"op\":\"teleport\"}", "unknown-op", false),
        ("{\"op\":\"register\",\"store\":\"s\",\"handles\":[\"a\"]}", "forbidden", false),
        ("{\"op\":\"done\",\"store\":\"s\",\"seq\":1}", "forbidden", false),
        ("{\"op\":\"dispatch\",\"type\":\"bad type!\"}", "bad-message", false),
        ("{\"op\":\"dispatch\",\"type\":\"a\",\"settle\":true}", "bad-message", false),
        ("{\"op\":\"hello\",\"protocol\":1,\"role\":\"client\"}", "bad-message", false),
    ])
    func badFrameGetsItsCode(input: String, code: String, fatal: Bool) {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: "{}")
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos"}"#)
        _ = bus.take(1); _ = bus.take(3)
        bus.send(2, input)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["error"])
        #expect(got.first?.str("code") == code)
        #expect(bus.closedPeers.contains(2) == fatal)
        // The other client still works.
        bus.send(3, #"{"op":"dispatch","id":"d","type":"todo/add","settle":true}"#)
        #expect(bus.ops(1) == ["action"])
        bus.send(1, #"{"op":"done","store":"todos","seq":1,"state":{"n":1}}"#)
        #expect(bus.ops(3) == ["snapshot", "settled"])
        // And the offender, when it survived, too.
        if !fatal {
            bus.send(2, #"{"op":"ping","id":"p"}"#)
            #expect(bus.ops(2) == ["pong"])
        }
    }

    @Test func emptyFrameBeforeHelloIsAHandshakeError() {
        let bus = TestBus()
        bus.connect(1)
        bus.feed(.emptyFrame(1))
        #expect(bus.take(1).map { $0.str("code") } == ["handshake-required"])
        #expect(bus.closedPeers.contains(1))
    }

    @Test func emptyFrameSurvivesOversizedCloses() {
        let bus = TestBus()
        bus.join(1, role: "client")
        bus.join(2, role: "client")
        bus.feed(.emptyFrame(1))
        #expect(bus.take(1).map { $0.str("code") } == ["bad-frame"])
        #expect(!bus.closedPeers.contains(1))
        bus.feed(.oversizedFrame(2, length: 9_999_999))
        let got = bus.take(2)
        #expect(got.map { $0.str("code") } == ["too-large"])
        #expect(got.first?.bool("fatal").value == true)
        #expect(bus.closedPeers.contains(2))
        bus.send(1, #"{"op":"ping","id":"still"}"#)
        #expect(bus.take(1).first?.rawText("id") == "\"still\"")
    }

    @Test func monitorMayNotDispatch() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "monitor")
        _ = bus.take(1)
        bus.send(2, #"{"op":"dispatch","type":"todo/add"}"#)
        let got = bus.take(2)
        #expect(got.filter { $0.op == "error" }.map { $0.str("code") } == ["forbidden"])
        #expect(got.filter { $0.op == "event" }.map { $0.str("kind") } == ["error"], "a monitor sees its own error as an event too")
        #expect(bus.ops(1).isEmpty)
    }
}

@Suite("Dispatch and settlement")
struct DispatchTests {
    @Test func actionIsDeliveredWithPayloadBytesUntouched() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"a1","type":"todo/add","payload":{ "title" : "milk\u00e9" , "n":[1, 2.5e3]}}"#)
        let got = bus.take(1)
        #expect(got.map(\.op) == ["action"])
        #expect(got[0].str("store") == "todos")
        #expect(got[0].num("seq") == 1)
        #expect(got[0].str("type") == "todo/add")
        #expect(got[0].num("origin") == 2)
        #expect(got[0].rawText("payload") == #"{ "title" : "milk\u00e9" , "n":[1, 2.5e3]}"#)
        #expect(bus.take(2).isEmpty, "fire-and-forget gets no reply")
    }

    @Test func missingPayloadIsNull() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/clear"])
        _ = bus.take(1)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","type":"todo/clear"}"#)
        #expect(bus.take(1).first?.rawText("payload") == "null")
    }

    @Test func noHandlerIsReportedEvenWithoutSettle() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"x","type":"cart/add"}"#)
        let got = bus.take(2)
        #expect(got.map { $0.str("code") } == ["no-handler"])
        #expect(got.first?.str("ref") == "x")
        // No seq was used: the next accepted action is 1.
        bus.send(2, #"{"op":"dispatch","type":"todo/add"}"#)
        #expect(bus.take(1).last?.num("seq") == 1)
    }

    @Test func settlementListsEveryStoresResult() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["x/*"], state: #"{"v":0}"#)
        bus.store(2, "b", handles: ["x/go"])
        bus.store(3, "c", handles: ["*"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","id":"s-1","type":"x/go","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"a","seq":1,"state":{"v":1}}"#)
        bus.send(2, #"{"op":"reject","store":"b","seq":1,"error":{"code":"b/nope","message":"no way"}}"#)
        #expect(bus.take(9).isEmpty, "not settled until every target answered")
        bus.send(3, #"{"op":"done","store":"c","seq":1}"#)
        let got = bus.take(9)
        #expect(got.map(\.op) == ["settled"])
        #expect(got[0].str("id") == "s-1")
        #expect(got[0].num("seq") == 1)
        #expect(got[0].rawText("results") ==
            #"[{"store":"a","status":"done","version":2},{"store":"b","status":"rejected","error":{"code":"b/nope","message":"no way"}},{"store":"c","status":"done","version":0}]"#)
    }

    @Test func rejectNeedsAnErrorCode() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["x"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        _ = bus.take(1)
        bus.send(1, #"{"op":"reject","store":"a","seq":1,"error":"boom"}"#)
        #expect(bus.take(1).map { $0.str("code") } == ["bad-message"])
        bus.send(1, #"{"op":"reject","store":"a","seq":1,"error":{"code":"a/boom"}}"#)
        #expect(bus.take(1).isEmpty)
    }

    @Test func answersMustComeInOrderFromTheOwner() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["x"])
        bus.store(2, "b", handles: ["y"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        _ = bus.take(1); _ = bus.take(2)
        bus.send(1, #"{"op":"done","store":"a","seq":2}"#)
        #expect(bus.take(1).map { $0.str("code") } == ["bad-message"])
        bus.send(2, #"{"op":"done","store":"a","seq":1}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["forbidden"])
        bus.send(1, #"{"op":"done","store":"a","seq":1}"#)
        bus.send(1, #"{"op":"done","store":"a","seq":2}"#)
        #expect(bus.take(1).isEmpty)
    }

    @Test func globalOrderAcrossClientsAndWindow() {
        let bus = TestBus { $0.storeWindow = 3 }
        bus.store(1, "log", handles: ["*"])
        _ = bus.take(1)
        for c in 10..<18 { bus.join(PeerID(c), role: "client") }
        for round in 0..<5 {
            for c in 10..<18 { bus.send(PeerID(c), #"{"op":"dispatch","type":"t/\#(round)"}"#) }
        }
        var delivered: [Int64] = []
        while true {
            let got = bus.take(1)
            if got.isEmpty { break }
            #expect(got.count <= 3, "window respected")
            for a in got {
                delivered.append(a.num("seq")!)
                bus.send(1, #"{"op":"done","store":"log","seq":\#(a.num("seq")!)}"#)
            }
        }
        #expect(delivered == Array(1...40))
    }

    @Test func followUpCarriesCause() {
        let bus = TestBus()
        bus.store(1, "comments", handles: ["comments/*"])
        _ = bus.take(1)
        bus.send(1, #"{"op":"dispatch","type":"comments/loaded","cause":7}"#)
        let got = bus.take(1)
        #expect(got.first?.num("cause") == 7)
        #expect(got.first?.num("origin") == 1)
    }

    @Test func maxPendingOverloads() {
        let bus = TestBus { $0.maxPending = 2 }
        bus.store(1, "a", handles: ["x"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        bus.send(9, #"{"op":"dispatch","id":"third","type":"x"}"#)
        let got = bus.take(9)
        #expect(got.map { $0.str("code") } == ["overloaded"])
        #expect(got.first?.str("ref") == "third")
        bus.send(1, #"{"op":"done","store":"a","seq":1}"#)
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        #expect(bus.take(9).isEmpty)
    }
}

@Suite("Snapshots")
struct SnapshotTests {
    @Test func versionsAreAssignedAndUnchangedStateIsNotResent() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc", "noop", "same"], state: #"{"n":0}"#)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"c"}"#)
        let first = bus.take(2)
        #expect(first.map(\.op) == ["subscribed", "snapshot"])
        #expect(first[0].str("status") == "up")
        #expect(first[1].num("version") == 1)
        #expect(first[1].rawText("state") == #"{"n":0}"#)
        bus.send(2, #"{"op":"dispatch","id":"1","type":"inc","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"c","seq":1,"state":{"n":1}}"#)
        let second = bus.take(2)
        #expect(second.map(\.op) == ["snapshot", "settled"], "read your writes: snapshot before settlement")
        #expect(second[0].num("version") == 2)
        #expect(second[0].num("seq") == 1)
        bus.send(2, #"{"op":"dispatch","id":"2","type":"same","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"c","seq":2,"state":{"n":1}}"#)
        let third = bus.take(2)
        #expect(third.map(\.op) == ["settled"], "byte-identical state is not a new version")
        #expect(third[0].rawText("results") == #"[{"store":"c","status":"done","version":2}]"#)
        bus.send(2, #"{"op":"dispatch","id":"3","type":"noop","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"c","seq":3}"#)
        #expect(bus.ops(2) == ["settled"])
    }

    @Test func retainedSnapshotOnSubscribeAndGet() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc"], state: #"{"n":0}"#)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","type":"inc"}"#)
        bus.send(1, #"{"op":"done","store":"c","seq":1,"state":{"n":1}}"#)
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"c"}"#)
        let got = bus.take(3)
        #expect(got.map(\.op) == ["subscribed", "snapshot"])
        #expect(got[1].rawText("state") == #"{"n":1}"#)
        #expect(got[1].num("version") == 2)
        bus.send(3, #"{"op":"get","id":"g","store":"c"}"#)
        let g = bus.take(3)
        #expect(g.first?.op == "got")
        #expect(g.first?.rawText("state") == #"{"n":1}"#)
        #expect(g.first?.num("seq") == 1)
        bus.send(3, #"{"op":"get","id":"g2","store":"nope"}"#)
        #expect(bus.take(3).map { $0.str("code") } == ["unknown-store"])
    }

    @Test func sameSnapshotBytesGoToEverySubscriber() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc"])
        for p in 10..<13 { bus.join(PeerID(p), role: "client"); bus.send(PeerID(p), #"{"op":"subscribe","store":"c"}"#) }
        var frames: [Frame] = []
        bus.send(10, #"{"op":"dispatch","type":"inc"}"#)
        for effect in bus.router.handle(.frame(1, Array(#"{"op":"done","store":"c","seq":1,"state":{"n":1}}"#.utf8)), now: 0) {
            if case .send(_, let f) = effect { frames.append(f) }
        }
        #expect(frames.count == 3)
        #expect(frames.allSatisfy { $0.bytes.baseAddress == frames[0].bytes.baseAddress }, "one frame, encoded once: the same bytes")
    }

    @Test func subscribeBeforeTheStoreExists() {
        let bus = TestBus()
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"later"}"#)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["subscribed"])
        #expect(got[0].str("status") == "unknown")
        #expect(got[0].num("version") == 0)
        bus.store(1, "later", handles: ["x"], state: #"{"ready":true}"#)
        let after = bus.take(2)
        #expect(after.map(\.op) == ["store-up", "snapshot"])
        #expect(after[0].num("version") == 1)
    }

    @Test func unsolicitedStateIsPublished() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["x"], state: #"{"loading":false}"#)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"c"}"#)
        _ = bus.take(2)
        bus.send(1, #"{"op":"state","store":"c","state":{"loading":true}}"#)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["snapshot"])
        #expect(got[0].num("version") == 2)
        bus.send(2, #"{"op":"state","store":"c","state":{}}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["forbidden"])
    }

    @Test func unsubscribeStopsSnapshots() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["x"], state: "0")
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"c"}"#)
        bus.send(2, #"{"op":"unsubscribe","store":"c"}"#)
        #expect(bus.ops(2) == ["subscribed", "snapshot", "unsubscribed"])
        bus.send(2, #"{"op":"dispatch","type":"x"}"#)
        bus.send(1, #"{"op":"done","store":"c","seq":1,"state":1}"#)
        #expect(bus.ops(2).isEmpty)
    }
}

@Suite("waitFor")
struct WaitForTests {
    @Test func waitingStoreGetsTheActionAfterTheOtherAnsweredAndSeesItsSnapshotFirst() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"todos":[]}"#)
        bus.store(2, "stats", handles: ["todo/*"], waitFor: ["todos"], state: #"{"count":0}"#)
        bus.send(2, #"{"op":"subscribe","store":"todos"}"#)
        _ = bus.take(1); _ = bus.take(2)
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","id":"d","type":"todo/add","settle":true}"#)
        #expect(bus.ops(1) == ["action"])
        #expect(bus.take(2).isEmpty, "stats waits for todos")
        bus.send(1, #"{"op":"done","store":"todos","seq":1,"state":{"todos":["milk"]}}"#)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["snapshot", "action"], "todos' new snapshot reaches stats before the action")
        #expect(got[0].num("seq") == 1)
        bus.send(2, #"{"op":"done","store":"stats","seq":1,"state":{"count":1}}"#)
        #expect(bus.ops(9) == ["settled"])
    }

    @Test func waitForOnlyOrdersActionsBothHandle() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.store(2, "stats", handles: ["todo/*", "stats/reset"], waitFor: ["todos"])
        _ = bus.take(1); _ = bus.take(2)
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","type":"stats/reset"}"#)
        #expect(bus.ops(2) == ["action"])
    }

    @Test func cyclesAreRefused() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["x"], waitFor: ["b"])
        bus.store(2, "b", handles: ["x"], waitFor: ["c"])
        _ = bus.take(2)
        bus.register(2, "c", handles: ["x"], waitFor: ["a"])
        let got = bus.take(2)
        #expect(got.map { $0.str("code") } == ["cycle"])
        #expect(got.first?.str("message")?.contains("c -> a -> b -> c") == true)
        bus.register(2, "self", handles: ["x"], waitFor: ["self"])  // a store waiting for itself (SPEC §8.2)
        #expect(bus.take(2).map { $0.str("code") } == ["cycle"])
    }
}

@Suite("Queries")
struct QueryTests {
    @Test func storeIsToldTheDeduplicatedSetOnEveryChange() {
        let bus = TestBus()
        bus.store(1, "comments", handles: ["comments/*"])
        _ = bus.take(1)
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        bus.send(2, #"{"op":"query","id":"q1","store":"comments","query":{"site":7}}"#)
        #expect(bus.ops(2) == ["query-ok"])
        #expect(bus.take(1).map { $0.rawText("queries") } == [#"[{"query":{"site":7},"count":1}]"#])
        bus.send(3, #"{"op":"query","id":"q1","store":"comments","query":{"site":7}}"#)
        bus.send(3, #"{"op":"query","id":"q2","store":"comments","query":{"site":8}}"#)
        #expect(bus.take(1).last?.rawText("queries") == #"[{"query":{"site":7},"count":2},{"query":{"site":8},"count":1}]"#)
        bus.send(2, #"{"op":"unquery","id":"q1"}"#)
        #expect(bus.ops(2) == ["unquery-ok"])
        #expect(bus.take(1).last?.rawText("queries") == #"[{"query":{"site":7},"count":1},{"query":{"site":8},"count":1}]"#)
        bus.disconnect(3)
        #expect(bus.take(1).last?.rawText("queries") == "[]", "a client's queries end when it disconnects")
    }

    @Test func querySetIsSortedByBytes() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["c/*"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"query","id":"1","store":"c","query":{"site":9}}"#)
        bus.send(2, #"{"op":"query","id":"2","store":"c","query":{"site":10}}"#)
        bus.send(2, #"{"op":"query","id":"3","store":"c","query":{"site":2}}"#)
        #expect(bus.take(1).last?.rawText("queries") == #"[{"query":{"site":10},"count":1},{"query":{"site":2},"count":1},{"query":{"site":9},"count":1}]"#)
    }

    @Test func queryIdsAreCheckedAndQueriesReachALateStore() {
        let bus = TestBus()
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"query","id":"q","store":"comments","query":{"site":1}}"#)
        bus.send(2, #"{"op":"query","id":"q","store":"comments","query":{"site":2}}"#)
        #expect(bus.take(2).map { $0.str("code") ?? $0.op } == ["query-ok", "bad-message"])
        bus.send(2, #"{"op":"unquery","id":"zzz"}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["bad-message"])
        bus.store(1, "comments", handles: ["comments/*"])
        let got = bus.take(1)
        #expect(got.map(\.op) == ["registered", "queries"])
        #expect(got.last?.rawText("queries") == #"[{"query":{"site":1},"count":1}]"#)
    }
}

@Suite("Store down and up")
struct StoreLifecycleTests {
    @Test func downNoticeRedeliveryAndResume() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"n":0}"#)
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"subscribe","store":"todos"}"#)
        bus.send(9, #"{"op":"dispatch","id":"a","type":"todo/add","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":1,"state":{"n":1}}"#)
        bus.send(9, #"{"op":"dispatch","id":"b","type":"todo/add","settle":true}"#)
        _ = bus.take(1); _ = bus.take(9)
        // The worker dies with action 2 unanswered; action 3 arrives while it is down.
        bus.disconnect(1)
        let down = bus.take(9)
        #expect(down.map(\.op) == ["store-down"])
        #expect(down[0].str("reason") == "disconnected")
        bus.send(9, #"{"op":"dispatch","id":"c","type":"todo/add","settle":true}"#)
        #expect(bus.take(9).isEmpty)
        // A new worker registers under the name: it resumes from the retained snapshot, then gets 2 and 3.
        bus.join(2, role: "store")
        bus.register(2, "todos", handles: ["todo/*"], state: #"{"n":0}"#)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["registered", "snapshot", "queries", "action", "action"])
        #expect(got[0].bool("resumed").value == true)
        #expect(got[0].num("version") == 2)
        #expect(got[1].rawText("state") == #"{"n":1}"#)
        #expect(got[3].num("seq") == 2)
        #expect(got[3].bool("redelivered").value == true)
        #expect(got[4].num("seq") == 3)
        #expect(got[4].has("redelivered") == false)
        #expect(bus.ops(9) == ["store-up"])
        bus.send(2, #"{"op":"done","store":"todos","seq":2,"state":{"n":2}}"#)
        bus.send(2, #"{"op":"done","store":"todos","seq":3,"state":{"n":3}}"#)
        let end = bus.take(9)
        #expect(end.map(\.op) == ["snapshot", "settled", "snapshot", "settled"])
        #expect(end[3].rawText("results") == #"[{"store":"todos","status":"done","version":4}]"#)
    }

    @Test func nameIsTakenOnlyWhileTheOwnerLives() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "store")
        bus.register(2, "todos", handles: ["todo/*"])
        #expect(bus.take(2).map { $0.str("code") } == ["name-taken"])
        bus.disconnect(1)
        bus.register(2, "todos", handles: ["todo/*"])
        #expect(bus.ops(2) == ["registered", "queries"])
    }

    @Test func queuedActionsExpireAsStoreUnavailable() {
        let bus = TestBus { $0.queueTimeout = 500 }
        bus.store(1, "todos", handles: ["todo/*"])
        bus.store(2, "other", handles: ["todo/*"])
        bus.join(9, role: "client")
        bus.disconnect(1)
        bus.send(9, #"{"op":"dispatch","id":"a","type":"todo/add","settle":true}"#)
        bus.send(2, #"{"op":"done","store":"other","seq":1}"#)
        #expect(bus.take(9).isEmpty)
        #expect(bus.router.nextDeadline == bus.now + 500)
        bus.advance(499)
        #expect(bus.take(9).isEmpty)
        bus.advance(1)
        let got = bus.take(9)
        #expect(got.map(\.op) == ["settled"])
        #expect(got[0].rawText("results")?.contains(#"{"store":"todos","status":"unavailable","error":{"code":"store-unavailable""#) == true)
        #expect(got[0].rawText("results")?.contains(#"{"store":"other","status":"done""#) == true)
    }

    @Test func fullQueueOfADownStoreIsUnavailableAtOnce() {
        let bus = TestBus { $0.queueLimit = 2 }
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(9, role: "client")
        bus.disconnect(1)
        for i in 1...3 { bus.send(9, #"{"op":"dispatch","id":"\#(i)","type":"todo/add","settle":true}"#) }
        let got = bus.take(9)
        #expect(got.map(\.op) == ["settled"])
        #expect(got[0].str("id") == "3")
        #expect(got[0].rawText("results")?.contains("unavailable") == true)
    }

    @Test func fullQueueOfALiveStoreRefusesTheDispatch() {
        let bus = TestBus { $0.queueLimit = 1; $0.storeWindow = 1; $0.fairPending = 0 }
        bus.store(1, "slow", handles: ["x"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        bus.send(9, #"{"op":"dispatch","type":"x"}"#)
        bus.send(9, #"{"op":"dispatch","id":"3","type":"x"}"#)
        #expect(bus.take(9).map { $0.str("code") } == ["overloaded"])
    }

    @Test func unregisterTakesTheStoreDown() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"subscribe","store":"todos"}"#)
        _ = bus.take(9)
        bus.send(1, #"{"op":"unregister","store":"todos"}"#)
        let got = bus.take(9)
        #expect(got.map(\.op) == ["store-down"])
        #expect(got[0].str("reason") == "unregistered")
    }
}

@Suite("Introspection and shutdown")
struct IntrospectionTests {
    @Test func infoDescribesStoresPeersAndCounters() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: "{}")
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"todos"}"#)
        bus.send(2, "{oops")
        _ = bus.take(2)
        bus.send(2, #"{"op":"info","id":"i"}"#)
        let info = bus.take(2)[0]
        #expect(info.op == "info")
        #expect(info.str("id") == "i")
        let stores = info.rawText("stores")!
        #expect(stores.contains(#""name":"todos","status":"up","handles":["todo/*"],"waitFor":[],"version":1"#))
        #expect(stores.contains(#""subscribers":1"#))
        #expect(stores.contains(#""owner":{"peer":1,"name":"todos-worker","pid":1,"uid":1000}"#))
        #expect(info.rawText("peers") == #"{"client":1,"store":1,"monitor":0}"#)
        #expect(info.rawText("counters")?.contains(#""errors":{"bad-json":1}"#) == true)
    }

    @Test func pingPong() {
        let bus = TestBus()
        bus.join(2, role: "monitor")
        bus.send(2, #"{"op":"ping","id":"p-1"}"#)
        #expect(bus.take(2).first?.str("id") == "p-1")
    }

    @Test func shutdownSaysByeAndClosesEveryone() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "client")
        bus.connect(3)
        bus.send(2, #"{"op":"subscribe","store":"todos"}"#)
        bus.send(2, #"{"op":"dispatch","id":"late","type":"todo/add","settle":true}"#)
        _ = bus.take(2)
        bus.feed(.shutdown)
        let client = bus.take(2)
        #expect(client.map(\.op) == ["settled", "store-down", "bye"])
        #expect(client[0].rawText("results")?.contains(#""status":"unavailable","error":{"code":"shutting-down""#) == true)
        #expect(client[1].str("reason") == "shutdown")
        for p: PeerID in [1, 3] {
            let got = bus.take(p)
            #expect(got.last?.op == "bye")
            #expect(got.last?.str("reason") == "shutdown")
        }
        #expect(bus.router.isIdle)
    }

    /// Shutdown settles every unsettled action, in seq order, wherever it waits: partly answered (one of two
    /// targets done), in a live store's window, or queued for a store that is down (fluxd finds them in the
    /// stores' queues and windows).
    @Test func shutdownSettlesEveryUnsettledActionInSeqOrder() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["x/*"])
        bus.store(4, "b", handles: ["x/*", "y/*"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"d1","type":"x/1","settle":true}"#)
        bus.send(2, #"{"op":"dispatch","id":"d2","type":"y/1","settle":true}"#)
        bus.send(2, #"{"op":"dispatch","id":"d3","type":"x/2","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"a","seq":1}"#)
        bus.feed(.closed(4))  // b is down: its three actions go back to its queue
        _ = bus.take(2)
        #expect(bus.router.pendingActionCount == 3)
        bus.feed(.shutdown)
        let settled = bus.take(2).filter { $0.op == "settled" }
        #expect(settled.map { $0.str("id") } == ["d1", "d2", "d3"])
        #expect(settled.map { $0.num("seq") } == [1, 2, 3])
        let first = settled.first?.rawText("results") ?? ""
        #expect(first.contains(#"{"store":"a","status":"done""#))
        #expect(first.contains(#"{"store":"b","status":"unavailable","error":{"code":"shutting-down""#))
        #expect(bus.router.pendingActionCount == 0)
    }

    /// An action queued for a store that is down, settled by shutdown, is not settled again when its queue
    /// timeout passes afterwards (found by the router fuzz target: pendingActionCount went to -1).
    @Test func shutdownSettlesAQueuedActionOnlyOnce() {
        let bus = TestBus { $0.queueTimeout = 100 }
        bus.store(1, "a", handles: ["x/*"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"d1","type":"x/1","settle":true}"#)
        bus.feed(.closed(1))  // a is down: the action waits in its queue
        _ = bus.take(2)
        bus.feed(.shutdown)
        #expect(bus.take(2).filter { $0.op == "settled" }.count == 1)
        #expect(bus.router.pendingActionCount == 0)
        bus.now += 1_000
        bus.feed(.tick)
        #expect(bus.router.pendingActionCount == 0)
        #expect(bus.router.nextDeadline == nil)
    }

    @Test func byeClosesTheConnection() {
        let bus = TestBus()
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"bye"}"#)
        #expect(bus.closedPeers.contains(2))
        #expect(bus.router.isIdle)
    }
}

@Suite("Monitor, host ops and drain")
struct MonitorHostDrainTests {
    /// The monitor effects of one event, decoded.
    func monitorEvents(_ bus: TestBus, _ event: RouterEvent) -> [Envelope] {
        var events: [Envelope] = []
        for effect in bus.router.handle(event, now: bus.now) {
            if case .monitor(_, let frame) = effect { events.append(try! Envelope(body: frame.bodyArray)) }
        }
        return events
    }

    @Test func monitorSeesConnectsDispatchesSnapshotsSettlementsAndErrors() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc"], state: #"{"n":0}"#)
        bus.join(5, role: "monitor", name: "tap")
        bus.connect(2)
        let connect = monitorEvents(bus, .frame(2, Array(#"{"op":"hello","protocol":1,"role":"client","name":"view"}"#.utf8)))
        #expect(connect.map { $0.str("kind") } == ["connect"])
        #expect(connect.first?.num("peer") == 2)
        #expect(connect.first?.str("name") == "view")
        let dispatch = monitorEvents(bus, .frame(2, Array(#"{"op":"dispatch","id":"d","type":"inc","payload":{"by":2},"settle":true}"#.utf8)))
        #expect(dispatch.map { $0.str("kind") } == ["dispatch"])
        #expect(dispatch.first?.num("seq") == 1)
        #expect(dispatch.first?.rawText("payload") == #"{"by":2}"#)
        #expect(dispatch.first?.str("originName") == "view")
        let done = monitorEvents(bus, .frame(1, Array(#"{"op":"done","store":"c","seq":1,"state":{"n":2}}"#.utf8)))
        #expect(done.map { $0.str("kind") } == ["snapshot", "settle"])
        #expect(done.first?.rawText("state") == #"{"n":2}"#)
        #expect(done.last?.rawText("results") == #"[{"store":"c","status":"done","version":2}]"#)
        let error = monitorEvents(bus, .frame(2, Array("{nope".utf8)))
        #expect(error.map { $0.str("kind") } == ["error"])
        #expect(error.first?.str("code") == "bad-json")
        let gone = monitorEvents(bus, .closed(1))
        #expect(gone.map { $0.str("kind") } == ["disconnect", "store-down"] || gone.map { $0.str("kind") } == ["store-down", "disconnect"])
    }

    @Test func noMonitorNoEventWork() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc"])
        bus.join(2, role: "client")
        let effects = bus.router.handle(.frame(2, Array(#"{"op":"dispatch","type":"inc"}"#.utf8)), now: bus.now)
        #expect(!effects.contains { if case .monitor = $0 { return true } else { return false } })
    }

    @Test func hostOpsGoToTheHostAfterHandshake() {
        var config = RouterConfig()
        config.hostOps = [.workers]
        let router = Router(config: config)
        _ = router.handle(.connected(1, PeerCredentials()), now: 0)
        let before = router.handle(.frame(1, Array(#"{"op":"workers","id":"w"}"#.utf8)), now: 0)
        #expect(!before.contains { if case .host = $0 { return true } else { return false } }, "not before hello")
        let bus = TestBus { $0.hostOps = [.workers] }
        bus.join(2, role: "client")
        let effects = bus.router.handle(.frame(2, Array(#"{"op":"workers","id":"w"}"#.utf8)), now: bus.now)
        guard case .host(let peer, let request)? = effects.first else { Issue.record("no host effect: \(effects)"); return }
        #expect(peer == 2)
        #expect(request == .workers(id: "w"))
        bus.send(2, #"{"op":"teleport"}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["unknown-op"])
    }

    @Test func drainRefusesNewDispatchesButLetsInFlightSettle() {
        let bus = TestBus()
        bus.store(1, "c", handles: ["inc"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"a","type":"inc","settle":true}"#)
        #expect(bus.router.pendingActionCount == 1)
        bus.feed(.drain)
        bus.send(2, #"{"op":"dispatch","id":"b","type":"inc","settle":true}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["shutting-down"])
        _ = bus.take(1)
        bus.send(1, #"{"op":"done","store":"c","seq":1}"#)
        #expect(bus.ops(2) == ["settled"])
        #expect(bus.router.pendingActionCount == 0)
    }

    @Test func storeStatusForTheHost() {
        let bus = TestBus()
        #expect(bus.router.storeStatus("c").status == "unknown")
        bus.store(1, "c", handles: ["inc"], state: "{}")
        let up = bus.router.storeStatus("c")
        #expect(up.status == "up")
        #expect(up.owner == 1)
        #expect(up.ownerPID == 1)
        #expect(up.version == 1)
        bus.disconnect(1)
        #expect(bus.router.storeStatus("c").status == "down")
    }
}

@Suite("Backpressure: newest wins and slow consumers")
struct BackpressureTests {
    /// Snapshots are marked so a backlogged connection keeps only the newest per store; the frames that change
    /// what a subscription means fence them, with the same per-store key.
    @Test func snapshotsAreNewestWinsAndSubscriptionNoticesFenceThem() {
        let bus = TestBus()
        bus.store(1, "a", handles: ["inc"], state: #"{"n":0}"#)
        bus.store(3, "b", handles: ["inc"], state: #"{"m":0}"#)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"a"}"#)
        bus.send(2, #"{"op":"subscribe","store":"b"}"#)
        bus.send(2, #"{"op":"dispatch","id":"x","type":"inc","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"a","seq":1,"state":{"n":1}}"#)
        bus.send(3, #"{"op":"done","store":"b","seq":1,"state":{"m":1}}"#)
        bus.disconnect(1)
        bus.store(4, "a", handles: ["inc"])
        bus.send(2, #"{"op":"unsubscribe","store":"a"}"#)
        let marks = Array(bus.marks[2]!.dropFirst())  // after the welcome
        #expect(marks.map(\.op) == ["subscribed", "snapshot", "subscribed", "snapshot", "snapshot", "snapshot",
                                    "settled", "store-down", "store-up", "unsubscribed"])
        guard case .fence(let a) = marks[0].coalescing, case .fence(let b) = marks[2].coalescing else {
            Issue.record("subscribed must fence: \(marks)")
            return
        }
        #expect(a != b, "each store has its own key")
        #expect(marks[1].coalescing == .newestWins(key: a))
        #expect(marks[3].coalescing == .newestWins(key: b))
        #expect(marks[4].coalescing == .newestWins(key: a))
        #expect(marks[5].coalescing == .newestWins(key: b))
        #expect(marks[6].coalescing == .none, "a settlement is never dropped")
        #expect(marks[7].coalescing == .fence(key: a))
        #expect(marks[8].coalescing == .fence(key: a))
        #expect(marks[9].coalescing == .fence(key: a))
    }

    @Test func backloggedPeerGetsSlowConsumerAndIsClosedOthersAreNot() {
        let bus = TestBus { $0.maxBacklog = 1 << 20 }
        bus.store(1, "a", handles: ["inc"], state: #"{"n":0}"#)
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        _ = bus.take(1)
        bus.send(2, #"{"op":"dispatch","id":"x","type":"inc","settle":true}"#)
        bus.feed(.backlogged(2))
        let got = bus.take(2)
        #expect(got.map(\.op) == ["error"])
        #expect(got[0].str("code") == "slow-consumer")
        #expect(got[0].bool("fatal").value == true)
        #expect(got[0].raw("ref") == nil, "not about any one message")
        #expect(got[0].str("message")?.contains("1048576") == true)
        #expect(bus.closedPeers == [2])
        // The action dispatched by the closed peer still completes; the store and the other client carry on.
        bus.send(1, #"{"op":"done","store":"a","seq":1,"state":{"n":1}}"#)
        bus.send(3, #"{"op":"dispatch","id":"y","type":"inc","settle":true}"#)
        #expect(bus.ops(1) == ["action", "action"])
        bus.send(1, #"{"op":"done","store":"a","seq":2,"state":{"n":2}}"#)
        #expect(bus.ops(3) == ["settled"])
        #expect(bus.router.counters.errors["slow-consumer"] == 1)
        // Reported for a peer already gone: nothing happens.
        bus.feed(.backlogged(2))
        #expect(bus.take(2).isEmpty)
    }

    @Test func welcomeAnnouncesMaxBacklog() {
        let bus = TestBus { $0.maxBacklog = 5_000_000 }
        bus.connect(5)
        bus.send(5, #"{"op":"hello","protocol":1,"role":"client"}"#)
        let limits = try! Envelope(body: Array(bus.take(5)[0].raw("limits")!))
        #expect(limits.num("maxBacklog") == 5_000_000)
    }
}

@Suite("Effect sink")
struct EffectSinkTests {
    /// Records what a sink is given, in the same words as an effect array.
    final class Recorder: RouterEffectSink {
        var lines: [String] = []
        func send(_ frame: Frame, to peer: PeerID) { lines.append(EffectSinkTests.describe(.send(peer, frame))) }
        func perform(_ effect: RouterEffect) { lines.append(EffectSinkTests.describe(effect)) }
        func isBehind(_ peer: PeerID) -> Bool { false }
    }

    static func describe(_ effect: RouterEffect) -> String {
        switch effect {
        case .send(let peer, let frame): return "send \(peer) \(frame.text) \(frame.coalescing)"
        case .monitor(let peer, let frame): return "monitor \(peer) \(frame.text)"
        case .host(let peer, let request): return "host \(peer) \(request)"
        case .storeChanged(let change): return "storeChanged \(change)"
        case .close(let peer): return "close \(peer)"
        case .log(let level, let message): return "log \(level) \(message)"
        case .stalled(let store, let pid, let closing): return "stalled \(store) \(pid.map { "\($0)" } ?? "-") \(closing)"
        case .deferred: return "deferred"
        case .prepare(let peer, let preparation): return "prepare \(peer) #\(preparation.number) \(preparation.inputBytes) bytes"
        case .discard(let garbage): return "discard \(garbage.count)"
        }
    }

    /// fluxd's daemon takes effects through a sink as the router produces them; tests read them from an array.
    /// Both must be the same effects in the same order, with the same traffic counted, for every kind of effect.
    @Test func sinkGetsTheSameEffectsInTheSameOrderAsTheArray() {
        var config = RouterConfig()
        config.hostOps = [.workers]
        let viaArray = Router(config: config)
        let viaSink = Router(config: config)
        let recorder = Recorder()
        var fromArray: [String] = []
        var now: Millis = 1_000
        func feed(_ event: RouterEvent) {
            now += 1
            fromArray += viaArray.handle(event, now: now).map(EffectSinkTests.describe)
            viaSink.handle(event, now: now, sink: recorder)
        }
        func frame(_ peer: PeerID, _ json: String) { feed(.frame(peer, Array(json.utf8))) }
        for peer: PeerID in 1...4 { feed(.connected(peer, PeerCredentials(pid: Int32(peer), uid: 1000))) }
        frame(1, #"{"op":"hello","protocol":1,"role":"store","name":"w"}"#)
        frame(1, #"{"op":"register","store":"s","handles":["t/*"],"state":{"n":0}}"#)
        frame(2, #"{"op":"hello","protocol":1,"role":"client","name":"view"}"#)
        frame(3, #"{"op":"hello","protocol":1,"role":"monitor","name":"mon"}"#)
        frame(2, #"{"op":"subscribe","store":"s"}"#)
        frame(2, #"{"op":"dispatch","id":"a","type":"t/x","payload":{"k":1},"settle":true}"#)
        frame(2, #"{"op":"dispatch","type":"t/x","payload":{"k":2}}"#)
        frame(1, #"{"op":"done","store":"s","seq":1,"state":{"n":1}}"#)
        frame(1, #"{"op":"done","store":"s","seq":2,"state":{"n":1}}"#)
        frame(2, #"{"op":"workers","id":"w"}"#)
        frame(2, #"{"op":"dispatch","type":"nobody/x"}"#)
        frame(2, #"{"op":"dispatch""#)
        feed(.emptyFrame(2))
        frame(4, #"{"op":"dispatch"}"#)
        feed(.closed(1))
        feed(.shutdown)
        #expect(fromArray.count > 20)
        for kind in ["send", "monitor", "host", "close", "log"] {
            #expect(fromArray.contains { $0.hasPrefix(kind + " ") }, "no \(kind) effect exercised")
        }
        #expect(recorder.lines == fromArray)
        #expect(viaSink.counters.traffic.framesOut == viaArray.counters.traffic.framesOut)
        #expect(viaSink.counters.traffic.bytesOut == viaArray.counters.traffic.bytesOut)
        #expect(viaSink.counters.traffic.framesIn == viaArray.counters.traffic.framesIn)
    }

    @Test("forget (SPEC §10): only a store that is down; its queue settles store-unavailable, subscribers get store-down forgotten and stay subscribed, it no longer routes, and a store of the name made later starts above the version floor")
    func forgetAStoreThatIsDown() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"items":[]}"#)
        bus.send(1, #"{"op":"state","store":"todos","state":{"items":[1]}}"#)  // version 2
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"todos"}"#)
        bus.join(3, role: "client", name: "ops")
        _ = bus.take(1); _ = bus.take(2)
        bus.send(3, #"{"op":"forget","id":"f0","store":"todos"}"#)
        let up = bus.take(3)
        #expect(up.map { $0.str("code") } == ["store-is-up"] && up[0].str("ref") == "f0")
        bus.disconnect(1)
        #expect(bus.take(2).map { $0.str("reason") } == ["disconnected"])
        bus.send(2, #"{"op":"dispatch","id":"d1","type":"todo/add","settle":true}"#)  // queued for the down store
        #expect(bus.take(2).isEmpty)
        bus.send(3, #"{"op":"forget","id":"f1","store":"todos"}"#)
        let forgotten = bus.take(3)
        #expect(forgotten.map(\.op) == ["forgotten"])
        #expect(forgotten.first?.str("store") == "todos" && forgotten.first?.num("gaveUp") == 1 && forgotten.first?.str("id") == "f1")
        let told = bus.take(2)
        #expect(told.map(\.op) == ["settled", "store-down"])
        #expect(told.first?.rawText("results")?.contains(#""status":"unavailable","error":{"code":"store-unavailable""#) == true)
        #expect(told.last?.str("reason") == "forgotten")
        // Nothing routes to it any more; forgetting it again finds nothing.
        bus.send(2, #"{"op":"dispatch","id":"d2","type":"todo/add","settle":true}"#)
        #expect(bus.take(2).map { $0.str("code") } == ["no-handler"])
        bus.send(3, #"{"op":"forget","id":"f2","store":"todos"}"#)
        #expect(bus.take(3).map { $0.str("code") } == ["unknown-store"])
        bus.send(3, #"{"op":"get","id":"g","store":"todos"}"#)
        #expect(bus.take(3).first?.str("status") != "down")
        // A new store of the name: a new registration (not resumed), versions above the forgotten one's 2; the
        // subscriber, still subscribed, sees it come up and its first state.
        bus.store(4, "todos", handles: ["todo/*"], state: #"{"items":["new"]}"#)
        let registered = bus.take(4)
        #expect(registered.first?.op == "registered")
        #expect(registered.first?.num("version") == 3 && registered.first?.rawText("resumed") == "false")
        let seen = bus.take(2)
        #expect(seen.map(\.op) == ["store-up", "snapshot"])
        #expect(seen.last?.num("version") == 3)
        // A request without an id or store is a bad message.
        bus.send(3, #"{"op":"forget","store":"todos"}"#)
        #expect(bus.take(3).map { $0.str("code") } == ["bad-message"])
    }

}
