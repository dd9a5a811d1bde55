import CLibUV
import FluxCore
import Glibc

/// Receives what happens on a `Connection` (on the loop thread).
public protocol ConnectionDelegate: AnyObject {
    /// A frame (or a framing problem) arrived. Not called any more once a close was requested.
    func connection(_ connection: Connection, received frame: DecodedFrame)
    /// The connection is gone. Called exactly once per connection, from libuv's close callback.
    func connectionClosed(_ connection: Connection, reason: CloseReason)
    /// `accountableBytes` may have changed outside a `send`: after a read left an unfinished frame (or finished
    /// one), when a write the kernel did not take at once started, and when it completed. Not called once a
    /// close was requested.
    func connectionAccountingChanged(_ connection: Connection)
}

extension ConnectionDelegate {
    public func connectionAccountingChanged(_ connection: Connection) {}
}

/// Why a connection closed (the first cause wins).
public enum CloseReason: Equatable, Sendable, CustomStringConvertible {
    /// `close(afterFlush:)` was called.
    case requested
    /// The peer closed its end (EOF).
    case peerClosed
    /// A read or write failed.
    case error(UVError)

    public var description: String {
        switch self {
        case .requested: return "requested"
        case .peerClosed: return "peer closed"
        case .error(let error): return error.description
        }
    }
}

/// Who is at the other end of a Unix socket, as the kernel reports it (`SO_PEERCRED`).
public struct SocketCredentials: Equatable, Sendable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32

    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

/// One accepted Unix-socket connection (`uv_pipe_t`): reads bytes into a `FrameDecoder` and reports frames to its
/// delegate; queues outgoing `Frame`s and writes everything queued in one loop iteration at once, straight from
/// the frames' memory: first with `uv_try_write` (one `writev`, no request, no poll watcher change), and whatever
/// the kernel did not take with a single `uv_write`.
///
/// Backpressure: while that `uv_write` is in flight (the peer is not reading as fast as frames come), new frames
/// stay queued here, and a frame marked `Coalescing.newestWins(key)` replaces the queued one with the same key in
/// place (newest wins, SPEC §8.5): a subscriber that falls behind costs one snapshot per store, not a growing
/// queue. `queuedBytes` tells the owner how far behind the peer is (fluxd closes it above `maxBacklog`).
///
/// Handle lifecycle: created by `PipeListener` for each accepted socket, or by `adopting(descriptor:...)` for a
/// socket the owner already has (the handle holds a retain on this object), reading from then on;
/// `close(afterFlush: true)` stops reading and closes once every queued write completed; `close(afterFlush:
/// false)`, EOF, or a read/write error close at once (writes in flight complete with `UV_ECANCELED`). The
/// delegate hears `connectionClosed` from the close callback, exactly once, after which the handle memory is freed
/// and the delegate released.
///
/// Performance: this object lives on one thread and none of its methods re-enters another while that one is
/// modifying the same property, so its hot stored properties are `@exclusivity(unchecked)`: the runtime's dynamic
/// exclusivity checks were a measurable share of the hot path (figures: Benchmarks/PROFILE.md).
public final class Connection: HandleOwner {
    /// A value for the owner's use (fluxd stores the peer id here). Not used by the transport.
    ///
    /// Computed over a private stored property so that other modules' reads run this module's unchecked access:
    /// a stored property read directly from another module gets a dynamic exclusivity check on every read.
    public var tag: UInt64 {
        get { storedTag }
        set { storedTag = newValue }
    }
    @exclusivity(unchecked) private var storedTag: UInt64 = 0
    /// Who receives frames and the close. Held strongly until the close was reported.
    @exclusivity(unchecked) public var delegate: (any ConnectionDelegate)?
    /// The peer's process credentials, read when the connection was accepted (nil if the kernel would not say).
    public private(set) var credentials: SocketCredentials?

