import FluxCore

/// Identifies one connection for the lifetime of a fluxd process (never reused). Announced to the peer as
/// `welcome.peer` and shown in introspection.
public typealias PeerID = UInt64

/// Milliseconds on a monotonic clock. The router never reads a clock: the caller passes `now` with every event,
/// which makes time as testable as everything else.
public typealias Millis = UInt64

/// Who is at the other end of a connection, as the kernel reports it (SO_PEERCRED). Shown in introspection.
public struct PeerCredentials: Sendable, Equatable {
    public var pid: Int32?
    public var uid: UInt32?
    public var gid: UInt32?

    public init(pid: Int32? = nil, uid: UInt32? = nil, gid: UInt32? = nil) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

/// The limits and identity a router runs with; announced to every peer in `welcome.limits`.
public struct RouterConfig: Sendable {
    /// The clock of the per-store metrics (`fluxd --metrics`, docs/metrics.md: `StoreStats`); nil: none are counted.
    public var metricsClock: MetricsClock?
    /// Largest frame body accepted, in bytes (`too-large` above it).
    public var maxFrame: UInt32 = 1_048_576
    /// Actions delivered to one store before its first unanswered one is answered.
    public var storeWindow: Int = 64
    /// Actions queued at most for a store that is down.
    public var queueLimit: Int = 1024
    /// How long an action waits for a store that is down before it is settled `store-unavailable`.
    public var queueTimeout: Millis = 5000
    /// How long a new connection has to send `hello`.
    public var handshakeTimeout: Millis = 5000
    /// Unsettled dispatches one connection may have at once (`overloaded` above it).
    public var maxPending: Int = 65_536
    /// A store whose queue holds `queueLimit` actions still accepts a dispatch from a connection with fewer than
    /// this many unsettled actions: a flood from one connection cannot lock the others out of a store (a queue
    /// holds at most `queueLimit` + `fairPending` × connections).
    public var fairPending: Int = 8
    /// Bytes that may wait in fluxd for one connection (queued, not yet taken by the kernel) before it is closed
    /// as a slow consumer (`slow-consumer`). Snapshots for a connection that is behind are coalesced (newest
    /// wins), so only frames that cannot be dropped count towards this in practice.
    public var maxBacklog: Int = 64 << 20
    /// Stores one `register` may name in `waitFor` (`limit-exceeded` above it): with the cycle check linear in
    /// the registration graph, this bounds the work one `register` can cause.
    public var maxWaitFor: Int = 64
    /// Live queries one connection may hold at once (`limit-exceeded` above it).
    public var maxQueries: Int = 4096
    /// Bytes of live query values one connection may hold at once (`limit-exceeded` above it).
    public var maxQueryBytes: Int = 1 << 20
    /// Stores one connection may be subscribed to at once (`limit-exceeded` above it).
    public var maxSubscriptions: Int = 4096
    /// Connections fluxd accepts at once, from all users (`too-many-connections` above it).
    public var maxConnections: Int = 8192
    /// Connections one user (uid) may hold at once (`too-many-connections` above it).
    public var maxConnectionsPerUser: Int = 4096
    /// Connections that have not completed their handshake yet (`too-many-connections` above it).
    public var maxHandshakes: Int = 1024
    /// Connections of one user that have not completed their handshake yet: one user's silent connections
    /// cannot take every handshake slot (`too-many-connections` above it).
    public var maxHandshakesPerUser: Int = 256
    /// Stores one connection may own at once (`limit-exceeded` above it).
    public var maxStoresPerConnection: Int = 1024
    /// The memory budget: bytes fluxd accounts for (see `MemoryBudget`).
    public var memory = MemoryBudget.Limits()
    /// How long an opted-in peer (`hello.heartbeat`) may stay silent before fluxd pings it (0: never).
    public var pingInterval: Millis = 30_000
    /// Pings an opted-in peer may leave unanswered; silent through one more interval it is closed
    /// (`unresponsive`).
    public var maxPingsOut: Int = 2
    /// How long a store may leave its oldest delivered action unanswered before it is reported stalled
    /// (0: never).
    public var storeTimeout: Millis = 30_000
    /// Whether a stalled store's connection is closed (`unresponsive`), so its supervisor can restart it; its
    /// unanswered actions are redelivered as for any store that goes down (SPEC §10).
    public var closeStalledStores = false
    /// Whether the router makes `.debug` log effects (fluxd turns them off unless its log level is debug or
    /// trace: building their text cost more than the rest of refusing a request, under a flood of bad requests).
    public var debugLogs = true
    /// The server name in `welcome.server`.
    public var serverName: String = "fluxd/\(FluxBusVersion.string)"
    /// Host operations (SPEC §8.11) the router hands to its host (e.g. fluxd's worker supervisor) as a `.host`
    /// effect once validated; the others get `unknown-op`. `DaemonCore` fills this from its registered handlers.
    public var hostOps: Set<Op> = []
    /// The history this run's seqs and versions belong to (`welcome.epoch`, SPEC §15.1): the journal's for a
    /// durable fluxd, a new one per run for an ephemeral one.
    public var epoch: String = ""
    /// `welcome.durability`: "always", "batch", "none" or "ephemeral" (SPEC §15.2).
    public var durability: String = "ephemeral"
    /// How long settled outcomes of sessions are kept for `recover` (SPEC §15.4), and at most how many per user
    /// (kept outcomes and unsettled session dispatches together; more are refused `outcome-quota`).
    public var outcomeWindow: Millis = 600_000
    public var maxOutcomes = 100_000
    /// Bytes of recent patches kept per store for subscribers that resume with `from` (SPEC §16.3; announced).
    public var deltaHistory = 1 << 20
    /// Patches and states of at least this many bytes are applied and parsed off the loop thread (a
    /// `Preparation`, `Router+Preparation.swift`) while the peer's frames wait; smaller ones inline (32 KiB:
    /// ~500 patch operations or a 32 KB parse, well under a millisecond). The fuzz target and tests lower it.
    public var preparationBytes = 32 * 1024
    /// Whether `dispatch.seq` is accepted (`fluxd --replay`, for `fluxctl replay`; SPEC §8.3).
    public var replay = false
    /// Who may send the privileged operations (SPEC §8.11: `restart-worker`, `stop-worker`; §8.12: `history`,
    /// `state-at`); nil: every peer (an in-process bus, tests). fluxd sets its own uid, root and the config's
    /// `admin_users`/`admin_groups`.
    public var admins: Admins?
    /// Seqs reserved in the journal at a time (SPEC §15.1: persisted ahead of use).
    public var seqBlock: UInt64 = 1 << 16

