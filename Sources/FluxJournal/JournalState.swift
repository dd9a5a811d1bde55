import DequeModule
import FluxCore

/// One store's final result for one action.
public struct TargetResult: Sendable, Equatable {
    public var store: String
    public var outcome: ResultOutcome
    /// The store's version after it answered (for `done`).
    public var version: UInt64

    public init(store: String, outcome: ResultOutcome, version: UInt64) {
        self.store = store
        self.outcome = outcome
        self.version = version
    }
}

/// Who asked for a settlement: a session (`hello.session`, raw JSON string bytes) of one uid, and the dispatch id
/// (raw JSON string bytes) within it (SPEC §15.4).
public struct SessionKey: Hashable, Sendable {
    public let uid: UInt32
    public let session: [UInt8]
    public let id: [UInt8]

    /// A key from the decoded texts of the session and the id.
    public init(uid: UInt32, session: [UInt8], id: [UInt8]) {
        self.uid = uid
        self.session = session
        self.id = id
    }

    /// A key from the raw JSON strings of the session and the id as a peer wrote them (so `"c-1"` and
    /// `"c\u002d1"` are the same id).
    public init(uid: UInt32, sessionJSON: ArraySlice<UInt8>, idJSON: ArraySlice<UInt8>) {
        self.init(uid: uid, session: Self.text(sessionJSON), id: Self.text(idJSON))
    }

    /// The decoded bytes of a JSON string token (quotes included): the bytes between the quotes when it has no
    /// escape, which is the common case.
    public static func text(_ token: ArraySlice<UInt8>) -> [UInt8] {
        guard token.count >= 2 else { return [] }
        let inner = token.dropFirst().dropLast()
        if !inner.contains(UInt8(ascii: "\\")) { return Array(inner) }
        return Array(decodeJSONString(token).utf8)
    }

    /// Hashes the texts as whole byte runs (the synthesized conformance fed them to the hasher byte by byte: a
    /// dictionary look-up of the outcome log cost more than the rest of recording a settlement).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(uid)
        hasher.combine(session.count)
        session.withUnsafeBytes { hasher.combine(bytes: $0) }
        id.withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    public static func == (a: SessionKey, b: SessionKey) -> Bool {
        a.uid == b.uid && a.session == b.session && a.id == b.id
    }
}

/// The outcomes of settled dispatches made under a session, kept for the outcome window (SPEC §15.4), per user:
/// each user's outcomes are kept for at least `window` ms after they settled, and a user holds at most `capacity`
/// of them. The router refuses a user's session dispatch that would take it past its capacity (`outcome-quota`),
/// so one user's outcomes never push out another's; should an insert still find its user full (a journal written
/// with a larger capacity), that user's own oldest outcome goes.
public struct OutcomeLog: Sendable {
    public struct Entry: Sendable, Equatable {
        public var seq: UInt64
        public var results: [TargetResult]

        public init(seq: UInt64, results: [TargetResult]) {
            self.seq = seq
            self.results = results
        }

        /// About what the entry takes in memory (its key included), for the memory budget.
        public func bytes(_ key: SessionKey) -> Int {
            var n = 96 + key.session.count + key.id.count
            for r in results {
                n += 48 + r.store.utf8.count
                switch r.outcome {
                case .done: break
                case .rejected(let e): n += e.count
                case .unavailable(let code, let message): n += code.utf8.count + message.utf8.count
                }
            }
            return n
        }
    }

    /// An outcome the log let go of: whose it was and how many bytes it held.
    public struct Dropped: Sendable, Equatable {
        public var uid: UInt32
        public var bytes: Int
    }

    /// The most outcomes one user holds.
    public let capacity: Int
    public let window: UInt64
    private var entries = ShardedDictionary<SessionKey, Entry>()
    /// Each user's outcomes in the order they were kept (a key kept again appears twice: only its latest counts).
    private var orders: [UInt32: Order] = [:]
    /// Each user's live outcomes.
    private var counts: [UInt32: Int] = [:]

    /// One kept outcome, in its user's order.
    struct Item: Sendable {
        let key: SessionKey
        let at: UInt64
        let entry: Entry
    }

