import CLibUV
import Glibc
import Logging
import Synchronization

/// Owns one libuv loop (`uv_loop_t`) and runs it on one thread: every handle (listener, connections, timers,
/// signals) belongs to a loop and may be touched only on the thread running it. The one thing that may be used
/// from any thread is `remote` (a `uv_async_t` underneath).
///
/// Once per loop iteration the loop flushes the write queues of the connections that have frames pending
/// (a `uv_check` handle right after I/O callbacks, and a `uv_prepare` handle before the loop blocks, so frames
/// queued by timer or close callbacks go out too).
///
/// Lifecycle: `init` -> create handles -> `run()` (blocks) -> somebody calls `stop()` (loop thread) or
/// `remote.requestStop()` (any thread; calls `onStopRequest`, which by default calls `stop()`) -> the owner closes
/// its handles -> `run()` returns once no handle is left, after checking that none leaked and closing the loop.
///
/// Performance: this object lives on one thread and none of its methods re-enters another while that one is
/// modifying the same property, so its hot stored properties are `@exclusivity(unchecked)`: the runtime's dynamic
/// exclusivity checks were a measurable share of the hot path (figures: Benchmarks/PROFILE.md).
public final class EventLoop {
    /// Size of the read buffer shared by every connection of the loop (reads are consumed synchronously).
    public static let readBufferSize = 65_536

    /// How long one connection's turn may handle frames (measured from the start of its read, checked every
    /// `Connection.turnCheckEvery` frames on the tick clock) before the loop serves the others
    /// (`Connection.framesPerTurn` bounds it by count as well). A peer whose frames each cost microseconds (patches,
    /// subscribes, dispatches that are journaled, settled and answered) waits for its next turn after a quarter of
    /// a millisecond: a round trip of another peer crosses two or three loop iterations (client -> store ->
    /// client), each of which may include one turn of every busy peer, and at 1 ms per turn a pipelining attacker
    /// added 3-4 ms to another user's p99 (attacks 7a and 9, Benchmarks/ATTACKS.md), at 0.25 ms under 1 ms.
    /// (Counted from the 32nd frame, as before, a turn of 20 µs frames ran 1.3-1.6 ms: attack 14a.) Pipelined work
    /// of 64 small frames per read takes ~0.1 ms and is never cut. Tests change it.
    public var turnNanoseconds: UInt64 = 250_000 {
        didSet { turnTicks = ticks(nanoseconds: turnNanoseconds) }
    }
    /// `turnNanoseconds` in ticks of `clock()`: until the tick rate is known (`calibrate()`, a few milliseconds
    /// after start) one tick is taken for a nanosecond (shorter turns on any clock of 1 GHz or more).
    @exclusivity(unchecked) public private(set) var turnTicks: UInt64 = 250_000
    /// Whether the tick rate has been measured (`calibrate()`).
    @exclusivity(unchecked) private var calibrated = false

    let loop: UnsafeMutablePointer<uv_loop_t>
    let logger: Logger
    /// The thread-safe side door into this loop.
    public let remote: EventLoopRemote
    /// Called on the loop thread when `remote.requestStop()` was called. Default (nil): `stop()`.
    public var onStopRequest: (() -> Void)?
    /// Called on the loop thread after `remote.wake()` (several wakes may be coalesced into one call).
    public var onWake: (() -> Void)?
    /// Where values whose release is long work go (a connection's queue of hundreds of thousands of frames, dropped
    /// when it is cut off or closed): released on another thread by the owner (fluxd's preparations thread). Nil:
    /// released here.
    public var releaseElsewhere: ((any Sendable) -> Void)?

