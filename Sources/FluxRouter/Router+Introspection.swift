import FluxCore

// Introspection (SPEC §8.7): ping, get, info.
extension Router {
    // MARK: - Introspection and liveness

    func ping(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        var b = FrameBuilder(op: "pong")
        if let id = env.raw(.id), env.span(.id)?.kind == .string { b.raw("id", id) }
        out.send(peer, b.finish())
    }

    func get(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        let id = env.raw(.id)
        guard case .value(let name) = env.string(.store) else {
            return fail(peer, .badMessage, "get needs \"store\"", &out, ref: env.string(.id).value)
        }
        guard let store = stores[name], let snapshot = store.snapshot else {
            return fail(peer, .unknownStore, "no snapshot is retained for store \"\(name)\"", &out, ref: env.string(.id).value ?? name)
        }
        var b = FrameBuilder(op: "got", capacity: snapshot.bytes.count + 64)
        if let id, env.span(.id)?.kind == .string { b.raw("id", id) }
        b.string("store", name)
        b.int("version", store.version)
        b.int("seq", store.snapshotSeq)
        b.raw("state", snapshot.bytes[store.stateRange])
        out.send(peer, b.finish())
    }

    func info(_ peer: Peer, _ env: Envelope, _ out: inout Output) {
        var j: [UInt8] = []
        j.append(UInt8(ascii: "["))
        var first = true
        for name in stores.keys.sorted() {
            let s = stores[name]!
            guard s.wasRegistered else { continue }  // a name only subscribed to or queried is no store (yet)
            if !first { j.append(UInt8(ascii: ",")) }
            first = false
            j.append(contentsOf: "{\"name\":".utf8); appendEscaped(name, to: &j)
            j.append(contentsOf: ",\"status\":\"\(s.status.rawValue)\",\"handles\":".utf8); appendStrings(s.handles, &j)
            j.append(contentsOf: ",\"waitFor\":".utf8); appendStrings(s.waitFor, &j)
            j.append(contentsOf: ",\"version\":\(s.version),\"seq\":\(s.seq),\"subscribers\":\(s.subscribers.count)".utf8)
            j.append(contentsOf: ",\"queued\":\(s.queue.count),\"inflight\":\(s.inflight.count),\"queries\":\(s.queryOrder.count)".utf8)
            if s.stalled {
                j.append(contentsOf: ",\"stalled\":true,\"stalledFor\":\(now - s.lastProgress)".utf8)
            }
            if let owner = s.owner, let p = peers[owner] {
                j.append(contentsOf: ",\"owner\":{\"peer\":\(p.id),\"name\":".utf8); appendEscaped(p.name, to: &j)
                if let pid = p.creds.pid { j.append(contentsOf: ",\"pid\":\(pid)".utf8) }
                if let uid = p.creds.uid { j.append(contentsOf: ",\"uid\":\(uid)".utf8) }
                j.append(UInt8(ascii: "}"))
            }
            j.append(UInt8(ascii: "}"))
        }
        j.append(UInt8(ascii: "]"))
        var roles = [Role.client: 0, .store: 0, .monitor: 0]
        for p in peers.values { if let r = p.role { roles[r, default: 0] += 1 } }
        var b = FrameBuilder(op: "info", capacity: j.count + 512)
        if let id = env.raw(.id), env.span(.id)?.kind == .string { b.raw("id", id) }
        b.int("seq", lastSeq)
        b.raw("stores", j)
        b.raw("peers", Array("{\"client\":\(roles[.client]!),\"store\":\(roles[.store]!),\"monitor\":\(roles[.monitor]!)}".utf8))
        var current = counters
        current.traffic.add(out.traffic)  // this event's traffic so far is not in `counters` yet
        b.raw("counters", current.json())
        var users: [UInt8] = Array("[".utf8)
        for (i, uid) in memory.byUser.keys.sorted().enumerated() {
            if i > 0 { users.append(UInt8(ascii: ",")) }
            let n = connectionsByUser[uid] ?? 0
            users.append(contentsOf: "{\"uid\":\(uid == UInt32.max ? "null" : "\(uid)"),\"bytes\":\(memory.byUser[uid] ?? 0),\"connections\":\(n)}".utf8)
        }
        users.append(UInt8(ascii: "]"))
        b.raw("memory", Array("{\"used\":\(memory.used),\"peak\":\(memory.peak),\"limit\":\(config.memory.total),\"perUser\":\(config.memory.perUser),\"connectionAllowance\":\(config.memory.connectionAllowance),\"refusals\":\(memory.refusals),\"users\":".utf8) + users + [UInt8(ascii: "}")])
        let accepts = acceptErrors.keys.sorted().map { "\"\($0)\":\(acceptErrors[$0]!)" }.joined(separator: ",")
        b.raw("load", Array("{\"connections\":\(peers.count),\"handshakes\":\(handshakes.count),\"storeNames\":\(stores.count),\"longestLoopHoldMicros\":\(longestLoopHold),\"maxCycleCheckSteps\":\(maxCycleCheckSteps),\"acceptErrors\":{\(accepts)}}".utf8))
        out.send(peer, b.finish())
    }

    func appendStrings(_ values: [String], _ j: inout [UInt8]) {
        j.append(UInt8(ascii: "["))
        for (i, v) in values.enumerated() {
            if i > 0 { j.append(UInt8(ascii: ",")) }
            appendEscaped(v, to: &j)
        }
        j.append(UInt8(ascii: "]"))
    }
}
