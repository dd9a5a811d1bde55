import DequeModule
import FluxCore
import FluxJournal

extension Router {
    // MARK: - Stores

    func register(_ peer: Peer, _ request: RegisterRequest, now: Millis, _ out: inout Output) {
        let name = request.store, handles = request.handles, waitFor = request.waitFor
        if waitFor.count > config.maxWaitFor {
            return refuseRegistration(peer, name, .limitExceeded, "\"waitFor\" names \(waitFor.count) stores (maxWaitFor \(config.maxWaitFor))", &out)
        }
        if !peer.owned.contains(name) && peer.owned.count >= config.maxStoresPerConnection {
            return refuseRegistration(peer, name, .limitExceeded, "this connection owns \(peer.owned.count) stores (maxStoresPerConnection \(config.maxStoresPerConnection))", &out)
        }
        if !(stores[name]?.wasRegistered ?? false), journaling, let refusal = journal!.refusal {
            logRefusedRegistration(peer, name, "journal", &out)
            return failJournal(peer, refusal, &out)  // a new name must be journaled; a known one resumes
        }
        if journaling, !(stores[name]?.wasRegistered ?? false), journal!.isOverDiskShare(peer.account.uid) {
            logRefusedRegistration(peer, name, ErrorCode.diskQuota.rawValue, &out)
            return failDiskQuota(peer, "the registration of store \"\(name)\" was not accepted", &out)
        }
        let store = entry(name)
        if let owner = store.owner {
            return refuseRegistration(peer, name, .nameTaken, "store \"\(name)\" is owned by peer \(owner)", &out)
        }
        if let path = cyclePath(from: name, waitFor: waitFor) {
            forgetIfUnused(store)  // a refused registration leaves no name behind
            return refuseRegistration(peer, name, .cycle, "waitFor would make a cycle: \(path.joined(separator: " -> "))", &out)
        }
        // A registered name is remembered for the whole run: it stays charged to the last connection that
        // registered it (and so to its user), which bounds how many names one user can make fluxd keep.
        let registrationCost = 256 + name.utf8.count + handles.reduce(0) { $0 + $1.utf8.count + 16 }
            + (config.metricsClock != nil ? StoreStats.worstCaseBytes : 0)  // (its metrics series, at their most)
            + waitFor.reduce(0) { $0 + $1.utf8.count + 16 }
        // The initial state (used when no snapshot is retained) must fit too, checked before anything is announced:
        // its room is charged with the registration and handed back for `publish` to take below.
        let initialCost = store.version == 0 ? request.state.map { 96 + store.nameJSON.count + $0.range.count } ?? 0 : 0
        let noRoom = "fluxd's memory budget has no room for registering store \"\(name)\"\(initialCost > 0 ? " with its initial state" : "") (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)"
        if store.registeredBy === peer.account {
            guard memory.resize(peer.account, from: store.registrationCost, to: registrationCost + initialCost) else {
                forgetIfUnused(store)
                return refuseRegistration(peer, name, .memoryBudget, noRoom, &out)
            }
            memory.release(peer.account, initialCost)
        } else {
            guard memory.charge(peer.account, registrationCost + initialCost) else {
                forgetIfUnused(store)
                return refuseRegistration(peer, name, .memoryBudget, noRoom, &out)
            }
            memory.release(peer.account, initialCost)
            if let previous = store.registeredBy { memory.release(previous, store.registrationCost) }
            store.registeredBy = peer.account
        }
        store.registrationCost = registrationCost
        let resumed = store.wasRegistered  // registered before in this run (SPEC §8.2)
        store.ownerPeer = peer
        store.status = .up
        store.queryDeltas = request.queryDeltas
        store.stalled = false
        expiringStores.remove(name)
        upStores.insert(name)
        if config.storeTimeout > 0 { scheduleSweep() }
        if !store.wasRegistered || store.handles != handles || store.waitFor != waitFor {
            if journaling { journal!.register(store: name, handles: handles, waitFor: waitFor, uid: peer.account.uid) }
        }
        routes.reindex(store, old: store.wasRegistered ? store.handles : [], new: handles)
        store.handles = handles
        store.waitFor = waitFor
        store.wasRegistered = true
        peer.owned.insert(name)
        routes.invalidate()
        for i in store.queue.indices { store.queue[i].deadline = nil }

        let initial = store.hasRetained ? nil : request.state.map { request.body[$0.range] }
        var b = FrameBuilder(op: "registered")
        b.string("store", name)
        let versionAfter = initial == nil ? store.version : store.nextVersion  // the initial state's, made below
        b.int("version", versionAfter)
        b.int("seq", store.seq)
        b.bool("resumed", resumed)
        out.send(peer, b.finish())
        var up = FrameBuilder(op: "store-up")
        up.string("store", name)
        up.int("version", versionAfter)
        let upFrame = up.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribedPeers where sub !== peer { out.send(sub, upFrame) }
        observeStoreUp(name, version: versionAfter, owner: peer, &out)
        let versionBefore = store.version
        if let initial {
            let published = publish(store, state: initial, seq: store.seq, &out)
            assert(published, "the initial state's room was checked above")
        }
        let broadcastToSelf = store.version != versionBefore && peer.subscriptions.contains(name)
        if !broadcastToSelf, let snapshot = retainedSnapshot(store) { out.send(peer, snapshot) }
        sendQueries(store, &out)
        out.log(.info, "store \"\(name)\" registered by peer \(peer.id) (\(peer.name)), version \(store.version)\(resumed ? ", resumed" : ""), \(store.queue.count) queued")
        pump(store, &out)
    }