    /// Drops `value` through `releaseElsewhere` when there is one.
    func release(_ value: any Sendable) {
        if let releaseElsewhere { releaseElsewhere(value) }
    }
    /// Called on the loop thread before the next flush of the connections' queued frames (at the latest at the end
    /// of this loop iteration, after its I/O callbacks) once `requestBeforeFlush()` was called: the owner sends
    /// what it deferred while handling a batch of reads, and writes its journal. (A flag, not a call per flush:
    /// the hot path pays one load.) Returning false holds every connection's frames back (they stay queued, and
    /// `beforeFlush` is asked again at the next flush): fluxd's journal could not write the records they reveal.
    public var beforeFlush: (() -> Bool)? {
        get { storedBeforeFlush }
        set { storedBeforeFlush = newValue }
    }
    @exclusivity(unchecked) private var storedBeforeFlush: (() -> Bool)?
    @exclusivity(unchecked) private var beforeFlushRequested = false

    /// Has `beforeFlush` called before the next flush.
    public func requestBeforeFlush() { beforeFlushRequested = true }

    private let readBuffer: UnsafeMutableRawPointer
    private var waker: LoopWaker?
    private var prepareFlusher: LoopFlusher?
    private var checkFlusher: LoopFlusher?
    @exclusivity(unchecked) private var dirty: [Connection] = []
    /// Connections whose turn ended with frames left (`Connection.framesPerTurn`), served one turn each per
    /// iteration by `turnTaker` (an idle handle, so the loop polls without blocking while any wait).
    @exclusivity(unchecked) private var waitingTurns: [Connection] = []
    private var turnTaker: LoopTurnTaker?
    @exclusivity(unchecked) private var flushing: [Connection] = []
    @exclusivity(unchecked) private var state = State.idle

    private enum State { case idle, running, finished }

    /// Creates a loop on the calling thread; it may be run on another thread later (not concurrently).
    public convenience init(logger: Logger) throws(TransportError) {
        try self.init(logger: logger, remote: EventLoopRemote())
    }

    init(logger: Logger, remote: EventLoopRemote) throws(TransportError) {
        self.logger = logger
        self.remote = remote
        loop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        readBuffer = UnsafeMutableRawPointer.allocate(byteCount: EventLoop.readBufferSize, alignment: 16)
        let rc = uv_loop_init(loop)
        if rc < 0 {
            state = .finished // nothing to close; deinit frees the memory
            throw .uv(UVError(code: rc, operation: "uv_loop_init"))
        }
        // The read buffer is reached from the alloc callback through the loop: no Swift object traffic per read.
        loop.pointee.data = readBuffer
        waker = try LoopWaker(loop: self) // on failure deinit closes the loop
        prepareFlusher = LoopFlusher(loop: self, phase: .prepare)
        turnTaker = LoopTurnTaker(loop: self)
        checkFlusher = LoopFlusher(loop: self, phase: .check)
        remote.attach(EventLoopRemote.AsyncHandle(pointer: waker!.async))
    }

    deinit {
        if state == .idle {
            // Never run: close the internal handles so the loop can be closed cleanly.
            closeInternalHandles()
            _ = uv_run(loop, UV_RUN_DEFAULT)
            let rc = uv_loop_close(loop)
            assert(rc == 0, "uv_loop_close: \(UVError(code: rc, operation: "uv_loop_close"))")
        }
        loop.deallocate()
        readBuffer.deallocate()
    }

    /// The loop's cached monotonic clock in milliseconds (updated at the start of each iteration).
    public var now: UInt64 { uv_now(loop) }

    /// The longest time one callback held this loop (a connection's read, or a span the owner measured with
    /// `clock()` and `holdEnded(since:)`), in ticks of `clock()`; `longestHoldNanoseconds` converts it.
    public var longestHold: UInt64 { storedLongestHold }
    @exclusivity(unchecked) private var storedLongestHold: UInt64 = 0
    /// Both clocks when the loop was made: their rates compared since then convert ticks to nanoseconds.
    private let startTicks = fluxbus_ticks()
    private let startNanoseconds = uv_hrtime()

    /// A tick count for measuring holds: the CPU's time-stamp counter where there is one (a single instruction,
    /// where reading the clock twice per read showed in the profile, Benchmarks/PROFILE.md), else nanoseconds.
    @inline(__always)
    public static func clock() -> UInt64 { fluxbus_ticks() }

