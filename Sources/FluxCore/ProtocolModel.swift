// The vocabulary of protocol v1 in one place: ops and their directions, roles, store statuses, the limits fluxd
// announces, and the rules for names, ids and integers (SPEC §4). fluxd's router, the SDKs, fluxctl and the
// worker config parser all take these from here; Tests/FluxCoreTests/ProtocolModelTests.swift fails when they
// disagree with protocol/schemas and SPEC.md. (The error codes are `ErrorCode`, the socket path rule
// `SocketPath`.)

/// Who sends a message: any peer to fluxd (`c2d`), a store-role peer to fluxd (`s2d`), or fluxd to a peer (`d2c`).
public enum MessageDirection: String, Sendable, CaseIterable {
    case c2d, s2d, d2c
}

/// Every `op` of protocol v1 (SPEC §7-§8). The raw value is the wire spelling.
public enum Op: String, Sendable, CaseIterable, Hashable {
    case hello, welcome
    case register, registered, unregister
    case dispatch, action, done, reject, settled
    case state, snapshot
    case subscribe, subscribed, unsubscribe, unsubscribed
    case storeDown = "store-down", storeUp = "store-up"
    case query, queryOK = "query-ok", unquery, unqueryOK = "unquery-ok", queries, queriesChanged = "queries-changed"
    case info, get, got, ping, pong, bye, error
    case event, missed
    case workers, restartWorker = "restart-worker", stopWorker = "stop-worker", worker
    /// Since fluxd 0.3.0 (SPEC §8.12, §15): recovered settlements and the journal's history.
    case recover, recovered, history, stateAt = "state-at"
    /// Since fluxd 0.4.0 (SPEC §16): a store's change as a patch; delta and path subscribers' frames.
    case patch, delta, subtree
    /// Since fluxd 0.4.0 (SPEC §8.11): reload fluxd's config file, and the answer.
    case reload, reloaded
    /// Since fluxd 0.4.0 (SPEC §8.3): the answer to a `dispatch` with `ack`.
    case accepted
    /// Since fluxd 0.4.0 (SPEC §10): forget a store that is down for good (privileged), and the answer.
    case forget, forgotten

    /// The directions a message with this op travels in (some, like `ping`, go both ways).
    public var directions: [MessageDirection] {
        switch self {
        case .hello, .dispatch, .subscribe, .unsubscribe, .query, .unquery, .get, .restartWorker, .stopWorker,
             .recover, .reload, .forget:
            return [.c2d]
        case .register, .unregister, .done, .reject, .state, .patch:
            return [.s2d]
        case .info, .ping, .pong, .bye, .workers, .history, .stateAt:
            return [.c2d, .d2c]
        case .welcome, .registered, .action, .settled, .snapshot, .subscribed, .unsubscribed, .storeDown, .storeUp,
             .queryOK, .unqueryOK, .queries, .queriesChanged, .got, .error, .event, .missed, .worker, .recovered,
             .delta, .subtree, .reloaded, .accepted, .forgotten:
            return [.d2c]
        }
    }

    /// Whether fluxd receives messages with this op (a peer may send it).
    public var isReceivedByDaemon: Bool { directions.contains(.c2d) || directions.contains(.s2d) }

    /// The op of a message fluxd receives, or nil when `raw` names none (`unknown-op`; ops fluxd only sends
    /// count as unknown too).
    public static func received(_ raw: String) -> Op? {
        guard let op = Op(rawValue: raw), op.isReceivedByDaemon else { return nil }
        return op
    }

    /// Host operations (SPEC §8.11): answered by fluxd as a plugin host, not by the dispatcher.
    public var isHostOperation: Bool { self == .workers || self == .restartWorker || self == .stopWorker || self == .reload }
}

/// The role a connection announces in `hello` (SPEC §7): a view-side client, a store worker, or a read-only
/// monitor.
public enum Role: String, Sendable, Codable, CaseIterable {
    case client, store, monitor

    /// Whether the role may dispatch actions and hold queries (every role but `monitor`).
    public var mayDispatch: Bool { self != .monitor }
    /// Whether the role may register stores, answer actions and publish state.
    public var mayOwnStores: Bool { self == .store }
}