    func unregister(_ peer: Peer, _ request: UnregisterRequest, now: Millis, _ out: inout Output) {
        let name = request.store
        guard let store = stores[name], store.owner == peer.id else {
            return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
        }
        storeDown(store, reason: "unregistered", now: now, &out)
    }

    /// A store's owner is gone: keep name, routes and snapshot; put unanswered actions back at the front of the
    /// queue, to be redelivered when the store registers again; start the queue timeout; tell subscribers.
    func storeDown(_ store: StoreEntry, reason: StaticString, now: Millis, quietly: Bool = false,
                           _ out: inout Output) {
        store.ownerPeer?.owned.remove(store.name)
        store.ownerPeer = nil
        store.status = .down
        store.stalled = false
        upStores.remove(store.name)
        var back = store.inflight
        store.inflight.removeAll()
        for i in back.indices { back[i].redelivered = true }
        store.queue.prepend(contentsOf: back)
        let deadline = now + config.queueTimeout
        for i in store.queue.indices { store.queue[i].deadline = max(store.queue[i].deadline ?? deadline, deadline) }
        if !store.queue.isEmpty { expiringStores.insert(store.name) }
        var b = FrameBuilder(op: "store-down")
        b.string("store", store.name)
        b.constant("reason", reason)
        let frame = b.finish(coalescing: .fence(key: store.key))
        for sub in store.subscribedPeers { out.send(sub, frame) }
        observeStoreDown(store, reason: reason, &out)
        out.log(quietly ? .debug : .notice, "store \"\(store.name)\" down (\(reason)), \(store.queue.count) queued")
    }

    /// The waitFor path that would close a cycle if `name` waited for `waitFor`, or nil.
    ///
    /// A depth-first search that remembers every store it has finished (`done`): a store from which `name` is not
    /// reachable is never walked again, so one check visits each store and each waitFor edge at most once
    /// (linear in the registration graph; the steps are counted in `maxCycleCheckSteps`). Iterative, so a long
    /// chain of stores cannot exhaust the stack.
    func cyclePath(from name: String, waitFor: [String]) -> [String]? {
        var done: Set<String> = [name]
        var path: [String] = [name]
        // Each frame: a store on the current path and the index of its next waitFor entry to walk.
        var stack: [(deps: [String], next: Int)] = [(waitFor, 0)]
        var steps = 0
        defer { maxCycleCheckSteps = max(maxCycleCheckSteps, steps) }
        while !stack.isEmpty {
            let top = stack.count - 1
            let (deps, next) = stack[top]
            guard next < deps.count else {
                stack.removeLast()
                path.removeLast()
                continue
            }
            stack[top].next = next + 1
            let dep = deps[next]
            steps += 1  // one edge
            if dep == name { return path + [name] }
            guard done.insert(dep).inserted else { continue }
            steps += 1  // one store
            path.append(dep)
            stack.append((stores[dep]?.waitFor ?? [], 0))
        }
        return nil
    }