    /// Records a hold that started at `start` (an `EventLoop.clock()` reading) and ends now.
    @inline(__always)
    public func holdEnded(since start: UInt64, file: StaticString = #fileID, line: UInt = #line) {
        let held = fluxbus_ticks() &- start
        if held > storedLongestHold {
            storedLongestHold = held
            longestHoldSite = "\(file):\(line)"
        }
    }

    /// Where the longest hold was measured (the source file and line of the callback that measured it: what kind
    /// of callback it was), for `info.load.longestLoopHoldAt`.
    public private(set) var longestHoldSite = ""

    /// `longestHold` in nanoseconds.
    public var longestHoldNanoseconds: UInt64 {
        let ticks = fluxbus_ticks() &- startTicks
        let nanos = uv_hrtime() &- startNanoseconds
        guard ticks > 0, nanos > 0 else { return storedLongestHold }
        return UInt64(Double(storedLongestHold) * Double(nanos) / Double(ticks))
    }

    /// `nanoseconds` in ticks of `clock()` at the rate measured since the loop was made (one tick per nanosecond
    /// until 10 ms have passed).
    func ticks(nanoseconds: UInt64) -> UInt64 {
        let ticks = fluxbus_ticks() &- startTicks
        let nanos = uv_hrtime() &- startNanoseconds
        guard nanos >= 10_000_000, ticks > 0 else { return nanoseconds }
        let converted = Double(nanoseconds) * Double(ticks) / Double(nanos)
        return converted >= Double(UInt64.max) ? .max : UInt64(converted)
    }

    /// Measures the tick rate once 50 ms have passed since the loop was made (called once per iteration until
    /// then; the time-stamp counter runs at a constant rate, so once is enough).
    @inline(__always)
    private func calibrate() {
        guard !calibrated else { return }
        guard uv_hrtime() &- startNanoseconds >= 50_000_000 else { return }
        calibrated = true
        turnTicks = ticks(nanoseconds: turnNanoseconds)
    }

    /// Refreshes the cached clock (after long synchronous work).
    public func updateTime() { uv_update_time(loop) }

    /// Lets `run()` return once every other handle is closed or inactive. Loop thread only. Idempotent.
    public func stop() {
        waker?.unreference()
    }

    /// Runs the loop on the calling thread until `stop()` was called and no handle is active, then closes the
    /// internal handles, asserts that no handle leaked and closes the loop. Call at most once.
    public func run() {
        precondition(state == .idle, "EventLoop.run() called twice")
        state = .running
        _ = uv_run(loop, UV_RUN_DEFAULT)
        closeInternalHandles()
        _ = uv_run(loop, UV_RUN_DEFAULT)
        let leaked = openHandleDescriptions()
        if !leaked.isEmpty {
            // A handle its owner never closed: our bug. Fail loudly in debug builds, clean up in release.
            logger.critical("event loop ended with open handles", metadata: ["handles": "\(leaked)"])
            assertionFailure("event loop ended with open handles: \(leaked)")
            closeAllHandles()
            _ = uv_run(loop, UV_RUN_DEFAULT)
        }
        state = .finished
        let rc = uv_loop_close(loop)
        precondition(rc == 0, "uv_loop_close: \(UVError(code: rc, operation: "uv_loop_close"))")
    }

    /// Creates a loop on a new thread, runs `setup` there (to create handles), then runs the loop until it is
    /// stopped. Use the returned thread's `remote` to stop it and `join()` to wait for it.
    public static func startThread(
        logger: Logger,
        setup: @escaping @Sendable (EventLoop) throws -> Void
    ) throws(TransportError) -> EventLoopThread {
        try EventLoopThread(logger: logger, setup: setup)
    }

    // MARK: - Internal

    /// Queues a connection for this iteration's flush.
    @inline(__always)
    func markDirty(_ connection: Connection) {
        dirty.append(connection)
    }

