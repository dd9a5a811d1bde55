import DequeModule
import FluxCore

// Reply encoding: every frame the router builds from its state (through FrameBuilder), and errors.
extension Router {
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

    /// The `results` array of a settlement: one object per target store, ordered by name (SPEC §8.3).
    func resultsJSON(_ action: ActionRecord) -> [UInt8] {
        var j = JSONBuilder(capacity: 48 * action.targets.count)
        j.array { results in
            for (i, store) in action.targets.enumerated() {
                results.object { r in
                    r.rawField("store", store.nameJSON)
                    switch action.result(at: i)! {
                    case .done:
                        r.field("status", "done")
                        r.field("version", action.version(at: i))
                    case .rejected(let error):
                        r.field("status", "rejected")
                        r.rawField("error", error)  // the store's error, byte for byte
                    case .unavailable(let code, let message):
                        r.field("status", "unavailable")
                        r.object("error") { e in
                            e.field("code", code.rawValue)
                            e.field("message", message)
                        }
                    }
                }
            }
        }
        return j.bytes
    }

    /// `welcome` (SPEC §8.1): this connection's peer id and the limits fluxd enforces.
    func welcomeFrame(_ peer: Peer) -> Frame {
        var b = FrameBuilder(op: "welcome")
        b.int("protocol", fluxProtocolVersion)
        b.string("server", config.serverName)
        b.int("peer", peer.id)
        b.raw("limits", welcomeLimits)
        b.string("epoch", config.epoch)
        b.string("durability", config.durability)
        return b.finish()
    }

    /// `welcome.limits` (SPEC §12): built once, the config does not change while the router runs. Every
    /// `LimitName` is announced.
    static func limitsJSON(_ c: RouterConfig) -> [UInt8] {
        var j = JSONBuilder()
        j.object { o in
            for limit in LimitName.allCases {
                switch limit {
                case .maxFrame: o.field("maxFrame", c.maxFrame)
                case .storeWindow: o.field("storeWindow", c.storeWindow)
                case .queueLimit: o.field("queueLimit", c.queueLimit)
                case .queueTimeout: o.field("queueTimeout", c.queueTimeout)
                case .handshakeTimeout: o.field("handshakeTimeout", c.handshakeTimeout)
                case .maxPending: o.field("maxPending", c.maxPending)
                case .maxBacklog: o.field("maxBacklog", c.maxBacklog)
                case .fairPending: o.field("fairPending", c.fairPending)
                case .maxQueries: o.field("maxQueries", c.maxQueries)
                case .maxQueryBytes: o.field("maxQueryBytes", c.maxQueryBytes)
                case .maxSubscriptions: o.field("maxSubscriptions", c.maxSubscriptions)
                case .maxWaitFor: o.field("maxWaitFor", c.maxWaitFor)
                case .maxConnectionsPerUser: o.field("maxConnectionsPerUser", c.maxConnectionsPerUser)
                case .memoryPerUser: o.field("memoryPerUser", c.memory.perUser)
                case .connectionAllowance: o.field("connectionAllowance", c.memory.connectionAllowance)
                case .pingInterval: o.field("pingInterval", c.pingInterval)
                case .maxPingsOut: o.field("maxPingsOut", c.maxPingsOut)
                case .storeTimeout: o.field("storeTimeout", c.storeTimeout)
                case .maxStoresPerConnection: o.field("maxStoresPerConnection", c.maxStoresPerConnection)
                case .outcomeWindow: o.field("outcomeWindow", c.outcomeWindow)
                case .deltaHistory: o.field("deltaHistory", c.deltaHistory)
                }
            }
        }
        return j.bytes
    }

    /// The fatal `unsupported-version` error (SPEC §8.1): it lists the versions this fluxd speaks.
    func unsupportedVersionFrame(_ message: String) -> Frame {
        var b = FrameBuilder(op: "error")
        b.constant("code", "unsupported-version")
        b.string("message", message)
        b.key("supported")
        var j = JSONBuilder()
        j.array { a in a.value(fluxProtocolVersion) }
        b.rawBytes(j.bytes)
        b.bool("fatal", true)
        return b.finish()
    }

    /// A store's new state does not fit its user's share of the memory budget: the store is closed with
    /// `memory-budget` (its unanswered actions are redelivered when it registers again, SPEC §10).
    func failStateOverBudget(_ peer: Peer, _ store: StoreEntry, _ size: Int, _ out: inout Output) {
        failOverBudget(peer, store, "a state of \(size) bytes", &out)
    }

    /// A state (or a patched one: `what` says which) that does not fit the memory budget closes the store's
    /// connection with `memory-budget`.
    func failOverBudget(_ peer: Peer, _ store: StoreEntry, _ what: String, _ out: inout Output) {
        out.log(.warning, "store \"\(store.name)\": \(what) does not fit the memory budget; closing its connection")
        fail(peer, .memoryBudget, "\(what) for store \"\(store.name)\" does not fit fluxd's memory budget (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes; \(memory.used) of \(config.memory.total) in total)", &out, ref: store.name, fatal: true)
    }

    /// A refused `register`: answered with its error, and logged (rate-limited: a store that keeps retrying is
    /// seen in the log without flooding it).
    func refuseRegistration(_ peer: Peer, _ name: String, _ code: ErrorCode, _ message: String, _ out: inout Output) {
        logRefusedRegistration(peer, name, code.rawValue, &out)
        fail(peer, code, message, &out)
    }

    func logRefusedRegistration(_ peer: Peer, _ name: String, _ code: String, _ out: inout Output) {
        logLimited(&refusalLog, .warning, "refused the registration of store \"\(name)\" by peer \(peer.id) (\(peer.name), uid \(peer.account.uid)): \(code)", &out)
    }

    /// Logs a line of a kind a peer can cause over and over, through that kind's `LogRateLimit`: the line is made
    /// only when it is logged, and the first one after lines were left out says how many.
    func logLimited(_ limit: inout LogRateLimit, _ level: LogLevel, _ line: @autoclosure () -> String,
                    _ out: inout Output) {
        guard case .log(let suppressed) = limit.admit(now: now) else { return }
        let more = suppressed > 0 ? " (\(suppressed) more like it not logged in the last \(LogRateLimit.window / 1000) s)" : ""
        out.log(level, line() + more)
    }

    /// SPEC §16.2: a patch that does not apply closes the store's connection (it and fluxd disagree on its state).
    func failPatch(_ peer: Peer, _ store: StoreEntry, _ message: String, _ out: inout Output) {
        out.log(.warning, "store \"\(store.name)\": \(message); closing its connection")
        fail(peer, .patchFailed, message, &out, ref: store.name, fatal: true)
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
        observeError(peer, code, message, &out)
        out.log(.debug, "peer \(peer.id) (\(peer.name)): \(code.rawValue): \(message)")
    }
}
