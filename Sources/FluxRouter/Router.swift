import DequeModule
import FluxCore
import FluxJournal

/// The dispatcher as a pure state machine: the single place where FluxBus's semantics live.
///
/// The transport turns socket and timer activity into `RouterEvent`s; the router answers each with
/// `RouterEffect`s (frames to send, connections to close, lines to log). It does no I/O and reads no clock, so
/// every rule of protocol/SPEC.md can be unit-tested by feeding events and reading effects.
///
/// How to read it: `handle` dispatches on the event; `receive` parses the envelope and dispatches on `op`;
/// each `op` has one method, in the order of SPEC.md: connections, stores, dispatch and answers here;
/// subscriptions and queries in Router+Queries.swift, introspection in Router+Introspection.swift, heartbeats,
/// stalled stores and transport memory accounting in Router+Liveness.swift. The state it works on (peers, stores,
/// actions) is in RouterState.swift, its output plumbing in RouterOutput.swift, the memory budget in
/// MemoryBudget.swift. The rules it keeps:
/// - R1 one global order: `dispatch` gives each accepted action the next `seq`; each store's `queue` and
///   `inflight` are in `seq` order and `pump` sends strictly from the head.
/// - R2 one answer per action: `answer` accepts only the oldest unanswered action of a store.
/// - R3 waitFor: `pump` holds an action at the head of a store's queue until every store it waits for, among the
///   action's targets, has answered it.
/// - R4 snapshots: `publish` numbers versions, drops byte-identical states, retains the frame and sends the same
///   bytes to every subscriber.
/// - R5 read your writes: `publish` runs before `record`, so the snapshot is queued to every subscriber before
///   the settlement is queued to the dispatcher (frames to one peer keep their order).
/// - R6/R7 nothing silently lost, isolation: every refusal is an `error` frame to the peer that caused it.
///
/// Performance: this object lives on one thread and none of its methods re-enters another while that one is
/// modifying the same property, so its hot stored properties are `@exclusivity(unchecked)`: the runtime's dynamic
/// exclusivity checks were a measurable share of the hot path (figures: Benchmarks/PROFILE.md).
public final class Router {
    public let config: RouterConfig
    /// The host operations answered by the host (`RouterConfig.hostOps`, and those registered since).
    @exclusivity(unchecked) public var hostOps: Set<Op>

