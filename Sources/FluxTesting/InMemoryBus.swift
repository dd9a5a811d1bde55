import FluxClient
import FluxCore
import FluxJournal
import FluxRouter
import FluxStore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// fluxd in memory, for unit-testing stores and views without sockets or processes: an adapter of the same
/// `FluxRouter.DaemonCore` fluxd runs (router, slow-consumer and monitor policies, host operations), connecting
/// `FluxClient`s and `FluxStore`s to it over `InMemoryConnection`s.
///
///     let bus = InMemoryBus()
///     let running = try await bus.start(store)          // store.run(on:) in a task, waits until registered
///     let client = try await bus.client()
///     let settlement = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "x"))
///
/// Events are fed to the router one at a time, in the order they were submitted; whichever thread submits when
/// the bus is idle carries out the resulting deliveries (frames to connections are delivered in effect order).
/// Time does not pass by itself: it starts at 0 ms and moves only with `advance(by:)`, which also fires the
/// router's timers (queue and handshake timeouts), so timeouts are tested deterministically.
///
/// A durable bus (`durable: true`) journals into memory with the same policy as fluxd (`DaemonCore.commitJournal`):
/// the frames of each event go out once its records are written; `failJournalWrites` makes the writes fail (a
/// full disk holds every frame until they succeed again); `journalRecords` are what it wrote, and a bus made
/// with `restoring:` them restarts from them (SPEC §15: seqs go on, states are kept, unanswered actions are
/// redelivered).
public final class InMemoryBus: Sendable {
    fileprivate enum Delivery {
        case frame(InMemoryConnection, [UInt8])
        case close(InMemoryConnection)
    }

    /// The core's transport: collects the deliveries of an event, made once the bus's lock is released.
    /// Nothing is ever backlogged in memory.
    fileprivate final class Wire: DaemonTransport {
        var connections: [PeerID: InMemoryConnection] = [:]
        var deliveries: [Delivery] = []
        var closed: [PeerID] = []
        var logs: [String] = []

        func write(_ frame: Frame, to peer: PeerID) -> Int {
            if let c = connections[peer] { deliveries.append(.frame(c, frame.bodyArray)) }
            return 0
        }
        func queuedBytes(of peer: PeerID) -> Int { 0 }
        func accountableBytes(of peer: PeerID) -> Int { 0 }
        func charged(_ bytes: Int, for peer: PeerID) {}
        func discardQueued(of peer: PeerID) {}
        func close(_ peer: PeerID, cutOffAfter: Millis?) {
            if let c = connections.removeValue(forKey: peer) {
                deliveries.append(.close(c))
                closed.append(peer)
            }
        }
        func requestEndOfBatch() {}  // the batch ends when the queue is drained (`hasDeferredWork`)
    }

    private struct State {
        let wire: Wire
        let core: DaemonCore
        var now: Millis = 0
        var nextPeer: PeerID = 1
        var queue: [RouterEvent] = []
        var queueHead = 0
        var pumping = false
        var router: Router { core.router }
        let journal: MemoryJournal?
        /// Deliveries waiting for the journal to write what they reveal.
        var held: [Delivery] = []

        init(config: RouterConfig, journal: MemoryJournal?) {
            wire = Wire()
            var config = config
            if journal != nil && !config.isDurable { config.durability = "batch" }
            if journal != nil && config.epoch.isEmpty { config.epoch = "in-memory" }
            core = DaemonCore(config: DaemonCoreConfig(router: config), transport: wire, journal: journal)
            core.onLog = { [unowned wire] level, message in wire.logs.append("\(level): \(message)") }
            self.journal = journal
            if let journal { core.attachJournal(recovered: journal.recovered(), chargedTo: getuid(), now: 0) }
        }

        /// The deliveries of what was handled since the last call, once the journal wrote what they reveal.
        mutating func release(_ out: [Delivery]) -> [Delivery] {
            guard journal != nil else { return out }
            held += out
            guard core.commitJournal(now: now) else { return [] }
            defer { held = [] }
            return held
        }
    }

    private let state: Mutex<State>
    /// The router's configuration (limits announced in `welcome`).
    public let config: RouterConfig

    public init(config: RouterConfig = RouterConfig()) {
        self.config = config
        self.state = Mutex(State(config: config, journal: nil))
    }

    /// A durable bus (`durable`), journaling into memory; restarted from `restoring`, the records a previous
    /// durable bus wrote (`journalRecords`).
    public init(config: RouterConfig = RouterConfig(), durable: Bool, restoring: [[UInt8]] = []) {
        self.config = config
        self.state = Mutex(State(config: config, journal: durable ? MemoryJournal(written: restoring) : nil))
    }

    // MARK: The journal (a durable bus)

    /// The records the journal wrote so far (those of a restart's predecessor first).
    public var journalRecords: [[UInt8]] { state.withLock { s in s.journal.map { Array($0.written) } ?? [] } }

    /// Frames held until the journal writes what they reveal.
    public var heldFrames: Int { state.withLock { $0.held.count } }

    /// Makes the journal's writes fail as a full disk does (`.diskFull`: every frame is held until they succeed
    /// again, new work is refused `disk-full`) or for good (`.failed`); nil: they succeed again (the held frames
    /// go out at once).
    public func failJournalWrites(_ failure: JournalCommitResult?) {
        state.withLock { $0.journal?.failWrites = failure }
        if failure == nil { submit([]) }
    }

    // MARK: Connections

    /// A new connection to the bus (the router sees it connect when it is started).
    public func connect(credentials: PeerCredentials = PeerCredentials(pid: getpid(), uid: getuid(), gid: getgid()))
        -> InMemoryConnection
    {
        let peer = state.withLock { s -> PeerID in
            defer { s.nextPeer += 1 }
            return s.nextPeer
        }
        return InMemoryConnection(bus: self, peer: peer, credentials: credentials, maxFrame: config.maxFrame)
    }

