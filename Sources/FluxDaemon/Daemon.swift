import FluxCore
import FluxRouter
import FluxTransport
import Glibc
import Logging

/// Everything a `Daemon` needs to know at startup.
public struct DaemonConfig: Sendable {
    /// Where to listen.
    public var socketPath: String
    /// Permission bits of the socket file (default 0600: only the owner may connect).
    public var socketMode: UInt32 = 0o600
    /// `listen(2)` backlog.
    public var backlog: Int32 = 1024
    /// Limits handed to the router (and `maxFrame` to the transport's frame decoders).
    public var router = RouterConfig()
    /// How long shutdown waits for peers' queued frames to be written before it closes them anyway.
    public var shutdownGrace: Millis = 2000
    /// How long a connection closed as a slow consumer (`router.maxBacklog`) has to read its `slow-consumer`
    /// error before it is cut off.
    public var slowConsumerGrace: Millis = 1000

    public init(socketPath: String) {
        self.socketPath = socketPath
    }
}

/// Why a daemon could not start. The description is the message fluxd prints.
public enum DaemonError: Error, CustomStringConvertible {
    /// A live fluxd (or anything else) accepts connections on the socket path.
    case alreadyRunning(path: String)
    /// The socket could not be set up (path too long, not a socket, permissions, ...).
    case cannotListen(path: String, TransportError)
    /// The transport could not be set up (loop, signal handlers).
    case transport(TransportError)

    public var description: String {
        switch self {
        case .alreadyRunning(let path): return "another fluxd is listening on \(path)"
        case .cannotListen(let path, let error): return "cannot listen on \(path): \(error)"
        case .transport(let error): return "cannot start: \(error)"
        }
    }
}

/// fluxd's core wiring: owns the socket listener, the connections and one `Router`, turns transport activity
/// into `RouterEvent`s and carries out the router's `RouterEffect`s in order. Everything runs on the loop thread.
///
/// Lifecycle: `init` -> `start()` (listen, install SIGINT/SIGTERM/SIGHUP handlers) -> ... -> `shutdown()` (on
/// SIGINT/SIGTERM or the loop's stop request): stop accepting and unlink the socket, feed `.shutdown`, let peers
/// drain for at most `shutdownGrace` ms, close every handle and stop the loop, so `EventLoop.run()` returns.
///
/// Performance: this object lives on one thread and none of its methods re-enters another while that one is
/// modifying the same property, so its hot stored properties are `@exclusivity(unchecked)`: the runtime's dynamic
/// exclusivity checks were ~13% of fluxd's instructions per routed action (Benchmarks/PROFILE.md).
public final class Daemon: ListenerDelegate, ConnectionDelegate, RouterEffectSink {
    /// The configuration the daemon was started with.
    public let config: DaemonConfig
    /// Called on SIGHUP (configuration reload will hook in here). Default: a log line.
    @exclusivity(unchecked) public var onHangup: (() -> Void)?
    /// Called on SIGINT/SIGTERM instead of `shutdown()` (fluxd's graceful stop: drain, stop workers, then
    /// `shutdown()`). Default (nil): `shutdown()` at once.
    @exclusivity(unchecked) public var onTerminate: ((Int32) -> Void)?
    /// Called once the daemon has closed everything and stopped the loop.
    @exclusivity(unchecked) public var onStopped: (() -> Void)?
    /// Answers requests whose op is in `config.router.hostOps` (e.g. the worker supervisor's `workers`); reply
    /// with `send(_:to:)`. Without a handler such requests get `unknown-op`.
    @exclusivity(unchecked) public var onHostRequest: ((PeerID, Envelope) -> Void)?
    /// A monitor whose connection has more than this many bytes queued misses events (and is told how many).
    @exclusivity(unchecked) public var monitorBacklogLimit = 1 << 20
    /// Called when the router reports a stalled store (`RouterEffect.stalled`): its name, its owner's pid, and
    /// whether its connection is being closed as `unresponsive` (the plugin host then stops a supervised worker
    /// so that it restarts).
    @exclusivity(unchecked) public var onStoreStalled: ((String, Int32?, Bool) -> Void)?

