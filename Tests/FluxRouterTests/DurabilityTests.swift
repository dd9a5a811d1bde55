import FluxCore
import FluxJournal
import Testing
@testable import FluxRouter

/// SPEC §15 on the router alone: what it journals, and what a router restored from those records does. A
/// `MemoryJournal` stands in for the files; "restarting" is a new router restored from the records.
struct DurabilityTests {
    /// A bus whose router journals to `journal`, restored first from `from` (a previous run's records).
    static func durableBus(_ journal: MemoryJournal, from: MemoryJournal? = nil,
                           configure: (inout RouterConfig) -> Void = { _ in }) -> TestBus {
        TestBus(journal: journal, restoring: from?.state()) {
            $0.durability = "batch"
            $0.epoch = "e1"
            $0.seqBlock = 100
            configure(&$0)
        }
    }

    /// A run: store "todos" registered, one action answered with a new state, one delivered and unanswered.
    static func firstRun(_ journal: MemoryJournal) -> TestBus {
        let bus = durableBus(journal)
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"items":[]}"#)
        bus.join(2, role: "client")
        _ = bus.take(1)
        bus.send(2, #"{"op":"dispatch","id":"c-1","type":"todo/add","payload":{"t":"milk"},"settle":true}"#)
        #expect(bus.take(1).map(\.op) == ["action"])
        bus.send(1, #"{"op":"done","store":"todos","seq":1,"state":{"items":["milk"]}}"#)
        bus.send(2, #"{"op":"dispatch","id":"c-2","type":"todo/add","payload":{"t":"eggs"},"settle":true}"#)
        #expect(bus.take(1).map { $0.num("seq") } == [2])
        return bus
    }

    @Test("each record is journaled where it is made: the first seq block before anyone connects, then actions, snapshots before their results")
    func whatIsJournaled() {
        let journal = MemoryJournal()
        _ = Self.firstRun(journal)
        let kinds = journal.decoded().map { record -> String in
            switch record {
            case .seqReserve(let n): return "reserve \(n)"
            case .register(let s, _, _): return "register \(s)"
            case .action(let a): return "action \(a.seq)"
            case .result(let seq, let s, _, let v): return "result \(seq) \(s) v\(v)"
            case .snapshot(let s, let v, let seq, _): return "snapshot \(s) v\(v) seq \(seq)"
            case .patch(let s, let v, let seq, _): return "patch \(s) v\(v) seq \(seq)"
            case .forget(let s, let seq, let floor): return "forget \(s) seq \(seq) floor \(floor)"
            case .storePosition, .outcome, .segmentSummary: return "checkpoint-only"
            }
        }
        #expect(kinds == ["reserve 100", "register todos", "snapshot todos v1 seq 0", "action 1",
                          "snapshot todos v2 seq 1", "result 1 todos v2", "action 2"])
    }

