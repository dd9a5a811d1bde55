import DequeModule
import FluxCore
import FluxJournal
import FluxJSONValue

// SPEC §16: changes published as patches, delta subscribers, path subscribers, and the retained state that
// patches keep as a tree (rendered only when a frame needs the whole state).
//
// What each kind of subscriber is sent for a new version (the one place that says it):
// - full subscribers: the `snapshot` frame (rendered from the tree when the change came as a patch only);
// - delta subscribers: a `delta` made of the store's patch bytes when the change came with a patch, the
//   subscriber was sent the version before and its connection is not behind; the `snapshot` frame otherwise;
// - path subscribers: a `subtree` when the change touches their path (by the patch's paths, or, for a whole
//   state, by comparing the value at the path with the one last sent).
extension Router {
    /// What a patch from a store did.
    enum PatchOutcome {
        /// A new version was made.
        case applied
        /// An empty patch: nothing changed, no version.
        case empty
        /// The patch does not apply (SPEC §16.2: `patch-failed`, the store's connection is closed).
        case failed(String)
        /// The patched state does not fit the memory budget (what did not fit, for the error message).
        case overBudget(String)
    }

    /// How many times the rendered bytes of a state its tree is charged as (SPEC §16.5: the tree is charged to the
    /// memory budget like the retained snapshot, and its rendering is kept beside it once a frame needed it): the
    /// tree takes 6.7-6.8 bytes of heap per rendered byte for the todo state (small objects of short strings and
    /// numbers; `JSONTreeMemoryTests` holds it below 7), plus 1 for the rendering.
    static let treeOverhead = 8

    /// The largest state a tree may render to: a checkpoint writes each retained state as one journal record
    /// (SPEC §16.5), so a patch that would make a larger one is refused before it is accepted.
    static let maxTreeBytes = maxRecordBytes - (1 << 16)

    /// What a retained state kept as a tree of `bytes` rendered bytes is charged.
    func treeCost(_ store: StoreEntry, bytes: Int) -> Int {
        96 + store.nameJSON.count + Router.treeOverhead * bytes
    }

    // MARK: - The retained state

    /// The retained snapshot frame, rendered from the tree if a patch made it newer (cached until the next change).
    /// Its charge does not change: the tree's is by its rendered size already (`treeCost`).
    func retainedSnapshot(_ store: StoreEntry) -> Frame? {
        if let snapshot = store.snapshot { return snapshot }
        guard let tree = store.tree else { return nil }
        let state = tree.compactBytes
        store.snapshot = snapshotFrame(store, seq: store.snapshotSeq, state: state[...])
        return store.snapshot
    }

    /// Builds the `snapshot` frame of the store's current version and records where its state sits.
    func snapshotFrame(_ store: StoreEntry, seq: UInt64, state: ArraySlice<UInt8>) -> Frame {
        var b = FrameBuilder(op: "snapshot", capacity: 64 + store.nameJSON.count + state.count)
        b.raw("store", store.nameJSON)
        b.int("version", store.version)
        b.int("seq", seq)
        b.key("state")
        let stateStart = b.byteCount
        b.rawBytes(state)
        store.stateRange = stateStart..<(stateStart + state.count)
        // A subscriber that cannot keep up is sent only the newest of its unwritten snapshots of this store.
        return b.finish(coalescing: .newestWins(key: store.key))
    }

    /// The retained state as the publisher's tree, kept: the tree a patch made, or the retained bytes parsed once
    /// and kept for the next patches, charged at `treeCost` to the state's account. Nil when nothing is retained,
    /// or when that account has no room to keep the tree.
    func keptTree(_ store: StoreEntry) -> JSONTree? {
        if store.treePayer != nil { dropPathTree(store) }  // (parsed for path subscribers: the publisher's now)
        if let tree = store.tree { return tree }
        guard let snapshot = store.snapshot else { return nil }
        let tree = preparedParse(store, bytes: store.stateRange.count)
            ?? JSONTree(scanned: withExtendedLifetime(snapshot) { Array(snapshot.bytes[store.stateRange]) }[...])
        statesParsed += 1
        guard chargeRetained(store, treeCost(store, bytes: tree.byteCount)) else { return nil }
        store.tree = tree
        return tree
    }

