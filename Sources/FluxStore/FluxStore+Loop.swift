import FluxClient
import FluxCore
import Foundation
import Logging

extension FluxStore {
    /// The message loop of one `run`: owns the state while running; everything here runs one message at a time.
    struct Loop {
        enum Step { case next, stop }
        /// `interrupted`: the connection was lost; the client reconnects, then the store registers again.
        enum Phase { case registering, awaitingSnapshot, ready, interrupted }

        let store: FluxStore
        let client: FluxClient
        let config: Registry
        let decoder = JSONDecoder()
        var state: State
        var phase = Phase.registering
        /// The connection (`FluxClient.generation`) the store registered on: its answers go on that one only.
        var generation: Int?
        /// The seq of the snapshot adopted on registering (else `registered.seq`): actions up to it are already in
        /// the state (SPEC §15.3, rule 2).
        var adoptedSeq = 0
        var followed: [String: any Sendable] = [:]
        /// The active queries (canonical JSON bytes -> count), kept from `queries` and `queries-changed`.
        var activeQueries: [[UInt8]: Int] = [:]

        var registered: Bool { phase != .registering && phase != .interrupted }

        init(store: FluxStore, client: FluxClient, config: Registry) {
            self.store = store
            self.client = client
            self.config = config
            self.state = store.initial
        }

        /// Sends `register` on the client's current connection.
        mutating func register() throws(FluxError) {
            let frame = try store.registerFrame(state: generation == nil ? store.initial : state)
            let current = client.generation
            try client.send(frame: frame, generation: current)
            generation = current
            phase = .registering
        }

        mutating func handle(_ item: Inbound) throws(FluxError) -> Step {
            switch item {
            case .store(.ended(let error)):
                if let error { throw error }
                return .stop
            case .store(.interrupted(let error)):
                phase = .interrupted
                store.logger.notice("store \(store.name): connection to fluxd lost (\(error)); it registers again once reconnected")
            case .store(.resumed(let generation, let epochChanged)):
                // Registered on that connection already (the first registration raced the reconnection): done.
                if let registeredOn = self.generation, registeredOn >= generation { return .next }
                if epochChanged {
                    store.logger.notice("store \(store.name): fluxd's history changed (another epoch); registering afresh")
                }
                do {
                    try register()
                } catch {
                    // Lost again already: the next `resumed` registers.
                    store.logger.debug("store \(store.name): registering again failed: \(error)")
                }
            case .store(.message(let env)):
                try handleMessage(env)
            case .followed(let name, let event):
                guard case .snapshot(let raw) = event, let follow = config.follows.first(where: { $0.store == name }) else {
                    return .next
                }
                let view = RawSnapshotView(store: raw.store, version: raw.version, seq: raw.seq, state: raw.state)
                let snapshot: any Sendable
                do {
                    snapshot = try follow.decode(view, decoder)
                } catch {
                    store.report(FluxError.coding("snapshot \(raw.version) of followed store \(name): \(error)"))
                    return .next
                }
                followed[name] = snapshot
                if let handler = follow.handler, phase == .ready {
                    runOutsideAction(cause: raw.seq) { state, ctx in try handler(&state, snapshot, ctx) }
                }
            }
            return .next
        }

        mutating func handleMessage(_ env: Envelope) throws(FluxError) {
            switch env.fluxString("op") {
            case "registered":
                adoptedSeq = env.fluxInt("seq") ?? 0
                if (env.fluxInt("version") ?? 0) > 0 {
                    phase = .awaitingSnapshot
                } else {
                    becomeReady()
                }
            case "snapshot":
                guard phase == .awaitingSnapshot, let raw = env.raw("state") else { return }
                // Adopted even when the state in memory is newer (rule 1): after a fluxd restart, the actions
                // whose answers fluxd did not record come again.
                do {
                    state = try decoder.decode(State.self, from: Data(raw))
                } catch {
                    throw FluxError.coding("the retained state of \(store.name) does not decode as \(State.self): \(error)")
                }
                adoptedSeq = env.fluxInt("seq") ?? adoptedSeq
                becomeReady()
            case "error":
                let error = FluxError.server(ServerError(
                    rawCode: env.fluxString("code") ?? "", message: env.fluxString("message") ?? "",
                    ref: env.fluxString("ref"), fatal: env.bool("fatal").value ?? false))
                if phase == .registering { throw error }
                store.report(error)
            case "queries", "queries-changed":
                if phase != .ready { becomeReady() }
                let whole = env.fluxString("op") == "queries"
                guard let entries = env.raw(whole ? "queries" : "changes"), applyQueries(entries, whole: whole) else {
                    store.report(FluxError.protocolViolation("unreadable \(whole ? "queries" : "queries-changed") message for \(store.name)"))
                    return
                }
                guard let handler = config.queries else { return }
                let raw = activeQueriesJSON()
                let decoder = self.decoder
                runOutsideAction(cause: nil) { state, ctx in try handler(&state, raw, ctx, decoder) }
            case "action":
                if phase != .ready { becomeReady() }
                handleAction(env)
            default:
                break
            }
        }

