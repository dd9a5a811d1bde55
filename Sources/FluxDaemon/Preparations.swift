import Dispatch
import FluxCore
import FluxRouter
import FluxTransport
import Synchronization

/// Runs the router's preparations (large patches and parses: `Router+Preparation.swift`) off the loop thread, one
/// at a time and in order, on a dispatch queue of their own, and hands each result back to the loop thread through
/// the loop's wake-up (`EventLoopRemote.wake`), which it shares with the metrics endpoint's refresh requests.
///
/// Lifecycle: made with the daemon; `start` and `requestMetrics` from any thread; `take` on the loop thread (in
/// `EventLoop.onWake`). A result that arrives after the daemon closed is never taken (nothing waits for it).
final class WakeReasons: Sendable {
    struct Taken {
        var prepared: [(PeerID, PreparationResult)] = []
        var metricsWanted = false
    }

    private let queue = DispatchQueue(label: "fluxd.preparations")
    private let state = Mutex(Taken())
    private let remote: EventLoopRemote

    init(remote: EventLoopRemote) { self.remote = remote }

    /// Runs `preparation` on the queue; its result is taken on the loop thread after the wake-up.
    func start(_ preparation: Preparation, for peer: PeerID) {
        queue.async { [self] in
            let result = preparation.run()
            state.withLock { $0.prepared.append((peer, result)) }
            remote.wake()
        }
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