    func entry(_ name: String) -> StoreEntry {
        if let s = stores[name] { return s }
        let s = StoreEntry(name: name, key: nextStoreKey)
        s.versionBase = versionFloor
        nextStoreKey &+= 1
        stores[name] = s
        storesByNameCache = nil
        return s
    }

    /// Forgets a store name nobody needs any more: never registered, no subscriber, no live query (SPEC §10).
    /// A name that is subscribed to before its store registers stays known, so reconnecting clients keep working.
    func forgetIfUnused(_ store: StoreEntry) {
        guard !store.wasRegistered, !store.hasSubscribers, store.queryOrder.isEmpty, store.queue.isEmpty,
              store.inflight.isEmpty, !store.hasRetained else { return }
        stores.removeValue(forKey: store.name)
        storesByNameCache = nil
    }

    // MARK: - Dispatch, delivery and answers

    /// R1: an accepted action gets the next `seq` and joins the queue of every store that handles its type, in
    /// `seq` order; refusals (§11) give it no `seq`.
    func dispatch(_ peer: Peer, _ request: DispatchRequest, _ body: [UInt8], now: Millis, _ out: inout Output) {
        let idRaw = request.id.map { body[$0.range] }
        let typeJSON = body[request.type.range]
        let type: String
        let targets: [StoreEntry]
        if request.typeIsKnown, let last = routes.last(ifSameAs: typeJSON) {
            type = last.type
            targets = last.targets
        } else {
            type = decodeJSONString(typeJSON)
            targets = routes.targets(for: type, typeJSON: typeJSON, in: stores)
        }
        let wantsSettlement = request.settle, cause = request.cause
        if shuttingDown || draining {
            return fail(peer, .shuttingDown, "fluxd is shutting down", &out)  // (ref: the id, SPEC §8.9)
        }
        if targets.isEmpty {
            return fail(peer, .noHandler, "no store handles \"\(type)\"", &out)
        }
        if journaling, journal!.refusesWork(of: peer.account.uid) {
            if let refusal = journal!.refusal { return failJournal(peer, refusal, &out) }
            return failDiskQuota(peer, "this dispatch was not accepted", &out)
        }
        if peer.unsettled >= config.maxPending {
            return fail(peer, .overloaded, "\(peer.unsettled) dispatches are unsettled (maxPending \(config.maxPending))", &out)
        }
        // A full queue refuses busy dispatchers only: one with fewer than `fairPending` unsettled actions is still
        // accepted, so a flood from one connection cannot lock the others out of a store.
        for s in targets where s.status == .up && s.queue.count >= config.queueLimit && peer.unsettled >= config.fairPending {
            return fail(peer, .overloaded, "store \"\(s.name)\" has \(s.queue.count) queued actions (queueLimit \(config.queueLimit))", &out)
        }
        // A dispatch whose outcome is to be kept for `recover` takes one of its user's outcome slots (SPEC §15.4).
        var sessionKey: SessionKey?
        if wantsSettlement, let session = peer.session, let idRaw {
            let uid = peer.account.uid
            let held = outcomes.count(of: uid) + (pendingSessionCounts[uid] ?? 0)
            if held >= config.maxOutcomes {
                expireOutcomes()
                if outcomes.count(of: uid) + (pendingSessionCounts[uid] ?? 0) >= config.maxOutcomes {
                    return fail(peer, .outcomeQuota, "uid \(uid) holds \(held) dispatch outcomes for recover, its quota (maxOutcomes \(config.maxOutcomes) per user, each kept \(config.outcomeWindow) ms after it settles); this dispatch was not sent", &out)
                }
            }
            sessionKey = SessionKey(uid: uid, sessionJSON: session, idJSON: idRaw)
        }
        let payload = request.payload.map { body[$0.range] } ?? ArraySlice("null".utf8)
        guard memory.charge(peer.account, Router.actionCost(payload.count, typeJSON.count)) else {
            return fail(peer, .memoryBudget, "fluxd's memory budget has no room for this action (\(peer.unsettled) of this connection's dispatches are unsettled; uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)", &out)
        }
        if let wanted = request.seq {
            guard config.replay else {
                return fail(peer, .forbidden, "\"seq\" is accepted only by a fluxd started with --replay", &out)
            }
            guard UInt64(wanted) > lastSeq else {
                return fail(peer, .badMessage, "\"seq\" \(wanted) is not above the last seq given (\(lastSeq))", &out)
            }
            lastSeq = UInt64(wanted) - 1
        }
        lastSeq += 1
        let session = wantsSettlement ? peer.session : nil
        let action = ActionRecord(
            seq: lastSeq, typeJSON: typeJSON, origin: peer.id, cause: cause,
            payload: payload,
            dispatcher: peer, id: wantsSettlement ? idRaw : nil, targets: targets)
        if journaling {
            if lastSeq > reservedSeq {
                reservedSeq = lastSeq + config.seqBlock - 1
                journal!.reserveSeq(upTo: reservedSeq)
            } else if reservedSeq - lastSeq < config.seqBlock / 2 {
                // The next block, while half of this one is left: made durable off the loop before it is needed
                // (Journal.commit), so that no dispatch waits for a sync (issue 27).
                reservedSeq += config.seqBlock
                journal!.reserveSeq(upTo: reservedSeq)
            }
            journal!.action(seq: lastSeq, typeJSON: typeJSON, origin: peer.id, cause: cause.map { UInt64($0) },
                               id: wantsSettlement ? idRaw : nil, session: session, uid: peer.account.uid,
                               payload: payload, targets: routes.lastJournalNames)
        }
        if request.ack, let idRaw {
            // Accepted (SPEC §8.3): its seq, before anything the action leads to.
            var b = FrameBuilder(op: "accepted", capacity: 48 + idRaw.count)
            b.raw("id", idRaw)
            b.int("seq", lastSeq)
            out.send(peer, b.finish())
        }
        pendingCount += 1
        peer.unsettled += 1
        if let sessionKey { indexSession(sessionKey, action) }
        out.traffic.actions += 1
        observeDispatch(action, type: type, from: peer, &out)
        let clock = config.metricsClock
        let acceptedAt = clock?() ?? 0
        for (i, store) in targets.enumerated() {
            if clock != nil { store.stats.dispatched &+= 1 }
            if store.status == .down && store.queue.count >= config.queueLimit {
                let result = StoreResult.unavailable(.storeUnavailable, "store \"\(store.name)\" is down and its queue is full (queueLimit \(config.queueLimit))")
                journalResult(action, store: store, result, version: store.version)
                action.setResult(at: i, result)
                if config.metricsClock != nil { store.stats.failed[ErrorCode.storeUnavailable.rawValue, default: 0] &+= 1 }
                logLimited(&givenUpLog, .notice, "action \(action.seq) given up for store \"\(store.name)\": it is down and its queue is full", &out)
                continue
            }
            if store.status == .down {
                store.queue.append(Delivery(action: action, deadline: now + config.queueTimeout, acceptedAt: acceptedAt))
                expiringStores.insert(store.name)
            } else {
                store.queue.append(Delivery(action: action, deadline: nil, acceptedAt: acceptedAt))
            }
        }
        for store in targets { pump(store, &out) }
        if action.isComplete { settle(action, &out) }
    }