    @exclusivity(unchecked) private var decoder: FrameDecoder
    @exclusivity(unchecked) private var pending = FrameQueue()
    /// Coalescing key -> index in `pending` of the queued frame a newer one with that key replaces.
    @exclusivity(unchecked) private var replaceable: [UInt32: Int] = [:]
    @exclusivity(unchecked) private var pendingBytes = 0
    @exclusivity(unchecked) private var inFlightBytes = 0
    @exclusivity(unchecked) private var writesInFlight = 0
    @exclusivity(unchecked) private var isDirty = false
    @exclusivity(unchecked) private var phase = Phase.open
    @exclusivity(unchecked) private var closeReason: CloseReason?

    private enum Phase {
        /// Reading and writing.
        case open
        /// Not reading; closes when the last write completes.
        case draining
        /// `uv_close` called (or about to be).
        case closing
    }

    init(loop: EventLoop, maxFrame: UInt32) {
        decoder = FrameDecoder(maxFrame: maxFrame)
        super.init(loop: loop, handleType: uv_pipe_t.self)
        uvMust(uv_pipe_init(loop.loop, typed(uv_pipe_t.self), 0), "uv_pipe_init")
        adopt()
    }

    /// Wraps `descriptor`, a connected Unix stream socket the caller already holds, in a connection that reads
    /// from the next loop iteration on (its frames go to `delegate`, which may also be set afterwards, before the
    /// loop runs again). `PipeListener` makes every accepted connection this way; tests wrap one end of a
    /// `socketpair(2)` to drive a connection without a listener or a daemon.
    ///
    /// The connection owns the descriptor from this call on, whatever the outcome: it is closed with the
    /// connection, or at once when this throws (`uv_pipe_open` or `uv_read_start` failed; nothing is left open
    /// then: the handle closes on the next loop iteration). Loop thread only.
    public static func adopting(descriptor: Int32, loop: EventLoop, maxFrame: UInt32,
                                delegate: (any ConnectionDelegate)? = nil) throws(TransportError) -> Connection {
        let connection = Connection(loop: loop, maxFrame: maxFrame)
        let rc = uv_pipe_open(connection.typed(uv_pipe_t.self), descriptor)
        if rc < 0 {
            Glibc.close(descriptor)
            connection.close(afterFlush: false)
            throw .uv(UVError(code: rc, operation: "uv_pipe_open"))
        }
        connection.delegate = delegate
        do {
            try connection.startReading()
        } catch {
            connection.delegate = nil
            connection.close(afterFlush: false)
            throw error
        }
        return connection
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { UnsafeMutablePointer(OpaquePointer(handle)) }

    /// Bytes queued and not yet written by the kernel (frames pending plus writes in flight).
    public var queuedBytes: Int { pendingBytes + inFlightBytes }

    /// The bytes this connection holds that its owner accounts for: the unfinished frame being read, and the
    /// frames the kernel has not taken while a write is in flight (frames queued within one loop iteration are
    /// written at its end and not counted).
    public var accountableBytes: Int {
        decoder.bufferedByteCount + (writesInFlight > 0 ? pendingBytes + inFlightBytes : 0)
    }

    /// For the owner's use: the `accountableBytes` it last accounted for (fluxd's memory budget). While it is not
    /// 0, the connection reports every change of `accountableBytes` (`connectionAccountingChanged`).
    public var accounted: Int {
        get { storedAccounted }
        set { storedAccounted = newValue }
    }
    @exclusivity(unchecked) private var storedAccounted = 0

    /// Whether a close was requested or happened (no more frames are delivered; sends are dropped).
    public var isClosing: Bool { phase != .open }

    /// Queues `frame`; it goes out with everything else queued for this connection in this loop iteration, or
    /// once the write in flight completes. Returns false (and drops the frame) when the connection is closing.
    ///
    /// While a write is in flight, a `.newestWins(key)` frame takes the place of the queued frame with the same
    /// key, if any (and no `.fence(key)` frame was queued since).
    @discardableResult
    public func send(_ frame: Frame) -> Bool {
        guard phase == .open else { return false }
        switch frame.coalescing {
        case .none:
            break
        case .newestWins(let key):
            // Only a connection that is behind keeps frames queued past this iteration; the others skip the map.
            if writesInFlight > 0 {
                if let index = replaceable[key] {
                    pendingBytes += frame.bytes.count - pending[index].bytes.count
                    pending[index] = frame
                    return true
                }
                replaceable[key] = pending.count
            }
        case .fence(let key):
            if !replaceable.isEmpty { replaceable.removeValue(forKey: key) }
        }
        pending.append(frame)
        pendingBytes += frame.bytes.count
        if !isDirty && writesInFlight == 0 {
            isDirty = true
            eventLoop.markDirty(self)
        }
        return true
    }

    /// Drops every queued frame not yet handed to the kernel (a write in flight completes). For a peer about to
    /// be closed as a slow consumer: what is sent after this goes out right after the write in flight.
    public func discardQueued() {
        dropPending()
        replaceable.removeAll()
        pendingBytes = 0
    }

    /// The most frames one write takes (see `flush`): IOV_MAX, what one `writev` takes anyway.
    static let maxFramesPerWrite = 1024

    /// Frames above which dropping a queue is left to another thread (`EventLoop.releaseElsewhere`): releasing
    /// 64 MiB of small frames one by one held the loop for tens of milliseconds.
    static let releaseElsewhereAbove = 1024

    /// Drops every pending frame: a long queue is released off the loop thread.
    private func dropPending() {
        if pending.count > Self.releaseElsewhereAbove {
            eventLoop.release(pending.take())
        } else {
            pending.removeAll()
        }
    }

    /// Closes the connection. With `afterFlush`, stops reading and closes once every frame queued so far has been
    /// written; without, closes now (queued frames are dropped). Idempotent; a later `afterFlush: false` cuts a
    /// drain short.
    public func close(afterFlush: Bool = true) {
        if closeReason == nil { closeReason = .requested }
        switch phase {
        case .closing:
            return
        case .open:
            if afterFlush {
                phase = .draining
                uvMust(uv_read_stop(stream), "uv_read_stop")
                closeIfDrained()
            } else {
                closeNow()
            }
        case .draining:
            if !afterFlush { closeNow() }
        }
    }

    // MARK: - Internal

    /// Called by `adopting(descriptor:...)` right after `uv_pipe_open`.
    private func startReading() throws(TransportError) {
        credentials = readPeerCredentials()
        try uvCheck(uv_read_start(stream, connectionAlloc, connectionRead), "uv_read_start")
    }

    /// Frames handled from one read before what they produced is written out. Everything one loop iteration
    /// produces goes out in one write per connection; only a very long read (64 KiB holds ~500 small frames) is
    /// routed in slices, so the receivers start on its first frames while fluxd routes the rest. (Smaller slices
    /// cost more in `writev`s and wake-ups than the overlap gained once routing was fast; the measurements are
    /// in Benchmarks/PROFILE.md.)
    static let framesPerFlush = 256
    /// ... but only once those frames make writes of this many frames on average (a slice that fans out to many
    /// connections waits for more, since every connection written costs a syscall).
    static let framesPerWrite = 8

    /// Frames one connection may have handled per turn (one read, or one resumed turn) before the loop serves
    /// the others: a peer that pipelines a flood of cheap-to-refuse frames (thousands in one 64 KiB read) waits
    /// for its next turn instead of holding the loop for milliseconds while other peers' frames wait.
    static let framesPerTurn = 512
    /// ... or frames handled for `EventLoop.turnNanoseconds`, counted from the start of the read (or of the resumed
    /// turn) and checked every `turnCheckEvery` frames (a tick-counter read: a few cycles).
    static let turnCheckEvery = 4

    /// Whether a turn that has handled `inTurn` frames since `start` (an `EventLoop.clock()` reading) is over.
    @inline(__always)
    static func turnOver(_ inTurn: Int, since start: UInt64, budget: UInt64) -> Bool {
        if inTurn >= framesPerTurn { return true }
        guard inTurn % turnCheckEvery == 0 else { return false }
        return EventLoop.clock() &- start >= budget
    }

    /// Whether reading is paused until the loop gives this connection its next turn (`resumeTurn`).
    @exclusivity(unchecked) private var pausedForTurn = false

    fileprivate func received(_ bytes: UnsafeRawBufferPointer) {
        guard phase == .open else { return }
        let start = EventLoop.clock()
        var offset = 0
        var handled = 0
        var inTurn = 0
        // The delegate once per read, not once per frame (a retain and a release each; issue 27): it changes only
        // when the connection is made or closed, and a closed connection stops this loop.
        let delegate = self.delegate
        while phase == .open, let frame = decoder.next(from: bytes, at: &offset) {
            delegate?.connection(self, received: frame)
            handled += 1
            inTurn += 1
            if handled >= Connection.framesPerFlush && handled >= Connection.framesPerWrite * eventLoop.dirtyCount {
                handled = 0
                eventLoop.flushDirty()
            }
            if offset < bytes.count && Connection.turnOver(inTurn, since: start, budget: eventLoop.turnTicks) && phase == .open {
                // Its turn is over: keep the rest of this read and stop reading until the loop comes back to it.
                decoder.append(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
                offset = bytes.count
                pauseForTurn()
                // Not another frame from what was kept: `next(from:at:)` would take it from the decoder's buffer.
                break
            }
        }
        // An unfinished frame now, or one accounted before: the owner accounts for the change.
        if phase == .open && (decoder.bufferedByteCount != 0 || storedAccounted != 0) {
            delegate?.connectionAccountingChanged(self)
        }
        withLoop { $0.holdEnded(since: start) }
    }

    private func pauseForTurn() {
        guard !pausedForTurn else { return }
        pausedForTurn = true
        uvMust(uv_read_stop(stream), "uv_read_stop")
        eventLoop.waitForTurn(self)
    }

    /// The loop's next turn for a connection that was paused (`framesPerTurn`): handles up to that many of the
    /// frames it kept, and reads again once they are all handled. Returns whether it needs another turn.
    func resumeTurn() -> Bool {
        guard pausedForTurn else { return false }
        guard phase == .open else {
            pausedForTurn = false
            return false
        }
        let start = EventLoop.clock()
        defer { eventLoop.holdEnded(since: start) }
        var inTurn = 0
        let delegate = self.delegate  // (once per turn, as in `received`)
        while phase == .open, let frame = decoder.next() {
            delegate?.connection(self, received: frame)
            inTurn += 1
            if Connection.turnOver(inTurn, since: start, budget: eventLoop.turnTicks) { return phase == .open }
        }
        pausedForTurn = false
        guard phase == .open else { return false }
        uvMust(uv_read_start(stream, connectionAlloc, connectionRead), "uv_read_start")
        if decoder.bufferedByteCount != 0 || storedAccounted != 0 { delegate?.connectionAccountingChanged(self) }
        return false
    }

    fileprivate func readFailed(_ status: Int) {
        if status == Int(uvEOF) {
            if closeReason == nil { closeReason = .peerClosed }
            // The peer may only have shut down its writing side: let what is queued go out, then close.
            if phase == .open {
                phase = .draining
                uvMust(uv_read_stop(stream), "uv_read_stop")
                closeIfDrained()
            }
        } else {
            if closeReason == nil { closeReason = .error(UVError(code: Int32(status), operation: "read")) }
            closeNow()
        }
    }

    /// Writes every pending frame (called by the loop once per iteration, and again after a write in flight
    /// completed). Tries one synchronous `uv_try_write` of all of them first; if the kernel took everything the
    /// write is done (no request, no watcher re-arm). The rest goes out with one `uv_write`, whose request keeps
    /// the frames alive until its callback; until then further frames stay queued (and may be coalesced).
    func flush() {
        isDirty = false
        guard phase != .closing, !pending.isEmpty, writesInFlight == 0 else { return }
        // At most `maxFramesPerWrite` frames a write: the work of one flush (iovecs, retains, releases) stays
        // bounded however far behind the peer is (a write of 450,000 queued frames held the loop 25 ms); the rest
        // goes out in the next iterations.
        let count = min(pending.count, Self.maxFramesPerWrite)
        var total = pendingBytes
        if count < pending.count {
            total = 0
            for i in 0..<count { total &+= pending.bytes(at: i).count }
        }
        var request: WriteRequest?
        // > 0: bytes left for `uv_write` (request made); 0: all written by `uv_try_write`; < 0: a libuv error.
        let rc = withUnsafeTemporaryAllocation(of: uv_buf_t.self, capacity: count) { bufs -> Int in
            for i in 0..<count {
                let bytes = pending.bytes(at: i)  // (kept alive by the queue, then by the request)
                let base = UnsafeMutableRawPointer(mutating: bytes.baseAddress!)
                bufs[i] = uv_buf_init(base.assumingMemoryBound(to: CChar.self), UInt32(bytes.count))
            }
            var first = 0
            var remaining = total
            let written = uv_try_write(stream, bufs.baseAddress, UInt32(count))
            if written < 0 {
                if written != Int32(UV_EAGAIN.rawValue) { return Int(written) }
            } else {
                remaining -= Int(written)
                if remaining == 0 { return 0 }
                // Skip what the kernel took: whole frames, then a prefix of the first one left.
                var skip = Int(written)
                while skip >= Int(bufs[first].len) {
                    skip -= Int(bufs[first].len)
                    first += 1
                }
                bufs[first].base = bufs[first].base! + skip
                bufs[first].len -= skip
            }
            let made = WriteRequest.make(frames: pending.prefix(count), byteCount: remaining)
            request = made
            // libuv copies the uv_buf_t array; the frames themselves stay alive in the request.
            let status = uv_write(made.uvRequest, stream, bufs.baseAddress! + first, UInt32(count - first),
                                  connectionWritten)
            return status < 0 ? Int(status) : remaining
        }
        let left = pending.count - count
        if left == 0 {
            pending.removeAll()
            if !replaceable.isEmpty { replaceable.removeAll(keepingCapacity: true) }
            pendingBytes = 0
        } else {
            pending.removeFirst(count)
            pendingBytes -= total
            if !replaceable.isEmpty {
                // Coalescing keys point into what is left (those written are no longer replaceable).
                var kept: [UInt32: Int] = [:]
                for (key, index) in replaceable where index >= count { kept[key] = index - count }
                replaceable = kept
            }
        }
        if rc < 0 {
            if let request {
                // The callback will not run: release the request here.
                Unmanaged.passUnretained(request).release()
            }
            let operation = request == nil ? "write" : "uv_write"
            if closeReason == nil { closeReason = .error(UVError(code: Int32(rc), operation: operation)) }
            closeNow()
        } else if rc == 0 {
            if left > 0 {
                isDirty = true
                eventLoop.markDirty(self)  // the rest in the next iteration's flush
            } else if phase == .draining {
                closeIfDrained()
            }
        } else {
            writesInFlight += 1
            inFlightBytes += rc
            if phase == .open { delegate?.connectionAccountingChanged(self) }
        }
    }

    fileprivate func written(byteCount: Int, status: Int32) {
        writesInFlight -= 1
        inFlightBytes -= byteCount
        if phase == .open && storedAccounted != 0 { delegate?.connectionAccountingChanged(self) }
        if status < 0 && status != uvECANCELED {
            if closeReason == nil { closeReason = .error(UVError(code: status, operation: "write")) }
            closeNow()
        } else if !pending.isEmpty {
            // What queued up behind this write goes out in this iteration's flush.
            if !isDirty && phase != .closing {
                isDirty = true
                eventLoop.markDirty(self)
            }
        } else if phase == .draining {
            closeIfDrained()
        }
    }

    private func closeIfDrained() {
        if pending.isEmpty && writesInFlight == 0 { closeNow() }
    }

    private func closeNow() {
        guard phase != .closing else { return }
        phase = .closing
        dropPending()
        replaceable.removeAll()
        pendingBytes = 0
        closeHandle()
    }

    override func didClose() {
        let reason = closeReason ?? .requested
        let delegate = self.delegate
        self.delegate = nil
        delegate?.connectionClosed(self, reason: reason)
    }

    private func readPeerCredentials() -> SocketCredentials? {
        var fd = uv_os_fd_t()
        guard uv_fileno(handle, &fd) == 0 else { return nil }
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (not visible to Swift without _GNU_SOURCE)
        var cred: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: cred))
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0,
              Int(length) == MemoryLayout.size(ofValue: cred) else { return nil }
        return SocketCredentials(pid: cred.0, uid: cred.1, gid: cred.2)
    }
}

