import DequeModule
import FluxCore
import FluxJSONValue
import FluxJournal

// The router's state: peers, stores, actions in flight, and the values they are made of.

/// One connection's state.
final class Peer {
    let id: PeerID
    let creds: PeerCredentials
    let connectedAt: Millis
    @exclusivity(unchecked) var role: Role?
    @exclusivity(unchecked) var name = ""
    /// `hello.session` (the raw JSON string), under which its settlements can be recovered (SPEC §15.4).
    @exclusivity(unchecked) var session: ArraySlice<UInt8>?
    @exclusivity(unchecked) var closing = false
    @exclusivity(unchecked) var owned: Set<String> = []
    /// Stores it subscribed to whole (full or delta subscriptions).
    @exclusivity(unchecked) var subscriptions: Set<String> = []
    /// Its path subscriptions (SPEC §16.4).
    @exclusivity(unchecked) var pathSubscriptions: [PathKey: PathSubscription] = [:]
    /// The last coalescing key given to one of its path subscriptions.
    @exclusivity(unchecked) var nextPathKey: UInt32 = 0
    /// Subscriptions of every kind it holds (`maxSubscriptions`).
    var subscriptionCount: Int { subscriptions.count + pathSubscriptions.count }

    /// A path subscription's identity on its connection: the store and the pointer text, by their bytes (SPEC §3.2).
    struct PathKey: Hashable {
        let store: MemberKey
        let path: MemberKey
        init(store: String, path: String) {
            self.store = MemberKey(text: store)
            self.path = MemberKey(text: path)
        }
    }
    @exclusivity(unchecked) var queries: [String: (store: String, bytes: [UInt8])] = [:]
    /// Accepted dispatches from this peer not yet settled.
    @exclusivity(unchecked) var unsettled = 0
    /// Host requests handed to the host and not answered yet, and the `pong`s held until they are (SPEC §8.7: a
    /// `pong` comes after every reply to frames sent before its `ping`; a host may answer some requests later).
    @exclusivity(unchecked) var hostOutstanding = 0
    @exclusivity(unchecked) var heldPongs: [Frame] = []
    /// The store this peer last answered or published for (a lookup cache; checked against `owner` on use).
    @exclusivity(unchecked) var lastStore: StoreEntry?
    /// Bytes of its live queries' values (`maxQueryBytes`).
    @exclusivity(unchecked) var queryBytes = 0
    /// What it holds of fluxd's memory budget.
    let account: MemoryBudget.Account
    /// Liveness: whether it asked for heartbeats, when a frame last came from it, when it was last pinged, and
    /// how many pings it has left unanswered.
    @exclusivity(unchecked) var heartbeat = false
    @exclusivity(unchecked) var lastHeard: Millis = 0
    @exclusivity(unchecked) var lastPingAt: Millis = 0
    @exclusivity(unchecked) var pingsOut = 0
    /// The preparation off the loop its frame waits for (`Router+Preparation.swift`), and the frames held
    /// meanwhile, in order, with their bytes (charged to `account`).
    @exclusivity(unchecked) var preparing: PendingPreparation?
    @exclusivity(unchecked) var held = Deque<[UInt8]>()
    @exclusivity(unchecked) var heldBytes = 0
    /// What the rows of an `info` being encoded off the loop for this peer are charged to its account (released
    /// when the reply is made, or when the peer closes).
    @exclusivity(unchecked) var infoRowsCharge = 0

    init(id: PeerID, creds: PeerCredentials, connectedAt: Millis, account: MemoryBudget.Account) {
        self.id = id
        self.creds = creds
        self.connectedAt = connectedAt
        self.account = account
    }
}

