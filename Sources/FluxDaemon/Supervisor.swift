import FluxCore
import FluxRouter
import FluxTransport
import Glibc
import Logging

/// What `fluxctl workers` shows of one worker.
public enum WorkerState: String, Sendable {
    /// Waiting for the stores it depends on, or started and not yet registered its stores.
    case starting
    /// Its stores are up.
    case running
    /// Ended; restarts when its backoff delay is over.
    case backingOff = "backing-off"
    /// Asked to stop (SIGTERM sent; SIGKILL after the stop timeout).
    case stopping
    /// Not running and not going to be restarted (stopped on request, exited under its policy, or never started).
    case stopped
    /// Given up on: the intensity limit was reached, or its command cannot be started.
    case failed
}

/// Starts, watches, restarts and stops the workers a config file lists (fluxd as a plugin host). Everything runs on
/// the daemon's loop thread.
///
/// Per worker: `starting` (waiting for its `after` stores to be up, then spawned with `FLUXBUS_SOCKET` and
/// `--socket PATH`; it must register every store in `stores` within `start_timeout`, else it is killed) ->
/// `running` (its stores are up; if one goes down while the process lives, its connection is gone: it is killed and
/// treated as crashed) -> on exit, restarted per its policy after a backoff delay (`backing-off`), unless more than
/// `intensity.restarts` restarts happened within `intensity.within` (then `failed`, reported in the log and by
/// `fluxctl workers`). A command that cannot be started at all (no such file, not executable: `SpawnFailure.permanent`)
/// is `failed` at once, never retried in a loop; a start that fails for a reason of the moment (`EMFILE`, `ENFILE`,
/// `EAGAIN`, `ENOMEM`, ...: `SpawnFailure.transient`) is retried after the worker's backoff delay, whatever its
/// restart policy (it never ran), and is not counted against the intensity limit (the worker did not fail: the
/// machine was out of something; retries happen at most every `backoff.cap`, and are logged). The supervisor reacts to
/// the daemon core's store changes (`DaemonCore.onStoreChange`: a store registered or went down), to its workers'
/// exits and to its timers; it never polls.
///
/// Processes, time and the stores' status come through small interfaces (SupervisorSeams.swift): fluxd's libuv
/// spawner and loop clock and its daemon core's store status (`init(loop:daemon:...)`), or a test's fakes
/// (`init(config:...:spawner:clock:storeStatus:)`).
public final class Supervisor {
    /// What the daemon core knows of a store (`Daemon.storeStatus`).
    public typealias StoreStatusLookup = (String) -> StoreStatusInfo

    private let spawner: any WorkerSpawner
    private let clock: any SupervisorClock
    private let storeStatus: StoreStatusLookup
    private let socketPath: String
    private var logger: Logger
    private let executableDirectory: String?
    /// The config in force.
    public private(set) var config: SupervisorConfig
    private var workers: [String: Worker] = [:]
    /// Worker names in start order (workers being removed stay until they stopped).
    private var order: [String] = []
    private var stoppingAll: (() -> Void)?

    /// A supervisor for `config` on the daemon's loop, spawning `ChildProcess`es and reading the stores' status
    /// from `daemon` (nothing runs until `start()`).
    public convenience init(loop: EventLoop, daemon: Daemon, config: SupervisorConfig, socketPath: String,
                            executableDirectory: String?, logger: Logger) {
        self.init(config: config, socketPath: socketPath, executableDirectory: executableDirectory, logger: logger,
                  spawner: ChildProcessSpawner(loop: loop, executableDirectory: executableDirectory), clock: LoopClock(loop: loop),
                  storeStatus: { [unowned daemon] store in daemon.storeStatus(store) })
    }

    /// A supervisor for `config` that starts processes with `spawner`, keeps time with `clock` and learns the
    /// stores' status from `storeStatus` (nothing runs until `start()`; call `storeChanged(_:)` when a store
    /// comes up or goes down).
    public init(config: SupervisorConfig, socketPath: String, executableDirectory: String?, logger: Logger,
                spawner: any WorkerSpawner, clock: any SupervisorClock, storeStatus: @escaping StoreStatusLookup) {
        self.spawner = spawner
        self.clock = clock
        self.storeStatus = storeStatus
        self.config = config
        self.socketPath = socketPath
        self.executableDirectory = executableDirectory
        self.logger = logger
    }