    /// Sends actions from the head of a live store's queue while its window has room and the head is not held
    /// back by waitFor.
    func pump(_ store: StoreEntry, _ out: inout Output) {
        guard store.status == .up, let peer = store.ownerPeer else { return }
        while store.inflight.count < config.storeWindow, !store.queue.isEmpty {
            if !store.waitFor.isEmpty {
                let action = store.queue[0].action
                for dep in store.waitFor {
                    if let i = action.targets.firstIndex(where: { $0.name == dep }), action.result(at: i) == nil { return }
                }
            }
            let head = store.queue.removeFirst()
            out.send(peer, actionFrame(head.action, store: store, redelivered: head.redelivered))
            if store.inflight.isEmpty { store.lastProgress = now }  // the store's clock starts with its oldest
            store.inflight.append(head)
        }
    }

    /// `done` or `reject` from a store: must answer the oldest action in flight to that store.
    func answer(_ peer: Peer, _ request: AnswerRequest, _ body: [UInt8], _ out: inout Output) {
        let store: StoreEntry
        if let last = peer.lastStore, last.ownerPeer === peer, sameBytes(last.nameJSON, body[request.store.range]) {
            store = last  // the store this peer answered for last, named the same way: no decoding or hashing
        } else {
            let name: String
            do { name = try request.storeName(in: body) } catch { return fail(peer, error.code, error.message, &out, ref: error.ref) }
            guard let owned = ownedStore(peer, name) else {
                return fail(peer, .forbidden, "store \"\(name)\" is not yours", &out, ref: name)
            }
            store = owned
        }
        let name = store.name
        let seq = request.seq
        // R2: only the oldest unanswered action of the store may be answered. (Read in place: the oldest delivery
        // is copied, and its action retained, only once it is removed below.)
        guard !store.inflight.isEmpty, store.inflight[0].action.seq == seq else {
            let expected = store.inflight.first.map { "\($0.action.seq)" } ?? "none"
            return fail(peer, .badMessage, "answer for seq \(seq) out of order: the oldest unanswered action of \"\(name)\" is \(expected)", &out, ref: name)
        }
        let result: StoreResult
        // (An answer's state is journaled even when its user is over its disk share: it finishes work accepted
        // within the share, at most one state per unsettled action, and it is what brings the user back under it.
        // A state outside an action is new work: refused below.)
        if request.isDone {
            if let span = request.state {
                // R4/R5: the new state is published before the result is recorded, so every subscriber has the
                // snapshot queued before the dispatcher's settlement.
                if !store.pathSubscribers.isEmpty,
                   preparesParse(peer, store, .body(body, span.range), body: body, &out) { return }
                let patch = request.patch.map { body[$0.range] }
                guard publish(store, state: body[span.range], seq: seq, patch: patch, &out) else {
                    // The action stays unanswered: redelivered when the store comes back (SPEC §10).
                    return failStateOverBudget(peer, store, span.range.count, &out)
                }
            } else if let span = request.patch {
                // SPEC §16.2: the change as a patch. One that does not apply closes the store's connection; the
                // action stays unanswered and is delivered again after it registered again.
                if preparesPatch(peer, store, body, span.range, base: request.base, &out) { return }
                switch publishPatch(store, patch: body[span.range], base: request.base, seq: seq, &out) {
                case .applied, .empty: break
                case .failed(let message): return failPatch(peer, store, message, &out)
                case .overBudget(let what): return failOverBudget(peer, store, what, &out)
                }
            }
            result = .done
        } else {
            result = .rejected(body[request.error!.range])
        }
        let head = store.inflight.removeFirst()
        if let clock = config.metricsClock {
            store.stats.latency.record(clock() &- head.acceptedAt)
            if case .rejected(let error) = result {
                store.stats.reject(code: Router.rejectionCode(error))
            } else {
                store.stats.done &+= 1
            }
        }
        store.lastProgress = now
        if store.stalled { storeRecovered(store, &out) }
        store.seq = head.action.seq
        record(head.action, store: store, result: result, &out)
        pump(store, &out)
    }