    /// `connection` paused reading with frames left: it gets a turn in each coming iteration until they are done.
    func waitForTurn(_ connection: Connection) {
        waitingTurns.append(connection)
        if waitingTurns.count == 1 { turnTaker?.start() }
    }

    /// One turn for each connection waiting for one (called by the idle handle, before this iteration's poll).
    func takeTurns() {
        let start = fluxbus_ticks()  // (each turn is a hold too; this also counts the idle callback's own work)
        defer { holdEnded(since: start) }
        let turns = waitingTurns
        waitingTurns.removeAll(keepingCapacity: true)
        for connection in turns where connection.resumeTurn() { waitingTurns.append(connection) }
        if waitingTurns.isEmpty && dirty.isEmpty { turnTaker?.stop() }
    }

    /// Connections with frames waiting for this iteration's flush.
    var dirtyCount: Int { dirty.count }

    /// Writes out every connection's pending frames (one `uv_write` per connection).
    func flushDirty() {
        // A hold of its own: the owner's `beforeFlush` (fluxd's journal writes) and the connections' writes.
        let start = fluxbus_ticks()
        defer { holdEnded(since: start) }
        calibrate()
        if beforeFlushRequested {
            beforeFlushRequested = false
            if let hook = storedBeforeFlush, !hook() {
                beforeFlushRequested = true
                return
            }
        }
        guard !dirty.isEmpty else { return }
        swap(&dirty, &flushing)
        for connection in flushing { connection.flush() }
        flushing.removeAll(keepingCapacity: true)
        // A connection with more than one write's worth of frames is dirty again: the idle handle keeps the next
        // poll from blocking, so the rest goes out in the next iteration.
        if !dirty.isEmpty { turnTaker?.start() }
    }

    func handleAsync(stop: Bool, wake: Bool) {
        // A hold of its own: what the owner does when woken (fluxd: the results of work done off the loop) or
        // asked to stop.
        let start = fluxbus_ticks()
        defer { holdEnded(since: start) }
        if wake, let onWake { onWake() }
        if stop {
            if let onStopRequest { onStopRequest() } else { self.stop() }
        }
    }

    private func closeInternalHandles() {
        if let waker {
            remote.detach()
            waker.closeHandle()
            self.waker = nil
        }
        prepareFlusher?.closeHandle()
        prepareFlusher = nil
        turnTaker?.closeHandle()
        turnTaker = nil
        waitingTurns.removeAll()
        checkFlusher?.closeHandle()
        checkFlusher = nil
    }

    /// "type (active)" for every handle that is not closing.
    private func openHandleDescriptions() -> [String] {
        var found: [String] = []
        withUnsafeMutablePointer(to: &found) { pointer in
            uv_walk(loop, { handle, arg in
                guard let handle, let arg, uv_is_closing(handle) == 0 else { return }
                let list = arg.assumingMemoryBound(to: [String].self)
                let type = String(cString: uv_handle_type_name(uv_handle_get_type(handle)))
                list.pointee.append(uv_is_active(handle) != 0 ? "\(type) (active)" : type)
            }, pointer)
        }
        return found
    }

    private func closeAllHandles() {
        var owners: [HandleOwner] = []
        withUnsafeMutablePointer(to: &owners) { pointer in
            uv_walk(loop, { handle, arg in
                guard let handle, let arg, uv_is_closing(handle) == 0, let owner = handleOwner(of: handle) else { return }
                arg.assumingMemoryBound(to: [HandleOwner].self).pointee.append(owner)
            }, pointer)
        }
        for owner in owners {
            if let connection = owner as? Connection {
                connection.close(afterFlush: false)
            } else {
                owner.closeHandle()
            }
        }
    }
}

