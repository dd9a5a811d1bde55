import DequeModule
import FluxCore

/// The dispatcher as a pure state machine: the single place where FluxBus's semantics live.
///
/// The transport turns socket and timer activity into `RouterEvent`s; the router answers each with
/// `RouterEffect`s (frames to send, connections to close, lines to log). It does no I/O and reads no clock, so
/// every rule of protocol/SPEC.md can be unit-tested by feeding events and reading effects.
///
/// How to read it: `handle` dispatches on the event; `receive` parses the envelope and dispatches on `op`;
/// each `op` has one method below, in the order of SPEC.md. The rules it keeps:
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

    @exclusivity(unchecked) private var peers: [PeerID: Peer] = [:]
    /// The peer of the last frame (frames come in runs from one connection): no hashing then.
    @exclusivity(unchecked) private var lastPeer: Peer?
    /// Peers that have not said hello yet, in connection order (so their deadlines are in order too).
    @exclusivity(unchecked) private var handshakes: [PeerID] = []
    /// Every store name fluxd has heard of: registered (up or down) or only subscribed/queried (unknown).
    @exclusivity(unchecked) private var stores: [String: StoreEntry] = [:]
    /// How many accepted actions are not settled yet (each one sits in the queue or window of every target
    /// store that has not answered it: `unsettledActions()` finds them).
    @exclusivity(unchecked) private var pendingCount = 0
    /// Action type -> the stores that handle it (sorted by name). Cleared whenever a registration changes.
    @exclusivity(unchecked) private var routes: [String: [StoreEntry]] = [:]
    /// The last route looked up, with the type as its dispatcher wrote it (consecutive actions mostly have the
    /// same type, written the same way): no decoding or hashing then.
    @exclusivity(unchecked) private var lastRoute = LastRoute()
    @exclusivity(unchecked) private var lastSeq: UInt64 = 0
    @exclusivity(unchecked) private var shuttingDown = false
    @exclusivity(unchecked) private var draining = false
    /// Monitor peers (role monitor, handshake done), in connection order: they get every `event`.
    @exclusivity(unchecked) private var monitors: [PeerID] = []
    /// The clock reading of the first event (monitor events carry time since then) and of the current one.
    @exclusivity(unchecked) private var epoch: Millis?
    @exclusivity(unchecked) private var now: Millis = 0
    /// The body of the message being handled: errors about it carry its `id` if a string, else its `store` as
    /// `ref` (SPEC §8.9), read only when an error is actually sent (scanning it again then is cheaper than
    /// keeping the envelope for every message).
    @exclusivity(unchecked) private var currentBody: [UInt8]?
    /// Stores that are down: the only ones whose queues can expire (`nextDeadline`, `tick`).
    @exclusivity(unchecked) private var downStores: Set<String> = []
    /// Traffic and error counters, reported by `info`.
    @exclusivity(unchecked) public private(set) var counters = Counters()

    /// How many action types' routes are cached before the cache starts over.
    static let routeCacheLimit = 4096

    public init(config: RouterConfig = RouterConfig()) {
        self.config = config
    }

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
        var out = Output(effects: effects, sink: nil)
        effects = []
        handle(event, now: now, &out)
        effects = out.effects
    }

    /// Feeds one event; `sink` carries out each effect as it is produced, in order (no effect array: fluxd's
    /// hot path).
    public func handle(_ event: RouterEvent, now: Millis, sink: any RouterEffectSink) {
        var out = Output(effects: [], sink: sink)
        handle(event, now: now, &out)
    }

    private func handle(_ event: RouterEvent, now: Millis, _ out: inout Output) {
        if epoch == nil { epoch = now }
        self.now = now
        switch event {
        case .connected(let id, let creds):
            connected(id, creds, now: now, &out)
        case .frame(let id, let body):
            if let peer = peerFrom(id), !peer.closing {
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
        case .tick:
            tick(now: now, &out)
        case .drain:
            if !draining { out.log(.notice, "draining: refusing new dispatches, \(pendingCount) actions in flight") }
            draining = true
        case .shutdown:
            shutdown(&out)
        }
        counters.traffic.add(out.traffic)
    }

    /// The connected peer `id` (a one-entry cache in front of `peers`).
    @inline(__always)
    private func peerFrom(_ id: PeerID) -> Peer? {
        if let p = lastPeer, p.id == id { return p }
        guard let p = peers[id] else { return nil }
        lastPeer = p
        return p
    }

    /// Whether anything can expire at all (a handshake pending, or a store down): without, `nextDeadline` is nil.
    public var hasDeadlines: Bool { !handshakes.isEmpty || !downStores.isEmpty }

    /// The earliest time at which a `tick` has work to do (a handshake or a queued action expiring), if any.
    public var nextDeadline: Millis? {
        var next: Millis? = nil
        if let first = handshakes.first, let peer = peers[first] {
            next = peer.connectedAt + config.handshakeTimeout
        }
        for name in downStores {
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
    private func emit(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        guard !monitors.isEmpty else { return }
        emitNow(kind, &out, fields)
    }

    private func emitNow(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
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

    private func connected(_ id: PeerID, _ creds: PeerCredentials, now: Millis, _ out: inout Output) {
        let peer = Peer(id: id, creds: creds, connectedAt: now)
        peers[id] = peer
        handshakes.append(id)
        out.traffic.connections += 1
        if shuttingDown {
            out.send(peer, byeFrame(reason: "shutdown"))
            close(peer, &out)
        }
    }

    private func hello(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard peer.role == nil else {
            return fail(peer, .badMessage, "hello was already received", &out)
        }
        handshakes.removeAll { $0 == peer.id }
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
        peer.role = role
        peer.name = name
        var b = FrameBuilder(op: "welcome")
        b.int("protocol", fluxProtocolVersion)
        b.string("server", config.serverName)
        b.int("peer", peer.id)
        var limits: [UInt8] = []
        limits.append(contentsOf: "{\"maxFrame\":\(config.maxFrame),\"storeWindow\":\(config.storeWindow),".utf8)
        limits.append(contentsOf: "\"queueLimit\":\(config.queueLimit),\"queueTimeout\":\(config.queueTimeout),".utf8)
        limits.append(contentsOf: "\"handshakeTimeout\":\(config.handshakeTimeout),\"maxPending\":\(config.maxPending),".utf8)
        limits.append(contentsOf: "\"maxBacklog\":\(config.maxBacklog)}".utf8)
        b.raw("limits", limits)
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

    private func closed(_ id: PeerID, now: Millis, _ out: inout Output) {
        guard let peer = peers.removeValue(forKey: id) else { return }
        peer.closing = true  // nothing more is sent to it (it may still be referenced by its unsettled actions)
        if lastPeer === peer { lastPeer = nil }
        handshakes.removeAll { $0 == id }
        monitors.removeAll { $0 == id }
        if peer.role != nil {
            emit("disconnect", &out) { e in
                e.int("peer", id)
                e.string("name", peer.name)
            }
        }
        for name in peer.owned.sorted() {
            if let store = stores[name] { storeDown(store, reason: shuttingDown ? "shutdown" : "disconnected", now: now, &out) }
        }
        for name in peer.subscriptions {
            stores[name]?.subscribers.removeAll { $0 === peer }
        }
        var touched: [String] = []
        for (_, q) in peer.queries {
            if let store = stores[q.store], store.removeQuery(q.bytes) { touched.append(q.store) }
        }
        for name in Set(touched).sorted() { if let store = stores[name] { sendQueries(store, &out) } }
        out.log(.debug, "peer \(id) (\(peer.name)) closed")
    }

    private func close(_ peer: Peer, _ out: inout Output) {
        guard !peer.closing else { return }
        peer.closing = true
        out.append(.close(peer.id))
    }

    // MARK: - Receiving

    private func receive(_ peer: Peer, _ body: [UInt8], now: Millis, _ out: inout Output) {
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
        case "bye": close(peer, &out)
        case "register": if permitted(peer, role == .store, op, &out) { register(peer, env, now: now, &out) }
        case "unregister": if permitted(peer, role == .store, op, &out) { unregister(peer, env, now: now, &out) }
        case "done", "reject": if permitted(peer, role == .store, op, &out) { answer(peer, env, isDone: op == "done", &out) }
        case "state": if permitted(peer, role == .store, op, &out) { unsolicitedState(peer, env, &out) }
        case "hello": fail(peer, .badMessage, "hello was already received", &out)
        default:
            if config.hostOps.contains(op) {
                out.append(.host(peer.id, env))
            } else {
                fail(peer, .unknownOp, "unknown op \"\(op)\"", &out)
            }
        }
    }

    /// Whether the peer's role may send `op`; if not, the peer gets `forbidden`.
    private func permitted(_ peer: Peer, _ ok: Bool, _ op: String, _ out: inout Output) -> Bool {
        if !ok { fail(peer, .forbidden, "a \(peer.role?.rawValue ?? "peer") may not send \(op)", &out) }
        return ok
    }

    // MARK: - Stores

    private func register(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
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
        if let initial = env.span(.state), initial.kind == .null {
            return fail(peer, .badMessage, "\"state\" may not be null", &out, ref: name)
        }
        let store = entry(name)
        if let owner = store.owner {
            return fail(peer, .nameTaken, "store \"\(name)\" is owned by peer \(owner)", &out, ref: name)
        }
        if let path = cyclePath(from: name, waitFor: waitFor) {
            return fail(peer, .cycle, "waitFor would make a cycle: \(path.joined(separator: " -> "))", &out, ref: name)
        }
        let resumed = store.version > 0
        store.ownerPeer = peer
        store.status = .up
        downStores.remove(name)
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
        let versionBefore = store.version
        if let initial { publish(store, state: initial, seq: store.seq, &out) }
        let broadcastToSelf = store.version != versionBefore && peer.subscriptions.contains(name)
        if let snapshot = store.snapshot, !broadcastToSelf { out.send(peer, snapshot) }
        sendQueries(store, &out)
        out.log(.info, "store \"\(name)\" registered by peer \(peer.id) (\(peer.name)), version \(store.version)\(resumed ? ", resumed" : ""), \(store.queue.count) queued")
        pump(store, &out)
    }

    private func unregister(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
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
    private func storeDown(_ store: StoreEntry, reason: StaticString, now: Millis, _ out: inout Output) {
        store.ownerPeer?.owned.remove(store.name)
        store.ownerPeer = nil
        store.status = .down
        downStores.insert(store.name)
        var back = store.inflight
        store.inflight.removeAll()
        for i in back.indices { back[i].redelivered = true }
        store.queue.prepend(contentsOf: back)
        let deadline = now + config.queueTimeout
        for i in store.queue.indices { store.queue[i].deadline = max(store.queue[i].deadline ?? deadline, deadline) }
        var b = FrameBuilder(op: "store-down")
        b.string("store", store.name)
        b.constant("reason", reason)
        let frame = b.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribers { out.send(sub, frame) }
        emit("store-down", &out) { e in
            e.string("store", store.name)
            e.constant("reason", reason)
        }
        out.log(.notice, "store \"\(store.name)\" down (\(reason)), \(store.queue.count) actions queued")
    }

    /// The waitFor path that would close a cycle if `name` waited for `waitFor`, or nil.
    private func cyclePath(from name: String, waitFor: [String]) -> [String]? {
        var visiting: [String] = [name]
        func walk(_ current: String, _ deps: [String]) -> [String]? {
            for dep in deps {
                if dep == name { return visiting + [name] }
                if visiting.contains(dep) { continue }
                visiting.append(dep)
                if let found = walk(dep, stores[dep]?.waitFor ?? []) { return found }
                visiting.removeLast()
            }
            return nil
        }
        return walk(name, waitFor)
    }

    private func entry(_ name: String) -> StoreEntry {
        if let s = stores[name] { return s }
        let s = StoreEntry(name: name, key: UInt32(truncatingIfNeeded: stores.count + 1))
        stores[name] = s
        return s
    }

    // MARK: - Dispatch, delivery and answers

    private func dispatch(_ peer: Peer, _ env: Envelope, now: Millis, _ out: inout Output) {
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
        for s in targets where s.status == .up && s.queue.count >= config.queueLimit {
            return fail(peer, .overloaded, "store \"\(s.name)\" has \(s.queue.count) actions queued (queueLimit \(config.queueLimit))", &out, ref: refText)
        }
        lastSeq += 1
        let action = ActionRecord(
            seq: lastSeq, typeJSON: typeJSON, origin: peer.id, cause: cause,
            payload: env.raw(.payload) ?? ArraySlice("null".utf8),
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
            store.queue.append(Delivery(action: action, deadline: store.status == .down ? now + config.queueTimeout : nil))
        }
        for store in targets { pump(store, &out) }
        if action.isComplete { settle(action, &out) }
    }

    /// The stores that handle `type`, sorted by name (cached until a registration changes).
    private func route(_ type: String, typeJSON: ArraySlice<UInt8>) -> [StoreEntry] {
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
    private func pump(_ store: StoreEntry, _ out: inout Output) {
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
            store.inflight.append(head)
        }
    }

    private func actionFrame(_ action: ActionRecord, store: StoreEntry, redelivered: Bool) -> Frame {
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
    private func answer(_ peer: Peer, _ env: Envelope, isDone: Bool, _ out: inout Output) {
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
                publish(store, state: env.body[state.range], seq: UInt64(bitPattern: seq), &out)
            }
            result = .done
        } else {
            guard let error = env.raw(.error), (try? Envelope(body: Array(error)))?.string("code").value != nil else {
                return fail(peer, .badMessage, "reject needs \"error\": {\"code\": string, \"message\": string}", &out, ref: name)
            }
            result = .rejected(error)
        }
        let head = store.inflight.removeFirst()
        store.seq = head.action.seq
        record(head.action, store: store, result: result, &out)
        pump(store, &out)
    }

    /// The store `name` if `peer` owns it (a store peer's last answered store is remembered: no hashing then).
    private func ownedStore(_ peer: Peer, _ name: String) -> StoreEntry? {
        if let last = peer.lastStore, last.ownerPeer === peer, last.name == name { return last }
        guard let store = stores[name], store.owner == peer.id else { return nil }
        peer.lastStore = store
        return store
    }

    /// Records one store's result for an action; releases stores waiting for it; settles when complete.
    private func record(_ action: ActionRecord, store: StoreEntry, result: StoreResult, _ out: inout Output) {
        guard let i = action.targets.firstIndex(where: { $0 === store }) else { return }
        action.setResult(at: i, result, version: store.version)
        if action.targets.count > 1 {
            for other in action.targets where other !== store && other.waitFor.contains(store.name) { pump(other, &out) }
        }
        if action.isComplete { settle(action, &out) }
    }

    private func settle(_ action: ActionRecord, _ out: inout Output) {
        pendingCount -= 1
        let dispatcher = action.dispatcher
        dispatcher.unsettled -= 1
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
    private func resultsJSON(_ action: ActionRecord) -> [UInt8] {
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
    private func publish(_ store: StoreEntry, state: ArraySlice<UInt8>, seq: UInt64, _ out: inout Output) {
        if let current = store.snapshot, sameBytes(UnsafeRawBufferPointer(rebasing: current.bytes[store.stateRange]), state) {
            return
        }
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
    }

    private func unsolicitedState(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let name) = env.string(.store) else {
            return fail(peer, .badMessage, "state needs \"store\"", &out)
        }
        guard let store = ownedStore(peer, name) else {
            return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
        }
        guard let state = env.span(.state), state.kind != .null else {
            return fail(peer, .badMessage, "state needs a non-null \"state\"", &out, ref: name)
        }
        publish(store, state: env.body[state.range], seq: store.seq, &out)
    }

    // MARK: - Subscriptions and queries

    private func subscribe(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let name) = env.string(.store), Names.isValidStore(name) else {
            return fail(peer, .badMessage, "subscribe needs a valid \"store\" name", &out)
        }
        let store = entry(name)
        var b = FrameBuilder(op: "subscribed")
        b.string("store", name)
        b.string("status", store.status.rawValue)
        b.int("version", store.version)
        out.send(peer, b.finish(coalescing: .fence(key: store.key)))
        if peer.subscriptions.insert(name).inserted {
            store.subscribers.append(peer)
        }
        if let snapshot = store.snapshot { out.send(peer, snapshot) }
    }

    private func unsubscribe(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let name) = env.string(.store) else {
            return fail(peer, .badMessage, "unsubscribe needs \"store\"", &out)
        }
        if peer.subscriptions.remove(name) != nil {
            stores[name]?.subscribers.removeAll { $0 === peer }
        }
        var b = FrameBuilder(op: "unsubscribed")
        b.string("store", name)
        out.send(peer, b.finish(coalescing: stores[name].map { .fence(key: $0.key) } ?? .none))
    }

    private func query(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let id) = env.string(.id), !id.isEmpty, id.utf8.count <= 256 else {
            return fail(peer, .badMessage, "query needs an \"id\" of 1 to 256 bytes", &out)
        }
        guard case .value(let name) = env.string(.store), Names.isValidStore(name) else {
            return fail(peer, .badMessage, "query needs a valid \"store\" name", &out, ref: id)
        }
        guard let q = env.raw("query") else {
            return fail(peer, .badMessage, "query needs \"query\"", &out, ref: id)
        }
        guard peer.queries[id] == nil else {
            return fail(peer, .badMessage, "query id \"\(id)\" is already active", &out, ref: id)
        }
        let bytes = Array(q)
        peer.queries[id] = (name, bytes)
        let store = entry(name)
        var b = FrameBuilder(op: "query-ok")
        b.raw("id", env.raw(.id)!)
        out.send(peer, b.finish())
        store.addQuery(bytes)
        sendQueries(store, &out)
    }

    private func unquery(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        guard case .value(let id) = env.string(.id) else {
            return fail(peer, .badMessage, "unquery needs \"id\"", &out)
        }
        guard let q = peer.queries.removeValue(forKey: id) else {
            return fail(peer, .badMessage, "no active query \"\(id)\"", &out, ref: id)
        }
        var b = FrameBuilder(op: "unquery-ok")
        b.raw("id", env.raw(.id)!)
        out.send(peer, b.finish())
        if let store = stores[q.store], store.removeQuery(q.bytes) { sendQueries(store, &out) }
    }

    /// Tells a live store its current deduplicated set of active queries.
    private func sendQueries(_ store: StoreEntry, _ out: inout Output) {
        guard let peer = store.ownerPeer else { return }
        var b = FrameBuilder(op: "queries")
        b.string("store", store.name)
        b.key("queries")
        b.rawBytes(CollectionOfOne(UInt8(ascii: "[")))
        for (i, q) in store.queryOrder.enumerated() {
            if i > 0 { b.rawBytes(CollectionOfOne(UInt8(ascii: ","))) }
            b.rawBytes("{\"query\":".utf8)
            b.rawBytes(q)
            b.rawBytes(",\"count\":".utf8)
            b.intValue(store.queryCounts[q] ?? 0)
            b.rawBytes(CollectionOfOne(UInt8(ascii: "}")))
        }
        b.rawBytes(CollectionOfOne(UInt8(ascii: "]")))
        out.send(peer, b.finish())
    }

    // MARK: - Introspection and liveness

    private func ping(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        var b = FrameBuilder(op: "pong")
        if let id = env.raw(.id), env.span(.id)?.kind == .string { b.raw("id", id) }
        out.send(peer, b.finish())
    }

    private func get(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        let id = env.raw(.id)
        guard case .value(let name) = env.string(.store) else {
            return fail(peer, .badMessage, "get needs \"store\"", &out, ref: env.string(.id).value)
        }
        guard let store = stores[name], let snapshot = store.snapshot else {
            return fail(peer, .unknownStore, "no snapshot is retained for store \"\(name)\"", &out, ref: env.string(.id).value ?? name)
        }
        var b = FrameBuilder(op: "got", capacity: snapshot.bytes.count + 64)
        if let id, env.span(.id)?.kind == .string { b.raw("id", id) }
        b.string("store", name)
        b.int("version", store.version)
        b.int("seq", store.snapshotSeq)
        b.raw("state", snapshot.bytes[store.stateRange])
        out.send(peer, b.finish())
    }

    private func info(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        var j: [UInt8] = []
        j.append(UInt8(ascii: "["))
        var first = true
        for name in stores.keys.sorted() {
            let s = stores[name]!
            if !first { j.append(UInt8(ascii: ",")) }
            first = false
            j.append(contentsOf: "{\"name\":".utf8); appendEscaped(name, to: &j)
            j.append(contentsOf: ",\"status\":\"\(s.status.rawValue)\",\"handles\":".utf8); appendStrings(s.handles, &j)
            j.append(contentsOf: ",\"waitFor\":".utf8); appendStrings(s.waitFor, &j)
            j.append(contentsOf: ",\"version\":\(s.version),\"seq\":\(s.seq),\"subscribers\":\(s.subscribers.count)".utf8)
            j.append(contentsOf: ",\"queued\":\(s.queue.count),\"inflight\":\(s.inflight.count),\"queries\":\(s.queryOrder.count)".utf8)
            if let owner = s.owner, let p = peers[owner] {
                j.append(contentsOf: ",\"owner\":{\"peer\":\(p.id),\"name\":".utf8); appendEscaped(p.name, to: &j)
                if let pid = p.creds.pid { j.append(contentsOf: ",\"pid\":\(pid)".utf8) }
                if let uid = p.creds.uid { j.append(contentsOf: ",\"uid\":\(uid)".utf8) }
                j.append(UInt8(ascii: "}"))
            }
            j.append(UInt8(ascii: "}"))
        }
        j.append(UInt8(ascii: "]"))
        var roles = [Role.client: 0, .store: 0, .monitor: 0]
        for p in peers.values { if let r = p.role { roles[r, default: 0] += 1 } }
        var b = FrameBuilder(op: "info", capacity: j.count + 512)
        if let id = env.raw(.id), env.span(.id)?.kind == .string { b.raw("id", id) }
        b.int("seq", lastSeq)
        b.raw("stores", j)
        b.raw("peers", Array("{\"client\":\(roles[.client]!),\"store\":\(roles[.store]!),\"monitor\":\(roles[.monitor]!)}".utf8))
        var current = counters
        current.traffic.add(out.traffic)  // this event's traffic so far is not in `counters` yet
        b.raw("counters", current.json())
        out.send(peer, b.finish())
    }

    private func appendStrings(_ values: [String], _ j: inout [UInt8]) {
        j.append(UInt8(ascii: "["))
        for (i, v) in values.enumerated() {
            if i > 0 { j.append(UInt8(ascii: ",")) }
            appendEscaped(v, to: &j)
        }
        j.append(UInt8(ascii: "]"))
    }

    // MARK: - Time and shutdown

    private func tick(now: Millis, _ out: inout Output) {
        while let first = handshakes.first {
            guard let peer = peers[first] else { handshakes.removeFirst(); continue }
            guard peer.connectedAt + config.handshakeTimeout <= now else { break }
            handshakes.removeFirst()
            fail(peer, .timeout, "no hello within \(config.handshakeTimeout) ms", &out)
        }
        for name in downStores.sorted() {
            guard let store = stores[name] else { continue }
            while let head = store.queue.first, let d = head.deadline, d <= now {
                store.queue.removeFirst()
                record(head.action, store: store, result: .unavailable(.storeUnavailable, "store \"\(name)\" stayed down for \(config.queueTimeout) ms"), &out)
            }
        }
    }

    private func shutdown(_ out: inout Output) {
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
    private func unsettledActions() -> [ActionRecord] {
        var found: [UInt64: ActionRecord] = [:]
        for store in stores.values {
            for d in store.inflight { found[d.action.seq] = d.action }
            for d in store.queue { found[d.action.seq] = d.action }
        }
        return found.keys.sorted().map { found[$0]! }
    }

    private func byeFrame(reason: StaticString) -> Frame {
        var b = FrameBuilder(op: "bye")
        b.constant("reason", reason)
        return b.finish()
    }

    // MARK: - Errors

    /// Sends an error to one peer (and closes its connection when the code is fatal or `fatal` is set).
    private func fail(_ peer: Peer, _ code: ErrorCode, _ message: String, _ out: inout Output,
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
        emit("error", &out) { e in
            e.int("peer", peer.id)
            e.string("code", code.rawValue)
            e.string("message", message)
        }
        out.log(.debug, "peer \(peer.id) (\(peer.name)): \(code.rawValue): \(message)")
        if closes { close(peer, &out) }
    }
}

// MARK: - State

/// The role a peer announced in hello.
enum Role: String {
    case client, store, monitor
    var mayDispatch: Bool { self != .monitor }
}

/// One connection's state.
final class Peer {
    let id: PeerID
    let creds: PeerCredentials
    let connectedAt: Millis
    @exclusivity(unchecked) var role: Role?
    @exclusivity(unchecked) var name = ""
    @exclusivity(unchecked) var closing = false
    @exclusivity(unchecked) var owned: Set<String> = []
    @exclusivity(unchecked) var subscriptions: Set<String> = []
    @exclusivity(unchecked) var queries: [String: (store: String, bytes: [UInt8])] = [:]
    /// Accepted dispatches from this peer not yet settled.
    @exclusivity(unchecked) var unsettled = 0
    /// The store this peer last answered or published for (a lookup cache; checked against `owner` on use).
    @exclusivity(unchecked) var lastStore: StoreEntry?

    init(id: PeerID, creds: PeerCredentials, connectedAt: Millis) {
        self.id = id
        self.creds = creds
        self.connectedAt = connectedAt
    }
}

/// Whether a store has an owner: never registered (only subscribed or queried), up, or down.
enum StoreStatus: String {
    case unknown, up, down
}

/// One store as the dispatcher knows it.
final class StoreEntry {
    let name: String
    /// A number of its own (1, 2, 3 … in order of first mention; never reused within a run): the coalescing key
    /// of its snapshots.
    let key: UInt32
    /// `name` as a JSON string (quoted, escaped once), spliced into every frame that names the store.
    let nameJSON: [UInt8]
    @exclusivity(unchecked) var status = StoreStatus.unknown
    @exclusivity(unchecked) var wasRegistered = false
    /// The connection that owns it while it is up.
    @exclusivity(unchecked) var ownerPeer: Peer?
    var owner: PeerID? { ownerPeer?.id }
    @exclusivity(unchecked) var handles: [String] = []
    @exclusivity(unchecked) var waitFor: [String] = []
    /// The last version published (0: none yet) and the seq of the last action the store answered.
    @exclusivity(unchecked) var version: UInt64 = 0
    @exclusivity(unchecked) var seq: UInt64 = 0
    /// The retained snapshot frame, and where its state bytes sit in it.
    @exclusivity(unchecked) var snapshot: Frame?
    @exclusivity(unchecked) var stateRange: Range<Int> = 0..<0
    @exclusivity(unchecked) var snapshotSeq: UInt64 = 0
    /// Actions waiting to be sent to the store, and those sent but not answered, both in seq order.
    @exclusivity(unchecked) var queue = Deque<Delivery>()
    @exclusivity(unchecked) var inflight = Deque<Delivery>()
    /// Subscribed connections, in subscription order (removed when they unsubscribe or close).
    @exclusivity(unchecked) var subscribers: [Peer] = []
    /// Active queries, deduplicated by bytes, sorted by bytes, with how many holders each has.
    @exclusivity(unchecked) var queryOrder: [[UInt8]] = []
    @exclusivity(unchecked) var queryCounts: [[UInt8]: Int] = [:]

    init(name: String, key: UInt32) {
        self.name = name
        self.key = key
        var json: [UInt8] = []
        appendEscaped(name, to: &json)
        self.nameJSON = json
    }

    func addQuery(_ q: [UInt8]) {
        if queryCounts[q] == nil {
            let at = queryOrder.firstIndex { !$0.lexicographicallyPrecedes(q) } ?? queryOrder.endIndex
            queryOrder.insert(q, at: at)
        }
        queryCounts[q, default: 0] += 1
    }

    /// Returns true (the set changed) — counts are part of what the store is told.
    func removeQuery(_ q: [UInt8]) -> Bool {
        guard let n = queryCounts[q] else { return false }
        if n <= 1 {
            queryCounts.removeValue(forKey: q)
            queryOrder.removeAll { $0 == q }
        } else {
            queryCounts[q] = n - 1
        }
        return true
    }
}

/// One action on its way to one store: an element of the store's `queue` or `inflight` (a value, so a queued
/// delivery costs no allocation of its own).
struct Delivery {
    let action: ActionRecord
    /// While the store is down: when the action gives up waiting (`store-unavailable`).
    var deadline: Millis?
    var redelivered = false

    init(action: ActionRecord, deadline: Millis?) {
        self.action = action
        self.deadline = deadline
    }
}

/// An accepted action: what it is, where it goes, and what each target answered.
final class ActionRecord {
    let seq: UInt64
    /// The action type as the dispatcher wrote it (a valid JSON string), forwarded as is.
    let typeJSON: ArraySlice<UInt8>
    let origin: PeerID
    let cause: Int64?
    let payload: ArraySlice<UInt8>
    /// The peer that dispatched it (kept while the action is unsettled, even if that peer has gone).
    let dispatcher: Peer
    /// The dispatch id (raw JSON string) when the dispatcher asked for a settlement.
    let id: ArraySlice<UInt8>?
    /// The stores it goes to, sorted by name.
    let targets: [StoreEntry]
    /// Each target's final result (nil: not final yet) and its version after a `done`: the first target's
    /// inline (most actions have one target, and then no array is allocated), the others' in `more`.
    @exclusivity(unchecked) private var first = Outcome()
    @exclusivity(unchecked) private var more: [Outcome]
    @exclusivity(unchecked) private var finalCount = 0

    struct Outcome {
        var result: StoreResult?
        var version: UInt64 = 0
    }

    init(seq: UInt64, typeJSON: ArraySlice<UInt8>, origin: PeerID, cause: Int64?,
         payload: ArraySlice<UInt8>, dispatcher: Peer, id: ArraySlice<UInt8>?, targets: [StoreEntry]) {
        self.seq = seq
        self.typeJSON = typeJSON
        self.origin = origin
        self.cause = cause
        self.payload = payload
        self.dispatcher = dispatcher
        self.id = id
        self.targets = targets
        self.more = targets.count > 1 ? Array(repeating: Outcome(), count: targets.count - 1) : []
    }

    /// Target `i`'s final result, or nil while it has none.
    func result(at i: Int) -> StoreResult? { i == 0 ? first.result : more[i - 1].result }

    /// The version target `i`'s state had after its `done`.
    func version(at i: Int) -> UInt64 { i == 0 ? first.version : more[i - 1].version }

    /// Makes target `i`'s result final (once; a later call for the same target is ignored).
    func setResult(at i: Int, _ result: StoreResult, version: UInt64 = 0) {
        guard self.result(at: i) == nil else { return }
        let outcome = Outcome(result: result, version: version)
        if i == 0 { first = outcome } else { more[i - 1] = outcome }
        finalCount += 1
    }

    var isComplete: Bool { finalCount == targets.count }
}

/// The route looked up last, with its type as the dispatcher wrote it (`isValid` false: none).
struct LastRoute {
    var type = ""
    var typeJSON: [UInt8] = []
    var targets: [StoreEntry] = []
    var isValid: Bool { !typeJSON.isEmpty }
}

/// One store's answer to one action.
enum StoreResult {
    case done
    case rejected(ArraySlice<UInt8>)
    case unavailable(ErrorCode, String)
}

/// Counters reported by `info`.
public struct Counters: Sendable {
    /// Connections, frames, bytes, actions and snapshots.
    public var traffic = Traffic()
    /// Errors sent, by code.
    public var errors: [String: UInt64] = [:]

    mutating func count(_ code: ErrorCode) { errors[code.rawValue, default: 0] += 1 }

    func json() -> [UInt8] {
        let t = traffic
        var j = Array("{\"connections\":\(t.connections),\"framesIn\":\(t.framesIn),\"framesOut\":\(t.framesOut),\"bytesIn\":\(t.bytesIn),\"bytesOut\":\(t.bytesOut),\"actions\":\(t.actions),\"snapshots\":\(t.snapshots),\"errors\":{".utf8)
        for (i, key) in errors.keys.sorted().enumerated() {
            if i > 0 { j.append(UInt8(ascii: ",")) }
            j.append(contentsOf: "\"\(key)\":\(errors[key]!)".utf8)
        }
        j.append(contentsOf: "}}".utf8)
        return j
    }
}

/// The effects being produced by one event, and the traffic they count (added to `Router.counters` when the
/// event is done: plain integers here, so building an `Output` per event copies no dictionary).
struct Output {
    /// The effects, in order, when there is no sink.
    var effects: [RouterEffect]
    /// Carries the effects out as they come instead (the caller of `handle(_:now:sink:)` keeps it alive).
    unowned(unsafe) let sink: (any RouterEffectSink)?
    var traffic = Traffic()

    init(effects: [RouterEffect], sink: (any RouterEffectSink)?) {
        self.effects = effects
        self.sink = sink
    }

    /// Queues a frame to a peer; a peer that is closing gets nothing more.
    mutating func send(_ peer: Peer, _ frame: Frame) {
        guard !peer.closing else { return }
        traffic.framesOut += 1
        traffic.bytesOut += UInt64(frame.bytes.count)
        if let sink { sink.send(frame, to: peer.id) } else { effects.append(.send(peer.id, frame)) }
    }

    mutating func log(_ level: LogLevel, _ message: String) {
        append(.log(level, message))
    }

    mutating func append(_ effect: RouterEffect) {
        if let sink { sink.perform(effect) } else { effects.append(effect) }
    }
}

/// Traffic counters: plain integers, so an event counts into its own `Traffic` (in `Output`) and adds it to the
/// router's counters once, without copying the errors dictionary per event.
public struct Traffic: Sendable {
    public var connections: UInt64 = 0
    public var framesIn: UInt64 = 0
    public var framesOut: UInt64 = 0
    public var bytesIn: UInt64 = 0
    public var bytesOut: UInt64 = 0
    public var actions: UInt64 = 0
    public var snapshots: UInt64 = 0

    mutating func add(_ t: Traffic) {
        connections += t.connections
        framesIn += t.framesIn
        framesOut += t.framesOut
        bytesIn += t.bytesIn
        bytesOut += t.bytesOut
        actions += t.actions
        snapshots += t.snapshots
    }
}
