import DequeModule
import FluxCore

// Subscriptions and queries (SPEC §8.5, §8.6): limits, query sets and their deltas, whole sets per batch.
extension Router {
    // MARK: - Subscriptions and queries

    func subscribe(_ peer: Peer, _ request: StoreRequest, _ out: inout Output) {
        if request.path != nil { return subscribePath(peer, request, &out) }
        let name = request.store
        if !peer.subscriptions.contains(name) {
            guard peer.subscriptionCount < config.maxSubscriptions else {
                return fail(peer, .limitExceeded, "this connection holds \(peer.subscriptionCount) subscriptions (maxSubscriptions \(config.maxSubscriptions))", &out, ref: name)
            }
            guard memory.charge(peer.account, Router.subscriptionCost(name)) else {
                return fail(peer, .memoryBudget, "fluxd's memory budget has no room for another subscription of uid \(peer.account.uid)", &out, ref: name)
            }
            peer.subscriptions.insert(name)
        }
        let store = entry(name)
        // One whole-store subscription per connection and store: a repeated subscribe may switch its kind.
        store.subscribers.removeAll { $0 === peer }
        store.deltaSubscribers.removeAll { $0.peer === peer }
        if request.deltas {
            store.deltaSubscribers.append(DeltaSubscription(peer: peer, sent: store.version))
        } else {
            store.subscribers.append(peer)
        }
        var b = FrameBuilder(op: "subscribed")
        b.string("store", name)
        b.string("status", store.status.rawValue)
        b.int("version", store.version)
        if request.deltas { b.bool("deltas", true) }
        out.send(peer, b.finish(coalescing: .fence(key: store.key)))
        resume(peer, store, from: request.from, deltas: request.deltas, &out)
    }

    /// SPEC §16.4: a path subscription; answered `subscribed` (with the path), then the retained version's subtree.
    private func subscribePath(_ peer: Peer, _ request: StoreRequest, _ out: inout Output) {
        let name = request.store, path = request.path!
        let store = entry(name)
        // The retained state parsed once and kept (SPEC §16.5); a large one is parsed off the loop first.
        if store.tree == nil, let state = retainedStateBytes(store), let body = currentBody,
           preparesParse(peer, store, state, body: body, &out) { return }
        let sub: PathSubscription
        let key = Peer.PathKey(store: name, path: path)
        if let existing = peer.pathSubscriptions[key] {
            sub = existing
        } else {
            guard peer.subscriptionCount < config.maxSubscriptions else {
                return fail(peer, .limitExceeded, "this connection holds \(peer.subscriptionCount) subscriptions (maxSubscriptions \(config.maxSubscriptions))", &out, ref: name)
            }
            peer.nextPathKey &+= 1
            nextPathOrder &+= 1
            sub = PathSubscription(peer: peer, store: name, path: path, tokens: request.tokens,
                                   key: 0x4000_0000 | (peer.nextPathKey & 0x3FFF_FFFF), order: nextPathOrder)
            guard memory.charge(peer.account, Router.subscriptionCost(name) + sub.pathJSON.count) else {
                return fail(peer, .memoryBudget, "fluxd's memory budget has no room for another subscription of uid \(peer.account.uid)", &out, ref: name)
            }
            peer.pathSubscriptions[key] = sub
            store.pathSubscribers.insert(sub)
        }
        var b = FrameBuilder(op: "subscribed")
        b.string("store", name)
        b.string("status", store.status.rawValue)
        b.int("version", store.version)
        b.raw("path", sub.pathJSON)
        out.send(peer, b.finish(coalescing: .fence(key: sub.key)))
        guard store.hasRetained else { return }
        // The state parsed once and kept (SPEC §16.5): a subscribe costs its path, not a parse of the state.
        guard let tree = pathTree(store, payer: peer) else {
            return fail(peer, .memoryBudget, "store \"\(name)\"'s state cannot be kept parsed for this path subscription: uid \(peer.account.uid)'s share of fluxd's memory budget has no room for it (\(treeCost(store, bytes: store.stateRange.count)) bytes)", &out, ref: name)
        }
        sendSubtree(sub, store, value: tree.value(at: sub.tokens)?.compactBytes, &out)
    }

    func unsubscribe(_ peer: Peer, _ request: StoreRequest, _ out: inout Output) {
        let name = request.store
        let store = stores[name]
        var fence = store.map { Coalescing.fence(key: $0.key) } ?? .none
        if let path = request.path {
            if let sub = peer.pathSubscriptions.removeValue(forKey: Peer.PathKey(store: name, path: path)) {
                store?.pathSubscribers.remove(sub)
                memory.release(peer.account, Router.subscriptionCost(name) + sub.pathJSON.count)
                fence = .fence(key: sub.key)
                if let store, store.treePayer === peer, !peer.pathSubscriptions.values.contains(where: { $0.store == name }) {
                    pathSubscriberLeft(peer, store)
                }
            }
        } else if peer.subscriptions.remove(name) != nil {
            store?.subscribers.removeAll { $0 === peer }
            store?.deltaSubscribers.removeAll { $0.peer === peer }
            memory.release(peer.account, Router.subscriptionCost(name))
        }
        var b = FrameBuilder(op: "unsubscribed")
        b.string("store", name)
        if let path = request.path {
            var json: [UInt8] = []
            appendEscaped(path, to: &json)
            b.raw("path", json[...])
        }
        out.send(peer, b.finish(coalescing: fence))
        if let store { forgetIfUnused(store) }
    }

