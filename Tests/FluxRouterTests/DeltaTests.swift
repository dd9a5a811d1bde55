import FluxCore
import FluxJournal
import FluxJSONValue
import Testing
@testable import FluxRouter

/// SPEC §16 on the router alone: patches from stores, delta subscribers, path subscribers, resume, patch-failed,
/// and patches across a restart.
@Suite("SPEC §16 patches, deltas and path subscriptions")
struct DeltaTests {
    static let initial = #"{"todos":[{"id":1,"done":false},{"id":2,"done":false},{"id":3,"done":false}],"n":3}"#

    /// Store peer 1 owns "todos" (version 1); peer 2 subscribes full, 3 with deltas, 4 to /todos/1, 5 to /n.
    static func bus(_ configure: (inout RouterConfig) -> Void = { _ in }) -> TestBus {
        let bus = TestBus(configure)
        bus.store(1, "todos", handles: ["todo/*"], state: initial)
        #expect(bus.ops(1) == ["registered", "snapshot", "queries"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"todos"}"#)
        #expect(bus.ops(2) == ["subscribed", "snapshot"])
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos","deltas":true}"#)
        let subscribed = bus.take(3)
        #expect(subscribed.map(\.op) == ["subscribed", "snapshot"])
        #expect(subscribed.first?.bool("deltas").value == true)
        bus.join(4, role: "client")
        bus.send(4, #"{"op":"subscribe","store":"todos","path":"/todos/1"}"#)
        let path = bus.take(4)
        #expect(path.map(\.op) == ["subscribed", "subtree"])
        #expect(path.first?.str("path") == "/todos/1")
        #expect(path.last?.rawText("value") == #"{"id":2,"done":false}"#)
        bus.join(5, role: "monitor")
        bus.send(5, #"{"op":"subscribe","store":"todos","path":"/n"}"#)
        #expect(bus.ops(5) == ["subscribed", "subtree"])
        bus.join(6, role: "client")
        return bus
    }

    /// Peer 6 dispatches one action; store 1 answers it with `answer` (a done's extra fields).
    static func act(_ bus: TestBus, _ answer: String, dispatcher: PeerID = 6) -> Int64 {
        bus.send(dispatcher, #"{"op":"dispatch","id":"d","type":"todo/toggle","settle":true}"#)
        let action = bus.take(1)
        let seq = action.first?.num("seq") ?? 0
        bus.send(1, #"{"op":"done","store":"todos","seq":\#(seq)\#(answer)}"#)
        return seq
    }

    @Test("a patch: the delta subscriber gets the store's bytes, the full one fluxd's rendering, the touched path its subtree, the untouched path nothing; settled after all")
    func patchFansOut() throws {
        let bus = Self.bus()
        let patch = #"[{"op":"replace","path":"/todos/1/done","value":true}]"#
        let seq = Self.act(bus, #","base":1,"patch":\#(patch)"#)
        let full = bus.take(2)
        #expect(full.map(\.op) == ["snapshot"])
        #expect(full.first?.rawText("state") == #"{"todos":[{"id":1,"done":false},{"id":2,"done":true},{"id":3,"done":false}],"n":3}"#)
        #expect(full.first?.num("version") == 2 && full.first?.num("seq") == seq)
        let delta = bus.take(3)
        #expect(delta.map(\.op) == ["delta"])
        #expect(delta.first?.rawText("patch") == patch, "the patch bytes as the store wrote them")
        #expect(delta.first?.num("from") == 1 && delta.first?.num("version") == 2 && delta.first?.num("seq") == seq)
        let path = bus.take(4)
        #expect(path.map(\.op) == ["subtree"])
        #expect(path.first?.rawText("value") == #"{"id":2,"done":true}"# && path.first?.num("version") == 2)
        #expect(bus.take(5).filter { $0.op == "subtree" }.isEmpty, "a path subscriber is not woken by changes elsewhere")
        let settled = bus.take(6)
        #expect(settled.map(\.op) == ["settled"])
        // get, and a new subscriber, see the whole patched state at once.
        bus.send(6, #"{"op":"get","store":"todos"}"#)
        #expect(bus.take(6).first?.rawText("state") == full.first?.rawText("state"))
        bus.join(7, role: "client")
        bus.send(7, #"{"op":"subscribe","store":"todos","deltas":true}"#)
        #expect(bus.take(7).last?.rawText("state") == full.first?.rawText("state"))
    }

    @Test("without full subscribers the patched state is not rendered until a frame needs it")
    func renderedOnDemand() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: Self.initial)
        _ = bus.take(1)
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos","deltas":true}"#)
        _ = bus.take(3)
        bus.join(6, role: "client")
        _ = Self.act(bus, #","patch":[{"op":"add","path":"/todos/-","value":{"id":4,"done":false}},{"op":"replace","path":"/n","value":4}]"#)
        #expect(bus.ops(3) == ["delta"])
        let store = bus.router.stores["todos"]!
        #expect(store.snapshot == nil && store.tree != nil && store.version == 2)
        bus.send(6, #"{"op":"get","store":"todos"}"#)
        let got = bus.take(6).first { $0.op == "got" }
        #expect(got?.rawText("state") == #"{"todos":[{"id":1,"done":false},{"id":2,"done":false},{"id":3,"done":false},{"id":4,"done":false}],"n":4}"#)
        #expect(store.snapshot != nil, "rendered once, kept until the next change")
    }

    @Test("an empty patch makes no version; a whole state byte-identical to the rendered one makes none either")
    func emptyPatch() {
        let bus = Self.bus()
        _ = Self.act(bus, #","patch":[]"#)
        #expect(bus.take(2).isEmpty && bus.take(3).isEmpty && bus.take(4).isEmpty)
        #expect(bus.take(6).first?.rawText("results") == #"[{"store":"todos","status":"done","version":1}]"#)
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":4}]"#)
        _ = bus.take(2); _ = bus.take(3); _ = bus.take(6)
        _ = Self.act(bus, #","state":{"todos":[{"id":1,"done":false},{"id":2,"done":false},{"id":3,"done":false}],"n":4}"#)
        #expect(bus.take(2).isEmpty, "R4 compares with the retained state's bytes, however they were made")
        #expect(bus.router.stores["todos"]!.version == 2)
    }

    @Test("patch-failed: a patch that does not apply, or names another base, closes the store; the state is unchanged and the action comes again")
    func patchFailed() {
        for answer in [#","base":7,"patch":[{"op":"replace","path":"/n","value":9}]"#,
                       #","patch":[{"op":"replace","path":"/n","value":9},{"op":"remove","path":"/todos/9"}]"#,
                       #","patch":[{"op":"frobnicate","path":"/n"}]"#] {
            let bus = Self.bus()
            let seq = Self.act(bus, answer)
            let error = bus.take(1).first { $0.op == "error" }
            #expect(error?.str("code") == "patch-failed", "\(answer)")
            #expect(error?.bool("fatal").value == true && error?.str("ref") == "todos")
            #expect(bus.closedPeers.contains(1))
            #expect(bus.take(2).map(\.op) == ["store-down"] && bus.take(3).map(\.op) == ["store-down"])
            bus.send(6, #"{"op":"get","store":"todos"}"#)
            #expect(bus.take(6).first { $0.op == "got" }?.rawText("state") == Self.initial)
            bus.store(11, "todos", handles: ["todo/*"])
            let again = bus.take(11)
            #expect(again.map(\.op) == ["registered", "snapshot", "queries", "action"])
            #expect(again.last?.num("seq") == seq && again.last?.bool("redelivered").value == true)
        }
    }

    @Test("a patch that is not an array is bad-message and the store survives; deltas with a path, and a bad path, are bad-message")
    func badMessages() {
        let bus = Self.bus()
        bus.join(8, role: "client")
        bus.send(8, #"{"op":"subscribe","store":"todos","deltas":true,"path":"/n"}"#)
        #expect(bus.take(8).first?.str("code") == "bad-message")
        bus.send(8, #"{"op":"subscribe","store":"todos","path":"n"}"#)
        #expect(bus.take(8).first?.str("code") == "bad-message")
        bus.send(8, #"{"op":"subscribe","store":"todos","path":"/a~2"}"#)
        #expect(bus.take(8).first?.str("code") == "bad-message")
        bus.send(1, #"{"op":"patch","store":"todos","patch":{"op":"add"}}"#)
        #expect(bus.take(1).first?.str("code") == "bad-message")
        #expect(!bus.closedPeers.contains(1))
        bus.send(8, #"{"op":"patch","store":"todos","patch":[]}"#)
        #expect(bus.take(8).first?.str("code") == "forbidden")
    }

    @Test("the patch op: a change outside an action, with the seq of the last answered action")
    func unsolicitedPatch() {
        let bus = Self.bus()
        bus.send(1, #"{"op":"patch","store":"todos","base":1,"patch":[{"op":"remove","path":"/todos/0"}]}"#)
        let delta = bus.take(3)
        #expect(delta.map(\.op) == ["delta"] && delta.first?.num("seq") == 0)
        // Removing /todos/0 shifts /todos/1: the path subscriber is told (its value is the former /todos/2).
        let path = bus.take(4)
        #expect(path.first?.rawText("value") == #"{"id":3,"done":false}"#)
        #expect(bus.take(5).filter { $0.op == "subtree" }.isEmpty)
    }

    @Test("a delta subscriber that is behind is sent the whole snapshot (which coalesces), then deltas again")
    func behindGetsSnapshots() {
        let bus = Self.bus()
        bus.queued[3] = DaemonCore.behindBytes + 1
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":4}]"#)
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":5}]"#)
        let behind = bus.take(3)
        #expect(behind.map(\.op) == ["snapshot", "snapshot"])
        #expect(behind.last?.rawText("state")?.hasSuffix(#""n":5}"#) == true)
        #expect(bus.marks[3]!.suffix(2).allSatisfy { $0.coalescing == .newestWins(key: bus.router.stores["todos"]!.key) })
        bus.queued[3] = 0
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":6}]"#)
        let caughtUp = bus.take(3)
        #expect(caughtUp.map(\.op) == ["delta"] && caughtUp.first?.num("from") == 3)
        #expect(bus.marks[3]!.last?.coalescing == .fence(key: bus.router.stores["todos"]!.key),
                "deltas are never replaced, and no snapshot before one is")
    }

    @Test("resume with from: nothing when current, the kept patches when they reach back, else the snapshot")
    func resume() {
        let bus = Self.bus { $0.deltaHistory = 200 }
        for n in 4...6 { _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":\#(n)}]"#) }
        bus.join(9, role: "client")
        bus.send(9, #"{"op":"subscribe","store":"todos","deltas":true,"from":4}"#)
        #expect(bus.ops(9) == ["subscribed"])
        bus.send(9, #"{"op":"subscribe","store":"todos","deltas":true,"from":2}"#)
        let resumed = bus.take(9)
        #expect(resumed.map(\.op) == ["subscribed", "delta", "delta"])
        #expect(resumed.dropFirst().map { $0.num("from") } == [2, 3])
        // 200 bytes of history keep the last patches only: from 1 is answered with the snapshot.
        bus.send(9, #"{"op":"subscribe","store":"todos","deltas":true,"from":0}"#)
        #expect(bus.ops(9) == ["subscribed", "snapshot"])
        for n in 7...12 { _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":\#(n)}]"#) }
        bus.send(9, #"{"op":"subscribe","store":"todos","deltas":true,"from":4}"#)
        #expect(bus.ops(9).last == "snapshot", "older than the kept patches")
        bus.send(9, #"{"op":"subscribe","store":"todos","from":11}"#)
        #expect(bus.ops(9) == ["subscribed", "snapshot"], "a full subscription resumes with the snapshot")
        bus.send(9, #"{"op":"subscribe","store":"todos","from":99}"#)
        #expect(bus.ops(9) == ["subscribed", "snapshot"], "a version above the retained one: the snapshot")
    }

    @Test("the kept patches are charged to the retained state's account; without room for more the oldest are let go; a whole state returns their charge")
    func historyCharged() throws {
        let bus = Self.bus { $0.deltaHistory = 1 << 20 }
        let store = try #require(bus.router.stores["todos"])
        for n in 4...6 { _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":\#(n)}]"#) }
        let account = try #require(store.retainedBy)
        #expect(store.recentPatches.count == 3)
        #expect(store.historyBy === account)
        #expect(store.historyCost == store.recentPatchBytes + 3 * RecentPatch.overhead)
        // The user's share full to the byte: a fourth patch does not fit beside the three, so the oldest go.
        let uid = account.uid
        let limit = bus.router.memory.limits.perUser
        var filled = 0
        while bus.router.memory.byUser[uid]! < limit {  // (twice: the first part may fill the allowance only)
            let more = limit - bus.router.memory.byUser[uid]!
            bus.router.memory.force(account, more)
            filled += more
        }
        let versionBefore = store.version
        store.recentPatches.append(RecentPatch(version: versionBefore + 1, seq: 99, bytes: Array(#"[{"op":"replace","path":"/n","value":7}]"#.utf8)))
        store.recentPatchBytes += store.recentPatches.last!.bytes.count
        let costBefore = store.historyCost
        bus.router.chargeHistory(store)
        #expect(store.recentPatches.count == 3 && store.recentPatches.last?.version == versionBefore + 1,
                "the newest kept, the oldest let go: \(store.recentPatches.map(\.version))")
        #expect(store.historyCost <= costBefore && bus.router.memory.byUser[uid]! <= limit)
        bus.router.memory.release(account, filled)
        // A whole state: the history and its charge are gone.
        let held = account.held
        let cost = store.historyCost
        store.recentPatches.removeLast()
        store.recentPatchBytes -= #"[{"op":"replace","path":"/n","value":7}]"#.utf8.count
        bus.router.forgetHistory(store)
        #expect(store.recentPatches.isEmpty && store.historyBy == nil && store.historyCost == 0)
        #expect(account.held == held - cost)
    }

    @Test("done with both state and patch: full subscribers get the state as written, delta subscribers the patch")
    func stateAndPatch() {
        let bus = Self.bus()
        let state = #"{"todos": [], "n": 0}"#
        let patch = #"[{"op":"replace","path":"/todos","value":[]},{"op":"replace","path":"/n","value":0}]"#
        _ = Self.act(bus, #","state":\#(state),"patch":\#(patch)"#)
        #expect(bus.take(2).first?.rawText("state") == state)
        #expect(bus.take(3).first?.rawText("patch") == patch)
        let path = bus.take(4)
        #expect(path.first?.op == "subtree" && path.first?.bool("exists").value == false && path.first?.raw("value") == nil)
        #expect(bus.take(5).first { $0.op == "subtree" }?.rawText("value") == "0")
    }

    @Test("whole states: a path subscriber is sent its subtree only when its value changed")
    func pathWithWholeStates() {
        let bus = Self.bus()
        _ = Self.act(bus, #","state":{"todos":[{"id":1,"done":true},{"id":2,"done":false},{"id":3,"done":false}],"n":3}"#)
        #expect(bus.take(4).isEmpty && bus.take(5).filter { $0.op == "subtree" }.isEmpty)
        #expect(bus.take(3).map(\.op) == ["snapshot"])
        _ = Self.act(bus, #","state":{"todos":[{"id":1,"done":true},{"id":2,"done":true},{"id":3,"done":false}],"n":3}"#)
        #expect(bus.take(4).first?.rawText("value") == #"{"id":2,"done":true}"#)
    }

    @Test("unsubscribing a path ends that path only; a connection closing ends all its subscriptions")
    func unsubscribePath() {
        let bus = Self.bus()
        bus.send(4, #"{"op":"subscribe","store":"todos","path":"/n"}"#)
        _ = bus.take(4)
        bus.send(4, #"{"op":"unsubscribe","store":"todos","path":"/todos/1"}"#)
        let reply = bus.take(4)
        #expect(reply.map(\.op) == ["unsubscribed"] && reply.first?.str("path") == "/todos/1")
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/todos/1/done","value":true},{"op":"replace","path":"/n","value":4}]"#)
        let after = bus.take(4)
        #expect(after.map { $0.str("path") } == ["/n"])
        bus.disconnect(4)
        bus.disconnect(3)
        #expect(bus.router.stores["todos"]!.pathSubscribers.count == 1 && bus.router.stores["todos"]!.deltaSubscribers.isEmpty)
    }

    @Test("an append (`-`) touches the index the element gets, not the elements before it")
    func appendTouchesItsIndex() {
        let bus = Self.bus()
        bus.send(4, #"{"op":"subscribe","store":"todos","path":"/todos/3"}"#)
        let before = bus.take(4)
        #expect(before.last?.bool("exists").value == false)
        _ = Self.act(bus, #","patch":[{"op":"add","path":"/todos/-","value":{"id":4,"done":false}}]"#)
        let after = bus.take(4)
        #expect(after.map { $0.str("path") } == ["/todos/3"], "/todos/1 is not touched; /todos/3 now exists")
        #expect(after.last?.rawText("value") == #"{"id":4,"done":false}"#)
    }

    @Test("what touches a path (SPEC §16.4's examples)")
    func touches() throws {
        func t(_ op: String, _ path: String) throws -> Bool {
            let patch = try JSONPatch(parsing: Array("[\(op)]".utf8))
            return Router.touches(patch.operations[0], StoreRequest.pointerTokens(path)!)
        }
        #expect(try t(#"{"op":"remove","path":"/todos/2"}"#, "/todos/3"))
        #expect(try t(#"{"op":"remove","path":"/todos/2"}"#, "/todos/2/title"))
        #expect(try !t(#"{"op":"remove","path":"/todos/2"}"#, "/todos/1"))
        #expect(try !t(#"{"op":"replace","path":"/todos/2","value":1}"#, "/todos/3"))
        #expect(try !t(#"{"op":"replace","path":"/todos/2","value":1}"#, "/todos/1"))
        #expect(try t(#"{"op":"replace","path":"/todos","value":[]}"#, "/todos/1"))
        #expect(try t(#"{"op":"add","path":"/todos/0","value":1}"#, "/todos/5/done"))
        #expect(try t(#"{"op":"add","path":"/todos/5","value":1}"#, "/todos/5"))
        #expect(try !t(#"{"op":"add","path":"/todos/5","value":1}"#, "/todos/4"))
        #expect(try t(#"{"op":"replace","path":"","value":1}"#, "/anything"))
        #expect(try !t(#"{"op":"test","path":"/n","value":1}"#, "/n"))
        #expect(try t(#"{"op":"move","from":"/a","path":"/b"}"#, "/a/x"))
        #expect(try t(#"{"op":"move","from":"/a","path":"/b"}"#, "/b"))
        #expect(try !t(#"{"op":"copy","from":"/a","path":"/b"}"#, "/a"))
        #expect(try !t(#"{"op":"replace","path":"/todos/1","value":1}"#, "/tod"))
        #expect(try !t(#"{"op":"remove","path":"/m/2"}"#, "/m/x"), "an object key that looks like nothing numeric")
    }

    @Test("monitors get an event of kind delta for a change that came as a patch")
    func monitorEvent() {
        let bus = Self.bus()
        _ = bus.take(5)
        _ = Self.act(bus, #","patch":[{"op":"replace","path":"/n","value":4}]"#)
        let events = bus.take(5).filter { $0.op == "event" }
        let delta = events.first { $0.str("kind") == "delta" }
        #expect(delta?.num("from") == 1 && delta?.num("version") == 2)
        #expect(delta?.rawText("patch") == #"[{"op":"replace","path":"/n","value":4}]"#)
        #expect(!events.contains { $0.str("kind") == "snapshot" })
    }

    @Test("journaled as patches; after a restart the state is the snapshot with the patches applied, and delta subscribers resume")
    func acrossRestart() throws {
        let before = MemoryJournal()
        let first = DurabilityTests.durableBus(before)
        first.store(1, "todos", handles: ["todo/*"], state: Self.initial)
        _ = first.take(1)
        first.join(6, role: "client")
        _ = Self.act(first, #","patch":[{"op":"replace","path":"/n","value":4}]"#)
        _ = Self.act(first, #","patch":[{"op":"remove","path":"/todos/0"}]"#)
        let kinds = before.decoded().compactMap { r -> String? in
            if case .patch(let s, let v, _, _) = r { return "patch \(s) v\(v)" } else { return nil }
        }
        #expect(kinds == ["patch todos v2", "patch todos v3"])
        let after = MemoryJournal()
        let bus = DurabilityTests.durableBus(after, from: before)
        #expect(bus.router.restoreProblems.isEmpty)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"get","store":"todos"}"#)
        let got = bus.take(2).first
        #expect(got?.num("version") == 3)
        #expect(got?.rawText("state") == #"{"todos":[{"id":2,"done":false},{"id":3,"done":false}],"n":4}"#)
        bus.send(2, #"{"op":"subscribe","store":"todos","deltas":true,"from":1}"#)
        #expect(bus.take(2).map(\.op) == ["subscribed", "delta", "delta"])
    }
}