/// A store's liveness as fluxd reports it (`subscribed.status`, `info`, SPEC §10).
public enum StoreStatus: String, Sendable, Equatable, CaseIterable {
    /// Registered and its owner connected.
    case up
    /// Registered once, its owner is gone; actions for it are queued.
    case down
    /// Never registered (yet): only subscribed to or queried.
    case unknown
}

/// The keys of `welcome.limits` (SPEC §12). Every limit fluxd announces is one of these.
public enum LimitName: String, Sendable, CaseIterable {
    case maxFrame, storeWindow, queueLimit, queueTimeout, handshakeTimeout, maxPending, maxBacklog, fairPending
    case maxQueries, maxQueryBytes, maxSubscriptions, maxWaitFor, maxConnectionsPerUser, memoryPerUser
    case connectionAllowance, pingInterval, maxPingsOut, storeTimeout, maxStoresPerConnection
    /// Since fluxd 0.3.0 (SPEC §15.4).
    case outcomeWindow
    /// Since fluxd 0.4.0 (SPEC §16.3).
    case deltaHistory
}

/// The rules for names, ids, free text and integers (SPEC §4).
public enum Names {
    /// Longest store name, in bytes.
    public static let maxStoreBytes = 128
    /// Longest action type or pattern, in bytes.
    public static let maxTypeBytes = 256
    /// Longest id (decoded), in bytes.
    public static let maxIDBytes = 256
    /// Longest peer name (`hello.name`, decoded), in bytes.
    public static let maxPeerNameBytes = 128
    /// Largest integer on the wire: 2^53 - 1, safe in every JSON implementation (SPEC §4.3).
    public static let maxInteger: Int64 = 9_007_199_254_740_991

    /// Store name: 1-128 bytes of `[A-Za-z0-9._:/-]`.
    public static func isValidStore(_ s: String) -> Bool { valid(s.utf8, max: maxStoreBytes) }
    /// Action type: 1-256 bytes of `[A-Za-z0-9._:/-]`.
    public static func isValidType(_ s: String) -> Bool { valid(s.utf8, max: maxTypeBytes) }
    /// Pattern: an action type, or a prefix of one followed by a single trailing `*` (the prefix may be empty).
    public static func isValidPattern(_ s: String) -> Bool {
        if s == "*" { return true }
        if s.utf8.last == UInt8(ascii: "*") { return valid(s.utf8.dropLast(), max: maxTypeBytes - 1) }
        return isValidType(s)
    }
    /// Worker name (`restart-worker.name`, SPEC §8.11; the keys of the worker config): 1-64 bytes of
    /// `[A-Za-z0-9._-]`.
    public static func isValidWorker(_ s: String) -> Bool {
        let u = s.utf8
        return !u.isEmpty && u.count <= 64 && u.allSatisfy { c in
            (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122)
                || c == UInt8(ascii: "-") || c == UInt8(ascii: "_") || c == UInt8(ascii: ".")
        }
    }
    /// Id (`dispatch.id`, `query.id`, ...): any string whose decoded value is 1-256 bytes of UTF-8.
    public static func isValidID(_ s: String) -> Bool { !s.utf8.isEmpty && s.utf8.count <= maxIDBytes }
    /// Peer name (`hello.name`): any string of at most 128 bytes decoded.
    public static func isValidPeerName(_ s: String) -> Bool { s.utf8.count <= maxPeerNameBytes }
    /// Integer field: 0 ... 2^53-1 (`positive`: 1 ... 2^53-1, for `seq`, `version`, peer ids and `cause`).
    public static func isValidInteger(_ n: Int64, positive: Bool = false) -> Bool {
        n >= (positive ? 1 : 0) && n <= maxInteger
    }

    private static func valid<C: Collection>(_ u: C, max: Int) -> Bool where C.Element == UInt8 {
        guard !u.isEmpty, u.count <= max else { return false }
        for c in u {
            switch c {
            case 48...57, 65...90, 97...122, UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: ":"),
                 UInt8(ascii: "/"), UInt8(ascii: "-"):
                continue
            default:
                return false
            }
        }
        return true
    }

    /// Whether `type` matches `pattern` (exact, `prefix*`, or `*`; SPEC §5).
    public static func matches(pattern: String, type: String) -> Bool {
        if pattern.utf8.last == UInt8(ascii: "*") {
            return type.utf8.starts(with: pattern.utf8.dropLast())
        }
        return pattern == type
    }
}

/// The protocol version this code speaks.
public let fluxProtocolVersion = 1
