import CLibUV

/// A one-shot or repeating timer on the loop (`uv_timer_t`), in milliseconds of the loop's clock.
///
/// Handle lifecycle: `init` inits the handle (which retains this object); `start`/`stop` any number of times;
/// `close()` stops it for good; the close callback frees the memory and releases the handler (and whatever it
/// captured). A stopped timer does not keep the loop running, but must still be closed.
public final class LoopTimer: HandleOwner {
    private var handler: (() -> Void)?

    /// Creates a stopped timer that calls `handler` on the loop thread each time it fires.
    public init(loop: EventLoop, handler: @escaping () -> Void) {
        self.handler = handler
        super.init(loop: loop, handleType: uv_timer_t.self)
        uvMust(uv_timer_init(loop.loop, typed(uv_timer_t.self)), "uv_timer_init")
        adopt()
    }

    /// Fires after `timeout` ms (counted from the loop's cached `now`), then every `repeat` ms if non-zero.
    /// Restarts a running timer.
    public func start(after timeout: UInt64, repeat interval: UInt64 = 0) {
        precondition(!closeStarted, "LoopTimer.start after close")
        uvMust(uv_timer_start(typed(uv_timer_t.self), { timer in
            let owner = Unmanaged<LoopTimer>.fromOpaque(timer!.pointee.data).takeUnretainedValue()
            let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
            owner.handler?()
            owner.eventLoop.holdEnded(since: start)
        }, timeout, interval), "uv_timer_start")
    }

    /// Stops the timer (it may be started again).
    public func stop() {
        guard !closeStarted else { return }
        uvMust(uv_timer_stop(typed(uv_timer_t.self)), "uv_timer_stop")
    }

    /// Whether the timer is armed.
    public var isRunning: Bool { isActiveHandle }

    /// Closes the timer for good. Idempotent.
    public func close() { closeHandle() }

    override func didClose() { handler = nil }
}

/// Calls a handler on the loop thread when the process receives a signal (`uv_signal_t`).
///
/// Handle lifecycle: `init` inits and starts the handle (which retains this object); `close()` stops watching;
/// the close callback frees the memory and releases the handler. An open watcher keeps the loop running.
public final class SignalWatcher: HandleOwner {
    /// The signal number watched.
    public let signal: Int32
    private var handler: ((Int32) -> Void)?

    /// Starts watching `signal`.
    public init(loop: EventLoop, signal: Int32, handler: @escaping (Int32) -> Void) throws(TransportError) {
        self.signal = signal
        self.handler = handler
        super.init(loop: loop, handleType: uv_signal_t.self)
        let watcher = typed(uv_signal_t.self)
        try uvCheck(uv_signal_init(loop.loop, watcher), "uv_signal_init")
        adopt()
        do {
            try uvCheck(uv_signal_start(watcher, { watcher, signal in
                let owner = Unmanaged<SignalWatcher>.fromOpaque(watcher!.pointee.data).takeUnretainedValue()
                let start = EventLoop.clock()
                owner.handler?(signal)
                owner.eventLoop.holdEnded(since: start)
            }, signal), "uv_signal_start")
        } catch {
            closeHandle()
            throw error
        }
    }

    /// Stops watching. Idempotent.
    public func close() { closeHandle() }

    override func didClose() { handler = nil }
}
