import FluxCore
import Logging

// What the connection's reader hands to the client, one event at a time, in wire order. Nothing here calls user
// code with the client's lock held: answers resume their awaiter after the lock is released, subscriber callbacks
// run after it, store sinks and monitor callbacks are taken under it and called outside.
extension FluxClient {
    func receive(_ event: ConnectionEvent) {
        switch event {
        case .frame(let body): handleFrame(body)
        case .closed(let error): handleClosed(error)
        }
    }

    private func handleFrame(_ body: [UInt8]) {
        let env: Envelope
        do {
            env = try Envelope(body: body)
        } catch {
            logger.warning("fluxd sent an unreadable frame: \(error.message)")
            reportUnanswered(.protocolViolation("fluxd sent an unreadable frame: \(error.message)"))
            return
        }
        guard let op = env.fluxString("op") else {
            reportUnanswered(.protocolViolation("fluxd sent a message without op"))
            return
        }
        switch op {
        case "welcome":
            complete(Self.helloKey, .success(env))
        case "error":
            handleError(env)
        case "settled", "info", "got", "pong", "query-ok", "unquery-ok", "workers", "worker", "history", "state-at":
            if let id = env.fluxString("id") { complete(id, .success(env)) }
        case "subscribed", "unsubscribed", "snapshot", "store-down", "store-up":
            handleSubscriptionMessage(op, env)
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
            logger.info("fluxd said bye (\(reason))")
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
        enum Route { case pending(String), sink(@Sendable (StoreInbound) -> Void), barrier, stream }
        let route = state.withLock { s -> Route in
            if s.phase == .handshaking, s.pending[Self.helloKey] != nil { return .pending(Self.helloKey) }
            if let ref = error.ref {
                if s.pending[ref] != nil { return .pending(ref) }
                if let sink = s.sinks[ref] { return .sink(sink) }
                for (key, barrier) in s.barriers where barrier.ids.contains(ref) {
                    s.barriers[key]?.refused.append(error)
                    return .barrier
                }
            }
            return .stream
        }
        switch route {
        case .pending(let key): complete(key, .failure(.server(error)))
        case .sink(let sink): sink(.message(env))
        case .barrier: break
        case .stream:
            if error.fatal { logger.warning("fluxd: \(error)") }
            reportUnanswered(.server(error))
        }
    }

    private func handleSubscriptionMessage(_ op: String, _ env: Envelope) {
        let store = env.fluxString("store") ?? ""
        var problem: FluxError?
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
                let snapshot = RawSnapshot(store: store, version: version, seq: env.fluxInt("seq") ?? 0, state: raw)
                if (sub.latest?.version ?? 0) < version { sub.latest = snapshot }
                sub.version = max(sub.version, version)
                event = .snapshot(snapshot)
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
        let taken = state.withLock { s in
            let local = error == nil || s.phase == .closing
            let terminal: FluxError
            if local {
                terminal = .closed
            } else if let reason = s.byeReason {
                terminal = .disconnected("fluxd said bye (\(reason))")
            } else {
                terminal = error ?? .disconnected("connection closed")
            }
            s.terminal = terminal
            s.phase = .closed
            let subscribers = s.subscriptions.values.flatMap { $0.subscribers.values }
            for subscriber in subscribers { subscriber.end(local ? nil : terminal) }
            for listener in s.monitors.values {
                switch listener {
                case .queue(let q): q.finish(local ? nil : terminal)
                case .callback(let c): c.enqueue(.end(local ? nil : terminal))
                }
            }
            let result = (
                local: local, terminal: terminal,
                pending: Array(s.pending.keys),
                subscribers: subscribers,
                monitors: Array(s.monitors.values),
                sinks: Array(s.sinks.values),
                waiters: s.closeWaiters)
            s.subscriptions = [:]
            s.monitors = [:]
            s.sinks = [:]
            s.closeWaiters = []
            s.outbox = []
            return result
        }
        if !taken.local { logger.notice("connection to fluxd ended: \(taken.terminal)") }
        for key in taken.pending { complete(key, .failure(taken.terminal)) }
        for sub in taken.subscribers { sub.run() }
        for case .callback(let c) in taken.monitors { c.run() }
        for sink in taken.sinks { sink(.ended(taken.local ? nil : taken.terminal)) }
        finishErrors()
        for w in taken.waiters { w.resume() }
    }
}