    /// Starts the workers in dependency order (each once the stores it depends on are up).
    public func start() {
        for spec in config.workers { add(spec) }
        evaluate()
    }

    /// A store came up or went down: workers waiting for it may start or be running now, or have lost their
    /// connection.
    public func storeChanged(_ change: StoreChange) {
        if stoppingAll == nil { evaluate() }
    }

    /// Whether every worker process has ended.
    public var allStopped: Bool { workers.values.allSatisfy { $0.child == nil } }

    // MARK: - Operations

    /// Applies a config read again (`PluginHost.reload`, which reads and checks it off the loop): starts added
    /// workers, stops removed ones, restarts changed ones; unchanged ones keep running.
    @discardableResult
    func reload(to fresh: SupervisorConfig) -> (added: [String], removed: [String], changed: [String]) {
        guard stoppingAll == nil else { return ([], [], []) }
        let old = Dictionary(uniqueKeysWithValues: config.workers.map { ($0.name, $0) })
        let new = Set(fresh.workers.map(\.name))
        config = fresh
        var added: [String] = [], removed: [String] = [], changed: [String] = []
        for name in old.keys.sorted() where !new.contains(name) {
            guard let worker = workers[name] else { continue }
            removed.append(name)
            worker.desired = nil
            stop(worker, reason: "removed from the config")
            if worker.child == nil { forget(worker) }
        }
        for spec in fresh.workers {
            if let worker = workers[spec.name] {
                guard worker.spec != spec else { continue }
                changed.append(spec.name)
                worker.desired = spec
                worker.resetFailures()
                if worker.child != nil {
                    stop(worker, reason: "its config changed")
                } else {
                    worker.spec = spec
                    worker.timer.stop()
                    worker.state = .starting
                }
            } else {
                added.append(spec.name)
                add(spec)
            }
        }
        // Start order follows the new file; workers on their way out go last.
        order = fresh.workers.map(\.name) + order.filter { !new.contains($0) }
        logger.notice("config reloaded", metadata: ["added": "\(added.count)", "removed": "\(removed.count)", "changed": "\(changed.count)"])
        evaluate()
        return (added, removed, changed)
    }

    /// Restarts a worker (also a failed or stopped one; its restart history is forgotten). False: no such worker.
    @discardableResult
    public func restart(name: String) -> Bool {
        guard let worker = workers[name], worker.desired != nil, stoppingAll == nil else { return false }
        worker.resetFailures()
        worker.held = false
        if worker.child != nil {
            worker.restartAfterStop = true
            stop(worker, reason: "restart requested")
        } else {
            worker.timer.stop()
            worker.state = .starting
            worker.lastError = nil
            evaluate()
        }
        return true
    }

    /// Stops a worker until it is restarted (`restart(name:)`, a reload that changes it, or fluxd's restart). False:
    /// no such worker.
    @discardableResult
    public func stop(name: String) -> Bool {
        guard let worker = workers[name], worker.desired != nil else { return false }
        worker.held = true
        worker.restartAfterStop = false
        if worker.child != nil {
            stop(worker, reason: "stop requested")
        } else {
            worker.timer.stop()
            worker.state = .stopped
        }
        return true
    }

    /// Stops every worker in reverse dependency order (a worker is stopped once no live worker depends on its
    /// stores), then calls `completion`, then closes the supervisor's handles.
    public func stopAll(completion: @escaping () -> Void) {
        guard stoppingAll == nil else { return }
        stoppingAll = completion
        for worker in workers.values {
            worker.held = true
            worker.restartAfterStop = false
            if worker.child == nil {
                worker.timer.stop()
                if worker.state != .failed { worker.state = .stopped }
            }
        }
        logger.info("stopping workers", metadata: ["running": "\(workers.values.filter { $0.child != nil }.count)"])
        continueStoppingAll()
    }

    /// SIGKILLs every worker (the hurried stop); the supervisor's handles close once they all exited.
    public func killAll() {
        if stoppingAll == nil { stoppingAll = {} }
        for worker in workers.values {
            worker.held = true
            worker.child?.kill(SIGKILL)
            worker.child?.close()
        }
        continueStoppingAll()
    }