    /// The retained state as a tree for path subscriptions: the kept one, or the retained bytes parsed once (off
    /// the loop when large: `preparesParse`) and kept for every later path subscription and change, charged at
    /// `treeCost` to `payer`, a path subscriber of the store (SPEC §16.5: a path subscription's cost is its
    /// subscriber's, never the publisher's). Nil when the payer's account has no room.
    func pathTree(_ store: StoreEntry, payer: Peer) -> JSONTree? {
        if let tree = store.tree { return tree }
        guard let snapshot = store.snapshot else { return nil }
        let tree = preparedParse(store, bytes: store.stateRange.count)
            ?? JSONTree(scanned: withExtendedLifetime(snapshot) { Array(snapshot.bytes[store.stateRange]) }[...])
        statesParsed += 1
        let cost = treeCost(store, bytes: tree.byteCount)
        guard memory.charge(payer.account, cost) else { return nil }
        store.tree = tree
        store.treePayer = payer
        store.treePayerCost = cost
        return tree
    }

    /// Lets go of a tree kept for path subscriptions, and of its charge.
    func dropPathTree(_ store: StoreEntry) {
        guard let payer = store.treePayer else { return }
        memory.release(payer.account, store.treePayerCost)
        store.treePayer = nil
        store.treePayerCost = 0
        if let tree = store.tree { discard(tree) }
        store.tree = nil
    }

    /// `peer` no longer subscribes to paths of `store`: if it paid for the store's kept tree, another path
    /// subscriber takes the charge over when it has room, else the tree is let go (parsed again when needed).
    func pathSubscriberLeft(_ peer: Peer, _ store: StoreEntry) {
        guard store.treePayer === peer else { return }
        let cost = store.treePayerCost
        memory.release(peer.account, cost)
        store.treePayer = nil
        store.treePayerCost = 0
        for sub in store.pathSubscribers.all where sub.peer !== peer && !sub.peer.closing {
            if memory.charge(sub.peer.account, cost) {
                store.treePayer = sub.peer
                store.treePayerCost = cost
                return
            }
        }
        if let tree = store.tree { discard(tree) }
        store.tree = nil
    }

    // MARK: - Publishing a patch

