import FluxCore
import FluxJSONValue

// Path subscriptions (SPEC §16.4): `subscribe` with `path`, answered `subscribed` echoing the path, then `subtree`
// frames. They live beside the whole-store subscriptions (`State.subscriptions`) and never share their events: a
// `subscribed`/`unsubscribed` with a `path` and every `subtree` go to the path subscription they name only;
// `store-down`/`store-up` (sent once per connection and store) go to both.

/// A path subscription's key: the store and the pointer as given (fluxd echoes it as given).
struct PathKey: Hashable, Comparable {
    var store: String
    var path: String

    static func < (a: PathKey, b: PathKey) -> Bool { (a.store, a.path) < (b.store, b.path) }
}

/// One wire path subscription, shared by the local subscriptions to the same store and path.
struct WirePathSubscription {
    var subscribers: [Int: EventQueue<WirePathEvent>] = [:]
    var status: StoreStatus?
    var version = 0
    /// The newest value received (a subscriber added later starts from it).
    var latest: RawSubtree?
    /// The newest version handed to the subscribers (within the current era): older ones are dropped.
    var delivered = 0
    /// When a `subscribe` for it waits for its `subscribed` on this connection: its place among those sent
    /// (`State.pathOrder`), so a refusal goes to the oldest.
    var awaiting: Int?
}

extension FluxClient {
    /// The longest JSON Pointer fluxd takes (SPEC §16.4), in UTF-8 bytes.
    public static let maxPathBytes = 1024

    /// Subscribes to the value at JSON Pointer `path` inside `store`'s state (SPEC §16.4), decoded as `S`. The first
    /// event is `.subscribed(status)`, then the retained version's value (`Subtree.exists` false when the state has
    /// nothing at `path`), then one for each version whose change touches `path`: a change elsewhere in the state
    /// sends nothing, so a subscriber that reads one todo of a large state is neither woken nor sent data by
    /// changes to the others. Removing or inserting an array element before the path touches it (the value there
    /// is now another element's). A change may touch the path without changing its value (the same value then
    /// comes with the new version).
    ///
    /// `path` is an RFC 6901 pointer (`""` for the whole state, `/todos/3`, `~0` for `~` and `~1` for `/` in a
    /// token) of at most `maxPathBytes` bytes; anything else throws `FluxError.invalidArgument` and nothing is sent.
    /// A fluxd without path subscriptions (before 0.4.0: its welcome has no `limits.deltaHistory`) makes this throw
    /// `FluxError.invalidArgument` too, with nothing sent. A store that never registered can be subscribed to: the
    /// status is then `unknown` and values come once it does. A client that has ended throws its ending
    /// (`FluxError.closed` after `close()`).
    ///
    /// Only the newest value waits for a slow consumer; status events are all kept. One connection may hold the
    /// whole-store subscription (`subscribe(store:as:)`) and any number of path subscriptions of one store at once;
    /// each counts against `limits.maxSubscriptions` (a refusal, e.g. `limit-exceeded`, ends the subscription
    /// with `FluxError.server`). Several local subscriptions to the same store and path share one wire
    /// subscription, withdrawn (`unsubscribe` with `path`) when the last one ends: its consumer's task is
    /// cancelled, it and its iterator are dropped, or `cancel()` is called. After a reconnection the path is
    /// subscribed again (a value not newer than the last one delivered is dropped; after a change of fluxd
    /// history versions start over). It finishes with an error when the connection is lost for good or a value
    /// does not decode as `S`, and without one after `close()`.
    public func subscribe<S: Decodable & Sendable>(store: String, path: String,
                                                   as type: S.Type = S.self) throws(FluxError) -> PathSubscription<S> {
        try subscribePath(store: store, path: path) { bytes throws(FluxError) in try FluxJSON.decode(S.self, from: bytes) }
    }

    /// Subscribes to the value at JSON Pointer `path` inside `store`'s state as JSON (for tools; see
    /// `subscribe(store:path:as:)`): each value is the JSON fluxd sent (its compact rendering of the state's part).
    public func subscribeJSON(store: String, path: String) throws(FluxError) -> PathSubscription<RawJSON> {
        try subscribePath(store: store, path: path) { bytes throws(FluxError) in RawJSON(Array(bytes)) }
    }

    /// Checks `path` as fluxd would (SPEC §16.4: RFC 6901 syntax, at most `maxPathBytes` bytes).
    static func validatePath(_ path: String) throws(FluxError) {
        let bytes = path.utf8.count
        guard bytes <= maxPathBytes else {
            throw .invalidArgument("a path subscription's JSON Pointer has at most \(maxPathBytes) bytes (this one has \(bytes))")
        }
        do {
            _ = try JSONPointer(parsing: path)
        } catch {
            throw .invalidArgument("\(error.message): a path is \"\" (the whole state) or /token/... (RFC 6901)")
        }
    }