    /// fluxd closed a stalled store of this worker's (`unresponsive`): the worker is killed (SIGKILL, which also
    /// ends a stopped process) and restarted like after a crash. False: `pid` is not one of our workers.
    @discardableResult
    public func killStalled(pid: Int32, store: String) -> Bool {
        guard let worker = workers.values.first(where: { $0.child?.pid == pid }) else { return false }
        logger.warning("worker's store stalled; killing the worker so that it restarts",
                       metadata: ["worker": "\(worker.spec.name)", "pid": "\(pid)", "store": "\(store)"])
        worker.child?.kill(SIGKILL)
        return true
    }

    // MARK: - Host operations

    /// The host operations `answer(_:)` handles (SPEC §8.11).
    public static let hostOps: [Op] = [.workers, .restartWorker, .stopWorker]

    /// Answers a host operation (validated by the router; the reply goes out through the daemon core).
    public func answer(_ request: HostRequest) -> HostAnswer {
        switch request {
        case .workers(let id):
            var b = FrameBuilder(op: "workers")
            b.string("id", id)
            b.key("workers")
            var list: [UInt8] = [UInt8(ascii: "[")]
            for (i, name) in order.enumerated() {
                guard let worker = workers[name] else { continue }
                if i > 0 { list.append(UInt8(ascii: ",")) }
                list += json(of: worker)
            }
            list.append(UInt8(ascii: "]"))
            b.rawBytes(list)
            return .reply(b.finish())
        case .restartWorker(let id, let name), .stopWorker(let id, let name):
            let known: Bool
            if case .restartWorker = request { known = restart(name: name) } else { known = stop(name: name) }
            guard known, let worker = workers[name] else {
                return .error(.unknownWorker, "no worker named \"\(name)\" in fluxd's running config")
            }
            var b = FrameBuilder(op: "worker")
            b.string("id", id)
            b.raw("worker", json(of: worker))
            return .reply(b.finish())
        case .history, .stateAt, .reload:
            return .error(.unknownOp, "\(request.op.rawValue) is not answered by the supervisor")
        }
    }

    /// One worker as `workers` reports it (without the JSON), for tests and diagnostics.
    struct WorkerStatus: Equatable {
        var state: WorkerState
        var pid: Int32?
        var restarts: Int
        var lastExit: ProcessExit?
        var lastError: String?
    }

    /// The worker `name` as `workers` reports it; nil when there is no such worker (any more).
    func status(of name: String) -> WorkerStatus? {
        guard let worker = workers[name] else { return nil }
        return WorkerStatus(state: worker.state, pid: worker.child?.pid, restarts: worker.restarts,
                            lastExit: worker.lastExit, lastError: worker.lastError)
    }

    /// The workers' names in start order (workers being removed last).
    var workerNames: [String] { order.filter { workers[$0] != nil } }

    private func json(of worker: Worker) -> [UInt8] {
        var out: [UInt8] = []
        func key(_ k: String) { out += Array("\"\(k)\":".utf8) }
        out += Array("{".utf8)
        key("name"); appendEscaped(worker.spec.name, to: &out)
        out += Array(",".utf8); key("state"); appendEscaped(worker.state.rawValue, to: &out)
        out += Array(",".utf8); key("pid"); out += Array((worker.child.map { "\($0.pid)" } ?? "null").utf8)
        out += Array(",".utf8); key("restarts"); out += Array("\(worker.restarts)".utf8)
        let uptime = worker.child != nil ? "\(clock.now - worker.startedAt)" : "null"
        out += Array(",".utf8); key("uptime_ms"); out += Array(uptime.utf8)
        out += Array(",".utf8); key("last_exit")
        switch worker.lastExit {
        case nil: out += Array("null".utf8)
        case .exited(let code)?: out += Array("{\"code\":\(code)}".utf8)
        case .signalled(let signal)?:
            out += Array("{\"signal\":".utf8); appendEscaped(signalName(signal), to: &out); out += Array("}".utf8)
        }
        out += Array(",".utf8); key("stores")
        out += Array("[".utf8)
        for (i, store) in worker.spec.stores.enumerated() {
            if i > 0 { out += Array(",".utf8) }
            appendEscaped(store, to: &out)
        }
        out += Array("]".utf8)
        if let error = worker.lastError ?? waitingProblem(of: worker) {
            out += Array(",".utf8); key("error"); appendEscaped(error, to: &out)
        }
        out += Array("}".utf8)
        return out
    }

