import FluxCore
import FluxJournal
import FluxLog
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
///
/// Under a service manager (`notifier`, systemd's `NOTIFY_SOCKET`): `READY=1` once the daemon serves
/// (`runPluginHost`), `STOPPING=1` at the first stop request, `RELOADING=1` then `READY=1` around a reload, and a
/// `STATUS=` line for each of these states (listening, draining, stopping workers, reload failed).
public final class PluginHost {
    private let loop: EventLoop
    private let daemon: Daemon
    private let supervisor: Supervisor?
    private var drainTimeout: Millis
    /// What a reload needs: the config file's `[fluxd]` settings fluxd runs with, the keys the command line set
    /// (they win over the file), the shared log settings, and where bare worker commands are looked up.
    private var runningSettings: [String: String]
    private let commandLine: Set<String>
    private let logSettings: LogSettings?
    private let executableDirectory: String?
    private var logger: Logger
    private var drainTimer: LoopTimer?
    private var drainStarted: Millis = 0
    private var terminating = false
    private let notifier: ServiceNotifier
    private var notifyFailureLogged = false

    /// Wires `daemon` (not started yet) and, with a supervisor config, the supervisor; tells `notifier` (default:
    /// nobody) about readiness, reloads and stops.
    public init(loop: EventLoop, daemon: Daemon, supervisorConfig: SupervisorConfig?, executableDirectory: String?,
                logger: Logger, notifier: ServiceNotifier = ServiceNotifier(address: nil),
                commandLine: Set<String> = [], logSettings: LogSettings? = nil) {
        self.loop = loop
        self.daemon = daemon
        self.logger = logger
        self.notifier = notifier
        self.runningSettings = supervisorConfig?.settings ?? [:]
        self.commandLine = commandLine
        self.logSettings = logSettings
        self.executableDirectory = executableDirectory
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
            daemon.workerRestarts = { [unowned supervisor] in
                var restarts: [String: Int] = [:]
                for name in supervisor.workerNames { restarts[name] = supervisor.status(of: name)?.restarts ?? 0 }
                return restarts
            }
            for op in Supervisor.hostOps {
                daemon.core.handleHostOperation(op) { [unowned supervisor] _, request in supervisor.answer(request) }
            }
            daemon.onHangup = { [unowned self, unowned supervisor] in
                self.logger.notice("SIGHUP: reloading the config", metadata: ["file": "\(supervisor.config.path)"])
                // One SIGHUP reload waiting is enough: it reads the file as it is when its turn comes.
                guard !self.hangupReloadWaiting else { return }
                self.hangupReloadWaiting = true
                // While stopping, the service manager has heard STOPPING=1: no READY=1 after it.
                let notify = !self.terminating
                if notify { self.sent(self.notifier.reloading(status: "reloading \(supervisor.config.path)")) }
                self.reload(started: { [unowned self] in self.hangupReloadWaiting = false }) { [unowned self] result in
                    guard notify, !self.terminating else { return }
                    let listening = "listening on \(self.daemon.config.socketPath)"
                    switch result {
                    case .success:
                        self.sent(self.notifier.ready(status: "\(listening); config reloaded"))
                    case .failure:
                        self.sent(self.notifier.ready(status: "\(listening); config reload failed, the running configuration is kept"))
                    }
                }
            }
        } else {
            daemon.onHangup = { [unowned self] in
                self.logger.warning("SIGHUP: fluxd was started without --config: there is no file to reload")
            }
        }
        daemon.core.handleHostOperation(.reload) { [unowned self] peer, request in
            guard case .reload(let id) = request else { return .error(.unknownOp, "not a reload") }
            guard self.supervisor != nil else { return Self.reloadAnswer(self.reload(), id: id) }
            // The file is read and parsed on the reader thread, applied on the loop thread, in its turn.
            return self.daemon.core.answerLater(peer, request) { ticket in
                self.reload { [unowned self] result in self.daemon.complete(ticket, with: Self.reloadAnswer(result, id: id)) }
            }
        }
    }

    private static func reloadAnswer(_ result: Result<ReloadOutcome, ReloadRefusal>, id: String) -> HostAnswer {
        switch result {
        case .failure(let refusal):
            return .error(.reloadRefused, refusal.message)
        case .success(let outcome):
            var b = FrameBuilder(op: "reloaded")
            b.string("id", id)
            var workers = JSONBuilder()
            workers.object { w in
                w.field("added", strings: outcome.added)
                w.field("removed", strings: outcome.removed)
                w.field("changed", strings: outcome.changed)
            }
            b.key("workers")
            b.rawBytes(workers.bytes)
            b.strings("settings", outcome.settings)
            return .reply(b.finish())
        }
    }

    /// What a reload changed: workers added, removed and restarted with a new config, and the `[fluxd]` settings
    /// applied to the running fluxd.
    public struct ReloadOutcome: Sendable, Equatable {
        public var added: [String] = []
        public var removed: [String] = []
        public var changed: [String] = []
        public var settings: [String] = []
    }

    /// Why a reload changed nothing.
    public struct ReloadRefusal: Error, Sendable, Equatable {
        public var message: String
    }

    /// Reads the config file again and applies it, all or nothing (SIGHUP, `reload`; docs/configuration.md): the
    /// workers and the live settings (`DaemonSettings.keys`: the log level and format) and `drain_timeout`. A file
    /// that does not parse, or that changes a setting that takes a restart and that the command line does not set,
    /// is refused as a whole and the running configuration is kept.
    public func reload() -> Result<ReloadOutcome, ReloadRefusal> {
        guard let supervisor else { return apply(nil) }
        return apply(Self.load(path: supervisor.config.path, executableDirectory: executableDirectory))
    }

    /// `reload()` with the file read and parsed on the daemon's reader thread (`Daemon.offLoop`: a config file of
    /// up to 1 MiB is no work for the loop) and applied on the loop thread; `done` gets the outcome there.
    /// Reloads run one at a time, in the order asked (two never interleave: each reads the file when its turn
    /// comes, after the one before was applied); `started` is called when this one's read starts.
    public func reload(started: (() -> Void)? = nil, then done: @escaping (Result<ReloadOutcome, ReloadRefusal>) -> Void) {
        reloadQueue.append((started, done))
        if reloadQueue.count == 1 { startNextReload() }
    }

    /// Reloads asked for, the first one in progress (loop thread). Lifecycle: each is removed once applied; those
    /// left when the daemon closes are never finished (nothing waits for them then).
    private var reloadQueue: [(started: (() -> Void)?, done: (Result<ReloadOutcome, ReloadRefusal>) -> Void)] = []
    /// A SIGHUP reload is queued and has not started reading yet (a second SIGHUP then adds nothing).
    private var hangupReloadWaiting = false

    private func startNextReload() {
        guard let next = reloadQueue.first else { return }
        next.started?()
        guard let supervisor else {
            finishReload(apply(nil))
            return
        }
        let path = supervisor.config.path, directory = executableDirectory
        daemon.offLoop({ Self.load(path: path, executableDirectory: directory) }) { [unowned self] loaded in
            self.finishReload(self.apply(loaded))
        }
    }

    private func finishReload(_ result: Result<ReloadOutcome, ReloadRefusal>) {
        let done = reloadQueue.removeFirst().done
        done(result)
        startNextReload()
    }

    /// Reads and parses the config file (any thread).
    private static func load(path: String, executableDirectory: String?) -> Result<SupervisorConfig, ConfigError> {
        do {
            return .success(try SupervisorConfig.load(path: path, executableDirectory: executableDirectory))
        } catch {
            return .failure(error)
        }
    }

    /// Applies a config file read by `load` (nil: fluxd has no config file), all or nothing (loop thread).
    private func apply(_ loaded: Result<SupervisorConfig, ConfigError>?) -> Result<ReloadOutcome, ReloadRefusal> {
        func refuse(_ message: String) -> Result<ReloadOutcome, ReloadRefusal> {
            logger.error("config reload failed; keeping the running configuration", metadata: ["reason": "\(message)"])
            return .failure(ReloadRefusal(message: message))
        }
        guard let supervisor, let loaded else { return refuse("fluxd was started without --config: there is no file to reload") }
        let fresh: SupervisorConfig
        switch loaded {
        case .success(let config): fresh = config
        case .failure(let error): return refuse("bad config: \(error)")
        }
        var (live, restart) = DaemonSettings.changes(from: runningSettings, to: fresh.settings, commandLine: commandLine)
        if fresh.adminUIDs != supervisor.config.adminUIDs { restart.append("admin_users") }
        if fresh.adminGIDs != supervisor.config.adminGIDs { restart.append("admin_groups") }
        if !restart.isEmpty {
            let described = restart.map { key in
                "\(key) (running: \(runningSettings[key] ?? "unset"), file: \(fresh.settings[key] ?? "unset"))"
            }
            return refuse("\(described.joined(separator: ", ")): needs a restart of fluxd; nothing was changed")
        }
        var level: Logger.Level?, format: LogFormat?
        if live.contains("log_level"), let text = fresh.settings["log_level"] {
            guard let parsed = Logger.Level(rawValue: text), parsed != .critical else {
                return refuse("log_level must be one of trace, debug, info, notice, warning, error, got '\(text)'")
            }
            level = parsed
        }
        if live.contains("log_format"), let text = fresh.settings["log_format"] {
            guard let parsed = LogFormat(rawValue: text) else { return refuse("log_format must be text or json, got '\(text)'") }
            format = parsed
        }
        // Applied from here on: nothing below refuses.
        if live.contains("log_level") { logSettings?.level = level ?? .info }
        if live.contains("log_format") { logSettings?.format = format ?? .text }
        // drain_timeout ([fluxd], read by the host): applied when it changed and fluxd drains (an ephemeral one;
        // a durable one keeps its actions in the journal instead).
        if daemon.journal == nil && drainTimeout != fresh.drainTimeout {
            drainTimeout = fresh.drainTimeout
            live = (live + ["drain_timeout"]).sorted()
        }
        runningSettings = fresh.settings
        let (added, removed, changed) = supervisor.reload(to: fresh)
        if !live.isEmpty { logger.notice("config settings applied", metadata: ["settings": "\(live.joined(separator: ","))"]) }
        return .success(ReloadOutcome(added: added, removed: removed, changed: changed, settings: live))
    }

    /// Starts the workers (call after the daemon listens).
    public func start() {
        supervisor?.start()
    }

    /// Tells the service manager fluxd serves (`READY=1`; call once the daemon listens).
    public func notifyReady() {
        logger.notice("ready", metadata: ["path": "\(daemon.config.socketPath)"])
        sent(notifier.ready(status: "listening on \(daemon.config.socketPath)"))
    }

    /// Logs the first message the service manager could not be sent (the rest would say the same).
    private func sent(_ failure: Int32?) {
        guard let failure, !notifyFailureLogged else { return }
        notifyFailureLogged = true
        logger.warning("cannot notify the service manager", metadata: [
            "NOTIFY_SOCKET": "\(notifier.address ?? "")", "error": "\(String(cString: strerror(failure)))"])
    }

    /// The graceful stop (first call), or the hurried one (second call).
    public func terminate() {
        if terminating {
            logger.notice("second stop request: killing workers and closing now")
            sent(notifier.status("stopping now: second stop request"))
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
        let pending = daemon.pendingActionCount
        sent(notifier.stopping(status: pending == 0 || drainTimeout == 0 ? "stopping"
            : "stopping: draining \(pending) unsettled action\(pending == 1 ? "" : "s") (at most \(drainTimeout) ms)"))
        // A durable fluxd does not drain (its unsettled actions stay in the journal, SPEC §15): no drain to announce.
        if drainTimeout > 0 {
            logger.info("draining: refusing new dispatches until in-flight actions settle",
                        metadata: ["pending": "\(daemon.pendingActionCount)", "timeout_ms": "\(drainTimeout)"])
        }
        drainTimer = LoopTimer(loop: loop) { [unowned self] in self.checkDrained() }
        drainTimer?.start(after: 0, repeat: 20)
    }

    private func checkDrained() {
        let pending = daemon.pendingActionCount
        let waited = loop.now - drainStarted
        guard pending == 0 || waited >= drainTimeout else { return }
        if pending > 0 && drainTimeout > 0 {
            logger.warning("drain timeout over; actions still unsettled", metadata: ["pending": "\(pending)"])
        }
        drainTimer?.close()
        drainTimer = nil
        if let supervisor {
            sent(notifier.status("stopping: stopping workers"))
            supervisor.stopAll { [unowned self] in self.daemon.shutdown() }
        } else {
            daemon.shutdown()
        }
    }
}

