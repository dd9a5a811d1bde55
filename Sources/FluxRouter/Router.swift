import DequeModule
import FluxCore

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
/// exclusivity checks were ~13% of fluxd's instructions per routed action (Benchmarks/PROFILE.md).
public final class Router {
    public let config: RouterConfig
    /// The host operations answered by the host (`RouterConfig.hostOps`, and those registered since).
    @exclusivity(unchecked) public var hostOps: Set<Op>

    @exclusivity(unchecked) var peers: [PeerID: Peer] = [:]
    /// The peer of the last frame (frames come in runs from one connection): no hashing then.
    @exclusivity(unchecked) var lastPeer: Peer?
    /// Peers that have not said hello yet, in connection order (so their deadlines are in order too).
    @exclusivity(unchecked) var handshakes: [PeerID] = []
    /// Every store name fluxd has heard of: registered (up or down) or only subscribed/queried (unknown).
    @exclusivity(unchecked) var stores: [String: StoreEntry] = [:]
    /// How many accepted actions are not settled yet (each one sits in the queue or window of every target
    /// store that has not answered it: `unsettledActions()` finds them).
    @exclusivity(unchecked) var pendingCount = 0
    /// Action type -> the stores that handle it (sorted by name). Cleared whenever a registration changes.
    @exclusivity(unchecked) var routes: [String: [StoreEntry]] = [:]
    /// The last route looked up, with the type as its dispatcher wrote it (consecutive actions mostly have the
    /// same type, written the same way): no decoding or hashing then.
    @exclusivity(unchecked) var lastRoute = LastRoute()
    @exclusivity(unchecked) var lastSeq: UInt64 = 0
    @exclusivity(unchecked) var shuttingDown = false
    @exclusivity(unchecked) var draining = false
    /// Monitor peers (role monitor, handshake done), in connection order: they get every `event`.
    @exclusivity(unchecked) var monitors: [PeerID] = []
    /// The clock reading of the first event (monitor events carry time since then) and of the current one.
    @exclusivity(unchecked) var epoch: Millis?
    @exclusivity(unchecked) var now: Millis = 0
    /// The body of the message being handled: errors about it carry its `id` if a string, else its `store` as
    /// `ref` (SPEC §8.9), read only when an error is actually sent (scanning it again then is cheaper than
    /// keeping the envelope for every message).
    @exclusivity(unchecked) var currentBody: [UInt8]?
    /// Stores that are down and hold queued actions: the only ones whose queues can expire (`nextDeadline`,
    /// `tick`). Not every down store: thousands of down stores with empty queues (connections that registered
    /// many stores and left) made every event pay for walking them in `nextDeadline`.
    @exclusivity(unchecked) var expiringStores: Set<String> = []
    /// Traffic and error counters, reported by `info`.
    @exclusivity(unchecked) public private(set) var counters = Counters()
    /// The bytes fluxd accounts for, by connection and user (see `MemoryBudget`).
    public let memory: MemoryBudget
    /// The coalescing key of the next store fluxd hears of (never reused within a run, even after a name is
    /// forgotten).
    @exclusivity(unchecked) var nextStoreKey: UInt32 = 1
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
    @exclusivity(unchecked) public private(set) var maxCycleCheckSteps = 0
    /// The longest time one loop callback held fluxd's loop, in microseconds, as the host measured it (shown in
    /// `info`; the router only reports it).
    @exclusivity(unchecked) public var longestLoopHold: UInt64 = 0
    /// Connections the host failed to accept, by errno name (e.g. `EMFILE`), as it counted them (shown in `info`).
    @exclusivity(unchecked) public var acceptErrors: [String: UInt64] = [:]

    /// How many action types' routes are cached before the cache starts over.
    static let routeCacheLimit = 4096

    public init(config: RouterConfig = RouterConfig()) {
        self.config = config
        self.hostOps = config.hostOps
        self.memory = MemoryBudget(limits: config.memory)
        self.welcomeLimits = Router.limitsJSON(config)
    }

    /// `welcome.limits` (the config does not change while the router runs).
    let welcomeLimits: [UInt8]