    private let loop: EventLoop
    private let router: Router
    @exclusivity(unchecked) private var logger: Logger
    @exclusivity(unchecked) private var listener: PipeListener?
    @exclusivity(unchecked) private var connections: [PeerID: Connection] = [:]
    /// A direct-mapped cache in front of `connections` (slot `peer % size`): frames go out in runs to a few
    /// peers (a store and its subscribers), which then cost no hashing.
    @exclusivity(unchecked) private var connectionCache = [(peer: PeerID, connection: Connection?)](
        repeating: (0, nil), count: Daemon.connectionCacheSize)
    private static let connectionCacheSize = 64
    @exclusivity(unchecked) private var nextPeer: PeerID = 1
    /// Host requests (`RouterEffect.host`) of the event being fed, answered once the router is done with it.
    @exclusivity(unchecked) private var hostRequests: [(PeerID, Envelope)] = []
    @exclusivity(unchecked) private var signals: [SignalWatcher] = []
    @exclusivity(unchecked) private var tickTimer: LoopTimer?
    /// Feeds `.tick` every `router.sweepInterval` for the liveness sweep (heartbeats, stalled stores): a
    /// repeating timer, so that routing never has to re-arm one. Lifecycle: created in `start`, closed in
    /// `closeAll`.
    @exclusivity(unchecked) private var sweepTimer: LoopTimer?
    @exclusivity(unchecked) private var armedDeadline: Millis?
    @exclusivity(unchecked) private var graceTimer: LoopTimer?
    @exclusivity(unchecked) private var phase = Phase.created
    @exclusivity(unchecked) private var feeding = false
    /// Monitor events dropped per monitor since its last delivered one.
    @exclusivity(unchecked) private var missedEvents: [PeerID: Int] = [:]
    /// Peers found over `maxBacklog` (`.backlogged`) or over the memory budget (`.overBudget`) while carrying out
    /// effects, told once the effects are done.
    @exclusivity(unchecked) private var backlogged: [(PeerID, RouterEvent)] = []
    /// Connections whose accountable bytes changed during a feed, accounted once it is done.
    @exclusivity(unchecked) private var toAccount: [PeerID] = []
    /// The longest loop hold last told to the router.
    @exclusivity(unchecked) private var reportedHold: UInt64 = 0
    /// How far a connection's queued bytes may grow past what was accounted before `send` accounts again.
    private static let accountingSlack = 256 << 10
    /// Connections closed as slow consumers: each is cut off when its timer fires, unless it closed by then.
    /// Lifecycle: created and started in `cutOffLater`, closed when it fires, when the connection closes, or in
    /// `closeAll`.
    @exclusivity(unchecked) private var cutOffTimers: [PeerID: LoopTimer] = [:]

    private enum Phase { case created, running, shuttingDown, stopped }

    /// A daemon on `loop` (not listening yet).
    public init(loop: EventLoop, config: DaemonConfig, logger: Logger) {
        self.loop = loop
        self.config = config
        self.logger = logger
        self.router = Router(config: config.router)
    }

    /// Number of open connections.
    public var connectionCount: Int { connections.count }