/// One `uv_write_t` and the frames it writes, in a single allocation (the request is tail-allocated). Retained
/// through `req->data` from `uv_write` until the write callback, which also runs on `UV_ECANCELED`.
final class WriteRequest: ManagedBuffer<WriteRequest.Header, uv_write_t> {
    struct Header {
        let frames: [Frame]
        let byteCount: Int
    }

    static func make(frames: [Frame], byteCount: Int) -> WriteRequest {
        let buffer = WriteRequest.create(minimumCapacity: 1) { _ in Header(frames: frames, byteCount: byteCount) }
        let request = unsafeDowncast(buffer, to: WriteRequest.self)
        request.uvRequest.pointee.data = Unmanaged.passRetained(request).toOpaque()
        return request
    }

    /// The tail-allocated request; its address is stable for the object's lifetime.
    var uvRequest: UnsafeMutablePointer<uv_write_t> { withUnsafeMutablePointerToElements { $0 } }
}

private func connectionAlloc(_ handle: UnsafeMutablePointer<uv_handle_t>?, _ suggested: Int,
                             _ buf: UnsafeMutablePointer<uv_buf_t>?) {
    // The loop's shared read buffer (see EventLoop.init): every read is consumed before the next alloc.
    let base = handle!.pointee.loop.pointee.data!.assumingMemoryBound(to: CChar.self)
    buf!.pointee = uv_buf_init(base, UInt32(EventLoop.readBufferSize))
}

