import FluxCore
import Testing
@testable import FluxRouter

/// The policies the daemon core adds around the router, through a transport whose backlog the test sets: slow
/// consumers, monitors that are behind, transport bytes against the memory budget, host operations, and the
/// notifications a host reacts to.
@Suite("DaemonCore: the semantics fluxd, the in-memory bus and these tests share")
struct DaemonCoreTests {
    /// A transport whose queues never drain by themselves: `backlog[peer]` bytes wait, plus what was written.
    final class FakeTransport: DaemonTransport {
        var backlog: [PeerID: Int] = [:]
        var partial: [PeerID: Int] = [:]
        var frames: [PeerID: [Envelope]] = [:]
        var closes: [(PeerID, Millis?)] = []
        var discarded: [PeerID] = []
        var charges: [PeerID: Int] = [:]

        func write(_ frame: Frame, to peer: PeerID) -> Int {
            frames[peer, default: []].append(try! Envelope(body: frame.bodyArray))
            backlog[peer, default: 0] += frame.bytes.count
            return backlog[peer]!
        }
        func queuedBytes(of peer: PeerID) -> Int { backlog[peer] ?? 0 }
        func accountableBytes(of peer: PeerID) -> Int { (backlog[peer] ?? 0) + (partial[peer] ?? 0) }
        func charged(_ bytes: Int, for peer: PeerID) { charges[peer] = bytes }
        func discardQueued(of peer: PeerID) {
            discarded.append(peer)
            backlog[peer] = 0
        }
        func close(_ peer: PeerID, cutOffAfter: Millis?) { closes.append((peer, cutOffAfter)) }
        func requestEndOfBatch() {}

        func take(_ peer: PeerID) -> [Envelope] {
            defer { frames[peer] = [] }
            return frames[peer] ?? []
        }
        /// The peer read everything.
        func drain(_ peer: PeerID) { backlog[peer] = 0 }
    }

    final class Harness {
        let transport = FakeTransport()
        let core: DaemonCore
        var now: Millis = 1000
        var changes: [StoreChange] = []

        init(_ configure: (inout DaemonCoreConfig) -> Void = { _ in }) {
            var config = DaemonCoreConfig()
            configure(&config)
            core = DaemonCore(config: config, transport: transport)
            core.onStoreChange = { [unowned self] in self.changes.append($0) }
        }

        func send(_ peer: PeerID, _ json: String) { core.handle(.frame(peer, Array(json.utf8)), now: now) }

        func join(_ peer: PeerID, role: String, uid: UInt32 = 1000, gid: UInt32? = nil) {
            core.handle(.connected(peer, PeerCredentials(pid: Int32(peer), uid: uid, gid: gid)), now: now)
            send(peer, #"{"op":"hello","protocol":1,"role":"\#(role)","name":"p\#(peer)"}"#)
            #expect(transport.take(peer).map { $0.string("op").value } == ["welcome"])
            transport.drain(peer)
        }
    }

