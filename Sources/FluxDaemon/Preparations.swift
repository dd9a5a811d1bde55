import CFluxSys
import Dispatch
import FluxCore
import FluxRouter
import FluxTransport
import Glibc
import Synchronization

/// Runs work off the loop thread and hands the results back to the loop thread through the loop's wake-up
/// (`EventLoopRemote.wake`), which it shares with the metrics endpoint's refresh requests. Two threads of its own
/// (`NiceThread`), each running its jobs one at a time and in order:
/// - the preparations thread: the router's preparations (large patches and parses: `Router+Preparation.swift`) and
///   releasing large garbage;
/// - the reader thread: fluxd's journal reads (`history`, `state-at`) and config-file reloads, which can take a
///   second on a large journal: on a thread of their own they never delay a preparation, which a dispatch waits for.
///
/// Lifecycle: made with the daemon; each thread starts with its first job and ends at `stop()` (the daemon's
/// `closeAll`), after the job it is running; jobs not started by then are dropped (nothing waits for them: their
/// peers are being closed). `start`, `discard`, `read` and `requestMetrics` from any thread; `take` on the loop
/// thread (in `EventLoop.onWake`). A result that arrives after the daemon closed is never taken.
final class WakeReasons: Sendable {
    struct Taken {
        var prepared: [(PeerID, PreparationResult)] = []
        /// Results of `read` jobs, by the number the loop gave them.
        var finished: [(UInt64, any Sendable)] = []
        var metricsWanted = false
    }

    private let state = Mutex(Taken())
    private let remote: EventLoopRemote
    private let preparations = NiceThread()
    private let reads = NiceThread()

    init(remote: EventLoopRemote) { self.remote = remote }

    /// Runs `preparation` on the preparations thread; its result is taken on the loop thread after the wake-up.
    func start(_ preparation: Preparation, for peer: PeerID) {
        preparations.run { [self] in
            let result = preparation.run()
            state.withLock { $0.prepared.append((peer, result)) }
            remote.wake()
        }
    }

    /// Releases `garbage` on the preparations thread (a large tree's nodes: long work the loop does not do).
    func discard(_ garbage: Garbage) {
        preparations.run { withExtendedLifetime(garbage) {} }
    }

    /// Releases `value` on the preparations thread (a connection's long queue of frames).
    func release(_ value: any Sendable) {
        preparations.run { withExtendedLifetime(value) {} }
    }

    /// Runs `work` on the reader thread; its result is taken on the loop thread after the wake-up, as `number`.
    func read(_ number: UInt64, _ work: @escaping @Sendable () -> any Sendable) {
        reads.run { [self] in
            let result = work()
            state.withLock { $0.finished.append((number, result)) }
            remote.wake()
        }
    }

    /// Ends both threads after their current jobs (idempotent).
    func stop() {
        preparations.stop()
        reads.stop()
    }

    /// The metrics endpoint wants fresh numbers (the loop thread copies them in at its wake-up).
    func requestMetrics() {
        state.withLock { $0.metricsWanted = true }
        remote.wake()
    }

    /// What the wake-up is for (loop thread).
    func take() -> Taken {
        state.withLock { taken in
            defer { taken = Taken() }
            return taken
        }
    }
}

/// A thread of its own that runs jobs one at a time, in order, at nice +10 (`setpriority` on the thread, once):
/// the loop thread, and every process on the machine at normal priority, win the CPU over this bulk work, so a
/// large patch or a journal read costs other peers none of it. (A thread of its own, not a dispatch queue: a pool
/// thread would keep the lower priority for other work, and an unprivileged fluxd cannot raise it back.)
///
/// Lifecycle: the thread starts with the first job and ends at `stop()`, after the job it is running; jobs not
/// started by then are dropped (released on the thread that stops it). A job is released on this thread once it
/// ran (what it captured goes with it). `run` and `stop` from any thread; no lock is held while a job runs.
final class NiceThread: Sendable {
    typealias Job = @Sendable () -> Void

    private struct Jobs {
        var queue: [Job] = []
        var threadStarted = false
        var stopped = false
    }

    private let jobs = Mutex(Jobs())
    private let signal = DispatchSemaphore(value: 0)

    func run(_ job: @escaping Job) {
        let startThread = jobs.withLock { jobs -> Bool in
            guard !jobs.stopped else { return false }
            jobs.queue.append(job)
            defer { jobs.threadStarted = true }
            return !jobs.threadStarted
        }
        if startThread { spawn() }
        signal.signal()
    }

    /// Ends the thread after its current job (idempotent).
    func stop() {
        let (running, dropped) = jobs.withLock { jobs -> (Bool, [Job]) in
            defer { jobs.stopped = true; jobs.queue = [] }
            return (jobs.threadStarted && !jobs.stopped, jobs.queue)
        }
        _ = dropped  // released here, outside the lock
        if running { signal.signal() }
    }

    private func spawn() {
        var tid = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&tid, nil, { context in
            let owner = Unmanaged<NiceThread>.fromOpaque(context!).takeRetainedValue()
            owner.work()
            return nil
        }, context)
        if rc == 0 {
            pthread_detach(tid)
        } else {
            // No thread: the jobs run on a dispatch queue's thread instead, at normal priority.
            Unmanaged<NiceThread>.fromOpaque(context).release()
            DispatchQueue.global().async { self.work(nice: false) }
        }
    }

    private enum Next { case job(Job), nothing, stop }

    private func work(nice: Bool = true) {
        if nice { _ = cfluxsys_nice_thread(10) }
        while true {
            signal.wait()
            let next = jobs.withLock { jobs -> Next in
                if jobs.stopped { return .stop }
                if jobs.queue.isEmpty { return .nothing }
                return .job(jobs.queue.removeFirst())
            }
            switch next {
            case .stop: return
            case .nothing: continue
            case .job(let job): job()
            }
        }
    }
}