    /// A client connected to the bus, handshake done.
    public func client(name: String = "test-client", role: Role = .client) async throws -> FluxClient {
        try await FluxClient.connect(over: connect(), name: name, role: role)
    }

    /// Runs `store` on a new connection (in a task) and waits until it is registered and has adopted its state.
    public func start<S>(_ store: FluxStore<S>, peerName: String? = nil, timeout: Duration = .seconds(5))
        async throws -> RunningStore
    {
        let connection = connect()
        let task = Task { try await store.run(on: connection, peerName: peerName) }
        do {
            try await withTimeout(timeout, "store \(store.name) to register") { try await store.ready() }
        } catch {
            task.cancel()
            connection.close()
            throw error
        }
        return RunningStore(name: store.name, connection: connection, task: task)
    }

    // MARK: Time

    /// The bus's clock, in milliseconds.
    public var now: Millis { state.withLock { $0.now } }

    /// Moves the clock forward and lets the router expire what is due (`tick`).
    public func advance(by duration: Duration) {
        let ms = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        state.withLock { s in
            s.now += Millis(max(0, ms))
            _ = s.core.journalTimer(now: s.now)
        }
        submit([.tick])
    }

    /// When the router next has timed work to do, if ever.
    public var nextDeadline: Millis? { state.withLock { $0.router.nextDeadline } }

    /// Feeds `shutdown` to the router: every peer is told `bye` and closed.
    public func shutdown() {
        submit([.shutdown])
    }

    /// The router's `log` effects so far, as "level: message" lines.
    public var logs: [String] { state.withLock { $0.wire.logs } }

    /// Answers host operation `op` (`workers`, `restart-worker`, `stop-worker`; SPEC §8.11) with `handler`, as
    /// fluxd's worker supervisor does: the request arrives validated, the answer goes out through the same core
    /// (counted, with error codes). Without a handler such requests get `unknown-op`, as from a fluxd without
    /// workers. The handler runs on whichever thread is feeding the bus, with the bus's lock held: it must not
    /// call back into the bus.
    public func handleHostOperation(_ op: Op, with handler: @escaping @Sendable (HostRequest) -> HostAnswer) {
        state.withLock { $0.core.handleHostOperation(op) { _, request in handler(request) } }
    }

    /// Connections the router has open.
    public var connectionCount: Int { state.withLock { $0.wire.connections.count } }

    // MARK: Pump

    func register(_ connection: InMemoryConnection) {
        state.withLock { $0.wire.connections[connection.peer] = connection }
        submit([.connected(connection.peer, connection.credentials)])
    }

    /// Appends events and, if no one else is pumping, carries them out.
    func submit(_ events: [RouterEvent]) {
        if enqueue(events) { drain() }
    }

    /// Appends events; returns whether the caller must `drain()`.
    func enqueue(_ events: [RouterEvent]) -> Bool {
        state.withLock { s -> Bool in
            s.queue.append(contentsOf: events)
            if s.pumping { return false }
            s.pumping = true
            return true
        }
    }

    /// The local end closed the connection: the router sees `closed` (once).
    func closedByClient(_ peer: PeerID) {
        let known = state.withLock { $0.wire.connections.removeValue(forKey: peer) != nil }
        if known { submit([.closed(peer)]) }
    }

    func drain() {
        while true {
            let work = state.withLock { s -> [Delivery]? in
                guard s.queueHead < s.queue.count else {
                    // The batch is done: what the router deferred to its end (as fluxd's transport feeds it).
                    if s.router.hasDeferredWork {
                        s.queue.append(.endOfBatch)
                        return []
                    }
                    s.queue.removeAll(keepingCapacity: true)
                    s.queueHead = 0
                    s.pumping = false
                    // (Deliveries held for the journal: a retry, e.g. after `failJournalWrites(nil)`.)
                    if !s.held.isEmpty {
                        let out = s.release([])
                        if !out.isEmpty { s.pumping = true }
                        return out.isEmpty ? nil : out
                    }
                    return nil
                }
                let event = s.queue[s.queueHead]
                s.queueHead += 1
                s.core.handle(event, now: s.now)
                let out = s.wire.deliveries
                s.wire.deliveries.removeAll()
                for peer in s.wire.closed { s.queue.append(.closed(peer)) }
                s.wire.closed.removeAll()
                return s.release(out)
            }
            guard let work else { return }
            for delivery in work {
                switch delivery {
                case .frame(let c, let body): c.deliver(.frame(body))
                case .close(let c): c.closedByBus()
                }
            }
        }
    }
}

/// A store running on an `InMemoryBus` (see `InMemoryBus.start`).
public final class RunningStore: Sendable {
    /// The store's name.
    public let name: String
    /// Its connection to the bus.
    public let connection: InMemoryConnection
    private let task: Task<Void, any Error>

    init(name: String, connection: InMemoryConnection, task: Task<Void, any Error>) {
        self.name = name
        self.connection = connection
        self.task = task
    }

    /// Stops the store cleanly (it unregisters and says bye) and waits for `run` to return.
    public func stop() async throws {
        task.cancel()
        try await task.value
    }

    /// Drops the store's connection without a word, like a crashed worker, and waits for `run` to return.
    public func crash() async {
        connection.close()
        _ = try? await task.value
    }

    /// Waits for `run` to end and returns what it threw, if anything.
    public func finished() async -> (any Error)? {
        do {
            try await task.value
            return nil
        } catch {
            return error
        }
    }
}