    private func subscribePath<S: Sendable>(
        store: String, path: String, decode: @escaping @Sendable (ArraySlice<UInt8>) throws(FluxError) -> S
    ) throws(FluxError) -> PathSubscription<S> {
        guard Names.isValidStore(store) else { throw .invalidArgument("bad store name \"\(store)\"") }
        try Self.validatePath(path)
        let (speaks16, server, terminal) = state.withLock { ($0.deltas, $0.welcome?.server ?? "fluxd", $0.terminal) }
        if let terminal { throw terminal }
        guard speaks16 else {
            throw .invalidArgument("\(server) has no path subscriptions (its welcome has no limits.deltaHistory): they need fluxd 0.4.0 or newer (SPEC §16.4); nothing was sent")
        }
        let core = PathSubscriptionCore(client: self, store: store, path: path)
        core.attach(addPathSubscriber(PathKey(store: store, path: path), core.queue))
        return PathSubscription(core: core, decode: decode)
    }

    /// `subscribe` for a path subscription.
    static func pathSubscribeFrame(_ key: PathKey) -> Frame {
        var b = FrameBuilder(op: "subscribe")
        b.string("store", key.store)
        b.string("path", key.path)
        return b.finish()
    }

    /// Adds a local subscriber to a wire path subscription (sending `subscribe` if it is the first).
    private func addPathSubscriber(_ key: PathKey, _ queue: EventQueue<WirePathEvent>) -> Int? {
        let id = state.withLock { s -> Int? in
            if let terminal = s.terminal {
                queue.finish(terminal == .closed ? nil : terminal)
                return nil
            }
            s.nextSubscriber += 1
            let id = s.nextSubscriber
            if var sub = s.pathSubscriptions[key] {
                // Served from what the wire subscription already knows, before anything newer (same lock).
                if let status = sub.status { queue.push(.subscribed(status, version: sub.version)) }
                if let latest = sub.latest { queue.push(.subtree(latest)) }
                sub.subscribers[id] = queue
                s.pathSubscriptions[key] = sub
            } else {
                var sub = WirePathSubscription()
                sub.subscribers[id] = queue
                // While reconnecting, the reconnection subscribes to every path then in `pathSubscriptions`.
                if s.phase != .reconnecting {
                    s.pathOrder += 1
                    sub.awaiting = s.pathOrder
                    s.outbox.append(contentsOf: Self.pathSubscribeFrame(key).wireBytes)
                }
                s.pathSubscriptions[key] = sub
            }
            return id
        }
        try? flush()
        return id
    }

    /// Removes a local path subscriber (sending `unsubscribe` with the path if it was the last) and ends it.
    func removePathSubscriber(store: String, path: String, id: Int) {
        let key = PathKey(store: store, path: path)
        let removed = state.withLock { s -> Bool in
            guard var sub = s.pathSubscriptions[key], let queue = sub.subscribers.removeValue(forKey: id) else {
                return false
            }
            if sub.subscribers.isEmpty {
                s.pathSubscriptions[key] = nil
                if s.terminal == nil && s.phase != .reconnecting {
                    s.pathDraining[key, default: 0] += 1
                    var b = FrameBuilder(op: "unsubscribe")
                    b.string("store", store)
                    b.string("path", path)
                    s.outbox.append(contentsOf: b.finish().wireBytes)
                }
            } else {
                s.pathSubscriptions[key] = sub
            }
            queue.finish(nil)
            return true
        }
        if removed { try? flush() }
    }