    /// Listens on the socket and installs the signal handlers. On failure nothing is left open.
    public func start() throws(DaemonError) {
        precondition(phase == .created, "Daemon.start called twice")
        var options = ListenerOptions()
        options.mode = mode_t(config.socketMode)
        options.backlog = config.backlog
        options.maxFrame = config.router.maxFrame
        do {
            listener = try PipeListener.listen(loop: loop, path: config.socketPath, options: options, delegate: self)
        } catch .addressInUse(let path) {
            throw .alreadyRunning(path: path)
        } catch {
            throw .cannotListen(path: config.socketPath, error)
        }
        do {
            for signal in [SIGINT, SIGTERM, SIGHUP] {
                signals.append(try SignalWatcher(loop: loop, signal: signal) { [unowned self] signal in
                    self.received(signal: signal)
                })
            }
        } catch {
            closeAll()
            throw .transport(error)
        }
        tickTimer = LoopTimer(loop: loop) { [unowned self] in
            let start = EventLoop.clock()
            self.armedDeadline = nil
            self.feed(.tick)
            self.loop.holdEnded(since: start)
        }
        if router.sweepInterval > 0 {
            sweepTimer = LoopTimer(loop: loop) { [unowned self] in
                let start = EventLoop.clock()
                if self.router.needsSweep(now: self.loop.now) { self.feed(.tick) }
                self.loop.holdEnded(since: start)
            }
            sweepTimer?.start(after: router.sweepInterval, repeat: router.sweepInterval)
        }
        loop.beforeFlush = { [unowned self] in
            guard self.router.hasDeferredWork, self.phase != .stopped else { return }
            if self.feeding { self.loop.requestBeforeFlush() } else { self.feed(.endOfBatch) }
        }
        phase = .running
        loop.onStopRequest = { [unowned self] in self.shutdown() }
        logger.info("listening", metadata: ["path": "\(config.socketPath)",
                                            "mode": "\(String(config.socketMode, radix: 8))"])
    }

    /// Starts a graceful shutdown (idempotent; a second call while draining closes every connection at once).
    public func shutdown() {
        switch phase {
        case .created:
            phase = .stopped
            loop.stop()
            onStopped?()
        case .running:
            phase = .shuttingDown
            logger.info("shutting down", metadata: ["connections": "\(connections.count)"])
            listener?.close()
            listener = nil
            feed(.shutdown)
            // The router says goodbye and closes its peers; whatever it left open is closed after a flush too.
            for connection in connections.values { connection.close(afterFlush: true) }
            graceTimer = LoopTimer(loop: loop) { [unowned self] in
                self.logger.warning("shutdown grace period over; closing connections",
                                    metadata: ["connections": "\(self.connections.count)"])
                for connection in self.connections.values { connection.close(afterFlush: false) }
            }
            graceTimer?.start(after: config.shutdownGrace)
            finishIfDrained()
        case .shuttingDown:
            logger.notice("closing every connection now")
            for connection in connections.values { connection.close(afterFlush: false) }
        case .stopped:
            break
        }
    }

    // MARK: - Transport callbacks

    public func listener(_ listener: PipeListener, accepted connection: Connection) {
        let start = EventLoop.clock()
        defer { loop.holdEnded(since: start) }
        guard phase == .running else {
            connection.close(afterFlush: false)
            return
        }
        let id = nextPeer
        nextPeer += 1
        connection.tag = id
        connection.delegate = self
        connection.sendCheckpoint = min(config.router.maxBacklog, Daemon.accountingSlack)
        connections[id] = connection
        let credentials = connection.credentials.map {
            PeerCredentials(pid: $0.pid, uid: $0.uid, gid: $0.gid)
        } ?? PeerCredentials()
        logger.debug("peer connected", metadata: ["peer": "\(id)", "pid": "\(credentials.pid.map { "\($0)" } ?? "?")",
                                                  "uid": "\(credentials.uid.map { "\($0)" } ?? "?")"])
        feed(.connected(id, credentials))
    }

    /// Accept failures, counted by errno name (`acceptErrorCount`) and logged at most once a second
    /// (AcceptErrors.swift).
    @exclusivity(unchecked) var acceptFailures = AcceptFailureLog(interval: 1000)

    public func listener(_ listener: PipeListener, acceptFailed error: UVError) {
        let report = acceptFailures.record(error.name, now: loop.now)
        router.acceptErrors = acceptFailures.counts  // shown in info's load
        guard let report else { return }
        logger.error("accept failed", metadata: report.metadata(error))
    }

