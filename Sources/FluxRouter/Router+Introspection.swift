import FluxCore

// Introspection (SPEC §8.7): ping, get, info.
extension Router {
    // MARK: - Introspection and liveness

    func ping(_ peer: Peer, _ request: IdentifiedRequest, _ out: inout Output) {
        var b = FrameBuilder(op: "pong")
        if let id = request.idRaw { b.raw("id", id) }
        let pong = b.finish()
        guard peer.hostOutstanding > 0 else { return out.send(peer, pong) }
        // A host request before it is not answered yet: its `pong` waits for that answer (SPEC §8.7), charged to
        // the peer while it waits.
        guard memory.charge(peer.account, Self.heldPongCost(pong)) else {
            return fail(peer, .memoryBudget, "no room in fluxd's memory budget to hold this pong until the host operations before it are answered", &out, ref: request.idRaw.map { decodeJSONString($0) })
        }
        peer.heldPongs.append(pong)
    }

    static func heldPongCost(_ pong: Frame) -> Int { 48 + pong.bytes.count }

    /// Hands `request` to the host (fluxd's supervisor or journal reader), counting it until it is answered.
    func askHost(_ peer: Peer, _ request: HostRequest, _ out: inout Output) {
        peer.hostOutstanding += 1
        out.append(.host(peer.id, request))
    }

    /// A host request of `peer` was answered: the pongs held for it go once none is left.
    func hostAnswered(_ peer: Peer, _ out: inout Output) {
        peer.hostOutstanding = max(0, peer.hostOutstanding - 1)
        guard peer.hostOutstanding == 0, !peer.heldPongs.isEmpty else { return }
        let pongs = peer.heldPongs
        peer.heldPongs = []
        for pong in pongs {
            memory.release(peer.account, Self.heldPongCost(pong))
            if !peer.closing { out.send(peer, pong) }
        }
    }

    func get(_ peer: Peer, _ request: GetRequest, _ out: inout Output) {
        let name = request.store
        guard let store = stores[name], let snapshot = retainedSnapshot(store) else {
            return fail(peer, .unknownStore, "no snapshot is retained for store \"\(name)\"", &out, ref: request.id ?? name)
        }
        var b = FrameBuilder(op: "got", capacity: snapshot.bytes.count + 64)
        if let id = request.idRaw { b.raw("id", id) }
        b.string("store", name)
        b.int("version", store.version)
        b.int("seq", store.snapshotSeq)
        b.raw("state", snapshot.bytes[store.stateRange])
        out.send(peer, b.finish())
    }

    /// Every store entry, sorted by name.
    func storesByName() -> [StoreEntry] {
        if let cached = storesByNameCache { return cached }
        let sorted = stores.values.sorted { $0.name < $1.name }
        storesByNameCache = sorted
        return sorted
    }

    /// Registered stores above which `info` encodes its `stores` list off the loop (`Preparation.Work.info`): on a
    /// bus of 12,400 stores encoding it held the loop 6-11 ms; copying the rows out takes a tenth of that.
    static let infoStoresOffLoopAbove = 1024

    /// `info` (SPEC §8.7): the registered stores, peers by role, counters, the memory budget and the load. The
    /// `stores` list of a bus of many stores is encoded off the loop: the rows are copied as they are now, the
    /// peer's frames wait (in order, like behind a large patch) and the reply is sent once it is encoded, with the
    /// other sections as they are then.
    func info(_ peer: Peer, _ request: IdentifiedRequest, _ out: inout Output) {
        let storesJSON: [UInt8]
        if let work = preparedWork, work.peer === peer, case .info(let bytes) = work.outcome {
            storesJSON = bytes
            memory.release(peer.account, peer.infoRowsCharge)
            peer.infoRowsCharge = 0
        } else {
            let rows = infoRows()
            if rows.count > Self.infoStoresOffLoopAbove, let body = currentBody {
                // The rows (and the list made from them) are the asker's while they are encoded: charged to it,
                // so peers that each ask cannot hold unaccounted copies of a large bus.
                let charge = InfoRow.estimatedBytes(rows)
                guard memory.charge(peer.account, charge) else {
                    return fail(peer, .memoryBudget, "no room in fluxd's memory budget to list \(rows.count) stores for this info (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)", &out, ref: request.idRaw.map { decodeJSONString($0) })
                }
                peer.infoRowsCharge = charge
                return prepare(peer, store: nil, .info(rows), holding: body, &out)
            }
            storesJSON = InfoRow.encode(rows)
        }
        infoReply(peer, request, storesJSON: storesJSON, &out)
    }