    /// SPEC §16.2: a store's patch (from `done` or the `patch` op), applied to the retained state; a new version
    /// goes to every kind of subscriber. Costs O(operations · log n) (`JSONTree.apply`), and the result's size is
    /// checked after every operation against what the store's account may still hold: a patch that would not fit
    /// (a `copy` doubling the state, say) is refused at that operation, before anything of it is kept.
    func publishPatch(_ store: StoreEntry, patch: ArraySlice<UInt8>, base: UInt64?, seq: UInt64,
                      _ out: inout Output) -> PatchOutcome {
        guard store.hasRetained else { return .failed("store \"\(store.name)\" has no retained state to patch") }
        if let base, base != store.version {
            return .failed("the patch applies to version \(base), the retained state of \"\(store.name)\" is version \(store.version)")
        }
        guard let limit = patchLimit(store) else {
            return .overBudget("the parsed state of \(store.stateRange.count) bytes")
        }
        // As it is now: a patch that fails or does not fit leaves the store as it was, its charge included.
        let hadTree = store.tree != nil
        let before = (account: store.retainedBy, cost: store.retainedCost)
        func putBack(_ old: JSONTree?) {
            store.tree = hadTree ? old : nil
            restoreCharge(store, before)
        }
        let tree: JSONTree
        let applied: [JSONPatchOperation]
        let prepared = store.ownerPeer.flatMap { preparedFor($0, store) }
        if prepared != nil, store.treePayer != nil { dropPathTree(store) }  // (the patched tree is the publisher's)
        switch prepared {
        // Applied off the loop (`Router+Preparation.swift`) to this very state:
        case .patched(let result, let operations, let steps, let parsedState):
            if parsedState { statesParsed += 1 }
            patchSteps &+= UInt64(steps)
            (tree, applied) = (result, operations)
        case .patchFailed(let error, let parsedState):
            if parsedState { statesParsed += 1 }
            return patchRefusal(store, error, limit: limit)
        case .invalidPatch(let error):
            return .failed("patch for \"\(store.name)\": \(error)")
        case .empty:
            return .empty
        default:
            let operations: JSONPatch
            // (A field of a frame fluxd scanned whole: read straight from the bytes.)
            do { operations = try JSONPatch(scanned: patch) } catch { return .failed("patch for \"\(store.name)\": \(error)") }
            if operations.isEmpty { return .empty }
            guard let old = keptTree(store) else {
                putBack(nil)
                return .overBudget("the parsed state of \(store.stateRange.count) bytes")
            }
            var changed = old
            store.tree = nil  // (the old root is kept in `old`; the patch copies only the nodes on its paths)
            var steps = 0
            do {
                applied = try changed.apply(operations, limits: TreePatchLimits(maxBytes: limit), steps: &steps)
            } catch {
                putBack(old)  // as it was: a patch applies whole or not at all, and nothing of it is kept (SPEC §16.2)
                return patchRefusal(store, error, limit: limit)
            }
            patchSteps &+= UInt64(steps)
            store.tree = old
            tree = changed
        }
        guard chargeRetained(store, treeCost(store, bytes: tree.byteCount)) else {
            putBack(store.tree)
            return .overBudget("a state of \(tree.byteCount) bytes")
        }
        if let previous = store.tree { discard(previous) }  // (its nodes that the new version does not share)
        store.tree = tree
        store.snapshot = nil
        store.version = store.nextVersion
        store.snapshotSeq = seq
        if journaling { journal!.patch(store: store.journalName, version: store.version, seq: seq, patch: patch, uid: store.payerUID) }
        rememberPatch(store, seq: seq, patch)
        out.traffic.snapshots += 1
        broadcast(store, seq: seq, patch: patch, operations: applied, &out)
        observeDelta(store, seq: seq, patch: patch, &out)
        return .applied
    }

    /// The largest state (rendered bytes) a patch may make of `store`'s: what its account may still hold, plus
    /// what this state holds now if it is charged to the same account, within `maxTreeBytes`. Nil when no
    /// account can hold it.
    func patchLimit(_ store: StoreEntry) -> Int? {
        guard let account = store.ownerPeer?.account ?? store.retainedBy else { return nil }
        let credit = account === store.retainedBy ? store.retainedCost : 0
        let room = memory.headroom(account) + credit - 96 - store.nameJSON.count
        return min(max(0, room / Router.treeOverhead), Router.maxTreeBytes)
    }

    /// A patch that does not apply, or would make a state larger than `limit`.
    func patchRefusal(_ store: StoreEntry, _ error: JSONPatchError, limit: Int) -> PatchOutcome {
        if error.kind == .tooLarge {
            return .overBudget("patch operation \(error.operation ?? 0) would make a state of more than \(limit) bytes, so")
        }
        return .failed("patch for \"\(store.name)\" does not apply to version \(store.version): \(error)")
    }