/// One store as the dispatcher knows it.
final class StoreEntry {
    let name: String
    /// Its metrics' counters (counted only with `RouterConfig.metricsClock`).
    @exclusivity(unchecked) var stats = StoreStats()
    /// A number of its own (1, 2, 3 … in order of first mention; never reused within a run): the coalescing key
    /// of its snapshots.
    let key: UInt32
    /// `name` as a JSON string (quoted, escaped once), spliced into every frame that names the store.
    let nameJSON: [UInt8]
    /// `name` as journal records hold it, encoded once (issue 27).
    let journalName: JournalName
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
    /// SPEC §10: the version floor when the entry was made (0 unless a store was forgotten before): its first
    /// version is above it, so a version a subscriber held of a forgotten store of the same name never comes again.
    @exclusivity(unchecked) var versionBase: UInt64 = 0
    /// The version its next state makes.
    var nextVersion: UInt64 { max(version, versionBase) + 1 }
    /// The retained snapshot frame, and where its state bytes sit in it. Nil while `tree` is newer (a patch was
    /// applied and no frame needed the whole state yet: `Router.retainedSnapshot` renders it).
    @exclusivity(unchecked) var snapshot: Frame?
    /// SPEC §16.5: the retained state as a tree, kept while the store publishes patches (nil otherwise), and the
    /// bytes its memory charge assumes.
    @exclusivity(unchecked) var tree: JSONTree?
    /// While `tree` was parsed from a whole state only for path subscriptions: the path subscriber whose account
    /// it is charged to, and the charge (the publisher pays for its snapshot only: another user's subscriptions
    /// never spend its budget). Nil while the tree is the publisher's (it patches it).
    @exclusivity(unchecked) var treePayer: Peer?
    @exclusivity(unchecked) var treePayerCost = 0
    /// The payer of the previous version's tree while a new whole state is being published (it pays again).
    @exclusivity(unchecked) var lastTreePayer: Peer?
    /// The most recent patches, for subscribers resuming with `from` (SPEC §16.3), within `deltaHistory` bytes.
    @exclusivity(unchecked) var recentPatches = Deque<RecentPatch>()
    @exclusivity(unchecked) var recentPatchBytes = 0
    /// The account the recent patches are charged to (the retained state's), and how much (see `chargeHistory`).
    @exclusivity(unchecked) var historyBy: MemoryBudget.Account?
    @exclusivity(unchecked) var historyCost = 0
    /// Whether a state is retained (as a frame, or as a tree not rendered yet).
    var hasRetained: Bool { snapshot != nil || tree != nil }
    @exclusivity(unchecked) var stateRange: Range<Int> = 0..<0
    @exclusivity(unchecked) var snapshotSeq: UInt64 = 0
    /// Actions waiting to be sent to the store, and those sent but not answered, both in seq order.
    @exclusivity(unchecked) var queue = Deque<Delivery>()
    @exclusivity(unchecked) var inflight = Deque<Delivery>()
    /// Subscribed connections, in subscription order (removed when they unsubscribe or close): full ones, delta
    /// ones (SPEC §16.3) and path ones (§16.4).
    @exclusivity(unchecked) var subscribers: [Peer] = []
    @exclusivity(unchecked) var deltaSubscribers: [DeltaSubscription] = []
    @exclusivity(unchecked) var pathSubscribers = PathIndex()
    /// Whether anyone subscribes to it, in any way.
    var hasSubscribers: Bool { !subscribers.isEmpty || !deltaSubscribers.isEmpty || !pathSubscribers.isEmpty }