    public func connection(_ connection: Connection, received frame: DecodedFrame) {
        let id = connection.tag
        switch frame {
        case .frame(let body): feed(.frame(id, body))
        case .empty: feed(.emptyFrame(id))
        case .tooLarge(let length): feed(.oversizedFrame(id, length: length))
        }
    }

    public func connectionClosed(_ connection: Connection, reason: CloseReason) {
        let start = EventLoop.clock()
        defer { loop.holdEnded(since: start) }
        let id = connection.tag
        guard connections.removeValue(forKey: id) != nil else { return }
        let slot = Int(truncatingIfNeeded: id % PeerID(Daemon.connectionCacheSize))
        if connectionCache[slot].peer == id { connectionCache[slot] = (0, nil) }
        logger.debug("peer closed", metadata: ["peer": "\(id)", "reason": "\(reason)"])
        missedEvents.removeValue(forKey: id)
        cutOffTimers.removeValue(forKey: id)?.close()
        feed(.closed(id))
        if phase == .shuttingDown { finishIfDrained() }
    }

    // MARK: - Router

    /// Feeds one event to the router, which has the daemon carry out its effects as it produces them (in order;
    /// see the `RouterEffectSink` methods below), then re-arms the deadline timer.
    private func feed(_ event: RouterEvent) {
        precondition(!feeding, "router re-entered")
        if loop.longestHold != reportedHold {
            reportedHold = loop.longestHold
            router.longestLoopHold = loop.longestHoldNanoseconds / 1000
        }
        feeding = true
        router.handle(event, now: loop.now, sink: self)
        feeding = false
        if !toAccount.isEmpty {
            let peers = toAccount
            toAccount.removeAll()
            for peer in peers { if let c = connections[peer] { account(peer, c) } }
        }
        if !hostRequests.isEmpty {
            // After the router is done with the event: a handler may feed the router (e.g. to drain it).
            let requests = hostRequests
            hostRequests.removeAll()
            for (peer, request) in requests { answerHostRequest(request, from: peer) }
        }
        closeBacklogged()
        armDeadlineTimer()
    }

    /// Tells the router about the peers found over `maxBacklog` (it closes them with `slow-consumer`) or over the
    /// memory budget (`memory-budget`).
    private func closeBacklogged() {
        guard !backlogged.isEmpty else { return }
        let peers = backlogged
        backlogged = []
        for (peer, event) in peers {
            feed(event)
            cutOffLater(peer)
        }
    }

    public func connectionAccountingChanged(_ connection: Connection) {
        let peer = connection.tag
        if feeding {
            toAccount.append(peer)
        } else {
            account(peer, connection)
            if !backlogged.isEmpty { closeBacklogged() }
        }
    }

    /// Charges (or returns) the change in a connection's accountable bytes to its memory account; a growth the
    /// budget refuses closes it with `memory-budget` once this feed is done.
    private func account(_ peer: PeerID, _ connection: Connection) {
        guard !connection.isClosing, cutOffTimers[peer] == nil else { return }
        let bytes = connection.accountableBytes
        if bytes != connection.accounted {
            guard router.accountTransport(peer, bytes: bytes) else {
                overBudget(peer, connection, bytes: bytes)
                return
            }
            connection.accounted = bytes
        }
        connection.sendCheckpoint = min(config.router.maxBacklog,
                                        max(connection.queuedBytes, bytes) + Daemon.accountingSlack)
    }

    /// Sends a frame to a peer: the router's `.send` effect, and host-operation replies. Queued on the peer's
    /// connection and written at the end of this loop iteration (or part-way through a long batch; see
    /// `Connection`); a peer over `maxBacklog` is closed as a slow consumer.
    public func send(_ frame: Frame, to peer: PeerID) {
        if let connection = connection(peer) {
            connection.send(frame)
            if connection.queuedBytes > connection.sendCheckpoint {  // (at most maxBacklog)
                if connection.queuedBytes > config.router.maxBacklog {
                    overBacklog(peer, connection)
                } else if feeding {
                    toAccount.append(peer)
                } else {
                    account(peer, connection)
                }
                if !feeding { closeBacklogged() }  // a host reply, sent outside the router's event
            }
        }
    }