    /// Starts applying a patch of `body` off the loop when it is large (`preparationBytes`) and was not prepared
    /// for this state yet; true when it did (the frame is held). Small patches, and patches that fail the cheap
    /// checks (no state, another base), are taken inline.
    func preparesPatch(_ peer: Peer, _ store: StoreEntry, _ body: [UInt8], _ patch: Range<Int>, base: UInt64?,
                       _ out: inout Output) -> Bool {
        guard patch.count >= config.preparationBytes, preparedFor(peer, store) == nil, store.hasRetained,
              base == nil || base == store.version, let limit = patchLimit(store) else { return false }
        let base = store.treePayer == nil ? store.tree : nil  // (a tree parsed for path subscribers is not charged to it)
        let state = base == nil ? retainedStateBytes(store) : nil
        prepare(peer, store: store, .patch(base: base, state: state, body: body, patch: patch, maxBytes: limit),
                holding: body, &out)
        return true
    }

    /// Starts parsing a state off the loop when it is large and a path subscription needs it parsed (an
    /// incoming state that path subscribers will be matched against, or the retained one a new path subscription
    /// reads). True when it did (the frame, `body`, is held).
    func preparesParse(_ peer: Peer, _ store: StoreEntry, _ state: Preparation.StateBytes, body: [UInt8],
                       _ out: inout Output) -> Bool {
        guard state.count >= config.preparationBytes, preparedParse(store, bytes: state.count) == nil else { return false }
        prepare(peer, store: store, .parse(state), holding: body, &out)
        return true
    }

    /// Puts a retained state's charge back where it was (account and size).
    func restoreCharge(_ store: StoreEntry, _ before: (account: MemoryBudget.Account?, cost: Int)) {
        if let account = store.retainedBy { memory.release(account, store.retainedCost) }
        store.retainedBy = before.account
        store.retainedCost = before.cost
        if let account = before.account { memory.force(account, before.cost) }
    }

    /// Charges the retained state's new cost to its publisher (whole states and patched trees alike). False, with
    /// nothing changed, when the budget has no room.
    func chargeRetained(_ store: StoreEntry, _ cost: Int) -> Bool {
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
        return true
    }

    /// Keeps the patch that made the store's current version for resuming subscribers, within `deltaHistory`.
    func rememberPatch(_ store: StoreEntry, seq: UInt64, _ patch: ArraySlice<UInt8>) {
        guard config.deltaHistory > 0, patch.count <= config.deltaHistory else {
            forgetHistory(store)
            return
        }
        if let last = store.recentPatches.last, last.version != store.version - 1 {
            // A whole state came in between: older patches cannot chain to now.
            store.recentPatches.removeAll()
            store.recentPatchBytes = 0
        }
        store.recentPatches.append(RecentPatch(version: store.version, seq: seq, bytes: Array(patch)))
        store.recentPatchBytes += patch.count
        while store.recentPatchBytes > config.deltaHistory, let first = store.recentPatches.popFirst() {
            store.recentPatchBytes -= first.bytes.count
        }
        chargeHistory(store)
    }

    /// Lets go of the kept patches (a whole state made the current version) and of their charge.
    func forgetHistory(_ store: StoreEntry) {
        store.recentPatches.removeAll()
        store.recentPatchBytes = 0
        chargeHistory(store)
    }

    /// Charges the kept patches to the memory budget, to the account that holds the retained state (SPEC §16.5:
    /// they are part of what a store's changes keep in fluxd). They are a convenience for resuming subscribers, so
    /// when that account has no room for them the oldest are let go (a subscriber resuming from before them is
    /// sent the whole state) rather than anything refused.
    func chargeHistory(_ store: StoreEntry) {
        if let held = store.historyBy, held !== store.retainedBy || store.recentPatches.isEmpty {
            memory.release(held, store.historyCost)
            store.historyBy = nil
            store.historyCost = 0
        }
        guard let account = store.retainedBy else {
            store.recentPatches.removeAll()
            store.recentPatchBytes = 0
            return
        }
        while !store.recentPatches.isEmpty {
            let cost = store.recentPatchBytes + RecentPatch.overhead * store.recentPatches.count
            if memory.resize(account, from: store.historyCost, to: cost) {
                store.historyBy = account
                store.historyCost = cost
                return
            }
            let first = store.recentPatches.removeFirst()
            store.recentPatchBytes -= first.bytes.count
        }
        if store.historyBy != nil {
            memory.release(account, store.historyCost)
            store.historyBy = nil
            store.historyCost = 0
        }
    }