/// The thread-safe way into a running `EventLoop`: ask it to stop or wake it (through a `uv_async_t`).
/// Calls after the loop has ended do nothing; calls before it starts running are remembered.
public final class EventLoopRemote: Sendable {
    /// The loop's async handle; used from other threads only through `uv_async_send`, under the lock, while the
    /// handle is open (the loop detaches it before closing it).
    struct AsyncHandle: @unchecked Sendable {
        let pointer: UnsafeMutablePointer<uv_async_t>
    }

    private struct State {
        var async: AsyncHandle?
        var stopRequested = false
        var wakeRequested = false
        var ended = false
    }

    private let state = Mutex<State>(State())

    init() {}

    /// Asks the loop to stop: its `onStopRequest` runs on the loop thread. Any thread.
    public func requestStop() {
        state.withLock { state in
            state.stopRequested = true
            if let async = state.async { uvMust(uv_async_send(async.pointer), "uv_async_send") }
        }
    }

    /// Wakes the loop: its `onWake` runs on the loop thread. Any thread.
    public func wake() {
        state.withLock { state in
            state.wakeRequested = true
            if let async = state.async { uvMust(uv_async_send(async.pointer), "uv_async_send") }
        }
    }

    func attach(_ async: AsyncHandle) {
        state.withLock { state in
            precondition(state.async == nil && !state.ended, "remote attached twice")
            state.async = async
            // Requests made before the loop existed are delivered on its first iteration.
            if state.stopRequested || state.wakeRequested { uvMust(uv_async_send(async.pointer), "uv_async_send") }
        }
    }

    func detach() {
        state.withLock { state in
            state.async = nil
            state.ended = true
        }
    }

    /// Takes the pending requests (loop thread, from the async callback).
    func takeRequests() -> (stop: Bool, wake: Bool) {
        state.withLock { state in
            defer { state.stopRequested = false; state.wakeRequested = false }
            return (state.stopRequested, state.wakeRequested)
        }
    }
}

/// The loop's `uv_async_t`. Lifecycle: opened and referenced in `EventLoop.init` (it keeps the loop running until
/// `stop()` unreferences it); closed by `EventLoop.run()` after the loop drained, freed in the close callback.
final class LoopWaker: HandleOwner {
    var async: UnsafeMutablePointer<uv_async_t> { typed(uv_async_t.self) }

    init(loop: EventLoop) throws(TransportError) {
        super.init(loop: loop, handleType: uv_async_t.self)
        try uvCheck(uv_async_init(loop.loop, async, { async in
            guard let async, let data = async.pointee.data else { return }
            let waker = Unmanaged<LoopWaker>.fromOpaque(data).takeUnretainedValue()
            let requests = waker.eventLoop.remote.takeRequests()
            waker.eventLoop.handleAsync(stop: requests.stop, wake: requests.wake)
        }), "uv_async_init")
        adopt()
    }

    func unreference() {
        if !closeStarted { uv_unref(handle) }
    }
}

/// A `uv_prepare_t` or `uv_check_t` that flushes the loop's pending writes each iteration. Lifecycle: opened,
/// started and unreferenced (it never keeps the loop alive) in `EventLoop.init`; closed by `EventLoop.run()` at the
/// end; freed in the close callback.
final class LoopFlusher: HandleOwner {
    enum Phase { case prepare, check }

    init(loop: EventLoop, phase: Phase) {
        switch phase {
        case .prepare:
            super.init(loop: loop, handleType: uv_prepare_t.self)
            let prepare = typed(uv_prepare_t.self)
            uvMust(uv_prepare_init(loop.loop, prepare), "uv_prepare_init")
            adopt()
            uvMust(uv_prepare_start(prepare, { prepare in
                guard let prepare, let data = prepare.pointee.data else { return }
                Unmanaged<LoopFlusher>.fromOpaque(data).takeUnretainedValue().eventLoop.flushDirty()
            }), "uv_prepare_start")
        case .check:
            super.init(loop: loop, handleType: uv_check_t.self)
            let check = typed(uv_check_t.self)
            uvMust(uv_check_init(loop.loop, check), "uv_check_init")
            adopt()
            uvMust(uv_check_start(check, { check in
                guard let check, let data = check.pointee.data else { return }
                Unmanaged<LoopFlusher>.fromOpaque(data).takeUnretainedValue().eventLoop.flushDirty()
            }), "uv_check_start")
        }
        uv_unref(handle)
    }
}

