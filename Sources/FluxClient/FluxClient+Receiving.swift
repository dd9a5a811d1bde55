import FluxCore
import FluxJSONValue
import Logging

// What the connection's reader hands to the client, one event at a time, in wire order. Nothing here calls user
// code with the client's lock held: answers resume their awaiter after the lock is released, subscriber callbacks
// run after it, store sinks and monitor callbacks are taken under it and called outside.
extension FluxClient {
    /// An event of connection `generation` (those of an earlier connection are ignored).
    func receive(_ event: ConnectionEvent, generation: Int) {
        switch event {
        case .frame(let body): handleFrame(body, generation: generation)
        case .closed(let error):
            guard state.withLock({ $0.generation == generation }) else { return }
            handleClosed(error)
        }
    }

    private func handleFrame(_ body: [UInt8], generation: Int) {
        let env: Envelope
        do {
            env = try Envelope(body: body)
        } catch {
            guard state.withLock({ $0.generation == generation }) else { return }
            logger.warning("fluxd sent an unreadable frame: \(error.message)")
            reportUnanswered(.protocolViolation("fluxd sent an unreadable frame: \(error.message)"))
            return
        }
        if env.isString(.op, "action") {
            // A store's hot path: the op compared as bytes (no String made for it, no switch over every op name),
            // the connection's generation checked and the store's sink found under one lock.
            if let store = env.string(.store).value,
               let sink = state.withLock({ $0.generation == generation ? $0.sinks[store] : nil }) {
                sink(.message(env))
            }
            return
        }
        // Events of an earlier connection are ignored.
        guard state.withLock({ $0.generation == generation }) else { return }
        guard let op = env.fluxString("op") else {
            reportUnanswered(.protocolViolation("fluxd sent a message without op"))
            return
        }
        switch op {
        case "welcome":
            complete(Self.helloKey, .success(env))
        case "error":
            handleError(env)
        case "settled", "accepted", "info", "got", "pong", "query-ok", "unquery-ok", "workers", "worker", "history", "state-at", "reloaded", "forgotten":
            if let id = env.fluxString("id") { complete(id, .success(env)) }
        case "recovered":
            handleRecovered(env)
        case "subscribed", "unsubscribed", "snapshot", "store-down", "store-up", "delta":
            if (op == "subscribed" || op == "unsubscribed") && env.raw("path") != nil {
                handlePathMessage(op, env)  // a path subscription's (SPEC §16.4), never the whole-store one's
            } else {
                handleSubscriptionMessage(op, env)
                if op == "store-down" || op == "store-up" { handlePathMessage(op, env) }
            }
        case "subtree":
            handlePathMessage(op, env)
        case "registered", "action", "queries", "queries-changed":
            if let store = env.fluxString("store"), let sink = state.withLock({ $0.sinks[store] }) {
                sink(.message(env))
            }
        case "event", "missed":
            handleMonitorEvent(env, kind: op == "missed" ? "missed" : env.fluxString("kind") ?? "")
        case "ping":
            // A heartbeat (we asked for them in hello): answered at once, from the reader, whatever user code does.
            var b = FrameBuilder(op: "pong")
            if let id = env.raw("id"), env.span("id")?.kind == .string { b.raw("id", id) }
            try? send(frame: b.finish())
        case "bye":
            let reason = env.fluxString("reason") ?? "no reason given"
            logger.debug("fluxd said bye (\(reason))")  // (the line saying the connection was lost names the reason)
            state.withLock { $0.byeReason = reason }
        default:
            break // Unknown ops from a newer fluxd are ignored (forward compatibility).
        }
    }

    private func handleError(_ env: Envelope) {
        let rawCode = env.fluxString("code") ?? ""
        let error = ServerError(
            rawCode: rawCode,
            message: env.fluxString("message") ?? "",
            ref: env.fluxString("ref"),
            fatal: env.bool("fatal").value ?? ErrorCode(rawValue: rawCode)?.isFatal ?? false)
        enum Route { case pending(String), sink(@Sendable (StoreInbound) -> Void), barrier, handled, stream, recover([String]) }
        let route = state.withLock { s -> Route in
            if s.phase == .handshaking || s.phase == .reconnecting, s.pending[Self.helloKey] != nil {
                return .pending(Self.helloKey)
            }
            if let ref = error.ref {
                if s.pending[ref] != nil { return .pending(ref) }
                if let ids = s.recovering.removeValue(forKey: ref) { return .recover(ids) }
                if let sink = s.sinks[ref] { return .sink(sink) }
                for (key, barrier) in s.barriers where barrier.ids.contains(ref) {
                    s.barriers[key]?.refused.append(error)
                    return .barrier
                }
                // A refused path subscription (SPEC §16.4) ends with the error.
                if Self.refusePathSubscription(&s, store: ref, error: error) { return .handled }
            }
            return .stream
        }
        switch route {
        case .pending(let key): complete(key, .failure(.server(error)))
        case .sink(let sink): sink(.message(env))
        case .barrier, .handled: break
        case .recover(let ids):
            // A fluxd that cannot recover (unknown-op from an older one, bad-message): nobody can tell.
            let lost = FluxError.disconnected(
                "the connection to fluxd was lost before the settlement arrived, and fluxd could not tell its outcome (\(error)): the outcome is unknown")
            for id in ids { complete(id, .failure(lost)) }
        case .stream:
            if error.fatal { logger.warning("fluxd: \(error)") }
            reportUnanswered(.server(error))
        }
    }