    /// Why a worker that is `starting` has not been started: the first store of its `after` that is not up, and
    /// the state of the worker that provides it (`fluxctl workers` shows it as the PROBLEM). Nil when it is not
    /// waiting.
    private func waitingProblem(of worker: Worker) -> String? {
        guard worker.state == .starting, worker.child == nil,
              let store = worker.spec.after.first(where: { storeStatus($0).status != "up" }) else { return nil }
        let provider = order.compactMap { workers[$0] }.first { $0.spec.stores.contains(store) }
        let by = provider.map { "worker \($0.spec.name) is \($0.state.rawValue)" } ?? "no worker of the config provides it"
        return "waiting for store \"\(store)\" to be up (\(by))"
    }

    // MARK: - The state machine

    private func add(_ spec: WorkerSpec) {
        let worker = Worker(spec: spec, supervisor: self, clock: clock)
        workers[spec.name] = worker
        if !order.contains(spec.name) { order.append(spec.name) }
    }

    private func forget(_ worker: Worker) {
        worker.timer.close()
        workers.removeValue(forKey: worker.spec.name)
        order.removeAll { $0 == worker.spec.name }
    }

    /// Looks at every worker: starts the ones whose dependencies are up, promotes the ones whose stores registered,
    /// notices lost connections. Called on every change that can matter (store changes, exits, timers, requests).
    private func evaluate() {
        if stoppingAll != nil { return continueStoppingAll() }
        for name in order {
            guard let worker = workers[name], !worker.held, worker.desired != nil else { continue }
            switch worker.state {
            case .starting where worker.child == nil:
                if worker.spec.after.allSatisfy({ storeStatus($0).status == "up" }) { spawn(worker) }
            case .starting:
                guard worker.terminating == nil else { continue }
                let registered = worker.spec.stores.allSatisfy { store in
                    let status = storeStatus(store)
                    return status.status == "up" && status.owner.map { !worker.staleOwners.contains($0) } ?? true
                }
                if registered {
                    worker.state = .running
                    worker.timer.stop()
                    worker.runningSince = clock.now
                    logger.info("worker running", metadata: ["worker": "\(name)", "pid": "\(worker.child!.pid)",
                                                             "stores": "\(worker.spec.stores.joined(separator: ","))"])
                }
            case .running:
                guard worker.terminating == nil else { continue }
                if let lost = worker.spec.stores.first(where: { storeStatus($0).status != "up" }) {
                    logger.warning("worker lost its connection; killing it",
                                   metadata: ["worker": "\(name)", "store": "\(lost)"])
                    terminate(worker, because: "store \(lost) went down while the process lived")
                }
            default:
                break
            }
        }
    }

    private func spawn(_ worker: Worker) {
        let spec = worker.spec
        var environment: [String: String] = [:]
        for (key, value) in ProcessEnvironment.current() { environment[key] = value }
        for (key, value) in spec.environment { environment[key] = value }
        environment["FLUXBUS_SOCKET"] = socketPath
        // fluxd logs each line a worker prints with its own time: the SDKs' lines leave theirs out (docs/logging.md).
        if spec.environment["FLUXBUS_LOG_TIME"] == nil { environment["FLUXBUS_LOG_TIME"] = "0" }
        var options = SpawnOptions(executable: spec.executable,
                                   arguments: spec.arguments + (spec.socketArgument ? ["--socket", socketPath] : []),
                                   environment: environment.map { "\($0.key)=\($0.value)" }.sorted(),
                                   workingDirectory: spec.workingDirectory)
        options.detached = true
        // Stores that are up now belong to somebody else (a previous instance whose close is not processed yet).
        worker.staleOwners = Set(spec.stores.compactMap { storeStatus($0).owner })
        do {
            worker.child = try spawner.spawn(options, observer: worker)
        } catch {
            if case .uv(let uv) = error, SpawnFailure(uvCode: uv.code) == .transient {
                return retryStart(worker, after: error)
            }
            worker.state = .failed
            worker.lastError = "cannot start \(spec.command): \(describe(error))"
            logger.error("worker cannot be started; not retrying (fix the config and reload, or fluxctl restart)",
                         metadata: ["worker": "\(spec.name)", "command": "\(spec.executable)", "error": "\(describe(error))"])
            return
        }
        worker.startedAt = clock.now
        worker.lastError = nil
        worker.terminating = nil
        logger.info("worker started", metadata: ["worker": "\(spec.name)", "pid": "\(worker.child!.pid)",
                                                 "command": "\(spec.executable)"])
        if spec.stores.isEmpty {
            worker.state = .running
            worker.runningSince = clock.now
        } else {
            worker.state = .starting
            worker.timer.start(after: spec.startTimeout)
        }
    }