        /// Applies a `queries` array (the whole set) or a `queries-changed` array (each entry's new count; 0: gone).
        mutating func applyQueries(_ json: ArraySlice<UInt8>, whole: Bool) -> Bool {
            guard let list = try? JSONSerialization.jsonObject(with: Data(json), options: [.fragmentsAllowed]) as? [[String: Any]] else {
                return false
            }
            if whole { activeQueries = [:] }
            for entry in list {
                guard let query = entry["query"], let count = entry["count"] as? Int,
                      let key = try? JSONSerialization.data(withJSONObject: query, options: [.sortedKeys, .fragmentsAllowed, .withoutEscapingSlashes])
                else { return false }
                if count > 0 { activeQueries[Array(key)] = count } else { activeQueries.removeValue(forKey: Array(key)) }
            }
            return true
        }

        /// The active queries as a `queries` array, sorted by their bytes.
        func activeQueriesJSON() -> ArraySlice<UInt8> {
            var out: [UInt8] = [UInt8(ascii: "[")]
            for (i, key) in activeQueries.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(contentsOf: #"{"query":"#.utf8)
                out.append(contentsOf: key)
                out.append(contentsOf: #","count":\#(activeQueries[key]!)}"#.utf8)
            }
            out.append(UInt8(ascii: "]"))
            return out[...]
        }

        mutating func becomeReady() {
            phase = .ready
            store.publishState(state)
            // Followed snapshots that arrived before registration completed: hand the latest of each over now.
            for follow in config.follows {
                guard let handler = follow.handler, let snapshot = followed[follow.store] else { continue }
                runOutsideAction(cause: nil) { state, ctx in try handler(&state, snapshot, ctx) }
            }
            store.markReady()
        }

        func handler(for type: String) -> ActionHandler? {
            if let h = config.exact[type] { return h }
            return config.prefixes.first { type.utf8.starts(with: $0.prefix.utf8) }?.handler
        }

        mutating func handleAction(_ env: Envelope) {
            guard let seq = env.fluxInt("seq") else {
                store.report(FluxError.protocolViolation("action without seq"))
                return
            }
            let type = env.fluxString("type") ?? ""
            if seq <= adoptedSeq {
                // Already in the adopted snapshot (rule 2): answered without applying it again.
                store.logger.debug("store \(store.name): seq \(seq) (\(type)) is already in the adopted snapshot (seq \(adoptedSeq)); skipped")
                var b = FrameBuilder(op: "done")
                b.string("store", store.name)
                b.int("seq", seq)
                try? client.queue(frame: b.finish(), generation: generation)
                return
            }
            let ctx = ActionContext(
                storeName: store.name, seq: seq, type: type, origin: env.fluxInt("origin") ?? 0,
                cause: env.fluxInt("cause"), redelivered: env.bool("redelivered").value ?? false, followed: followed)
            var copy = state
            var b: FrameBuilder
            do {
                var encoded: [UInt8]?
                if let h = handler(for: type) {
                    try h(&copy, env.raw("payload"), ctx, decoder)
                    if copy != state { encoded = try FluxJSON.encode(copy) }
                } else if store.unhandled == .reject {
                    let handled = store.handledTypes
                    throw StoreRejection(
                        code: StoreRejection.unhandledActionCode,
                        message: "no handler for '\(type)'; this store handles: "
                            + (handled.isEmpty ? "no action types (it has no handlers)" : handled.joined(separator: ", ")))
                }
                b = FrameBuilder(op: "done", capacity: 64 + (encoded?.count ?? 0))
                b.string("store", store.name)
                b.int("seq", seq)
                if let encoded {
                    b.raw("state", encoded)
                    state = copy
                    store.publishState(copy)
                }
            } catch {
                let rejection = error as? StoreRejection
                    ?? StoreRejection(code: StoreRejection.errorCode, message: PayloadProblem.readable(error))
                b = FrameBuilder(op: "reject")
                b.string("store", store.name)
                b.int("seq", seq)
                b.raw("error", errorObjectJSON(code: rejection.code, message: rejection.message))
                ctx.followUps = []
                ctx.spawned = []
            }
            // Written after the run of waiting messages (see `run`), on the connection the store registered on
            // (an answer for a lost connection is dropped: fluxd redelivers the action).
            try? client.queue(frame: b.finish(), generation: generation)
            carryOut(ctx)
        }

        /// Runs a query/follow handler as a transaction; publishes the state with `state` when it changed.
        mutating func runOutsideAction(cause: Int?, _ body: (inout State, StoreContext) throws -> Void) {
            let ctx = StoreContext(storeName: store.name, followUpCause: cause, followed: followed)
            var copy = state
            do {
                try body(&copy, ctx)
                if copy != state {
                    let encoded = try FluxJSON.encode(copy)
                    var b = FrameBuilder(op: "state", capacity: 64 + encoded.count)
                    b.string("store", store.name)
                    b.raw("state", encoded)
                    state = copy
                    store.publishState(copy)
                    try? client.send(frame: b.finish(), generation: generation)
                }
            } catch {
                store.report(error)
                return
            }
            carryOut(ctx)
        }

        func carryOut(_ ctx: StoreContext) {
            for f in ctx.followUps {
                do {
                    try client.dispatch(type: f.type, payloadJSON: f.payload, cause: f.cause)
                } catch {
                    store.report(error)
                }
            }
            let dispatcher = StoreDispatcher(client: client, cause: ctx.followUpCause)
            for work in ctx.spawned { store.start(work, dispatcher: dispatcher) }
        }
    }
}