    /// The connected peers (with the cache of the last frame's peer).
    @exclusivity(unchecked) var peers = PeerTable()
    /// Peers that have not said hello yet, in connection order (so their deadlines are in order too).
    @exclusivity(unchecked) var handshakes: [PeerID] = []
    /// Every store name fluxd has heard of: registered (up or down) or only subscribed/queried (unknown).
    @exclusivity(unchecked) var stores: [String: StoreEntry] = [:]
    /// `stores` sorted by name, for `info` (sorting 12,000 names took a tenth of its time); made again after a
    /// name is added or forgotten.
    @exclusivity(unchecked) var storesByNameCache: [StoreEntry]?
    /// How many accepted actions are not settled yet (each one sits in the queue or window of every target
    /// store that has not answered it: `unsettledActions()` finds them).
    @exclusivity(unchecked) var pendingCount = 0
    /// Which stores handle which action types (with its caches).
    @exclusivity(unchecked) var routes = RouteTable()
    @exclusivity(unchecked) var lastSeq: UInt64 = 0
    /// Where this run's records go (nil: an ephemeral fluxd), given at init; records go there once
    /// `startJournaling()` is called, after the restore (SPEC §15). A `let`: the hot path's calls through it need no
    /// retain and release (a `var` cost ~22 instructions per call; issue 27).
    public let journal: (any JournalWriting)?
    /// Whether the router journals: `journal` is set and `startJournaling()` was called (a plain flag: the hot path
    /// of an ephemeral fluxd tests this, not the existential).
    @exclusivity(unchecked) var journaling = false
    /// The seq high-water mark journaled: seqs up to it may be handed out (SPEC §15.1).
    @exclusivity(unchecked) var reservedSeq: UInt64 = 0
    /// Where `lastSeq` stood after a restore, and the newest seq the journal held then.
    @exclusivity(unchecked) var restoredSeqMark: UInt64 = 0
    @exclusivity(unchecked) var restoredNewestSeq: UInt64 = 0
    /// Outcomes of settled dispatches made under a session, for `recover` (SPEC §15.4).
    @exclusivity(unchecked) var outcomes: OutcomeLog
    /// Unsettled dispatches made under a session with `settle`, by (uid, session, id): `recover` looks its ids up
    /// here (SPEC §15.4), and each user's count of them, which with its kept outcomes makes its outcome quota.
    @exclusivity(unchecked) var pendingSessions = ShardedDictionary<SessionKey, ActionRecord>()
    @exclusivity(unchecked) var pendingSessionCounts: [UInt32: Int] = [:]
    /// The accounts kept outcomes are charged to, per user.
    @exclusivity(unchecked) var outcomeAccounts: [UInt32: MemoryBudget.Account] = [:]
    @exclusivity(unchecked) var shuttingDown = false
    @exclusivity(unchecked) var draining = false
    /// Monitor peers (role monitor, handshake done), in connection order: they get every `event`.
    @exclusivity(unchecked) var monitors: [PeerID] = []
    /// The clock reading of the first event (monitor events carry time since then) and of the current one.
    @exclusivity(unchecked) var epoch: Millis?
    @exclusivity(unchecked) var now: Millis = 0
    /// Log lines for refused registrations and oversized frames (peers that retry in a loop): at most a few per
    /// window.
    @exclusivity(unchecked) var refusalLog = LogRateLimit()
    /// Log lines for actions given up for a store that is down (one per action: a flood of dispatches to a down
    /// store wrote 99,000 lines a second, one `write` each, on the loop) and for refused connections.
    @exclusivity(unchecked) var givenUpLog = LogRateLimit()
    @exclusivity(unchecked) var connectionRefusalLog = LogRateLimit()
    /// Path subscriptions made so far (each one's `order`).
    @exclusivity(unchecked) var nextPathOrder: UInt64 = 0
    /// Tree nodes visited applying patches (`JSONTree.apply`'s steps), since start: the work the fuzz target and
    /// the tests hold to O(operations · log n).
    public internal(set) var patchSteps: UInt64 = 0
    /// Path index nodes visited matching patches against path subscriptions (`PathIndex.touched`), since start.
    public internal(set) var pathSteps: UInt64 = 0
    /// Retained states parsed into trees (`keptTree`, `parsedTree`), since start: a whole state is parsed once
    /// however many path subscriptions it serves.
    public internal(set) var statesParsed: UInt64 = 0
    /// Preparations handed to the host to run off the loop (large patches and parses; not the turns of held
    /// frames), since start.
    public internal(set) var preparationsStarted: UInt64 = 0
    /// The last preparation's number, and the result in hand while the frame it was made for is taken again.
    @exclusivity(unchecked) var nextPreparation: UInt64 = 0
    @exclusivity(unchecked) var preparedWork: PreparedWork?
    /// Values to release off the loop, sent as one `.discard` at the end of the event.
    @exclusivity(unchecked) var garbage: [any Sendable] = []
    /// What `restore` found wrong and worked around (for the host to log).
    public internal(set) var restoreProblems: [String] = []
    /// The body of the message being handled: errors about it carry its `id` if a string, else its `store` as
    /// `ref` (SPEC §8.9), read only when an error is actually sent (scanning it again then is cheaper than
    /// keeping the envelope for every message).
    @exclusivity(unchecked) var currentBody: [UInt8]?
    /// Stores that are down and hold queued actions: the only ones whose queues can expire (`nextDeadline`,
    /// `tick`). Not every down store: thousands of down stores with empty queues (connections that registered
    /// many stores and left) made every event pay for walking them in `nextDeadline`.
    @exclusivity(unchecked) var expiringStores: Set<String> = []
    /// Traffic and error counters, reported by `info`.
    @exclusivity(unchecked) public internal(set) var counters = Counters()
    /// The bytes fluxd accounts for, by connection and user (see `MemoryBudget`).
    public let memory: MemoryBudget
    /// The coalescing key of the next store fluxd hears of (never reused within a run, even after a name is
    /// forgotten).
    @exclusivity(unchecked) var nextStoreKey: UInt32 = 1
    /// SPEC §10: the highest version a forgotten store reached (0: none forgotten); stores made later start above it.
    @exclusivity(unchecked) var versionFloor: UInt64 = 0
    /// Open connections per user (uid; `UInt32.max` when unknown), for `maxConnectionsPerUser`, and those of them
    /// still in the handshake, for `maxHandshakesPerUser`.
    @exclusivity(unchecked) var connectionsByUser: [UInt32: Int] = [:]
    @exclusivity(unchecked) var handshakesByUser: [UInt32: Int] = [:]
    /// Peers that asked for heartbeats (`hello.heartbeat`), in no particular order.
    @exclusivity(unchecked) var heartbeatPeers: Set<PeerID> = []
    /// When the liveness sweep (heartbeats, stalled stores) runs next, while anything needs it.
    @exclusivity(unchecked) var sweepAt: Millis?
    /// Up stores (the only ones that can stall): checked by the sweep.
    @exclusivity(unchecked) var upStores: Set<String> = []
    /// Stores whose whole `queries` set is due at the end of this batch (`endOfBatch`).
    @exclusivity(unchecked) var deferredQueries: [StoreEntry] = []
    /// Heartbeat pings sent (their ids are `hb-<n>`).
    @exclusivity(unchecked) var pingCount = 0
    /// The most stores and waitFor edges one cycle check has visited (each is visited at most once).
    @exclusivity(unchecked) public internal(set) var maxCycleCheckSteps = 0
    /// The longest time one loop callback held fluxd's loop, in microseconds, as the host measured it (shown in
    /// `info`; the router only reports it).
    @exclusivity(unchecked) public var longestLoopHold: UInt64 = 0
    /// Where the host measured it (a source location naming the kind of callback), shown in `info` beside it.
    @exclusivity(unchecked) public var longestLoopHoldAt = ""
    /// Connections the host failed to accept, by errno name (e.g. `EMFILE`), as it counted them (shown in `info`).
    @exclusivity(unchecked) public var acceptErrors: [String: UInt64] = [:]