    /// A start failed for a reason of the moment (`SpawnFailure.transient`): try again after the backoff delay.
    private func retryStart(_ worker: Worker, after error: TransportError) {
        worker.consecutiveFailures += 1
        let delay = worker.spec.backoff.delay(attempt: worker.consecutiveFailures)
        worker.state = .backingOff
        worker.lastError = "cannot start \(worker.spec.command) for now: \(describe(error)); retrying in \(delay) ms"
        logger.warning("worker start failed for now; retrying after backoff",
                       metadata: ["worker": "\(worker.spec.name)", "command": "\(worker.spec.executable)",
                                  "error": "\(describe(error))", "delay_ms": "\(delay)"])
        worker.timer.start(after: delay)
    }

    private func describe(_ error: TransportError) -> String {
        if case .uv(let uv) = error { return "\(uv.message) (\(uv.name))" }
        return "\(error)"
    }

    /// Timer of a worker fired: start timeout, backoff over, or stop timeout.
    fileprivate func timerFired(_ worker: Worker) {
        switch worker.state {
        case .starting where worker.child != nil && worker.terminating == nil:
            logger.warning("worker did not register its stores within the start timeout; killing it",
                           metadata: ["worker": "\(worker.spec.name)", "timeout_ms": "\(worker.spec.startTimeout)"])
            terminate(worker, because: "did not register \(worker.spec.stores.joined(separator: ", ")) within \(worker.spec.startTimeout) ms")
        case .backingOff:
            worker.state = .starting
            evaluate()
        default:
            if let child = worker.child {
                logger.warning("worker did not exit within the stop timeout; sending SIGKILL",
                               metadata: ["worker": "\(worker.spec.name)", "pid": "\(child.pid)"])
                child.kill(SIGKILL)
            }
        }
    }

    /// SIGTERM now, SIGKILL after the stop timeout; the exit then counts as a failure (restart per policy).
    private func terminate(_ worker: Worker, because reason: String) {
        worker.terminating = reason
        worker.child?.kill(SIGTERM)
        worker.timer.start(after: worker.spec.stopTimeout)
    }

    /// Stops a worker on purpose (no restart unless `restartAfterStop` or a pending `desired` spec says so).
    private func stop(_ worker: Worker, reason: String) {
        guard let child = worker.child else { return }
        if worker.state != .stopping {
            logger.info("stopping worker", metadata: ["worker": "\(worker.spec.name)", "pid": "\(child.pid)", "reason": "\(reason)"])
            worker.state = .stopping
            child.kill(SIGTERM)
            worker.timer.start(after: worker.spec.stopTimeout)
        }
    }