    static func limitsJSON(_ c: RouterConfig) -> [UInt8] {
        let fields: [(String, String)] = [
            ("maxFrame", "\(c.maxFrame)"), ("storeWindow", "\(c.storeWindow)"), ("queueLimit", "\(c.queueLimit)"),
            ("queueTimeout", "\(c.queueTimeout)"), ("handshakeTimeout", "\(c.handshakeTimeout)"),
            ("maxPending", "\(c.maxPending)"), ("maxBacklog", "\(c.maxBacklog)"),
            ("fairPending", "\(c.fairPending)"),
            // since fluxd 0.2.0
            ("maxQueries", "\(c.maxQueries)"), ("maxQueryBytes", "\(c.maxQueryBytes)"),
            ("maxSubscriptions", "\(c.maxSubscriptions)"), ("maxWaitFor", "\(c.maxWaitFor)"),
            ("maxStoresPerConnection", "\(c.maxStoresPerConnection)"),
            ("maxConnectionsPerUser", "\(c.maxConnectionsPerUser)"),
            ("memoryPerUser", "\(c.memory.perUser)"), ("connectionAllowance", "\(c.memory.connectionAllowance)"),
            ("pingInterval", "\(c.pingInterval)"), ("maxPingsOut", "\(c.maxPingsOut)"),
            ("storeTimeout", "\(c.storeTimeout)"),
        ]
        return Array(("{" + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}").utf8)
    }

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
            store.queue.removeAll()
            store.inflight.removeAll()
        }
        for peer in peers.values { peer.lastStore = nil }
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
                receive(peer, body, now: now, &out)
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
                fail(peer, .tooLarge, "frame of \(length) bytes exceeds maxFrame \(config.maxFrame)", &out)
            }
        case .closed(let id):
            closed(id, now: now, &out)
        case .backlogged(let id):
            if let peer = peers[id], !peer.closing {
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
            if !draining { out.log(.notice, "draining: refusing new dispatches, \(pendingCount) actions in flight") }
            draining = true
        case .shutdown:
            shutdown(&out)
        case .hostReply(let id, let frame):
            if let peer = peers[id], !peer.closing { out.send(peer, frame) }
        case .hostError(let id, let code, let message, let ref):
            if let peer = peers[id], !peer.closing { fail(peer, code, message, &out, ref: ref) }
        }
        counters.traffic.add(out.traffic)
    }

    /// The connected peer `id` (a one-entry cache in front of `peers`).
    @inline(__always)
    func peerFrom(_ id: PeerID) -> Peer? {
        if let p = lastPeer, p.id == id { return p }
        guard let p = peers[id] else { return nil }
        lastPeer = p
        return p
    }

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

    // MARK: - Monitor events

    /// Sends one `event` to every monitor; the frame is built only when a monitor is connected. (Inlined, so that
    /// without monitors the caller does not even build the closure and retain what it captures.)
    @inline(__always)
    func emit(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        guard !monitors.isEmpty else { return }
        emitNow(kind, &out, fields)
    }

    func emitNow(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        var b = FrameBuilder(op: "event")
        b.constant("kind", kind)
        b.int("t", now - (epoch ?? now))
        fields(&b)
        let frame = b.finish()
        for id in monitors {
            if let p = peers[id], !p.closing { out.append(.monitor(id, frame)) }
        }
    }

    // MARK: - Connections and handshake

    func connected(_ id: PeerID, _ creds: PeerCredentials, now: Millis, _ out: inout Output) {
        let uid = creds.uid ?? UInt32.max
        let userConnections = connectionsByUser[uid] ?? 0
        // Checked before this connection counts: the limits are on connections fluxd accepts.
        var refusal: String? = nil
        if peers.count >= config.maxConnections {
            refusal = "fluxd has \(peers.count) connections (maxConnections \(config.maxConnections))"
        } else if userConnections >= config.maxConnectionsPerUser {
            refusal = "uid \(uid) has \(userConnections) connections (maxConnectionsPerUser \(config.maxConnectionsPerUser))"
        } else if handshakes.count >= config.maxHandshakes {
            refusal = "\(handshakes.count) connections have not said hello yet (maxHandshakes \(config.maxHandshakes))"
        } else if (handshakesByUser[uid] ?? 0) >= config.maxHandshakesPerUser {
            refusal = "uid \(uid) has \(handshakesByUser[uid] ?? 0) connections that have not said hello yet (maxHandshakesPerUser \(config.maxHandshakesPerUser))"
        }
        let account = refusal == nil ? memory.open(uid: uid) : nil
        if refusal == nil && account == nil {
            refusal = "fluxd's memory budget has no room for another connection of uid \(uid) (\(memory.byUser[uid] ?? 0) of \(config.memory.perUser) bytes per user, \(memory.used) of \(config.memory.total) in total)"
        }
        let peer = Peer(id: id, creds: creds, connectedAt: now, account: account ?? memory.userAccount(uid: uid))
        peers[id] = peer
        connectionsByUser[uid] = userConnections + 1
        out.traffic.connections += 1
        if let refusal {
            out.log(.warning, "connection refused: \(refusal)")
            return fail(peer, .tooManyConnections, refusal, &out)
        }
        handshakes.append(id)
        handshakesByUser[uid, default: 0] += 1
        if shuttingDown {
            out.send(peer, byeFrame(reason: "shutdown"))
            close(peer, &out)
        }
    }

    /// The peer is no longer in the handshake (it said hello, timed out or closed).
    func endHandshake(_ peer: Peer) {
        guard let i = handshakes.firstIndex(of: peer.id) else { return }
        handshakes.remove(at: i)
        let uid = peer.account.uid
        if let n = handshakesByUser[uid] {
            if n <= 1 { handshakesByUser.removeValue(forKey: uid) } else { handshakesByUser[uid] = n - 1 }
        }
    }

    func hello(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard peer.role == nil else {
            return fail(peer, .badMessage, "hello was already received", &out)
        }
        endHandshake(peer)
        guard case .value(let version) = env.int("protocol") else {
            return fail(peer, .badMessage, "hello needs an integer \"protocol\"", &out, fatal: true)
        }
        guard version == Int64(fluxProtocolVersion) else {
            var b = FrameBuilder(op: "error")
            b.constant("code", "unsupported-version")
            b.string("message", "protocol \(version) is not supported; this fluxd speaks protocol \(fluxProtocolVersion)")
            b.raw("supported", Array("[\(fluxProtocolVersion)]".utf8))
            b.bool("fatal", true)
            counters.count(.unsupportedVersion)
            out.send(peer, b.finish())
            return close(peer, &out)
        }
        guard case .value(let roleName) = env.string("role"), let role = Role(rawValue: roleName) else {
            return fail(peer, .badMessage, "hello needs \"role\": \"client\", \"store\" or \"monitor\"", &out, fatal: true)
        }
        var name = ""
        switch env.string("name") {
        case .value(let n) where n.utf8.count <= 128: name = n
        case .absent: break
        default: return fail(peer, .badMessage, "\"name\" must be a string of at most 128 bytes", &out, fatal: true)
        }
        var heartbeat = false
        switch env.bool("heartbeat") {
        case .value(let h): heartbeat = h
        case .absent: break
        case .wrongType: return fail(peer, .badMessage, "\"heartbeat\" must be a boolean", &out, fatal: true)
        }
        peer.role = role
        peer.name = name
        if heartbeat && config.pingInterval > 0 {
            peer.heartbeat = true
            heartbeatPeers.insert(peer.id)
            scheduleSweep()
        }
        var b = FrameBuilder(op: "welcome")
        b.int("protocol", fluxProtocolVersion)
        b.string("server", config.serverName)
        b.int("peer", peer.id)
        b.raw("limits", welcomeLimits)
        out.send(peer, b.finish())
        out.log(.debug, "peer \(peer.id) hello: role \(role.rawValue), name \"\(name)\"")
        emit("connect", &out) { e in
            e.int("peer", peer.id)
            e.string("role", role.rawValue)
            e.string("name", name)
            if let pid = peer.creds.pid { e.int("pid", pid) }
            if let uid = peer.creds.uid { e.int("uid", uid) }
        }
        if role == .monitor { monitors.append(peer.id) }
    }

    func closed(_ id: PeerID, now: Millis, _ out: inout Output) {
        guard let peer = peers.removeValue(forKey: id) else { return }
        peer.closing = true  // nothing more is sent to it (it may still be referenced by its unsettled actions)
        if lastPeer === peer { lastPeer = nil }
        endHandshake(peer)
        monitors.removeAll { $0 == id }
        if peer.heartbeat { heartbeatPeers.remove(id) }
        let uid = peer.account.uid
        if let n = connectionsByUser[uid] {
            if n <= 1 { connectionsByUser.removeValue(forKey: uid) } else { connectionsByUser[uid] = n - 1 }
        }
        if peer.role != nil {
            emit("disconnect", &out) { e in
                e.int("peer", id)
                e.string("name", peer.name)
            }
        }
        let owned = peer.owned.sorted()
        let quietly = owned.count > 8  // one line for them all, not one per store
        for name in owned {
            if let store = stores[name] {
                storeDown(store, reason: shuttingDown ? "shutdown" : "disconnected", now: now, quietly: quietly, &out)
            }
        }
        if quietly { out.log(.notice, "\(owned.count) stores of peer \(id) (\(peer.name)) down (\(shuttingDown ? "shutdown" : "disconnected"))") }
        for name in peer.subscriptions {
            stores[name]?.subscribers.removeAll { $0 === peer }
            memory.release(peer.account, Router.subscriptionCost(name))
        }
        var withdrawn: [String: [[UInt8]]] = [:]
        for (_, q) in peer.queries {
            withdrawn[q.store, default: []].append(q.bytes)
            memory.release(peer.account, Router.queryCost(q.bytes))
        }
        var changes: [String: [QueryChange]] = [:]
        for (name, qs) in withdrawn {
            if let changed = stores[name]?.removeQueries(qs), !changed.isEmpty { changes[name] = changed }
        }
        peer.queries = [:]
        memory.close(peer.account)
        for name in changes.keys.sorted() {
            if let store = stores[name] { queriesChanged(store, changes[name]!, &out) }
        }
        for name in Set(peer.subscriptions).union(changes.keys).sorted() {
            if let store = stores[name] { forgetIfUnused(store) }
        }
        out.log(.debug, "peer \(id) (\(peer.name)) closed")
    }

    func close(_ peer: Peer, _ out: inout Output) {
        guard !peer.closing else { return }
        peer.closing = true
        out.append(.close(peer.id))
    }

    // MARK: - Receiving

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
        guard let opSpan = env.span(.op), opSpan.kind == .string else {
            if peer.role == nil { return fail(peer, .handshakeRequired, "the first frame must be hello", &out) }
            return fail(peer, .badMessage, "a message needs a string \"op\"", &out)
        }
        currentBody = body
        defer { currentBody = nil }
        // The two ops of every routed action first, told apart by their bytes (no String for them).
        if let role = peer.role {
            if env.isString(.op, "dispatch") {
                if permitted(peer, role.mayDispatch, "dispatch", &out) { dispatch(peer, env, now: now, &out) }
                return
            }
            if env.isString(.op, "done") {
                if permitted(peer, role == .store, "done", &out) { answer(peer, env, isDone: true, &out) }
                return
            }
        }
        let op = env.string(.op).value ?? ""
        guard let role = peer.role else {
            if op == "hello" { return hello(peer, env, &out) }
            return fail(peer, .handshakeRequired, "the first frame must be hello, not \(op)", &out)
        }
        switch op {
        case "dispatch": if permitted(peer, role.mayDispatch, op, &out) { dispatch(peer, env, now: now, &out) }
        case "subscribe": subscribe(peer, env, &out)
        case "unsubscribe": unsubscribe(peer, env, &out)
        case "query": if permitted(peer, role.mayDispatch, op, &out) { query(peer, env, &out) }
        case "unquery": if permitted(peer, role.mayDispatch, op, &out) { unquery(peer, env, &out) }
        case "info": info(peer, env, &out)
        case "get": get(peer, env, &out)
        case "ping": ping(peer, env, &out)
        case "pong": break  // a heartbeat answer: hearing from the peer is all that counts
        case "bye": close(peer, &out)
        case "register": if permitted(peer, role == .store, op, &out) { register(peer, env, now: now, &out) }
        case "unregister": if permitted(peer, role == .store, op, &out) { unregister(peer, env, now: now, &out) }
        case "done", "reject": if permitted(peer, role == .store, op, &out) { answer(peer, env, isDone: op == "done", &out) }
        case "state": if permitted(peer, role == .store, op, &out) { unsolicitedState(peer, env, &out) }
        case "hello": fail(peer, .badMessage, "hello was already received", &out)
        default:
            if let host = Op.received(op), host.isHostOperation, hostOps.contains(host) {
                hostRequest(peer, host, env, &out)
            } else {
                fail(peer, .unknownOp, "unknown op \"\(op)\"", &out)
            }
        }
    }

    /// A host operation (SPEC §8.11): validated here, answered by the host (`.host` effect).
    func hostRequest(_ peer: Peer, _ op: Op, _ env: Envelope, _ out: inout Output) {
        guard case .value(let id) = env.string(.id), Names.isValidID(id) else {
            return fail(peer, .badMessage, "\(op.rawValue) needs an \"id\": a string of 1 to \(Names.maxIDBytes) bytes", &out)
        }
        if op == .workers { return out.append(.host(peer.id, .workers(id: id))) }
        guard case .value(let name) = env.string("name"), Names.isValidWorker(name) else {
            return fail(peer, .badMessage, "\(op.rawValue) needs a worker \"name\": 1 to 64 bytes of A-Z a-z 0-9 . _ -", &out, ref: id)
        }
        out.append(.host(peer.id, op == .restartWorker ? .restartWorker(id: id, name: name) : .stopWorker(id: id, name: name)))
    }

    /// Whether the peer's role may send `op`; if not, the peer gets `forbidden`.
    func permitted(_ peer: Peer, _ ok: Bool, _ op: String, _ out: inout Output) -> Bool {
        if !ok { fail(peer, .forbidden, "a \(peer.role?.rawValue ?? "peer") may not send \(op)", &out) }
        return ok
    }

    // MARK: - Stores

    func register(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
        guard case .value(let name) = env.string(.store), Names.isValidStore(name) else {
            return fail(peer, .badMessage, "register needs a valid \"store\" name", &out)
        }
        var handles: [String] = []
        switch env.stringArray("handles") {
        case .value(let h) where h.allSatisfy(Names.isValidPattern): handles = h
        case .absent: break
        default: return fail(peer, .badMessage, "\"handles\" must be an array of action types or prefix* patterns", &out, ref: name)
        }
        var waitFor: [String] = []
        switch env.stringArray("waitFor") {
        case .value(let w) where w.allSatisfy(Names.isValidStore) && !w.contains(name): waitFor = w
        case .absent: break
        default: return fail(peer, .badMessage, "\"waitFor\" must be an array of other stores' names", &out, ref: name)
        }
        if waitFor.count > config.maxWaitFor {
            return fail(peer, .limitExceeded, "\"waitFor\" names \(waitFor.count) stores (maxWaitFor \(config.maxWaitFor))", &out, ref: name)
        }
        var queryDeltas = false
        switch env.bool("queryDeltas") {
        case .value(let q): queryDeltas = q
        case .absent: break
        case .wrongType: return fail(peer, .badMessage, "\"queryDeltas\" must be a boolean", &out, ref: name)
        }
        if let initial = env.span(.state), initial.kind == .null {
            return fail(peer, .badMessage, "\"state\" may not be null", &out, ref: name)
        }
        if !peer.owned.contains(name) && peer.owned.count >= config.maxStoresPerConnection {
            return fail(peer, .limitExceeded, "this connection owns \(peer.owned.count) stores (maxStoresPerConnection \(config.maxStoresPerConnection))", &out, ref: name)
        }
        let store = entry(name)
        if let owner = store.owner {
            return fail(peer, .nameTaken, "store \"\(name)\" is owned by peer \(owner)", &out, ref: name)
        }
        if let path = cyclePath(from: name, waitFor: waitFor) {
            forgetIfUnused(store)  // a refused registration leaves no name behind
            return fail(peer, .cycle, "waitFor would make a cycle: \(path.joined(separator: " -> "))", &out, ref: name)
        }
        // A registered name is remembered for the whole run: it stays charged to the last connection that
        // registered it (and so to its user), which bounds how many names one user can make fluxd keep.
        let registrationCost = 256 + name.utf8.count + handles.reduce(0) { $0 + $1.utf8.count + 16 }
            + waitFor.reduce(0) { $0 + $1.utf8.count + 16 }
        // The initial state (used when no snapshot is retained) must fit too, checked before anything is announced:
        // its room is charged with the registration and handed back for `publish` to take below.
        let initialCost = store.version == 0 ? env.span(.state).map { 96 + store.nameJSON.count + $0.range.count } ?? 0 : 0
        let noRoom = "fluxd's memory budget has no room for registering store \"\(name)\"\(initialCost > 0 ? " with its initial state" : "") (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)"
        if store.registeredBy === peer.account {
            guard memory.resize(peer.account, from: store.registrationCost, to: registrationCost + initialCost) else {
                forgetIfUnused(store)
                return fail(peer, .memoryBudget, noRoom, &out, ref: name)
            }
            memory.release(peer.account, initialCost)
        } else {
            guard memory.charge(peer.account, registrationCost + initialCost) else {
                forgetIfUnused(store)
                return fail(peer, .memoryBudget, noRoom, &out, ref: name)
            }
            memory.release(peer.account, initialCost)
            if let previous = store.registeredBy { memory.release(previous, store.registrationCost) }
            store.registeredBy = peer.account
        }
        store.registrationCost = registrationCost
        let resumed = store.version > 0
        store.ownerPeer = peer
        store.status = .up
        store.queryDeltas = queryDeltas
        store.stalled = false
        expiringStores.remove(name)
        upStores.insert(name)
        if config.storeTimeout > 0 { scheduleSweep() }
        store.handles = handles
        store.waitFor = waitFor
        store.wasRegistered = true
        peer.owned.insert(name)
        routes.removeAll(keepingCapacity: true)
        lastRoute = LastRoute()
        for i in store.queue.indices { store.queue[i].deadline = nil }

        let initial = resumed ? nil : env.raw(.state)
        var b = FrameBuilder(op: "registered")
        b.string("store", name)
        b.int("version", store.version + (initial == nil ? 0 : 1))  // the initial state becomes version 1 below
        b.int("seq", store.seq)
        b.bool("resumed", resumed)
        out.send(peer, b.finish())
        var up = FrameBuilder(op: "store-up")
        up.string("store", name)
        up.int("version", store.version + (initial == nil ? 0 : 1))
        let upFrame = up.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribers where sub !== peer { out.send(sub, upFrame) }
        emit("store-up", &out) { e in
            e.string("store", name)
            e.int("version", store.version + (initial == nil ? 0 : 1))
        }
        out.append(.storeChanged(StoreChange(store: name, status: .up, owner: peer.id, ownerPID: peer.creds.pid)))
        let versionBefore = store.version
        if let initial {
            let published = publish(store, state: initial, seq: store.seq, &out)
            assert(published, "the initial state's room was checked above")
        }
        let broadcastToSelf = store.version != versionBefore && peer.subscriptions.contains(name)
        if let snapshot = store.snapshot, !broadcastToSelf { out.send(peer, snapshot) }
        sendQueries(store, &out)
        out.log(.info, "store \"\(name)\" registered by peer \(peer.id) (\(peer.name)), version \(store.version)\(resumed ? ", resumed" : ""), \(store.queue.count) queued")
        pump(store, &out)
    }

    func unregister(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
        guard case .value(let name) = env.string(.store), let store = stores[name] else {
            return fail(peer, .unknownStore, "unregister needs the name of a store you own", &out)
        }
        guard store.owner == peer.id else {
            return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
        }
        storeDown(store, reason: "unregistered", now: now, &out)
    }

    /// A store's owner is gone: keep name, routes and snapshot; put unanswered actions back at the front of the
    /// queue, to be redelivered when the store registers again; start the queue timeout; tell subscribers.
    func storeDown(_ store: StoreEntry, reason: StaticString, now: Millis, quietly: Bool = false,
                           _ out: inout Output) {
        store.ownerPeer?.owned.remove(store.name)
        store.ownerPeer = nil
        store.status = .down
        store.stalled = false
        upStores.remove(store.name)
        var back = store.inflight
        store.inflight.removeAll()
        for i in back.indices { back[i].redelivered = true }
        store.queue.prepend(contentsOf: back)
        let deadline = now + config.queueTimeout
        for i in store.queue.indices { store.queue[i].deadline = max(store.queue[i].deadline ?? deadline, deadline) }
        if !store.queue.isEmpty { expiringStores.insert(store.name) }
        var b = FrameBuilder(op: "store-down")
        b.string("store", store.name)
        b.constant("reason", reason)
        let frame = b.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribers { out.send(sub, frame) }
        emit("store-down", &out) { e in
            e.string("store", store.name)
            e.constant("reason", reason)
        }
        out.append(.storeChanged(StoreChange(store: store.name, status: .down)))
        out.log(quietly ? .debug : .notice, "store \"\(store.name)\" down (\(reason)), \(store.queue.count) actions queued")
    }

    /// The waitFor path that would close a cycle if `name` waited for `waitFor`, or nil.
    ///
    /// A depth-first search that remembers every store it has finished (`done`): a store from which `name` is not
    /// reachable is never walked again, so one check visits each store and each waitFor edge at most once
    /// (linear in the registration graph; the steps are counted in `maxCycleCheckSteps`). Iterative, so a long
    /// chain of stores cannot exhaust the stack.
    func cyclePath(from name: String, waitFor: [String]) -> [String]? {
        var done: Set<String> = [name]
        var path: [String] = [name]
        // Each frame: a store on the current path and the index of its next waitFor entry to walk.
        var stack: [(deps: [String], next: Int)] = [(waitFor, 0)]
        var steps = 0
        defer { maxCycleCheckSteps = max(maxCycleCheckSteps, steps) }
        while !stack.isEmpty {
            let top = stack.count - 1
            let (deps, next) = stack[top]
            guard next < deps.count else {
                stack.removeLast()
                path.removeLast()
                continue
            }
            stack[top].next = next + 1
            let dep = deps[next]
            steps += 1  // one edge
            if dep == name { return path + [name] }
            guard done.insert(dep).inserted else { continue }
            steps += 1  // one store
            path.append(dep)
            stack.append((stores[dep]?.waitFor ?? [], 0))
        }
        return nil
    }

    func entry(_ name: String) -> StoreEntry {
        if let s = stores[name] { return s }
        let s = StoreEntry(name: name, key: nextStoreKey)
        nextStoreKey &+= 1
        stores[name] = s
        return s
    }

    /// Forgets a store name nobody needs any more: never registered, no subscriber, no live query (SPEC §10).
    /// A name that is subscribed to before its store registers stays known, so reconnecting clients keep working.
    func forgetIfUnused(_ store: StoreEntry) {
        guard !store.wasRegistered, store.subscribers.isEmpty, store.queryOrder.isEmpty, store.queue.isEmpty,
              store.inflight.isEmpty, store.snapshot == nil else { return }
        stores.removeValue(forKey: store.name)
    }

    // MARK: - Dispatch, delivery and answers

    func dispatch(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
        var idRaw: ArraySlice<UInt8>? = nil
        switch env.string(.id) {
        case .absent: break
        case .value(let id) where !id.isEmpty && id.utf8.count <= 256: idRaw = env.raw(.id)
        default: return fail(peer, .badMessage, "\"id\" must be a string of 1 to 256 bytes", &out)
        }
        let refText = idRaw.map { decodeJSONString($0) }
        // A type written exactly as the last one routed is that type, and valid (a route is looked up only for
        // valid types): no decoding then.
        guard let typeSpan = env.span(.type), typeSpan.kind == .string else {
            return fail(peer, .badMessage, "dispatch needs a valid action \"type\"", &out, ref: refText)
        }
        let typeJSON = env.body[typeSpan.range]
        let type: String
        var knownTargets: [StoreEntry]? = nil
        if lastRoute.isValid && sameBytes(lastRoute.typeJSON, typeJSON) {
            type = lastRoute.type
            knownTargets = lastRoute.targets
        } else {
            type = decodeJSONString(typeJSON)
            guard Names.isValidType(type) else {
                return fail(peer, .badMessage, "dispatch needs a valid action \"type\"", &out, ref: refText)
            }
        }
        var wantsSettlement = false
        switch env.bool(.settle) {
        case .absent: break
        case .value(let s): wantsSettlement = s
        case .wrongType: return fail(peer, .badMessage, "\"settle\" must be a boolean", &out, ref: refText)
        }
        if wantsSettlement && idRaw == nil {
            return fail(peer, .badMessage, "a dispatch with settle needs an \"id\"", &out)
        }
        var cause: Int64? = nil
        switch env.int(.cause) {
        case .absent: break
        case .value(let c) where c > 0: cause = c
        default: return fail(peer, .badMessage, "\"cause\" must be a positive integer (a seq)", &out, ref: refText)
        }
        if shuttingDown || draining {
            return fail(peer, .shuttingDown, "fluxd is shutting down", &out, ref: refText)
        }
        let targets = knownTargets ?? route(type, typeJSON: typeJSON)
        if targets.isEmpty {
            return fail(peer, .noHandler, "no store handles \"\(type)\"", &out, ref: refText)
        }
        if peer.unsettled >= config.maxPending {
            return fail(peer, .overloaded, "\(peer.unsettled) dispatches are unsettled (maxPending \(config.maxPending))", &out, ref: refText)
        }
        // A full queue refuses busy dispatchers only: one with fewer than `fairPending` unsettled actions is still
        // accepted, so a flood from one connection cannot lock the others out of a store.
        for s in targets where s.status == .up && s.queue.count >= config.queueLimit && peer.unsettled >= config.fairPending {
            return fail(peer, .overloaded, "store \"\(s.name)\" has \(s.queue.count) actions queued (queueLimit \(config.queueLimit))", &out, ref: refText)
        }
        let payload = env.raw(.payload) ?? ArraySlice("null".utf8)
        guard memory.charge(peer.account, Router.actionCost(payload.count, typeJSON.count)) else {
            return fail(peer, .memoryBudget, "fluxd's memory budget has no room for this action (\(peer.unsettled) of this connection's dispatches are unsettled; uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)", &out, ref: refText)
        }
        lastSeq += 1
        let action = ActionRecord(
            seq: lastSeq, typeJSON: typeJSON, origin: peer.id, cause: cause,
            payload: payload,
            dispatcher: peer, id: wantsSettlement ? idRaw : nil, targets: targets)
        pendingCount += 1
        peer.unsettled += 1
        out.traffic.actions += 1
        emit("dispatch", &out) { e in
            e.int("seq", action.seq)
            e.string("type", type)
            e.int("origin", peer.id)
            e.string("originName", peer.name)
            if let cause { e.int("cause", cause) }
            e.raw("payload", action.payload)
        }
        for (i, store) in targets.enumerated() {
            if store.status == .down && store.queue.count >= config.queueLimit {
                action.setResult(at: i, .unavailable(.storeUnavailable, "store \"\(store.name)\" is down and its queue is full (queueLimit \(config.queueLimit))"))
                continue
            }
            if store.status == .down {
                store.queue.append(Delivery(action: action, deadline: now + config.queueTimeout))
                expiringStores.insert(store.name)
            } else {
                store.queue.append(Delivery(action: action, deadline: nil))
            }
        }
        for store in targets { pump(store, &out) }
        if action.isComplete { settle(action, &out) }
    }

    /// The stores that handle `type`, sorted by name (cached until a registration changes).
    func route(_ type: String, typeJSON: ArraySlice<UInt8>) -> [StoreEntry] {
        if lastRoute.isValid && lastRoute.type == type { return lastRoute.targets }
        if let cached = routes[type] {
            lastRoute = LastRoute(type: type, typeJSON: Array(typeJSON), targets: cached)
            return cached
        }
        var targets: [StoreEntry] = []
        for store in stores.values where store.wasRegistered {
            if store.handles.contains(where: { Names.matches(pattern: $0, type: type) }) { targets.append(store) }
        }
        targets.sort { $0.name < $1.name }
        // Bounded: a peer dispatching endless distinct types must not grow fluxd's memory.
        if routes.count >= Router.routeCacheLimit { routes.removeAll(keepingCapacity: true) }
        routes[type] = targets
        lastRoute = LastRoute(type: type, typeJSON: Array(typeJSON), targets: targets)
        return targets
    }

    /// Sends actions from the head of a live store's queue while its window has room and the head is not held
    /// back by waitFor.
    func pump(_ store: StoreEntry, _ out: inout Output) {
        guard store.status == .up, let peer = store.ownerPeer else { return }
        while store.inflight.count < config.storeWindow, !store.queue.isEmpty {
            if !store.waitFor.isEmpty {
                let action = store.queue[0].action
                for dep in store.waitFor {
                    if let i = action.targets.firstIndex(where: { $0.name == dep }), action.result(at: i) == nil { return }
                }
            }
            let head = store.queue.removeFirst()
            out.send(peer, actionFrame(head.action, store: store, redelivered: head.redelivered))
            if store.inflight.isEmpty { store.lastProgress = now }  // the store's clock starts with its oldest
            store.inflight.append(head)
        }
    }

    func actionFrame(_ action: ActionRecord, store: StoreEntry, redelivered: Bool) -> Frame {
        var b = FrameBuilder(op: "action", capacity: 96 + store.nameJSON.count + action.typeJSON.count + action.payload.count)
        b.raw("store", store.nameJSON)
        b.int("seq", action.seq)
        b.raw("type", action.typeJSON)
        b.int("origin", action.origin)
        if let cause = action.cause { b.int("cause", cause) }
        if redelivered { b.bool("redelivered", true) }
        b.raw("payload", action.payload)
        return b.finish()
    }

    /// `done` or `reject` from a store: must answer the oldest action in flight to that store.
    func answer(_ peer: Peer, _ env: Envelope, isDone: Bool, _ out: inout Output) {
        let store: StoreEntry
        if let last = peer.lastStore, last.ownerPeer === peer, let raw = env.raw(.store), sameBytes(last.nameJSON, raw) {
            store = last  // the store this peer answered for last, named the same way: no decoding or hashing
        } else {
            guard case .value(let name) = env.string(.store) else {
                return fail(peer, .badMessage, "\(isDone ? "done" : "reject") needs \"store\"", &out)
            }
            guard let owned = ownedStore(peer, name) else {
                return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
            }
            store = owned
        }
        let name = store.name
        guard case .value(let seq) = env.int(.seq) else {
            return fail(peer, .badMessage, "\(isDone ? "done" : "reject") needs an integer \"seq\"", &out, ref: name)
        }
        // (Read in place: the oldest delivery is copied, and its action retained, only once it is removed below.)
        guard !store.inflight.isEmpty, store.inflight[0].action.seq == UInt64(bitPattern: seq) else {
            let expected = store.inflight.first.map { "\($0.action.seq)" } ?? "none"
            return fail(peer, .badMessage, "answer for seq \(seq) out of order: the oldest unanswered action of \"\(name)\" is \(expected)", &out, ref: name)
        }
        let result: StoreResult
        if isDone {
            if let state = env.span(.state) {
                guard state.kind != .null else {
                    return fail(peer, .badMessage, "\"state\" may not be null", &out, ref: name)
                }
                guard publish(store, state: env.body[state.range], seq: UInt64(bitPattern: seq), &out) else {
                    // The action stays unanswered: redelivered when the store comes back (SPEC §10).
                    return failStateOverBudget(peer, store, env.body[state.range].count, &out)
                }
            }
            result = .done
        } else {
            guard let error = env.raw(.error), (try? Envelope(body: Array(error)))?.string("code").value != nil else {
                return fail(peer, .badMessage, "reject needs \"error\": {\"code\": string, \"message\": string}", &out, ref: name)
            }
            result = .rejected(error)
        }
        let head = store.inflight.removeFirst()
        store.lastProgress = now
        if store.stalled { storeRecovered(store, &out) }
        store.seq = head.action.seq
        record(head.action, store: store, result: result, &out)
        pump(store, &out)
    }

    /// The store `name` if `peer` owns it (a store peer's last answered store is remembered: no hashing then).
    func ownedStore(_ peer: Peer, _ name: String) -> StoreEntry? {
        if let last = peer.lastStore, last.ownerPeer === peer, last.name == name { return last }
        guard let store = stores[name], store.owner == peer.id else { return nil }
        peer.lastStore = store
        return store
    }

    /// Records one store's result for an action; releases stores waiting for it; settles when complete.
    func record(_ action: ActionRecord, store: StoreEntry, result: StoreResult, _ out: inout Output) {
        guard let i = action.targets.firstIndex(where: { $0 === store }) else { return }
        action.setResult(at: i, result, version: store.version)
        if action.targets.count > 1 {
            for other in action.targets where other !== store && other.waitFor.contains(store.name) { pump(other, &out) }
        }
        if action.isComplete { settle(action, &out) }
    }

    func settle(_ action: ActionRecord, _ out: inout Output) {
        pendingCount -= 1
        let dispatcher = action.dispatcher
        dispatcher.unsettled -= 1
        memory.release(dispatcher.account, Router.actionCost(action.payload.count, action.typeJSON.count))
        let toDispatcher = action.id != nil && !dispatcher.closing  // a peer that is gone is `closing` too
        guard toDispatcher || !monitors.isEmpty else { return }
        let results = resultsJSON(action)
        if toDispatcher, let id = action.id {
            var b = FrameBuilder(op: "settled", capacity: results.count + 64)
            b.raw("id", id)
            b.int("seq", action.seq)
            b.raw("results", results)
            out.send(dispatcher, b.finish())
        }
        emit("settle", &out) { e in
            e.int("seq", action.seq)
            e.raw("results", results)
        }
    }

    /// The `results` array of a settlement: one object per target store, ordered by name.
    func resultsJSON(_ action: ActionRecord) -> [UInt8] {
        var j: [UInt8] = [UInt8(ascii: "[")]
        for (i, store) in action.targets.enumerated() {
            if i > 0 { j.append(UInt8(ascii: ",")) }
            j.append(contentsOf: "{\"store\":".utf8)
            j.append(contentsOf: store.nameJSON)
            switch action.result(at: i)! {
            case .done:
                j.append(contentsOf: ",\"status\":\"done\",\"version\":\(action.version(at: i))".utf8)
            case .rejected(let error):
                j.append(contentsOf: ",\"status\":\"rejected\",\"error\":".utf8)
                j.append(contentsOf: error)
            case .unavailable(let code, let message):
                j.append(contentsOf: ",\"status\":\"unavailable\",\"error\":{\"code\":".utf8)
                appendEscaped(code.rawValue, to: &j)
                j.append(contentsOf: ",\"message\":".utf8)
                appendEscaped(message, to: &j)
                j.append(UInt8(ascii: "}"))
            }
            j.append(UInt8(ascii: "}"))
        }
        j.append(UInt8(ascii: "]"))
        return j
    }

    /// A new state from a store: a new version unless byte-identical to the retained one; retained; the same
    /// frame goes to every subscriber.
    @discardableResult
    func publish(_ store: StoreEntry, state: ArraySlice<UInt8>, seq: UInt64, _ out: inout Output) -> Bool {
        if let current = store.snapshot, sameBytes(UnsafeRawBufferPointer(rebasing: current.bytes[store.stateRange]), state) {
            return true
        }
        // The retained snapshot is charged to the connection that published it (within its allowance a small
        // state costs the shared budget nothing); it stays charged to that account, and so to its user, after the
        // connection closes, until a newer state replaces it.
        let cost = 96 + store.nameJSON.count + state.count
        if let owner = store.ownerPeer, owner.account === store.retainedBy {
            // The common case: the same connection publishes again; only the difference is charged.
            guard memory.resize(owner.account, from: store.retainedCost, to: cost) else { return false }
        } else {
            guard let account = store.ownerPeer?.account ?? store.retainedBy else { return false }
            if let previous = store.retainedBy { memory.release(previous, store.retainedCost) }
            guard memory.charge(account, cost) else {
                if let previous = store.retainedBy { memory.force(previous, store.retainedCost) }
                return false
            }
            store.retainedBy = account
        }
        store.retainedCost = cost
        store.version += 1
        var b = FrameBuilder(op: "snapshot", capacity: 64 + store.nameJSON.count + state.count)
        b.raw("store", store.nameJSON)
        b.int("version", store.version)
        b.int("seq", seq)
        b.key("state")
        let stateStart = b.byteCount
        b.rawBytes(state)
        // A subscriber that cannot keep up is sent only the newest of its unwritten snapshots of this store.
        let frame = b.finish(coalescing: .newestWins(key: store.key))
        store.snapshot = frame
        store.snapshotSeq = seq
        store.stateRange = stateStart..<(stateStart + state.count)
        out.traffic.snapshots += 1
        for sub in store.subscribers { out.send(sub, frame) }
        emit("snapshot", &out) { e in
            e.string("store", store.name)
            e.int("version", store.version)
            e.int("seq", seq)
            e.raw("state", state)
        }
        return true
    }

    /// A store's new state does not fit its user's share of the memory budget: the store is closed with
    /// `memory-budget` (its unanswered actions are redelivered when it registers again, SPEC §10).
    func failStateOverBudget(_ peer: Peer, _ store: StoreEntry, _ size: Int, _ out: inout Output) {
        out.log(.warning, "store \"\(store.name)\": a state of \(size) bytes does not fit the memory budget; closing its connection")
        fail(peer, .memoryBudget, "a state of \(size) bytes for store \"\(store.name)\" does not fit fluxd's memory budget (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes; \(memory.used) of \(config.memory.total) in total)", &out, ref: store.name, fatal: true)
    }

    func unsolicitedState(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let name) = env.string(.store) else {
            return fail(peer, .badMessage, "state needs \"store\"", &out)
        }
        guard let store = ownedStore(peer, name) else {
            return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
        }
        guard let state = env.span(.state), state.kind != .null else {
            return fail(peer, .badMessage, "state needs a non-null \"state\"", &out, ref: name)
        }
        if !publish(store, state: env.body[state.range], seq: store.seq, &out) {
            failStateOverBudget(peer, store, env.body[state.range].count, &out)
        }
    }

    // MARK: - Time and shutdown

    func tick(now: Millis, _ out: inout Output) {
        if let at = sweepAt, at <= now { sweep(now: now, &out) }
        while let first = handshakes.first {
            guard let peer = peers[first] else { handshakes.removeFirst(); continue }
            guard peer.connectedAt + config.handshakeTimeout <= now else { break }
            endHandshake(peer)
            fail(peer, .timeout, "no hello within \(config.handshakeTimeout) ms", &out)
        }
        for name in expiringStores.sorted() {
            guard let store = stores[name] else { continue }
            while let head = store.queue.first, let d = head.deadline, d <= now {
                store.queue.removeFirst()
                record(head.action, store: store, result: .unavailable(.storeUnavailable, "store \"\(name)\" stayed down for \(config.queueTimeout) ms"), &out)
            }
            if store.queue.isEmpty { expiringStores.remove(name) }
        }
    }

    func shutdown(_ out: inout Output) {
        guard !shuttingDown else { return }
        shuttingDown = true
        out.log(.notice, "shutting down: settling \(pendingCount) actions, saying goodbye to \(peers.count) peers")
        for action in unsettledActions() {
            for i in action.targets.indices where action.result(at: i) == nil {
                action.setResult(at: i, .unavailable(.shuttingDown, "fluxd is shutting down"))
            }
            settle(action, &out)
        }
        for name in stores.keys.sorted() {
            let store = stores[name]!
            // Every store's deliveries go, a down store's too: they are settled now, and one left in a down
            // store's queue would expire at a later tick and be settled a second time.
            store.queue.removeAll()
            store.inflight.removeAll()
            guard store.status == .up else { continue }
            var b = FrameBuilder(op: "store-down")
            b.string("store", name)
            b.constant("reason", "shutdown")
            let frame = b.finish(coalescing: .fence(key: store.key))
            for sub in store.subscribers { out.send(sub, frame) }
        }
        expiringStores.removeAll()
        let bye = byeFrame(reason: "shutdown")
        for id in peers.keys.sorted() {
            let peer = peers[id]!
            guard !peer.closing else { continue }
            out.send(peer, bye)
            close(peer, &out)
        }
    }

    /// Every accepted, unsettled action, in seq order: each is waiting in the queue or window of at least one
    /// target store (an action leaves a store's queues only with a final result from it, and settles when all
    /// its targets have one).
    func unsettledActions() -> [ActionRecord] {
        var found: [UInt64: ActionRecord] = [:]
        for store in stores.values {
            for d in store.inflight { found[d.action.seq] = d.action }
            for d in store.queue { found[d.action.seq] = d.action }
        }
        return found.keys.sorted().map { found[$0]! }
    }

    func byeFrame(reason: StaticString) -> Frame {
        var b = FrameBuilder(op: "bye")
        b.constant("reason", reason)
        return b.finish()
    }

    // MARK: - Errors

    /// Sends an error to one peer (and closes its connection when the code is fatal or `fatal` is set).
    func fail(_ peer: Peer, _ code: ErrorCode, _ message: String, _ out: inout Output,
                      ref: String? = nil, fatal: Bool = false) {
        let closes = fatal || code.isFatal
        var b = FrameBuilder(op: "error")
        b.string("code", code.rawValue)
        b.string("message", message)
        let current = currentBody.flatMap { try? Envelope(body: $0) }
        if let ref = ref ?? current.flatMap({ $0.string(.id).value ?? $0.string(.store).value }) {
            b.string("ref", ref)
        }
        b.bool("fatal", closes)
        counters.count(code)
        out.send(peer, b.finish())
        // Closed before the monitor event: a monitor whose own error is fatal gets nothing after it (found by the
        // router fuzz target).
        if closes { close(peer, &out) }
        emit("error", &out) { e in
            e.int("peer", peer.id)
            e.string("code", code.rawValue)
            e.string("message", message)
        }
        out.log(.debug, "peer \(peer.id) (\(peer.name)): \(code.rawValue): \(message)")
    }
}

