import FluxCore
import Foundation
import Synchronization

/// One event of a wire subscription before decoding (what `FluxClient` hands to its local subscribers).
package enum WireStoreEvent: Sendable {
    case subscribed(StoreStatus)
    case snapshot(RawSnapshot)
    case storeDown(String)
    case storeUp(Int)
}

/// A snapshot whose state is still JSON bytes.
package struct RawSnapshot: Sendable {
    package var store: String
    package var version: Int
    package var seq: Int
    package var state: ArraySlice<UInt8>
}

/// What a store registered through a client receives: its messages (`registered`, its own `snapshot`, `queries`,
/// `action`, and `error`s whose ref is the store's name) in wire order, then the end of the connection.
package enum StoreInbound: Sendable {
    case message(Envelope)
    /// The connection ended: nil when closed locally, else why.
    case ended(FluxError?)
}

/// A connection to fluxd speaking protocol v1: dispatch actions (fire-and-forget or settled), subscribe to stores'
/// snapshots, declare queries, introspect.
///
/// Create one with `connect(socketPath:name:role:)` (or `connect(over:name:role:)` for another transport such as
/// FluxTesting's in-memory bus). All methods may be called from any task or thread.
///
/// Errors: fluxd's `error` replies become `FluxError.server` with the stable `ErrorCode`. A reply is matched to its
/// request by the id the client generated. Errors that answer no awaited request — notably `no-handler` for a
/// fire-and-forget `dispatch` — are delivered on the `errors` stream (its `ref` is the id `dispatch` returned).
/// When the connection drops, every awaited call throws `FluxError.disconnected` and every subscription finishes
/// with that error. Awaited calls have no built-in timeout; wrap them if you need one. Call `close()` when done.
public final class FluxClient: Sendable {
    private enum Phase: Equatable { case handshaking, ready, closing, closed }

    private struct Subscriber {
        let deliver: @Sendable (WireStoreEvent) -> Void
        let end: @Sendable (FluxError?) -> Void
    }

    private struct WireSubscription {
        var subscribers: [Int: Subscriber] = [:]
        var status: StoreStatus?
        var latest: RawSnapshot?
    }

    private struct State {
        var phase = Phase.handshaking
        var welcome: Welcome?
        var terminal: FluxError?
        var nextID = 0
        var pending: [String: CheckedContinuation<Envelope, any Error>] = [:]
        var subscriptions: [String: WireSubscription] = [:]
        var draining: [String: Int] = [:]
        var nextSubscriber = 0
        var sinks: [String: @Sendable (StoreInbound) -> Void] = [:]
        var taps: [Int: AsyncStream<[UInt8]>.Continuation] = [:]
        var nextTap = 0
        var byeReason: String?
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
        var outbox: [UInt8] = []
    }

    private static let helloKey = "#hello"

    private let state = Mutex(State())
    private let sendLock = Mutex(())
    private let errorsContinuation: AsyncStream<FluxError>.Continuation

    /// The transport this client speaks over.
    public let connection: any FluxConnection
    /// The peer name announced in `hello`.
    public let name: String
    /// The role announced in `hello`.
    public let role: Role
    /// Errors from fluxd that answer no awaited call (e.g. `no-handler` for a fire-and-forget dispatch), and
    /// frames from fluxd this SDK could not read. Newest 256 kept; finishes when the connection ends. One consumer.
    public let errors: AsyncStream<FluxError>

    private init(connection: any FluxConnection, name: String, role: Role) {
        self.connection = connection
        self.name = name
        self.role = role
        (errors, errorsContinuation) = AsyncStream.makeStream(of: FluxError.self, bufferingPolicy: .bufferingNewest(256))
    }

    // MARK: Connecting

    /// Connects to fluxd's Unix socket and does the `hello`/`welcome` handshake.
    ///
    /// Before sending anything it checks who listens on the socket: when `expectedServerUID` is given, or
    /// `$FLUXBUS_SERVER_UID` is set, or this process runs as root (then 0 is expected), a listener running as another
    /// uid is refused with `FluxError.untrustedServer` (see `SocketConnection.init(path:maxFrame:expectedServerUID:)`).
    public static func connect(
        socketPath: String = defaultSocketPath(), name: String, role: Role = .client, expectedServerUID: UInt32? = nil
    ) async throws -> FluxClient {
        let connection = try SocketConnection(path: socketPath, expectedServerUID: expectedServerUID)
        return try await connect(over: connection, name: name, role: role)
    }

