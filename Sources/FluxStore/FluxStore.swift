import FluxClient
import FluxCore
import Foundation
import Logging
import Synchronization

/// A store worker: one explicit state type, action handlers that mutate it transactionally, and the wire
/// protocol (register, answer every action in order, publish snapshots) handled for you.
///
///     let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"])
///     store.on("todo/add", as: AddTodo.self) { state, action, ctx in state.todos.append(action.todo) }
///     try await store.run()
///
/// Semantics:
/// - One handler runs at a time, in delivery (seq) order.
/// - A handler mutates a copy of the state. If it throws, the copy is dropped and the store answers `reject`
///   (`StoreRejection`'s code and message; `store/error` for other errors). If it returns, the store answers `done`
///   with the new state when it differs (`!=`) from the old one, else `done` without state (no new version).
///   Several changes in one handler make one snapshot.
/// - The handler is picked by exact action type, else by the longest matching `prefix*` pattern given to `on`.
///   An action that matches the store's `handles` but no handler (a typo such as `counter/ad` under `counter/*`)
///   is rejected with `store/unhandled-action`, naming the type and the handled types, unless the store was made
///   with `unhandled: .ignore` (then it is answered `done`, unchanged).
/// - A payload that does not decode as the handler's type is rejected with `store/bad-payload` and a message for
///   the person who dispatched it (`payload of todo/add: field 'title' is missing`). Other errors a handler throws
///   become `store/error` with the error's description.
/// - On `registered`, the store adopts the retained snapshot's state (it resumes where it was), then handles
///   queued actions. A retained state that does not decode as `State` makes `run` throw rather than overwrite it.
///   An action whose seq is not above the adopted snapshot's is already in that state: it is answered `done`
///   without calling a handler (SPEC §15.3, rule 2).
/// - Reconnection (SPEC §15.5): `run(socketPath:)` reconnects by itself when fluxd goes away or restarts (see
///   `ReconnectPolicy`; `connectivityEvents()` tells what happens), registers again and adopts the retained
///   snapshot, even if it is older than the state in memory (rule 1: fluxd redelivers what it had not recorded).
/// - Follow-up dispatches and spawned async work (see `StoreContext`) happen only if the handler returns.
/// - Query-driven stores: `onQueriesChanged` is called, in order with the actions, with the decoded active query
///   set whenever fluxd reports it changed; state changes it makes are published with a `state` message.
/// - Following other stores: `follow(_:as:_:)` subscribes on the store's own connection; snapshots are handled in
///   wire order with the actions, so with `waitFor` an action's handler sees the followed store's state after it
///   handled the same action (`ctx.latest`).
///
/// Configure (`on`, `onQueriesChanged`, `follow`, `onError`) before `run`. Errors nobody answers go to `onError`'s
/// handler, else to the store's `logger` (swift-log; nothing is written to stderr by the store itself).
public final class FluxStore<State: Codable & Equatable & Sendable>: Sendable {
    typealias ActionHandler = @Sendable (inout State, ArraySlice<UInt8>?, ActionContext, JSONDecoder) throws -> Void
    typealias QueriesHandler = @Sendable (inout State, ArraySlice<UInt8>, StoreContext, JSONDecoder) throws -> Void

    struct Follow: Sendable {
        var store: String
        /// Turns what fluxd sends for the followed store (a whole snapshot, or a delta applied to the state held)
        /// into a `Snapshot<T>`, decoded incrementally (`StateReader`): a change to one todo of 10,000 decodes that
        /// todo, not the whole state.
        var read: @Sendable (RawSnapshot) throws(FluxError) -> ReadStep<any Sendable>
        var handler: (@Sendable (inout State, any Sendable, StoreContext) throws -> Void)?
    }


    struct Registry {
        var exact: [String: ActionHandler] = [:]
        var prefixes: [(prefix: String, handler: ActionHandler)] = []
        var queries: QueriesHandler?
        var follows: [Follow] = []
        var onError: (@Sendable (any Error) -> Void)?
        var running = false
    }