    public init(config: RouterConfig = RouterConfig(), journal: (any JournalWriting)? = nil) {
        self.config = config
        self.journal = journal
        self.hostOps = config.hostOps
        self.memory = MemoryBudget(limits: config.memory)
        self.outcomes = OutcomeLog(capacity: config.maxOutcomes, window: config.outcomeWindow)
        self.welcomeLimits = Router.limitsJSON(config)
    }

    /// From now on every accepted action, result and state is journaled (after `restore`, before any peer
    /// connects; `DaemonCore.attachJournal`).
    public func startJournaling() {
        journaling = journal != nil
    }

    /// `welcome.limits` (the config does not change while the router runs).
    let welcomeLimits: [UInt8]

    /// What a subscription and a live query are charged to their connection's memory account.
    static func subscriptionCost(_ name: String) -> Int { 96 + name.utf8.count }
    static func queryCost(_ bytes: [UInt8]) -> Int { 160 + bytes.count }
    /// What an accepted action is charged to its dispatcher's account until it settles.
    @inline(__always)
    static func actionCost(_ payload: Int, _ type: Int) -> Int { 192 + payload + type }

    /// Peers and stores refer to each other (a store's owner, subscribers and deliveries, whose actions refer to
    /// their dispatcher; a peer's last store): a router dropped while connections are open (an in-memory bus at
    /// the end of a test) breaks those cycles, or they would never be freed.
    deinit {
        for store in stores.values {
            store.ownerPeer = nil
            store.subscribers.removeAll()
            store.deltaSubscribers.removeAll()
            store.pathSubscribers.removeAll()
            store.queue.removeAll()
            store.inflight.removeAll()
        }
        for peer in peers.values {
            peer.lastStore = nil
            peer.pathSubscriptions = [:]
        }
    }

    /// Convenience for tests: the effects of one event.
    public func handle(_ event: RouterEvent, now: Millis) -> [RouterEffect] {
        var effects: [RouterEffect] = []
        handle(event, now: now, into: &effects)
        return effects
    }

    /// Feeds one event; appends the effects to carry out, in order.
    public func handle(_ event: RouterEvent, now: Millis, into effects: inout [RouterEffect]) {
        var out = Output(effects: effects, sink: nil, debugLogs: config.debugLogs)
        effects = []
        handle(event, now: now, &out)
        effects = out.effects
    }