    /// Each registered store's `info` row, by name.
    func infoRows() -> [InfoRow] {
        var rows: [InfoRow] = []
        let all = storesByName()
        rows.reserveCapacity(all.count)
        for s in all where s.wasRegistered {  // a name only subscribed to or queried is no store (yet)
            var owner: InfoRow.Owner?
            if let id = s.owner, let p = peers[id] {
                owner = InfoRow.Owner(peer: p.id, name: p.name, pid: p.creds.pid, uid: p.creds.uid)
            }
            rows.append(InfoRow(
                nameJSON: s.nameJSON, status: s.status, handles: s.handles, waitFor: s.waitFor, version: s.version,
                seq: s.seq, subscribers: s.subscribers.count + s.deltaSubscribers.count + s.pathSubscribers.count,
                queued: s.queue.count, inflight: s.inflight.count, queries: s.queryOrder.count,
                stalledFor: s.stalled ? now - s.lastProgress : nil, owner: owner))
        }
        return rows
    }

    func infoReply(_ peer: Peer, _ request: IdentifiedRequest, storesJSON: [UInt8], _ out: inout Output) {
        var roles = [Role.client: 0, .store: 0, .monitor: 0]
        for p in peers.values { if let r = p.role { roles[r, default: 0] += 1 } }
        var current = counters
        current.traffic.add(out.traffic)  // this event's traffic so far is not in `counters` yet
        func json(_ body: (inout JSONBuilder) -> Void) -> [UInt8] {
            var j = JSONBuilder(capacity: 256)
            j.object(body)
            return j.bytes
        }
        let peersJSON = json { p in
            for role in Role.allCases { p.field(named: role.rawValue, roles[role]!) }
        }
        let countersJSON = json { c in current.write(to: &c) }
        let memoryJSON = json { m in
            m.field("used", memory.used)
            m.field("peak", memory.peak)
            m.field("limit", config.memory.total)
            m.field("perUser", config.memory.perUser)
            m.field("connectionAllowance", config.memory.connectionAllowance)
            m.field("refusals", memory.refusals)
            m.array("users") { users in
                for uid in memory.byUser.keys.sorted() {
                    users.object { u in
                        if uid == UInt32.max { u.nullField("uid") } else { u.field("uid", uid) }
                        u.field("bytes", memory.byUser[uid] ?? 0)
                        u.field("connections", connectionsByUser[uid] ?? 0)
                    }
                }
            }
        }
        let loadJSON = json { l in
            l.field("connections", peers.count)
            l.field("handshakes", handshakes.count)
            l.field("storeNames", self.stores.count)
            l.field("longestLoopHoldMicros", longestLoopHold)
            if !longestLoopHoldAt.isEmpty { l.field("longestLoopHoldAt", longestLoopHoldAt) }
            l.field("maxCycleCheckSteps", maxCycleCheckSteps)
            l.field("patchSteps", Int(clamping: patchSteps))
            l.field("pathMatchSteps", Int(clamping: pathSteps))
            l.field("statesParsed", Int(clamping: statesParsed))
            l.field("preparations", Int(clamping: preparationsStarted))
            l.object("acceptErrors") { a in
                for name in acceptErrors.keys.sorted() { a.field(named: name, acceptErrors[name]!) }
            }
        }
        var b = FrameBuilder(op: "info", capacity: storesJSON.count + 1024)
        if let id = request.idRaw { b.raw("id", id) }
        b.int("seq", lastAcceptedSeq)  // (after a restart, the newest journaled action, not the reserved block's edge)
        b.raw("stores", storesJSON)
        b.raw("peers", peersJSON)
        b.raw("counters", countersJSON)
        b.raw("memory", memoryJSON)
        b.raw("load", loadJSON)
        if journaling, let journal {
            // The journal's disk shares (SPEC §15.2): the share and what each user with memory accounted holds.
            var d = JSONBuilder(capacity: 64 + 40 * memory.byUser.count)
            d.object { o in
                o.field("perUser", journal.diskPerUser)
                o.array("users") { list in
                    for uid in memory.byUser.keys.sorted() where uid != UInt32.max {
                        let bytes = journal.diskUse(of: uid)
                        guard bytes > 0 else { continue }
                        list.object { u in
                            u.field("uid", uid)
                            u.field("bytes", bytes)
                        }
                    }
                }
            }
            b.raw("disk", d.bytes)
        }
        out.send(peer, b.finish())
    }

