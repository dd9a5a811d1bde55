import FluxRouter
import FluxTransport
import Glibc

// What the `Supervisor` needs from the world, as small interfaces: processes (`WorkerSpawner`), time
// (`SupervisorClock`) and the stores' status (a closure, `Supervisor.StoreStatusLookup`). fluxd passes the libuv
// implementations below and its daemon core's store status; the supervisor's unit tests (Tests/FluxDaemonTests)
// pass a fake spawner, a fake clock and a dictionary of stores, and drive the state machine without processes,
// sockets or waiting.

/// A started worker process, as the supervisor uses it.
public protocol WorkerProcess: AnyObject {
    /// The process id.
    var pid: Int32 { get }
    /// Sends `signal` (to the process group when the process leads one); does nothing once it was reaped. False
    /// when the signal could not be sent.
    @discardableResult
    func kill(_ signal: Int32) -> Bool
    /// Stops reading its output (shutdown: a grandchild may hold the pipes open). Never kills anything.
    func close()
}

/// Hears what a started worker process does (on the loop thread).
public protocol WorkerProcessObserver: AnyObject {
    /// A line the process wrote (see `ChildProcessDelegate`).
    func workerProcess(_ process: any WorkerProcess, wrote line: String, to stream: FluxTransport.OutputStream)
    /// The process ended; called exactly once per started process.
    func workerProcess(_ process: any WorkerProcess, exited: ProcessExit)
}

/// Starts worker processes.
public protocol WorkerSpawner: AnyObject {
    /// Starts a process that reports to `observer` (held strongly until the exit was reported). Throws when it
    /// cannot be started; a `.uv` error's code tells a permanent failure from one of the moment (`SpawnFailure`).
    func spawn(_ options: SpawnOptions, observer: any WorkerProcessObserver) throws(TransportError) -> any WorkerProcess
}

/// A one-shot timer (a worker's start timeout, backoff delay or stop timeout).
public protocol SupervisorTimer: AnyObject {
    /// Fires once, `timeout` ms from now; restarts a running timer. Not after `close()`.
    func start(after timeout: Millis)
    /// Disarms the timer (it may be started again).
    func stop()
    /// Disarms the timer for good. Idempotent.
    func close()
}

/// The supervisor's time: a millisecond clock and timers on it.
public protocol SupervisorClock: AnyObject {
    /// Now, in ms (monotonic).
    var now: Millis { get }
    /// A stopped timer that calls `handler` each time it fires.
    func makeTimer(_ handler: @escaping () -> Void) -> any SupervisorTimer
}

// MARK: - The libuv implementations (fluxd)

/// Starts workers with `ChildProcess.spawn` on the daemon's loop. With `fluxd-exec` beside fluxd, each worker
/// is started through it, so that it dies with fluxd (PR_SET_PDEATHSIG: a worker must not outlive a killed fluxd
/// and hold its store names against the next one's workers; see Sources/fluxd-exec/main.c). The spawn happens
/// on the loop thread, which lives as long as fluxd, as the death signal follows the spawning thread.
public final class ChildProcessSpawner: WorkerSpawner {
    private let loop: EventLoop
    private let trampoline: String?

    public init(loop: EventLoop, executableDirectory: String? = nil) {
        self.loop = loop
        let candidate = executableDirectory.map { $0 + "/fluxd-exec" }
        trampoline = candidate.flatMap { access($0, X_OK) == 0 ? $0 : nil }
    }

    public func spawn(_ options: SpawnOptions,
                      observer: any WorkerProcessObserver) throws(TransportError) -> any WorkerProcess {
        var options = options
        if let trampoline {
            // A command that cannot run fails here, as `uv_spawn` would fail it (a permanent failure, not a
            // worker that exits 127 and is restarted).
            try Self.checkRunnable(options)
            options.arguments = [String(getpid()), options.executable] + options.arguments
            options.executable = trampoline
        }
        return try ChildProcess.spawn(loop: loop, options: options, delegate: ChildProcessForwarder(observer))
    }

    /// Fails like `uv_spawn` (ENOENT, EACCES) when `options.executable` cannot be run: a path must be executable;
    /// a bare name must be found in the child's PATH.
    static func checkRunnable(_ options: SpawnOptions) throws(TransportError) {
        func fail(_ code: Int32) -> TransportError {
            .uv(UVError(code: -code, operation: "uv_spawn \(options.executable)"))
        }
        if options.executable.contains("/") {
            guard access(options.executable, X_OK) == 0 else { throw fail(errno == ENOENT ? ENOENT : EACCES) }
            return
        }
        let path = options.environment.first { $0.hasPrefix("PATH=") }.map { String($0.dropFirst(5)) }
            ?? "/usr/local/bin:/usr/bin:/bin"
        for dir in path.split(separator: ":") where access("\(dir)/\(options.executable)", X_OK) == 0 { return }
        throw fail(ENOENT)
    }
}

extension ChildProcess: WorkerProcess {}

/// Passes a `ChildProcess`'s delegate calls on to a `WorkerProcessObserver` (held strongly, as the child holds its
/// delegate: until the exit was reported and both pipes closed).
private final class ChildProcessForwarder: ChildProcessDelegate {
    let observer: any WorkerProcessObserver

    init(_ observer: any WorkerProcessObserver) {
        self.observer = observer
    }

    func childProcess(_ child: ChildProcess, wrote line: String, to stream: FluxTransport.OutputStream) {
        observer.workerProcess(child, wrote: line, to: stream)
    }

    func childProcess(_ child: ChildProcess, exited: ProcessExit) {
        observer.workerProcess(child, exited: exited)
    }
}

/// The loop's clock and `LoopTimer`s.
public final class LoopClock: SupervisorClock {
    private let loop: EventLoop

    public init(loop: EventLoop) {
        self.loop = loop
    }

    public var now: Millis { loop.now }

    public func makeTimer(_ handler: @escaping () -> Void) -> any SupervisorTimer {
        LoopSupervisorTimer(LoopTimer(loop: loop, handler: handler))
    }
}

/// A `LoopTimer` as a one-shot `SupervisorTimer`.
private final class LoopSupervisorTimer: SupervisorTimer {
    private let timer: LoopTimer

    init(_ timer: LoopTimer) {
        self.timer = timer
    }

    func start(after timeout: Millis) { timer.start(after: timeout) }
    func stop() { timer.stop() }
    func close() { timer.close() }
}
