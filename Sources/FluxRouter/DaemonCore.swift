import FluxCore
import FluxJournal

/// What a `DaemonCore` needs from whatever carries its frames: fluxd's libuv transport (`FluxDaemon.Daemon`),
/// `FluxTesting`'s in-memory bus, or the router tests' bus. An adapter owns the connections; the core owns every
/// decision about them (what to send, when a peer is too slow, what the memory budget allows).
///
/// The core calls these while it handles an event, on the adapter's thread; none of them may feed the core an
/// event. A peer the adapter does not know (closed already) is ignored.
public protocol DaemonTransport: AnyObject {
    /// Queues `frame` for `peer` (written in order, after what was queued before). Returns the bytes now waiting
    /// unwritten for the peer (0 where nothing ever waits, e.g. in memory).
    func write(_ frame: Frame, to peer: PeerID) -> Int
    /// Bytes waiting unwritten for `peer`.
    func queuedBytes(of peer: PeerID) -> Int
    /// Bytes the transport holds for `peer` that count towards fluxd's memory budget: its unfinished frame and
    /// its frames waiting to be written.
    func accountableBytes(of peer: PeerID) -> Int
    /// The core charged `bytes` of the peer's transport bytes to the memory budget: a transport that reports
    /// changes only while something is charged (fluxd's) keeps this.
    func charged(_ bytes: Int, for peer: PeerID)
    /// Drops what waits unwritten for `peer` (a write already in progress finishes).
    func discardQueued(of peer: PeerID)
    /// Closes `peer`'s connection after writing what was queued for it; with `cutOffAfter`, closes it without
    /// waiting for those writes once that many milliseconds have passed. The adapter reports `.closed(peer)`
    /// once it is gone.
    func close(_ peer: PeerID, cutOffAfter: Millis?)
    /// Asks the adapter to feed `.endOfBatch` before it writes what this batch of reads produced.
    func requestEndOfBatch()
    /// Runs `preparation` off the loop thread and feeds `.prepared(peer, preparation.run())` once it is done
    /// (after the current event); false when the adapter has no other thread (the core then runs it itself,
    /// right after the event). Default: false.
    func startPreparation(_ preparation: Preparation, for peer: PeerID) -> Bool
    /// Releases `garbage` off the loop thread if the adapter has another (default: released here, at once).
    func discard(_ garbage: Garbage)
}

extension DaemonTransport {
    public func startPreparation(_ preparation: Preparation, for peer: PeerID) -> Bool { false }
    public func discard(_ garbage: Garbage) {}
}

/// How a `DaemonCore` treats its peers beyond the router's own limits.
public struct DaemonCoreConfig: Sendable {
    /// The router's limits and identity.
    public var router = RouterConfig()
    /// How long a connection closed as a slow consumer (`router.maxBacklog`) or over the memory budget has to
    /// read its error before it is cut off.
    public var slowConsumerGrace: Millis = 1000
    /// A monitor whose connection has more than this many bytes waiting misses events (and is told how many with
    /// `missed` before the next one it gets).
    public var monitorBacklogLimit = 1 << 20
    /// Host requests answered later (`DaemonCore.answerLater`: fluxd's journal reads and reloads, done off the
    /// loop thread) outstanding at most per connection, and in all; one more is refused `overloaded` at once. The
    /// total counts a request until its answer arrives, even when its peer closed first, so the work queued off
    /// the loop never exceeds it.
    public var maxDeferredPerPeer = 4
    public var maxDeferredTotal = 16

    public init(router: RouterConfig = RouterConfig()) {
        self.router = router
    }
}

/// The answer of a host-operation handler (`DaemonCore.handleHostOperation`).
public enum HostAnswer: Sendable {
    /// The reply frame (built with `FrameBuilder`; its `id` is the request's).
    case reply(Frame)
    /// A refusal: the peer gets `error` with this code and message, `ref` the request's id.
    case error(ErrorCode, String)
    /// Answered later through `DaemonCore.complete(_:with:now:)`: what `DaemonCore.answerLater` returns once it
    /// took the request (a handler returns it only from there).
    case later
}

