import FluxCore

/// The role a connection announces in `hello` (FluxCore's protocol model).
public typealias Role = FluxCore.Role

/// The limits fluxd announces in `welcome.limits` (SPEC §12): one property per `FluxCore.LimitName`, nil when this
/// fluxd did not announce it (an older fluxd: the peer then assumes no limit). Bytes for sizes, milliseconds for
/// times.
public struct Limits: Sendable, Equatable, Codable {
    /// Largest frame body fluxd accepts (bytes).
    public var maxFrame: Int?
    /// Actions delivered to a store before the oldest is answered.
    public var storeWindow: Int?
    /// Actions queued for a store.
    public var queueLimit: Int?
    /// How long a queued action waits for a down store (ms).
    public var queueTimeout: Int?
    /// Time from connect to `hello` (ms).
    public var handshakeTimeout: Int?
    /// Accepted, not yet final actions per dispatching connection.
    public var maxPending: Int?
    /// Bytes that may wait in fluxd, unwritten, for one connection before it is closed `slow-consumer`.
    public var maxBacklog: Int?
    /// Below this many unsettled actions a connection is not refused `overloaded` by a full store queue.
    public var fairPending: Int?
    /// Live queries one connection may hold.
    public var maxQueries: Int?
    /// Bytes of the `query` values of one connection's live queries.
    public var maxQueryBytes: Int?
    /// Stores one connection may subscribe to.
    public var maxSubscriptions: Int?
    /// Stores one `register` may name in `waitFor`.
    public var maxWaitFor: Int?
    /// Connections open at once with one uid.
    public var maxConnectionsPerUser: Int?
    /// The part of fluxd's memory budget one uid may hold (bytes).
    public var memoryPerUser: Int?
    /// The part of the budget each connection holds from connect to close (bytes).
    public var connectionAllowance: Int?
    /// Silence after which fluxd pings a connection that asked for heartbeats (ms; 0: none).
    public var pingInterval: Int?
    /// Pings left unanswered before such a connection is closed `unresponsive`.
    public var maxPingsOut: Int?
    /// An action unanswered this long makes its store stalled (ms; 0: never).
    public var storeTimeout: Int?
    /// Stores one connection may own at once.
    public var maxStoresPerConnection: Int?
    /// How long fluxd keeps the outcomes of a session's settled dispatches for `recover` (ms; SPEC §15.4).
    public var outcomeWindow: Int?
    /// Bytes of recent patches fluxd holds per store for resuming delta subscribers (SPEC §16.3; since fluxd
    /// 0.4.0: its presence says fluxd takes patches, delta and path subscriptions).
    public var deltaHistory: Int?

    public init() {}

    /// The limit named `name`.
    public subscript(name: LimitName) -> Int? {
        switch name {
        case .maxFrame: return maxFrame
        case .storeWindow: return storeWindow
        case .queueLimit: return queueLimit
        case .queueTimeout: return queueTimeout
        case .handshakeTimeout: return handshakeTimeout
        case .maxPending: return maxPending
        case .maxBacklog: return maxBacklog
        case .fairPending: return fairPending
        case .maxQueries: return maxQueries
        case .maxQueryBytes: return maxQueryBytes
        case .maxSubscriptions: return maxSubscriptions
        case .maxWaitFor: return maxWaitFor
        case .maxConnectionsPerUser: return maxConnectionsPerUser
        case .memoryPerUser: return memoryPerUser
        case .connectionAllowance: return connectionAllowance
        case .pingInterval: return pingInterval
        case .maxPingsOut: return maxPingsOut
        case .storeTimeout: return storeTimeout
        case .maxStoresPerConnection: return maxStoresPerConnection
        case .outcomeWindow: return outcomeWindow
        case .deltaHistory: return deltaHistory
        }
    }
}

/// The names of `welcome.limits` (FluxCore's protocol model).
public typealias LimitName = FluxCore.LimitName

