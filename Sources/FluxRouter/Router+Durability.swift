import DequeModule
import FluxCore
import FluxJournal
import FluxJSONValue

// Durability (SPEC §15): what the router journals, how it restores what a journal recovered, and how a peer
// recovers its settlements (`recover`). The journal itself (`JournalWriting`) only records; the semantics stay
// here and in Semantics.swift, which call these helpers at each point where a record is made:
// - `register` journals a new or changed registration; `dispatch` journals the accepted action (after reserving
//   seqs ahead, SPEC §15.1); `record` and a full down queue journal a result; `publish` journals a snapshot
//   (before the result it belongs to: SPEC §15.3);
// - the host writes every record staged while handling an event before it writes that event's frames (SPEC
//   §15.2), so no frame reveals a record the operating system does not have.

extension Router {
    /// Refuses a request the journal cannot take now (SPEC §15.2): `disk-full` while space is short,
    /// `journal-failed` after a sync failed.
    func failJournal(_ peer: Peer, _ refusal: JournalRefusal, _ out: inout Output) {
        switch refusal {
        case .diskFull(let why): fail(peer, .diskFull, "fluxd's journal cannot take new work: \(why)", &out)
        case .failed(let why): fail(peer, .journalFailed, "fluxd's journal failed: \(why)", &out)
        }
    }

    /// Journals the reservation of the seqs the next dispatches take (a block of `seqBlock`, as the first
    /// dispatch would), so that the host can make it durable before it serves anyone. Returns whether it did.
    public func reserveFirstSeqs() -> Bool {
        guard journaling, let journal, reservedSeq <= lastSeq else { return false }
        reservedSeq = lastSeq + config.seqBlock
        journal.reserveSeq(upTo: reservedSeq)
        return true
    }

    func journalResult(_ action: ActionRecord, store: StoreEntry, _ result: StoreResult, version: UInt64) {
        guard journaling else { return }
        // (A result fluxd gave, `unavailable`, is the dispatcher's work; a store's answer is its owner's.)
        let uid: UInt32
        if case .unavailable = result { uid = action.dispatcher.account.uid } else { uid = store.payerUID }
        journal!.result(seq: action.seq, store: store.journalName, outcome: result.journaled, version: version, uid: uid)
    }

    /// Whether `peer`'s user holds its share of the journal's disk (SPEC §15.2).
    func overDiskShare(_ peer: Peer) -> Bool { journaling && journal!.isOverDiskShare(peer.account.uid) }

    /// Refuses new work of a user over its disk share with `disk-quota` (the connection survives).
    func failDiskQuota(_ peer: Peer, _ what: String, _ out: inout Output) {
        let uid = peer.account.uid
        fail(peer, .diskQuota, "uid \(uid) holds \(journal!.diskUse(of: uid)) bytes of fluxd's journal, its share (--disk-per-user \(journal!.diskPerUser)); \(what). Its share frees as the journal is checkpointed", &out)
    }

    /// A store whose owner is over its disk share sent a state outside an action (new work): closed with
    /// `disk-quota`.
    func failStoreOverDiskShare(_ peer: Peer, _ store: StoreEntry, _ out: inout Output) {
        let uid = peer.account.uid
        out.log(.warning, "store \"\(store.name)\": uid \(uid) holds its share of the journal's disk; closing its connection")
        fail(peer, .diskQuota, "uid \(uid) holds \(journal!.diskUse(of: uid)) bytes of fluxd's journal, its share (--disk-per-user \(journal!.diskPerUser)); the state for store \"\(store.name)\" was not accepted", &out, ref: store.name, fatal: true)
    }

    /// Keeps the outcome of a settled dispatch made under a session, for `recover` (SPEC §15.4).
    func rememberOutcome(_ action: ActionRecord, key: SessionKey) {
        var results: [TargetResult] = []
        results.reserveCapacity(action.targets.count)
        for (i, store) in action.targets.enumerated() {
            results.append(TargetResult(store: store.name, outcome: action.result(at: i)!.journaled,
                                        version: action.version(at: i)))
        }
        rememberOutcome(key, seq: action.seq, results: results)
    }

