import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import Logging

extension FluxStore {
    /// The message loop of one `run`: owns the state while running; everything here runs one message at a time.
    struct Loop {
        typealias Step = StoreLoopStep
        typealias Phase = StoreLoopPhase
        typealias Publication = StorePublication

        let store: FluxStore
        let client: FluxClient
        let config: Registry
        let decoder = JSONDecoder()
        var phase = Phase.registering
        /// The connection (`FluxClient.generation`) the store registered on: its answers go on that one only.
        var generation: Int?
        /// The seq of the snapshot adopted on registering (else `registered.seq`): actions up to it are already in
        /// the state (SPEC §15.3, rule 2).
        var adoptedSeq = 0
        var followed: [String: any Sendable] = [:]
        /// The active queries (canonical JSON bytes -> count), kept from `queries` and `queries-changed`.
        var activeQueries: [[UInt8]: Int] = [:]
        /// Describes each new state as a patch from the one fluxd retains (SPEC §16.2); its baseline is that state.
        var delta = JSONDeltaEncoder()
        /// Whether fluxd takes patches (its `welcome.limits` has `deltaHistory`: fluxd 0.4.0 or later).
        var patches = false
        /// The version fluxd retains, which the next patch applies to (sent as `base`); nil: not known (patches go
        /// without `base`).
        var base: Int?
        /// After `patch-failed`: the next change goes as a whole state (a patch that failed once is not trusted).
        var wholeNext = false
        /// The size of the state's JSON as last sent or adopted whole; nil once changes went as patches (the size
        /// is then not known; a state that grew past `wholeStateLimit` stays on patches).
        var wholeSize: Int?
        /// The state's JSON left out of `register` because the frame would have been larger than fluxd's
        /// `maxFrame` (SPEC §16.6): published in pieces if fluxd turns out to retain no state for the store.
        var owed: [UInt8]?
        /// The last state published in pieces, kept until a registration shows fluxd took every piece: a
        /// publication cut short goes on from the piece fluxd took last (SPEC §16.6).
        var piecesSent: StatePieces?
        /// The store's name as a JSON string (written into every answer).
        let nameJSON: [UInt8]
        /// The handler found for the last action type (actions of one type tend to come in runs).
        var lastHandler: (type: String, handler: ActionHandler?)?
        /// The state (the last stored property: the ones before it keep offsets known at compile time, where a
        /// field after a `State` of unknown size is found through the type's metadata).
        var state: State

        var registered: Bool { phase != .registering && phase != .interrupted }

        init(store: FluxStore, client: FluxClient, config: Registry) {
            self.store = store
            self.client = client
            self.config = config
            self.state = store.initial
            var name: [UInt8] = []
            appendEscaped(store.name, to: &name)
            self.nameJSON = name
        }

        /// Sends `register` on the client's current connection: with the state, when the frame fits in fluxd's
        /// `maxFrame`; without it otherwise (SPEC §16.6: fluxd's retained state is adopted, or, when it has none,
        /// the state is published in pieces once registered).
        mutating func register() throws(FluxError) {
            let json = try FluxJSON.encode(generation == nil ? store.initial : state)
            var frame = store.registerFrame(stateJSON: json)
            owed = nil
            if let maxFrame = client.welcome.limits.maxFrame, frame.body.count > maxFrame {
                frame = store.registerFrame(stateJSON: nil)
                owed = json
            }
            let current = client.generation
            try client.send(frame: frame, generation: current)
            wholeSize = json.count
            generation = current
            phase = .registering
            patches = client.welcome.limits.deltaHistory != nil
            delta.forgetBaseline()
            base = nil
        }

        /// Handles a run of messages in order (stopping at one that ends the run).
        mutating func handle(_ items: [StoreMailboxItem]) throws(FluxError) -> Step {
            for item in items where try handle(item) == .stop { return .stop }
            return .next
        }