    public init() {}

    /// Whether a journal keeps this router's state across restarts.
    public var isDurable: Bool { durability != "ephemeral" }
}

/// Something that happened at the edge of the router: the transport turns socket and timer activity into these.
public enum RouterEvent: Sendable {
    /// A peer connected.
    case connected(PeerID, PeerCredentials)
    /// A complete frame body arrived from a peer.
    case frame(PeerID, [UInt8])
    /// A zero-length frame arrived (`bad-frame`).
    case emptyFrame(PeerID)
    /// A frame announced a length above `maxFrame` (`too-large`; the router closes the connection).
    case oversizedFrame(PeerID, length: UInt32)
    /// The connection is gone (peer closed, error, or after a `close` effect). Reported exactly once per peer.
    case closed(PeerID)
    /// More than `maxBacklog` bytes wait to be written to the peer (it does not read fast enough): the router
    /// sends it `slow-consumer` and closes it. The host has already dropped what was queued and not yet written.
    case backlogged(PeerID)
    /// The peer's unfinished frame and unwritten frames outgrew fluxd's memory budget
    /// (`Router.accountTransport` said no): the router sends it `memory-budget` and closes it. The host has
    /// already dropped what was queued and not yet written.
    case overBudget(PeerID)
    /// The transport is about to write what this batch of reads produced (once per loop iteration): the router
    /// sends what it deferred to coalesce (whole `queries` sets of stores that did not ask for deltas). Fed only
    /// while `Router.hasDeferredWork`.
    case endOfBatch
    /// Time passed; the router expires handshakes and queued actions whose deadline is at or before `now`.
    case tick
    /// fluxd is about to shut down: refuse new dispatches (`shutting-down`) but keep routing answers, so actions
    /// in flight settle. `Router.pendingActionCount` tells when they have.
    case drain
    /// fluxd is shutting down: settle what is left as `shutting-down`, say goodbye to every peer and close.
    case shutdown
    /// The host ran the `Preparation` of a `.prepare` effect (off the loop): the peer's held frames are taken.
    case prepared(PeerID, PreparationResult)
    /// The host's answer to a `.host` request: sent to the peer like any reply (counted in `info`).
    case hostReply(PeerID, Frame)
    /// The host refused a `.host` request: the peer gets `error` with `code` and `ref` (counted, and a monitor
    /// `error` event, as for every error).
    case hostError(PeerID, ErrorCode, message: String, ref: String?)
}

/// A host operation (SPEC §8.11), decoded and validated by the router; the host answers it with
/// `RouterEvent.hostReply` or `.hostError` (`ref` is `id`).
public enum HostRequest: Sendable, Equatable {
    /// `workers`: list the workers.
    case workers(id: String)
    /// `restart-worker`: restart the worker `name`.
    case restartWorker(id: String, name: String)
    /// `stop-worker`: stop the worker `name` (it stays stopped until restarted).
    case stopWorker(id: String, name: String)
    /// `reload`: read the config file again and apply what may change while fluxd runs.
    case reload(id: String)
    /// `history` (SPEC §8.12): up to `limit` journaled actions from seq `from` (nil: the oldest retained); `idRaw`
    /// is the request's id token, echoed in the reply.
    case history(idRaw: [UInt8]?, from: UInt64?, limit: Int)
    /// `state-at` (SPEC §8.12): a store's state at a version, or after a seq.
    case stateAt(idRaw: [UInt8]?, store: String, version: UInt64?, seq: UInt64?)