    /// An unsettled session dispatch, indexed for `recover` and counted in its user's outcome quota. (A second
    /// dispatch with the same id in the session replaces the first in the index: ids are unique within a session,
    /// SPEC §15.4, and `recover` answers for the latest.)
    func indexSession(_ key: SessionKey, _ action: ActionRecord) {
        pendingSessions[key] = action
        pendingSessionCounts[key.uid, default: 0] += 1
    }

    /// The session dispatch settled (its outcome is kept from now on, in the outcome log).
    func unindexSession(_ key: SessionKey, _ action: ActionRecord) {
        if pendingSessions[key] === action { pendingSessions.removeValue(forKey: key) }
        let n = (pendingSessionCounts[key.uid] ?? 1) - 1
        if n > 0 { pendingSessionCounts[key.uid] = n } else { pendingSessionCounts.removeValue(forKey: key.uid) }
    }

    /// Keeps an outcome, charged to its user's share of the memory budget, and returns what the log let go of.
    /// It is always kept (an outcome that was not would later read as never sent); when the user's share has no
    /// room for it, the stores' error objects of more than `keptErrorBytes` in it are kept as their code alone
    /// (SPEC §15.4), so what is charged beyond the share is a few hundred bytes per result.
    func rememberOutcome(_ key: SessionKey, seq: UInt64, results: [TargetResult]) {
        releaseOutcomes(outcomes.expire(now: now))
        let account = outcomeAccount(key.uid)
        var results = results
        var entry = OutcomeLog.Entry(seq: seq, results: results)
        if !memory.charge(account, entry.bytes(key)) {
            for i in results.indices {
                guard case .rejected(let error) = results[i].outcome, error.count > Self.keptErrorBytes else { continue }
                let code = (try? Envelope(body: Array(error)))?.string("code").value ?? "rejected"
                var j = JSONBuilder(capacity: 160 + code.utf8.count)
                j.object { o in
                    o.field("code", code)
                    o.field("message", "(the store's error of \(error.count) bytes was not kept: uid \(key.uid)'s memory share was full)")
                }
                results[i].outcome = .rejected(j.bytes[...])
            }
            entry = OutcomeLog.Entry(seq: seq, results: results)
            memory.force(account, entry.bytes(key))
        }
        releaseOutcomes(outcomes.insert(key, seq: seq, results: results, at: now))
    }

    /// The largest store error object an outcome keeps whatever its user's memory share.
    static let keptErrorBytes = 256

    func expireOutcomes() {
        releaseOutcomes(outcomes.expire(now: now))
    }

    private func releaseOutcomes(_ dropped: [OutcomeLog.Dropped]) {
        for d in dropped { memory.release(outcomeAccount(d.uid), d.bytes) }
    }

    /// The account a user's kept outcomes are charged to.
    private func outcomeAccount(_ uid: UInt32) -> MemoryBudget.Account {
        if let a = outcomeAccounts[uid] { return a }
        let a = memory.userAccount(uid: uid)
        outcomeAccounts[uid] = a
        return a
    }

    // MARK: - recover (SPEC §8.12)