    /// The store `name` if `peer` owns it (a store peer's last answered store is remembered: no hashing then).
    func ownedStore(_ peer: Peer, _ name: String) -> StoreEntry? {
        if let last = peer.lastStore, last.ownerPeer === peer, last.name == name { return last }
        guard let store = stores[name], store.owner == peer.id else { return nil }
        peer.lastStore = store
        return store
    }

    /// Records one store's result for an action; releases stores waiting for it; settles when complete.
    func record(_ action: ActionRecord, store: StoreEntry, result: StoreResult, _ out: inout Output) {
        guard let i = action.targets.firstIndex(where: { $0 === store }) else { return }
        if config.metricsClock != nil, case .unavailable(let code, _) = result { store.stats.failed[code.rawValue, default: 0] &+= 1 }
        if journaling { journalResult(action, store: store, result, version: store.version) }
        action.setResult(at: i, result, version: store.version)
        if action.targets.count > 1 {
            for other in action.targets where other !== store && other.waitFor.contains(store.name) { pump(other, &out) }
        }
        if action.isComplete { settle(action, &out) }
    }

    func settle(_ action: ActionRecord, _ out: inout Output) {
        pendingCount -= 1
        let dispatcher = action.dispatcher
        dispatcher.unsettled -= 1
        memory.release(dispatcher.account, Router.actionCost(action.payload.count, action.typeJSON.count))
        if action.session != nil, let session = action.session, let id = action.id {
            let key = SessionKey(uid: dispatcher.account.uid, sessionJSON: session, idJSON: id)
            unindexSession(key, action)
            rememberOutcome(action, key: key)
        }
        let toDispatcher = action.id != nil && !dispatcher.closing  // a peer that is gone is `closing` too
        guard toDispatcher || !monitors.isEmpty else { return }
        let results = resultsJSON(action)
        if toDispatcher, let id = action.id {
            var b = FrameBuilder(op: "settled", capacity: results.count + 64)
            b.raw("id", id)
            b.int("seq", action.seq)
            b.raw("results", results)
            out.send(dispatcher, b.finish())
        }
        observeSettle(action, results: results, &out)
    }