/// Runs fluxd on the calling thread: prepares process signals, creates the loop, starts the daemon (and, given a
/// config, the workers after `ready` was called), returns after the graceful stop. `notifier` hears `READY=1`
/// right after `ready` (the socket listens and the journal is restored by then), and the later states. Throws when
/// the daemon cannot start (nothing is left open, no worker was started).
public func runPluginHost(config: DaemonConfig, supervisorConfig: SupervisorConfig?, executableDirectory: String?,
                          journal: Journal? = nil, logger: Logger,
                          notifier: ServiceNotifier = ServiceNotifier(address: nil),
                          commandLine: Set<String> = [], logSettings: LogSettings? = nil,
                          ready: (String) -> Void) throws(DaemonError) {
    ProcessSetup.prepareSignals()
    ChildProcess.prepareSignals()
    let loop = try makeDaemonLoop(config: config, logger: logger)
    let daemon = Daemon(loop: loop, config: config, logger: logger, journal: journal)
    let host = PluginHost(loop: loop, daemon: daemon, supervisorConfig: supervisorConfig,
                          executableDirectory: executableDirectory, logger: logger, notifier: notifier,
                          commandLine: commandLine, logSettings: logSettings)
    try startDaemon(daemon, on: loop)
    ready(config.socketPath)
    host.notifyReady()
    host.start()
    withExtendedLifetime((daemon, host)) { loop.run() }
}