/// A host request answered later (`DaemonCore.answerLater`): handed to the work that answers it, and back to the
/// core with the answer (`DaemonCore.complete`). Any thread may hold it; the core takes it on its thread only.
public struct HostTicket: Hashable, Sendable {
    /// The peer that asked.
    public let peer: PeerID
    let serial: UInt64
    let request: String?

    public static func == (a: HostTicket, b: HostTicket) -> Bool { a.serial == b.serial }
    public func hash(into hasher: inout Hasher) { hasher.combine(serial) }
}

/// The one host of fluxd's semantics: the `Router` (SPEC R1-R7, §10) plus the policies that need to know about
/// the transport — a slow consumer is cut off (`maxBacklog`, SPEC §8.5), a monitor that is behind misses events
/// and is told how many (§8.10), transport bytes are charged to the memory budget (§12), host operations are
/// answered by registered handlers through the router (so their replies and errors are counted and monitored like
/// any other) — and the notifications a host reacts to (stores up and down, stalled stores, logs).
///
/// It does no I/O and reads no clock: an adapter (`DaemonTransport`) feeds it events with the time and carries
/// out its writes and closes. fluxd's libuv transport, `FluxTesting.InMemoryBus` and the router tests are three
/// such adapters over this one core (swift-nio's `EmbeddedChannel` idea: tests run the real pipeline).
///
/// Not thread-safe: one thread (fluxd's loop thread) feeds it. `handle` must not be re-entered from the
/// transport's methods; the notification closures run after the event is done and may feed it.
public final class DaemonCore: RouterEffectSink {
    /// The configuration it runs with.
    public let config: DaemonCoreConfig
    /// The dispatcher state machine (read its introspection; feed it only through `handle`).
    public let router: Router
    /// Called for every log line the core makes.
    @exclusivity(unchecked) public var onLog: ((LogLevel, String) -> Void)?
    /// Called when a store comes up or goes down (after the event that did it).
    @exclusivity(unchecked) public var onStoreChange: ((StoreChange) -> Void)?
    /// Called when a store left its oldest action unanswered past `storeTimeout` (after the event): its name, its
    /// owner's pid, and whether its connection is being closed as `unresponsive`.
    @exclusivity(unchecked) public var onStoreStalled: ((String, Int32?, Bool) -> Void)?

    /// (Unowned and unchecked: the adapter owns the core and outlives it; a checked unowned reference cost a
    /// reference-count operation per frame.)
    private unowned(unsafe) let transport: any DaemonTransport
    /// `transport.write`, for the frames of the hot path: the transport held at +0 (`Unmanaged`) inside a closure
    /// made once at init for its concrete type. A call through the `unowned(unsafe)` existential still retained
    /// and released the transport for every frame (issue 27).
    private let writeFrame: (Frame, PeerID) -> Int
    @exclusivity(unchecked) private var hostHandlers: [Op: (PeerID, HostRequest) -> HostAnswer] = [:]
    @exclusivity(unchecked) private var feeding = false
    /// Work found while carrying out an event's effects, done once the router is finished with it.
    @exclusivity(unchecked) private var later = Later()
    /// Peers being closed as slow consumers or over budget: cut off after `slowConsumerGrace`, and no longer
    /// accounted.
    @exclusivity(unchecked) private var cuttingOff: Set<PeerID> = []
    /// What each peer's transport bytes were last charged at, for the peers that have been charged anything.
    @exclusivity(unchecked) private var accounted: [PeerID: Int] = [:]
    /// Monitor events dropped per monitor since its last delivered one.
    @exclusivity(unchecked) private var missedEvents: [PeerID: Int] = [:]
    /// Per peer with a host answer outstanding (`answerLater`): its host requests in order, each with its answer
    /// once known; answers leave from the front only, so a peer's host requests are answered in the order it sent
    /// them. Removed when the peer closes (answers that arrive later are dropped).
    @exclusivity(unchecked) private var hostQueues: [PeerID: [QueuedHostAnswer]] = [:]
    /// Tickets handed out and not completed yet (their peers may have closed): `maxDeferredTotal` bounds them.
    @exclusivity(unchecked) private var outstandingTickets: Set<UInt64> = []
    @exclusivity(unchecked) private var nextTicket: UInt64 = 1
    /// The journal and what the host of durability keeps between batches (DaemonCore+Durability.swift).
    @exclusivity(unchecked) var durability = DurabilityHost()
    /// The journal of a durable bus (nil: ephemeral): committed once per batch (DaemonCore+Durability.swift).
    public let committer: (any JournalCommitting)?

