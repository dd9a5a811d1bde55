import CFluxSys
import Dispatch
import FluxCore
import FluxRouter
import FluxTransport
import Glibc
import Synchronization

/// Runs the router's preparations (large patches and parses: `Router+Preparation.swift`) off the loop thread, one
/// at a time and in order, on a thread of its own, and hands each result back to the loop thread through the
/// loop's wake-up (`EventLoopRemote.wake`), which it shares with the metrics endpoint's refresh requests.
///
/// The thread runs at nice +10 (`setpriority` on the thread, once): the loop thread, and every process on the
/// machine at normal priority, win the CPU over this bulk work, so a large patch costs other peers none of it. (A
/// thread of its own, not a dispatch queue: a pool thread would keep the lower priority for other work, and an
/// unprivileged fluxd cannot raise it back.)
///
/// Lifecycle: made with the daemon; the thread starts with the first preparation and ends at `stop()` (the
/// daemon's `closeAll`), after the job it is running; jobs not started by then are dropped (nothing waits for
/// them: their peers are being closed). `start` and `requestMetrics` from any thread; `take` on the loop thread
/// (in `EventLoop.onWake`). A result that arrives after the daemon closed is never taken.
final class WakeReasons: Sendable {
    struct Taken {
        var prepared: [(PeerID, PreparationResult)] = []
        var metricsWanted = false
    }

    private enum Job {
        case prepare(PeerID, Preparation)
        case discard(Garbage)
    }

    private struct Jobs {
        var queue: [Job] = []
        var threadStarted = false
        var stopped = false
    }

    private let state = Mutex(Taken())
    private let jobs = Mutex(Jobs())
    private let signal = DispatchSemaphore(value: 0)
    private let remote: EventLoopRemote

    init(remote: EventLoopRemote) { self.remote = remote }

    /// Runs `preparation` on the preparations thread; its result is taken on the loop thread after the wake-up.
    func start(_ preparation: Preparation, for peer: PeerID) { add(.prepare(peer, preparation)) }

    /// Releases `garbage` on the preparations thread (a large tree's nodes: long work the loop does not do).
    func discard(_ garbage: Garbage) { add(.discard(garbage)) }

    private func add(_ job: Job) {
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
        let running = jobs.withLock { jobs -> Bool in
            defer { jobs.stopped = true; jobs.queue = [] }
            return jobs.threadStarted && !jobs.stopped
        }
        if running { signal.signal() }
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

    private func spawn() {
        var tid = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&tid, nil, { context in
            let owner = Unmanaged<WakeReasons>.fromOpaque(context!).takeRetainedValue()
            owner.work()
            return nil
        }, context)
        if rc == 0 {
            pthread_detach(tid)
        } else {
            // No thread: the jobs run on a dispatch queue's thread instead, at normal priority.
            Unmanaged<WakeReasons>.fromOpaque(context).release()
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
            case .stop:
                return
            case .nothing:
                continue
            case .job(.prepare(let peer, let preparation)):
                let result = preparation.run()
                state.withLock { $0.prepared.append((peer, result)) }
                remote.wake()
            case .job(.discard):
                break  // (released as the job goes out of scope)
            }
        }
    }
}
