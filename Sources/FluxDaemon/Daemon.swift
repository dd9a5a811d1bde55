import FluxCore
import FluxJournal
import FluxRouter
import FluxTransport
import Glibc
import Logging

/// Everything a `Daemon` needs to know at startup.
public struct DaemonConfig: Sendable {
    /// Where to listen.
    public var socketPath: String
    /// A socket that is already listening on `socketPath`, passed by the service manager (socket activation,
    /// `SocketActivation.take()`): served instead of binding one, and never unlinked (nil: fluxd binds its own).
    /// `socketMode` does not apply to it (the creator chose the mode).
    public var listenDescriptor: Int32?
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
    /// Where Prometheus metrics are served (`fluxd --metrics`, docs/metrics.md); nil: none are kept.
    public var metricsAddress: MetricsAddress?
    /// How long one connection's turn of reading may take before the loop serves the others
    /// (`EventLoop.turnNanoseconds`, docs/limits.md), in microseconds.
    public var turnMicros: UInt64 = 250

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
    /// The metrics endpoint could not listen.
    case metrics(MetricsAddressError)

    public var description: String {
        switch self {
        case .alreadyRunning(let path): return "another fluxd is listening on \(path)"
        case .cannotListen(let path, let error): return "cannot listen on \(path): \(error)"
        case .transport(let error): return "cannot start: \(error)"
        case .metrics(let error): return "--metrics: \(error)"
        }
    }
}

/// fluxd's libuv adapter of the daemon core: owns the socket listener, the connections, the signals and the
/// timers; turns their activity into `RouterEvent`s for its `DaemonCore`, and carries out the core's writes and
/// closes (`DaemonTransport`). The semantics, slow-consumer and memory policies included, are the core's.
/// Everything runs on the loop thread.
///
/// Lifecycle: `init` -> `start()` (listen, or serve the socket `config.listenDescriptor` passed, install SIGINT/SIGTERM/SIGHUP handlers) -> ... -> `shutdown()` (on
/// SIGINT/SIGTERM or the loop's stop request): stop accepting and unlink the socket, feed `.shutdown`, let peers
/// drain for at most `shutdownGrace` ms, close every handle and stop the loop, so `EventLoop.run()` returns. A socket
/// passed by the service manager is closed but not unlinked: it stays with systemd, which queues connections on it
/// until the next fluxd serves it.
///
/// Performance: this object lives on one thread and none of its methods re-enters another while that one is
/// modifying the same property, so its hot stored properties are `@exclusivity(unchecked)`: the runtime's dynamic
/// exclusivity checks were a measurable share of the hot path (figures: Benchmarks/PROFILE.md).
public final class Daemon: ListenerDelegate, ConnectionDelegate, DaemonTransport {
    /// The configuration the daemon was started with.
    public let config: DaemonConfig
    /// Called on SIGHUP (configuration reload will hook in here). Default: a log line.
    @exclusivity(unchecked) public var onHangup: (() -> Void)?
    /// Called on SIGINT/SIGTERM instead of `shutdown()` (fluxd's graceful stop: drain, stop workers, then
    /// `shutdown()`). Default (nil): `shutdown()` at once.
    @exclusivity(unchecked) public var onTerminate: ((Int32) -> Void)?
    /// Called once the daemon has closed everything and stopped the loop.
    @exclusivity(unchecked) public var onStopped: (() -> Void)?
    /// The daemon core: the router and the policies around it. Register host operations and observe stores here.
    @exclusivity(unchecked) public private(set) var core: DaemonCore!
    /// `core`, unretained, for the call per event (`feed`): through the `var` it was retained and released each
    /// time (issue 27). Both are set once, in `init`; `core` keeps it alive.
    @exclusivity(unchecked) private var coreRef: Unmanaged<DaemonCore>!
    let loop: EventLoop
    /// Work done off the loop (the router's preparations) and the metrics endpoint's refresh requests, taken at the
    /// loop's wake-up.
    private let wakes: WakeReasons
    private var router: Router { core.router }
    @exclusivity(unchecked) var logger: Logger
    @exclusivity(unchecked) private var listener: PipeListener?
    @exclusivity(unchecked) private var connections: [PeerID: Connection] = [:]
    /// A direct-mapped cache in front of `connections` (slot `peer % size`): frames go out in runs to a few
    /// peers (a store and its subscribers), which then cost no hashing. Unretained (`connections` owns them; an
    /// entry is cleared where its connection leaves `connections`, `connectionClosed`): a write through it costs
    /// no retain and release per frame (issue 27).
    @exclusivity(unchecked) private var connectionCache = [(peer: PeerID, connection: Unmanaged<Connection>?)](
        repeating: (0, nil), count: Daemon.connectionCacheSize)
    private static let connectionCacheSize = 64
    @exclusivity(unchecked) private var nextPeer: PeerID = 1
    @exclusivity(unchecked) private var signals: [SignalWatcher] = []
    @exclusivity(unchecked) private var tickTimer: LoopTimer?
    /// Feeds `.tick` every `router.sweepInterval` for the liveness sweep (heartbeats, stalled stores): a
    /// repeating timer, so that routing never has to re-arm one. Lifecycle: created in `start`, closed in
    /// `closeAll`.
    @exclusivity(unchecked) private var sweepTimer: LoopTimer?
    @exclusivity(unchecked) private var armedDeadline: Millis?
    @exclusivity(unchecked) private var graceTimer: LoopTimer?
    @exclusivity(unchecked) private var phase = Phase.created
    /// The longest loop hold last told to the router.
    @exclusivity(unchecked) private var reportedHold: UInt64 = 0
    /// Connections being closed with a deadline (slow consumers, over budget): each is cut off when its timer
    /// fires, unless it closed by then. Lifecycle: created and started in `close(_:cutOffAfter:)`, closed when it
    /// fires, when the connection closes, or in `closeAll`.
    @exclusivity(unchecked) private var cutOffTimers: [PeerID: LoopTimer] = [:]

