import FluxCore
@testable import FluxRouter
import Testing

/// Issue 13's limits, one rule at a time, through the router alone (the attack suite in IntegrationTests drives
/// the same rules through a real fluxd).
@Suite("Isolation limits")
struct IsolationLimitTests {
    /// `aN` and `bN` each wait for `a(N-1)` and `b(N-1)`: a naive path walk doubles its work per layer; the
    /// visited set keeps the check linear in stores + edges.
    @Test func cycleCheckVisitsEachStoreAndEdgeOnce() {
        let layers = 40
        let bus = TestBus()
        bus.join(1, role: "store")
        bus.register(1, "a0", handles: ["x/a"])
        bus.register(1, "b0", handles: ["x/b"])
        for n in 1..<layers {
            bus.register(1, "a\(n)", handles: [], waitFor: ["a\(n - 1)", "b\(n - 1)"])
            bus.register(1, "b\(n)", handles: [], waitFor: ["a\(n - 1)", "b\(n - 1)"])
        }
        #expect(bus.take(1).filter { $0.op == "error" }.isEmpty)
        let storeCount = 2 * layers
        let edgeCount = 4 * (layers - 1)
        bus.register(1, "top", handles: [], waitFor: ["a\(layers - 1)", "b\(layers - 1)"])
        #expect(bus.router.maxCycleCheckSteps <= storeCount + edgeCount + 2)
        #expect(bus.router.maxCycleCheckSteps >= storeCount)  // it did walk the whole graph
        // A real cycle is still found, with its path.
        _ = bus.take(1)
        bus.send(1, #"{"op":"unregister","store":"a0"}"#)
        bus.register(1, "a0", handles: ["x/a"], waitFor: ["top"])
        let got = bus.take(1).filter { $0.op == "error" }
        #expect(got.map { $0.str("code") } == ["cycle"])
        #expect(got.first?.str("message")?.contains("a0 -> top -> a") == true)
    }

    @Test func waitForListIsBounded() {
        let bus = TestBus { $0.maxWaitFor = 3 }
        bus.join(1, role: "store")
        bus.register(1, "s", handles: ["x"], waitFor: ["a", "b", "c", "d"])
        #expect(bus.take(1).map { $0.str("code") } == ["limit-exceeded"])
        bus.register(1, "s", handles: ["x"], waitFor: ["a", "b", "c"])
        #expect(bus.ops(1).first == "registered")
    }

    @Test func liveQueriesAreLimitedInCountAndBytes() {
        let bus = TestBus { $0.maxQueries = 2; $0.maxQueryBytes = 40 }
        bus.join(1, role: "client")
        bus.send(1, #"{"op":"query","id":"q1","store":"s","query":{"site":1}}"#)
        bus.send(1, #"{"op":"query","id":"q2","store":"s","query":{"site":2}}"#)
        bus.send(1, #"{"op":"query","id":"q3","store":"s","query":{"site":3}}"#)
        var got = bus.take(1)
        #expect(got.map(\.op) == ["query-ok", "query-ok", "error"])
        #expect(got.last?.str("code") == "limit-exceeded")
        #expect(got.last?.str("ref") == "q3")
        #expect(bus.router.counters.errors["limit-exceeded"] == 1)
        // Releasing one makes room again; bytes are counted too.
        bus.send(1, #"{"op":"unquery","id":"q1"}"#)
        bus.send(1, #"{"op":"query","id":"q4","store":"s","query":{"site":"a string long enough to pass forty bytes"}}"#)
        got = bus.take(1)
        #expect(got.map(\.op) == ["unquery-ok", "error"])
        #expect(got.last?.str("code") == "limit-exceeded")
        #expect(got.last?.str("message")?.contains("maxQueryBytes") == true)
        // Another connection has limits of its own.
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"query","id":"q1","store":"s","query":{"site":9}}"#)
        #expect(bus.ops(2) == ["query-ok"])
    }

    @Test func subscriptionsAreLimited() {
        let bus = TestBus { $0.maxSubscriptions = 2 }
        bus.join(1, role: "client")
        for name in ["a", "b", "a", "c"] { bus.send(1, #"{"op":"subscribe","store":"\#(name)"}"#) }
        let got = bus.take(1)
        #expect(got.map(\.op) == ["subscribed", "subscribed", "subscribed", "error"])  // "a" twice is one
        #expect(got.last?.str("code") == "limit-exceeded")
        bus.send(1, #"{"op":"unsubscribe","store":"a"}"#)
        bus.send(1, #"{"op":"subscribe","store":"c"}"#)
        #expect(bus.ops(1) == ["unsubscribed", "subscribed"])
    }

    /// A store that asked for deltas gets each change (count 0: gone) instead of the whole set; one that did
    /// not keeps getting whole sets.
    @Test func queryDeltasCarryOnlyTheChange() {
        let bus = TestBus()
        bus.join(1, role: "store")
        bus.send(1, #"{"op":"register","store":"d","handles":["d/*"],"queryDeltas":true}"#)
        bus.store(2, "w", handles: ["w/*"])
        #expect(bus.ops(1) == ["registered", "queries"])
        _ = bus.take(2)
        bus.join(3, role: "client")
        bus.join(4, role: "client")
        for (peer, store) in [(3, "d"), (4, "d"), (3, "w"), (4, "w")] as [(PeerID, String)] {
            bus.send(peer, #"{"op":"query","id":"q-\#(store)","store":"\#(store)","query":{"site":7}}"#)
            bus.send(peer, #"{"op":"query","id":"r-\#(store)","store":"\#(store)","query":{"site":\#(peer)}}"#)
        }
        let deltas = bus.take(1)
        #expect(deltas.map(\.op) == Array(repeating: "queries-changed", count: 4))
        #expect(deltas.map { $0.rawText("changes")! } == [
            #"[{"query":{"site":7},"count":1}]"#, #"[{"query":{"site":3},"count":1}]"#,
            #"[{"query":{"site":7},"count":2}]"#, #"[{"query":{"site":4},"count":1}]"#,
        ])
        let whole = bus.take(2)
        #expect(whole.map(\.op) == Array(repeating: "queries", count: 4))
        #expect(whole.last?.rawText("queries") == #"[{"query":{"site":3},"count":1},{"query":{"site":4},"count":1},{"query":{"site":7},"count":2}]"#)
        // A disconnect withdraws several queries at once: one frame, sorted by the queries' bytes.
        bus.disconnect(3)
        #expect(bus.take(1).map { $0.rawText("changes")! } == [#"[{"query":{"site":3},"count":0},{"query":{"site":7},"count":1}]"#])
        #expect(bus.take(2).map { $0.rawText("queries")! } == [#"[{"query":{"site":4},"count":1},{"query":{"site":7},"count":1}]"#])
    }

    /// A full queue refuses the flooding connection, not one with few unsettled actions (`fairPending`).
    @Test func fullQueueRefusesOnlyBusyDispatchers() {
        let bus = TestBus { $0.queueLimit = 4; $0.storeWindow = 1; $0.fairPending = 2 }
        bus.store(1, "s", handles: ["s/*"])
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        for i in 0..<8 { bus.send(2, #"{"op":"dispatch","id":"f\#(i)","type":"s/x","settle":true}"#) }
        let flood = bus.take(2)
        #expect(flood.filter { $0.str("code") == "overloaded" }.count == 3)  // 1 in flight + 4 queued accepted
        bus.send(3, #"{"op":"dispatch","id":"w1","type":"s/x","settle":true}"#)
        bus.send(3, #"{"op":"dispatch","id":"w2","type":"s/x","settle":true}"#)
        bus.send(3, #"{"op":"dispatch","id":"w3","type":"s/x","settle":true}"#)
        #expect(bus.take(3).map { $0.str("code") } == ["overloaded"])  // the first two fit its fair share
    }

    /// A store without deltas gets one whole set per batch of reads, however many changes the batch made.
    @Test func wholeQuerySetsAreSentOncePerBatch() {
        let bus = TestBus()
        bus.store(1, "w", handles: ["w/*"])
        _ = bus.take(1)
        bus.join(2, role: "client")
        bus.batch {
            for i in 0..<100 { bus.send(2, #"{"op":"query","id":"q\#(i)","store":"w","query":{"site":\#(i)}}"#) }
            bus.send(2, #"{"op":"unquery","id":"q0"}"#)
        }
        let sets = bus.take(1)
        #expect(sets.map(\.op) == ["queries"])
        let set = try! Envelope(body: Array(#"{"q":"#.utf8) + Array(sets[0].raw("queries")!) + Array("}".utf8))
        #expect(set.raw("q")?.filter { $0 == UInt8(ascii: "{") }.count == 2 * 99)  // 99 queries, each {query:{site}}
        #expect(bus.take(2).count == 101)
    }

    @Test func storesPerConnectionAreLimited() {
        let bus = TestBus { $0.maxStoresPerConnection = 2 }
        bus.join(1, role: "store")
        for name in ["a", "b", "a", "c"] { bus.register(1, name, handles: []) }
        let codes = bus.take(1).filter { $0.op == "error" }.map { $0.str("code") }
        #expect(codes == ["name-taken", "limit-exceeded"])  // "a" again is name-taken (it owns it), "c" is one too many
        bus.send(1, #"{"op":"unregister","store":"a"}"#)
        bus.register(1, "c", handles: [])
        #expect(bus.take(1).first?.op == "registered")
    }

    @Test func handshakesAreLimitedPerUser() {
        let bus = TestBus { $0.maxHandshakesPerUser = 2 }
        for id: PeerID in 1...3 { bus.feed(.connected(id, PeerCredentials(pid: Int32(id), uid: 1000))) }
        #expect(bus.take(3).map { $0.str("code") } == ["too-many-connections"])
        bus.feed(.connected(4, PeerCredentials(pid: 4, uid: 1001)))  // another user is not affected
        #expect(bus.take(4).isEmpty)
        bus.send(1, #"{"op":"hello","protocol":1,"role":"client"}"#)  // a slot frees when a handshake completes
        bus.feed(.connected(5, PeerCredentials(pid: 5, uid: 1000)))
        #expect(bus.take(5).isEmpty)
    }

    /// Down stores with nothing queued cost routing nothing: only stores whose queues can expire make deadlines
    /// (thousands of down stores used to be walked after every event).
    @Test func downStoresWithEmptyQueuesMakeNoDeadlines() {
        let bus = TestBus()
        bus.join(1, role: "store")
        for i in 0..<500 { bus.register(1, "s\(i)", handles: ["s\(i)/*"]) }
        bus.disconnect(1)
        #expect(!bus.router.hasDeadlines && bus.router.nextDeadline == nil)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"dispatch","id":"a","type":"s7/x","settle":true}"#)
        #expect(bus.router.nextDeadline == bus.now + RouterConfig().queueTimeout)
        bus.advance(RouterConfig().queueTimeout)
        #expect(bus.take(2).first?.rawText("results")?.contains("store-unavailable") == true)
        #expect(!bus.router.hasDeadlines)
    }

    /// A connection that held the same query twice (and another one held by someone else too) withdraws each
    /// once, with its final count, in the order of the queries' bytes.
    @Test func closingWithdrawsEachQueryOnceWithItsFinalCount() {
        let bus = TestBus()
        bus.join(1, role: "store")
        bus.send(1, #"{"op":"register","store":"d","handles":[],"queryDeltas":true}"#)
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"query","id":"x","store":"d","query":"b"}"#)
        for (id, q) in [("1", "c"), ("2", "c"), ("3", "b"), ("4", "a")] {
            bus.send(2, #"{"op":"query","id":"\#(id)","store":"d","query":"\#(q)"}"#)
        }
        _ = bus.take(1)
        bus.disconnect(2)
        #expect(bus.take(1).map { $0.rawText("changes")! } == [#"[{"query":"a","count":0},{"query":"b","count":1},{"query":"c","count":0}]"#])
        bus.send(3, #"{"op":"query","id":"y","store":"d","query":"c"}"#)
        #expect(bus.take(1).map { $0.rawText("changes")! } == [#"[{"query":"c","count":1}]"#])
    }

    /// A fatal error is the last frame a peer gets: a monitor is not sent the event about its own fatal error
    /// (found by the router fuzz target).
    @Test func aMonitorGetsNothingAfterItsOwnFatalError() {
        let bus = TestBus()
        bus.join(1, role: "monitor")
        bus.join(2, role: "monitor")
        _ = bus.take(1)
        _ = bus.take(2)
        bus.feed(.oversizedFrame(1, length: 1 << 30))
        #expect(bus.take(1).map(\.op) == ["error"])
        #expect(bus.take(2).map { $0.str("kind") } == ["error", "disconnect"])  // the other monitor sees it
    }

    /// A registration whose initial state does not fit the memory budget is refused before anything is
    /// announced: subscribers never hear of a version that does not exist (found by the router fuzz target).
    @Test func initialStateOverBudgetIsRefusedBeforeTheStoreIsUp() {
        let bus = TestBus { c in
            c.memory.total = 1 << 20
            c.memory.perUser = 600
            c.memory.connectionAllowance = 256
        }
        bus.join(1, role: "client")
        bus.send(1, #"{"op":"subscribe","store":"todos"}"#)
        _ = bus.take(1)
        bus.join(2, role: "store")
        bus.register(2, "todos", handles: [], state: #"{"big":"\#(String(repeating: "x", count: 300))"}"#)
        let refusal = bus.take(2)
        #expect(refusal.map { $0.str("code") } == ["memory-budget"])
        #expect(refusal.first?.bool("fatal").value == false)
        #expect(bus.take(1).isEmpty)  // no store-up, no version
        bus.send(1, #"{"op":"subscribe","store":"todos"}"#)
        #expect(bus.take(1).first?.num("version") == 0)
    }

    @Test func unusedStoreNamesAreForgotten() {
        let bus = TestBus()
        bus.join(1, role: "client")
        for i in 0..<500 {
            bus.send(1, #"{"op":"subscribe","store":"ghost-\#(i)"}"#)
            bus.send(1, #"{"op":"query","id":"q\#(i)","store":"ghost-q-\#(i)","query":1}"#)
        }
        #expect(storeNames(bus, 90) == 1000)
        for i in 0..<250 { bus.send(1, #"{"op":"unsubscribe","store":"ghost-\#(i)"}"#) }
        for i in 0..<250 { bus.send(1, #"{"op":"unquery","id":"q\#(i)"}"#) }
        #expect(storeNames(bus, 91) == 500)
        bus.disconnect(1)
        #expect(storeNames(bus, 92) == 0)
        // Subscribing before the store registers keeps working, and a registered store is never forgotten.
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"later"}"#)
        bus.store(3, "later", handles: ["l/*"], state: #"{"n":1}"#)
        #expect(bus.ops(2) == ["subscribed", "store-up", "snapshot"])
        bus.disconnect(2)
        bus.disconnect(3)
        #expect(storeNames(bus, 93) == 1)
    }

    private func storeNames(_ bus: TestBus, _ monitor: PeerID) -> Int64 {
        bus.join(monitor, role: "monitor")
        defer { bus.disconnect(monitor) }
        bus.send(monitor, #"{"op":"info"}"#)
        let info = bus.take(monitor).first { $0.op == "info" }!
        return try! Envelope(body: Array(info.raw("load")!)).num("storeNames")!
    }

    @Test func connectionsAreLimitedInTotalPerUserAndInTheHandshake() {
        let bus = TestBus { $0.maxConnectionsPerUser = 2; $0.maxConnections = 4; $0.maxHandshakes = 3 }
        bus.feed(.connected(1, PeerCredentials(pid: 1, uid: 1000)))
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 1000)))
        bus.feed(.connected(3, PeerCredentials(pid: 3, uid: 1000)))
        #expect(bus.take(3).map { $0.str("code") } == ["too-many-connections"])
        #expect(bus.closedPeers.contains(3))
        #expect(bus.take(1).isEmpty && bus.take(2).isEmpty)  // the others are untouched
        bus.feed(.connected(4, PeerCredentials(pid: 4, uid: 1001)))
        bus.feed(.connected(5, PeerCredentials(pid: 5, uid: 1002)))
        let refused = bus.take(5)
        #expect(refused.map { $0.str("code") } == ["too-many-connections"])
        #expect(refused.first?.str("message")?.contains("maxHandshakes") == true)
        // Completing handshakes makes room for handshakes, not for connections of a user at its limit.
        for id: PeerID in [1, 2, 4] { bus.send(id, #"{"op":"hello","protocol":1,"role":"client"}"#) }
        bus.feed(.connected(6, PeerCredentials(pid: 6, uid: 1003)))
        #expect(bus.take(6).isEmpty)
        bus.feed(.connected(7, PeerCredentials(pid: 7, uid: 1004)))
        #expect(bus.take(7).first?.str("message")?.contains("maxConnections") == true)
        // A user's count drops when its connections close.
        bus.disconnect(1)
        bus.feed(.connected(8, PeerCredentials(pid: 8, uid: 1000)))
        #expect(bus.take(8).isEmpty)
    }

    /// Past its user's share, a dispatch is refused with `memory-budget`; a small peer of another user, inside
    /// its allowance, is unaffected; settling returns the bytes.
    @Test func memoryBudgetRefusesTheUserOverItsShare() {
        let bus = TestBus { c in
            c.memory.total = 1 << 20
            c.memory.perUser = 256 << 10
            c.memory.connectionAllowance = 16 << 10
        }
        bus.store(1, "s", handles: ["s/*"])
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 2000)))
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client"}"#)
        _ = bus.take(2)
        let baseline = bus.router.memory.used
        let big = String(repeating: "x", count: 60_000)
        var accepted = 0
        var refused = 0
        for i in 0..<10 {
            bus.send(2, #"{"op":"dispatch","id":"d\#(i)","type":"s/big","payload":"\#(big)","settle":true}"#)
            let errors = bus.take(2).filter { $0.op == "error" }
            if errors.isEmpty { accepted += 1 } else {
                #expect(errors.map { $0.str("code") } == ["memory-budget"])
                refused += 1
            }
        }
        #expect(accepted == 4 && refused == 6)  // 4 x ~60 KB fit in a 256 KiB share
        #expect(bus.router.memory.byUser[2000]! <= 256 << 10)
        // Another user's small dispatch goes through.
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"dispatch","id":"small","type":"s/x","payload":{},"settle":true}"#)
        #expect(bus.take(3).isEmpty)
        // The store answers everything: the bytes come back.
        for action in bus.take(1) where action.op == "action" {
            bus.send(1, #"{"op":"done","store":"s","seq":\#(action.num("seq")!)}"#)
        }
        #expect(bus.take(2).filter { $0.op == "settled" }.count == 4)
        #expect(bus.router.memory.used == baseline + (16 << 10))  // peer 3's allowance is all that was added
    }

    @Test func transportBytesOverTheBudgetCloseOnlyThatPeer() {
        let bus = TestBus { c in
            c.memory.total = 512 << 10
            c.memory.perUser = 512 << 10
            c.memory.connectionAllowance = 16 << 10
        }
        bus.join(1, role: "client")
        bus.join(2, role: "client")
        #expect(bus.router.accountTransport(1, bytes: 300 << 10))
        #expect(!bus.router.accountTransport(2, bytes: 300 << 10))  // 2 x 300 KiB > 512 KiB
        #expect(bus.router.accountTransport(2, bytes: 10 << 10))  // within its allowance: always
        bus.feed(.overBudget(1))
        #expect(bus.take(1).map { $0.str("code") } == ["memory-budget"])
        #expect(bus.closedPeers.contains(1))
        #expect(!bus.closedPeers.contains(2))
        #expect(bus.router.memory.used == 16 << 10)  // peer 1's bytes returned on close
    }

    @Test func heartbeatsPingSilentPeersAndCloseUnresponsiveOnes() {
        let bus = TestBus { $0.pingInterval = 100; $0.maxPingsOut = 2 }
        bus.connect(1)
        bus.send(1, #"{"op":"hello","protocol":1,"role":"client","heartbeat":true}"#)
        let welcome = bus.take(1)[0]
        let limits = try! Envelope(body: Array(welcome.raw("limits")!))
        #expect(limits.num("pingInterval") == 100 && limits.num("maxPingsOut") == 2)
        bus.join(2, role: "client")  // did not ask: never pinged
        bus.advance(50)
        #expect(bus.take(1).isEmpty)
        bus.advance(60)
        let ping = bus.take(1)
        #expect(ping.map(\.op) == ["ping"])
        // An answer (any frame) keeps it alive.
        bus.send(1, #"{"op":"pong","id":"\#(ping[0].str("id")!)"}"#)
        #expect(bus.take(1).isEmpty)  // pong is not an unknown op
        for _ in 0..<4 { bus.advance(25) }
        #expect(bus.take(1).map(\.op) == ["ping"])  // silent again for an interval
        for _ in 0..<20 { bus.advance(25) }
        let end = bus.take(1)
        #expect(end.map(\.op) == ["ping", "error"])
        #expect(end.last?.str("code") == "unresponsive")
        #expect(bus.closedPeers.contains(1))
        #expect(bus.take(2).isEmpty && !bus.closedPeers.contains(2))
    }

    @Test func stalledStoresAreReportedAndOptionallyClosed() {
        for close in [false, true] {
            let bus = TestBus { $0.storeTimeout = 100; $0.closeStalledStores = close }
            bus.store(1, "s", handles: ["s/*"])
            bus.join(2, role: "client")
            bus.join(3, role: "monitor")
            _ = bus.take(1)
            bus.send(2, #"{"op":"dispatch","id":"a","type":"s/x","settle":true}"#)
            #expect(bus.ops(1) == ["action"])
            for _ in 0..<3 { bus.advance(30) }
            #expect(bus.stalls.isEmpty)
            bus.advance(30)
            #expect(bus.stalls.map(\.store) == ["s"] && bus.stalls[0].closing == close)
            #expect(bus.take(3).contains { $0.op == "event" && $0.str("kind") == "store-stalled" })
            #expect(bus.logs.contains { $0.contains("store \"s\" stalled") })
            bus.advance(200)
            #expect(bus.stalls.count == 1)  // reported once per stall
            if close {
                #expect(bus.take(1).map { $0.str("code") } == ["unresponsive"])
                #expect(bus.closedPeers.contains(1))
                // Its action is redelivered to the next owner (SPEC §10), then settles.
                bus.store(4, "s", handles: ["s/*"])
                let again = bus.take(4).filter { $0.op == "action" }
                #expect(again.count == 1 && again[0].raw("redelivered") != nil)
                bus.send(4, #"{"op":"done","store":"s","seq":1}"#)
            } else {
                bus.send(2, #"{"op":"info"}"#)
                let info = bus.take(2).first { $0.op == "info" }!
                #expect(info.rawText("stores")!.contains(#""stalled":true"#))
                bus.send(1, #"{"op":"done","store":"s","seq":1}"#)
                #expect(bus.logs.contains { $0.contains("answers again") })
            }
            #expect(bus.take(2).filter { $0.op == "settled" }.count == 1)
        }
    }

    @Test("actions given up for a down store with a full queue log at most a few lines per window, then say how many were left out")
    func givenUpLinesAreRateLimited() {
        let bus = TestBus { c in
            c.queueLimit = 2
            c.fairPending = 0
        }
        bus.store(1, "s", handles: ["s/*"])
        bus.join(2, role: "client")
        bus.disconnect(1)
        let before = bus.logs.count
        for i in 0..<40 { bus.send(2, #"{"op":"dispatch","id":"d\#(i)","type":"s/x","settle":true}"#) }
        // 2 queued, 38 given up: 5 lines, 33 left out.
        #expect(bus.logs[before...].filter { $0.contains("given up for store") }.count == LogRateLimit.perWindow)
        #expect(bus.take(2).filter { $0.op == "settled" }.count == 38)  // every one settled all the same
        let later = bus.logs.count
        bus.advance(LogRateLimit.window)  // the 2 queued expire (queueTimeout) in the next window
        let next = bus.logs[later...].filter { $0.contains("given up for store") }
        #expect(next.count == 2)
        #expect(next.first?.hasSuffix("(33 more like it not logged in the last 10 s)") == true)
    }
}