    private func handleSubscriptionMessage(_ op: String, _ env: Envelope) {
        let store = env.fluxString("store") ?? ""
        var problem: FluxError?
        // A delta's patch is read before the lock is taken.
        var patch: JSONPatch?
        if op == "delta" {
            guard let raw = env.raw("patch"), let parsed = try? JSONPatch(scanned: raw) else {
                reportUnanswered(.protocolViolation("bad delta message for \(store)"))
                resync(store: store)
                return
            }
            patch = parsed
        }
        var resyncNeeded = false
        var sink: (@Sendable (StoreInbound) -> Void)?
        let callbacks = state.withLock { s -> [Subscriber] in
            if op == "unsubscribed" {
                if let n = s.draining[store] { s.draining[store] = n > 1 ? n - 1 : nil }
                return []
            }
            if op == "snapshot" { sink = s.sinks[store] }
            // Frames for a wire subscription we withdrew, up to its `unsubscribed`, belong to no one.
            guard s.draining[store] == nil, var sub = s.subscriptions[store] else { return [] }
            let event: WireStoreEvent
            switch op {
            case "subscribed":
                let status = StoreStatus(rawValue: env.fluxString("status") ?? "") ?? .unknown
                let version = env.fluxInt("version") ?? sub.version
                sub.status = status
                sub.version = max(sub.version, version)
                event = .subscribed(status, version: version)
            case "snapshot":
                guard let version = env.fluxInt("version"), let raw = env.raw("state") else {
                    problem = .protocolViolation("bad snapshot message for \(store)")
                    return []
                }
                let snapshot = RawSnapshot(store: store, version: version, seq: env.fluxInt("seq") ?? 0, state: raw,
                                           era: s.era)
                // Versions only grow (R4): one not above the last delivered is a repeat (after a reconnection,
                // the retained snapshot sent again on subscribing) and is not delivered twice, unless a resync
                // asked for it (subscribers that hold it drop it).
                let resync = sub.resyncing
                sub.resyncing = false
                guard version > sub.delivered || (resync && version == sub.delivered) else {
                    s.subscriptions[store] = sub
                    return []
                }
                sub.delivered = version
                if (sub.latest?.version ?? 0) < version { sub.latest = snapshot }
                sub.version = max(sub.version, version)
                event = .snapshot(snapshot)
            case "delta":
                guard let version = env.fluxInt("version"), let from = env.fluxInt("from"), let patch else {
                    problem = .protocolViolation("bad delta message for \(store)")
                    return []
                }
                guard version > sub.delivered else { return [] }
                guard from == sub.delivered else {
                    // Not from the version the subscribers hold: cannot come from a conforming fluxd. Resync.
                    problem = .protocolViolation("delta of \(store) from version \(from), but version \(sub.delivered) is held; resynchronising")
                    resyncNeeded = true
                    return []
                }
                sub.delivered = version
                sub.version = max(sub.version, version)
                event = .snapshot(RawSnapshot(store: store, version: version, seq: env.fluxInt("seq") ?? 0,
                                              state: [], era: s.era, patch: patch, from: from))
            case "store-down":
                sub.status = .down
                event = .storeDown(env.fluxString("reason") ?? "unknown")
            default: // store-up
                sub.status = .up
                let version = env.fluxInt("version") ?? 0
                sub.version = max(sub.version, version)
                event = .storeUp(version)
            }
            s.subscriptions[store] = sub
            let subscribers = sub.subscribers.keys.sorted().map { sub.subscribers[$0]! }
            for subscriber in subscribers { subscriber.push(event) }
            return subscribers
        }
        sink?(.message(env))
        for subscriber in callbacks { subscriber.run() }
        if let problem { reportUnanswered(problem) }
        if resyncNeeded { resync(store: store) }
    }

    private func handleMonitorEvent(_ env: Envelope, kind: String) {
        let event = MonitorEvent(kind: kind, message: env)
        let listeners = state.withLock { Array($0.monitors.values) }
        for listener in listeners {
            switch listener {
            case .queue(let q): q.push(event)
            case .callback(let c):
                c.enqueue(.event(event))
                c.run()
            }
        }
    }