    /// The store's name.
    public let name: String
    /// The action type patterns it handles.
    public let handles: [String]
    /// Stores that must answer an action before this one gets it.
    public let waitFor: [String]
    /// The state registered when fluxd retains none.
    public let initial: State
    /// What the store answers an action that matches `handles` but none of its handlers.
    public let unhandled: UnhandledActions
    /// Where the store logs (errors nobody answers, when no `onError` handler is set).
    public let logger: Logger
    /// States whose JSON is at most this many bytes are published whole, larger ones as patches (with a fluxd that
    /// takes patches, SPEC §16.2). A small state costs the store next to nothing to write whole, and fluxd forwards
    /// whole states untouched while it applies a patch to its tree and renders the state for full subscribers: below
    /// about a kilobyte the whole state is the cheaper message for everyone (Benchmarks/RESULTS.md §7).
    public let wholeStateLimit: Int

    /// The default `wholeStateLimit`: 1024 bytes, or `FLUXBUS_WHOLE_STATE_LIMIT` from the environment (0: every
    /// change as a patch).
    public static var defaultWholeStateLimit: Int {
        ProcessInfo.processInfo.environment["FLUXBUS_WHOLE_STATE_LIMIT"].flatMap { Int($0) }.map { max(0, $0) } ?? 1024
    }

    private let registry = Mutex(Registry())
    /// Guards `current`. (Not a `Mutex<State>`: in this generic class, each use of that type looked its metadata
    /// up at run time, once per action.)
    private let currentLock = Mutex(())
    @exclusivity(unchecked) private nonisolated(unsafe) var current: State
    private let readiness = Mutex(Readiness())
    private let tasks = Mutex(TaskBag())
    private let connectivity = ConnectivityBroadcaster()

    /// A store named `name` (SPEC §4.1) that starts from `initial` when fluxd retains no state for it, is sent the
    /// actions matching `handles` (patterns: `todo/add`, `todo/*`), after the stores in `waitFor` answered them.
    /// `unhandled`: `.reject` (default) answers an action no handler takes with `store/unhandled-action`; `.ignore`
    /// answers it `done`. `logger`: where the store logs. `wholeStateLimit`: states up to this many bytes of JSON
    /// are published whole, larger ones as patches.
    public init(name: String, initial: State, handles: [String], waitFor: [String] = [],
                unhandled: UnhandledActions = .reject, logger: Logger = Logger(label: "fluxbus.store"),
                wholeStateLimit: Int = FluxStore.defaultWholeStateLimit) {
        precondition(Names.isValidStore(name), "bad store name \"\(name)\"")
        for p in handles { precondition(Names.isValidPattern(p), "bad pattern \"\(p)\"") }
        for w in waitFor { precondition(Names.isValidStore(w), "bad store name \"\(w)\" in waitFor") }
        self.name = name
        self.handles = handles
        self.waitFor = waitFor
        self.initial = initial
        self.unhandled = unhandled
        self.logger = logger
        self.wholeStateLimit = wholeStateLimit
        self.current = initial
    }

    /// The state as of the last action or query change handled (for tests and diagnostics).
    public var state: State { currentLock.withLock { _ in current } }

    // MARK: Configuration

    /// Handles actions of `type` (or matching `type` when it ends in `*`) whose payload decodes as `A`.
    public func on<A: Decodable & Sendable>(
        _ type: String, as payload: A.Type,
        _ handler: @escaping @Sendable (inout State, A, ActionContext) throws -> Void
    ) {
        add(type) { state, raw, ctx, decoder in
            let value: A
            let bytes = raw ?? ArraySlice("null".utf8)
            do {
                value = try decoder.decode(A.self, from: Data(bytes))
            } catch {
                throw StoreRejection(code: StoreRejection.badPayloadCode,
                                     message: "payload of \(ctx.type): \(PayloadProblem.describe(error, payload: bytes))")
            }
            try handler(&state, value, ctx)
        }
    }

    /// Handles actions of `type` (or matching `type` when it ends in `*`), ignoring any payload.
    public func on(_ type: String, _ handler: @escaping @Sendable (inout State, ActionContext) throws -> Void) {
        add(type) { state, _, ctx, _ in try handler(&state, ctx) }
    }