    func recover(_ peer: Peer, _ request: RecoverRequest, _ out: inout Output) {
        guard let session = peer.session else {
            return fail(peer, .badMessage, "recover needs a session: say hello with \"session\" (SPEC §15.4)", &out)
        }
        let uid = peer.account.uid
        let sessionText = SessionKey.text(session)
        expireOutcomes()
        // (Each id is one look-up in the unsettled session dispatches and one in the kept outcomes: recover costs
        // what it asks, however much else is unsettled.)
        var j = JSONBuilder(capacity: 64 * request.ids.count)
        var attached = 0
        j.array { list in
            for id in request.ids {
                let key = SessionKey(uid: uid, session: sessionText, id: Array(id.utf8))
                list.object { o in
                    o.field("id", id)
                    if let action = pendingSessions[key] {
                        o.field("status", "pending")
                        o.field("seq", action.seq)
                        if action.dispatcher !== peer { reattach(action, to: peer); attached += 1 }
                    } else if let done = outcomes.outcome(key) {
                        o.field("status", "settled")
                        o.field("seq", done.seq)
                        o.rawField("results", resultsJSON(done.results))
                    } else {
                        o.field("status", "unknown")
                    }
                }
            }
        }
        var b = FrameBuilder(op: "recovered", capacity: j.bytes.count + 64)
        if let id = request.idRaw { b.raw("id", id) }
        b.raw("outcomes", j.bytes)
        out.send(peer, b.finish())
        out.log(.debug, "peer \(peer.id) recovered \(request.ids.count) dispatches (\(attached) pending ones now settle to it)")
    }

    /// The settlement of an unsettled action goes to `peer` from now on (it recovered it).
    private func reattach(_ action: ActionRecord, to peer: Peer) {
        let old = action.dispatcher
        let cost = Router.actionCost(action.payload.count, action.typeJSON.count)
        old.unsettled -= 1
        memory.release(old.account, cost)
        memory.force(peer.account, cost)
        peer.unsettled += 1
        action.dispatcher = peer
    }

    func resultsJSON(_ results: [TargetResult]) -> [UInt8] {
        var j = JSONBuilder(capacity: 48 * results.count)
        j.array { list in
            for r in results { list.object { o in Router.writeResult(r, to: &o) } }
        }
        return j.bytes
    }

    /// The members of one result object, as in `settled` (SPEC §8.3): for `recovered` and `history`.
    public static func writeResult(_ r: TargetResult, to o: inout JSONBuilder) {
        o.field("store", r.store)
        switch r.outcome {
        case .done:
            o.field("status", "done")
            o.field("version", r.version)
        case .rejected(let error):
            o.field("status", "rejected")
            o.rawField("error", error)
        case .unavailable(let code, let message):
            o.field("status", "unavailable")
            o.object("error") { e in
                e.field("code", code)
                e.field("message", message)
            }
        }
    }

    /// The seq of the newest accepted action (0: none yet; after a restart, the newest journaled one until the
    /// next is accepted: `lastSeq` then stands at the reserved high-water mark).
    public var lastAcceptedSeq: UInt64 { lastSeq == restoredSeqMark ? restoredNewestSeq : lastSeq }

    // MARK: - Checkpoints

    /// The records of a checkpoint: everything a restart needs, as if the journal so far were these records
    /// alone (the seq high-water mark; each registered store's registration, retained snapshot and position; the
    /// unsettled actions with the results they have; the outcomes kept for `recover`). Read in this order by
    /// `JournalState.apply`.
    public func checkpointRecords(_ emit: (JournalRecord, UInt32) -> Void) {
        checkpointCapture().emit(emit)
    }