    /// A user's outcomes in order, in chunks of at most `chunkSize` that are never changed once full: a copy of the
    /// log (a checkpoint's, `snapshot`) shares them, and the log's next change copies at most one chunk.
    struct Order: Sendable {
        var chunks: [[Item]] = []
        /// Where the first chunk's live items start.
        var head = 0

        var first: Item? { chunks.first.map { $0[head] } }
        var isEmpty: Bool { chunks.isEmpty }

        mutating func append(_ item: Item) {
            if chunks.isEmpty || chunks[chunks.count - 1].count >= OutcomeLog.chunkSize {
                var chunk: [Item] = []
                chunk.reserveCapacity(OutcomeLog.chunkSize)
                chunks.append(chunk)
            }
            chunks[chunks.count - 1].append(item)
        }

        mutating func removeFirst() -> Item? {
            guard let item = first else { return nil }
            head += 1
            if head == chunks[0].count {
                chunks.removeFirst()
                head = 0
            }
            return item
        }

        /// The items from the oldest.
        func forEach(_ body: (Item) -> Void) {
            for (i, chunk) in chunks.enumerated() {
                for item in chunk[(i == 0 ? head : 0)...] { body(item) }
            }
        }
    }

    static let chunkSize = 1024

    public init(capacity: Int = 100_000, window: UInt64 = 600_000) {
        self.capacity = capacity
        self.window = window
    }

    public var count: Int { entries.count }

    /// The outcomes user `uid` holds now.
    public func count(of uid: UInt32) -> Int { counts[uid] ?? 0 }

    /// Remembers the outcome of the dispatch `key` (settled at `at`, in ms on the caller's clock). Returns what
    /// it let go of: an older outcome of the same key, and the user's own oldest when it was at `capacity`.
    @discardableResult
    public mutating func insert(_ key: SessionKey, seq: UInt64, results: [TargetResult], at: UInt64) -> [Dropped] {
        var dropped: [Dropped] = []
        let entry = Entry(seq: seq, results: results)
        if let previous = entries.updateValue(entry, forKey: key) {
            dropped.append(Dropped(uid: key.uid, bytes: previous.bytes(key)))
        } else {
            counts[key.uid, default: 0] += 1
        }
        orders[key.uid, default: Order()].append(Item(key: key, at: at, entry: entry))
        while count(of: key.uid) > capacity { if let d = dropOldest(of: key.uid) { dropped.append(d) } }
        return dropped
    }

    public func outcome(_ key: SessionKey) -> Entry? { entries[key] }

    /// Forgets outcomes older than the window; returns what it let go of. (Work: one look per user that holds
    /// outcomes, and one step per outcome let go.)
    @discardableResult
    public mutating func expire(now: UInt64) -> [Dropped] {
        var dropped: [Dropped] = []
        for uid in orders.keys {
            while let first = orders[uid]?.first, first.at + window < now {
                if let d = dropOldest(of: uid) { dropped.append(d) }
            }
            if orders[uid]?.isEmpty == true { orders.removeValue(forKey: uid) }
        }
        return dropped
    }

    private mutating func dropOldest(of uid: UInt32) -> Dropped? {
        guard let first = orders[uid]?.removeFirst() else { return nil }
        // The same key may have been kept again later: only its latest entry counts.
        guard let e = entries[first.key], e.seq == first.entry.seq else { return nil }
        entries.removeValue(forKey: first.key)
        counts[uid, default: 1] -= 1
        if counts[uid] == 0 { counts.removeValue(forKey: uid) }
        return Dropped(uid: uid, bytes: e.bytes(first.key))
    }

    /// Every outcome, each user's oldest first (for a checkpoint).
    public var all: [(key: SessionKey, entry: Entry)] {
        var out: [(key: SessionKey, entry: Entry)] = []
        for uid in orders.keys.sorted() {
            orders[uid]!.forEach { item in
                if let e = entries[item.key], e.seq == item.entry.seq { out.append((item.key, e)) }
            }
        }
        return out
    }

    /// The outcomes as they are now, for a checkpoint written on another thread: taking it costs a copy of one
    /// chunk reference per 1,024 outcomes, and the log's next change copies at most one chunk per user.
    public var snapshot: Snapshot { Snapshot(orders: orders) }

    /// Outcomes taken by `snapshot`.
    public struct Snapshot: Sendable {
        let orders: [UInt32: Order]

