import FluxCore

// Liveness (SPEC §8.7 heartbeats, §10 stalled stores) and the transport's memory accounting (§12).
extension Router {
    // MARK: - Liveness

    /// The transport's bytes for `peer` (its unfinished frame and its frames waiting to be written) changed to
    /// `bytes`: they are charged to its memory account. False when growing them would pass the budget: the host
    /// then drops what waits to be written and feeds `.overBudget(peer)`.
    public func accountTransport(_ peer: PeerID, bytes: Int) -> Bool {
        guard let p = peers[peer] else { return true }
        return memory.setTransport(p.account, bytes)
    }

    /// Whether a `tick` at `now` has liveness work to do (pings, closing silent peers, stalled stores).
    public func needsSweep(now: Millis) -> Bool {
        guard let at = sweepAt else { return false }
        return at <= now
    }

    /// How often the host should check `needsSweep` (0: heartbeats and stall reports are off).
    public var sweepInterval: Millis {
        guard config.pingInterval > 0 || config.storeTimeout > 0 else { return 0 }
        return sweepIntervalWhenOn
    }

    /// How often the liveness sweep runs while some peer asked for heartbeats or some store is up.
    var sweepIntervalWhenOn: Millis {
        var interval: Millis = 1000
        if config.pingInterval > 0 { interval = min(interval, max(config.pingInterval / 4, 5)) }
        if config.storeTimeout > 0 { interval = min(interval, max(config.storeTimeout / 4, 5)) }
        return interval
    }

    func scheduleSweep() {
        if sweepAt == nil { sweepAt = now + sweepIntervalWhenOn }
    }

    /// Pings opted-in peers that have been silent for `pingInterval`, closes those silent through `maxPingsOut`
    /// pings, and reports stores whose oldest delivered action waited longer than `storeTimeout`.
    func sweep(now: Millis, _ out: inout Output) {
        if config.pingInterval > 0 {
            for id in heartbeatPeers.sorted() {
                guard let peer = peers[id], !peer.closing else { continue }
                if peer.lastHeard >= peer.lastPingAt { peer.pingsOut = 0 }  // heard from since the last ping
                let silentSince = max(peer.lastHeard, peer.connectedAt)
                guard now >= silentSince + config.pingInterval * Millis(peer.pingsOut + 1) else { continue }
                if peer.pingsOut >= config.maxPingsOut {
                    fail(peer, .unresponsive, "no frame for \(now - silentSince) ms and \(peer.pingsOut) pings unanswered", &out)
                    continue
                }
                peer.pingsOut += 1
                peer.lastPingAt = now
                pingCount += 1
                var b = FrameBuilder(op: "ping")
                b.string("id", "hb-\(pingCount)")
                out.send(peer, b.finish())
            }
        }
        if config.storeTimeout > 0 {
            for name in upStores.sorted() {
                guard let store = stores[name], !store.stalled, !store.inflight.isEmpty,
                      now >= store.lastProgress + config.storeTimeout, let owner = store.ownerPeer,
                      !owner.closing else { continue }  // (a closing owner is about to take it down anyway)
                store.stalled = true
                let waited = now - store.lastProgress
                let seq = store.inflight[0].action.seq
                out.log(.warning, "store \"\(name)\" stalled: action \(seq) unanswered for \(waited) ms, \(store.inflight.count) in flight, \(store.queue.count) queued (peer \(owner.id), pid \(owner.creds.pid.map { "\($0)" } ?? "?"))\(config.closeStalledStores ? "; closing it" : "")")
                observeStall(name, seq: seq, waited: waited, &out)
                out.append(.stalled(store: name, pid: owner.creds.pid, closing: config.closeStalledStores))
                if config.closeStalledStores {
                    fail(owner, .unresponsive, "store \"\(name)\" left action \(seq) unanswered for \(waited) ms (storeTimeout \(config.storeTimeout))", &out, ref: name, fatal: true)
                }
            }
        }
        sweepAt = heartbeatPeers.isEmpty && (config.storeTimeout == 0 || upStores.isEmpty) ? nil : now + sweepIntervalWhenOn
    }

    /// A stalled store answered again.
    func storeRecovered(_ store: StoreEntry, _ out: inout Output) {
        store.stalled = false
        out.log(.notice, "store \"\(store.name)\" answers again")
        observeRecovery(store, &out)
    }
}