    private struct QueuedHostAnswer {
        var serial: UInt64?
        var ref: String?
        var answer: HostAnswer?
    }

    private struct Later {
        var hostRequests: [(PeerID, HostRequest)] = [] { didSet { isEmpty = false } }
        var storeChanges: [StoreChange] = [] { didSet { isEmpty = false } }
        var stalls: [(String, Int32?, Bool)] = [] { didSet { isEmpty = false } }
        var overLimit: [(PeerID, RouterEvent)] = [] { didSet { isEmpty = false } }
        var toAccount: [PeerID] = [] { didSet { isEmpty = false } }
        var preparations: [(PeerID, Preparation)] = [] { didSet { isEmpty = false } }
        /// Nothing was added (one flag read after every event, not six arrays'; only ever added to, then
        /// replaced whole).
        private(set) var isEmpty = true
    }

    /// How far a peer's queued bytes may grow past what was charged before a write charges them again.
    static let accountingSlack = 256 << 10
    /// Queues up to this size need no look at the peer after a write (below both the slack and `maxBacklog`).
    private let checkAbove: Int

    /// A core that writes through `transport` (kept unowned: the adapter owns the core); durable with `journal`
    /// once `attachJournal` restored what it recovered.
    public init<Transport: DaemonTransport>(config: DaemonCoreConfig, transport: Transport,
                                            journal: (any JournalCommitting)? = nil) {
        self.config = config
        self.committer = journal
        self.router = Router(config: config.router, journal: journal)
        self.transport = transport
        let unretained = Unmanaged.passUnretained(transport)
        self.writeFrame = { frame, peer in unretained._withUnsafeGuaranteedRef { $0.write(frame, to: peer) } }
        self.checkAbove = min(Self.accountingSlack, config.router.maxBacklog)
    }

    /// Answers host operation `op` (SPEC §8.11) with `handler`: the router validates the request, the handler
    /// answers it (after the event that carried it; it may feed the core), at once or, through `answerLater`,
    /// once work done elsewhere is finished.
    public func handleHostOperation(_ op: Op, with handler: @escaping (PeerID, HostRequest) -> HostAnswer) {
        precondition(op.isHostOperation || op == .history || op == .stateAt, "\(op) is not answered by a host")
        hostHandlers[op] = handler
        router.hostOps.insert(op)
    }

    /// Feeds one event at time `now` (milliseconds on a monotonic clock), carries out its effects through the
    /// transport, then what they called for: slow consumers and peers over budget are closed, host requests
    /// answered, notifications delivered.
    public func handle(_ event: RouterEvent, now: Millis) {
        precondition(!feeding, "DaemonCore.handle re-entered")
        if case .closed(let peer) = event { forget(peer) }
        feeding = true
        router.handle(event, now: now, core: self)
        feeding = false
        if !later.isEmpty { finish(now: now) }
    }

    /// The transport's accountable bytes for `peer` changed (its unfinished frame grew, or writes completed).
    public func transportBytesChanged(_ peer: PeerID, now: Millis) {
        if feeding {
            later.toAccount.append(peer)
        } else {
            account(peer)
            if !later.isEmpty { finish(now: now) }
        }
    }

    /// Whether the core is in the middle of `handle` (an adapter asked to feed `.endOfBatch` then asks again
    /// once it is done).
    public var isHandling: Bool { feeding }

    // MARK: - Host answers that come later