    func query(_ peer: Peer, _ request: QueryRequest, _ out: inout Output) {
        let id = request.id, name = request.store, q = request.query
        guard peer.queries[id] == nil else {
            return fail(peer, .badMessage, "query id \"\(id)\" is already active", &out, ref: id)
        }
        guard peer.queries.count < config.maxQueries else {
            return fail(peer, .limitExceeded, "this connection holds \(peer.queries.count) live queries (maxQueries \(config.maxQueries))", &out, ref: id)
        }
        guard peer.queryBytes + q.count <= config.maxQueryBytes else {
            return fail(peer, .limitExceeded, "this connection's live queries hold \(peer.queryBytes) bytes; \(q.count) more would pass maxQueryBytes \(config.maxQueryBytes)", &out, ref: id)
        }
        let bytes = Array(q)
        guard memory.charge(peer.account, Router.queryCost(bytes)) else {
            return fail(peer, .memoryBudget, "fluxd's memory budget has no room for another query of uid \(peer.account.uid)", &out, ref: id)
        }
        peer.queries[id] = (name, bytes)
        peer.queryBytes += bytes.count
        let store = entry(name)
        var b = FrameBuilder(op: "query-ok")
        b.raw("id", request.idRaw)
        out.send(peer, b.finish())
        queriesChanged(store, [store.addQuery(bytes)], &out)
    }

    func unquery(_ peer: Peer, _ request: UnqueryRequest, _ out: inout Output) {
        let id = request.id
        guard let q = peer.queries.removeValue(forKey: id) else {
            return fail(peer, .badMessage, "no active query \"\(id)\"", &out, ref: id)
        }
        peer.queryBytes -= q.bytes.count
        memory.release(peer.account, Router.queryCost(q.bytes))
        var b = FrameBuilder(op: "unquery-ok")
        b.raw("id", request.idRaw)
        out.send(peer, b.finish())
        if let store = stores[q.store] {
            if let change = store.removeQuery(q.bytes) { queriesChanged(store, [change], &out) }
            forgetIfUnused(store)
        }
    }

    /// Tells a live store that its active queries changed: the queries in `changed` (each is sent with its new
    /// count, 0 = no longer active) to a store that asked for deltas (`register.queryDeltas`), the whole set to
    /// any other.
    /// `changes`: each changed query once, with its new count, in the order of the queries' bytes.
    func queriesChanged(_ store: StoreEntry, _ changes: [QueryChange], _ out: inout Output) {
        guard let peer = store.ownerPeer else { return }
        guard store.queryDeltas else {
            // The whole set, once per batch of reads however many changes the batch made: building a set of
            // thousands of queries for each change made a burst of queries quadratic (Benchmarks/ATTACKS.md).
            if !store.queriesDeferred {
                store.queriesDeferred = true
                if deferredQueries.isEmpty { out.append(.deferred) }
                deferredQueries.append(store)
            }
            return
        }
        var b = FrameBuilder(op: "queries-changed")
        b.raw("store", store.nameJSON)
        b.key("changes")
        appendQueryCounts(changes, to: &b)
        out.send(peer, b.finish())
    }

    /// Whether the router deferred work to the end of the transport's batch (`RouterEvent.endOfBatch`).
    public var hasDeferredWork: Bool { !deferredQueries.isEmpty }

    func flushDeferredQueries(_ out: inout Output) {
        let stores = deferredQueries
        deferredQueries.removeAll()
        for store in stores where store.queriesDeferred {
            store.queriesDeferred = false
            sendQueries(store, &out)
        }
    }

    /// Tells a live store its current deduplicated set of active queries.
    func sendQueries(_ store: StoreEntry, _ out: inout Output) {
        store.queriesDeferred = false
        guard let peer = store.ownerPeer else { return }
        var b = FrameBuilder(op: "queries")
        b.string("store", store.name)
        b.key("queries")
        appendQueryCounts(store.queryOrder.map { QueryChange(bytes: $0, count: store.queryCounts[QueryKey($0)] ?? 0) }, to: &b)
        // A store behind on reading gets only the newest set (its own coalescing key, apart from its snapshots').
        out.send(peer, b.finish(coalescing: .newestWins(key: store.key | 0x8000_0000)))
    }

    /// `[{"query": Q, "count": N}, ...]` (count 0: withdrawn).
    func appendQueryCounts(_ queries: [QueryChange], to b: inout FrameBuilder) {
        b.rawBytes(CollectionOfOne(UInt8(ascii: "[")))
        for (i, q) in queries.enumerated() {
            if i > 0 { b.rawBytes(CollectionOfOne(UInt8(ascii: ","))) }
            b.rawBytes("{\"query\":".utf8)
            b.rawBytes(q.bytes)
            b.rawBytes(",\"count\":".utf8)
            b.intValue(q.count)
            b.rawBytes(CollectionOfOne(UInt8(ascii: "}")))
        }
        b.rawBytes(CollectionOfOne(UInt8(ascii: "]")))
    }
}