    /// Does the handshake over an existing (not yet started) connection.
    public static func connect(over connection: any FluxConnection, name: String, role: Role = .client) async throws -> FluxClient {
        let client = FluxClient(connection: connection, name: name, role: role)
        connection.start { [client] event in client.receive(event) }
        var hello = FrameBuilder(op: "hello")
        hello.int("protocol", fluxProtocolVersion)
        hello.string("role", role.rawValue)
        hello.string("name", name)
        hello.bool("heartbeat", true)  // fluxd pings us when we are silent; the reader answers (SPEC §8.7)
        let reply: Envelope
        do {
            reply = try await client.request(key: helloKey, frame: hello.finish())
        } catch {
            connection.close()
            throw error
        }
        guard reply.fluxString("op") == "welcome" else {
            connection.close()
            throw FluxError.protocolViolation("expected welcome, got \(String(decoding: reply.body, as: UTF8.self))")
        }
        let limits = reply.raw("limits").flatMap { try? FluxJSON.decode(Limits.self, from: $0) }
        let welcome = Welcome(
            protocolVersion: reply.fluxInt("protocol") ?? 0,
            server: reply.fluxString("server") ?? "",
            peer: reply.fluxInt("peer") ?? 0,
            limits: limits ?? Limits())
        client.state.withLock { s in
            s.welcome = welcome
            if s.phase == .handshaking { s.phase = .ready }
        }
        return client
    }

    /// What fluxd said in `welcome` (peer id, limits).
    public var welcome: Welcome {
        guard let w = state.withLock({ $0.welcome }) else { preconditionFailure("FluxClient used before connect finished") }
        return w
    }

    /// Whether the connection has ended (closed locally or dropped).
    public var isClosed: Bool { state.withLock { $0.terminal != nil } }

    // MARK: Dispatch