/// A `uv_idle_t` that gives paused connections their turns (`EventLoop.takeTurns`). Active only while some wait:
/// an active idle handle makes the loop poll without blocking. Lifecycle: opened (inactive, unreferenced) in
/// `EventLoop.init`, started and stopped by `EventLoop`, closed by `EventLoop.run()` at the end, freed in the close
/// callback.
final class LoopTurnTaker: HandleOwner {
    init(loop: EventLoop) {
        super.init(loop: loop, handleType: uv_idle_t.self)
        uvMust(uv_idle_init(loop.loop, typed(uv_idle_t.self)), "uv_idle_init")
        adopt()
        uv_unref(handle)
    }

    func start() {
        guard !closeStarted else { return }
        uvMust(uv_idle_start(typed(uv_idle_t.self), { idle in
            guard let idle, let data = idle.pointee.data else { return }
            Unmanaged<LoopTurnTaker>.fromOpaque(data).takeUnretainedValue().eventLoop.takeTurns()
        }), "uv_idle_start")
    }

    func stop() {
        guard !closeStarted else { return }
        uvMust(uv_idle_stop(typed(uv_idle_t.self)), "uv_idle_stop")
    }
}

/// A thread of its own running one `EventLoop` (see `EventLoop.startThread`). Stop it through `remote`, then
/// `join()`.
public final class EventLoopThread: Sendable {
    /// Stops or wakes the loop from any thread.
    public let remote: EventLoopRemote
    private let thread: Mutex<pthread_t?>
    private let outcome = Mutex<(any Error)?>(nil)

    private final class Start: @unchecked Sendable {
        // @unchecked: written before pthread_create, read only by the new thread.
        let logger: Logger
        let remote: EventLoopRemote
        let setup: @Sendable (EventLoop) throws -> Void
        let owner: EventLoopThread
        init(logger: Logger, remote: EventLoopRemote, setup: @escaping @Sendable (EventLoop) throws -> Void,
             owner: EventLoopThread) {
            self.logger = logger
            self.remote = remote
            self.setup = setup
            self.owner = owner
        }
    }

    init(logger: Logger, setup: @escaping @Sendable (EventLoop) throws -> Void) throws(TransportError) {
        remote = EventLoopRemote()
        thread = Mutex(nil)
        let start = Start(logger: logger, remote: remote, setup: setup, owner: self)
        var tid = pthread_t()
        let context = Unmanaged.passRetained(start).toOpaque()
        let rc = pthread_create(&tid, nil, { context in
            let start = Unmanaged<Start>.fromOpaque(context!).takeRetainedValue()
            start.owner.body(start)
            return nil
        }, context)
        guard rc == 0 else {
            Unmanaged<Start>.fromOpaque(context).release()
            throw .system(operation: "pthread_create", path: "", errno: rc)
        }
        thread.withLock { $0 = tid }
    }

    private func body(_ start: Start) {
        do {
            let loop = try EventLoop(logger: start.logger, remote: start.remote)
            do {
                try start.setup(loop)
            } catch {
                loop.stop()
                loop.run()
                throw error
            }
            loop.run()
        } catch {
            outcome.withLock { $0 = error }
        }
    }

    /// Waits for the loop thread to end; rethrows what loop creation, `setup` or `run()` threw. Call once.
    public func join() throws {
        let tid = thread.withLock { tid -> pthread_t? in
            defer { tid = nil }
            return tid
        }
        guard let tid else { preconditionFailure("EventLoopThread joined twice") }
        let rc = pthread_join(tid, nil)
        precondition(rc == 0, "pthread_join: \(rc)")
        if let error = outcome.withLock({ $0 }) { throw error }
    }
}
