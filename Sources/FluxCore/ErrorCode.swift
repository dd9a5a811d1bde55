/// The stable error codes of protocol v1. Each is sent as `{"op":"error","code":...}` (or inside a settlement
/// result). The raw value is the wire spelling; it never changes within protocol version 1.
public enum ErrorCode: String, Sendable, CaseIterable, Hashable {
    /// A frame of length zero. The connection survives.
    case badFrame = "bad-frame"
    /// A frame longer than the announced `maxFrame`. The connection is closed.
    case tooLarge = "too-large"
    /// The frame is not valid JSON (RFC 8259, UTF-8, depth limit, no trailing bytes). The connection survives.
    case badJSON = "bad-json"
    /// Valid JSON that is not a valid message: not an object, missing or ill-typed field, bad name, duplicate key,
    /// an answer out of order. The connection survives.
    case badMessage = "bad-message"
    /// The `op` is not one protocol v1 knows. The connection survives.
    case unknownOp = "unknown-op"
    /// The first frame of a connection was not `hello`. The connection is closed.
    case handshakeRequired = "handshake-required"
    /// `hello.protocol` names a version fluxd does not speak. The connection is closed.
    case unsupportedVersion = "unsupported-version"
    /// No `hello` within the handshake timeout. The connection is closed.
    case timeout = "timeout"
    /// The peer's role may not send this message, or it answered for a store it does not own. Survives.
    case forbidden = "forbidden"
    /// `register` for a store name that a live connection owns. Survives.
    case nameTaken = "name-taken"
    /// `register` whose waitFor list would make a cycle. Survives.
    case cycle = "cycle"
    /// A request about a store fluxd knows nothing of. Survives.
    case unknownStore = "unknown-store"
    /// `dispatch` of a type no registered store handles; the action gets no sequence number. Survives.
    case noHandler = "no-handler"
    /// Too many unsettled dispatches from one connection. Survives.
    case overloaded = "overloaded"
    /// A settlement result: the store stayed down past the queue timeout, or its queue was full.
    case storeUnavailable = "store-unavailable"
    /// `dispatch` while fluxd is shutting down. Survives until fluxd closes it.
    case shuttingDown = "shutting-down"
    /// `restart-worker` / `stop-worker` naming no worker of fluxd's running config (fluxd as a plugin host). Survives.
    case unknownWorker = "unknown-worker"
    /// More than `maxBacklog` bytes waited in fluxd for the connection (it does not read fast enough). The
    /// connection is closed.
    case slowConsumer = "slow-consumer"
    /// A per-connection limit of `welcome.limits` would be exceeded: live queries (`maxQueries`,
    /// `maxQueryBytes`), subscriptions (`maxSubscriptions`) or `waitFor` entries (`maxWaitFor`). Survives.
    case limitExceeded = "limit-exceeded"
    /// The connection limit in total, per user or of connections still in the handshake is reached, or the memory
    /// budget has no room for another connection. Sent instead of `welcome`; the connection is closed.
    case tooManyConnections = "too-many-connections"
    /// fluxd's memory budget has no room for what the peer asked (its user's share, or the total, is used up):
    /// a request is refused (survives); a connection whose unfinished frame or unread backlog outgrows it is
    /// closed.
    case memoryBudget = "memory-budget"
    /// A peer that asked for heartbeats answered none of `maxPingsOut` pings, or a store left an action
    /// unanswered longer than fluxd's store timeout where fluxd closes stalled stores. The connection is closed.
    case unresponsive = "unresponsive"
    /// Since fluxd 0.3.0 (SPEC §15.2): the journal's disk is full; the dispatch (or new registration) is refused
    /// and nothing accepted before is lost; fluxd accepts again once a write succeeds. Survives.
    case diskFull = "disk-full"
    /// Since fluxd 0.3.0 (SPEC §15.2): the journal could not be made durable (a failed `fdatasync`, never
    /// retried): fluxd accepts nothing more until it is restarted. Survives.
    case journalFailed = "journal-failed"
    /// Since fluxd 0.3.0 (SPEC §8.12): the history or state asked for is not in the journal's retention window
    /// (or fluxd is ephemeral). Survives.
    case notRetained = "not-retained"
    /// Since fluxd 0.4.0 (SPEC §16.2): a store's patch does not apply to the retained state (or names another
    /// `base`, or there is no retained state). Closes the store's connection: its unanswered action is delivered
    /// again once it registered again and adopted the retained snapshot.
    case patchFailed = "patch-failed"
    /// Since fluxd 0.4.0 (SPEC §8.11): `reload` changed nothing: fluxd has no config file, the file is not valid,
    /// or it changes a setting that takes a restart (the message names them). The running configuration is kept.
    /// Survives.
    case reloadRefused = "reload-refused"
    /// Since fluxd 0.4.0 (SPEC §15.4): a dispatch made under a session with `settle` would take its user past the
    /// outcomes it may hold in the outcome window (`maxOutcomes` per user): its outcome could not be kept for
    /// `recover`, so it is refused and not sent. Another user's dispatches are unaffected. Survives.
    case outcomeQuota = "outcome-quota"
    /// Since fluxd 0.4.0 (SPEC §15.2): the peer's user holds its share of the journal's disk (`--disk-per-user`):
    /// its new work is refused (a `dispatch` or a new registration survives; a store's `state` or `patch` outside
    /// an action closes the store's connection) while other users' work goes on. Answers to accepted actions are
    /// journaled (they finish work accepted within the share).
    case diskQuota = "disk-quota"
    /// Since fluxd 0.4.0 (SPEC §10): `forget` of a store that is up (a live connection owns it): only a store
    /// that is down can be forgotten. Survives.
    case storeIsUp = "store-is-up"

    /// Whether fluxd closes the connection after sending this error.
    public var isFatal: Bool {
        switch self {
        case .tooLarge, .handshakeRequired, .unsupportedVersion, .timeout, .slowConsumer, .tooManyConnections,
             .unresponsive, .patchFailed: return true
        default: return false
        }
    }
}