    /// Feeds one event; `sink` carries out each effect as it is produced, in order (no effect array: fluxd's
    /// hot path).
    public func handle(_ event: RouterEvent, now: Millis, sink: any RouterEffectSink) {
        var out = Output(effects: [], sink: sink, debugLogs: config.debugLogs)
        handle(event, now: now, &out)
    }

    /// `handle(_:now:sink:)` for the daemon core (the same effects, called directly).
    func handle(_ event: RouterEvent, now: Millis, core: DaemonCore) {
        var out = Output(effects: [], sink: nil, core: core, debugLogs: config.debugLogs)
        handle(event, now: now, &out)
    }

    func handle(_ event: RouterEvent, now: Millis, _ out: inout Output) {
        if epoch == nil { epoch = now }
        self.now = now
        switch event {
        case .connected(let id, let creds):
            connected(id, creds, now: now, &out)
        case .frame(let id, let body):
            if let peer = peerFrom(id), !peer.closing {
                peer.lastHeard = now
                out.traffic.framesIn += 1
                out.traffic.bytesIn += UInt64(body.count + 4)
                if peer.preparing != nil {
                    hold(peer, body, &out)  // behind its frame whose work runs off the loop, in order
                } else {
                    receive(peer, body, now: now, &out)
                }
            }
        case .emptyFrame(let id):
            if let peer = peers[id], !peer.closing {
                out.traffic.framesIn += 1
                out.traffic.bytesIn += 4
                if peer.role == nil {
                    fail(peer, .handshakeRequired, "the first frame must be hello, not an empty frame", &out)
                } else {
                    fail(peer, .badFrame, "zero-length frame", &out)
                }
            }
        case .oversizedFrame(let id, let length):
            if let peer = peers[id], !peer.closing {
                logLimited(&refusalLog, .warning, "peer \(peer.id) (\(peer.name), uid \(peer.account.uid)) sent a frame of \(length) bytes, over maxFrame \(config.maxFrame); closing it", &out)
                fail(peer, .tooLarge, "frame of \(length) bytes exceeds maxFrame \(config.maxFrame)", &out)
            }
        case .closed(let id):
            closed(id, now: now, &out)
        case .backlogged(let id):
            if let peer = peers[id], !peer.closing {
                out.log(.warning, "peer \(peer.id) (\(peer.name)) closed as a slow consumer: more than \(config.maxBacklog) bytes queued to it and not read")
                fail(peer, .slowConsumer, "more than \(config.maxBacklog) bytes queued to this connection and not read", &out, fatal: true)
            }
        case .overBudget(let id):
            if let peer = peers[id], !peer.closing {
                let user = peer.account.uid == UInt32.max ? "its user" : "uid \(peer.account.uid)"
                fail(peer, .memoryBudget, "this connection's unfinished frame and unread frames outgrew fluxd's memory budget (\(user) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes; \(memory.used) of \(config.memory.total) in total)", &out, fatal: true)
            }
        case .tick:
            tick(now: now, &out)
        case .endOfBatch:
            flushDeferredQueries(&out)
        case .drain:
            if !draining { out.log(.notice, "draining: refusing new dispatches, \(pendingCount) in flight") }
            draining = true
        case .shutdown:
            shutdown(&out)
        case .prepared(let id, let result):
            prepared(id, result, now: now, &out)
        case .hostReply(let id, let frame):
            if let peer = peers[id] {
                if !peer.closing { out.send(peer, frame) }
                hostAnswered(peer, &out)
            }
        case .hostError(let id, let code, let message, let ref):
            if let peer = peers[id] {
                if !peer.closing { fail(peer, code, message, &out, ref: ref) }
                hostAnswered(peer, &out)
            }
        }
        if !garbage.isEmpty {
            out.append(.discard(Garbage(items: garbage)))
            garbage = []
        }
        counters.traffic.add(out.traffic)
    }

    /// The connected peer `id` (through the peer table's cache).
    @inline(__always)
    func peerFrom(_ id: PeerID) -> Peer? { peers.cached(id) }

    /// Whether anything can expire at all (a handshake pending, a store down, or the liveness sweep): without,
    /// `nextDeadline` is nil.
    public var hasDeadlines: Bool { !handshakes.isEmpty || !expiringStores.isEmpty }

