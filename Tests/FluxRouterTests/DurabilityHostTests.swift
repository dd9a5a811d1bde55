import FluxCore
import FluxJournal
@testable import FluxRouter
import Testing

/// The host of durability in the core (`DaemonCore.commitJournal`, issue 27): the same policy fluxd runs, on a
/// `MemoryJournal` that fails writes when told, so these run without a disk. `TestBus(journal:)` holds every
/// frame until the end of its batch, commits, and delivers only if the journal wrote; each delivered frame is
/// checked against the written records (`revealedUnwritten`).
struct DurabilityHostTests {
    static func bus(_ journal: MemoryJournal) -> TestBus {
        TestBus(journal: journal) {
            $0.durability = "batch"
            $0.epoch = "e1"
            $0.seqBlock = 100
        }
    }

    static func dispatch(_ id: String, _ t: String) -> String {
        #"{"op":"dispatch","id":"\#(id)","type":"todo/add","payload":{"t":"\#(t)"},"settle":true}"#
    }

    @Test("a full disk holds every frame until a write succeeds; the records waiting are charged to the memory budget; then the frames go, in order")
    func heldUntilWritten() {
        let journal = MemoryJournal()
        let bus = Self.bus(journal)
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"items":[]}"#)
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        _ = bus.take(1)
        let usedBefore = bus.router.memory.used

        journal.failWrites = .diskFull
        bus.send(2, Self.dispatch("c-1", "milk"))
        // Accepted and staged, not written: nothing that reveals it goes out.
        #expect(bus.take(1).isEmpty && bus.take(2).isEmpty)
        #expect(bus.heldFrames == 1 && journal.hasStaged && journal.isRefusing)
        #expect(bus.router.memory.used == usedBefore + journal.stagedBytes && journal.stagedBytes > 0)
        #expect(bus.logs.contains { $0.contains("frames are held until a write succeeds") })
        // New work is refused disk-full meanwhile; the refusal waits behind the held frames too.
        bus.send(3, Self.dispatch("c-2", "eggs"))
        #expect(bus.take(3).isEmpty && bus.heldFrames == 2)
        // Still failing: the timer's retry writes nothing, nothing goes.
        bus.advance(100)
        bus.journalTimer()
        #expect(bus.take(1).isEmpty && bus.heldFrames == 2)

        journal.failWrites = nil
        bus.journalTimer()
        #expect(bus.heldFrames == 0 && !journal.hasStaged && !journal.isRefusing)
        let action = bus.take(1)
        #expect(action.map(\.op) == ["action"] && action.first?.num("seq") == 1)
        #expect(bus.take(3).map { $0.str("code") } == ["disk-full"])
        #expect(bus.router.memory.used == usedBefore)
        #expect(bus.logs.contains { $0.contains("written again; the frames held back go out") })
        #expect(bus.logs.contains { $0.contains("space is back") })
        // Work goes on as before.
        bus.send(1, #"{"op":"done","store":"todos","seq":1,"state":{"items":["milk"]}}"#)
        #expect(bus.take(2).map(\.op) == ["settled"])
        bus.send(3, Self.dispatch("c-3", "tea"))
        #expect(bus.take(1).map { $0.num("seq") } == [2])
        #expect(bus.revealedUnwritten.isEmpty, "\(bus.revealedUnwritten)")
    }

    @Test("no frame reveals an unwritten record: random dispatches, answers and failing writes")
    func nothingRevealedUnwritten() {
        var rng = SplitMixR(state: 27)
        let journal = MemoryJournal()
        let bus = Self.bus(journal)
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"n":0}"#)
        bus.store(4, "stats", handles: ["todo/*"], state: #"{"n":0}"#)
        bus.join(2, role: "client")
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos"}"#)
        var delivered: [PeerID: [Int64]] = [1: [], 4: []]
        var answered: [PeerID: Int] = [1: 0, 4: 0]
        var dispatched = 0
        var settled = 0
        var refused = 0
        func collect() {
            for store in [PeerID(1), 4] { delivered[store]! += bus.take(store).filter { $0.op == "action" }.compactMap { $0.num("seq") } }
            for env in bus.take(2) {
                if env.op == "settled" { settled += 1 } else if env.op == "error" { refused += 1 }
            }
            _ = bus.take(3)
        }
        /// The store answers its oldest delivered, unanswered action; false if there is none.
        func answerNext(_ store: PeerID) -> Bool {
            guard answered[store]! < delivered[store]!.count else { return false }
            let seq = delivered[store]![answered[store]!]
            answered[store]! += 1
            let name = store == 1 ? "todos" : "stats"
            bus.send(store, #"{"op":"done","store":"\#(name)","seq":\#(seq),"state":{"n":\#(seq)}}"#)
            return true
        }
        for _ in 0..<600 {
            switch rng.below(10) {
            case 0:
                journal.failWrites = journal.failWrites == nil ? .diskFull : nil
            case 1:
                bus.advance(10)
                bus.journalTimer()
            case 2, 3, 4:
                dispatched += 1
                bus.send(2, Self.dispatch("c-\(dispatched)", "x"))
            default:
                _ = answerNext(rng.below(2) == 0 ? 1 : 4)
            }
            collect()
            #expect(bus.revealedUnwritten.isEmpty, "\(bus.revealedUnwritten)")
            if !bus.revealedUnwritten.isEmpty { return }
        }
        // Writes succeed again: everything held goes out, every accepted dispatch settles once answered.
        journal.failWrites = nil
        bus.journalTimer()
        collect()
        for store in [PeerID(1), 4] {
            while answerNext(store) { collect() }
        }
        #expect(bus.heldFrames == 0)
        #expect(settled + refused == dispatched && settled > 50 && refused > 0, "\(settled) settled, \(refused) refused of \(dispatched)")
        #expect(bus.revealedUnwritten.isEmpty)
        // What the journal wrote is what a restart recovers: every settled action's results are in it.
        #expect(journal.recovered().lastSeq >= UInt64(settled))
    }

    @Test("a write that failed for good: new work is refused journal-failed; in `always` mode the frames stay held")
    func failedForGood() {
        for always in [false, true] {
            let journal = MemoryJournal()
            journal.holdsFramesWhenFailed = always
            let bus = Self.bus(journal)
            bus.store(1, "todos", handles: ["todo/*"], state: #"{"items":[]}"#)
            bus.join(2, role: "client")
            _ = bus.take(1)
            journal.failWrites = .failed
            bus.send(2, Self.dispatch("c-1", "milk"))
            #expect(bus.take(1).map(\.op) == (always ? [] : ["action"]), "always: \(always)")
            #expect(bus.logs.filter { $0.hasPrefix("journal: the memory journal's writes failed") }.count == 1)
            bus.send(2, Self.dispatch("c-2", "eggs"))
            #expect(bus.take(2).map { $0.str("code") } == (always ? [] : ["journal-failed"]))
            #expect(bus.heldFrames == (always ? 2 : 0))
        }
    }
}
