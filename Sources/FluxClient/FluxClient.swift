import FluxCore
import FluxJSONValue
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

/// A snapshot whose state is still JSON bytes, or (a `delta`, SPEC §16.3) the patch from version `from`.
package struct RawSnapshot: Sendable {
    package var store: String
    package var version: Int
    package var seq: Int
    /// The whole state (empty for a delta).
    package var state: ArraySlice<UInt8>
    /// How many times this client found a new fluxd history (`welcome.epoch`) when it reconnected: versions of
    /// different eras are not comparable.
    package var era = 0
    /// For a delta: the patch from version `from` to `version`.
    package var patch: JSONPatch?
    /// For a delta: the version the patch applies to.
    package var from = 0

    package init(store: String, version: Int, seq: Int, state: ArraySlice<UInt8>, era: Int = 0,
                 patch: JSONPatch? = nil, from: Int = 0) {
        self.store = store
        self.version = version
        self.seq = seq
        self.state = state
        self.era = era
        self.patch = patch
        self.from = from
    }

    /// Set when deltas merged while the consumer did not read (SPEC §16.3) grew past `maxMergedOperations`: the
    /// reader asks fluxd for the whole state instead.
    package var mustResync = false
    /// How many operations of merged deltas may wait for a consumer before a resync replaces them.
    package static let maxMergedOperations = 4096

    /// Whether this is a delta (a patch to the state held, not a whole state). A whole state with a patch after it
    /// (`state` and `patch` both set: deltas merged into a waiting snapshot) is not.
    package var isDelta: Bool { patch != nil && state.isEmpty || mustResync }
}