    /// The earliest time at which a `tick` has work to do (a handshake or a queued action expiring), if any. The
    /// liveness sweep is not among them: the host ticks every `sweepInterval` while `needsSweep` says so (a
    /// repeating timer costs routing nothing, where a deadline would be re-checked after every event).
    public var nextDeadline: Millis? {
        var next: Millis? = nil
        if let first = handshakes.first, let peer = peers[first] {
            next = peer.connectedAt + config.handshakeTimeout
        }
        for name in expiringStores {
            if let head = stores[name]?.queue.first, let d = head.deadline {
                next = min(next ?? d, d)
            }
        }
        return next
    }

    /// Whether no peer is connected (after `shutdown`, the daemon may stop once this is true).
    public var isIdle: Bool { peers.isEmpty }

    /// The number of connected peers.
    public var peerCount: Int { peers.count }

    /// Accepted actions not yet settled (after `.drain`, the host waits for this to reach 0).
    public var pendingActionCount: Int { pendingCount }

    /// What the router knows of a store.
    public func storeStatus(_ name: String) -> StoreStatusInfo {
        guard let store = stores[name] else { return StoreStatusInfo(status: "unknown", version: 0) }
        return StoreStatusInfo(status: store.status.rawValue, owner: store.owner,
                               ownerPID: store.owner.flatMap { peers[$0]?.creds.pid }, version: store.version)
    }

    // MARK: - Receiving

    /// One frame from a peer: the envelope is scanned (SPEC §3.2), the op and the role checked (§7), the request
    /// decoded and validated (Requests.swift), then its semantics run. A refusal at any step is an `error`.
    func receive(_ peer: Peer, _ body: [UInt8], now: Millis, _ out: inout Output) {
        let env: Envelope
        do {
            env = try Envelope(body: body)
        } catch {
            if peer.role == nil {
                return fail(peer, .handshakeRequired, "the first frame must be a valid hello (\(error.message))", &out)
            }
            return fail(peer, error.code, error.message, &out)
        }
        currentBody = body
        defer { currentBody = nil }
        guard let opSpan = env.span(.op), opSpan.kind == .string else {
            if peer.role == nil { return fail(peer, .handshakeRequired, "the first frame must be hello", &out) }
            return fail(peer, .badMessage, "a message needs a string \"op\"", &out)
        }
        do {
            // The two ops of every routed action first, told apart by their bytes (no String for them).
            if let role = peer.role {
                if env.isString(.op, "dispatch") {
                    guard permitted(peer, role.mayDispatch, .dispatch, &out) else { return }
                    let request = try DispatchRequest(env, knownTypeJSON: routes.lastTypeJSON)
                    return dispatch(peer, request, body, now: now, &out)
                }
                if env.isString(.op, "done") {
                    guard permitted(peer, role.mayOwnStores, .done, &out) else { return }
                    let request = try AnswerRequest(env, isDone: true)
                    return answer(peer, request, body, &out)
                }
            }
            let name = env.string(.op).value ?? ""
            guard let role = peer.role else {
                guard name == "hello" else {
                    return fail(peer, .handshakeRequired, "the first frame must be hello, not \(name)", &out)
                }
                endHandshake(peer)  // a hello, good or bad, ends the handshake (a bad one closes the connection)
                let request: HelloRequest
                do { request = try HelloRequest(env) } catch where error.code == .unsupportedVersion {
                    counters.count(.unsupportedVersion)
                    out.send(peer, unsupportedVersionFrame(error.message))
                    return close(peer, &out)
                }
                return hello(peer, request, &out)
            }
            guard let op = Op.received(name), !op.isHostOperation || hostOps.contains(op) || op == .history || op == .stateAt else {
                return fail(peer, .unknownOp, "unknown op \"\(name)\"", &out)
            }
            try receive(op, from: peer, role: role, env, now: now, &out)
        } catch {
            fail(peer, error.code, error.message, &out, ref: error.ref, fatal: error.fatal)
        }
    }

