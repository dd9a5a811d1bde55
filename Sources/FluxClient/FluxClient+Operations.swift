import FluxCore
import Foundation

// The protocol's operations, typed: dispatch (fire-and-forget, settled, pipelined), introspection (`info`, `get`,
// `ping`), queries, and the host operations of fluxd as a plugin host (SPEC §8.11).
extension FluxClient {
    // MARK: Dispatch

    /// Dispatches an action without waiting for its settlement. Returns the id it was sent with: a `no-handler`
    /// (or other) error for it arrives on `errors` with that `ref` (or is reported by `confirmDispatched`).
    /// Never waits: the frame is queued for the writer (while the client reconnects, it is sent once connected
    /// again). Throws only when nothing could be sent.
    @discardableResult
    public func dispatch<P: Encodable>(type: String, payload: P, cause: Int? = nil) throws(FluxError) -> String {
        try dispatch(type: type, payloadJSON: FluxJSON.encode(payload), cause: cause)
    }

    /// Dispatches an action without payload (see `dispatch(type:payload:cause:)`).
    @discardableResult
    public func dispatch(type: String, cause: Int? = nil) throws(FluxError) -> String {
        try dispatch(type: type, payloadJSON: nil, cause: cause)
    }

    /// Dispatches an action whose payload is already JSON bytes (validated, then forwarded as they are).
    @discardableResult
    public func dispatch(type: String, payloadJSON: [UInt8]?, cause: Int? = nil) throws(FluxError) -> String {
        let id = nextID("d")
        try queueBytes(dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: false).wireBytes,
                       hold: true)
        try flush()
        return id
    }

    /// Dispatches an action and waits until fluxd accepted it (`ack`, SPEC §8.3, fluxd 0.4.0): returns its seq,
    /// or throws fluxd's refusal (`FluxError.server`: `no-handler`, `overloaded`, ...) to the caller. One round trip;
    /// the action's settlement is not awaited. (A fluxd before 0.4.0 sends no `accepted`: this times out.)
    @discardableResult
    public func dispatchAccepted(type: String, payloadJSON: [UInt8]?, cause: Int? = nil,
                                 timeout: Duration? = nil) async throws(FluxError) -> Int {
        let id = nextID("a")
        let frame = try dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: false, ack: true)
        let reply = try await request(key: id, frame: frame, timeout: timeout, what: "the acceptance of \(type)")
        guard reply.fluxString("op") == "accepted", let seq = reply.fluxInt("seq") else {
            throw .protocolViolation("expected accepted, got \(String(decoding: reply.body, as: UTF8.self))")
        }
        return seq
    }

    /// Dispatches an action with a payload and waits until fluxd accepted it (see `dispatchAccepted(type:payloadJSON:)`).
    @discardableResult
    public func dispatchAccepted<P: Encodable>(type: String, payload: P, cause: Int? = nil,
                                               timeout: Duration? = nil) async throws(FluxError) -> Int {
        try await dispatchAccepted(type: type, payloadJSON: try FluxJSON.encode(payload), cause: cause, timeout: timeout)
    }

    /// Waits until fluxd has taken the fire-and-forget dispatches with these ids (returned by `dispatch`): sends a
    /// `ping`, which fluxd answers after every reply to what was sent before it (SPEC §8.7), and throws the first
    /// refusal of one of them (`FluxError.server`, e.g. `no-handler`). Such refusals are not also put on `errors`.
    public func confirmDispatched(_ ids: [String], timeout: Duration? = nil) async throws(FluxError) {
        let key = nextID("b")
        state.withLock { $0.barriers[key] = (Set(ids), []) }
        defer { _ = state.withLock { $0.barriers.removeValue(forKey: key) } }
        var b = FrameBuilder(op: "ping")
        b.string("id", key)
        _ = try await request(key: key, frame: b.finish(), timeout: timeout, what: "fluxd to take \(ids.count) dispatch(es)")
        if let refused = state.withLock({ $0.barriers[key]?.refused.first }) { throw .server(refused) }
    }

    /// Dispatches an action and waits until every target store answered or gave up (within `timeout`, default
    /// `requestTimeout`, for the whole call). Throws `FluxError.server` (e.g. `no-handler`, `overloaded`) when fluxd
    /// refused the action. A store's rejection is a result in the `Settlement`, not an error: use
    /// `requireDone()` to turn it into one.
    ///
    /// Across a reconnection the settlement is recovered (SPEC §15.4): it completes as fluxd settled it; it throws
    /// `FluxError.notSent` when the action never reached fluxd (dispatch it again if you like), and
    /// `FluxError.disconnected` when its outcome cannot be known (fluxd lost its history, or reconnection is off).
    public func dispatchAndSettle<P: Encodable>(type: String, payload: P, cause: Int? = nil,
                                                timeout: Duration? = nil) async throws(FluxError) -> Settlement {
        try await dispatchAndSettle(type: type, payloadJSON: FluxJSON.encode(payload), cause: cause, timeout: timeout)
    }

    /// Dispatches an action without payload and waits for its settlement.
    public func dispatchAndSettle(type: String, cause: Int? = nil, timeout: Duration? = nil) async throws(FluxError) -> Settlement {
        try await dispatchAndSettle(type: type, payloadJSON: nil, cause: cause, timeout: timeout)
    }

    /// Dispatches an action whose payload is already JSON bytes and waits for its settlement.
    public func dispatchAndSettle(type: String, payloadJSON: [UInt8]?, cause: Int? = nil,
                                  timeout: Duration? = nil) async throws(FluxError) -> Settlement {
        let id = nextID("s")
        let frame = try dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: true)
        do {
            let reply = try await request(key: id, frame: frame, timeout: timeout, what: "the settlement of \(type)", settle: true)
            return try Self.parseSettlement(reply, id: id)
        } catch {
            throw await explainedTimeout(error, type: type)
        }
    }

    /// A settlement's timeout with what fluxd says the action still waits for appended (`waitingFor`); any other
    /// error as it is.
    func explainedTimeout(_ error: FluxError, type: String) async -> FluxError {
        guard case .timedOut(let message) = error else { return error }
        let note = await waitingFor(type: type)
        return note.isEmpty ? error : .timedOut(message + note)
    }

    /// What a settlement of `type` is still waiting for, as far as fluxd's `info` tells (asked with a 2-second
    /// limit; "" when it does not answer or nothing is pending): the stores handling the type that are down (fluxd
    /// keeps the action queued until they are back or their queue timeout ends), stalled, or busy, e.g.
    /// `; still waiting for store "stats", which is down (1 action queued for it; ...)`.
    public func waitingFor(type: String) async -> String {
        guard let info = try? await self.info(timeout: .seconds(2)) else { return "" }
        let targets = info.stores.filter { s in (s.handles ?? []).contains { Names.matches(pattern: $0, type: type) } }
        func actions(_ n: Int) -> String { n == 1 ? "1 action" : "\(n) actions" }
        let notes = targets.compactMap { s -> String? in
            if s.status == "down" {
                return "store \"\(s.name)\", which is down (\(actions(s.queued ?? 0)) queued for it; fluxd keeps them queued until the store is back or its queue timeout ends)"
            }
            if s.stalled == true { return "store \"\(s.name)\", which is stalled (an action unanswered for \((s.stalledFor ?? 0) / 1000) s)" }
            let ahead = (s.queued ?? 0) + (s.inflight ?? 0)
            if ahead > 0 { return "store \"\(s.name)\", which has \(actions(ahead)) to answer before this one" }
            return nil
        }
        return notes.isEmpty ? "" : "; still waiting for " + notes.joined(separator: "; ")
    }

    /// Dispatches a settled action now, in call order, and returns a ticket to await its settlement later: for
    /// pipelining (several actions in flight, sent in a known order). Never waits.
    public func beginDispatchAndSettle(type: String, payloadJSON: [UInt8]?, cause: Int? = nil) throws(FluxError) -> PendingSettlement {
        let id = nextID("s")
        try register(key: id, frame: dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: true),
                     settle: true)
        return PendingSettlement(client: self, id: id, type: type)
    }

    func dispatchFrame(id: String, type: String, payloadJSON: [UInt8]?, cause: Int?, settle: Bool, ack: Bool = false) throws(FluxError) -> Frame {
        guard Names.isValidType(type) else { throw .invalidArgument("bad action type \"\(type)\"") }
        if let payloadJSON { try FluxJSON.validate(payloadJSON) }
        var b = FrameBuilder(op: "dispatch", capacity: 64 + (payloadJSON?.count ?? 0))
        b.string("id", id)
        b.string("type", type)
        if let payloadJSON { b.raw("payload", payloadJSON) }
        if settle { b.bool("settle", true) }
        if ack { b.bool("ack", true) }
        if let cause { b.int("cause", cause) }
        return b.finish()
    }

    static func parseSettlement(_ env: Envelope, id: String) throws(FluxError) -> Settlement {
        struct RawResult: Decodable {
            struct RawError: Decodable { var code: String?; var message: String? }
            var store: String
            var status: String
            var version: Int?
            var error: RawError?
        }
        guard env.fluxString("op") == "settled", let seq = env.fluxInt("seq") else {
            throw .protocolViolation("bad settled message: \(String(decoding: env.body, as: UTF8.self))")
        }
        let raw = try env.raw("results").map { bytes throws(FluxError) in try FluxJSON.decode([RawResult].self, from: bytes) } ?? []
        let results = raw.map { r -> StoreResult in
            let code = r.error?.code ?? ""
            let message = r.error?.message ?? ""
            switch r.status {
            case "done": return StoreResult(store: r.store, status: .done(version: r.version ?? 0))
            case "rejected": return StoreResult(store: r.store, status: .rejected(code: code, message: message))
            default: return StoreResult(store: r.store, status: .unavailable(code: code.isEmpty ? r.status : code, message: message))
            }
        }
        return Settlement(id: id, seq: seq, results: results)
    }

    // MARK: Subscriptions

    /// Subscribes to a store's snapshots, decoded as `S`. The first event is `.subscribed(status)`, then the
    /// retained snapshot (if any), then newer ones, plus `.storeDown`/`.storeUp`.
    ///
    /// A store that never registered can be subscribed to (clients may start before stores): the status is then
    /// `unknown` (see `Subscription.status`) and snapshots come once it registers.
    ///
    /// Only the newest snapshot waits for a slow consumer (a newer one replaces it); status events are all kept.
    /// Several local subscriptions to one store share one wire subscription. The wire subscription is withdrawn
    /// (`unsubscribe`) when the last local one ends: its consumer's task is cancelled, it and its iterator are
    /// dropped (e.g. `break` out of `for try await`), or `cancel()` is called. It finishes with an error when the
    /// connection drops or a snapshot does not decode as `S`, and without one after `close()`.
    ///
    /// With a fluxd that has delta subscriptions (SPEC §16.3, fluxd 0.4.0), the subscription holds the state as
    /// JSON, applies each change fluxd sends as a patch, and decodes the typed state incrementally: a
    /// `TrackedArray` in `S` that the patch did not touch is the earlier value again, and one whose elements it
    /// touched decodes only those elements (the rest of `S` is decoded again). A change that cannot be applied
    /// makes the subscription ask fluxd for the whole state again.
    public func subscribe<S: Decodable & Sendable>(store: String, as type: S.Type = S.self) -> Subscription<S> {
        let reader = StateReader<S, TypedCodec<S>>.typed(S.self)
        return subscribe(store: store) { raw throws(FluxError) in try reader.read(raw) }
    }

    /// Subscribes to a store's snapshots as JSON (for tools; see `subscribe(store:as:)`): whole snapshots as the
    /// store published them, states made by patches as compact JSON.
    public func subscribeJSON(store: String) -> Subscription<RawJSON> {
        let reader = StateReader<RawJSON, Void>.json()
        return subscribe(store: store) { raw throws(FluxError) in try reader.read(raw) }
    }

    private func subscribe<S: Sendable>(store: String, read: @escaping @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<S>) -> Subscription<S> {
        let core = SubscriptionCore(client: self, store: store)
        guard Names.isValidStore(store) else {
            core.queue.finish(.invalidArgument("bad store name \"\(store)\""))
            return Subscription(core: core, read: read)
        }
        core.attach(addSubscriber(store: store, .queue(core.queue)))
        return Subscription(core: core, read: read)
    }

    /// Adds a local subscriber to `store`'s wire subscription (sending `subscribe` if it is the first), whose
    /// events are handed to `deliver` in wire order, one at a time, with no lock held (it may call the client).
    /// `end` is called once, after the last event, when the subscriber is removed or the connection ends.
    package func addSubscriber(
        store: String,
        deliver: @escaping @Sendable (WireStoreEvent) -> Void,
        end: @escaping @Sendable (FluxError?) -> Void
    ) -> Int? {
        // Such subscribers get whole snapshots: deltas are applied to a state held for this subscriber, and the
        // result rendered (a tool's or a following store's cost; typed subscriptions decode deltas incrementally).
        let whole = WholeSnapshots()
        let client = self
        return addSubscriber(store: store, .callback(CallbackQueue(deliver: { event in
            guard case .snapshot(let raw) = event else { return deliver(event) }
            switch whole.take(raw) {
            case .deliver(let snapshot): deliver(.snapshot(snapshot))
            case .skip: break
            case .resync: client.resync(store: store)
            }
        }, end: end)))
    }

    /// Adds a local subscriber that gets what fluxd sends as it is, deltas (SPEC §16.3) included, in wire order:
    /// for a reader that applies them itself (a store following another one, `FluxStore.follow`). A delta that does
    /// not apply is the reader's to report with `resync(store:)`.
    package func addDeltaSubscriber(
        store: String,
        deliver: @escaping @Sendable (WireStoreEvent) -> Void,
        end: @escaping @Sendable (FluxError?) -> Void
    ) -> Int? {
        addSubscriber(store: store, .callback(CallbackQueue(deliver: deliver, end: end)))
    }

    private func addSubscriber(store: String, _ subscriber: Subscriber) -> Int? {
        let id = state.withLock { s -> Int? in
            if let terminal = s.terminal {
                subscriber.end(terminal == .closed ? nil : terminal)
                return nil
            }
            s.nextSubscriber += 1
            let id = s.nextSubscriber
            if var sub = s.subscriptions[store] {
                // Served from what the wire subscription already knows, before anything newer (same lock).
                if let status = sub.status { subscriber.push(.subscribed(status, version: sub.version)) }
                if let latest = sub.latest, latest.version == sub.delivered {
                    subscriber.push(.snapshot(latest))
                } else if sub.delivered > 0 && s.phase == .ready {
                    // Deltas came after the last whole snapshot: ask fluxd for the whole state again (those that
                    // hold it drop it).
                    sub.resyncing = true
                    s.outbox.append(contentsOf: Self.subscribeFrame(store: store, deltas: s.deltas, from: nil).wireBytes)
                }
                sub.subscribers[id] = subscriber
                s.subscriptions[store] = sub
            } else {
                var sub = WireSubscription()
                sub.subscribers[id] = subscriber
                s.subscriptions[store] = sub
                // While reconnecting, the reconnection subscribes to every store then in `subscriptions`.
                guard s.phase != .reconnecting else { return id }
                s.outbox.append(contentsOf: Self.subscribeFrame(store: store, deltas: s.deltas, from: nil).wireBytes)
            }
            return id
        }
        subscriber.run()
        try? flush()
        return id
    }

    /// `subscribe` for `store`: a delta subscription when fluxd has them (SPEC §16.3), resuming from `from`.
    static func subscribeFrame(store: String, deltas: Bool, from: Int?) -> Frame {
        var b = FrameBuilder(op: "subscribe")
        b.string("store", store)
        if deltas {
            b.bool("deltas", true)
            if let from, from > 0 { b.int("from", from) }
        }
        return b.finish()
    }

    /// Asks fluxd for `store`'s whole state again (`subscribe` again, SPEC §16.3 resync): its snapshot goes to every
    /// local subscriber, and those that hold that version already drop it.
    package func resync(store: String) {
        let sent = state.withLock { s -> Bool in
            guard s.phase == .ready, s.subscriptions[store] != nil else { return false }
            s.subscriptions[store]?.resyncing = true
            s.outbox.append(contentsOf: Self.subscribeFrame(store: store, deltas: s.deltas, from: nil).wireBytes)
            return true
        }
        if sent { try? flush() }
    }

    /// Removes a local subscriber (sending `unsubscribe` if it was the last) and ends it.
    package func removeSubscriber(store: String, id: Int) {
        let removed = state.withLock { s -> Subscriber? in
            guard var sub = s.subscriptions[store], let subscriber = sub.subscribers.removeValue(forKey: id) else {
                return nil
            }
            if sub.subscribers.isEmpty {
                s.subscriptions[store] = nil
                if s.terminal == nil && s.phase != .reconnecting {
                    s.draining[store, default: 0] += 1
                    var b = FrameBuilder(op: "unsubscribe")
                    b.string("store", store)
                    s.outbox.append(contentsOf: b.finish().wireBytes)
                }
            } else {
                s.subscriptions[store] = sub
            }
            subscriber.end(nil)
            return subscriber
        }
        guard let removed else { return }
        try? flush()
        removed.run()
    }

    // MARK: Monitoring

    /// fluxd's monitor stream (SPEC §8.10): every dispatch, settlement, snapshot, store-up/down, connect,
    /// disconnect and error on the bus, for a client connected with role `monitor`. One consumer per call; up to
    /// `buffer` events wait for it, older ones are dropped and reported as a `missed` event (fluxd itself drops
    /// events for a monitor that does not read fast enough, and says so the same way).
    public func monitorEvents(buffer: Int = 65_536) -> MonitorEvents {
        let queue = EventQueue<MonitorEvent>(limit: max(1, buffer))
        let id = addMonitorListener(.queue(queue))
        return MonitorEvents(queue: queue, token: MonitorToken(client: self, id: id))
    }

    /// Hands every monitor event to `deliver` in wire order, one at a time, with no lock held (see `addSubscriber`).
    package func addMonitorListener(deliver: @escaping @Sendable (MonitorEvent) -> Void,
                                    end: @escaping @Sendable (FluxError?) -> Void) -> Int? {
        addMonitorListener(.callback(CallbackQueue(deliver: deliver, end: end)))
    }

    private func addMonitorListener(_ listener: MonitorListener) -> Int? {
        let id = state.withLock { s -> Int? in
            if let terminal = s.terminal {
                switch listener {
                case .queue(let q): q.finish(terminal == .closed ? nil : terminal)
                case .callback(let c): c.enqueue(.end(terminal == .closed ? nil : terminal))
                }
                return nil
            }
            s.nextSubscriber += 1
            s.monitors[s.nextSubscriber] = listener
            return s.nextSubscriber
        }
        if id == nil, case .callback(let c) = listener { c.run() }
        return id
    }

    /// Stops handing monitor events to listener `id` (and ends it).
    package func removeMonitorListener(_ id: Int) {
        guard let listener = state.withLock({ $0.monitors.removeValue(forKey: id) }) else { return }
        switch listener {
        case .queue(let q): q.finish(nil)
        case .callback(let c):
            c.enqueue(.end(nil))
            c.run()
        }
    }

    // MARK: Queries

    /// Declares a query on a store (WordPressFlux's Query); it stays active until the returned receipt is
    /// cancelled or released, or the client ends (it is declared again after a reconnection). The query is
    /// encoded with sorted keys, so equal queries from different clients are deduplicated by fluxd.
    public func query<Q: Encodable>(store: String, _ query: Q, timeout: Duration? = nil) async throws(FluxError) -> QueryReceipt {
        try await self.query(store: store, queryJSON: FluxJSON.encode(query), timeout: timeout)
    }

    /// Declares a query given as JSON bytes.
    public func query(store: String, queryJSON: [UInt8], timeout: Duration? = nil) async throws(FluxError) -> QueryReceipt {
        guard Names.isValidStore(store) else { throw .invalidArgument("bad store name \"\(store)\"") }
        try FluxJSON.validate(queryJSON)
        let id = nextID("q")
        var b = FrameBuilder(op: "query", capacity: 64 + queryJSON.count)
        b.string("id", id)
        b.string("store", store)
        b.raw("query", queryJSON)
        do {
            _ = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd to accept a query on \(store)")
        } catch {
            if error == .cancelled || { if case .timedOut = error { return true } else { return false } }() {
                unquery(id: id) // The query may have reached fluxd; withdraw it.
            }
            throw error
        }
        // Declared again on every new connection (after a reconnection) until the receipt is cancelled.
        state.withLock { $0.liveQueries[id] = (store, queryJSON) }
        return QueryReceipt(client: self, id: id, store: store)
    }

    /// Sends `unquery` (fire-and-forget; `unquery-ok` is not awaited).
    package func unquery(id: String) {
        _ = state.withLock { $0.liveQueries.removeValue(forKey: id) }
        var b = FrameBuilder(op: "unquery")
        b.string("id", id)
        try? send(frame: b.finish())
    }

    // MARK: Introspection

    /// Asks fluxd for its introspection data (stores, peers, counters, memory budget, load).
    public func info(timeout: Duration? = nil) async throws(FluxError) -> BusInfo {
        let id = nextID("r")
        var b = FrameBuilder(op: "info")
        b.string("id", id)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd's info")
        var info = try FluxJSON.decode(BusInfo.self, from: reply.body)
        info.json = reply.body
        return info
    }

    /// Reads a store's retained snapshot. Throws `unknown-store` when fluxd retains none.
    public func get<S: Decodable>(store: String, as type: S.Type = S.self, timeout: Duration? = nil) async throws(FluxError) -> Snapshot<S> {
        let raw = try await getJSON(store: store, timeout: timeout)
        return Snapshot(store: raw.store, version: raw.version, seq: raw.seq, state: try FluxJSON.decode(S.self, from: raw.state.bytes))
    }

    /// Reads a store's retained snapshot as the JSON the store published (for tools).
    public func getJSON(store: String, timeout: Duration? = nil) async throws(FluxError) -> Snapshot<RawJSON> {
        guard Names.isValidStore(store) else { throw .invalidArgument("bad store name \"\(store)\"") }
        let id = nextID("r")
        var b = FrameBuilder(op: "get")
        b.string("id", id)
        b.string("store", store)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "the state of \(store)")
        guard let version = reply.fluxInt("version"), let raw = reply.raw("state") else {
            throw .protocolViolation("bad got message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return Snapshot(store: reply.fluxString("store") ?? store, version: version, seq: reply.fluxInt("seq") ?? 0,
                        state: RawJSON(Array(raw)))
    }

    /// Round trip to fluxd and back.
    public func ping(timeout: Duration? = nil) async throws(FluxError) -> Duration {
        let id = nextID("p")
        var b = FrameBuilder(op: "ping")
        b.string("id", id)
        let frame = b.finish()
        let clock = ContinuousClock()
        let start = clock.now
        _ = try await request(key: id, frame: frame, timeout: timeout, what: "pong")
        return clock.now - start
    }

    // MARK: Host operations (SPEC §8.11)

    /// The workers fluxd supervises (`fluxd --config FILE`), in start order. A fluxd without `--config` refuses
    /// with `unknown-op`.
    public func workers(timeout: Duration? = nil) async throws(FluxError) -> [Worker] {
        let id = nextID("w")
        var b = FrameBuilder(op: "workers")
        b.string("id", id)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd's workers")
        guard reply.fluxString("op") == "workers", let list = reply.raw("workers") else {
            throw .protocolViolation("bad workers message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return try Self.objects(in: list).map { (o: ArraySlice<UInt8>) throws(FluxError) -> Worker in try Worker(object: o) }
    }

    /// Restarts a worker (stops it if it runs, then starts it; a failed or stopped one gets a new chance). Returns
    /// the worker right after the request was applied (typically `stopping` or `starting`). A name fluxd's config
    /// does not have is refused with `unknown-worker`.
    public func restartWorker(_ name: String, timeout: Duration? = nil) async throws(FluxError) -> Worker {
        try await workerRequest(.restartWorker, name, timeout: timeout)
    }

    /// Stops a worker until it is restarted (see `restartWorker`).
    public func stopWorker(_ name: String, timeout: Duration? = nil) async throws(FluxError) -> Worker {
        try await workerRequest(.stopWorker, name, timeout: timeout)
    }

    /// Asks fluxd to read its config file again (`fluxd --config FILE`; SPEC §8.11, docs/configuration.md): workers
    /// added, removed or changed are started, stopped or restarted, and the settings a running fluxd can change
    /// (log level and format) are applied. All or nothing: a fluxd without a config file, a file that is not valid,
    /// or one that changes a setting that takes a restart is refused with `reload-refused` (the message says why),
    /// and nothing changes. Privileged: fluxd's own user, root and the config's admins (`forbidden` for others).
    public func reload(timeout: Duration? = nil) async throws(FluxError) -> ReloadResult {
        let id = nextID("r")
        var b = FrameBuilder(op: "reload")
        b.string("id", id)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd to reload its config")
        guard reply.fluxString("op") == "reloaded", let workers = reply.raw("workers"), let settings = reply.raw("settings"),
              let w = try? Envelope(body: Array(workers)),
              let s = try? Envelope(body: Array("{\"s\":".utf8) + Array(settings) + [UInt8(ascii: "}")]) else {
            throw .protocolViolation("bad reloaded message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return ReloadResult(added: w.stringArray("added").value ?? [], removed: w.stringArray("removed").value ?? [],
                            changed: w.stringArray("changed").value ?? [], settings: s.stringArray("s").value ?? [])
    }

    /// Forgets a store that is down for good (SPEC §10): its queued actions settle `store-unavailable`, its
    /// subscribers get `store-down` with reason `forgotten`, its state, routes and registration go; a store of the
    /// name registered later starts anew. Returns how many queued actions were given up. A store that is up is
    /// refused with `store-is-up`, a name with no registered store with `unknown-store`. Privileged: fluxd's own
    /// user, root and the config's admins (`forbidden` for others).
    public func forget(store: String, timeout: Duration? = nil) async throws(FluxError) -> Int {
        guard Names.isValidStore(store) else { throw .invalidArgument("bad store name \"\(store)\"") }
        let id = nextID("f")
        var b = FrameBuilder(op: "forget")
        b.string("id", id)
        b.string("store", store)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd to forget store \"\(store)\"")
        guard reply.fluxString("op") == "forgotten", let gaveUp = reply.fluxInt("gaveUp") else {
            throw .protocolViolation("bad forgotten message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return gaveUp
    }

    private func workerRequest(_ op: Op, _ name: String, timeout: Duration?) async throws(FluxError) -> Worker {
        guard Names.isValidWorker(name) else { throw .invalidArgument("bad worker name \"\(name)\"") }
        let id = nextID("w")
        var b = op == .stopWorker ? FrameBuilder(op: "stop-worker") : FrameBuilder(op: "restart-worker")
        b.string("id", id)
        b.string("name", name)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd to \(op == .stopWorker ? "stop" : "restart") \(name)")
        guard reply.fluxString("op") == "worker", let worker = reply.raw("worker") else {
            throw .protocolViolation("bad worker message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return try Worker(object: worker)
    }

    /// The object elements of a JSON array fluxd sent (the frame was validated by FluxCore's scanner on receipt:
    /// this only finds where each element starts and ends), as byte slices.
    static func objects(in array: ArraySlice<UInt8>) throws(FluxError) -> [ArraySlice<UInt8>] {
        // FluxCore's validating scanner: no second JSON grammar here.
        guard let elements = jsonArrayElements(array), elements.allSatisfy({ $0.kind == .object }) else {
            throw .protocolViolation("fluxd sent a list that is not an array of objects")
        }
        return elements.map(\.bytes)
    }
}

/// A settled dispatch already sent (`FluxClient.beginDispatchAndSettle`), whose settlement is awaited later.
public struct PendingSettlement: Sendable {
    let client: FluxClient
    /// The dispatch id.
    public let id: String
    /// The action type.
    public let type: String

    /// Waits for the settlement (within `timeout`, default the client's `requestTimeout`, from this call on).
    public func settlement(timeout: Duration? = nil) async throws(FluxError) -> Settlement {
        let limit = timeout ?? client.requestTimeout
        do {
            let reply = try await client.awaitAnswer(key: id, deadline: .now + limit, limit: limit,
                                                     what: "the settlement of \(type)")
            return try FluxClient.parseSettlement(reply, id: id)
        } catch {
            throw await client.explainedTimeout(error, type: type)
        }
    }
}

extension Settlement {
    /// The settlement when every target store answered `done`; otherwise throws `FluxError.rejected` for the first
    /// store that rejected the action, or `FluxError.server` (`store-unavailable`) for one that was unavailable.
    @discardableResult
    public func requireDone() throws(FluxError) -> Settlement {
        for result in results {
            switch result.status {
            case .done: continue
            case .rejected(let code, let message): throw .rejected(store: result.store, code: code, message: message)
            case .unavailable(let code, let message):
                throw .server(ServerError(rawCode: code, message: message, ref: result.store))
            }
        }
        return self
    }
}