    /// A new state from a store: a new version unless byte-identical to the retained one; retained; the same
    /// frame goes to every subscriber.
    ///
    /// `patch` (SPEC §16.2, `done` with both): the same change as a patch, for delta subscribers.
    @discardableResult
    func publish(_ store: StoreEntry, state: ArraySlice<UInt8>, seq: UInt64, patch: ArraySlice<UInt8>? = nil,
                 _ out: inout Output) -> Bool {
        if store.tree != nil { _ = retainedSnapshot(store) }  // R4 compares with the retained bytes, however made
        // (The retained bytes read in place: binding the `Frame` copied it, a retain and a release per state.)
        if let current = store.snapshot?.bytes, sameBytes(UnsafeRawBufferPointer(rebasing: current[store.stateRange]), state) {
            return true
        }
        // The retained snapshot is charged to the connection that published it (within its allowance a small
        // state costs the shared budget nothing); it stays charged to that account, and so to its user, after the
        // connection closes, until a newer state replaces it.
        guard chargeRetained(store, 96 + store.nameJSON.count + state.count) else { return false }
        store.version = store.nextVersion
        if journaling { journal!.snapshot(store: store.journalName, version: store.version, seq: seq, state: state, uid: store.payerUID) }
        let frame = snapshotFrame(store, seq: seq, state: state)
        store.snapshot = frame
        store.snapshotSeq = seq
        // The bytes are the state now (SPEC §16.5); a tree parsed for path subscribers goes with its charge.
        if store.lastTreePayer !== store.treePayer { store.lastTreePayer = store.treePayer }
        if store.treePayer != nil {
            dropPathTree(store)
        } else if let tree = store.tree {
            discard(tree)
            store.tree = nil
        }
        if let patch { rememberPatch(store, seq: seq, patch) } else if !store.recentPatches.isEmpty {
            forgetHistory(store)
        }
        out.traffic.snapshots += 1
        if store.deltaSubscribers.isEmpty && store.pathSubscribers.isEmpty {
            for sub in store.subscribers { out.send(sub, frame) }  // (the common case, inline)
        } else {
            broadcast(store, seq: seq, patch: patch, operations: nil, &out)
        }
        observeSnapshot(store, seq: seq, state: state, &out)
        return true
    }

    /// SPEC §16.2: the `patch` op, a store's change outside an action.
    func unsolicitedPatch(_ peer: Peer, _ request: PatchRequest, _ out: inout Output) {
        guard let store = ownedStore(peer, request.store) else {
            return fail(peer, .forbidden, "store \"\(request.store)\" is not yours", &out, ref: request.store)
        }
        if overDiskShare(peer) { return failStoreOverDiskShare(peer, store, &out) }
        if preparesPatch(peer, store, request.body, request.patch.range, base: request.base, &out) { return }
        switch publishPatch(store, patch: request.body[request.patch.range], base: request.base, seq: store.seq, &out) {
        case .applied, .empty: break
        case .failed(let message): failPatch(peer, store, message, &out)
        case .overBudget(let what): failOverBudget(peer, store, what, &out)
        }
    }