    private func add(_ pattern: String, _ handler: @escaping ActionHandler) {
        precondition(Names.isValidPattern(pattern), "bad action type or pattern \"\(pattern)\"")
        registry.withLock { r in
            if pattern.hasSuffix("*") {
                r.prefixes.append((String(pattern.dropLast()), handler))
                r.prefixes.sort { $0.prefix.utf8.count > $1.prefix.utf8.count }
            } else {
                r.exact[pattern] = handler
            }
        }
    }

    /// Makes this a query-driven store (WordPressFlux QueryStore): `handler` gets the active queries, decoded
    /// as `Q` and deduplicated, every time the set changes (also right after registration). It may mutate the state
    /// (published as a `state` message when it changed), dispatch, or spawn fetches. Queries that do not decode as
    /// `Q` are left out (and reported to `onError`).
    public func onQueriesChanged<Q: Decodable & Sendable>(
        as query: Q.Type,
        _ handler: @escaping @Sendable (inout State, [ActiveQuery<Q>], StoreContext) throws -> Void
    ) {
        let onError: @Sendable (any Error) -> Void = { [weak self] e in self?.report(e) }
        registry.withLock { r in
            r.queries = { state, raw, ctx, decoder in
                let entries: [QueryEntry<Q>]
                do {
                    entries = try decoder.decode([QueryEntry<Q>].self, from: Data(raw))
                } catch {
                    onError(FluxError.coding("queries of \(ctx.storeName) unreadable: \(error)"))
                    return
                }
                var active: [ActiveQuery<Q>] = []
                for e in entries {
                    if let q = e.query {
                        active.append(ActiveQuery(query: q, count: e.count ?? 1))
                    } else {
                        onError(FluxError.coding("a query of \(ctx.storeName) does not decode as \(Q.self)"))
                    }
                }
                try handler(&state, active, ctx)
            }
        }
    }

    /// Subscribes to another store on this store's connection. Each snapshot (decoded as `T`) is kept for
    /// `ctx.latest(store, as: T.self)` and passed to `handler`, which runs one at a time with the actions and may
    /// update this store's state (published as a `state` message when it changed). With a fluxd that has delta
    /// subscriptions (SPEC §16.3) each change arrives as a patch and is decoded incrementally, like a typed
    /// `FluxClient.subscribe`: a `TrackedArray` in `T` that it did not touch is the earlier value again, so
    /// following a store of 10,000 todos costs a change's todos, not the whole state.
    public func follow<T: Decodable & Sendable>(
        _ store: String, as type: T.Type,
        _ handler: (@Sendable (inout State, Snapshot<T>, StoreContext) throws -> Void)? = nil
    ) {
        precondition(Names.isValidStore(store), "bad store name \"\(store)\"")
        let wrapped: (@Sendable (inout State, any Sendable, StoreContext) throws -> Void)?
        if let handler {
            wrapped = { state, snapshot, ctx in try handler(&state, snapshot as! Snapshot<T>, ctx) }
        } else {
            wrapped = nil
        }
        let reader = StateReader<T, TypedCodec<T>>.typed(T.self)
        let follow = Follow(
            store: store,
            read: { raw throws(FluxError) -> ReadStep<any Sendable> in
                switch try reader.read(raw) {
                case .state(let state):
                    return .state(Snapshot(store: raw.store, version: raw.version, seq: raw.seq, state: state))
                case .skip: return .skip
                case .resync: return .resync
                }
            },
            handler: wrapped)
        registry.withLock { $0.follows.append(follow) }
    }

    /// Where errors that have no one to answer go: spawned work that threw, `no-handler` for a follow-up dispatch,
    /// unreadable queries or followed snapshots, handler errors in query/follow handlers. Default: the store's
    /// `logger`, at level error.
    public func onError(_ handler: @escaping @Sendable (any Error) -> Void) {
        registry.withLock { $0.onError = handler }
    }

    func report(_ error: any Error) {
        if let handler = registry.withLock({ $0.onError }) {
            handler(error)
        } else {
            logger.error("\(error)", metadata: ["store": "\(name)"])
        }
    }