    /// Whose share of the memory budget a store's retained state is charged to, and how much (for tests and the
    /// fuzz target's model of the budget: a patched state's charge follows when fluxd last measured it, SPEC §16.5).
    public func retainedCharge(of name: String) -> (uid: UInt32, bytes: Int)? {
        guard let store = stores[name], let account = store.retainedBy else { return nil }
        return (account.uid, store.retainedCost)
    }

    /// The retained state of the store `name` as fluxd would send it (rendered from its tree if a patch made it),
    /// and its version; nil when none is retained (for tests and the fuzz target's restart check).
    public func retainedState(of name: String) -> (version: UInt64, state: [UInt8])? {
        guard let store = stores[name], let frame = retainedSnapshot(store) else { return nil }
        return (store.version, withExtendedLifetime(frame) { Array(frame.bytes[store.stateRange]) })
    }

    /// The charge of the patches kept for resuming subscribers of the store `name` (SPEC §16.5): whose, how many
    /// bytes in all, and how many patches of how many bytes; nil when it keeps none.
    public func historyCharge(of name: String) -> (uid: UInt32, bytes: Int, patches: Int, patchBytes: Int)? {
        guard let store = stores[name], let account = store.historyBy else { return nil }
        return (account.uid, store.historyCost, store.recentPatches.count, store.recentPatchBytes)
    }
}

/// One store's row of `info.stores` (SPEC §8.7), copied out of the router so that the list can be encoded on
/// another thread.
public struct InfoRow: Sendable {
    struct Owner: Sendable {
        let peer: PeerID
        let name: String
        let pid: Int32?
        let uid: UInt32?
    }

    let nameJSON: [UInt8]
    let status: StoreStatus
    let handles: [String]
    let waitFor: [String]
    let version: UInt64
    let seq: UInt64
    let subscribers: Int
    let queued: Int
    let inflight: Int
    let queries: Int
    /// How long the store has been stalled; nil when it is not.
    let stalledFor: Millis?
    let owner: Owner?

    /// About what `rows` and the list encoded from them take: a row's fields and its share of the encoded list
    /// (its name twice, its patterns, ~200 bytes of the rest).
    static func estimatedBytes(_ rows: [InfoRow]) -> Int {
        rows.reduce(0) { total, row in
            total + 256 + 2 * row.nameJSON.count + row.handles.reduce(0) { $0 + 2 * $1.utf8.count + 16 }
                + row.waitFor.reduce(0) { $0 + 2 * $1.utf8.count + 16 }
        }
    }

    /// The `stores` array.
    static func encode(_ rows: [InfoRow]) -> [UInt8] {
        var j = JSONBuilder(capacity: 64 + 200 * rows.count)
        j.array { list in
            for s in rows {
                list.object { o in
                    o.rawField("name", s.nameJSON)
                    o.field("status", s.status.rawValue)
                    o.field("handles", strings: s.handles)
                    o.field("waitFor", strings: s.waitFor)
                    o.field("version", s.version)
                    o.field("seq", s.seq)
                    o.field("subscribers", s.subscribers)
                    o.field("queued", s.queued)
                    o.field("inflight", s.inflight)
                    o.field("queries", s.queries)
                    if let stalledFor = s.stalledFor {
                        o.field("stalled", true)
                        o.field("stalledFor", stalledFor)
                    }
                    if let w = s.owner {
                        o.object("owner") { owner in
                            owner.field("peer", w.peer)
                            owner.field("name", w.name)
                            if let pid = w.pid { owner.field("pid", pid) }
                            if let uid = w.uid { owner.field("uid", uid) }
                        }
                    }
                }
            }
        }
        return j.bytes
    }
}