    /// A subscription message for path subscriptions: `subscribed`/`unsubscribed` with `path`, `subtree`, and
    /// `store-down`/`store-up` (for every path subscription of the store).
    func handlePathMessage(_ op: String, _ env: Envelope) {
        let store = env.fluxString("store") ?? ""
        var problem: FluxError?
        state.withLock { s in
            if op == "store-down" || op == "store-up" {
                let event: WirePathEvent = op == "store-down"
                    ? .storeDown(env.fluxString("reason") ?? "unknown") : .storeUp(env.fluxInt("version") ?? 0)
                for key in s.pathSubscriptions.keys.sorted() where key.store == store {
                    guard var sub = s.pathSubscriptions[key] else { continue }
                    if case .storeUp(let version) = event {
                        sub.status = .up
                        sub.version = max(sub.version, version)
                    } else {
                        sub.status = .down
                    }
                    s.pathSubscriptions[key] = sub
                    for id in sub.subscribers.keys.sorted() { sub.subscribers[id]!.push(event) }
                }
                return
            }
            guard let path = env.fluxString("path") else {
                problem = .protocolViolation("fluxd sent \(op) for \(store) without a path")
                return
            }
            let key = PathKey(store: store, path: path)
            if op == "unsubscribed" {
                if let n = s.pathDraining[key] { s.pathDraining[key] = n > 1 ? n - 1 : nil }
                return
            }
            // Frames for a path subscription we withdrew, up to its `unsubscribed`, belong to no one.
            guard s.pathDraining[key] == nil, var sub = s.pathSubscriptions[key] else { return }
            let event: WirePathEvent
            if op == "subscribed" {
                let status = StoreStatus(rawValue: env.fluxString("status") ?? "") ?? .unknown
                let version = env.fluxInt("version") ?? sub.version
                sub.status = status
                sub.version = max(sub.version, version)
                sub.awaiting = nil
                event = .subscribed(status, version: version)
            } else { // subtree
                guard let version = env.fluxInt("version"), let exists = env.bool("exists").value else {
                    problem = .protocolViolation("bad subtree message for \(path) in \(store)")
                    return
                }
                let value = exists ? env.raw("value") : nil
                if exists && value == nil {
                    problem = .protocolViolation("subtree of \(path) in \(store) version \(version) exists but has no value")
                    return
                }
                // Versions only grow (R4): one not above the last delivered is a repeat (after a reconnection, the
                // retained version's value sent again on subscribing) and is not delivered twice.
                guard version > sub.delivered else { return }
                let raw = RawSubtree(store: store, path: path, version: version, seq: env.fluxInt("seq") ?? 0,
                                     value: value, era: s.era)
                sub.delivered = version
                sub.latest = raw
                sub.version = max(sub.version, version)
                event = .subtree(raw)
            }
            s.pathSubscriptions[key] = sub
            for id in sub.subscribers.keys.sorted() { sub.subscribers[id]!.push(event) }
        }
        if let problem { reportUnanswered(problem) }
    }

    /// An `error` whose `ref` is `store`, when a path subscription of that store waits for its `subscribed` and
    /// no whole-store subscription of it is held (whose `subscribe` the error could answer instead): fluxd refused
    /// the oldest such subscription (`limit-exceeded`, `memory-budget`), which ends with the error. Under the lock.
    /// False when no path subscription takes it.
    static func refusePathSubscription(_ s: inout State, store: String, error: ServerError) -> Bool {
        guard s.subscriptions[store] == nil else { return false }
        let waiting = s.pathSubscriptions.filter { $0.key.store == store && $0.value.awaiting != nil }
        guard let (key, sub) = waiting.min(by: { $0.value.awaiting! < $1.value.awaiting! }) else { return false }
        s.pathSubscriptions[key] = nil
        for id in sub.subscribers.keys.sorted() { sub.subscribers[id]!.finish(.server(error)) }
        return true
    }

    /// After a reconnection (under the lock, from `resume`): the frames subscribing every path again, in order
    /// (values start over when fluxd's history changed). A fluxd that no longer has path subscriptions (an older
    /// one) ends them with an error.
    static func resubscribePaths(_ s: inout State, epochChanged: Bool) -> [UInt8] {
        s.pathDraining = [:]
        var out: [UInt8] = []
        for key in s.pathSubscriptions.keys.sorted() {
            guard var sub = s.pathSubscriptions[key] else { continue }
            guard s.deltas else {
                let error = FluxError.invalidArgument(
                    "reconnected to \(s.welcome?.server ?? "a fluxd"), which has no path subscriptions (SPEC §16.4, fluxd 0.4.0): the subscription to \(key.path) in \(key.store) ended")
                for id in sub.subscribers.keys.sorted() { sub.subscribers[id]!.finish(error) }
                s.pathSubscriptions[key] = nil
                continue
            }
            if epochChanged {
                sub.version = 0
                sub.delivered = 0
                sub.latest = nil
            }
            s.pathOrder += 1
            sub.awaiting = s.pathOrder
            s.pathSubscriptions[key] = sub
            out.append(contentsOf: pathSubscribeFrame(key).wireBytes)
        }
        return out
    }

    /// Ends every path subscription (the client ended; under the lock, from `finish`).
    static func endPathSubscriptions(_ s: inout State, _ error: FluxError?) {
        for sub in s.pathSubscriptions.values {
            for queue in sub.subscribers.values { queue.finish(error) }
        }
        s.pathSubscriptions = [:]
        s.pathDraining = [:]
    }
}