    /// Each connection that subscribes to it in any way, once (for `store-up`, `store-down`).
    var subscribedPeers: [Peer] {
        if deltaSubscribers.isEmpty && pathSubscribers.isEmpty { return subscribers }
        var seen = Set<PeerID>()
        var peers: [Peer] = []
        for peer in subscribers + deltaSubscribers.map(\.peer) + pathSubscribers.all.map(\.peer) where seen.insert(peer.id).inserted {
            peers.append(peer)
        }
        return peers
    }
    /// Active queries, deduplicated by bytes, sorted by bytes, with how many holders each has.
    @exclusivity(unchecked) var queryOrder: [[UInt8]] = []
    @exclusivity(unchecked) var queryCounts: [QueryKey: Int] = [:]
    /// Whether its owner asked for query changes instead of whole sets (`register.queryDeltas`), and whether a
    /// whole set is due at the end of this batch.
    @exclusivity(unchecked) var queryDeltas = false
    @exclusivity(unchecked) var queriesDeferred = false
    /// When it last made progress (answered, or was sent an action with none unanswered), and whether it is
    /// reported stalled (its oldest delivered action unanswered for `storeTimeout`).
    @exclusivity(unchecked) var lastProgress: Millis = 0
    @exclusivity(unchecked) var stalled = false
    /// Who its registration (name, patterns, waitFor) is charged to, and how much.
    @exclusivity(unchecked) var registeredBy: MemoryBudget.Account?
    @exclusivity(unchecked) var registrationCost = 0
    /// Who its retained snapshot is charged to, and how much.
    @exclusivity(unchecked) var retainedBy: MemoryBudget.Account?
    /// The user the store's journal records are charged to (its owner's; once it is gone, whoever registered or
    /// retained it last; else nobody).
    var payerUID: UInt32 { ownerPeer?.account.uid ?? registeredBy?.uid ?? retainedBy?.uid ?? .max }
    @exclusivity(unchecked) var retainedCost = 0

    init(name: String, key: UInt32) {
        self.name = name
        self.key = key
        var json: [UInt8] = []
        appendEscaped(name, to: &json)
        self.nameJSON = json
        self.journalName = JournalName(name)
    }

    /// Adds one holder of `q`; returns its new count (a change the store is told of).
    func addQuery(_ q: [UInt8]) -> QueryChange {
        let key = QueryKey(q)
        let n = (queryCounts[key] ?? 0) + 1
        if n == 1 { queryOrder.insert(q, at: queryPosition(q)) }
        queryCounts[key] = n
        return QueryChange(bytes: q, count: n)
    }

    /// Removes one holder of `q`; returns its new count (0: no longer active), or nil if it was not active.
    func removeQuery(_ q: [UInt8]) -> QueryChange? {
        let key = QueryKey(q)
        guard let n = queryCounts.removeValue(forKey: key) else { return nil }
        if n > 1 {
            queryCounts[key] = n - 1
        } else {
            let at = queryPosition(q)
            if at < queryOrder.count && queryOrder[at] == q { queryOrder.remove(at: at) }
        }
        return QueryChange(bytes: q, count: n - 1)
    }

    /// Withdraws several queries at once (a connection that closed): one hash per query and one pass over the
    /// set, no sorting. Returns each changed query once with its final count, in the order of their bytes.
    func removeQueries(_ qs: [[UInt8]]) -> [QueryChange] {
        var touched: [(position: Int, change: QueryChange)] = []
        var gone: [Int] = []
        for q in qs {
            let key = QueryKey(q)
            guard let n = queryCounts.removeValue(forKey: key) else { continue }
            let at = queryPosition(q)  // in the set as it was: positions stay valid until the compaction below
            if n > 1 { queryCounts[key] = n - 1 } else { gone.append(at) }
            touched.append((at, QueryChange(bytes: q, count: n - 1)))
        }
        if !gone.isEmpty {
            gone.sort()
            var kept: [[UInt8]] = []
            kept.reserveCapacity(queryOrder.count - gone.count)
            var g = 0
            for (i, q) in queryOrder.enumerated() {
                if g < gone.count && gone[g] == i {
                    while g < gone.count && gone[g] == i { g += 1 }
                    continue
                }
                kept.append(q)
            }
            queryOrder = kept
        }
        // The set's order is the bytes' order; the same query withdrawn twice keeps its last (lowest) count.
        touched.sort { $0.position != $1.position ? $0.position < $1.position : $0.change.count > $1.change.count }
        var changes: [QueryChange] = []
        for t in touched {
            if let last = changes.last, last.bytes == t.change.bytes { changes[changes.count - 1] = t.change } else {
                changes.append(t.change)
            }
        }
        return changes
    }