    // MARK: - Sending a new version

    /// Sends the store's new version to its subscribers: `patch` is the change as the store wrote it (nil: it came
    /// as a whole state, already in `store.snapshot`), `operations` its operations as applied (an append's `-`
    /// resolved to the index it made; for path subscribers).
    func broadcast(_ store: StoreEntry, seq: UInt64, patch: ArraySlice<UInt8>?, operations: [JSONPatchOperation]?,
                   _ out: inout Output) {
        let version = store.version
        if !store.subscribers.isEmpty, let frame = retainedSnapshot(store) {
            for sub in store.subscribers { out.send(sub, frame) }
        }
        if !store.deltaSubscribers.isEmpty {
            var delta: Frame?
            for sub in store.deltaSubscribers {
                if let patch, version > 1, sub.sent == version - 1, !out.isBehind(sub.peer) {
                    if delta == nil { delta = deltaFrame(store, from: version - 1, version: version, seq: seq, patch: patch) }
                    out.send(sub.peer, delta!)
                } else if let frame = retainedSnapshot(store) {
                    out.send(sub.peer, frame)
                }
                sub.sent = version
            }
        }
        if !store.pathSubscribers.isEmpty { notifyPaths(store, operations: operations, &out) }
    }

    /// A `delta` frame (SPEC §16.3): the patch bytes as the store wrote them. Never replaced, and a fence: a
    /// snapshot of the store queued before it is not replaced by a newer one after it (the delta applies to the
    /// version before it). A subscriber that is behind is sent the snapshot instead.
    func deltaFrame(_ store: StoreEntry, from: UInt64, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>) -> Frame {
        var b = FrameBuilder(op: "delta", capacity: 80 + store.nameJSON.count + patch.count)
        b.raw("store", store.nameJSON)
        b.int("from", from)
        b.int("version", version)
        b.int("seq", seq)
        b.raw("patch", patch)
        return b.finish(coalescing: .fence(key: store.key))
    }

    /// What a (re)subscribing connection is sent after `subscribed` (SPEC §16.3, resume): nothing when it holds
    /// the retained version, the patches since the version it holds when they are kept (delta subscriptions),
    /// else the retained snapshot.
    func resume(_ peer: Peer, _ store: StoreEntry, from: UInt64?, deltas: Bool, _ out: inout Output) {
        guard store.hasRetained else { return }
        if let from, from == store.version { return }
        if deltas, let from, from < store.version, let first = store.recentPatches.first,
           first.version <= from + 1, !out.isBehind(peer) {
            for patch in store.recentPatches where patch.version > from {
                out.send(peer, deltaFrame(store, from: patch.version - 1, version: patch.version, seq: patch.seq,
                                          patch: patch.bytes[...]))
            }
            return
        }
        if let snapshot = retainedSnapshot(store) { out.send(peer, snapshot) }
    }

    // MARK: - Path subscriptions

    /// Sends each path subscriber whose path the change touched the value at its path now: for a patch, the
    /// subscriptions its operations touch, found through the store's `PathIndex` (work proportional to the
    /// operations and what they touch); for a whole state, every subscription whose value changed (one parse of the
    /// state, kept).
    func notifyPaths(_ store: StoreEntry, operations: [JSONPatchOperation]?, _ out: inout Output) {
        let subs = operations.map { store.pathSubscribers.touched(by: $0) } ?? store.pathSubscribers.all
        if operations != nil { pathSteps &+= UInt64(store.pathSubscribers.lastSteps) }
        guard !subs.isEmpty else { return }
        let tree = store.tree ?? wholeStateTree(store, payers: subs)
        for sub in subs {
            let value = tree.flatMap { $0.value(at: sub.tokens) }.map(\.compactBytes)
            if operations == nil, sub.sentAny, value == sub.last { continue }  // a whole state that left it as it was
            sendSubtree(sub, store, value: value, &out)
        }
    }