    /// The action types (and `prefix*` patterns) this store has handlers for, sorted.
    var handledTypes: [String] {
        registry.withLock { r in (Array(r.exact.keys) + r.prefixes.map { $0.prefix + "*" }).sorted() }
    }

    // MARK: Running

    /// Connects to fluxd (role `store`), registers, and handles actions until the task is cancelled (then it
    /// unregisters, says bye and returns) or the connection is lost for good (then it throws
    /// `FluxError.disconnected`): with `reconnect` (on by default) a lost connection is made again, and the store
    /// registers again and resumes from the retained snapshot.
    /// Throws `FluxError.server` if registration is refused (`name-taken`, `cycle`, ...).
    /// `socketPath` nil: the default (`defaultSocketPath()`). A missing fluxd at the start throws
    /// `FluxError.cannotConnect`, which says where it looked and what to do.
    public func run(socketPath: String? = nil, peerName: String? = nil,
                    reconnect: ReconnectPolicy = .default) async throws(FluxError) {
        let client: FluxClient
        do {
            client = try await FluxClient.connect(socketPath: socketPath, name: peerName ?? name, role: .store,
                                                  reconnect: reconnect, logger: logger)
        } catch {
            fail(error)
            throw error
        }
        try await runOwning(client)
    }

    /// Like `run(socketPath:peerName:)` with connections made by `connector` (one now, one per reconnection
    /// attempt later; see `FluxClient.connect(name:role:...:connector:)`).
    public func run(peerName: String? = nil, reconnect: ReconnectPolicy = .default,
                    connector: @escaping FluxClient.Connector) async throws(FluxError) {
        let client: FluxClient
        do {
            client = try await FluxClient.connect(name: peerName ?? name, role: .store, reconnect: reconnect,
                                                  logger: logger, connector: connector)
        } catch {
            fail(error)
            throw error
        }
        try await runOwning(client)
    }

    /// Like `run(socketPath:peerName:)` over a connection that is not started yet (e.g. FluxTesting's bus); such
    /// a store does not reconnect.
    public func run(on connection: any FluxConnection, peerName: String? = nil) async throws(FluxError) {
        let client: FluxClient
        do {
            client = try await FluxClient.connect(over: connection, name: peerName ?? name, role: .store, logger: logger)
        } catch {
            fail(error)
            throw error
        }
        try await runOwning(client)
    }

    private func runOwning(_ client: FluxClient) async throws(FluxError) {
        let forward = Task { [weak self] in
            for await error in client.errors { self?.report(error) }
        }
        let events = client.connectivityEvents()
        let connectivity = self.connectivity
        let forwardEvents = Task {
            for await event in events { connectivity.yield(event) }
        }
        defer {
            forward.cancel()
            forwardEvents.cancel()
            connectivity.finish(permanently: false)
        }
        do {
            try await run(client: client)
        } catch {
            await client.close()
            throw error
        }
        await client.close()
    }

    /// What happens to the connection of the store's `run(socketPath:)` (or `run(peerName:reconnect:connector:)`)
    /// from now on: disconnected, reconnecting, reconnected, gave up. Each call makes a new stream, which finishes
    /// when that run ends. (A store run on a client of your own: use that client's `connectivityEvents()`.)
    public func connectivityEvents() -> AsyncStream<ConnectivityEvent> {
        connectivity.stream()
    }