        /// Every outcome, each user's oldest first (a key kept twice: its latest).
        public var all: [(key: SessionKey, entry: Entry)] {
            var out: [(key: SessionKey, entry: Entry)] = []
            for uid in orders.keys.sorted() {
                var latest: [SessionKey: UInt64] = [:]
                orders[uid]!.forEach { latest[$0.key] = $0.entry.seq }
                orders[uid]!.forEach { item in
                    if latest[item.key] == item.entry.seq { out.append((item.key, item.entry)) }
                }
            }
            return out
        }
    }
}

/// What the journal says fluxd's durable state is: built by applying records in order (`apply`), on start from
/// the segments on disk. Pure: no I/O.
public struct JournalState: Sendable {
    /// A store as journaled.
    public struct Store: Sendable, Equatable {
        public var name: String
        public var handles: [String] = []
        public var waitFor: [String] = []
        /// Whether a registration was journaled (a store only ever named in a snapshot is not).
        public var registered = false
        /// The last version published (0: none), and the seq of the last action it answered.
        public var version: UInt64 = 0
        public var seq: UInt64 = 0
        /// The retained snapshot: its version, the seq it was published with, and the state bytes.
        public var snapshot: (version: UInt64, seq: UInt64, state: ArraySlice<UInt8>)?
        /// The patches journaled after that snapshot, in order (SPEC §16): the retained state is the snapshot with
        /// them applied.
        public var patches: [(version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>)] = []

        public init(name: String) { self.name = name }

        public static func == (a: Store, b: Store) -> Bool {
            a.name == b.name && a.handles == b.handles && a.waitFor == b.waitFor && a.registered == b.registered
                && a.version == b.version && a.seq == b.seq && a.snapshot?.version == b.snapshot?.version
                && a.snapshot?.seq == b.snapshot?.seq && a.snapshot?.state.elementsEqual(b.snapshot?.state ?? []) ?? (b.snapshot == nil)
                && a.patches.count == b.patches.count
                && zip(a.patches, b.patches).allSatisfy { $0.version == $1.version && $0.seq == $1.seq && $0.patch.elementsEqual($1.patch) }
        }
    }

    /// An accepted action that is not final for every target yet.
    public struct Pending: Sendable, Equatable {
        public var action: ActionEntry
        /// Results so far, by target store.
        public var results: [String: TargetResult] = [:]
    }

    /// The highest seq ever handed out (the greater of the last action's and, after a power loss, the reserved
    /// high-water mark: `nextSeq` is above both).
    public private(set) var lastSeq: UInt64 = 0
    /// The seq high-water mark: seqs up to it may have been revealed.
    public private(set) var reservedSeq: UInt64 = 0
    public private(set) var stores: [String: Store] = [:]
    /// SPEC §10: the highest version a forgotten store reached (0: none was forgotten); stores made later start
    /// their versions above it.
    public private(set) var versionFloor: UInt64 = 0
    public private(set) var pending: [UInt64: Pending] = [:]
    /// Settled dispatches made under a session, for `recover` (their order is journal order).
    public private(set) var outcomes: OutcomeLog
    /// How many records and actions were applied.
    public private(set) var recordCount = 0
    public private(set) var actionCount = 0
    /// Results that named no pending action or target (a journal written by a fluxd with a bug, or cut by a
    /// repair): counted, not fatal.
    public private(set) var strayResults = 0
    /// What the segments a checkpoint covers hold, by number (from its summary records).
    public private(set) var segmentSummaries: [Int: (firstSeq: UInt64, lastSeq: UInt64, lastTime: UInt64, actions: UInt64)] = [:]

    public init(outcomes: OutcomeLog = OutcomeLog()) {
        self.outcomes = outcomes
    }

    /// The seq the next accepted action gets: above every seq that may have been revealed.
    public var nextSeq: UInt64 { max(lastSeq, reservedSeq) + 1 }