    /// A new whole state's tree for its path subscribers: kept and charged to one of them (the one that paid for
    /// the previous version's, if it still subscribes), or, when none has room, parsed for this change only (the
    /// change's bytes paid for that parse).
    func wholeStateTree(_ store: StoreEntry, payers subs: [PathSubscription]) -> JSONTree? {
        guard let snapshot = store.snapshot else { return nil }
        let tree = preparedParse(store, bytes: store.stateRange.count)
            ?? JSONTree(scanned: withExtendedLifetime(snapshot) { Array(snapshot.bytes[store.stateRange]) }[...])
        statesParsed += 1
        var candidates: [Peer] = []
        if let previous = store.lastTreePayer, !previous.closing, subs.contains(where: { $0.peer === previous }) {
            candidates.append(previous)
        }
        store.lastTreePayer = nil
        for sub in subs where candidates.count < 4 && !sub.peer.closing && !candidates.contains(where: { $0 === sub.peer }) {
            candidates.append(sub.peer)
        }
        let cost = treeCost(store, bytes: tree.byteCount)
        for payer in candidates where memory.charge(payer.account, cost) {
            store.tree = tree
            store.treePayer = payer
            store.treePayerCost = cost
            break
        }
        return tree
    }

    /// A `subtree` frame to one path subscriber (coalesced per subscription: newest wins).
    func sendSubtree(_ sub: PathSubscription, _ store: StoreEntry, value: [UInt8]?, _ out: inout Output) {
        var b = FrameBuilder(op: "subtree", capacity: 96 + store.nameJSON.count + sub.pathJSON.count + (value?.count ?? 0))
        b.raw("store", store.nameJSON)
        b.raw("path", sub.pathJSON)
        b.int("version", store.version)
        b.int("seq", store.snapshotSeq)
        b.bool("exists", value != nil)
        if let value { b.raw("value", value) }
        out.send(sub.peer, b.finish(coalescing: .newestWins(key: sub.key)))
        sub.last = value
        sub.sentAny = true
    }

    /// SPEC §16.4: whether a patch operation touches the subtree at `path`.
    static func touches(_ operation: JSONPatchOperation, _ path: [String]) -> Bool {
        switch operation {
        case .test: return false
        case .replace(let target, _): return related(target.tokens, path, shifts: false)
        case .copy(_, let target): return related(target.tokens, path, shifts: true)
        case .add(let target, _), .remove(let target): return related(target.tokens, path, shifts: true)
        case .move(let from, let target):
            return related(from.tokens, path, shifts: true) || related(target.tokens, path, shifts: true)
        }
    }

    /// Whether a change at `target` touches `path`: one is a prefix of the other, or (`shifts`: an insertion or
    /// removal) `target` is an index of an array that contains `path` at that index or after it.
    static func related(_ target: [String], _ path: [String], shifts: Bool) -> Bool {
        // (Tokens compared by their bytes, SPEC §3.2: "\u00e9" and "e\u0301" are different members.)
        let common = min(target.count, path.count)
        if target.prefix(common).elementsEqual(path.prefix(common), by: sameKey) { return true }
        guard shifts, target.count <= path.count, target.count > 0 else { return false }
        let k = target.count - 1
        guard target.prefix(k).elementsEqual(path.prefix(k), by: sameKey) else { return false }
        let last = target[k]
        guard let mine = JSONValue.arrayIndex(path[k]) else { return false }
        guard let at = JSONValue.arrayIndex(last) else { return false }  // (`-` was resolved to an index by apply)
        return mine >= at
    }
}