/// What fluxd said in `welcome`: who we are on the bus and the limits it enforces.
public struct Welcome: Sendable, Equatable {
    /// `welcome.protocol`.
    public var protocolVersion: Int
    /// `welcome.server`, e.g. `fluxd/0.1.0`.
    public var server: String
    /// This connection's peer id (`origin` of the actions it dispatches).
    public var peer: Int
    /// `welcome.limits`.
    public var limits: Limits
    /// `welcome.epoch` (since fluxd 0.3.0): the history this fluxd's seqs and versions belong to, the same across
    /// restarts of a durable fluxd (SPEC §15.1). nil from an older fluxd.
    public var epoch: String?
    /// `welcome.durability` (since fluxd 0.3.0): `always`, `batch`, `none` or `ephemeral`; nil from an older fluxd.
    public var durability: String?
}

/// A store's state at one version, as fluxd broadcast it (or as `get` returned it).
public struct Snapshot<State> {
    /// The store's name.
    public var store: String
    /// The store's version, assigned by fluxd: 1, 2, 3, ...
    public var version: Int
    /// The seq of the last action the store had answered when it produced this state.
    public var seq: Int
    /// The decoded state.
    public var state: State

    public init(store: String, version: Int, seq: Int, state: State) {
        self.store = store
        self.version = version
        self.seq = seq
        self.state = state
    }
}

extension Snapshot: Sendable where State: Sendable {}
extension Snapshot: Equatable where State: Equatable {}

/// A store's liveness as reported by `subscribed.status` (FluxCore's protocol model).
public typealias StoreStatus = FluxCore.StoreStatus

/// One event of a subscription, in the order fluxd sent them.
public enum StoreEvent<State> {
    /// The subscription is in place; the store's status at that moment. First event of every subscription.
    case subscribed(StoreStatus)
    /// A new version of the store's state (never older than one already yielded; intermediate ones may be skipped).
    case snapshot(Snapshot<State>)
    /// The store went down (`disconnected`, `unregistered` or `shutdown`). Its last snapshot stays valid.
    case storeDown(reason: String)
    /// The store is back, at this version (its snapshot follows if it is newer).
    case storeUp(version: Int)

    /// The snapshot, when this event is one.
    public var snapshot: Snapshot<State>? {
        if case .snapshot(let s) = self { return s }
        return nil
    }
}

extension StoreEvent: Sendable where State: Sendable {}
extension StoreEvent: Equatable where State: Equatable {}

/// What one target store did with a settled action.
public struct StoreResult: Sendable, Equatable {
    /// How the store answered.
    public enum Status: Sendable, Equatable {
        /// Handled; the store is at `version` (unchanged when the action changed nothing).
        case done(version: Int)
        /// The store refused the action (its state is unchanged). `code` is the store's own code
        /// (e.g. `todo/not-found`) or an SDK code (`store/bad-payload`, `store/error`).
        case rejected(code: String, message: String)
        /// The store was down past the queue timeout or its queue was full (`store-unavailable`).
        case unavailable(code: String, message: String)
    }

    /// The store's name.
    public var store: String
    /// Its answer.
    public var status: Status

    public init(store: String, status: Status) {
        self.store = store
        self.status = status
    }
}

/// The answer to `dispatchAndSettle`: the action's seq and every target store's result (ordered by store name).
public struct Settlement: Sendable, Equatable {
    /// The dispatch id (generated by the client).
    public var id: String
    /// The seq fluxd gave the action.
    public var seq: Int
    /// One result per target store, ordered by store name.
    public var results: [StoreResult]

    public init(id: String, seq: Int, results: [StoreResult]) {
        self.id = id
        self.seq = seq
        self.results = results
    }

    /// The status of one store, if it was a target.
    public subscript(store: String) -> StoreResult.Status? {
        results.first { $0.store == store }?.status
    }