    /// Registers and runs on an existing client connection (which must have role `store`). Several stores may
    /// run on one client; the client stays open when this returns. Returns when the task is cancelled (after
    /// sending `unregister`) or the client is closed; throws if registration fails or the connection drops.
    public func run(client: FluxClient) async throws(FluxError) {
        let (config, alreadyRunning) = registry.withLock { r -> (Registry, Bool) in
            defer { r.running = true }
            return (r, r.running)
        }
        precondition(!alreadyRunning, "FluxStore \(name) is already running")
        readiness.withLock { $0.reset() }
        defer {
            registry.withLock { $0.running = false }
            let pending = tasks.withLock { $0.cancelAll() }
            for t in pending { t.cancel() }
        }

        // Messages are posted to a mailbox by the connection's reader; the loop takes all that are waiting at
        // once and answers them with one write (a doorbell wakes it only when the mailbox was empty).
        let mailbox = StoreMailbox()
        do {
            try client.attachStore(name) { mailbox.post(.store($0)) }
        } catch {
            fail(error)
            throw error
        }
        defer { client.detachStore(name) }

        var followIDs: [(String, Int)] = []
        for follow in config.follows {
            let store = follow.store
            let id = client.addDeltaSubscriber(
                store: store,
                deliver: { mailbox.post(.followed(store, $0)) },
                end: { _ in })
            if let id { followIDs.append((store, id)) }
        }
        defer { for (store, id) in followIDs { client.removeSubscriber(store: store, id: id) } }

        var loop = Loop(store: self, client: client, config: config)
        do {
            try loop.register()
        } catch {
            // A client that is reconnecting: the store registers once it is connected again (`resumed`).
            if client.isClosed || client.isConnected || error.isCodingError {
                fail(error)
                throw error
            }
        }

        let outcome: Result<Void, FluxError> = await withTaskCancellationHandler {
            defer { try? client.flushQueued() }
            // After a cancellation, what was posted before it is still handled (as a stream would deliver it).
            while let items = await mailbox.next() {
                do throws(FluxError) {
                    if try loop.handle(items) == .stop { return .success(()) }
                } catch {
                    return .failure(error)
                }
                try? client.flushQueued()
            }
            return .success(()) // Cancelled.
        } onCancel: {
            mailbox.close()
        }
        switch outcome {
        case .success:
            if !client.isClosed && loop.registered, let generation = loop.generation {
                var b = FrameBuilder(op: "unregister")
                b.string("store", name)
                try? client.send(frame: b.finish(), generation: generation)
            }
            fail(.cancelled)
        case .failure(let error):
            fail(error)
            throw error
        }
    }

    /// Waits until the current (or next) `run` has registered and adopted its state. Throws what `run` threw if
    /// it failed before that.
    /// Throws `FluxError.cancelled` when the waiting task is cancelled, or when `run` was cancelled first.
    public func ready() async throws(FluxError) {
        let id = readiness.withLock { r -> Int in
            r.nextWaiter += 1
            return r.nextWaiter
        }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Result<Void, FluxError>, Never>) in
                let result = readiness.withLock { r -> Result<Void, FluxError>? in
                    if let result = r.result { return result }
                    if Task.isCancelled { return .failure(.cancelled) }
                    r.waiters[id] = c
                    return nil
                }
                if let result { c.resume(returning: result) }
            }
        } onCancel: {
            let waiter = readiness.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(returning: .failure(.cancelled))
        }
        try result.get()
    }

    func markReady() {
        let waiters = readiness.withLock { $0.resolve(.success(())) }
        for w in waiters { w.resume(returning: .success(())) }
    }

    private func fail(_ error: FluxError) {
        let waiters = readiness.withLock { $0.resolve(.failure(error)) }
        for w in waiters { w.resume(returning: .failure(error)) }
    }

    /// `register`, with `state` (used only when fluxd retains none): the initial state, or, registering again after
    /// a reconnection, the state in memory (an ephemeral fluxd that restarted retains nothing: the store keeps what
    /// it had; a durable one sends its retained snapshot, which the store adopts).
    /// The `register` frame, and the size of the state's JSON in it.
    /// The `register` frame, with `stateJSON` as its initial state when given.
    func registerFrame(stateJSON: [UInt8]?) -> Frame {
        var b = FrameBuilder(op: "register", capacity: 128 + (stateJSON?.count ?? 0))
        b.string("store", name)
        b.strings("handles", handles)
        b.strings("waitFor", waitFor)
        b.bool("queryDeltas", true)  // query changes one by one, not the whole set each time (SPEC §8.6)
        if let stateJSON { b.raw("state", stateJSON) }
        return b.finish()
    }

    func publishState(_ state: State) {
        currentLock.withLock { _ in current = state }
    }

    func start(_ work: @escaping @Sendable (StoreDispatcher) async throws -> Void, dispatcher: StoreDispatcher) {
        tasks.withLock { bag in
            let id = bag.next
            bag.next += 1
            bag.tasks[id] = Task { [weak self] in
                do {
                    try await work(dispatcher)
                } catch is CancellationError {
                } catch FluxError.cancelled {
                } catch {
                    self?.report(error)
                }
                _ = self?.tasks.withLock { $0.tasks.removeValue(forKey: id) }
            }
        }
    }

}