    /// The router's other effects.
    public func perform(_ effect: RouterEffect) {
        switch effect {
        case .send(let peer, let frame):
            send(frame, to: peer)
        case .monitor(let peer, let frame):
            deliverMonitorEvent(frame, to: peer)
        case .host(let peer, let request):
            hostRequests.append((peer, request))
        case .close(let peer):
            missedEvents.removeValue(forKey: peer)
            connections[peer]?.close(afterFlush: true)
        case .log(let level, let message):
            logger.log(level: level.swiftLogLevel, "\(message)")
        case .stalled(let store, let pid, let closing):
            onStoreStalled?(store, pid, closing)
        case .deferred:
            loop.requestBeforeFlush()
        }
    }

    private func answerHostRequest(_ request: Envelope, from peer: PeerID) {
        if let onHostRequest {
            onHostRequest(peer, request)
        } else {
            var b = FrameBuilder(op: "error")
            b.constant("code", "unknown-op")
            b.string("message", "unknown op \"\(request.string("op").value ?? "")\"")
            b.bool("fatal", false)
            connections[peer]?.send(b.finish())
        }
    }

    /// The open connection of `peer` (through `connectionCache`).
    @inline(__always)
    private func connection(_ peer: PeerID) -> Connection? {
        let slot = Int(truncatingIfNeeded: peer % PeerID(Daemon.connectionCacheSize))
        if connectionCache[slot].peer == peer, let c = connectionCache[slot].connection { return c }
        guard let c = connections[peer] else { return nil }
        connectionCache[slot] = (peer, c)
        return c
    }

    /// A peer does not read fast enough: drop what is queued and unwritten (it is about to be closed with
    /// `slow-consumer`, which then follows the write in flight) and tell the router once this feed is done.
    private func overBacklog(_ peer: PeerID, _ connection: Connection) {
        guard !backlogged.contains(where: { $0.0 == peer }), cutOffTimers[peer] == nil else { return }
        logger.warning("slow consumer", metadata: ["peer": "\(peer)", "queued": "\(connection.queuedBytes)"])
        connection.discardQueued()
        backlogged.append((peer, .backlogged(peer)))
    }

    /// A connection's unfinished frame and unwritten frames outgrew the memory budget: drop what is queued and
    /// unwritten and have the router close it with `memory-budget` once this feed is done.
    private func overBudget(_ peer: PeerID, _ connection: Connection, bytes: Int) {
        guard !backlogged.contains(where: { $0.0 == peer }), cutOffTimers[peer] == nil else { return }
        logger.warning("memory budget exceeded; closing connection",
                       metadata: ["peer": "\(peer)", "bytes": "\(bytes)", "budgetUsed": "\(router.memory.used)"])
        connection.discardQueued()
        if router.accountTransport(peer, bytes: connection.accountableBytes) {  // what is left
            connection.accounted = connection.accountableBytes
        }
        backlogged.append((peer, .overBudget(peer)))
    }

    /// Closes a slow consumer's connection without waiting for its writes if it has not read them within
    /// `slowConsumerGrace`.
    private func cutOffLater(_ peer: PeerID) {
        guard connections[peer] != nil, cutOffTimers[peer] == nil else { return }
        let timer = LoopTimer(loop: loop) { [unowned self] in
            self.cutOffTimers.removeValue(forKey: peer)?.close()
            self.connections[peer]?.close(afterFlush: false)
        }
        cutOffTimers[peer] = timer
        timer.start(after: config.slowConsumerGrace)
    }

    /// A monitor must never slow routing: while its connection is backlogged, events for it are dropped and
    /// counted; the next one delivered is preceded by `{"op":"missed","count":N}`.
    private func deliverMonitorEvent(_ frame: Frame, to peer: PeerID) {
        guard let connection = connections[peer] else { return }
        if connection.queuedBytes > monitorBacklogLimit {
            missedEvents[peer, default: 0] += 1
            return
        }
        if let missed = missedEvents.removeValue(forKey: peer) {
            var b = FrameBuilder(op: "missed")
            b.int("count", missed)
            connection.send(b.finish())
        }
        connection.send(frame)
    }