    fileprivate func exited(_ worker: Worker, how: ProcessExit) {
        let name = worker.spec.name
        worker.child = nil
        worker.lastExit = how
        worker.timer.stop()
        let uptime = clock.now - worker.startedAt
        if worker.state == .stopping {
            logger.info("worker stopped", metadata: ["worker": "\(name)", "exit": "\(how)"])
            worker.state = .stopped
            if worker.desired == nil {
                forget(worker)
            } else if let desired = worker.desired, desired != worker.spec {
                worker.spec = desired
                worker.state = .starting
            } else if worker.restartAfterStop {
                worker.restartAfterStop = false
                worker.state = .starting
            }
            if stoppingAll != nil { continueStoppingAll() } else { evaluate() }
            return
        }
        let reason = worker.terminating ?? "\(how)"
        worker.terminating = nil
        let failure = !how.isSuccess || reason != "\(how)"
        if stoppingAll != nil || worker.held {
            worker.state = .stopped
            if stoppingAll != nil { continueStoppingAll() }
            return
        }
        let restart: Bool
        switch worker.spec.restart {
        case .always: restart = true
        case .onFailure: restart = failure
        case .never: restart = false
        }
        guard restart else {
            worker.state = failure ? .failed : .stopped
            if failure { worker.lastError = reason }
            logger.log(level: failure ? .error : .info, "worker ended; not restarting (restart = \(worker.spec.restart.rawValue))",
                       metadata: ["worker": "\(name)", "exit": "\(how)", "reason": "\(reason)"])
            return
        }
        let now = clock.now
        worker.recentRestarts.removeAll { now - $0 >= worker.spec.intensity.window }
        if worker.recentRestarts.count >= worker.spec.intensity.maxRestarts {
            worker.state = .failed
            worker.lastError = "gave up: more than \(worker.spec.intensity.maxRestarts) restarts within \(Double(worker.spec.intensity.window) / 1000) s (last: \(reason))"
            logger.error("worker restarted too often; giving up",
                         metadata: ["worker": "\(name)", "restarts": "\(worker.recentRestarts.count)",
                                    "within_ms": "\(worker.spec.intensity.window)", "exit": "\(how)"])
            return
        }
        // A worker that ran for longer than the backoff cap starts its backoff over.
        if let since = worker.runningSince, now - since >= max(worker.spec.backoff.cap, 1000) { worker.consecutiveFailures = 0 }
        worker.runningSince = nil
        worker.consecutiveFailures += 1
        worker.recentRestarts.append(now)
        worker.restarts += 1
        let delay = worker.spec.backoff.delay(attempt: worker.consecutiveFailures)
        worker.state = .backingOff
        worker.lastError = reason
        logger.warning("worker ended; restarting after backoff",
                       metadata: ["worker": "\(name)", "exit": "\(how)", "reason": "\(reason)",
                                  "uptime_ms": "\(uptime)", "delay_ms": "\(delay)"])
        worker.timer.start(after: delay)
    }

    fileprivate func output(_ worker: Worker, line: String, stream: FluxTransport.OutputStream) {
        logger.info("\(worker.spec.name)| \(line)", metadata: ["worker": "\(worker.spec.name)", "stream": "\(stream.rawValue)"])
    }

    private func continueStoppingAll() {
        let alive = workers.values.filter { $0.child != nil }
        if alive.isEmpty {
            guard let completion = stoppingAll else { return }
            for worker in workers.values { worker.timer.close() }
            logger.info("every worker stopped")
            completion()
            return
        }
        let aliveDependencies = Set(alive.flatMap(\.spec.after))
        for worker in alive where worker.state != .stopping {
            // Stop a worker only once nothing alive waits for one of its stores.
            if worker.spec.stores.allSatisfy({ !aliveDependencies.contains($0) }) {
                stop(worker, reason: "fluxd is shutting down")
            }
        }
    }
}

/// One supervised worker's bookkeeping (loop thread only).
private final class Worker: WorkerProcessObserver {
    var spec: WorkerSpec
    /// The spec it should run with; nil once removed from the config.
    var desired: WorkerSpec?
    unowned let supervisor: Supervisor
    var state = WorkerState.starting
    var child: (any WorkerProcess)?
    var startedAt: Millis = 0
    var runningSince: Millis?
    var restarts = 0
    var recentRestarts: [Millis] = []
    var consecutiveFailures = 0
    var lastExit: ProcessExit?
    var lastError: String?
    /// Why it is being killed (start timeout, lost connection); nil when it is not.
    var terminating: String?
    /// Stopped by request: not started again until restarted.
    var held = false
    var restartAfterStop = false
    var staleOwners: Set<PeerID> = []
    /// Start timeout, backoff delay or stop timeout (one at a time).
    var timer: (any SupervisorTimer)!

    init(spec: WorkerSpec, supervisor: Supervisor, clock: any SupervisorClock) {
        self.spec = spec
        self.desired = spec
        self.supervisor = supervisor
        timer = clock.makeTimer { [unowned self] in self.supervisor.timerFired(self) }
    }

    func resetFailures() {
        recentRestarts = []
        consecutiveFailures = 0
    }

    func workerProcess(_ process: any WorkerProcess, wrote line: String, to stream: FluxTransport.OutputStream) {
        supervisor.output(self, line: line, stream: stream)
    }

    func workerProcess(_ process: any WorkerProcess, exited: ProcessExit) {
        guard child === process else { return }
        supervisor.exited(self, how: exited)
    }
}

/// fluxd's environment, as `NAME=value` pairs.
enum ProcessEnvironment {
    static func current() -> [(String, String)] {
        var result: [(String, String)] = []
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                result.append((String(text[..<equals]), String(text[text.index(after: equals)...])))
            }
            pointer += 1
        }
        return result
    }
}