    func unsolicitedState(_ peer: Peer, _ request: StateRequest, _ out: inout Output) {
        guard let store = ownedStore(peer, request.store) else {
            return fail(peer, .forbidden, "store \"\(request.store)\" is not yours", &out, ref: request.store)
        }
        if overDiskShare(peer) { return failStoreOverDiskShare(peer, store, &out) }
        if !store.pathSubscribers.isEmpty,
           preparesParse(peer, store, .body(request.body, request.state.range), body: request.body, &out) { return }
        let state = request.body[request.state.range]
        if !publish(store, state: state, seq: store.seq, &out) {
            failStateOverBudget(peer, store, state.count, &out)
        }
    }

    // MARK: - Time and shutdown

    func tick(now: Millis, _ out: inout Output) {
        if let at = sweepAt, at <= now { sweep(now: now, &out) }
        while let first = handshakes.first {
            guard let peer = peers[first] else { handshakes.removeFirst(); continue }
            guard peer.connectedAt + config.handshakeTimeout <= now else { break }
            endHandshake(peer)
            fail(peer, .timeout, "no hello within \(config.handshakeTimeout) ms", &out)
        }
        for name in expiringStores.sorted() {
            guard let store = stores[name] else { continue }
            while let head = store.queue.first, let d = head.deadline, d <= now {
                store.queue.removeFirst()
                logLimited(&givenUpLog, .notice, "action \(head.action.seq) given up for store \"\(name)\": it stayed down for \(config.queueTimeout) ms (queueTimeout)", &out)
                record(head.action, store: store, result: .unavailable(.storeUnavailable, "store \"\(name)\" stayed down for \(config.queueTimeout) ms"), &out)
            }
            if store.queue.isEmpty { expiringStores.remove(name) }
        }
    }

    func shutdown(_ out: inout Output) {
        guard !shuttingDown else { return }
        shuttingDown = true
        let durable = journal != nil
        if durable {
            // A durable fluxd keeps what is not final: it continues after the restart (SPEC §15.1).
            out.log(.notice, "stopping: \(pendingCount == 1 ? "1 action stays" : "\(pendingCount) actions stay") accepted in the journal, saying goodbye to \(peers.count == 1 ? "1 peer" : "\(peers.count) peers")")
        } else {
            out.log(.notice, "shutting down: settling \(pendingCount) actions, saying goodbye to \(peers.count) peers")
            for action in unsettledActions() {
                for i in action.targets.indices where action.result(at: i) == nil {
                    action.setResult(at: i, .unavailable(.shuttingDown, "fluxd is shutting down"))
                }
                settle(action, &out)
            }
        }
        for name in stores.keys.sorted() {
            let store = stores[name]!
            if !durable {
                // Every store's deliveries go, a down store's too: they are settled now, and one left in a down
                // store's queue would expire at a later tick and be settled a second time.
                store.queue.removeAll()
                store.inflight.removeAll()
            }
            guard store.status == .up else { continue }
            var b = FrameBuilder(op: "store-down")
            b.string("store", name)
            b.constant("reason", "shutdown")
            let frame = b.finish(coalescing: .fence(key: store.key))
            for sub in store.subscribedPeers { out.send(sub, frame) }
        }
        expiringStores.removeAll()  // (durable: no queued action is given up while fluxd stops)
        let bye = byeFrame(reason: durable ? "restart" : "shutdown")
        for id in peers.sortedIDs {
            let peer = peers[id]!
            guard !peer.closing else { continue }
            out.send(peer, bye)
            close(peer, &out)
        }
    }

    /// Every accepted, unsettled action, in seq order: each is waiting in the queue or window of at least one
    /// target store (an action leaves a store's queues only with a final result from it, and settles when all
    /// its targets have one).
    func unsettledActions() -> [ActionRecord] {
        var found: [UInt64: ActionRecord] = [:]
        for store in stores.values {
            for d in store.inflight { found[d.action.seq] = d.action }
            for d in store.queue { found[d.action.seq] = d.action }
        }
        return found.keys.sorted().map { found[$0]! }
    }
}