/// What a store registered through a client receives: its messages (`registered`, its own `snapshot`, `queries`,
/// `action`, and `error`s whose ref is the store's name) in wire order, then the end of the connection.
package enum StoreInbound: Sendable {
    case message(Envelope)
    /// The connection ended for good: nil when closed locally, else why.
    case ended(FluxError?)
    /// The connection was lost and the client is reconnecting: answers cannot be sent until `resumed`.
    case interrupted(FluxError)
    /// Connected again (connection `generation`): register the store again (SPEC §15.5). `epochChanged`: fluxd's
    /// history is not the one before.
    case resumed(generation: Int, epochChanged: Bool)
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
/// **Path subscriptions** (SPEC §16.4, fluxd 0.4.0): `subscribe(store:path:as:)` follows the value at one JSON
/// Pointer inside a store's state (a `PathSubscription` of `PathEvent`s), woken only by changes that touch it. One
/// connection may hold a store's whole-store subscription and any number of its path subscriptions at once; their
/// events never mix (`store-down`/`store-up` go to both).
///
/// Errors: fluxd's `error` replies become `FluxError.server` with the stable `ErrorCode`. A reply is matched to its
/// request by the id the client generated. Errors that answer no awaited request — notably `no-handler` for a
/// fire-and-forget `dispatch` — are delivered on the `errors` stream (its `ref` is the id `dispatch` returned), or to
/// `confirmDispatched(_:)`. When the connection drops, every awaited call throws `FluxError.disconnected` and every
/// subscription finishes with that error. Call `close()` when done.
///
/// **Reconnection** (SPEC §15.5). A client made with `connect(socketPath:...)` (or with a connector) reconnects by
/// itself when the connection drops or fluxd says `bye` (shutdown, restart), with backoff (`ReconnectPolicy`; on by
/// default), never after `close()`. It says `hello` with the same `session` every time; `connectivityEvents()` tells
/// a UI what happens (disconnected, reconnecting, reconnected). Once connected again it subscribes again (a
/// snapshot not newer than the last one delivered is dropped, so no version is delivered twice), declares its live
/// queries again, and asks fluxd (`recover`) for the settlements it was waiting for: a dispatch fluxd never saw
/// fails with `FluxError.notSent` (it may be dispatched again), one settled meanwhile completes, one still pending
/// keeps waiting. Calls made while disconnected wait for the reconnection within their timeout (a settled dispatch
/// that times out unsent throws `notSent`); other requests in flight when the connection dropped throw
/// `disconnected`. Without reconnection (`ReconnectPolicy.disabled`, `connect(over:)`, or after giving up) a lost
/// connection ends the client as described above.
public final class FluxClient: Sendable {
    enum Phase: Equatable { case handshaking, ready, reconnecting, closing, closed }

    /// A frame made while reconnecting, sent once connected again (`key`: the awaited answer's, if any).
    struct HeldFrame {
        var key: String?
        var bytes: [UInt8]
    }

    /// A connector: makes a new, not yet started connection to fluxd (each reconnection attempt calls it).
    public typealias Connector = @Sendable () async throws(FluxError) -> any FluxConnection

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
        /// The newest whole snapshot (a subscriber added later starts from it, when no delta came after it).
        var latest: RawSnapshot?
        /// The newest version handed to the subscribers (within the current era): older ones are dropped.
        var delivered = 0
        /// A resync was asked for (a `subscribe` again): its snapshot goes to the subscribers even when it is not
        /// newer than `delivered` (those that hold it already drop it).
        var resyncing = false
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
        /// The current connection, and its number (events of an earlier one are ignored).
        var connection: any FluxConnection
        var generation = 0
        var welcome: Welcome?
        var terminal: FluxError?
        var nextID = 0
        var pending: [String: PendingSlot] = [:]
        /// Ping ids of `confirmDispatched` barriers -> the dispatch ids they watch and the refusals seen.
        var barriers: [String: (ids: Set<String>, refused: [ServerError])] = [:]
        var subscriptions: [String: WireSubscription] = [:]
        var draining: [String: Int] = [:]
        /// Path subscriptions (SPEC §16.4), by store and path; those withdrawn, up to their `unsubscribed`; and
        /// how many path `subscribe`s were sent (their order, for a refusal).
        var pathSubscriptions: [PathKey: WirePathSubscription] = [:]
        var pathDraining: [PathKey: Int] = [:]
        var pathOrder = 0
        var nextSubscriber = 0
        var sinks: [String: @Sendable (StoreInbound) -> Void] = [:]
        var monitors: [Int: MonitorListener] = [:]
        var byeReason: String?
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
        var outbox: [UInt8] = []
        var flushing = false
        /// Frames made while reconnecting, in order.
        var held: [HeldFrame] = []
        /// Ids of settled dispatches whose settlement is awaited (recovered after a reconnection).
        var settles: Set<String> = []
        /// Live queries (id -> store, query JSON), declared again after a reconnection.
        var liveQueries: [String: (store: String, query: [UInt8])] = [:]
        /// `recover` requests in flight -> the dispatch ids they ask about.
        var recovering: [String: [String]] = [:]
        /// Bumped when a reconnection finds another fluxd history (`welcome.epoch`).
        var era = 0
        /// Whether fluxd has delta subscriptions (SPEC §16: `welcome.limits.deltaHistory`).
        var deltas: Bool { welcome?.limits.deltaHistory != nil }
        var reconnectTask: Task<Void, Never>?
        /// When the current connection was welcomed, and how many connections in a row were lost soon after it
        /// (`Reconnection.quickLoss`): the next reconnection continues their backoff instead of starting over, so
        /// a connection fluxd closes at once (a refused registration) is not retried in a tight loop.
        var welcomedAt: ContinuousClock.Instant?
        var quickLosses = 0
    }

    static let helloKey = "#hello"

    let state: Mutex<State>
    private let errorsContinuation: AsyncStream<FluxError>.Continuation
    let connectivity = ConnectivityBroadcaster()
    /// Makes the connections of reconnection attempts (nil: this client cannot reconnect).
    let connector: Connector?

    /// The transport this client speaks over now (a new one after each reconnection).
    public var connection: any FluxConnection { state.withLock { $0.connection } }
    /// This client's session (SPEC §15.4), sent in `hello` on every connection: random, made once per client.
    public let session: String
    /// How this client reconnects (`.disabled` when it was made over a single connection).
    public let reconnect: ReconnectPolicy
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
                 writeBufferLimit: Int, logger: Logger, reconnect: ReconnectPolicy, connector: Connector?) {
        self.state = Mutex(State(connection: connection))
        self.connector = connector
        self.reconnect = connector == nil ? .disabled : reconnect
        self.session = makeSessionID()
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
    /// - `reconnect`: how the client reconnects when it loses fluxd later (on by default; see `ReconnectPolicy`).
    ///   The first connection is not retried: this throws when it fails.
    /// - `logger`: where the client logs (swift-log; by default a logger labelled `fluxbus.client`).
    ///
    /// When no fluxd answers at the path it throws `FluxError.cannotConnect`, whose description names the path
    /// tried, where it came from, what is there, and how to start or find fluxd. Before sending anything it checks
    /// who listens on the socket: when `expectedServerUID` is given, or `$FLUXBUS_SERVER_UID` is set, or this
    /// process runs as root (then 0 is expected), a listener running as another uid is refused with
    /// `FluxError.untrustedServer` (see `SocketConnection.init(path:maxFrame:expectedServerUID:)`).
    public static func connect(
        socketPath: String? = nil, name: String, role: Role = .client, expectedServerUID: UInt32? = nil,
        requestTimeout: Duration = .seconds(10), reconnect: ReconnectPolicy = .default,
        logger: Logger = Logger(label: "fluxbus.client")
    ) async throws(FluxError) -> FluxClient {
        let path = socketPath ?? defaultSocketPath()
        let source = socketPath != nil ? "the socket path given"
            : (ProcessInfo.processInfo.environment["FLUXBUS_SOCKET"].map { !$0.isEmpty } == true
                ? "$FLUXBUS_SOCKET" : "the default path")
        let connector: Connector = { () throws(FluxError) -> any FluxConnection in
            do throws(FluxError) {
                return try SocketConnection(path: path, expectedServerUID: expectedServerUID)
            } catch {
                if case .cannotConnect(var e) = error {
                    e.source = source
                    throw .cannotConnect(e)
                }
                throw error
            }
        }
        return try await connect(name: name, role: role, requestTimeout: requestTimeout, reconnect: reconnect,
                                 logger: logger, connector: connector)
    }

    /// Connects with `connector` (which makes a new, not yet started connection each time it is called: the first
    /// one now, one per reconnection attempt later) and does the handshake (see `connect(socketPath:...)`).
    public static func connect(
        name: String, role: Role = .client, requestTimeout: Duration = .seconds(10), writeBufferLimit: Int = 4 << 20,
        reconnect: ReconnectPolicy = .default, logger: Logger = Logger(label: "fluxbus.client"),
        connector: @escaping Connector
    ) async throws(FluxError) -> FluxClient {
        let connection = try await connector()
        let client = FluxClient(connection: connection, name: name, role: role, requestTimeout: requestTimeout,
                                writeBufferLimit: writeBufferLimit, logger: logger, reconnect: reconnect,
                                connector: connector)
        try await client.handshake(connection)
        return client
    }

    /// Does the handshake over an existing (not yet started) connection (see `connect(socketPath:...)`). Such a
    /// client cannot reconnect (it has no way to make another connection): give `connect` a connector for that.
    public static func connect(
        over connection: any FluxConnection, name: String, role: Role = .client,
        requestTimeout: Duration = .seconds(10), writeBufferLimit: Int = 4 << 20,
        logger: Logger = Logger(label: "fluxbus.client")
    ) async throws(FluxError) -> FluxClient {
        let client = FluxClient(connection: connection, name: name, role: role, requestTimeout: requestTimeout,
                                writeBufferLimit: writeBufferLimit, logger: logger, reconnect: .disabled, connector: nil)
        try await client.handshake(connection)
        return client
    }

    /// The first handshake, on connection generation 0.
    private func handshake(_ connection: any FluxConnection) async throws(FluxError) {
        connection.start { [self] event in receive(event, generation: 0) }
        let reply: Envelope
        do {
            reply = try await request(key: Self.helloKey, frame: helloFrame(), timeout: nil,
                                      what: "fluxd's welcome (handshake)")
        } catch {
            connection.close()
            throw error
        }
        guard let welcome = Self.parseWelcome(reply) else {
            connection.close()
            throw .protocolViolation("expected welcome, got \(String(decoding: reply.body, as: UTF8.self))")
        }
        state.withLock { s in
            s.welcome = welcome
            s.welcomedAt = ContinuousClock().now
            if s.phase == .handshaking { s.phase = .ready }
        }
        logger.debug("connected to \(welcome.server) as peer \(welcome.peer)", metadata: ["name": "\(name)"])
    }

    /// `hello`, with this client's session.
    func helloFrame() -> Frame {
        var hello = FrameBuilder(op: "hello")
        hello.int("protocol", fluxProtocolVersion)
        hello.string("role", role.rawValue)
        hello.string("name", name)
        hello.bool("heartbeat", true)  // fluxd pings us when we are silent; the reader answers (SPEC §8.7)
        hello.string("session", session)  // the same on every connection: settlements can be recovered (§15.4)
        return hello.finish()
    }

    /// Reads `welcome` (nil if the reply is something else).
    static func parseWelcome(_ reply: Envelope) -> Welcome? {
        guard reply.fluxString("op") == "welcome" else { return nil }
        let limits = reply.raw("limits").flatMap { try? FluxJSON.decode(Limits.self, from: $0) }
        return Welcome(
            protocolVersion: reply.fluxInt("protocol") ?? 0,
            server: reply.fluxString("server") ?? "",
            peer: reply.fluxInt("peer") ?? 0,
            limits: limits ?? Limits(),
            epoch: reply.fluxString("epoch"),
            durability: reply.fluxString("durability"))
    }

    /// What fluxd said in `welcome` (peer id, limits) on the current connection.
    public var welcome: Welcome {
        guard let w = state.withLock({ $0.welcome }) else { preconditionFailure("FluxClient used before connect finished") }
        return w
    }

    /// Whether the client has ended (closed locally, or the connection dropped for good). A client that is
    /// reconnecting is not closed.
    public var isClosed: Bool { state.withLock { $0.terminal != nil } }

    /// Whether the client is connected and past the handshake (false while it reconnects, and once it ended).
    public var isConnected: Bool { state.withLock { $0.phase == .ready } }

    /// What happens to the connection from now on (disconnected, reconnecting, reconnected, gave up), for a UI to
    /// show. Each call makes a new stream (any number may listen); each keeps its newest 64 unread events and
    /// finishes when the client ends.
    public func connectivityEvents() -> AsyncStream<ConnectivityEvent> {
        connectivity.stream()
    }

    // MARK: Closing

    /// Says `bye`, waits (at most 2 s) for fluxd to close the connection, then closes it. Pending calls throw
    /// `FluxError.closed`; subscriptions finish without error. A client that is reconnecting stops doing so.
    public func close() async {
        enum Start { case none, bye, now }
        let start = state.withLock { s -> Start in
            guard s.terminal == nil, s.phase != .closing else { return .none }
            if s.phase == .reconnecting {
                s.phase = .closing
                return .now
            }
            s.phase = .closing
            s.outbox.append(contentsOf: FrameBuilder(op: "bye").finish().wireBytes)
            return .bye
        }
        if start == .now {
            finish(local: true, terminal: .closed)
            connection.close()
            return
        }
        if start == .bye { try? flush() }
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

    /// Closes the connection at once, without `bye` (like a crash, as far as fluxd can tell). The client ends (it
    /// does not reconnect).
    public func abort() {
        let reconnecting = state.withLock { s -> Bool in
            guard s.terminal == nil else { return false }
            if s.phase == .reconnecting {
                s.phase = .closing
                return true
            }
            s.phase = .closing
            return false
        }
        if reconnecting { finish(local: true, terminal: .closed) }
        connection.close()
    }

    // MARK: Store hooks (FluxStore)

    /// Routes `store`'s messages to `sink` (see `StoreInbound`). Called before sending `register`. `sink` is called
    /// on the connection's reader (or the reconnecting task) with no lock held.
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

    /// The number of the current connection (0 for the first; each reconnection makes the next).
    package var generation: Int { state.withLock { $0.generation } }

    /// Sends a frame (store answers, registration, ...). While reconnecting it throws `disconnected`: nothing is
    /// kept for the next connection. With `generation`, only on that connection (a store's answers belong to the
    /// connection it registered on).
    package func send(frame: Frame, generation: Int? = nil) throws(FluxError) {
        try queueBytes(frame.wireBytes, generation: generation)
        try flush()
    }

    /// Queues a frame without writing it yet: a store answering a run of actions hands all its answers to the
    /// connection at once (`flushQueued()` after the run; any other send hands them over too, in order).
    package func queue(frame: Frame, generation: Int? = nil) throws(FluxError) {
        // Copied from the frame straight into the outbox (not through an array of its own).
        try withExtendedLifetime(frame) { () throws(FluxError) in
            let bytes = frame.bytes
            try state.withLock { s throws(FluxError) in
                if let terminal = s.terminal { throw terminal }
                if s.phase == .reconnecting { throw .disconnected("not connected to fluxd (reconnecting)") }
                if let generation, generation != s.generation {
                    throw .disconnected("the connection this was meant for was lost")
                }
                s.outbox.append(contentsOf: bytes)
            }
        }
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

    /// Appends to the outbox (fails once the connection has ended). While reconnecting, `hold` keeps the frame
    /// for the next connection, else it fails; with `generation`, it fails unless that connection is the current one.
    func queueBytes(_ bytes: [UInt8], hold: Bool = false, generation: Int? = nil) throws(FluxError) {
        try state.withLock { s throws(FluxError) in
            if let terminal = s.terminal { throw terminal }
            if s.phase == .reconnecting {
                guard hold else { throw .disconnected("not connected to fluxd (reconnecting)") }
                s.held.append(HeldFrame(key: nil, bytes: bytes))
                return
            }
            if let generation, generation != s.generation {
                throw .disconnected("the connection this was meant for was lost")
            }
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
            let next = state.withLock { s -> (bytes: [UInt8], connection: any FluxConnection, generation: Int)? in
                if s.outbox.isEmpty {
                    s.flushing = false
                    return nil
                }
                defer { s.outbox = [] }
                return (s.outbox, s.connection, s.generation)
            }
            guard let next else { return }
            do {
                try next.connection.send(next.bytes)
            } catch {
                // Frames queued meanwhile for a newer connection (a reconnection) are still handed over.
                let newer = state.withLock { s -> Bool in
                    if s.generation != next.generation { return true }
                    s.outbox = []
                    s.flushing = false
                    return false
                }
                if !newer { throw error }
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
    /// While reconnecting, the frame is held for the next connection. `settle`: a settled dispatch, whose
    /// outcome is recovered after a reconnection.
    func register(key: String, frame: Frame, settle: Bool = false) throws(FluxError) {
        try state.withLock { s throws(FluxError) in
            if let terminal = s.terminal { throw terminal }
            s.pending[key] = .registered
            if settle { s.settles.insert(key) }
            if s.phase == .reconnecting {
                s.held.append(HeldFrame(key: key, bytes: frame.wireBytes))
            } else {
                s.outbox.append(contentsOf: frame.wireBytes)
            }
        }
        do {
            try flush()
        } catch {
            complete(key, .failure(error))
        }
    }

    /// Sends `frame` and waits for the message that answers `key` (an id, or the handshake), within `timeout`
    /// (the client's `requestTimeout` when nil) for the whole call.
    func request(key: String, frame: Frame, timeout: Duration?, what: String, settle: Bool = false) async throws(FluxError) -> Envelope {
        let limit = timeout ?? requestTimeout
        let deadline = ContinuousClock.now + limit
        try await waitForRoom(until: deadline, what: what)
        if Task.isCancelled { throw .cancelled }
        try register(key: key, frame: frame, settle: settle)
        return try await awaitAnswer(key: key, deadline: deadline, limit: limit, what: what)
    }

    /// Waits for the answer to `key` (registered with `register`) until `deadline`; `limit` is the whole call's
    /// timeout, named in the error (what is left of it when the wait starts depends on the machine's load).
    func awaitAnswer(key: String, deadline: ContinuousClock.Instant, limit: Duration, what: String) async throws(FluxError) -> Envelope {
        let seconds = limit.formatted
        let timer = Task { [weak self] in
            try? await Task.sleep(until: deadline, clock: .continuous)
            if !Task.isCancelled { self?.expire(key, what: what, within: seconds) }
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
                            s.settles.remove(key)
                            s.held.removeAll { $0.key == key }
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
            self.withdrawHeld(key)
            self.complete(key, .failure(.cancelled))
        }
        return try result.get()
    }

    /// The deadline of `key` passed: it fails with `timedOut`, or, when its frame is still held for a reconnection
    /// (never sent), the frame is dropped and a settled dispatch fails with `notSent`.
    func expire(_ key: String, what: String, within seconds: String) {
        let (held, settle) = state.withLock { s -> (Bool, Bool) in
            guard let i = s.held.firstIndex(where: { $0.key == key }) else { return (false, false) }
            s.held.remove(at: i)
            return (true, s.settles.contains(key))
        }
        let error: FluxError
        if held && settle {
            error = .notSent("\(what): fluxd could not be reached within \(seconds) (reconnecting); the action was not dispatched")
        } else if held {
            error = .timedOut("\(what): fluxd could not be reached within \(seconds) (reconnecting); nothing was sent")
        } else {
            error = .timedOut("\(what) (no answer within \(seconds))")
        }
        complete(key, .failure(error))
    }

    /// Drops `key`'s frame if it is still held for a reconnection.
    func withdrawHeld(_ key: String) {
        state.withLock { s in
            if let i = s.held.firstIndex(where: { $0.key == key }) { s.held.remove(at: i) }
        }
    }

    /// Delivers the answer to `key` (resumes its awaiter outside the lock, or keeps it for a later awaiter).
    func complete(_ key: String, _ result: Result<Envelope, FluxError>) {
        let waiter = state.withLock { s -> CheckedContinuation<Result<Envelope, FluxError>, Never>? in
            s.settles.remove(key)
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