private func connectionRead(_ stream: UnsafeMutablePointer<uv_stream_t>?, _ nread: Int,
                            _ buf: UnsafePointer<uv_buf_t>?) {
    // (At +0: `handle->data` holds the connection until its close callback, which runs after this one returns.)
    let owner = Unmanaged<Connection>.fromOpaque(stream!.pointee.data)
    if nread > 0 {
        owner._withUnsafeGuaranteedRef { $0.received(UnsafeRawBufferPointer(start: buf!.pointee.base, count: nread)) }
    } else if nread < 0 {
        let connection = owner.takeUnretainedValue()
        let start = EventLoop.clock()  // (`received` measures its own hold)
        connection.readFailed(nread)
        connection.eventLoop.holdEnded(since: start)
    }
}

private func connectionWritten(_ req: UnsafeMutablePointer<uv_write_t>?, _ status: Int32) {
    let request = Unmanaged<WriteRequest>.fromOpaque(req!.pointee.data).takeRetainedValue()
    // Write callbacks (also UV_ECANCELED ones) run before the handle's close callback: the owner is still there.
    let connection = Unmanaged<Connection>.fromOpaque(req!.pointee.handle.pointee.data).takeUnretainedValue()
    let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
    connection.written(byteCount: request.header.byteCount, status: status)
    connection.eventLoop.holdEnded(since: start)
}