    /// Applies one record. `at` is the time outcomes are remembered at (the caller's clock).
    public mutating func apply(_ record: JournalRecord, at: UInt64 = 0) {
        recordCount += 1
        switch record {
        case .seqReserve(let upTo):
            reservedSeq = max(reservedSeq, upTo)
        case .register(let name, let handles, let waitFor):
            var s = stores[name] ?? Store(name: name)
            s.handles = handles
            s.waitFor = waitFor
            s.registered = true
            stores[name] = s
        case .action(let a):
            actionCount += 1
            lastSeq = max(lastSeq, a.seq)
            for t in a.targets where stores[t] == nil { stores[t] = Store(name: t) }
            pending[a.seq] = Pending(action: a)
        case .result(let seq, let store, let outcome, let version):
            guard var p = pending[seq], p.action.targets.contains(store), p.results[store] == nil else {
                strayResults += 1
                return
            }
            p.results[store] = TargetResult(store: store, outcome: outcome, version: version)
            if case .unavailable = outcome {} else if var s = stores[store] {
                s.seq = max(s.seq, seq)
                stores[store] = s
            }
            if p.results.count == p.action.targets.count {
                pending.removeValue(forKey: seq)
                if let session = p.action.session, let id = p.action.id {
                    let results = p.action.targets.map { p.results[$0]! }
                    outcomes.insert(SessionKey(uid: p.action.uid, sessionJSON: session, idJSON: id), seq: seq,
                                    results: results, at: at)
                }
            } else {
                pending[seq] = p
            }
        case .snapshot(let name, let version, let seq, let state):
            // (Changed in place in the dictionary: a copy taken out and put back would copy the patch list once
            // per record, making a restart quadratic in the patches since the last checkpoint.)
            stores[name, default: Store(name: name)].version = max(stores[name]?.version ?? 0, version)
            stores[name]!.snapshot = (version, seq, state)
            stores[name]!.patches = []
        case .patch(let name, let version, let seq, let patch):
            stores[name, default: Store(name: name)].version = max(stores[name]?.version ?? 0, version)
            stores[name]!.patches.append((version, seq, patch))
        case .storePosition(let name, let version, let seq):
            var s = stores[name] ?? Store(name: name)
            s.version = max(s.version, version)
            s.seq = max(s.seq, seq)
            stores[name] = s
        case .forget(let name, _, let floor):
            // Its queued actions were given up (their results journaled) before it was forgotten.
            if !name.isEmpty { stores.removeValue(forKey: name) }
            versionFloor = max(versionFloor, floor)
        case .outcome(let uid, let session, let id, let seq, let results):
            outcomes.insert(SessionKey(uid: uid, session: session, id: id), seq: seq, results: results, at: at)
            lastSeq = max(lastSeq, seq)
        case .segmentSummary(let number, let firstSeq, let last, let lastTime, let actions):
            segmentSummaries[Int(number)] = (firstSeq, last, lastTime, actions)
            // The segments a checkpoint covers held actions up to `last`, settled ones included (which the
            // checkpoint does not repeat).
            if actions > 0 { lastSeq = max(lastSeq, last) }
        }
    }
}

/// A dictionary in 64 shards by hash: it grows one shard at a time, so no insert rehashes more than about 1/64 of
/// it (a 100,000-entry `Dictionary` doubling held fluxd's loop for 13-20 ms). For the maps a peer can fill on the
/// loop (kept outcomes, unsettled session dispatches).
public struct ShardedDictionary<Key: Hashable, Value> {
    private var shards = [[Key: Value]](repeating: [:], count: 64)
    public private(set) var count = 0

    public init() {}

    @inline(__always)
    private static func shard(_ key: Key) -> Int { key.hashValue & 63 }

    public subscript(key: Key) -> Value? {
        get { shards[Self.shard(key)][key] }
        set {
            let i = Self.shard(key)
            if let newValue {
                if shards[i].updateValue(newValue, forKey: key) == nil { count += 1 }
            } else if shards[i].removeValue(forKey: key) != nil {
                count -= 1
            }
        }
    }

    /// Sets `value` for `key`; returns the value it replaced.
    @discardableResult
    public mutating func updateValue(_ value: Value, forKey key: Key) -> Value? {
        let old = shards[Self.shard(key)].updateValue(value, forKey: key)
        if old == nil { count += 1 }
        return old
    }

    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        let old = shards[Self.shard(key)].removeValue(forKey: key)
        if old != nil { count -= 1 }
        return old
    }

    public var isEmpty: Bool { count == 0 }
}

extension ShardedDictionary: Sendable where Key: Sendable, Value: Sendable {}
