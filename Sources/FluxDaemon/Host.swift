import FluxCore
import FluxJournal
import FluxRouter
import FluxTransport
import Glibc
import Logging

/// fluxd as a plugin host: one daemon, optionally a `Supervisor` of the workers a config file lists, and the
/// graceful stop both share. Loop thread only.
///
/// SIGTERM/SIGINT: the router drains (new dispatches get `shutting-down`, answers keep flowing) until no accepted
/// action is unsettled or `drainTimeout` passed, then the workers are stopped in reverse dependency order, then
/// the daemon shuts down (socket unlinked, peers closed). A second SIGTERM/SIGINT cuts this short: workers get
/// SIGKILL and the daemon closes at once. SIGHUP reloads the config file.
public final class PluginHost {
    private let loop: EventLoop
    private let daemon: Daemon
    private let supervisor: Supervisor?
    private let drainTimeout: Millis
    private var logger: Logger
    private var drainTimer: LoopTimer?
    private var drainStarted: Millis = 0
    private var terminating = false

    /// Wires `daemon` (not started yet) and, with a supervisor config, the supervisor.
    public init(loop: EventLoop, daemon: Daemon, supervisorConfig: SupervisorConfig?, executableDirectory: String?,
                logger: Logger) {
        self.loop = loop
        self.daemon = daemon
        self.logger = logger
        // A durable fluxd does not drain: what is not final stays in the journal and continues after the restart.
        drainTimeout = daemon.journal != nil ? 0 : supervisorConfig?.drainTimeout ?? 5_000
        if let supervisorConfig {
            supervisor = Supervisor(loop: loop, daemon: daemon, config: supervisorConfig,
                                    socketPath: daemon.config.socketPath, executableDirectory: executableDirectory,
                                    logger: logger)
        } else {
            supervisor = nil
        }
        daemon.onTerminate = { [unowned self] _ in self.terminate() }
        if let supervisor {
            daemon.core.onStoreStalled = { [unowned supervisor] store, pid, closing in
                if closing, let pid { supervisor.killStalled(pid: pid, store: store) }
            }
            daemon.core.onStoreChange = { [unowned supervisor] change in supervisor.storeChanged(change) }
            for op in Supervisor.hostOps {
                daemon.core.handleHostOperation(op) { [unowned supervisor] _, request in supervisor.answer(request) }
            }
            daemon.onHangup = { [unowned self, unowned supervisor] in
                self.logger.notice("SIGHUP: reloading the config", metadata: ["file": "\(supervisor.config.path)"])
                supervisor.reload()
            }
        }
    }

    /// Starts the workers (call after the daemon listens).
    public func start() {
        supervisor?.start()
    }

    /// The graceful stop (first call), or the hurried one (second call).
    public func terminate() {
        if terminating {
            logger.notice("second stop request: killing workers and closing now")
            drainTimer?.close()
            drainTimer = nil
            supervisor?.killAll()
            daemon.shutdown()
            daemon.shutdown()
            return
        }
        terminating = true
        daemon.drain()
        drainStarted = loop.now
        logger.info("draining: refusing new dispatches until in-flight actions settle",
                    metadata: ["pending": "\(daemon.pendingActionCount)", "timeout_ms": "\(drainTimeout)"])
        drainTimer = LoopTimer(loop: loop) { [unowned self] in self.checkDrained() }
        drainTimer?.start(after: 0, repeat: 20)
    }

    private func checkDrained() {
        let pending = daemon.pendingActionCount
        let waited = loop.now - drainStarted
        guard pending == 0 || waited >= drainTimeout else { return }
        if pending > 0 {
            logger.warning("drain timeout over; actions still unsettled", metadata: ["pending": "\(pending)"])
        }
        drainTimer?.close()
        drainTimer = nil
        if let supervisor {
            supervisor.stopAll { [unowned self] in self.daemon.shutdown() }
        } else {
            daemon.shutdown()
        }
    }
}

/// Runs fluxd on the calling thread: prepares process signals, creates the loop, starts the daemon (and, given a
/// config, the workers after `ready` was called), returns after the graceful stop. Throws when the daemon cannot
/// start (nothing is left open, no worker was started).
public func runPluginHost(config: DaemonConfig, supervisorConfig: SupervisorConfig?, executableDirectory: String?,
                          journal: Journal? = nil, logger: Logger, ready: (String) -> Void) throws(DaemonError) {
    ProcessSetup.prepareSignals()
    ChildProcess.prepareSignals()
    let loop = try makeDaemonLoop(logger: logger)
    let daemon = Daemon(loop: loop, config: config, logger: logger, journal: journal)
    let host = PluginHost(loop: loop, daemon: daemon, supervisorConfig: supervisorConfig,
                          executableDirectory: executableDirectory, logger: logger)
    try startDaemon(daemon, on: loop)
    ready(config.socketPath)
    host.start()
    withExtendedLifetime((daemon, host)) { loop.run() }
}
