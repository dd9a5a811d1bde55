import FluxCore

// SPEC §10, forgetting a store that is down for good (`fluxctl forget`): its queue given up, its subscribers told,
// what it kept let go with its charges, journaled; the version floor that keeps a later store of the name apart.
extension Router {
    /// SPEC §10, `forget`: a store that is down is forgotten for good. Its queued actions are given up
    /// (`store-unavailable`), its subscribers told (`store-down`, reason `forgotten`) and kept subscribed to the
    /// name, its retained state, recent patches, routes and registration let go with their memory charges; the
    /// version floor rises to its last version, so a store of the name made later starts above every version a
    /// subscriber may hold. Journaled: a restart does not bring it back. Work: one step per queued action (each
    /// paid for by its dispatcher) and per subscriber.
    func forget(_ peer: Peer, _ request: ForgetRequest, now: Millis, _ out: inout Output) {
        let name = request.store
        guard let store = stores[name], store.wasRegistered else {
            return fail(peer, .unknownStore, "no store \"\(name)\" was registered: there is nothing to forget", &out, ref: request.id)
        }
        if let owner = store.ownerPeer {
            return fail(peer, .storeIsUp, "store \"\(name)\" is up (owned by peer \(owner.id), \(owner.name)): only a store that is down can be forgotten", &out, ref: request.id)
        }
        if journaling, case .failed(let why)? = journal!.refusal {
            return fail(peer, .journalFailed, "fluxd's journal failed: \(why)", &out, ref: request.id)
        }
        // Its queued actions (a down store has none in flight) are given up, in seq order.
        let queued = store.queue
        store.queue.removeAll()
        expiringStores.remove(name)
        for d in queued {
            record(d.action, store: store, result: .unavailable(.storeUnavailable, "store \"\(name)\" was forgotten"), &out)
        }
        versionFloor = max(versionFloor, store.version, store.versionBase)
        if journaling { journal!.forget(store: name, seq: lastSeq, versionFloor: versionFloor, uid: peer.account.uid) }
        // What it kept, with the memory charged for it.
        forgetHistory(store)
        dropPathTree(store)
        if let tree = store.tree { discard(tree) }
        store.tree = nil
        store.snapshot = nil
        store.stateRange = 0..<0
        if let account = store.retainedBy { memory.release(account, store.retainedCost) }
        store.retainedBy = nil
        store.retainedCost = 0
        store.lastTreePayer = nil
        if let account = store.registeredBy { memory.release(account, store.registrationCost) }
        store.registeredBy = nil
        store.registrationCost = 0
        routes.reindex(store, old: store.handles, new: [])
        routes.invalidate()
        store.handles = []
        store.waitFor = []
        store.wasRegistered = false
        store.status = .unknown
        store.version = 0
        store.seq = 0
        store.snapshotSeq = 0
        store.versionBase = versionFloor
        store.queryDeltas = false
        store.stats = StoreStats()
        var b = FrameBuilder(op: "store-down")
        b.string("store", name)
        b.constant("reason", "forgotten")
        let frame = b.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribedPeers { out.send(sub, frame) }
        observeStoreDown(store, reason: "forgotten", &out)
        var reply = FrameBuilder(op: "forgotten")
        reply.raw("id", request.idRaw)
        reply.string("store", name)
        reply.int("gaveUp", queued.count)
        out.send(peer, reply.finish())
        out.log(.notice, "store \"\(name)\" forgotten by peer \(peer.id) (\(peer.name)); \(queued.count) queued action\(queued.count == 1 ? "" : "s") given up")
        forgetIfUnused(store)
    }
}