    /// What a checkpoint holds, taken on the loop thread at little cost (references to immutable frames, trees and
    /// the outcome log's storage, and each unsettled action's results so far), to be encoded and written on
    /// another thread (`CheckpointCapture.emit`): the loop does O(stores + unsettled actions) small copies, never
    /// O(bytes) or a sort of the outcomes.
    ///
    /// `clean`: the checkpoint of a clean stop (`Journal.close`: every record written and synced, so no seq above
    /// `lastSeq` was ever revealed): its seq mark is `lastSeq`, and the next start continues at `lastSeq + 1`
    /// instead of above the reserved block (SPEC §15.1). Otherwise the mark covers the reserved block.
    public func checkpointCapture(clean: Bool = false) -> CheckpointCapture {
        expireOutcomes()
        var c = CheckpointCapture(seqMark: clean ? lastSeq : max(lastSeq, reservedSeq), outcomes: outcomes.snapshot)
        c.versionFloor = versionFloor
        c.stores.reserveCapacity(stores.count)
        for (name, store) in stores {
            guard store.wasRegistered || store.hasRetained else { continue }
            var s = CheckpointCapture.Store(name: name, owner: store.payerUID, registered: store.wasRegistered,
                                            handles: store.handles, waitFor: store.waitFor, version: store.version,
                                            seq: store.seq, snapshotSeq: store.snapshotSeq)
            if let snapshot = store.snapshot {
                s.state = .frame(snapshot, store.stateRange)
            } else if let tree = store.tree {
                s.state = .tree(tree)  // (rendered off the loop: SPEC §16.5)
            }
            s.retainedBy = store.retainedBy?.uid ?? store.payerUID
            c.stores.append(s)
        }
        for store in stores.values {
            for d in store.inflight { c.capture(d.action) }
            for d in store.queue { c.capture(d.action) }
        }
        return c
    }

    // MARK: - Restoring (SPEC §15.1)

    /// SPEC §16: the patches journaled after a store's snapshot, applied again (they applied when they were
    /// accepted), and kept for subscribers that resume. A patch that no longer applies (a damaged journal would
    /// have been refused before: this is a defect) stops there, at the version before it, and is logged.
    private func restorePatches(_ store: StoreEntry, _ s: JournalState.Store, owner: MemoryBudget.Account) {
        guard !s.patches.isEmpty, let snap = s.snapshot, let snapshot = store.snapshot else { return }
        var tree = JSONTree(scanned: withExtendedLifetime(snapshot) { Array(snapshot.bytes[store.stateRange]) }[...])
        store.version = snap.version
        for p in s.patches {
            // (Each patch costs O(its operations · log n): restoring is linear in the journal.)
            var steps = 0
            defer { patchSteps &+= UInt64(steps) }
            guard let patch = try? JSONPatch(parsing: p.patch), (try? tree.apply(patch, steps: &steps)) != nil else {
                restoreProblems.append("store \"\(store.name)\": the journaled patch making version \(p.version) does not apply; its state stays at version \(store.version)")
                break
            }
            store.version = p.version
            store.snapshotSeq = p.seq
            rememberPatch(store, seq: p.seq, p.patch)
        }
        store.tree = tree
        store.snapshot = nil
        memory.release(owner, store.retainedCost)
        store.retainedCost = treeCost(store, bytes: tree.byteCount)
        memory.force(owner, store.retainedCost)
    }