    private enum Phase { case created, running, shuttingDown, stopped }

    /// A daemon on `loop` (not listening yet); with a journal, durable (SPEC §15): the router takes over what the
    /// journal recovered, and every record it stages is written before the frames that reveal it.
    public init(loop: EventLoop, config: DaemonConfig, logger: Logger, journal: Journal? = nil) {
        self.loop = loop
        self.wakes = WakeReasons(remote: loop.remote)
        self.config = config
        self.logger = logger
        self.journal = journal
        self.journaled = journal != nil
        var coreConfig = DaemonCoreConfig(router: config.router)
        coreConfig.slowConsumerGrace = config.slowConsumerGrace
        if config.metricsAddress != nil {
            let metrics = FluxMetrics()
            self.metrics = metrics
            coreConfig.router.metricsClock = FluxMetrics.clock
            journal?.syncObserver = metrics.journalSyncObserver
        }
        core = DaemonCore(config: coreConfig, transport: self, journal: journal)
        coreRef = Unmanaged.passUnretained(core)
        core.onLog = { [unowned self] level, message in self.logger.log(level: level.swiftLogLevel, "\(message)") }
        if let journal {
            logger.info("journal: keeping at most \(journal.retainBytes) bytes of history (--retain-bytes), \(journal.diskPerUser) per user (--disk-per-user)")
            // The durability policy lives in the core (DaemonCore+Durability.swift): this adapter commits from
            // its flush hook and runs the journal's timer.
            core.attachJournal(recovered: journal.recovered, chargedTo: geteuid(), now: loop.now)
            journal.recovered = JournalState()  // the router holds what it needs; the segments' bytes can go
            let router = core.router
            journal.checkpointCapture = { [unowned journal] in router.checkpointCapture(clean: journal.isClosing) }
            let operations = JournalOperations(journal: journal, lastSeq: { router.lastAcceptedSeq },
                                               holdPath: getenv("FLUXD_TEST_HOLD_READS").map { String(cString: $0) })
            for op in [Op.history, .stateAt] {
                // Read on the reader thread (a history page from the oldest seq of a large journal held the loop
                // a second); answered in order per peer, at most `maxDeferredPerPeer`/`Total` outstanding.
                core.handleHostOperation(op) { [unowned self] peer, request in
                    self.core.answerLater(peer, request) { ticket in
                        let read = operations.prepare(request)
                        self.offLoop(read) { [unowned self] answer in self.complete(ticket, with: answer) }
                    }
                }
            }
        }
    }

    /// The journal (nil: ephemeral).
    public let journal: Journal?
    /// What the loop does with the result of each `offLoop` job, by its number (loop thread only). Lifecycle: an
    /// entry is added by `offLoop` and removed when its result is taken (`woken`), or in `closeAll` (the job's
    /// result, if it still comes, is never taken).
    @exclusivity(unchecked) private var offLoopResults: [UInt64: (any Sendable) -> Void] = [:]
    @exclusivity(unchecked) private var nextOffLoopJob: UInt64 = 1