        mutating func handle(_ item: StoreMailboxItem) throws(FluxError) -> Step {
            switch item {
            case .store(.ended(let error)):
                if let error { throw error }
                return .stop
            case .store(.interrupted(let error)):
                phase = .interrupted
                store.logger.debug("store \(store.name): connection to fluxd lost (\(error)); it registers again once reconnected")  // (the client said it)
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
                let snapshot: any Sendable
                do {
                    switch try follow.read(raw) {
                    case .state(let s): snapshot = s
                    case .skip: return .next
                    case .resync:
                        // A delta not from the version held: fluxd sends the whole state again.
                        client.resync(store: name)
                        return .next
                    }
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
            if env.isString(.op, "action") {  // The hot path: the op compared as bytes, no String made.
                if phase != .ready { becomeReady() }
                handleAction(env)
                return
            }
            switch env.fluxString("op") {
            case "registered":
                adoptedSeq = env.fluxInt("seq") ?? 0
                if (env.fluxInt("version") ?? 0) > 0 {
                    owed = nil
                    phase = .awaitingSnapshot
                } else {
                    if let owed { publishInPieces(owed) }
                    owed = nil
                    becomeReady()
                }
            case "snapshot":
                guard phase == .awaitingSnapshot, let raw = env.raw("state") else { return }
                if let piecesSent, resumePublication(piecesSent, raw: raw, version: env.fluxInt("version") ?? 0) {
                    adoptedSeq = env.fluxInt("seq") ?? adoptedSeq
                    becomeReady()
                    return
                }
                piecesSent = nil
                // Adopted even when the state in memory is newer (rule 1): after a fluxd restart, the actions
                // whose answers fluxd did not record come again.
                do {
                    state = try decoder.decode(State.self, from: Data(raw))
                } catch {
                    throw FluxError.coding("the retained state of \(store.name) does not decode as \(State.self): \(error)")
                }
                adoptedSeq = env.fluxInt("seq") ?? adoptedSeq
                adoptBaseline(raw, version: env.fluxInt("version") ?? 0)
                becomeReady()
            case "error":
                let error = FluxError.server(ServerError(
                    rawCode: env.fluxString("code") ?? "", message: env.fluxString("message") ?? "",
                    ref: env.fluxString("ref"), fatal: env.bool("fatal").value ?? false))
                if phase == .registering { throw error }
                if env.fluxString("code") == "patch-failed" {
                    // fluxd closes the connection; the store registers again, adopts the retained state, and
                    // sends its next change whole.
                    wholeNext = true
                    store.logger.warning("store \(store.name): fluxd could not apply a patch (\(error)); registering again")
                }
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

        /// `handler(for:)`, remembered for the last type.
        mutating func cachedHandler(for type: String) -> ActionHandler? {
            if let last = lastHandler, last.type == type { return last.handler }
            let found = handler(for: type)
            lastHandler = (type, found)
            return found
        }

        mutating func handleAction(_ env: Envelope) {
            guard let seq = env.int(.seq).value.map({ Int($0) }) else {
                store.report(FluxError.protocolViolation("action without seq"))
                return
            }
            let type = env.string(.type).value ?? ""
            if seq <= adoptedSeq {
                // Already in the adopted snapshot (rule 2): answered without applying it again.
                store.logger.debug("store \(store.name): seq \(seq) (\(type)) is already in the adopted snapshot (seq \(adoptedSeq)); skipped")
                var b = FrameBuilder(op: "done")
                b.raw("store", nameJSON)
                b.int("seq", seq)
                try? client.queue(frame: b.finish(), generation: generation)
                return
            }
            let ctx = ActionContext(storeName: store.name, seq: seq, type: type, message: env, followed: followed)
            var copy = state
            var b: FrameBuilder
            do {
                var change: Publication?
                if let h = cachedHandler(for: type) {
                    try h(&copy, env.raw(.payload), ctx, decoder)
                    change = try publication(of: copy)
                } else if store.unhandled == .reject {
                    let handled = store.handledTypes
                    throw StoreRejection(
                        code: StoreRejection.unhandledActionCode,
                        message: "no handler for '\(type)'; this store handles: "
                            + (handled.isEmpty ? "no action types (it has no handlers)" : handled.joined(separator: ", ")))
                }
                b = FrameBuilder(op: "done", capacity: 64 + nameJSON.count + (change?.size ?? 0))
                b.raw("store", nameJSON)
                b.int("seq", seq)
                if let change {
                    add(change, new: copy, to: &b)
                    state = copy
                    store.publishState(copy)
                }
            } catch {
                let rejection = error as? StoreRejection
                    ?? StoreRejection(code: StoreRejection.errorCode, message: PayloadProblem.readable(error))
                b = FrameBuilder(op: "reject")
                b.raw("store", nameJSON)
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
                if let change = try publication(of: copy) {
                    var b: FrameBuilder
                    if !change.isPatch {
                        b = FrameBuilder(op: "state", capacity: 64 + change.size)
                    } else {
                        b = FrameBuilder(op: "patch", capacity: 64 + change.size)
                    }
                    b.string("store", store.name)
                    add(change, new: copy, to: &b)
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

        /// What to publish for `new` (nil: unchanged). A patch when fluxd takes them and the store knows the state
        /// fluxd retains; else the whole state, when it differs from the current one.
        func publication(of new: State) throws -> Publication? {
            // A handler that changed nothing publishes nothing (R4: no version), even when it went through a
            // tracked collection's mutating method (`removeAll` that removed nothing). Cheap for tracked
            // collections: copies that share their chunks compare by identity.
            if new == state { return nil }
            if patches && !wholeNext && delta.hasBaseline, let size = wholeSize, size <= store.wholeStateLimit {
                // A small state: whole, written by the delta encoder's walk (no diff; the walk is the baseline of
                // a patch once the state has grown).
                return .small(try delta.whole(new, capacity: size + 64))
            }
            if patches && !wholeNext, let change = try delta.change(to: new) {
                return change.isEmpty ? nil : .patch(change, bytes: change.bytes)
            }
            return .whole(try FluxJSON.encode(new), baseline: patches)
        }

        /// Puts `change` into a `done`, `patch` or `state` frame, and takes it as what fluxd now retains.
        mutating func add(_ change: Publication, new: State, to b: inout FrameBuilder) {
            switch change {
            case .patch(let c, let bytes):
                b.raw("patch", bytes)
                if let base { b.int("base", base) }
                base = base.map { $0 + 1 }
                delta.commit(c)
                wholeSize = nil
            case .small(let whole):
                b.raw("state", whole.bytes)
                // As for any whole state: the version it makes is not known here (fluxd makes none for bytes equal
                // to what it retains), so patches that may follow go without `base`.
                base = nil
                delta.commit(whole)
                wholeSize = whole.bytes.count
            case .whole(let bytes, let baseline):
                b.raw("state", bytes)
                wholeNext = false
                wholeSize = bytes.count
                // fluxd retains exactly these bytes now (or identical ones): later patches start from them, without
                // a `base` (the version is not known here).
                base = nil
                delta.forgetBaseline()
                if baseline { try? delta.setBaseline(new) }
            }
        }

        /// SPEC §16.6: a state larger than a frame, when fluxd retains none: the root as an empty container (a
        /// `state`, version 1), then patches that each fit in a frame (versions 2, 3, ...), sent before any answer
        /// (frames to fluxd keep their order). Later changes are patches from this state.
        mutating func publishInPieces(_ json: [UInt8]) {
            let maxFrame = client.welcome.limits.maxFrame ?? (1 << 20)
            do throws(FluxError) {
                guard patches else {
                    throw .invalidArgument("the state of \(store.name) (\(json.count) bytes) is larger than fluxd's maxFrame (\(maxFrame)), and this fluxd takes no patches (SPEC §16) to publish it in pieces")
                }
                let pieces: StatePieces
                do { pieces = try JSONValue(parsing: json).pieces(maxPatchBytes: maxFrame - 128 - nameJSON.count) } catch {
                    throw .invalidArgument("the state of \(store.name) cannot be published: \(error)")
                }
                piecesSent = pieces
                let version = try sendPieces(pieces, after: 0)
                store.logger.notice("store \(store.name): its state (\(json.count) bytes) is larger than a frame (\(maxFrame)); published in \(pieces.patches.count + 1) pieces (versions 1-\(version))")
            } catch {
                store.report(error)
            }
        }

        /// Sends the pieces after the one that made `version` (0: all of them, the root first); later changes are
        /// patches from the whole state. Returns the version the last piece makes.
        mutating func sendPieces(_ pieces: StatePieces, after version: Int) throws(FluxError) -> Int {
            if version == 0 {
                var b = FrameBuilder(op: "state")
                b.raw("store", nameJSON)
                b.raw("state", pieces.root.compactBytes)
                try client.send(frame: b.finish(), generation: generation)
            }
            var version = max(version, 1)
            for patch in pieces.patches[(version - 1)...] {
                let bytes = patch.compactBytes
                var p = FrameBuilder(op: "patch", capacity: 96 + nameJSON.count + bytes.count)
                p.raw("store", nameJSON)
                p.int("base", version)
                p.raw("patch", bytes)
                try client.send(frame: p.finish(), generation: generation)
                version += 1
            }
            delta.forgetBaseline()
            try? delta.setBaseline(state)
            base = delta.hasBaseline ? version : nil
            wholeSize = nil
            return version
        }

        /// SPEC §16.6, a publication cut short: when fluxd's retained state (`raw`, at `version`) is what the
        /// pieces up to `version` made, the store keeps its own state and sends the pieces after it (true); else
        /// it adopts fluxd's state as usual (false).
        mutating func resumePublication(_ pieces: StatePieces, raw: ArraySlice<UInt8>, version: Int) -> Bool {
            guard version >= 1, version <= pieces.patches.count else { return false }
            var partial = pieces.root
            for patch in pieces.patches[..<(version - 1)] {
                guard (try? partial.apply(patch)) != nil else { return false }
            }
            guard partial.compactBytes.elementsEqual(raw) else { return false }
            do {
                let last = try sendPieces(pieces, after: version)
                store.logger.notice("store \(store.name): fluxd took its state's pieces up to version \(version); sent the rest (versions \(version + 1)-\(last))")
                return true
            } catch {
                store.report(error)
                return false
            }
        }

        /// After adopting the retained state (its bytes `raw`, at `version`): patches start from it. When the
        /// state encodes to other bytes than fluxd's (another member order, a field the model does not keep), the
        /// store publishes its own encoding first, so that fluxd and the store agree on the JSON patches apply to.
        mutating func adoptBaseline(_ raw: ArraySlice<UInt8>, version: Int) {
            delta.forgetBaseline()
            base = nil
            wholeSize = raw.count
            guard patches, version > 0 else { return }
            do {
                try delta.setBaseline(state)
                if wholeNext { return }
                let mine = try FluxJSON.encode(state)
                if mine.elementsEqual(raw) {
                    base = version
                    return
                }
                let maxFrame = client.welcome.limits.maxFrame ?? Int.max
                if mine.count + 64 + nameJSON.count <= maxFrame {
                    var b = FrameBuilder(op: "state", capacity: 64 + mine.count)
                    b.string("store", store.name)
                    b.raw("state", mine)
                    try client.send(frame: b.finish(), generation: generation)
                    base = version + 1
                    return
                }
                // Larger than a frame (SPEC §16.6): what differs, as a patch from fluxd's state (member order
                // aside, which patches do not depend on).
                let patch = try JSONValue(parsing: raw).diffPatch(to: JSONValue(parsing: mine))
                if patch.isEmpty {
                    base = version
                    return
                }
                let bytes = patch.compactBytes
                guard bytes.count + 96 + nameJSON.count <= maxFrame else {
                    throw FluxError.invalidArgument("the state of \(store.name) differs from fluxd's by more than a frame holds")
                }
                var p = FrameBuilder(op: "patch", capacity: 96 + nameJSON.count + bytes.count)
                p.raw("store", nameJSON)
                p.int("base", version)
                p.raw("patch", bytes)
                try client.send(frame: p.finish(), generation: generation)
                base = version + 1
            } catch {
                delta.forgetBaseline()
                store.logger.debug("store \(store.name): no patches from the adopted state: \(error)")
            }
        }

        func carryOut(_ ctx: StoreContext) {
            if ctx.followUps.isEmpty && ctx.spawned.isEmpty { return }
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

// The loop's own types, outside the generic `FluxStore<State>` (where each use of a nested type looked its metadata
// up at run time).

enum StoreLoopStep { case next, stop }

/// `interrupted`: the connection was lost; the client reconnects, then the store registers again.
enum StoreLoopPhase { case registering, awaitingSnapshot, ready, interrupted }

/// How a new state is published: as a patch from the retained state (SPEC §16.2), or whole.
enum StorePublication {
    case patch(JSONDeltaEncoder.Change, bytes: [UInt8])
    /// A small state whole, written by the delta encoder (its walk becomes the baseline of the next change).
    case small(JSONDeltaEncoder.Whole)
    case whole([UInt8], baseline: Bool)

    /// Whether it goes as a patch (the `patch` op outside an action), not as a whole state (`state`).
    var isPatch: Bool { if case .patch = self { return true } else { return false } }

    var size: Int {
        switch self {
        case .patch(_, let bytes): return bytes.count
        case .small(let whole): return whole.bytes.count
        case .whole(let bytes, _): return bytes.count
        }
    }
}