    /// The request's id (the `ref` of an error about it).
    public var id: String? {
        switch self {
        case .workers(let id), .restartWorker(let id, _), .stopWorker(let id, _), .reload(let id): return id
        case .history(let raw, _, _), .stateAt(let raw, _, _, _): return raw.map { decodeJSONString($0[...]) }
        }
    }

    /// The request's op.
    public var op: Op {
        switch self {
        case .workers: return .workers
        case .restartWorker: return .restartWorker
        case .stopWorker: return .stopWorker
        case .reload: return .reload
        case .history: return .history
        case .stateAt: return .stateAt
        }
    }
}

/// A store came up (registered) or went down (its owner unregistered it or closed): for a host that waits on
/// stores, such as fluxd's worker supervisor.
public struct StoreChange: Sendable, Equatable {
    /// The store's name.
    public var store: String
    /// `up` or `down`.
    public var status: StoreStatus
    /// The owning connection while up.
    public var owner: PeerID?
    /// The owner's process id, as the kernel reported it.
    public var ownerPID: Int32?
}

/// What the router asks the outside world to do, in order.
public enum RouterEffect: Sendable {
    /// Write a frame to a peer (frames to one peer go out in the order of these effects).
    case send(PeerID, Frame)
    /// Write a monitor `event` frame to a monitor peer. Unlike `send`, the host may drop it when that peer is
    /// backlogged (a monitor must never slow routing); it must then send `{"op":"missed","count":N}` before the
    /// next event it does deliver.
    case monitor(PeerID, Frame)
    /// A host operation whose op is in `RouterConfig.hostOps`, validated: the host answers it by feeding
    /// `.hostReply` or `.hostError`. (Indirect: every effect in the hot path's arrays would otherwise be copied at
    /// its size.)
    indirect case host(PeerID, HostRequest)
    /// Values the router let go of whose release is long work (a large tree's nodes, a large patch's operations):
    /// the host drops them off the loop thread if it has one (dropping the effect releases them here).
    case discard(Garbage)
    /// Run `Preparation.run()` (off the loop thread if the host has one) and feed `.prepared(peer, result)`:
    /// the peer's frames wait until then (`Router+Preparation.swift`).
    indirect case prepare(PeerID, Preparation)
    /// A store came up or went down (`StoreChange`).
    indirect case storeChanged(StoreChange)
    /// Close a peer's connection after writing what was sent to it before. A `closed` event follows.
    case close(PeerID)
    /// Something worth logging.
    case log(LogLevel, String)
    /// A store left its oldest delivered action unanswered for `storeTimeout` (reported once per stall);
    /// `closing`: its connection is being closed as `unresponsive` (the host may stop the process, e.g. a
    /// supervised worker, so that it restarts).
    case stalled(store: String, pid: Int32?, closing: Bool)
    /// The router deferred work to the end of the transport's batch of reads: feed `.endOfBatch` before the
    /// frames of this batch are written (`Router.hasDeferredWork` stays true until then).
    case deferred
}

/// Carries out a router's effects as the router produces them, in the order it produces them (see
/// `Router.handle(_:now:sink:)`): the host's alternative to collecting them in an array and carrying them out
/// afterwards. The sink must not feed the router another event from these calls.
public protocol RouterEffectSink: AnyObject {
    /// The `.send(peer, frame)` effect.
    func send(_ frame: Frame, to peer: PeerID)
    /// Every other effect.
    func perform(_ effect: RouterEffect)
    /// Whether frames wait in the transport, unwritten, for `peer` beyond what a healthy reader leaves (SPEC §16.3:
    /// a delta subscriber that is behind is sent whole snapshots, which coalesce).
    func isBehind(_ peer: PeerID) -> Bool
}

/// Severity of a `log` effect (mapped onto swift-log's levels by the daemon).
public enum LogLevel: Sendable, Equatable {
    /// (`critical`: the host can no longer do what it promised, e.g. the journal failed for good.)
    case debug, info, notice, warning, error, critical
}

/// What the router knows of one store, for its host (e.g. a supervisor waiting for a worker to register).
public struct StoreStatusInfo: Sendable, Equatable {
    /// `up` (a live connection owns it), `down` (registered before, owner gone) or `unknown`.
    public var status: String
    /// The owning connection while up.
    public var owner: PeerID?
    /// The owner's process id, as the kernel reported it.
    public var ownerPID: Int32?
    /// The latest snapshot version (0: none).
    public var version: UInt64
}

/// The peers allowed the privileged operations: by uid, or by the primary gid their credentials carry (SO_PEERCRED
/// reports no supplementary groups).
public struct Admins: Sendable, Equatable {
    public var uids: Set<UInt32>
    public var gids: Set<UInt32>

    public init(uids: Set<UInt32> = [], gids: Set<UInt32> = []) {
        self.uids = uids
        self.gids = gids
    }

    /// fluxd's own uid and root, plus `uids` and `gids`.
    public static func owner(_ uid: UInt32, uids: Set<UInt32> = [], gids: Set<UInt32> = []) -> Admins {
        Admins(uids: uids.union([uid, 0]), gids: gids)
    }

    /// Whether a peer with these credentials is one of them.
    public func admits(uid: UInt32?, gid: UInt32?) -> Bool {
        if let uid, uids.contains(uid) { return true }
        if let gid, gids.contains(gid) { return true }
        return false
    }
}