    /// Runs `work` on the reader thread (journal reads, config files: work that may take long, one job at a time,
    /// in order, at a lower priority) and then `then` with its result on the loop thread. Loop thread only. Not
    /// called once the daemon closed (nothing waits for it then).
    public func offLoop<T: Sendable>(_ work: @escaping @Sendable () -> T, then: @escaping (T) -> Void) {
        let number = nextOffLoopJob
        nextOffLoopJob += 1
        offLoopResults[number] = { result in then(result as! T) }
        wakes.read(number) { work() }
    }

    /// Gives the answer of a host request the core took with `answerLater` (loop thread, from an `offLoop`
    /// result): sent in its turn, counted and monitored like every answer.
    public func complete(_ ticket: HostTicket, with answer: HostAnswer) {
        if loop.longestHold != reportedHold {
            reportedHold = loop.longestHold
            router.longestLoopHold = loop.longestHoldNanoseconds / 1000
            router.longestLoopHoldAt = loop.longestHoldSite
        }
        core.complete(ticket, with: answer, now: loop.now)
        if journaled { loop.requestBeforeFlush() }
        armDeadlineTimer()
    }
    /// The metrics (with `config.metricsAddress`) and their endpoint, whose scrapes wake the loop to refresh them
    /// (`loop.onWake`). Lifecycle: the server is made in `start()` and stopped in `closeAll()`.
    public private(set) var metrics: FluxMetrics?
    @exclusivity(unchecked) private var metricsServer: MetricsServer?
    /// Restarts per supervised worker, for the metrics (set by the plugin host).
    public var workerRestarts: (() -> [String: Int])?
    /// Whether there is one (a flag for the hot path).
    let journaled: Bool
    /// Syncs in `batch` mode and retries a full disk (`DaemonCore.journalTimer`).
    @exclusivity(unchecked) var journalTimer: LoopTimer?

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
            if let descriptor = config.listenDescriptor {
                listener = try PipeListener.adopting(listeningDescriptor: descriptor, path: config.socketPath, loop: loop,
                                                     options: options, delegate: self)
            } else {
                listener = try PipeListener.listen(loop: loop, path: config.socketPath, options: options, delegate: self)
            }
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
        // (Unmanaged references used at +0: the hook runs at every iteration of a durable fluxd, and `stop` clears
        // it before the daemon, its core or its loop can go; captured unowned, each use cost a retain and a
        // release, ~250 instructions per round trip one in flight.)
        let daemonRef = Unmanaged.passUnretained(self), coreRef = Unmanaged.passUnretained(core!)
        let loopRef = Unmanaged.passUnretained(loop)
        loop.beforeFlush = {
            coreRef._withUnsafeGuaranteedRef { core in
                if core.router.hasDeferredWork { daemonRef._withUnsafeGuaranteedRef { $0.endBatchBeforeFlush() } }
                return core.commitJournal(now: loopRef._withUnsafeGuaranteedRef { $0.now })
            }
        }
        if let journal {
            let interval = journal.options.durability == .batch ? max(1, journal.options.syncInterval) : 100
            journalTimer = LoopTimer(loop: loop) { [unowned self] in
                if self.core.journalTimer(now: self.loop.now) { self.loop.requestBeforeFlush() }
            }
            journalTimer?.start(after: interval, repeat: interval)
        }
        if let metrics, let address = config.metricsAddress {
            do {
                let wakes = self.wakes
                metricsServer = try MetricsServer(address: address) { [metrics] in
                    metrics.refreshAndWait { wakes.requestMetrics() }
                    return metrics.exposition()
                }
            } catch {
                closeAll()
                throw .metrics(error)
            }
            refreshMetrics()
            metricsServer?.start()
            logger.info("metrics on http://\(metricsServer!.address)/metrics")
        }
        loop.onWake = { [unowned self] in self.woken() }
        let wakes = self.wakes
        loop.releaseElsewhere = { wakes.release($0) }
        phase = .running
        loop.onStopRequest = { [unowned self] in self.shutdown() }
        if config.listenDescriptor != nil {
            logger.info("listening on the socket the service manager passed", metadata: ["path": "\(config.socketPath)"])
        } else {
            logger.info("listening", metadata: ["path": "\(config.socketPath)",
                                                "mode": "\(String(config.socketMode, radix: 8))"])
        }
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
        cutOffTimers.removeValue(forKey: id)?.close()
        feed(.closed(id))
        if phase == .shuttingDown { finishIfDrained() }
    }

    // MARK: - The core

    /// Feeds one event to the core, then re-arms the deadline timer.
    private func feed(_ event: RouterEvent) {
        if loop.longestHold != reportedHold {
            reportedHold = loop.longestHold
            router.longestLoopHold = loop.longestHoldNanoseconds / 1000
            router.longestLoopHoldAt = loop.longestHoldSite
        }
        coreRef._withUnsafeGuaranteedRef { $0.handle(event, now: loop.now) }
        if journaled { loop.requestBeforeFlush() }
        armDeadlineTimer()
    }

    public func connectionAccountingChanged(_ connection: Connection) {
        core.transportBytesChanged(connection.tag, now: loop.now)
        armDeadlineTimer()
    }

    // MARK: - DaemonTransport

    public func write(_ frame: Frame, to peer: PeerID) -> Int {
        let slot = Int(truncatingIfNeeded: peer % PeerID(Daemon.connectionCacheSize))
        if connectionCache[slot].peer == peer, let cached = connectionCache[slot].connection {
            return cached._withUnsafeGuaranteedRef { connection in
                connection.send(frame)
                return connection.queuedBytes
            }
        }
        guard let connection = connections[peer] else { return 0 }
        connectionCache[slot] = (peer, Unmanaged.passUnretained(connection))
        connection.send(frame)
        return connection.queuedBytes
    }

    public func queuedBytes(of peer: PeerID) -> Int { connections[peer]?.queuedBytes ?? 0 }

    public func accountableBytes(of peer: PeerID) -> Int { connections[peer]?.accountableBytes ?? 0 }

    public func discardQueued(of peer: PeerID) { connections[peer]?.discardQueued() }

    public func charged(_ bytes: Int, for peer: PeerID) { connections[peer]?.accounted = bytes }

    public func close(_ peer: PeerID, cutOffAfter: Millis?) {
        guard let connection = connections[peer] else { return }
        connection.close(afterFlush: true)
        guard let cutOffAfter, cutOffTimers[peer] == nil else { return }
        let timer = LoopTimer(loop: loop) { [unowned self] in
            self.cutOffTimers.removeValue(forKey: peer)?.close()
            self.connections[peer]?.close(afterFlush: false)
        }
        cutOffTimers[peer] = timer
        timer.start(after: cutOffAfter)
    }

    public func requestEndOfBatch() { loop.requestBeforeFlush() }

    /// The router has work deferred to the end of the batch (`beforeFlush`): fed now, or asked for again if the
    /// core is in the middle of an event.
    func endBatchBeforeFlush() {
        guard phase != .stopped else { return }
        if core.isHandling { loop.requestBeforeFlush() } else { feed(.endOfBatch) }
    }

    public func startPreparation(_ preparation: Preparation, for peer: PeerID) -> Bool {
        wakes.start(preparation, for: peer)
        return true
    }

    public func discard(_ garbage: Garbage) { wakes.discard(garbage) }


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
                logger.notice("SIGHUP received; nothing to reload (no plugin host)")
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

    /// Copies the router's gauges and counters into the metrics (loop thread).
    /// The loop's wake-up: preparations done off the loop are fed to the core, the metrics refreshed if the
    /// endpoint asked.
    private func woken() {
        let taken = wakes.take()
        for (peer, result) in taken.prepared { feed(.prepared(peer, result)) }
        for (number, result) in taken.finished { offLoopResults.removeValue(forKey: number)?(result) }
        if taken.metricsWanted { refreshMetrics() }
    }

    private func refreshMetrics() {
        metrics?.refresh(router.metricsSample(), journal: journal, workerRestarts: workerRestarts?() ?? [:])
    }

    /// The metrics endpoint's address once it listens (with the port chosen for port 0).
    public var metricsEndpoint: MetricsAddress? { metricsServer?.address }

    private func closeAll() {
        listener?.close()
        listener = nil
        loop.onWake = nil
        loop.releaseElsewhere = nil
        wakes.stop()
        offLoopResults = [:]
        metricsServer?.stop()
        metricsServer = nil
        for signal in signals { signal.close() }
        signals = []
        tickTimer?.close()
        tickTimer = nil
        sweepTimer?.close()
        sweepTimer = nil
        loop.beforeFlush = nil
        graceTimer?.close()
        graceTimer = nil
        journalTimer?.close()
        journalTimer = nil
        if let journal {
            journal.close(now: loop.now)
            logger.info("journal: synced and closed")
        }
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
        case .critical: return .critical
        }
    }
}

/// A new event loop for a daemon, with its turns as `config` says; a transport failure becomes
/// `DaemonError.transport`.
func makeDaemonLoop(config: DaemonConfig, logger: Logger) throws(DaemonError) -> EventLoop {
    let loop: EventLoop
    do {
        loop = try EventLoop(logger: logger)
    } catch {
        throw .transport(error)
    }
    let (nanos, overflow) = config.turnMicros.multipliedReportingOverflow(by: 1000)
    loop.turnNanoseconds = overflow ? .max : nanos
    return loop
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