    /// Takes over what a journal recovered, before any peer connects: seqs continue above every seq that may have
    /// been revealed; stores are known again (registered ones down, with their patterns, waitFor, versions and
    /// retained snapshots); every action not final for some target is queued again for it, marked redelivered,
    /// its `queueTimeout` counted from now; the outcomes of settled session dispatches are kept for `recover`.
    public func restore(from state: JournalState, now: Millis) {
        precondition(peers.isEmpty && lastSeq == 0, "restore runs before anything else")
        self.now = now
        lastSeq = state.nextSeq - 1
        reservedSeq = lastSeq  // the next dispatch reserves a new block above it
        restoredSeqMark = lastSeq
        restoredNewestSeq = state.lastSeq
        let owner = memory.userAccount(uid: UInt32.max)  // restored state is charged to no connection
        versionFloor = state.versionFloor  // (before any entry is made: each starts above it)
        for name in state.stores.keys.sorted() {
            let s = state.stores[name]!
            let store = entry(name)
            if s.registered { routes.reindex(store, old: [], new: s.handles) }
            store.handles = s.handles
            store.waitFor = s.waitFor
            store.wasRegistered = s.registered
            store.status = s.registered ? .down : .unknown
            store.version = s.version
            store.seq = s.seq
            if let snap = s.snapshot {
                var b = FrameBuilder(op: "snapshot", capacity: 64 + store.nameJSON.count + snap.state.count)
                b.raw("store", store.nameJSON)
                b.int("version", snap.version)
                b.int("seq", snap.seq)
                b.key("state")
                let stateStart = b.byteCount
                b.rawBytes(snap.state)
                store.snapshot = b.finish(coalescing: .newestWins(key: store.key))
                store.stateRange = stateStart..<(stateStart + snap.state.count)
                store.snapshotSeq = snap.seq
                store.retainedBy = owner
                store.retainedCost = 96 + store.nameJSON.count + snap.state.count
                memory.force(owner, store.retainedCost)
                restorePatches(store, s, owner: owner)
            }
        }
        routes.invalidate()
        let stand = Peer(id: 0, creds: PeerCredentials(), connectedAt: now, account: owner)
        stand.closing = true
        for seq in state.pending.keys.sorted() {
            let p = state.pending[seq]!
            let a = p.action
            let targets = a.targets.compactMap { stores[$0] }
            guard targets.count == a.targets.count else { continue }
            let action = ActionRecord(
                seq: a.seq, typeJSON: ArraySlice(Array(a.typeJSON)), origin: a.origin,
                cause: a.cause.map { Int64($0) }, payload: ArraySlice(Array(a.payload)), dispatcher: stand,
                id: a.id.map { ArraySlice(Array($0)) }, targets: targets)
            let dispatcher = a.session == nil ? stand : Peer(id: 0, creds: PeerCredentials(uid: a.uid), connectedAt: now,
                                                            account: memory.userAccount(uid: a.uid))
            dispatcher.closing = true
            if let s = a.session { dispatcher.session = ArraySlice(Array(s)) }
            action.dispatcher = dispatcher
            pendingCount += 1
            dispatcher.unsettled += 1
            if let s = a.session, let id = a.id {
                indexSession(SessionKey(uid: a.uid, sessionJSON: ArraySlice(s), idJSON: ArraySlice(id)), action)
            }
            memory.force(dispatcher.account, Router.actionCost(action.payload.count, action.typeJSON.count))
            for (i, store) in targets.enumerated() {
                if let r = p.results[store.name] {
                    action.setResult(at: i, StoreResult(r.outcome), version: r.version)
                } else {
                    // (Latency of a restored action counts from the restart: its first acceptance was another run's.)
                    var d = Delivery(action: action, deadline: now + config.queueTimeout,
                                     acceptedAt: config.metricsClock?() ?? 0)
                    d.redelivered = true
                    store.queue.append(d)
                    expiringStores.insert(store.name)
                }
            }
        }
        for (key, entry) in state.outcomes.all {
            rememberOutcome(key, seq: entry.seq, results: entry.results)
        }
    }
}

extension StoreResult {
    /// As the journal keeps it.
    var journaled: ResultOutcome {
        switch self {
        case .done: return .done
        case .rejected(let error): return .rejected(error)
        case .unavailable(let code, let message): return .unavailable(code: code.rawValue, message: message)
        }
    }

    init(_ outcome: ResultOutcome) {
        switch outcome {
        case .done: self = .done
        case .rejected(let error): self = .rejected(ArraySlice(Array(error)))
        case .unavailable(let code, let message):
            self = .unavailable(ErrorCode(rawValue: code) ?? .storeUnavailable, message)
        }
    }
}

/// `recover` (SPEC §8.12).
struct RecoverRequest {
    var idRaw: ArraySlice<UInt8>?
    var ids: [String]

    static let maxIDs = 4096

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "recover")
        idRaw = try fields.id(required: false)?.raw
        guard let ids = try fields.names("ids", ref: nil, what: "dispatch ids (strings of 1 to \(Names.maxIDBytes) bytes)", Names.isValidID) else {
            throw .badMessage("recover needs \"ids\": an array of dispatch ids")
        }
        guard ids.count <= Self.maxIDs else {
            throw .badMessage("\"ids\" names \(ids.count) dispatches (at most \(Self.maxIDs) per recover)")
        }
        self.ids = ids
    }
}

