import FluxCore
import Foundation
import Logging
import Synchronization

/// One event of a wire subscription before decoding (what `FluxClient` hands to its local subscribers).
package enum WireStoreEvent: Sendable {
    case subscribed(StoreStatus, version: Int)
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
/// snapshots, declare queries, introspect, and ask fluxd as a plugin host about its workers.
///
/// Create one with `connect(socketPath:name:role:...)` (or `connect(over:name:role:...)` for another transport
/// such as FluxTesting's in-memory bus). All methods may be called from any task or thread. Every throwing call
/// throws `FluxError` (typed throws), so one `switch` covers every failure.
///
/// **Concurrency design.** The client's state sits behind one short lock that is never held across a system call,
/// a continuation resume that runs user code, or a callback: frames to send are appended to an outbox under the
/// lock and handed to the connection after it is released (whoever finds the outbox idle hands over everything
/// queued, so frames keep their order); subscriber callbacks are queued under the lock and called after it, one
/// at a time, in wire order. Writes never block Swift's cooperative thread pool: `SocketConnection` queues the
/// bytes and writes them from a writer thread of its own; async calls first *await* room when more than
/// `writeBufferLimit` bytes wait to be written (a slow fluxd slows those callers, without tying up a thread),
/// while the synchronous fire-and-forget `dispatch` only queues.
///
/// **Timeouts.** Every request (`dispatchAndSettle`, `info`, `get`, `ping`, `query`, the host operations, the
/// handshake) has a deadline covering the whole call (waiting for write room, sending, and the answer):
/// `requestTimeout` (10 s unless given to `connect`) or the `timeout:` argument. It then throws
/// `FluxError.timedOut` naming what was awaited; a late answer is ignored.
///
/// **Subscriptions keep only the newest snapshot.** Each local subscription buffers what its consumer has not read
/// yet, but a new snapshot replaces a waiting snapshot (in its place, as fluxd does on the wire, SPEC §8.5): a slow
/// consumer sees the latest state, never a backlog of old ones. Status events (`subscribed`, `store-down`,
/// `store-up`) are never dropped. `Subscription.status` says where the store stands (`unknown`: no store of that
/// name has registered yet), and `Subscription.nextSnapshot(timeout:)` says so when it times out.
///
/// Errors: fluxd's `error` replies become `FluxError.server` with the stable `ErrorCode`. A reply is matched to its
/// request by the id the client generated. Errors that answer no awaited request — notably `no-handler` for a
/// fire-and-forget `dispatch` — are delivered on the `errors` stream (its `ref` is the id `dispatch` returned), or to
/// `confirmDispatched(_:)`. When the connection drops, every awaited call throws `FluxError.disconnected` and every
/// subscription finishes with that error. Call `close()` when done.
public final class FluxClient: Sendable {
    enum Phase: Equatable { case handshaking, ready, closing, closed }

    /// A local subscriber of a wire subscription: a `Subscription`'s queue, or a callback (FluxStore, fluxctl).
    enum Subscriber {
        case queue(EventQueue<WireStoreEvent>)
        case callback(CallbackQueue<WireStoreEvent>)

        /// Hands over an event; called under the client's lock (no user code runs: callbacks run in `run()`).
        func push(_ event: WireStoreEvent) {
            switch self {
            case .queue(let q): q.push(event)
            case .callback(let c): c.enqueue(.event(event))
            }
        }

        /// Ends it; called under the client's lock.
        func end(_ error: FluxError?) {
            switch self {
            case .queue(let q): q.finish(error)
            case .callback(let c): c.enqueue(.end(error))
            }
        }

        /// Runs its callbacks, if it has any; called with no lock held.
        func run() {
            if case .callback(let c) = self { c.run() }
        }
    }

    struct WireSubscription {
        var subscribers: [Int: Subscriber] = [:]
        var status: StoreStatus?
        var version = 0
        var latest: RawSnapshot?
    }

    /// A monitor-event consumer.
    enum MonitorListener {
        case queue(EventQueue<MonitorEvent>)
        case callback(CallbackQueue<MonitorEvent>)
    }

    /// An awaited answer.
    enum PendingSlot {
        /// Sent; nobody awaits it yet (`beginDispatchAndSettle`).
        case registered
        case waiting(CheckedContinuation<Result<Envelope, FluxError>, Never>)
        /// Answered before anyone awaited it.
        case done(Result<Envelope, FluxError>)
    }

    struct State {
        var phase = Phase.handshaking
        var welcome: Welcome?
        var terminal: FluxError?
        var nextID = 0
        var pending: [String: PendingSlot] = [:]
        /// Ping ids of `confirmDispatched` barriers -> the dispatch ids they watch and the refusals seen.
        var barriers: [String: (ids: Set<String>, refused: [ServerError])] = [:]
        var subscriptions: [String: WireSubscription] = [:]
        var draining: [String: Int] = [:]
        var nextSubscriber = 0
        var sinks: [String: @Sendable (StoreInbound) -> Void] = [:]
        var monitors: [Int: MonitorListener] = [:]
        var byeReason: String?
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
        var outbox: [UInt8] = []
        var flushing = false
    }

    static let helloKey = "#hello"

    let state = Mutex(State())
    private let errorsContinuation: AsyncStream<FluxError>.Continuation

    /// The transport this client speaks over.
    public let connection: any FluxConnection
    /// The peer name announced in `hello`.
    public let name: String
    /// The role announced in `hello`.
    public let role: Role
    /// The deadline of a request when the call gives none (default 10 s).
    public let requestTimeout: Duration
    /// Async calls wait (without blocking a thread) while more than this many bytes wait to be written.
    public let writeBufferLimit: Int
    /// Where the client logs what no caller hears about (a dropped connection, frames it cannot read).
    public let logger: Logger
    /// Errors from fluxd that answer no awaited call (e.g. `no-handler` for a fire-and-forget dispatch), and
    /// frames from fluxd this SDK could not read. Newest 256 kept; finishes when the connection ends. One consumer.
    public let errors: AsyncStream<FluxError>

    private init(connection: any FluxConnection, name: String, role: Role, requestTimeout: Duration,
                 writeBufferLimit: Int, logger: Logger) {
        self.connection = connection
        self.name = name
        self.role = role
        self.requestTimeout = requestTimeout
        self.writeBufferLimit = writeBufferLimit
        self.logger = logger
        (errors, errorsContinuation) = AsyncStream.makeStream(of: FluxError.self, bufferingPolicy: .bufferingNewest(256))
    }

    // MARK: Connecting

    /// Connects to fluxd's Unix socket and does the `hello`/`welcome` handshake.
    ///
    /// - `socketPath`: nil for the default (`defaultSocketPath()`: `$FLUXBUS_SOCKET`, else the per-user default).
    /// - `requestTimeout`: the deadline of every request that gives none, and of this handshake.
    /// - `logger`: where the client logs (swift-log; by default a logger labelled `fluxbus.client`).
    ///
    /// When no fluxd answers at the path it throws `FluxError.cannotConnect`, whose description names the path
    /// tried, where it came from, what is there, and how to start or find fluxd. Before sending anything it checks
    /// who listens on the socket: when `expectedServerUID` is given, or `$FLUXBUS_SERVER_UID` is set, or this
    /// process runs as root (then 0 is expected), a listener running as another uid is refused with
    /// `FluxError.untrustedServer` (see `SocketConnection.init(path:maxFrame:expectedServerUID:)`).
    public static func connect(
        socketPath: String? = nil, name: String, role: Role = .client, expectedServerUID: UInt32? = nil,
        requestTimeout: Duration = .seconds(10), logger: Logger = Logger(label: "fluxbus.client")
    ) async throws(FluxError) -> FluxClient {
        let path = socketPath ?? defaultSocketPath()
        let connection: SocketConnection
        do {
            connection = try SocketConnection(path: path, expectedServerUID: expectedServerUID)
        } catch {
            if case .cannotConnect(var e) = error {
                e.source = socketPath != nil ? "the socket path given"
                    : (ProcessInfo.processInfo.environment["FLUXBUS_SOCKET"].map { !$0.isEmpty } == true
                        ? "$FLUXBUS_SOCKET" : "the default path")
                throw .cannotConnect(e)
            }
            throw error
        }
        return try await connect(over: connection, name: name, role: role, requestTimeout: requestTimeout, logger: logger)
    }

    /// Does the handshake over an existing (not yet started) connection (see `connect(socketPath:...)`).
    public static func connect(
        over connection: any FluxConnection, name: String, role: Role = .client,
        requestTimeout: Duration = .seconds(10), writeBufferLimit: Int = 4 << 20,
        logger: Logger = Logger(label: "fluxbus.client")
    ) async throws(FluxError) -> FluxClient {
        let client = FluxClient(connection: connection, name: name, role: role, requestTimeout: requestTimeout,
                                writeBufferLimit: writeBufferLimit, logger: logger)
        connection.start { [client] event in client.receive(event) }
        var hello = FrameBuilder(op: "hello")
        hello.int("protocol", fluxProtocolVersion)
        hello.string("role", role.rawValue)
        hello.string("name", name)
        hello.bool("heartbeat", true)  // fluxd pings us when we are silent; the reader answers (SPEC §8.7)
        let reply: Envelope
        do {
            reply = try await client.request(key: helloKey, frame: hello.finish(), timeout: nil,
                                             what: "fluxd's welcome (handshake)")
        } catch {
            connection.close()
            throw error
        }
        guard reply.fluxString("op") == "welcome" else {
            connection.close()
            throw .protocolViolation("expected welcome, got \(String(decoding: reply.body, as: UTF8.self))")
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
        client.logger.debug("connected to \(welcome.server) as peer \(welcome.peer)", metadata: ["name": "\(name)"])
        return client
    }

    /// What fluxd said in `welcome` (peer id, limits).
    public var welcome: Welcome {
        guard let w = state.withLock({ $0.welcome }) else { preconditionFailure("FluxClient used before connect finished") }
        return w
    }

    /// Whether the connection has ended (closed locally or dropped).
    public var isClosed: Bool { state.withLock { $0.terminal != nil } }

    // MARK: Closing

    /// Says `bye`, waits (at most 2 s) for fluxd to close the connection, then closes it. Pending calls throw
    /// `FluxError.closed`; subscriptions finish without error.
    public func close() async {
        let start = state.withLock { s -> Bool in
            guard s.terminal == nil, s.phase != .closing else { return false }
            s.phase = .closing
            s.outbox.append(contentsOf: FrameBuilder(op: "bye").finish().wireBytes)
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

    /// Routes `store`'s messages to `sink` (see `StoreInbound`). Called before sending `register`. `sink` is called
    /// on the connection's reader with no lock held.
    package func attachStore(_ store: String, sink: @escaping @Sendable (StoreInbound) -> Void) throws(FluxError) {
        try state.withLock { s throws(FluxError) in
            if let terminal = s.terminal { throw terminal }
            if s.sinks[store] != nil { throw .invalidArgument("store \"\(store)\" is already run on this connection") }
            s.sinks[store] = sink
        }
    }

    /// Stops routing a store's messages.
    package func detachStore(_ store: String) {
        _ = state.withLock { $0.sinks.removeValue(forKey: store) }
    }

    /// Sends a frame (store answers, registration, ...).
    package func send(frame: Frame) throws(FluxError) {
        try queueBytes(frame.wireBytes)
        try flush()
    }

    /// Queues a frame without writing it yet: a store answering a run of actions hands all its answers to the
    /// connection at once (`flushQueued()` after the run; any other send hands them over too, in order).
    package func queue(frame: Frame) throws(FluxError) {
        try queueBytes(frame.wireBytes)
    }

    /// Hands what `queue(frame:)` left queued to the connection.
    package func flushQueued() throws(FluxError) {
        try flush()
    }

    // MARK: Sending

    package func nextID(_ prefix: String) -> String {
        let n = state.withLock { s -> Int in
            s.nextID += 1
            return s.nextID
        }
        return "\(prefix)#\(n)"
    }

    /// Appends to the outbox (fails once the connection has ended).
    func queueBytes(_ bytes: [UInt8]) throws(FluxError) {
        try state.withLock { s throws(FluxError) in
            if let terminal = s.terminal { throw terminal }
            s.outbox.append(contentsOf: bytes)
        }
    }

    /// Hands the outbox to the connection, in order, with no lock held. If another thread (or an outer call on
    /// this one: an in-memory transport delivers replies from within `send`) is doing so, it hands over what was
    /// queued here too, and this returns at once.
    func flush() throws(FluxError) {
        let flusher = state.withLock { s -> Bool in
            if s.flushing || s.outbox.isEmpty { return false }
            s.flushing = true
            return true
        }
        guard flusher else { return }
        while true {
            let bytes = state.withLock { s -> [UInt8]? in
                if s.outbox.isEmpty {
                    s.flushing = false
                    return nil
                }
                defer { s.outbox = [] }
                return s.outbox
            }
            guard let bytes else { return }
            do {
                try connection.send(bytes)
            } catch {
                state.withLock { s in
                    s.outbox = []
                    s.flushing = false
                }
                throw error
            }
        }
    }

    // MARK: Requests

    /// Waits, with no thread blocked, while more than `writeBufferLimit` bytes wait to be written.
    func waitForRoom(until deadline: ContinuousClock.Instant, what: String) async throws(FluxError) {
        let connection = self.connection, limit = writeBufferLimit
        guard connection.pendingWriteBytes >= limit else { return }
        let room = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await connection.waitUntilWritable(below: limit)
                return true
            }
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        if Task.isCancelled { throw .cancelled }
        if !room {
            throw .timedOut("\(what): \(connection.pendingWriteBytes) bytes were still waiting to be written to fluxd")
        }
    }

    /// Registers `key` as awaited and queues `frame` (one step, so the answer cannot come first), then sends.
    func register(key: String, frame: Frame) throws(FluxError) {
        try state.withLock { s throws(FluxError) in
            if let terminal = s.terminal { throw terminal }
            s.pending[key] = .registered
            s.outbox.append(contentsOf: frame.wireBytes)
        }
        do {
            try flush()
        } catch {
            complete(key, .failure(error))
        }
    }

    /// Sends `frame` and waits for the message that answers `key` (an id, or the handshake), within `timeout`
    /// (the client's `requestTimeout` when nil) for the whole call.
    func request(key: String, frame: Frame, timeout: Duration?, what: String) async throws(FluxError) -> Envelope {
        let limit = timeout ?? requestTimeout
        let deadline = ContinuousClock.now + limit
        try await waitForRoom(until: deadline, what: what)
        if Task.isCancelled { throw .cancelled }
        try register(key: key, frame: frame)
        return try await awaitAnswer(key: key, deadline: deadline, limit: limit, what: what)
    }

    /// Waits for the answer to `key` (registered with `register`) until `deadline`; `limit` is the whole call's
    /// timeout, named in the error (what is left of it when the wait starts depends on the machine's load).
    func awaitAnswer(key: String, deadline: ContinuousClock.Instant, limit: Duration, what: String) async throws(FluxError) -> Envelope {
        let seconds = limit.formatted
        let timer = Task { [weak self] in
            try? await Task.sleep(until: deadline, clock: .continuous)
            if !Task.isCancelled { self?.complete(key, .failure(.timedOut("\(what) (no answer within \(seconds))"))) }
        }
        defer { timer.cancel() }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Result<Envelope, FluxError>, Never>) in
                let now = state.withLock { s -> Result<Envelope, FluxError>? in
                    switch s.pending[key] {
                    case .done(let r)?:
                        s.pending[key] = nil
                        return r
                    case .registered?:
                        if Task.isCancelled {
                            s.pending[key] = nil
                            return .failure(.cancelled)
                        }
                        s.pending[key] = .waiting(c)
                        return nil
                    case .waiting?:
                        preconditionFailure("two awaiters for \(key)")
                    case nil:
                        return .failure(s.terminal ?? .closed)
                    }
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            self.complete(key, .failure(.cancelled))
        }
        return try result.get()
    }

    /// Delivers the answer to `key` (resumes its awaiter outside the lock, or keeps it for a later awaiter).
    func complete(_ key: String, _ result: Result<Envelope, FluxError>) {
        let waiter = state.withLock { s -> CheckedContinuation<Result<Envelope, FluxError>, Never>? in
            switch s.pending[key] {
            case .waiting(let c)?:
                s.pending[key] = nil
                return c
            case .registered?:
                s.pending[key] = .done(result)
                return nil
            case .done?, nil:
                return nil
            }
        }
        waiter?.resume(returning: result)
    }

    /// Puts an error that answers no call on `errors`.
    func reportUnanswered(_ error: FluxError) {
        logger.debug("\(error)")
        errorsContinuation.yield(error)
    }

    /// Ends `errors` (the connection ended).
    func finishErrors() {
        errorsContinuation.finish()
    }
}

extension Duration {
    /// `10 s`, `0.5 s`.
    var formatted: String {
        let s = Double(components.seconds) + Double(components.attoseconds) / 1e18
        return s == s.rounded() ? "\(Int(s)) s" : "\((s * 1000).rounded() / 1000) s"
    }
}