    /// Where `q` is, or would be inserted, in `queryOrder` (binary search by bytes).
    private func queryPosition(_ q: [UInt8]) -> Int {
        var low = 0, high = queryOrder.count
        while low < high {
            let mid = (low + high) / 2
            if bytesPrecede(queryOrder[mid], q) { low = mid + 1 } else { high = mid }
        }
        return low
    }
}

/// A delta subscription (SPEC §16.3): its connection and the version it was last sent.
final class DeltaSubscription {
    let peer: Peer
    @exclusivity(unchecked) var sent: UInt64

    init(peer: Peer, sent: UInt64) {
        self.peer = peer
        self.sent = sent
    }
}

/// A path subscription (SPEC §16.4).
final class PathSubscription {
    let peer: Peer
    let store: String
    /// The pointer as given, as a JSON string, and its tokens.
    let path: String
    let pathJSON: [UInt8]
    let tokens: [String]
    /// Its `subtree` frames' coalescing key (unique within its connection).
    let key: UInt32
    /// When it was made, among the router's path subscriptions (frames for one change go out in this order).
    let order: UInt64
    /// The last patch match (`PathIndex.touched`) that collected it.
    @exclusivity(unchecked) var touchMark: UInt64 = 0
    /// The value last sent (its compact bytes; nil: absent), and whether anything was sent yet.
    @exclusivity(unchecked) var last: [UInt8]?
    @exclusivity(unchecked) var sentAny = false

    init(peer: Peer, store: String, path: String, tokens: [String], key: UInt32, order: UInt64) {
        self.peer = peer
        self.order = order
        self.store = store
        self.path = path
        self.tokens = tokens
        self.key = key
        var json: [UInt8] = []
        appendEscaped(path, to: &json)
        self.pathJSON = json
    }
}

/// A patch kept for resuming subscribers: the version it made, its seq and bytes.
struct RecentPatch {
    let version: UInt64
    let seq: UInt64
    let bytes: [UInt8]

    /// What one kept patch costs besides its bytes (the array's header and the deque's slot), for the budget.
    static let overhead = 64
}

/// A query whose number of holders changed, and its new count (0: no longer active).
struct QueryChange {
    let bytes: [UInt8]
    let count: Int
}

/// A query's bytes as a dictionary key, hashed in one pass over the bytes (`[UInt8]`'s own `Hashable` feeds the
/// hasher byte by byte: ~20 instructions a byte, which made a few thousand 300-byte queries cost a 30 ms loop
/// hold).
struct QueryKey: Hashable {
    let bytes: [UInt8]

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    func hash(into hasher: inout Hasher) {
        bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    static func == (a: QueryKey, b: QueryKey) -> Bool { sameBytes(a.bytes, b.bytes[...]) }
}

/// One action on its way to one store: an element of the store's `queue` or `inflight` (a value, so a queued
/// delivery costs no allocation of its own).
struct Delivery {
    let action: ActionRecord
    /// While the store is down: when the action gives up waiting (`store-unavailable`).
    var deadline: Millis?
    var redelivered = false
    /// When the action was accepted, by `RouterConfig.metricsClock` (0 without metrics).
    var acceptedAt: UInt64 = 0

    init(action: ActionRecord, deadline: Millis?, acceptedAt: UInt64 = 0) {
        self.action = action
        self.deadline = deadline
        self.acceptedAt = acceptedAt
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
    /// The peer that dispatched it (kept while the action is unsettled, even if that peer has gone), or the one
    /// that recovered it (`recover`, SPEC §15.4); after a restart, a stand-in that is gone.
    @exclusivity(unchecked) var dispatcher: Peer
    /// The dispatcher's session (`hello.session`) when it gave one and asked for settlement. (Read from the
    /// dispatcher, which keeps it: one that recovers an action has the same session, and a restored action's
    /// stand-in dispatcher holds the journaled one. Not a field of its own: the record stays in its allocation
    /// size class.)
    var session: ArraySlice<UInt8>? { id != nil ? dispatcher.session : nil }
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

/// One store's answer to one action.
enum StoreResult {
    case done
    case rejected(ArraySlice<UInt8>)
    case unavailable(ErrorCode, String)
}