    /// For a host-operation handler whose answer takes work the core's thread must not wait for (fluxd: journal
    /// reads, a reload's file): within the limits (`maxDeferredPerPeer`, `maxDeferredTotal`), takes the request,
    /// calls `start` with its ticket (which starts the work: it must not feed the core) and returns `.later`, for
    /// the handler to return; past them, returns `.error(.overloaded, ...)` and does not call `start`.
    ///
    /// The answer is given with `complete(_:with:now:)`. Until it is, the peer's later host requests wait behind
    /// it (answered in order); its other requests (dispatches, `info`, ...) are answered as usual.
    public func answerLater(_ peer: PeerID, _ request: HostRequest, start: (HostTicket) -> Void) -> HostAnswer {
        let queued = hostQueues[peer]?.count(where: { $0.serial != nil }) ?? 0
        if queued >= config.maxDeferredPerPeer {
            return .error(.overloaded, "\(request.op.rawValue): this connection already waits for \(queued) answers of journal reads or reloads (at most \(config.maxDeferredPerPeer)); ask again once one came")
        }
        if outstandingTickets.count >= config.maxDeferredTotal {
            return .error(.overloaded, "\(request.op.rawValue): fluxd already works on \(outstandingTickets.count) journal reads or reloads (at most \(config.maxDeferredTotal)); ask again later")
        }
        let ticket = HostTicket(peer: peer, serial: nextTicket, request: request.id)
        nextTicket += 1
        outstandingTickets.insert(ticket.serial)
        hostQueues[peer, default: []].append(QueuedHostAnswer(serial: ticket.serial, ref: request.id, answer: nil))
        start(ticket)
        return .later
    }

    /// The answer of a request taken by `answerLater` (on the core's thread, not from within `handle`): sent
    /// once every host request the peer sent before it is answered. Dropped when the peer closed meanwhile; a
    /// ticket completed twice is ignored the second time.
    public func complete(_ ticket: HostTicket, with answer: HostAnswer, now: Millis) {
        precondition(!feeding, "DaemonCore.complete called while handling an event")
        guard outstandingTickets.remove(ticket.serial) != nil else { return }
        guard var queue = hostQueues[ticket.peer],
              let i = queue.firstIndex(where: { $0.serial == ticket.serial }) else { return }
        if case .later = answer {
            assertionFailure("a host answer completed with .later")
            queue[i].answer = .error(.unknownOp, "\(ticket.request ?? "the request") was completed without an answer")
        } else {
            queue[i].answer = answer
        }
        hostQueues[ticket.peer] = queue
        releaseHostAnswers(of: ticket.peer, now: now)
    }

    /// Host answers taken by `answerLater` and not completed yet (their peers may have closed).
    public var deferredHostAnswers: Int { outstandingTickets.count }

    /// Sends the answers at the front of `peer`'s queue that are known.
    private func releaseHostAnswers(of peer: PeerID, now: Millis) {
        while let front = hostQueues[peer]?.first, let answer = front.answer {
            hostQueues[peer]!.removeFirst()
            if hostQueues[peer]!.isEmpty { hostQueues.removeValue(forKey: peer) }
            deliverHostAnswer(answer, to: peer, ref: front.ref, now: now)
        }
    }

    private func deliverHostAnswer(_ answer: HostAnswer, to peer: PeerID, ref: String?, now: Millis) {
        switch answer {
        case .reply(let frame): handle(.hostReply(peer, frame), now: now)
        case .error(let code, let message): handle(.hostError(peer, code, message: message, ref: ref), now: now)
        case .later: break
        }
    }

    private func finish(now: Millis) {
        while !later.isEmpty {
            let work = later
            later = Later()
            for peer in work.toAccount { account(peer) }
            for (peer, event) in work.overLimit { handle(event, now: now); _ = peer }
            for (peer, request) in work.hostRequests {
                let answer = hostHandlers[request.op].map { $0(peer, request) }
                    ?? .error(.unknownOp, "unknown op \"\(request.op.rawValue)\"")
                if case .later = answer { continue }  // queued by `answerLater`
                if hostQueues[peer] != nil {  // behind an answer that comes later: this one waits its turn
                    hostQueues[peer]!.append(QueuedHostAnswer(serial: nil, ref: request.id, answer: answer))
                } else {
                    deliverHostAnswer(answer, to: peer, ref: request.id, now: now)
                }
            }
            for (peer, preparation) in work.preparations where !transport.startPreparation(preparation, for: peer) {
                handle(.prepared(peer, preparation.run()), now: now)
            }
            for change in work.storeChanges { onStoreChange?(change) }
            for (store, pid, closing) in work.stalls { onStoreStalled?(store, pid, closing) }
        }
    }

