import CLibUV

/// Base of every transport object that owns one libuv handle (`Connection`, `PipeListener`, `LoopTimer`,
/// `SignalWatcher`). It has no public members: it exists to share the handle lifecycle below.
///
/// Lifecycle, shared by all subclasses:
/// 1. `init` allocates zeroed memory for the handle; the subclass calls `uv_<type>_init` and then `adopt()`,
///    which stores `Unmanaged.passRetained(self)` in `handle->data`. From then on libuv's handle keeps the owner
///    alive, whatever the caller does with its reference.
/// 2. `closeHandle()` calls `uv_close` (once; later calls do nothing).
/// 3. libuv's close callback runs on a later loop iteration: it calls `didClose()` (subclass hook), frees the
///    handle memory and releases the retain taken in step 1. Memory is freed only there ("handles are not
///    movable"; libuv may touch them until the close callback).
/// If `uv_<type>_init` fails, `adopt()` is never called and the memory is freed in `deinit`.
public class HandleOwner {
    /// The handle's memory (a `uv_pipe_t`, `uv_timer_t`, ...), as libuv's base type.
    final let handle: UnsafeMutablePointer<uv_handle_t>
    private final let memory: UnsafeMutableRawPointer
    /// The loop this handle belongs to. Not retained: the loop outlives its handles (`run()` returns only after
    /// every handle closed), and this keeps reference counting off the hot path.
    final unowned(unsafe) let eventLoop: EventLoop
    /// `eventLoop` for the hot path, called at +0 (`withLoop`): a call through the `unowned(unsafe)` reference
    /// still retained and released the loop each time (issue 27).
    private final let loopRef: Unmanaged<EventLoop>
    private final var adopted = false
    /// `uv_close` has been called.
    final private(set) var closeStarted = false
    /// The close callback has run; the handle memory is gone.
    final private(set) var closed = false

    init<Handle>(loop: EventLoop, handleType: Handle.Type) {
        let size = MemoryLayout<Handle>.size
        memory = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: MemoryLayout<Handle>.alignment)
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: size)
        handle = UnsafeMutablePointer<uv_handle_t>(OpaquePointer(memory))
        eventLoop = loop
        loopRef = Unmanaged.passUnretained(loop)
    }

    /// Calls `body` with the loop, not retained (it outlives its handles).
    @inline(__always)
    final func withLoop<R>(_ body: (EventLoop) -> R) -> R { loopRef._withUnsafeGuaranteedRef(body) }

    deinit {
        // Reached only when the handle was never adopted (init failed) or after the close callback.
        if !adopted { memory.deallocate() }
    }

    /// The handle as its concrete libuv type.
    @inline(__always)
    final func typed<Handle>(_: Handle.Type) -> UnsafeMutablePointer<Handle> {
        UnsafeMutablePointer<Handle>(OpaquePointer(memory))
    }

    /// Called right after a successful `uv_<type>_init`: libuv's handle now holds a retain on `self`.
    final func adopt() {
        precondition(!adopted, "handle adopted twice")
        adopted = true
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
    }

    /// Starts closing the handle (idempotent). The close callback runs on a later loop iteration.
    final func closeHandle() {
        guard adopted, !closeStarted else { return }
        closeStarted = true
        uv_close(handle, handleOwnerCloseCallback)
    }

    /// Whether libuv counts the handle as active (keeps `uv_run` going when referenced).
    final var isActiveHandle: Bool { adopted && !closed && uv_is_active(handle) != 0 }

    /// Subclass hook, called from the close callback before the memory is freed. Break reference cycles here.
    func didClose() {}

    fileprivate final func finishClose() {
        didClose()
        closed = true
        memory.deallocate()
    }
}

/// The one close callback of every handle: hook, free the memory, drop the retain taken in `adopt()`.
private func handleOwnerCloseCallback(_ handle: UnsafeMutablePointer<uv_handle_t>?) {
    guard let handle, let data = handle.pointee.data else {
        preconditionFailure("closed handle without an owner")
    }
    let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
    let loop: EventLoop
    do {
        let owner = Unmanaged<HandleOwner>.fromOpaque(data).takeRetainedValue()
        loop = owner.eventLoop
        owner.finishClose()  // (the owner, and what it held, may be released at the end of this scope)
    }
    loop.holdEnded(since: start)
}

/// The owner of a handle found by `uv_walk` (nil for handles we did not create).
func handleOwner(of handle: UnsafeMutablePointer<uv_handle_t>) -> HandleOwner? {
    guard let data = handle.pointee.data else { return nil }
    return Unmanaged<HandleOwner>.fromOpaque(data).takeUnretainedValue()
}