    @Test("a peer whose unread bytes pass maxBacklog gets slow-consumer, what waited is dropped, and it is cut off after the grace")
    func slowConsumer() {
        let h = Harness {
            $0.router.maxBacklog = 4096
            $0.slowConsumerGrace = 750
        }
        h.join(1, role: "store")
        h.send(1, #"{"op":"register","store":"s","handles":["t"],"state":{"n":0}}"#)
        h.join(2, role: "client")
        h.transport.backlog[2] = 4000  // peer 2 reads nothing
        h.send(2, #"{"op":"subscribe","store":"s"}"#)
        h.send(2, #"{"op":"get","id":"g","store":"s"}"#)
        h.send(2, #"{"op":"info","id":"i"}"#)  // the info reply alone passes 4096
        #expect(h.transport.discarded.contains(2))
        let last = h.transport.take(2).last
        #expect(last?.string("op").value == "error" && last?.string("code").value == "slow-consumer")
        #expect(h.transport.closes.contains { $0.0 == 2 && $0.1 == 750 })
        #expect(h.core.router.counters.errors["slow-consumer"] == 1)
        // The store is untouched.
        #expect(!h.transport.closes.contains { $0.0 == 1 })
    }

    @Test("a monitor that is behind misses events and is told how many before the next one")
    func monitorMissesEvents() {
        let h = Harness { $0.monitorBacklogLimit = 100 }
        h.join(1, role: "store")
        h.join(3, role: "monitor")
        h.send(1, #"{"op":"register","store":"s","handles":["t"],"state":{"n":0}}"#)
        #expect(h.transport.take(3).map { $0.string("kind").value } == ["store-up", "snapshot"])
        h.transport.backlog[3] = 1000
        h.join(2, role: "client")  // a connect event, missed
        h.send(2, #"{"op":"dispatch","type":"t"}"#)  // a dispatch event, missed
        #expect(h.transport.take(3).isEmpty)
        h.transport.drain(3)
        h.send(1, #"{"op":"done","store":"s","seq":1}"#)
        let got = h.transport.take(3)
        #expect(got.first?.string("op").value == "missed")
        #expect(got.first?.int("count").value == 2)
        #expect(got.dropFirst().allSatisfy { $0.string("op").value == "event" } && got.count > 1)
        #expect(!h.transport.closes.contains { $0.0 == 3 })
    }

    @Test("privileged operations (restart-worker, stop-worker, reload, history, state-at, forget) only from fluxd's uid, root and the admins: another uid gets forbidden and stays connected; workers is open to all")
    func privilegedOperations() {
        let h = Harness { $0.router.admins = .owner(1000, uids: [3000], gids: [50]) }
        var asked: [HostRequest] = []
        for op in [Op.workers, .restartWorker, .stopWorker, .reload] {
            h.core.handleHostOperation(op) { _, request in
                asked.append(request)
                return .error(.unknownWorker, "no worker named \"x\"")
            }
        }
        h.join(2, role: "client", uid: 2000)          // another user
        h.join(3, role: "client", uid: 1000)          // fluxd's own
        h.join(4, role: "client", uid: 0)             // root
        h.join(5, role: "client", uid: 3000)          // an admin by uid
        h.join(6, role: "client", uid: 2001, gid: 50) // an admin by group
        for op in ["restart-worker", "stop-worker"] {
            h.send(2, #"{"op":"\#(op)","id":"r","name":"x"}"#)
            let refused = h.transport.take(2)
            #expect(refused.map { $0.string("code").value } == ["forbidden"], "\(op)")
            #expect(refused.first?.string("ref").value == "r")
        }
        h.send(2, #"{"op":"reload","id":"re"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "forbidden")
        h.send(2, #"{"op":"history","id":"h"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "forbidden")
        h.send(2, #"{"op":"state-at","id":"s","store":"todos","seq":1}"#)
        #expect(h.transport.take(2).first?.string("code").value == "forbidden")
        h.send(2, #"{"op":"forget","id":"f","store":"todos"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "forbidden")
        #expect(asked.isEmpty, "no refused request reaches the host")
        #expect(!h.transport.closes.contains { $0.0 == 2 }, "forbidden is not fatal")
        h.send(2, #"{"op":"workers","id":"w"}"#)
        #expect(asked.count == 1, "workers (a read of the supervisor's state) is open to every peer")
        _ = h.transport.take(2)
        for peer: PeerID in [3, 4, 5, 6] {
            h.send(peer, #"{"op":"restart-worker","id":"r","name":"x"}"#)
            #expect(h.transport.take(peer).first?.string("code").value == "unknown-worker", "peer \(peer) reached the host")
            // (this core has no journal: a permitted journal read is answered not-retained)
            h.send(peer, #"{"op":"history","id":"h"}"#)
            #expect(h.transport.take(peer).first?.string("code").value == "not-retained", "peer \(peer)")
            h.send(peer, #"{"op":"reload","id":"re"}"#)
            _ = h.transport.take(peer)
            h.send(peer, #"{"op":"forget","id":"f","store":"todos"}"#)  // (permitted: the router answers)
            #expect(h.transport.take(peer).first?.string("code").value == "unknown-store", "peer \(peer)")
        }
        #expect(asked.count == 9)
        #expect(asked.filter { $0.op == .reload }.count == 4, "reload reached the host for fluxd's user, root and the admins")
    }

    /// A harness whose `workers` handler answers later (as fluxd's journal reads do) and `restart-worker` at once.
    final class Deferred {
        let h: Harness
        var tickets: [HostTicket] = []
        init(_ configure: (inout DaemonCoreConfig) -> Void = { _ in }) {
            h = Harness(configure)
            h.core.handleHostOperation(.workers) { [unowned self] peer, request in
                self.h.core.answerLater(peer, request) { self.tickets.append($0) }
            }
            h.core.handleHostOperation(.restartWorker) { _, _ in .error(.unknownWorker, "no worker named \"x\"") }
        }
        func reply(_ id: String) -> HostAnswer {
            var b = FrameBuilder(op: "workers")
            b.string("id", id)
            b.key("workers")
            b.rawBytes(Array(#"[]"#.utf8))
            return .reply(b.finish())
        }
        func complete(_ i: Int, _ id: String) { h.core.complete(tickets[i], with: reply(id), now: h.now) }
        func ids(_ peer: PeerID) -> [String] {
            h.transport.take(peer).map { $0.string("id").value ?? $0.string("ref").value ?? "?" }
        }
    }

    @Test("host answers that come later: a peer's host requests are answered in the order it sent them, its other requests at once, and the router counts them")
    func deferredAnswersKeepOrder() {
        let d = Deferred()
        d.h.join(2, role: "client")
        d.h.join(3, role: "client")
        d.h.send(2, #"{"op":"workers","id":"w1"}"#)
        d.h.send(2, #"{"op":"workers","id":"w2"}"#)
        d.h.send(2, #"{"op":"restart-worker","id":"r1","name":"x"}"#)  // answered at once, but sent after w1, w2
        d.h.send(2, #"{"op":"info","id":"i"}"#)  // not a host operation: answered at once
        #expect(d.ids(2) == ["i"])
        d.h.send(3, #"{"op":"restart-worker","id":"r3","name":"x"}"#)  // another peer does not wait
        #expect(d.ids(3) == ["r3"])
        #expect(d.tickets.count == 2 && d.h.core.deferredHostAnswers == 2)
        let framesOut = d.h.core.router.counters.traffic.framesOut
        d.complete(1, "w2")  // the second one's answer first: it waits for w1's
        #expect(d.ids(2).isEmpty)
        d.complete(0, "w1")
        #expect(d.ids(2) == ["w1", "w2", "r1"])
        #expect(d.h.core.router.counters.traffic.framesOut == framesOut + 3)
        #expect(d.h.core.router.counters.errors["unknown-worker"] == 2)
        #expect(d.h.core.deferredHostAnswers == 0)
        d.complete(0, "w1")  // a ticket completed twice: ignored
        #expect(d.ids(2).isEmpty)
        // With nothing outstanding, host answers go out at once again.
        d.h.send(2, #"{"op":"restart-worker","id":"r2","name":"x"}"#)
        #expect(d.ids(2) == ["r2"])
    }

    @Test("ping stays a barrier (SPEC §8.7): a pong after a host request answered later waits for that answer; other peers' pongs do not")
    func pongWaitsForLaterAnswers() {
        let d = Deferred()
        d.h.join(2, role: "client")
        d.h.join(3, role: "client")
        d.h.send(2, #"{"op":"workers","id":"w1"}"#)
        d.h.send(2, #"{"op":"ping","id":"p1"}"#)
        d.h.send(2, #"{"op":"info","id":"i"}"#)
        d.h.send(2, #"{"op":"ping","id":"p2"}"#)
        d.h.send(3, #"{"op":"ping","id":"p3"}"#)
        #expect(d.ids(2) == ["i"])
        #expect(d.ids(3) == ["p3"])
        d.complete(0, "w1")
        #expect(d.ids(2) == ["w1", "p1", "p2"])
        d.h.send(2, #"{"op":"ping","id":"p4"}"#)
        #expect(d.ids(2) == ["p4"])
    }

    @Test("a peer that closes before its later answer arrives: the answer is dropped, nothing of it is kept, and it still counts until it arrives")
    func deferredAnswerForClosedPeer() {
        let d = Deferred { $0.maxDeferredTotal = 1 }
        d.h.join(2, role: "client")
        d.h.join(3, role: "client")
        d.h.send(2, #"{"op":"workers","id":"w1"}"#)
        d.h.send(2, #"{"op":"restart-worker","id":"r1","name":"x"}"#)
        d.h.core.handle(.closed(2), now: d.h.now)
        _ = d.h.transport.take(2)
        // Its work is still under way: the total still counts it.
        d.h.send(3, #"{"op":"workers","id":"w3"}"#)
        let refused = d.h.transport.take(3)
        #expect(refused.map { $0.string("code").value } == ["overloaded"])
        #expect(d.h.core.deferredHostAnswers == 1)
        let framesOut = d.h.core.router.counters.traffic.framesOut
        d.complete(0, "w1")
        #expect(d.h.transport.take(2).isEmpty, "nothing is written for a closed peer")
        #expect(d.h.core.router.counters.traffic.framesOut == framesOut)
        #expect(d.h.core.deferredHostAnswers == 0)
        d.h.send(3, #"{"op":"workers","id":"w4"}"#)
        #expect(d.tickets.count == 2)
        d.complete(1, "w4")
        #expect(d.ids(3) == ["w4"])
    }

    @Test("later answers outstanding are bounded per connection and in all: one more is refused overloaded at once (with ref, not fatal), in its turn")
    func deferredAnswerLimits() {
        let d = Deferred {
            $0.maxDeferredPerPeer = 2
            $0.maxDeferredTotal = 3
        }
        d.h.join(2, role: "client")
        d.h.join(3, role: "client")
        d.h.send(2, #"{"op":"workers","id":"a"}"#)
        d.h.send(2, #"{"op":"workers","id":"b"}"#)
        d.h.send(2, #"{"op":"workers","id":"c"}"#)  // a third from this connection: refused, after a and b
        #expect(d.tickets.count == 2)
        #expect(d.h.transport.take(2).isEmpty)
        d.h.join(4, role: "client")
        d.h.send(3, #"{"op":"workers","id":"d"}"#)
        d.h.send(4, #"{"op":"workers","id":"e"}"#)  // a fourth in all: refused at once (nothing before it)
        let refused = d.h.transport.take(4)
        #expect(refused.map { $0.string("code").value } == ["overloaded"])
        #expect(refused.first?.string("ref").value == "e")
        #expect(refused.first?.bool("fatal").value == false)
        d.complete(0, "a")
        d.complete(1, "b")
        let answers = d.h.transport.take(2)
        #expect(answers.map { $0.string("id").value ?? $0.string("ref").value } == ["a", "b", "c"])
        #expect(answers.last?.string("code").value == "overloaded")
        #expect(!d.h.transport.closes.contains { [2, 3, 4].contains($0.0) })
        #expect(d.h.core.router.counters.errors["overloaded"] == 2)
        d.complete(2, "d")
        #expect(d.ids(3) == ["d"])
        // Room again: taken.
        d.h.send(4, #"{"op":"workers","id":"f"}"#)
        #expect(d.tickets.count == 4)
    }

    @Test("host operations are answered by their handlers through the router: replies counted, errors coded with ref")
    func hostOperations() {
        let h = Harness()
        var asked: [HostRequest] = []
        h.core.handleHostOperation(.workers) { _, request in
            asked.append(request)
            var b = FrameBuilder(op: "workers")
            b.string("id", request.id ?? "")
            b.key("workers")
            b.rawBytes(Array(#"[]"#.utf8))
            return .reply(b.finish())
        }
        h.core.handleHostOperation(.restartWorker) { _, _ in .error(.unknownWorker, "no worker named \"x\"") }
        h.join(2, role: "client")
        let framesOut = h.core.router.counters.traffic.framesOut
        h.send(2, #"{"op":"workers","id":"w1"}"#)
        #expect(asked == [.workers(id: "w1")])
        #expect(h.transport.take(2).map { $0.string("op").value } == ["workers"])
        #expect(h.core.router.counters.traffic.framesOut == framesOut + 1)
        h.send(2, #"{"op":"restart-worker","id":"r1","name":"x"}"#)
        let error = h.transport.take(2).first
        #expect(error?.string("code").value == "unknown-worker")
        #expect(error?.string("ref").value == "r1")
        #expect(h.core.router.counters.errors["unknown-worker"] == 1)
        // Not registered: unknown-op. Invalid: bad-message, and the handler is not called.
        h.send(2, #"{"op":"stop-worker","id":"s1","name":"x"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "unknown-op")
        h.send(2, #"{"op":"restart-worker","id":"r2","name":"no/slashes"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "bad-message")
        h.send(2, #"{"op":"workers"}"#)
        #expect(h.transport.take(2).first?.string("code").value == "bad-message")
        #expect(asked.count == 1)
    }

    @Test("store changes reach the host after the event: up with its owner, down when the owner goes")
    func storeChanges() {
        let h = Harness()
        h.join(1, role: "store")
        h.send(1, #"{"op":"register","store":"s","handles":["t"]}"#)
        #expect(h.changes == [StoreChange(store: "s", status: .up, owner: 1, ownerPID: 1)])
        h.core.handle(.closed(1), now: h.now)
        #expect(h.changes.last == StoreChange(store: "s", status: .down))
    }

    @Test("transport bytes are charged to the memory budget; a peer whose bytes do not fit is closed with memory-budget")
    func transportBytesAgainstTheBudget() {
        let h = Harness {
            $0.router.memory.total = 1 << 20
            $0.router.memory.perUser = 512 << 10
            $0.router.memory.connectionAllowance = 1024
        }
        h.join(2, role: "client")
        h.transport.partial[2] = 100 << 10
        h.core.transportBytesChanged(2, now: h.now)
        #expect(h.transport.charges[2] == 100 << 10)
        h.transport.partial[2] = 600 << 10
        h.core.transportBytesChanged(2, now: h.now)
        #expect(h.transport.take(2).last?.string("code").value == "memory-budget")
        #expect(h.transport.closes.contains { $0.0 == 2 && $0.1 != nil })
    }
}