    private func handleClosed(_ error: FluxError?) {
        enum Plan {
            case end(local: Bool, terminal: FluxError), handshakeFailed(FluxError)
            case reconnect(FluxError, failing: [String], sinks: [@Sendable (StoreInbound) -> Void])
        }
        let plan = state.withLock { s -> Plan in
            if s.phase == .reconnecting {
                // A reconnection attempt's connection ended before `welcome`: that attempt failed.
                return .handshakeFailed(error ?? .disconnected("the connection closed during the handshake"))
            }
            let local = error == nil || s.phase == .closing
            let reason: FluxError
            if local {
                reason = .closed
            } else if let bye = s.byeReason {
                reason = .disconnected("fluxd said bye (\(bye))")
            } else {
                reason = error ?? .disconnected("connection closed")
            }
            s.byeReason = nil
            guard !local, s.phase == .ready, connector != nil, reconnect.enabled else {
                return .end(local: local, terminal: reason)
            }
            // In the same step as the phase change: a call made from now on is held for the next connection.
            s.phase = .reconnecting
            s.outbox = []
            s.draining = [:]
            s.recovering = [:]
            // Settled dispatches are recovered after reconnecting; other requests cannot be (their answers were
            // for the lost connection): they fail.
            let failing = s.pending.keys.filter { $0 != Self.helloKey && !s.settles.contains($0) }
            return .reconnect(reason, failing: failing, sinks: Array(s.sinks.values))
        }
        switch plan {
        case .end(let local, let terminal):
            finish(local: local, terminal: terminal)
        case .handshakeFailed(let error):
            complete(Self.helloKey, .failure(error))
        case .reconnect(let reason, let failing, let sinks):
            lost(reason, failing: failing, sinks: sinks)
        }
    }

    /// Ends the client for good: every awaited call fails (`terminal`; a settled dispatch still held unsent fails
    /// with `notSent`), subscriptions, monitor streams and stores end (without error when `local`), `errors` and
    /// the connectivity streams finish. Idempotent.
    func finish(local: Bool, terminal: FluxError) {
        let taken = state.withLock { s -> (pending: [(String, FluxError)], subscribers: [Subscriber], monitors: [MonitorListener],
                                           sinks: [@Sendable (StoreInbound) -> Void], waiters: [CheckedContinuation<Void, Never>],
                                           task: Task<Void, Never>?)? in
            guard s.terminal == nil else { return nil }
            s.terminal = terminal
            s.phase = .closed
            let subscribers = s.subscriptions.values.flatMap { $0.subscribers.values }
            for subscriber in subscribers { subscriber.end(local ? nil : terminal) }
            Self.endPathSubscriptions(&s, local ? nil : terminal)
            for listener in s.monitors.values {
                switch listener {
                case .queue(let q): q.finish(local ? nil : terminal)
                case .callback(let c): c.enqueue(.end(local ? nil : terminal))
                }
            }
            let unsent = Set(s.held.compactMap { $0.key }).intersection(s.settles)
            let pending = s.pending.keys.map { key -> (String, FluxError) in
                if !local && unsent.contains(key) {
                    return (key, .notSent("the action was dispatched while reconnecting and the connection never came back (\(terminal))"))
                }
                return (key, terminal)
            }
            let result = (
                pending: pending,
                subscribers: subscribers,
                monitors: Array(s.monitors.values),
                sinks: Array(s.sinks.values),
                waiters: s.closeWaiters,
                task: s.reconnectTask)
            s.subscriptions = [:]
            s.monitors = [:]
            s.sinks = [:]
            s.closeWaiters = []
            s.outbox = []
            s.held = []
            s.liveQueries = [:]
            s.recovering = [:]
            s.reconnectTask = nil
            return result
        }
        guard let taken else { return }
        taken.task?.cancel()
        if !local { logger.notice("connection to fluxd ended: \(terminal)") }
        for (key, error) in taken.pending { complete(key, .failure(error)) }
        for sub in taken.subscribers { sub.run() }
        for case .callback(let c) in taken.monitors { c.run() }
        for sink in taken.sinks { sink(.ended(local ? nil : terminal)) }
        finishErrors()
        connectivity.finish()
        for w in taken.waiters { w.resume() }
    }

    /// `recovered`: settled ones complete, pending ones keep waiting (their `settled` follows on this connection),
    /// unknown ones never reached fluxd (`notSent`).
    private func handleRecovered(_ env: Envelope) {
        if let id = env.fluxString("id") { _ = state.withLock { $0.recovering.removeValue(forKey: id) } }
        guard let list = env.raw("outcomes"), let outcomes = try? Self.objects(in: list) else {
            reportUnanswered(.protocolViolation("bad recovered message: \(String(decoding: env.body, as: UTF8.self))"))
            return
        }
        for bytes in outcomes {
            guard let outcome = try? Envelope(body: Array(bytes)), let id = outcome.fluxString("id") else { continue }
            switch outcome.fluxString("status") {
            case "settled":
                // Answered as `settled` would have been: {"op":"settled","id":...,"seq":...,"results":[...]}.
                var b = FrameBuilder(op: "settled")
                b.string("id", id)
                b.int("seq", outcome.fluxInt("seq") ?? 0)
                b.raw("results", outcome.raw("results") ?? ArraySlice("[]".utf8))
                if let settled = try? Envelope(body: b.finish().bodyArray) {
                    complete(id, .success(settled))
                }
            case "pending":
                break  // Its `settled` comes on this connection.
            default:
                complete(id, .failure(.notSent(
                    "the connection to fluxd was lost and fluxd never accepted this dispatch (recovered: unknown); it may be dispatched again")))
            }
        }
    }
}