    /// The request `op` from a peer that has said hello.
    private func receive(_ op: Op, from peer: Peer, role: Role, _ env: Envelope, now: Millis,
                         _ out: inout Output) throws(Refusal) {
        switch op {
        case .dispatch:
            if permitted(peer, role.mayDispatch, op, &out) {
                dispatch(peer, try DispatchRequest(env, knownTypeJSON: routes.lastTypeJSON), env.body, now: now, &out)
            }
        case .done, .reject:
            if permitted(peer, role.mayOwnStores, op, &out) { answer(peer, try AnswerRequest(env, isDone: op == .done), env.body, &out) }
        case .register:
            if permitted(peer, role.mayOwnStores, op, &out) { register(peer, try RegisterRequest(env), now: now, &out) }
        case .unregister:
            if permitted(peer, role.mayOwnStores, op, &out) { unregister(peer, try UnregisterRequest(env), now: now, &out) }
        case .state:
            if permitted(peer, role.mayOwnStores, op, &out) { unsolicitedState(peer, try StateRequest(env), &out) }
        case .patch:
            if permitted(peer, role.mayOwnStores, op, &out) { unsolicitedPatch(peer, try PatchRequest(env), &out) }
        case .subscribe: subscribe(peer, try StoreRequest(env, op: "subscribe"), &out)
        case .unsubscribe: unsubscribe(peer, try StoreRequest(env, op: "unsubscribe"), &out)
        case .query:
            if permitted(peer, role.mayDispatch, op, &out) { query(peer, try QueryRequest(env), &out) }
        case .unquery:
            if permitted(peer, role.mayDispatch, op, &out) { unquery(peer, try UnqueryRequest(env), &out) }
        case .info: info(peer, try IdentifiedRequest(env, op: "info"), &out)
        case .get: get(peer, try GetRequest(env), &out)
        case .ping: ping(peer, try IdentifiedRequest(env, op: "ping"), &out)
        case .pong: _ = try IdentifiedRequest(env, op: "pong")  // a heartbeat answer: hearing from the peer is all that counts
        case .bye: close(peer, &out)
        case .hello: fail(peer, .badMessage, "hello was already received", &out)
        case .workers: askHost(peer, try HostRequest(env, op: op), &out)
        case .restartWorker, .stopWorker:
            let request = try HostRequest(env, op: op)
            if privileged(peer, op, &out) { askHost(peer, request, &out) }
        case .reload:
            let request = try HostRequest(env, op: op)
            guard privileged(peer, op, &out) else { return }
            if hostOps.contains(op) { askHost(peer, request, &out) }
            else { fail(peer, .reloadRefused, "this fluxd has no config file to reload", &out) }
        case .forget:
            let request = try ForgetRequest(env)
            if privileged(peer, op, &out) { forget(peer, request, now: now, &out) }
        case .recover:
            if permitted(peer, role.mayDispatch, op, &out) { recover(peer, try RecoverRequest(env), &out) }
        case .history, .stateAt:
            let request = try HostRequest(env, op: op)
            guard privileged(peer, op, &out) else { return }
            if hostOps.contains(op) { askHost(peer, request, &out) }
            else { fail(peer, .notRetained, "this fluxd is ephemeral: it keeps no history (SPEC §15.6)", &out) }
        case .welcome, .registered, .action, .settled, .snapshot, .subscribed, .unsubscribed, .storeDown, .storeUp,
             .queryOK, .unqueryOK, .queries, .queriesChanged, .got, .error, .event, .missed, .worker, .recovered,
             .delta, .subtree, .reloaded, .accepted, .forgotten:
            fail(peer, .unknownOp, "unknown op \"\(op.rawValue)\"", &out)  // (not received: `Op.received` is nil)
        }
    }

    /// Whether the peer may send a privileged operation (fluxd's own uid, root, or an admin of the config; SPEC
    /// §8.11, §8.12); if not, it gets `forbidden` (the connection stays open).
    func privileged(_ peer: Peer, _ op: Op, _ out: inout Output) -> Bool {
        guard let admins = config.admins else { return true }
        if admins.admits(uid: peer.creds.uid, gid: peer.creds.gid) { return true }
        fail(peer, .forbidden, "\(op.rawValue) is allowed to fluxd's own user, root and the admins of its config "
             + "(uid \(peer.creds.uid.map(String.init) ?? "unknown") is none of them)", &out)
        return false
    }

    /// Whether the peer's role may send `op` (SPEC §7); if not, the peer gets `forbidden`.
    func permitted(_ peer: Peer, _ ok: Bool, _ op: Op, _ out: inout Output) -> Bool {
        if !ok { fail(peer, .forbidden, "a \(peer.role?.rawValue ?? "peer") may not send \(op.rawValue)", &out) }
        return ok
    }
}