/// One-shot readiness of the current run.
struct Readiness {
    var result: Result<Void, FluxError>?
    var waiters: [Int: CheckedContinuation<Result<Void, FluxError>, Never>] = [:]
    var nextWaiter = 0

    mutating func reset() {
        if result != nil { result = nil }
    }

    mutating func resolve(_ r: Result<Void, FluxError>) -> [CheckedContinuation<Result<Void, FluxError>, Never>] {
        guard result == nil else { return [] }
        result = r
        defer { waiters = [:] }
        return Array(waiters.values)
    }
}

/// Spawned work of a running store.
struct TaskBag {
    var next = 0
    var tasks: [Int: Task<Void, Never>] = [:]

    mutating func cancelAll() -> [Task<Void, Never>] {
        defer { tasks = [:] }
        return Array(tasks.values)
    }
}

/// One element of a `queries` message, decoded leniently (a query that does not decode is nil).
struct QueryEntry<T: Decodable>: Decodable {
    var query: T?
    var count: Int?

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        query = try? c.decode(T.self, forKey: .query)
        count = try? c.decode(Int.self, forKey: .count)
    }

    enum CodingKeys: String, CodingKey { case query, count }
}

extension FluxError {
    /// Whether this is `.coding` (a state that does not encode: retrying cannot help).
    var isCodingError: Bool {
        if case .coding = self { return true }
        return false
    }
}

/// What the connection's reader hands to the loop of a store's `run`.
enum StoreMailboxItem: Sendable {
    case store(StoreInbound)
    case followed(String, WireStoreEvent)
}

/// Where the connection's reader leaves messages for the loop of one `run`: posting appends under a lock and wakes
/// the loop only when it waits, so a burst of messages costs one wake-up and is handled (and answered) as one run.
/// Not generic (not nested in `FluxStore<State>`): a generic type's metadata is looked up at run time on every use.
final class StoreMailbox: Sendable {
    private struct Box {
        var items: [StoreMailboxItem] = []
        /// The loop, waiting for a post (or the close).
        var waiter: UnsafeContinuation<Void, Never>?
        var closed = false
    }
    private let box = Mutex(Box())

    init() {}

    func post(_ item: StoreMailboxItem) {
        let waiter = box.withLock { b -> UnsafeContinuation<Void, Never>? in
            guard !b.closed else { return nil }
            b.items.append(item)
            defer { b.waiter = nil }
            return b.waiter
        }
        // Posted by the connection's reader: the loop is woken after the rest of the read was posted too, so it
        // takes the whole burst at once and answers it with one write (woken at once from anywhere else).
        if let waiter { ReadBurst.atEnd { waiter.resume() } }
    }

    /// Everything posted and not taken yet, in order, waiting (without blocking a thread) until there is something;
    /// nil once the mailbox is closed and everything posted before was taken. One loop takes at a time.
    func next() async -> [StoreMailboxItem]? {
        while true {
            let taken = box.withLock { b -> [StoreMailboxItem]?? in
                if !b.items.isEmpty {
                    defer { b.items = [] }
                    return b.items
                }
                return b.closed ? .some(nil) : nil
            }
            if let taken { return taken }
            await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
                let now = box.withLock { b -> Bool in
                    if !b.items.isEmpty || b.closed { return true }
                    b.waiter = c
                    return false
                }
                if now { c.resume() }
            }
        }
    }

    /// No more posts are kept; the loop's wait ends.
    func close() {
        let waiter = box.withLock { b -> UnsafeContinuation<Void, Never>? in
            b.closed = true
            defer { b.waiter = nil }
            return b.waiter
        }
        waiter?.resume()
    }
}