    private func forget(_ peer: PeerID) {
        hostQueues.removeValue(forKey: peer)  // (its tickets stay outstanding until their work is done)
        cuttingOff.remove(peer)
        accounted.removeValue(forKey: peer)
        missedEvents.removeValue(forKey: peer)
    }

    // MARK: - Effects

    /// The router's `.send`: queues the frame; a peer whose queue passed `maxBacklog` is a slow consumer, one
    /// whose queue grew past what was charged is charged again.
    public func send(_ frame: Frame, to peer: PeerID) {
        let queued = writeFrame(frame, peer)
        if queued > checkAbove { queueGrew(peer, queued) }
    }

    private func queueGrew(_ peer: PeerID, _ queued: Int) {
        guard !cuttingOff.contains(peer) else { return }
        if queued > config.router.maxBacklog {
            onLog?(.warning, "slow consumer: peer \(peer) has \(queued) bytes unread; closing it")
            cutOff(peer, .backlogged(peer))
        } else if queued > (accounted[peer] ?? 0) + Self.accountingSlack {
            if feeding { later.toAccount.append(peer) } else { account(peer) }
        }
    }

    /// Bytes unwritten for a connection above which a delta subscriber counts as behind (SPEC §16.3).
    public static let behindBytes = 65536

    public func isBehind(_ peer: PeerID) -> Bool { transport.queuedBytes(of: peer) > Self.behindBytes }

    /// Every other effect.
    public func perform(_ effect: RouterEffect) {
        switch effect {
        case .send(let peer, let frame):
            send(frame, to: peer)
        case .monitor(let peer, let frame):
            deliverMonitorEvent(frame, to: peer)
        case .host(let peer, let request):
            later.hostRequests.append((peer, request))
        case .close(let peer):
            transport.close(peer, cutOffAfter: cuttingOff.contains(peer) ? config.slowConsumerGrace : nil)
        case .log(let level, let message):
            onLog?(level, message)
        case .stalled(let store, let pid, let closing):
            later.stalls.append((store, pid, closing))
        case .storeChanged(let change):
            later.storeChanges.append(change)
        case .deferred:
            transport.requestEndOfBatch()
        case .prepare(let peer, let preparation):
            later.preparations.append((peer, preparation))
        case .discard(let garbage):
            transport.discard(garbage)
        }
    }

    /// A monitor must never slow routing (SPEC §8.10): while its connection is behind, events for it are dropped
    /// and counted; the next one delivered is preceded by `{"op":"missed","count":N}`.
    private func deliverMonitorEvent(_ frame: Frame, to peer: PeerID) {
        if transport.queuedBytes(of: peer) > config.monitorBacklogLimit {
            missedEvents[peer, default: 0] += 1
            return
        }
        if let missed = missedEvents.removeValue(forKey: peer) {
            var b = FrameBuilder(op: "missed")
            b.int("count", missed)
            send(b.finish(), to: peer)
        }
        send(frame, to: peer)
    }

    // MARK: - Slow consumers and the memory budget

    /// Charges the change in a peer's transport bytes to its memory account; a growth the budget refuses closes
    /// it with `memory-budget`.
    private func account(_ peer: PeerID) {
        guard !cuttingOff.contains(peer) else { return }
        let bytes = transport.accountableBytes(of: peer)
        guard bytes != (accounted[peer] ?? 0) else { return }
        if router.accountTransport(peer, bytes: bytes) {
            accounted[peer] = bytes
            transport.charged(bytes, for: peer)
            return
        }
        onLog?(.warning, "memory budget exceeded by peer \(peer) (\(bytes) bytes in the transport, \(router.memory.used) used in all); closing it")
        cutOff(peer, .overBudget(peer))
        let left = transport.accountableBytes(of: peer)
        if router.accountTransport(peer, bytes: left) {
            accounted[peer] = left
            transport.charged(left, for: peer)
        }
    }

    /// Drops what waits for `peer` and has the router close it with `event`'s error, which then follows the
    /// write in progress; the transport cuts it off if it has not read that within `slowConsumerGrace`.
    private func cutOff(_ peer: PeerID, _ event: RouterEvent) {
        cuttingOff.insert(peer)
        transport.discardQueued(of: peer)
        later.overLimit.append((peer, event))
    }
}