    /// Dispatches an action without waiting for its settlement. Returns the id it was sent with: a `no-handler`
    /// (or other) error for it arrives on `errors` with that `ref`. Throws only when nothing could be sent.
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
        try enqueue(dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: false))
        return id
    }

    /// Dispatches an action and waits until every target store answered or gave up.
    /// Throws `FluxError.server` (e.g. `no-handler`, `overloaded`) when fluxd refused the action.
    public func dispatchAndSettle<P: Encodable>(type: String, payload: P, cause: Int? = nil) async throws -> Settlement {
        try await dispatchAndSettle(type: type, payloadJSON: FluxJSON.encode(payload), cause: cause)
    }

    /// Dispatches an action without payload and waits for its settlement.
    public func dispatchAndSettle(type: String, cause: Int? = nil) async throws -> Settlement {
        try await dispatchAndSettle(type: type, payloadJSON: nil, cause: cause)
    }

    /// Dispatches an action whose payload is already JSON bytes and waits for its settlement.
    public func dispatchAndSettle(type: String, payloadJSON: [UInt8]?, cause: Int? = nil) async throws -> Settlement {
        let id = nextID("s")
        let frame = try dispatchFrame(id: id, type: type, payloadJSON: payloadJSON, cause: cause, settle: true)
        let reply = try await request(key: id, frame: frame)
        return try Self.parseSettlement(reply, id: id)
    }

    private func dispatchFrame(id: String, type: String, payloadJSON: [UInt8]?, cause: Int?, settle: Bool) throws(FluxError) -> Frame {
        guard Names.isValidType(type) else { throw .invalidArgument("bad action type \"\(type)\"") }
        if let payloadJSON { try FluxJSON.validate(payloadJSON) }
        var b = FrameBuilder(op: "dispatch", capacity: 64 + (payloadJSON?.count ?? 0))
        b.string("id", id)
        b.string("type", type)
        if let payloadJSON { b.raw("payload", payloadJSON) }
        if settle { b.bool("settle", true) }
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
    /// retained snapshot (if any), then every newer one, plus `.storeDown`/`.storeUp`.
    ///
    /// Several local subscriptions to one store share one wire subscription. The wire subscription is withdrawn
    /// (`unsubscribe`) when the last local one ends: its consumer's task is cancelled, its iterator is dropped
    /// (e.g. `break` out of `for try await`), or `cancel()` is called. It finishes with an error when the
    /// connection drops or a snapshot does not decode as `S`, and without one after `close()`. Events are buffered
    /// without limit until consumed.
    public func subscribe<S: Decodable & Sendable>(store: String, as type: S.Type = S.self) -> Subscription<S> {
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: WireStoreEvent.self, throwing: (any Error).self)
        let core = SubscriptionCore(client: self, store: store)
        continuation.onTermination = { _ in core.cancel() }
        guard Names.isValidStore(store) else {
            continuation.finish(throwing: FluxError.invalidArgument("bad store name \"\(store)\""))
            return Subscription(store: store, stream: stream, token: SubscriptionToken(core))
        }
        let id = addSubscriber(
            store: store,
            deliver: { continuation.yield($0) },
            end: { error in continuation.finish(throwing: error) })
        core.attach(id)
        return Subscription(store: store, stream: stream, token: SubscriptionToken(core))
    }

    /// Adds a local subscriber to `store`'s wire subscription (sending `subscribe` if it is the first).
    /// `deliver` is called with the client's lock held, in wire order: it must only enqueue (never call the client).
    /// `end` is called once, without the lock, when the subscriber is removed or the connection ends.
    package func addSubscriber(
        store: String,
        deliver: @escaping @Sendable (WireStoreEvent) -> Void,
        end: @escaping @Sendable (FluxError?) -> Void
    ) -> Int? {
        let result = state.withLock { s -> (id: Int?, error: FluxError?) in
            if let terminal = s.terminal { return (nil, terminal) }
            s.nextSubscriber += 1
            let id = s.nextSubscriber
            if var sub = s.subscriptions[store] {
                if let status = sub.status { deliver(.subscribed(status)) }
                if let latest = sub.latest { deliver(.snapshot(latest)) }
                sub.subscribers[id] = Subscriber(deliver: deliver, end: end)
                s.subscriptions[store] = sub
            } else {
                var sub = WireSubscription()
                sub.subscribers[id] = Subscriber(deliver: deliver, end: end)
                s.subscriptions[store] = sub
                var b = FrameBuilder(op: "subscribe")
                b.string("store", store)
                s.outbox.append(contentsOf: bytes(of: b.finish()))
            }
            return (id, nil)
        }
        if let error = result.error {
            end(error == .closed ? FluxError.closed : error)
            return nil
        }
        try? flush()
        return result.id
    }

    /// Removes a local subscriber (sending `unsubscribe` if it was the last) and ends it.
    package func removeSubscriber(store: String, id: Int) {
        let removed = state.withLock { s -> Subscriber? in
            guard var sub = s.subscriptions[store], let subscriber = sub.subscribers.removeValue(forKey: id) else {
                return nil
            }
            if sub.subscribers.isEmpty {
                s.subscriptions[store] = nil
                if s.terminal == nil {
                    s.draining[store, default: 0] += 1
                    var b = FrameBuilder(op: "unsubscribe")
                    b.string("store", store)
                    s.outbox.append(contentsOf: bytes(of: b.finish()))
                }
            } else {
                s.subscriptions[store] = sub
            }
            return subscriber
        }
        guard let removed else { return }
        try? flush()
        removed.end(nil)
    }

    // MARK: Queries

    /// Declares a query on a store (WordPressFlux's Query); it stays active until the returned receipt is
    /// cancelled or released, or the connection ends. The query is encoded with sorted keys, so equal queries from
    /// different clients are deduplicated by fluxd.
    public func query<Q: Encodable>(store: String, _ query: Q) async throws -> QueryReceipt {
        try await self.query(store: store, queryJSON: FluxJSON.encode(query))
    }

    /// Declares a query given as JSON bytes.
    public func query(store: String, queryJSON: [UInt8]) async throws -> QueryReceipt {
        guard Names.isValidStore(store) else { throw FluxError.invalidArgument("bad store name \"\(store)\"") }
        try FluxJSON.validate(queryJSON)
        let id = nextID("q")
        var b = FrameBuilder(op: "query", capacity: 64 + queryJSON.count)
        b.string("id", id)
        b.string("store", store)
        b.raw("query", queryJSON)
        do {
            _ = try await request(key: id, frame: b.finish())
        } catch is CancellationError {
            unquery(id: id) // The query may have reached fluxd; withdraw it.
            throw CancellationError()
        }
        return QueryReceipt(client: self, id: id, store: store)
    }

    /// Sends `unquery` (fire-and-forget; `unquery-ok` is not awaited).
    package func unquery(id: String) {
        var b = FrameBuilder(op: "unquery")
        b.string("id", id)
        try? enqueue(b.finish())
    }

    // MARK: Requests

    /// Asks fluxd for its introspection data.
    public func info() async throws -> BusInfo {
        let id = nextID("r")
        var b = FrameBuilder(op: "info")
        b.string("id", id)
        let reply = try await request(key: id, frame: b.finish())
        return try FluxJSON.decode(BusInfo.self, from: reply.body)
    }

    /// Reads a store's retained snapshot. Throws `unknown-store` when fluxd retains none.
    public func get<S: Decodable>(store: String, as type: S.Type = S.self) async throws -> Snapshot<S> {
        guard Names.isValidStore(store) else { throw FluxError.invalidArgument("bad store name \"\(store)\"") }
        let id = nextID("r")
        var b = FrameBuilder(op: "get")
        b.string("id", id)
        b.string("store", store)
        let reply = try await request(key: id, frame: b.finish())
        guard let version = reply.fluxInt("version"), let raw = reply.raw("state") else {
            throw FluxError.protocolViolation("bad got message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return Snapshot(store: reply.fluxString("store") ?? store, version: version, seq: reply.fluxInt("seq") ?? 0,
                        state: try FluxJSON.decode(S.self, from: raw))
    }

    /// Round trip to fluxd and back.
    public func ping() async throws -> Duration {
        let id = nextID("p")
        var b = FrameBuilder(op: "ping")
        b.string("id", id)
        let frame = b.finish()
        let clock = ContinuousClock()
        let start = clock.now
        _ = try await request(key: id, frame: frame)
        return clock.now - start
    }

    // MARK: Raw access (tools)

    /// Sends an arbitrary frame body as it is (fluxctl's raw mode). Replies are seen on `receivedFrames()`.
    public func sendRaw(body: [UInt8]) throws(FluxError) {
        try enqueueBytes(encodeFrame(body))
    }

    /// Every frame body received from now on, exactly as it came off the wire, including those the client
    /// also handles itself. Finishes when the connection ends; cancelling the consumer stops the tap.
    public func receivedFrames() -> AsyncStream<[UInt8]> {
        let (stream, continuation) = AsyncStream.makeStream(of: [UInt8].self)
        let id = state.withLock { s -> Int? in
            guard s.terminal == nil else { return nil }
            s.nextTap += 1
            s.taps[s.nextTap] = continuation
            return s.nextTap
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.taps.removeValue(forKey: id) }
        }
        return stream
    }

    // MARK: Closing

    /// Says `bye`, waits (at most 2 s) for fluxd to close the connection, then closes it. Pending calls throw
    /// `FluxError.closed`; subscriptions finish without error.
    public func close() async {
        let start = state.withLock { s -> Bool in
            guard s.terminal == nil, s.phase != .closing else { return false }
            s.phase = .closing
            s.outbox.append(contentsOf: bytes(of: FrameBuilder(op: "bye").finish()))
            return true
        }
        if start { try? flush() }
        let connection = self.connection
        let watchdog = Task {
            do {
                try await Task.sleep(for: .seconds(2))
                connection.close()
            } catch {}
        }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let done = state.withLock { s -> Bool in
                if s.terminal != nil { return true }
                s.closeWaiters.append(c)
                return false
            }
            if done { c.resume() }
        }
        watchdog.cancel()
        connection.close()
    }

    /// Closes the connection at once, without `bye` (like a crash, as far as fluxd can tell).
    public func abort() {
        connection.close()
    }

    // MARK: Store hooks (FluxStore)

    /// Routes `store`'s messages to `sink` (see `StoreInbound`). Called before sending `register`.
    package func attachStore(_ store: String, sink: @escaping @Sendable (StoreInbound) -> Void) throws(FluxError) {
        let error = state.withLock { s -> FluxError? in
            if let terminal = s.terminal { return terminal }
            if s.sinks[store] != nil { return .invalidArgument("store \"\(store)\" is already run on this connection") }
            s.sinks[store] = sink
            return nil
        }
        if let error { throw error }
    }

    /// Stops routing a store's messages.
    package func detachStore(_ store: String) {
        _ = state.withLock { $0.sinks.removeValue(forKey: store) }
    }

    /// Sends a frame (store answers, registration, ...).
    package func send(frame: Frame) throws(FluxError) {
        try enqueue(frame)
    }

    /// Queues a frame without writing it yet: a store answering a run of actions writes all its answers with one
    /// `send(2)` (`flushQueued()` after the run; any other send writes them too, in order).
    package func queue(frame: Frame) throws(FluxError) {
        try queueBytes(bytes(of: frame))
    }

    /// Writes what `queue(frame:)` left queued.
    package func flushQueued() throws(FluxError) {
        try flush()
    }

    // MARK: Internals

    package func nextID(_ prefix: String) -> String {
        let n = state.withLock { s -> Int in
            s.nextID += 1
            return s.nextID
        }
        return "\(prefix)#\(n)"
    }

    private func enqueue(_ frame: Frame) throws(FluxError) {
        try enqueueBytes(bytes(of: frame))
    }

    private func enqueueBytes<Bytes: Collection>(_ bytes: Bytes) throws(FluxError) where Bytes.Element == UInt8 {
        try queueBytes(bytes)
        try flush()
    }

    /// Appends to the outbox without writing (fails once the connection has ended).
    private func queueBytes<Bytes: Collection>(_ bytes: Bytes) throws(FluxError) where Bytes.Element == UInt8 {
        let error = state.withLock { s -> FluxError? in
            if let terminal = s.terminal { return terminal }
            s.outbox.append(contentsOf: bytes)
            return nil
        }
        if let error { throw error }
    }

    /// Writes everything queued, in queue order (whoever queued a frame flushes; one writer at a time).
    private func flush() throws(FluxError) {
        try sendLock.withLock { (_: inout Void) throws(FluxError) in
            while true {
                let bytes = state.withLock { s -> [UInt8] in
                    let out = s.outbox
                    s.outbox = []
                    return out
                }
                if bytes.isEmpty { return }
                try connection.send(bytes)
            }
        }
    }

    /// Sends `frame` and waits for the message that answers `key` (an id, or the handshake).
    private func request(key: String, frame: Frame) async throws -> Envelope {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Envelope, any Error>) in
                let failure = state.withLock { s -> (any Error)? in
                    if let terminal = s.terminal { return terminal }
                    if Task.isCancelled { return CancellationError() }
                    s.pending[key] = c
                    s.outbox.append(contentsOf: bytes(of: frame))
                    return nil
                }
                if let failure {
                    c.resume(throwing: failure)
                    return
                }
                do {
                    try flush()
                } catch {
                    takePending(key)?.resume(throwing: error)
                }
            }
        } onCancel: {
            takePending(key)?.resume(throwing: CancellationError())
        }
    }

    private func takePending(_ key: String) -> CheckedContinuation<Envelope, any Error>? {
        state.withLock { $0.pending.removeValue(forKey: key) }
    }

    private func report(_ error: FluxError) {
        errorsContinuation.yield(error)
    }

    // MARK: Receiving (called on the connection's reader, one event at a time)

    private func receive(_ event: ConnectionEvent) {
        switch event {
        case .frame(let body): handleFrame(body)
        case .closed(let error): handleClosed(error)
        }
    }

    private func handleFrame(_ body: [UInt8]) {
        let taps = state.withLock { s in s.taps.isEmpty ? [] : Array(s.taps.values) }
        for tap in taps { tap.yield(body) }
        let env: Envelope
        do {
            env = try Envelope(body: body)
        } catch {
            report(.protocolViolation("fluxd sent an unreadable frame: \(error.message)"))
            return
        }
        guard let op = env.fluxString("op") else {
            report(.protocolViolation("fluxd sent a message without op"))
            return
        }
        switch op {
        case "welcome":
            resolve(Self.helloKey, env)
        case "error":
            handleError(env)
        case "settled", "info", "got", "pong", "query-ok", "unquery-ok":
            if let id = env.fluxString("id") { resolve(id, env) }
        case "subscribed", "unsubscribed", "snapshot", "store-down", "store-up":
            handleSubscriptionMessage(op, env)
        case "registered", "action", "queries", "queries-changed":
            if let store = env.fluxString("store"), let sink = state.withLock({ $0.sinks[store] }) {
                sink(.message(env))
            }
        case "ping":
            // A heartbeat (we asked for them in hello): answered at once, from the reader, whatever user code does.
            var b = FrameBuilder(op: "pong")
            if let id = env.raw("id"), env.span("id")?.kind == .string { b.raw("id", id) }
            try? send(frame: b.finish())
        case "bye":
            state.withLock { $0.byeReason = env.fluxString("reason") ?? "no reason given" }
        default:
            break // Unknown ops from a newer fluxd are ignored (forward compatibility).
        }
    }

    private func resolve(_ key: String, _ env: Envelope) {
        takePending(key)?.resume(returning: env)
    }

    private func handleError(_ env: Envelope) {
        let rawCode = env.fluxString("code") ?? ""
        let error = ServerError(
            rawCode: rawCode,
            message: env.fluxString("message") ?? "",
            ref: env.fluxString("ref"),
            fatal: env.bool("fatal").value ?? ErrorCode(rawValue: rawCode)?.isFatal ?? false)
        enum Route { case pending(CheckedContinuation<Envelope, any Error>), sink(@Sendable (StoreInbound) -> Void), stream }
        let route = state.withLock { s -> Route in
            if s.phase == .handshaking, let c = s.pending.removeValue(forKey: Self.helloKey) { return .pending(c) }
            if let ref = error.ref {
                if let c = s.pending.removeValue(forKey: ref) { return .pending(c) }
                if let sink = s.sinks[ref] { return .sink(sink) }
            }
            return .stream
        }
        switch route {
        case .pending(let c): c.resume(throwing: FluxError.server(error))
        case .sink(let sink): sink(.message(env))
        case .stream: report(.server(error))
        }
    }

    private func handleSubscriptionMessage(_ op: String, _ env: Envelope) {
        let store = env.fluxString("store") ?? ""
        var problem: FluxError?
        state.withLock { s in
            if op == "unsubscribed" {
                if let n = s.draining[store] { s.draining[store] = n > 1 ? n - 1 : nil }
                return
            }
            if op == "snapshot", let sink = s.sinks[store] { sink(.message(env)) }
            // Frames for a wire subscription we withdrew, up to its `unsubscribed`, belong to no one.
            guard s.draining[store] == nil, var sub = s.subscriptions[store] else { return }
            let event: WireStoreEvent
            switch op {
            case "subscribed":
                let status = StoreStatus(rawValue: env.fluxString("status") ?? "") ?? .unknown
                sub.status = status
                event = .subscribed(status)
            case "snapshot":
                guard let version = env.fluxInt("version"), let raw = env.raw("state") else {
                    problem = .protocolViolation("bad snapshot message for \(store)")
                    return
                }
                let snapshot = RawSnapshot(store: store, version: version, seq: env.fluxInt("seq") ?? 0, state: raw)
                if (sub.latest?.version ?? 0) < version { sub.latest = snapshot }
                event = .snapshot(snapshot)
            case "store-down":
                sub.status = .down
                event = .storeDown(env.fluxString("reason") ?? "unknown")
            default: // store-up
                sub.status = .up
                event = .storeUp(env.fluxInt("version") ?? 0)
            }
            s.subscriptions[store] = sub
            for key in sub.subscribers.keys.sorted() { sub.subscribers[key]!.deliver(event) }
        }
        if let problem { report(problem) }
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
            let result = (
                local: local, terminal: terminal,
                pending: Array(s.pending.values),
                subscribers: s.subscriptions.values.flatMap { $0.subscribers.values },
                sinks: Array(s.sinks.values),
                taps: Array(s.taps.values),
                waiters: s.closeWaiters)
            s.pending = [:]
            s.subscriptions = [:]
            s.sinks = [:]
            s.taps = [:]
            s.closeWaiters = []
            s.outbox = []
            return result
        }
        for c in taken.pending { c.resume(throwing: taken.terminal) }
        for sub in taken.subscribers { sub.end(taken.local ? nil : taken.terminal) }
        for sink in taken.sinks { sink(.ended(taken.local ? nil : taken.terminal)) }
        for tap in taken.taps { tap.finish() }
        errorsContinuation.finish()
        for w in taken.waiters { w.resume() }
    }
}

/// A frame's bytes (prefix included) as an array. A `Frame` frees its storage in `deinit`, so its `bytes` must
/// never be read from a temporary that may already be released: this keeps the frame alive while copying.
func bytes(of frame: Frame) -> [UInt8] {
    frame.wireBytes
}