/// A checkpoint's content taken on the loop thread (`Router.checkpointCapture`), turned into records on any thread.
/// Sendable: it holds immutable values (frames, trees, copied arrays and the outcome log's copy-on-write storage)
/// and, of each unsettled action, only its `let` fields besides what was copied.
public struct CheckpointCapture: CheckpointContent, @unchecked Sendable {
    enum State {
        case frame(Frame, Range<Int>)
        case tree(JSONTree)
    }

    struct Store {
        var name: String
        var owner: UInt32
        var registered: Bool
        var handles: [String]
        var waitFor: [String]
        var version: UInt64
        var seq: UInt64
        var snapshotSeq: UInt64
        var state: State?
        var retainedBy: UInt32 = .max
    }

    struct Pending {
        let action: ActionRecord  // (only its `let` fields are read off the loop)
        let uid: UInt32
        let session: ArraySlice<UInt8>?
        let results: [(index: Int, outcome: ResultOutcome, version: UInt64)]
    }

    let seqMark: UInt64
    let outcomes: OutcomeLog.Snapshot
    /// SPEC §10: the version floor of forgotten stores (kept as a forget record of no store).
    var versionFloor: UInt64 = 0
    var stores: [Store] = []
    var pending: [Pending] = []
    private var seen: Set<UInt64> = []

    init(seqMark: UInt64, outcomes: OutcomeLog.Snapshot) {
        self.seqMark = seqMark
        self.outcomes = outcomes
    }

    /// An unsettled action (once, though several stores queue it).
    mutating func capture(_ action: ActionRecord) {
        guard seen.insert(action.seq).inserted else { return }
        var results: [(index: Int, outcome: ResultOutcome, version: UInt64)] = []
        for i in action.targets.indices {
            if let r = action.result(at: i) { results.append((i, r.journaled, action.version(at: i))) }
        }
        pending.append(Pending(action: action, uid: action.dispatcher.account.uid, session: action.session,
                               results: results))
    }

    /// The checkpoint's records, each with the user it is charged to, in the order `JournalState.apply` reads them.
    public func emit(_ emit: (JournalRecord, UInt32) -> Void) {
        emit(.seqReserve(seqMark), .max)
        if versionFloor > 0 { emit(.forget(store: "", seq: seqMark, versionFloor: versionFloor), .max) }
        for s in stores.sorted(by: { $0.name < $1.name }) {
            if s.registered { emit(.register(store: s.name, handles: s.handles, waitFor: s.waitFor), s.owner) }
            switch s.state {
            case .frame(let frame, let range)?:
                let state = withExtendedLifetime(frame) { ArraySlice(Array(frame.bytes[range])) }
                emit(.snapshot(store: s.name, version: s.version, seq: s.snapshotSeq, state: state), s.retainedBy)
            case .tree(let tree)?:
                emit(.snapshot(store: s.name, version: s.version, seq: s.snapshotSeq, state: tree.compactBytes[...]), s.retainedBy)
            case nil:
                break
            }
            emit(.storePosition(store: s.name, version: s.version, seq: s.seq), s.owner)
        }
        for p in pending.sorted(by: { $0.action.seq < $1.action.seq }) {
            let action = p.action
            emit(.action(ActionEntry(
                seq: action.seq, time: 0, typeJSON: action.typeJSON, origin: action.origin,
                cause: action.cause.map { UInt64($0) }, id: action.id, session: p.session,
                uid: p.session == nil ? 0 : p.uid, payload: action.payload,
                targets: action.targets.map(\.name))), p.uid)
            for r in p.results {
                emit(.result(seq: action.seq, store: action.targets[r.index].name, outcome: r.outcome, version: r.version), p.uid)
            }
        }
        for (key, entry) in outcomes.all {
            emit(.outcome(uid: key.uid, session: key.session, id: key.id, seq: entry.seq, results: entry.results), key.uid)
        }
    }
}