    @Test("after a restart: seq continues above the reserved block, the snapshot is retained, the store is down with its queue, the unanswered action is redelivered")
    func restartRestores() {
        let before = MemoryJournal()
        _ = Self.firstRun(before)
        let after = MemoryJournal()
        let bus = Self.durableBus(after, from: before)
        bus.join(3, role: "monitor")
        bus.send(3, #"{"op":"subscribe","store":"todos"}"#)
        let sub = bus.take(3)
        #expect(sub.map(\.op) == ["subscribed", "snapshot"])
        #expect(sub[0].str("status") == "down")
        #expect(sub[1].num("version") == 2 && sub[1].rawText("state") == #"{"items":["milk"]}"#)
        // The store comes back: it adopts the snapshot and gets the unanswered action, marked redelivered.
        bus.store(1, "todos", handles: ["todo/*"])
        let back = bus.take(1)
        #expect(back.map(\.op) == ["registered", "snapshot", "queries", "action"])
        #expect(back[0].num("version") == 2 && back[0].num("seq") == 1)
        #expect(back[0].string("resumed").value == nil)  // (a boolean)
        #expect(back[3].num("seq") == 2)
        #expect(back[3].rawText("redelivered") == "true")
        // A new action gets a seq above everything the first run may have revealed (its block ended at 100).
        bus.join(4, role: "client")
        bus.send(4, #"{"op":"dispatch","id":"d-1","type":"todo/add","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":2}"#)
        let more = bus.take(1)
        #expect(more.map { $0.num("seq") } == [101])
    }

    @Test("forget is journaled: after a restart (from the records, or from a checkpoint) the store stays forgotten and a store of the name starts above the version floor")
    func forgetSurvivesRestart() throws {
        let before = MemoryJournal()
        let bus1 = Self.firstRun(before)  // todos at version 2; action 2 delivered, unanswered
        bus1.disconnect(1)
        bus1.join(5, role: "client")
        bus1.send(5, #"{"op":"forget","id":"f","store":"todos"}"#)
        #expect(bus1.take(5).map(\.op) == ["forgotten"])
        #expect(before.decoded().suffix(2).map { "\($0)" }.last?.contains("forget") == true)
        for restored in [before.state(), { () -> JournalState in
            var state = JournalState()
            bus1.router.checkpointCapture().emit { record, _ in state.apply(record) }
            return state
        }()] {
            #expect(restored.stores["todos"] == nil)
            #expect(restored.versionFloor == 2)
            #expect(restored.pending.isEmpty)  // action 2 was given up before the forget
            let bus = TestBus(journal: MemoryJournal(), restoring: restored) { $0.durability = "batch"; $0.epoch = "e1"; $0.seqBlock = 100 }
            bus.store(1, "todos", handles: ["todo/*"], state: #"{"items":[]}"#)
            let back = bus.take(1)
            #expect(back.map(\.op) == ["registered", "snapshot", "queries"])
            #expect(back[0].num("version") == 3 && back[0].rawText("resumed") == "false")
        }
    }

    @Test("recover: a session's settled outcome survives the restart, a pending one settles to the recovering connection, an unknown id is unknown")
    func recoverAcrossRestart() {
        let before = MemoryJournal()
        let bus1 = Self.durableBus(before)
        bus1.store(1, "todos", handles: ["todo/*"])
        bus1.connect(2)
        bus1.send(2, #"{"op":"hello","protocol":1,"role":"client","session":"s-7"}"#)
        _ = bus1.take(2)
        _ = bus1.take(1)
        bus1.send(2, #"{"op":"dispatch","id":"c-1","type":"todo/add","settle":true}"#)
        bus1.send(1, #"{"op":"done","store":"todos","seq":1}"#)
        bus1.send(2, #"{"op":"dispatch","id":"c-2","type":"todo/add","settle":true}"#)
        #expect(bus1.take(2).map(\.op) == ["settled"])
        let bus = Self.durableBus(MemoryJournal(), from: before)
        bus.connect(5)
        bus.send(5, #"{"op":"hello","protocol":1,"role":"client","session":"s-7"}"#)
        _ = bus.take(5)
        bus.send(5, #"{"op":"recover","id":"r","ids":["c-1","c-2","c-3"]}"#)
        let got = bus.take(5)
        #expect(got.map(\.op) == ["recovered"])
        #expect(got[0].rawText("outcomes") == #"[{"id":"c-1","status":"settled","seq":1,"results":[{"store":"todos","status":"done","version":0}]},{"id":"c-2","status":"pending","seq":2},{"id":"c-3","status":"unknown"}]"#)
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.send(1, #"{"op":"done","store":"todos","seq":2}"#)
        let settled = bus.take(5)
        #expect(settled.map(\.op) == ["settled"])
        #expect(settled[0].str("id") == "c-2")
        // Another user's connection with the same session name sees nothing of it.
        bus.feed(.connected(9, PeerCredentials(pid: 9, uid: 4242)))
        bus.send(9, #"{"op":"hello","protocol":1,"role":"client","session":"s-7"}"#)
        _ = bus.take(9)
        bus.send(9, #"{"op":"recover","ids":["c-1"]}"#)
        #expect(bus.take(9)[0].rawText("outcomes") == #"[{"id":"c-1","status":"unknown"}]"#)
    }

    @Test("recover needs a session; a full or failed journal refuses new work with its own code")
    func refusals() {
        let journal = MemoryJournal()
        let bus = Self.durableBus(journal)
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"recover","ids":["x"]}"#)
        #expect(bus.take(2)[0].str("code") == "bad-message")
        journal.refusal = .diskFull("test")
        bus.send(2, #"{"op":"dispatch","id":"a","type":"todo/x"}"#)
        #expect(bus.take(2)[0].str("code") == "disk-full")
        journal.refusal = .failed("test")
        bus.send(2, #"{"op":"dispatch","id":"b","type":"todo/x"}"#)
        #expect(bus.take(2)[0].str("code") == "journal-failed")
        journal.refusal = nil
        bus.send(2, #"{"op":"dispatch","id":"c","type":"todo/x"}"#)
        #expect(bus.take(2).isEmpty)
    }

    @Test("a durable router's shutdown keeps unsettled actions (bye restart) instead of settling them shutting-down")
    func durableShutdownKeepsWork() {
        let journal = MemoryJournal()
        let bus = Self.firstRun(journal)
        #expect(bus.take(2).map(\.op) == ["settled"])
        bus.feed(.shutdown)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["bye"])
        #expect(got[0].str("reason") == "restart")
        #expect(journal.state().pending.keys.sorted() == [2])
    }

    @Test("a checkpoint restores what the whole journal restores")
    func checkpointEqualsJournal() {
        let journal = MemoryJournal()
        let bus = Self.firstRun(journal)
        var checkpoint = JournalState()
        bus.router.checkpointRecords { r, _ in checkpoint.apply(r) }
        let full = journal.state()
        #expect(checkpoint.stores == full.stores)
        #expect(checkpoint.pending == full.pending)
        #expect(checkpoint.nextSeq == full.nextSeq)
    }

    @Test("dispatch.seq: forbidden unless fluxd replays; a replaying fluxd gives exactly that seq, only above the last")
    func replayedSeqs() {
        let normal = TestBus()
        normal.store(1, "todos", handles: ["todo/*"])
        normal.join(2, role: "client")
        normal.send(2, #"{"op":"dispatch","id":"a","type":"todo/x","seq":7}"#)
        #expect(normal.take(2)[0].str("code") == "forbidden")
        let bus = TestBus { $0.replay = true }
        bus.store(1, "todos", handles: ["todo/*"])
        bus.join(2, role: "client")
        _ = bus.take(1)
        bus.send(2, #"{"op":"dispatch","id":"a","type":"todo/x","seq":7}"#)
        #expect(bus.take(1).map { $0.num("seq") } == [7])
        bus.send(2, #"{"op":"dispatch","id":"b","type":"todo/x","seq":7}"#)
        #expect(bus.take(2)[0].str("code") == "bad-message")
        bus.send(2, #"{"op":"dispatch","id":"c","type":"todo/x"}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":7}"#)
        #expect(bus.take(1).map { $0.num("seq") } == [8])
    }

    @Test("welcome announces the epoch, the durability and the outcome window")
    func welcome() {
        let bus = Self.durableBus(MemoryJournal())
        bus.connect(1)
        bus.send(1, #"{"op":"hello","protocol":1,"role":"client"}"#)
        let w = bus.take(1)[0]
        #expect(w.str("epoch") == "e1" && w.str("durability") == "batch")
        #expect(try! Envelope(body: Array(w.raw("limits")!)).num("outcomeWindow") == 600_000)
    }
}

extension DurabilityTests {
    @Test("kept outcomes count against their user's share of the memory budget, and are released when the window lets them go")
    func outcomesAreCharged() {
        let bus = Self.durableBus(MemoryJournal()) { $0.maxOutcomes = 2 }
        bus.store(1, "todos", handles: ["todo/*"])
        bus.connect(2)
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client","session":"s"}"#)
        _ = bus.take(2)
        _ = bus.take(1)
        let before = bus.router.memory.used
        for (seq, id) in ["a", "b"].enumerated() {
            bus.send(2, #"{"op":"dispatch","id":"\#(id)","type":"todo/x","settle":true}"#)
            bus.send(1, #"{"op":"done","store":"todos","seq":\#(seq + 1)}"#)
        }
        let withTwo = bus.router.memory.used
        #expect(withTwo > before)
        #expect(bus.router.outcomes.count == 2)
        bus.advance(700_000)  // past the outcome window
        bus.send(2, #"{"op":"recover","ids":["a"]}"#)
        #expect(bus.take(2).last?.rawText("outcomes") == #"[{"id":"a","status":"unknown"}]"#)
        #expect(bus.router.outcomes.count == 0)
        #expect(bus.router.memory.used < withTwo)
    }

    @Test("a user's outcomes are kept for the window within its own quota: past it its session dispatches are refused outcome-quota, unsent, and another user's are not touched")
    func outcomesPerUser() {
        let bus = Self.durableBus(MemoryJournal()) { $0.maxOutcomes = 3 }
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 1000)))
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client","session":"s"}"#)
        bus.feed(.connected(3, PeerCredentials(pid: 3, uid: 2000)))
        bus.send(3, #"{"op":"hello","protocol":1,"role":"client","session":"s"}"#)
        _ = bus.take(2)
        _ = bus.take(3)
        // The other user settles one dispatch first: its outcome must outlive the flood below.
        bus.send(3, #"{"op":"dispatch","id":"mine","type":"todo/x","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":1}"#)
        #expect(bus.take(3).map(\.op) == ["settled"])
        // User 1000: two settled and one unsettled take its three slots; the fourth is refused and gets no seq.
        bus.send(2, #"{"op":"dispatch","id":"a","type":"todo/x","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":2}"#)
        bus.send(2, #"{"op":"dispatch","id":"b","type":"todo/x","settle":true}"#)
        bus.send(1, #"{"op":"done","store":"todos","seq":3}"#)
        bus.send(2, #"{"op":"dispatch","id":"c","type":"todo/x","settle":true}"#)
        #expect(bus.take(2).map(\.op) == ["settled", "settled"])
        #expect(bus.take(1).map(\.op) == ["action", "action", "action", "action"])
        bus.send(2, #"{"op":"dispatch","id":"d","type":"todo/x","settle":true}"#)
        let refused = bus.take(2)
        #expect(refused.map(\.op) == ["error"])
        #expect(refused.first?.str("code") == "outcome-quota")
        #expect(refused.first?.str("ref") == "d")
        #expect(bus.take(1).isEmpty)  // not sent
        // Without a session (or without settle) nothing is kept, so nothing is refused.
        bus.send(2, #"{"op":"dispatch","type":"todo/x"}"#)
        #expect(bus.take(1).map(\.op) == ["action"])
        // The other user is untouched: its outcome is still there and it may dispatch under its session.
        bus.send(3, #"{"op":"recover","id":"r","ids":["mine"]}"#)
        #expect(bus.take(3).first?.rawText("outcomes")?.contains(#""id":"mine","status":"settled""#) == true)
        bus.send(3, #"{"op":"dispatch","id":"more","type":"todo/x","settle":true}"#)
        #expect(bus.take(3).isEmpty)  // accepted (it settles when the store answers)
        #expect(bus.take(1).map(\.op) == ["action"])
        // User 1000's own outcomes are all kept; once the window lets them go it may dispatch again.
        bus.send(2, #"{"op":"recover","id":"r","ids":["a","b","c","d"]}"#)
        #expect(bus.take(2).first?.rawText("outcomes") == #"[{"id":"a","status":"settled","seq":2,"results":[{"store":"todos","status":"done","version":0}]},{"id":"b","status":"settled","seq":3,"results":[{"store":"todos","status":"done","version":0}]},{"id":"c","status":"pending","seq":4},{"id":"d","status":"unknown"}]"#)
        bus.advance(700_000)
        bus.send(2, #"{"op":"dispatch","id":"e","type":"todo/x","settle":true}"#)
        #expect(bus.take(2).isEmpty)
    }

    @Test("recover looks each id up: among a thousand unsettled dispatches of other sessions and users it finds its own, pending and settled, and a second connection with the session takes the settlement")
    func recoverIsIndexedBySession() {
        let bus = Self.durableBus(MemoryJournal())
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 1000)))
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client","session":"other"}"#)
        _ = bus.take(2)
        for i in 0..<1000 {
            bus.send(2, #"{"op":"dispatch","id":"x-\#(i)","type":"todo/x","settle":true}"#)
        }
        bus.feed(.connected(3, PeerCredentials(pid: 3, uid: 1000)))
        bus.send(3, #"{"op":"hello","protocol":1,"role":"client","session":"mine"}"#)
        _ = bus.take(3)
        bus.send(3, #"{"op":"dispatch","id":"x-1","type":"todo/x","settle":true}"#)
        // A second connection of the same user and session: recover moves the pending settlement to it.
        bus.feed(.connected(4, PeerCredentials(pid: 4, uid: 1000)))
        bus.send(4, #"{"op":"hello","protocol":1,"role":"client","session":"mine"}"#)
        _ = bus.take(4)
        bus.send(4, #"{"op":"recover","id":"r","ids":["x-1","x-2"]}"#)
        #expect(bus.take(4).first?.rawText("outcomes") == #"[{"id":"x-1","status":"pending","seq":1001},{"id":"x-2","status":"unknown"}]"#)
        #expect(bus.router.pendingSessions.count == 1001)
        // The store answers everything; x-1 of "mine" settles to connection 4 only.
        _ = bus.take(1)
        for seq in 1...1001 { bus.send(1, #"{"op":"done","store":"todos","seq":\#(seq)}"#); _ = bus.take(1) }
        #expect(bus.take(3).isEmpty)
        let settled = bus.take(4)
        #expect(settled.map(\.op) == ["settled"] && settled.first?.num("seq") == 1001)
        #expect(bus.router.pendingSessions.isEmpty && bus.router.pendingSessionCounts.isEmpty)
        bus.send(3, #"{"op":"recover","id":"r","ids":["x-1"]}"#)
        #expect(bus.take(3).first?.rawText("outcomes")?.contains(#""status":"settled","seq":1001"#) == true)
    }

    @Test("an outcome is kept whatever its user's memory share, but a large store error in it is then kept as its code alone")
    func outcomeOverTheShareKeepsTheCode() {
        let bus = Self.durableBus(MemoryJournal()) { $0.memory.perUser = 200_000 }
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 1000)))
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client","session":"s"}"#)
        _ = bus.take(2)
        let message = String(repeating: "x", count: 300_000)
        for (seq, id) in ["small", "large"].enumerated() {
            bus.send(2, #"{"op":"dispatch","id":"\#(id)","type":"todo/x","settle":true}"#)
            let text = id == "small" ? "no" : message
            bus.send(1, #"{"op":"reject","store":"todos","seq":\#(seq + 1),"error":{"code":"\#(id)-code","message":"\#(text)"}}"#)
        }
        #expect(bus.take(2).map(\.op) == ["settled", "settled"])
        #expect(bus.router.memory.used < 1_000_000)
        bus.send(2, #"{"op":"recover","id":"r","ids":["small","large"]}"#)
        let outcomes = bus.take(2).first?.rawText("outcomes") ?? ""
        #expect(outcomes.contains(#"{"code":"small-code","message":"no"}"#))
        #expect(outcomes.contains(#"{"code":"large-code","message":"(the store's error of 300"#))
        #expect(outcomes.utf8.count < 2000)
    }


    @Test("a user over its share of the journal's disk gets disk-quota for new work (dispatch, a new registration, a state outside an action) while another user's work goes on and accepted work finishes")
    func diskQuota() {
        let journal = MemoryJournal()
        journal.diskPerUser = 4000
        let bus = Self.durableBus(journal)
        bus.feed(.connected(1, PeerCredentials(pid: 1, uid: 1000)))
        bus.send(1, #"{"op":"hello","protocol":1,"role":"store"}"#)
        bus.send(1, #"{"op":"register","store":"big","handles":["big/*"]}"#)
        bus.feed(.connected(2, PeerCredentials(pid: 2, uid: 1000)))
        bus.send(2, #"{"op":"hello","protocol":1,"role":"client"}"#)
        bus.feed(.connected(3, PeerCredentials(pid: 3, uid: 2000)))
        bus.send(3, #"{"op":"hello","protocol":1,"role":"client"}"#)
        bus.feed(.connected(4, PeerCredentials(pid: 4, uid: 2000)))
        bus.send(4, #"{"op":"hello","protocol":1,"role":"store"}"#)
        bus.send(4, #"{"op":"register","store":"small","handles":["small/*"]}"#)
        for p: PeerID in 1...4 { _ = bus.take(p) }
        // uid 1000 dispatches a 3 KB payload and its store answers with a 3 KB state: over its 4000 bytes.
        let big = String(repeating: "x", count: 3000)
        bus.send(2, #"{"op":"dispatch","id":"a","type":"big/x","settle":true,"payload":"\#(big)"}"#)
        #expect(bus.take(1).map(\.op) == ["action"])
        #expect(journal.isOverDiskShare(1000) == false)
        bus.send(1, #"{"op":"done","store":"big","seq":1,"state":"\#(big)"}"#)
        #expect(bus.take(2).map(\.op) == ["settled"])
        #expect(journal.isOverDiskShare(1000))
        // Its next dispatch is refused with its own code; a registration of a new name too.
        bus.send(2, #"{"op":"dispatch","id":"b","type":"big/x","settle":true}"#)
        let refused = bus.take(2)
        #expect(refused.first?.str("code") == "disk-quota")
        #expect(refused.first?.str("message")?.contains("uid 1000") == true)
        bus.send(1, #"{"op":"register","store":"another","handles":["x/*"]}"#)
        #expect(bus.take(1).first?.str("code") == "disk-quota")
        // The other user goes on: dispatch, its store answers with a state, settled.
        bus.send(3, #"{"op":"dispatch","id":"c","type":"small/x","settle":true}"#)
        #expect(bus.take(4).map(\.op) == ["action"])
        bus.send(4, #"{"op":"done","store":"small","seq":2,"state":{"n":1}}"#)
        #expect(bus.take(3).map(\.op) == ["settled"])
        // A dispatch of the other user to uid 1000's store is accepted (the dispatcher is within its share), and
        // the store's answer with a state finishes accepted work: journaled, settled. A state outside an action is
        // new work: the store's connection is closed with disk-quota.
        bus.send(3, #"{"op":"dispatch","id":"d","type":"big/x","settle":true}"#)
        #expect(bus.take(1).map(\.op) == ["action"])
        bus.send(1, #"{"op":"done","store":"big","seq":3,"state":"again"}"#)
        #expect(bus.take(3).map(\.op) == ["settled"])
        bus.send(1, #"{"op":"state","store":"big","state":"unasked"}"#)
        let closed = bus.take(1)
        #expect(closed.first?.str("code") == "disk-quota")
        #expect(closed.first?.rawText("fatal") == "true")
    }


    @Test("with metrics on, a store's registration is charged its series at their most (64 codes) to the registering user, and refused memory-budget past its share")
    func seriesChargedToTheStoresUser() {
        func registrationCharge(metrics: Bool) -> Int {
            let bus = TestBus { if metrics { $0.metricsClock = { 0 } } }
            bus.join(1, role: "store")
            let before = bus.router.memory.byUser.values.reduce(0, +)
            for i in 0..<20 { bus.send(1, #"{"op":"register","store":"s\#(i)","handles":["s\#(i)/*"]}"#) }
            _ = bus.take(1)
            return bus.router.memory.byUser.values.reduce(0, +) - before
        }
        let with = registrationCharge(metrics: true), without = registrationCharge(metrics: false)
        #expect(with - without >= 20 * StoreStats.maxRejectionCodes * 256, "\(with) vs \(without)")
        // A user whose share holds fewer stores' series is refused the next registration.
        let bus = TestBus {
            $0.metricsClock = { 0 }
            $0.memory.perUser = 200_000
        }
        bus.join(1, role: "store")
        var refused = 0
        for i in 0..<20 {
            bus.send(1, #"{"op":"register","store":"t\#(i)","handles":[]}"#)
            if bus.take(1).contains(where: { $0.str("code") == "memory-budget" }) { refused += 1 }
        }
        #expect(refused > 0 && refused < 20)
    }

}