    /// What the router knows of a store (e.g. whether a supervised worker has registered it yet).
    public func storeStatus(_ name: String) -> StoreStatusInfo { router.storeStatus(name) }

    /// Stops accepting dispatches while actions in flight settle; see `pendingActionCount`.
    public func drain() { feed(.drain) }

    /// Accepted actions not yet settled.
    public var pendingActionCount: Int { router.pendingActionCount }

    private func armDeadlineTimer() {
        // The common case, once peers have said hello and no store is down: nothing to arm, nothing armed.
        if armedDeadline == nil && !router.hasDeadlines { return }
        guard let tickTimer, phase != .stopped else { return }
        let deadline = router.nextDeadline
        guard deadline != armedDeadline else { return }
        armedDeadline = deadline
        if let deadline {
            let now = loop.now
            tickTimer.start(after: deadline > now ? deadline - now : 0)
        } else {
            tickTimer.stop()
        }
    }

    // MARK: - Signals and shutdown

    private func received(signal: Int32) {
        switch signal {
        case SIGHUP:
            if let onHangup {
                onHangup()
            } else {
                logger.notice("SIGHUP received (configuration reload is not implemented yet)")
            }
        default:
            logger.info("signal received", metadata: ["signal": "\(signal == SIGINT ? "SIGINT" : "SIGTERM")"])
            if let onTerminate { onTerminate(signal) } else { shutdown() }
        }
    }

    private func finishIfDrained() {
        guard phase == .shuttingDown, connections.isEmpty else { return }
        if !router.isIdle { logger.warning("router not idle after every peer closed") }
        phase = .stopped
        closeAll()
        logger.info("stopped")
        loop.stop()
        onStopped?()
    }

    private func closeAll() {
        listener?.close()
        listener = nil
        for signal in signals { signal.close() }
        signals = []
        tickTimer?.close()
        tickTimer = nil
        sweepTimer?.close()
        sweepTimer = nil
        loop.beforeFlush = nil
        graceTimer?.close()
        graceTimer = nil
        for timer in cutOffTimers.values { timer.close() }
        cutOffTimers = [:]
        loop.onStopRequest = nil
    }
}

extension LogLevel {
    /// The swift-log level of a router log effect.
    var swiftLogLevel: Logger.Level {
        switch self {
        case .debug: return .debug
        case .info: return .info
        case .notice: return .notice
        case .warning: return .warning
        case .error: return .error
        }
    }
}

/// Runs a whole daemon on the calling thread: prepares process signals, creates the loop, starts the daemon,
/// calls `ready` with the socket path once it listens, and returns after a clean shutdown (SIGINT/SIGTERM).
/// Throws when the daemon cannot start (nothing is left open).
public func runDaemon(config: DaemonConfig, logger: Logger, ready: (String) -> Void) throws(DaemonError) {
    ProcessSetup.prepareSignals()
    let loop = try makeDaemonLoop(logger: logger)
    let daemon = Daemon(loop: loop, config: config, logger: logger)
    try startDaemon(daemon, on: loop)
    ready(config.socketPath)
    withExtendedLifetime(daemon) { loop.run() }
}

/// A new event loop for a daemon; a transport failure becomes `DaemonError.transport`.
func makeDaemonLoop(logger: Logger) throws(DaemonError) -> EventLoop {
    do {
        return try EventLoop(logger: logger)
    } catch {
        throw .transport(error)
    }
}

/// Starts `daemon`; when it cannot start, lets `loop` run the close callbacks of whatever was opened, then close
/// it, and rethrows.
func startDaemon(_ daemon: Daemon, on loop: EventLoop) throws(DaemonError) {
    do {
        try daemon.start()
    } catch {
        loop.stop()
        loop.run()
        throw error
    }
}