    /// Whether every target answered `done`.
    public var allDone: Bool {
        results.allSatisfy { if case .done = $0.status { return true } else { return false } }
    }
}

/// fluxd's introspection (`info`): every store, peer counts, counters. Fields a given fluxd does not send are nil.
public struct BusInfo: Sendable, Equatable, Codable {
    /// One store as fluxd sees it.
    public struct Store: Sendable, Equatable, Codable {
        /// The peer that owns a store.
        public struct Owner: Sendable, Equatable, Codable {
            public var peer: Int?
            public var name: String?
            public var pid: Int?
            public var uid: Int?
        }
        public var name: String
        public var status: String?
        public var handles: [String]?
        public var waitFor: [String]?
        public var version: Int?
        public var seq: Int?
        public var subscribers: Int?
        public var queued: Int?
        public var inflight: Int?
        public var queries: Int?
        public var owner: Owner?
        /// Whether the store left an action unanswered longer than fluxd's store timeout (§10).
        public var stalled: Bool?
        /// Since when, in ms, while stalled.
        public var stalledFor: Int?
    }

    /// fluxd's memory budget (§12; fluxd 0.2.0).
    public struct Memory: Sendable, Equatable, Codable {
        /// One uid's share.
        public struct User: Sendable, Equatable, Codable {
            public var uid: Int?
            public var bytes: Int?
            public var connections: Int?
        }
        public var used: Int?
        public var peak: Int?
        public var limit: Int?
        public var perUser: Int?
        public var connectionAllowance: Int?
        public var refusals: Int?
        public var users: [User]?
    }

    /// How loaded fluxd is (fluxd 0.2.0).
    public struct Load: Sendable, Equatable, Codable {
        public var connections: Int?
        public var handshakes: Int?
        public var storeNames: Int?
        public var longestLoopHoldMicros: Int?
        public var maxCycleCheckSteps: Int?
        public var acceptErrors: [String: Int]?
    }

    /// Connected peers by role.
    public struct Peers: Sendable, Equatable, Codable {
        public var client: Int?
        public var store: Int?
        public var monitor: Int?
    }

    /// Traffic counters.
    public struct Counters: Sendable, Equatable, Codable {
        /// Connections accepted since fluxd started.
        public var connections: Int?
        public var framesIn: Int?
        public var framesOut: Int?
        public var bytesIn: Int?
        public var bytesOut: Int?
        public var actions: Int?
        public var snapshots: Int?
        public var errors: [String: Int]?
    }

    /// The seq of the last action fluxd accepted (after a restart, the newest one in its journal).
    public var seq: Int?
    public var stores: [Store]
    public var peers: Peers?
    public var counters: Counters?
    public var memory: Memory?
    public var load: Load?
    /// The reply exactly as fluxd sent it (the `info` message), for tools that show fields this type does not
    /// model (the reply may grow within protocol 1). Empty when the value was made otherwise.
    public var json: [UInt8] = []

    private enum CodingKeys: String, CodingKey { case seq, stores, peers, counters, memory, load }

    /// The store with this name, if fluxd knows it.
    public subscript(store name: String) -> Store? { stores.first { $0.name == name } }
}

/// A payload type for actions that carry none: encodes as `null`, decodes from anything.
public struct NoPayload: Codable, Sendable, Equatable {
    public init() {}
    public init(from decoder: any Decoder) throws {}
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encodeNil()
    }
}

/// What a config reload changed (`FluxClient.reload()`, the `reloaded` message): workers started (added), stopped
/// (removed) and restarted with their new config (changed), and the `[fluxd]` settings applied.
public struct ReloadResult: Sendable, Equatable {
    public var added: [String]
    public var removed: [String]
    public var changed: [String]
    public var settings: [String]

    public init(added: [String], removed: [String], changed: [String], settings: [String]) {
        self.added = added
        self.removed = removed
        self.changed = changed
        self.settings = settings
    }
}
