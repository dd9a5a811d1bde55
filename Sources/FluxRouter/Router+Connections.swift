import DequeModule
import FluxCore

// Connections and the handshake (SPEC §6, §8.1): limits on connections, hello, a peer that goes away.
extension Router {
    // MARK: - Connections and handshake

    func connected(_ id: PeerID, _ creds: PeerCredentials, now: Millis, _ out: inout Output) {
        let uid = creds.uid ?? UInt32.max
        let userConnections = connectionsByUser[uid] ?? 0
        // Checked before this connection counts: the limits are on connections fluxd accepts.
        var refusal: String? = nil
        if peers.count >= config.maxConnections {
            refusal = "fluxd has \(peers.count) connections (maxConnections \(config.maxConnections))"
        } else if userConnections >= config.maxConnectionsPerUser {
            refusal = "uid \(uid) has \(userConnections) connections (maxConnectionsPerUser \(config.maxConnectionsPerUser))"
        } else if handshakes.count >= config.maxHandshakes {
            refusal = "\(handshakes.count) connections have not said hello yet (maxHandshakes \(config.maxHandshakes))"
        } else if (handshakesByUser[uid] ?? 0) >= config.maxHandshakesPerUser {
            refusal = "uid \(uid) has \(handshakesByUser[uid] ?? 0) connections that have not said hello yet (maxHandshakesPerUser \(config.maxHandshakesPerUser))"
        }
        let account = refusal == nil ? memory.open(uid: uid) : nil
        if refusal == nil && account == nil {
            refusal = "fluxd's memory budget has no room for another connection of uid \(uid) (\(memory.byUser[uid] ?? 0) of \(config.memory.perUser) bytes per user, \(memory.used) of \(config.memory.total) in total)"
        }
        let peer = Peer(id: id, creds: creds, connectedAt: now, account: account ?? memory.userAccount(uid: uid))
        peers.insert(peer)
        connectionsByUser[uid] = userConnections + 1
        out.traffic.connections += 1
        if let refusal {
            logLimited(&connectionRefusalLog, .warning, "connection refused: \(refusal)", &out)
            return fail(peer, .tooManyConnections, refusal, &out)
        }
        handshakes.append(id)
        handshakesByUser[uid, default: 0] += 1
        if shuttingDown {
            out.send(peer, byeFrame(reason: "shutdown"))
            close(peer, &out)
        }
    }

    /// The peer is no longer in the handshake (it said hello, timed out or closed).
    func endHandshake(_ peer: Peer) {
        guard let i = handshakes.firstIndex(of: peer.id) else { return }
        handshakes.remove(at: i)
        let uid = peer.account.uid
        if let n = handshakesByUser[uid] {
            if n <= 1 { handshakesByUser.removeValue(forKey: uid) } else { handshakesByUser[uid] = n - 1 }
        }
    }

    func hello(_ peer: Peer, _ hello: HelloRequest, _ out: inout Output) {
        let role = hello.role, name = hello.name
        peer.role = role
        peer.name = name
        peer.session = hello.session
        if hello.heartbeat && config.pingInterval > 0 {
            peer.heartbeat = true
            heartbeatPeers.insert(peer.id)
            scheduleSweep()
        }
        out.send(peer, welcomeFrame(peer))
        out.log(.debug, "peer \(peer.id) hello: role \(role.rawValue), name \"\(name)\"")
        observeConnect(peer, &out)
        if role == .monitor { monitors.append(peer.id) }
    }

    func closed(_ id: PeerID, now: Millis, _ out: inout Output) {
        guard let peer = peers.remove(id) else { return }
        peer.closing = true  // nothing more is sent to it (it may still be referenced by its unsettled actions)
        for pong in peer.heldPongs { memory.release(peer.account, Router.heldPongCost(pong)) }
        peer.heldPongs = []
        endHandshake(peer)
        if peer.preparing != nil || !peer.held.isEmpty { dropHeld(peer) }
        monitors.removeAll { $0 == id }
        if peer.heartbeat { heartbeatPeers.remove(id) }
        let uid = peer.account.uid
        if let n = connectionsByUser[uid] {
            if n <= 1 { connectionsByUser.removeValue(forKey: uid) } else { connectionsByUser[uid] = n - 1 }
        }
        if peer.role != nil {
            observeDisconnect(peer, &out)
        }
        let owned = peer.owned.sorted()
        let quietly = owned.count > 8  // one line for them all, not one per store
        for name in owned {
            if let store = stores[name] {
                storeDown(store, reason: shuttingDown ? "shutdown" : "disconnected", now: now, quietly: quietly, &out)
            }
        }
        if quietly { out.log(.notice, "\(owned.count) stores of peer \(id) (\(peer.name)) down (\(shuttingDown ? "shutdown" : "disconnected"))") }
        for name in peer.subscriptions {
            stores[name]?.subscribers.removeAll { $0 === peer }
            stores[name]?.deltaSubscribers.removeAll { $0.peer === peer }
            memory.release(peer.account, Router.subscriptionCost(name))
        }
        for sub in peer.pathSubscriptions.values {
            stores[sub.store]?.pathSubscribers.remove(sub)
            memory.release(peer.account, Router.subscriptionCost(sub.store) + sub.pathJSON.count)
        }
        let pathStores = peer.pathSubscriptions.values.map(\.store)
        for name in Set(pathStores) {
            if let store = stores[name], store.treePayer === peer { pathSubscriberLeft(peer, store) }
        }
        peer.pathSubscriptions = [:]  // (each holds the peer: a cycle otherwise)
        var withdrawn: [String: [[UInt8]]] = [:]
        for (_, q) in peer.queries {
            withdrawn[q.store, default: []].append(q.bytes)
            memory.release(peer.account, Router.queryCost(q.bytes))
        }
        var changes: [String: [QueryChange]] = [:]
        for (name, qs) in withdrawn {
            if let changed = stores[name]?.removeQueries(qs), !changed.isEmpty { changes[name] = changed }
        }
        peer.queries = [:]
        memory.close(peer.account)
        for name in changes.keys.sorted() {
            if let store = stores[name] { queriesChanged(store, changes[name]!, &out) }
        }
        for name in Set(peer.subscriptions).union(changes.keys).union(pathStores).sorted() {
            if let store = stores[name] { forgetIfUnused(store) }
        }
        out.log(.debug, "peer \(id) (\(peer.name)) closed")
    }

    func close(_ peer: Peer, _ out: inout Output) {
        guard !peer.closing else { return }
        peer.closing = true
        out.append(.close(peer.id))
    }
}
