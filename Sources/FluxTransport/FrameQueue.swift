import FluxCore

/// The frames queued for one connection's next write, in order: a growable buffer of `Frame`s that releases them
/// one by one with a specialised loop. (An `[Frame]`'s `removeAll(keepingCapacity:)` destroyed them through the
/// runtime's generic value witnesses on fluxd's hot path; figures in Benchmarks/PROFILE.md.) Frames live at
/// `base[head ..< end]`: a write takes a bounded prefix (`removeFirst`) without moving the rest.
///
/// No memory until the first frame is queued (an idle connection costs nothing here). Loop-thread only, like its
/// owner.
struct FrameQueue: ~Copyable {
    private var base: UnsafeMutablePointer<Frame>?
    private var capacity = 0
    private var head = 0
    private var end = 0

    init() {}

    deinit {
        guard let base else { return }
        (base + head).deinitialize(count: end - head)
        base.deallocate()
    }

    /// Frames queued.
    var count: Int { end &- head }
    var isEmpty: Bool { end == head }

    mutating func append(_ frame: Frame) {
        if end == capacity { makeRoom() }
        (base.unsafelyUnwrapped + end).initialize(to: frame)
        end &+= 1
    }

    /// The frame at `index` (`0 ..< count`).
    subscript(index: Int) -> Frame {
        get {
            precondition(index >= 0 && index < count, "FrameQueue index out of range")
            return base.unsafelyUnwrapped[head &+ index]
        }
        set {
            precondition(index >= 0 && index < count, "FrameQueue index out of range")
            base.unsafelyUnwrapped[head &+ index] = newValue
        }
    }

    /// The wire bytes of the frame at `index` (`0 ..< count`), read in place: no copy of the frame, so no retain
    /// and release of its storage (a write's iovecs; issue 27). Valid while the frame stays queued.
    @inline(__always)
    func bytes(at index: Int) -> UnsafeRawBufferPointer {
        precondition(index >= 0 && index < count, "FrameQueue index out of range")
        return (base.unsafelyUnwrapped + (head &+ index)).pointee.bytes
    }

    /// Releases every frame; keeps the capacity.
    mutating func removeAll() {
        guard let base else { return }
        for i in head..<end { _ = (base + i).move() }
        head = 0
        end = 0
    }

    /// Releases the first `k` frames (`k <= count`).
    mutating func removeFirst(_ k: Int) {
        precondition(k >= 0 && k <= count, "FrameQueue.removeFirst out of range")
        guard k > 0, let base else { return }
        for i in head..<(head &+ k) { _ = (base + i).move() }
        head &+= k
        if head == end { head = 0; end = 0 }
    }

    /// Hands over every frame, leaving the queue empty with no storage: the batch releases them when it goes (on
    /// whichever thread drops it last).
    mutating func take() -> FrameBatch {
        let batch = FrameBatch(base: base, start: head, count: count)
        base = nil
        capacity = 0
        head = 0
        end = 0
        return batch
    }

    /// The first `n` frames, in order, as an array (for a write that must keep them alive).
    func prefix(_ n: Int) -> [Frame] {
        guard let base, n > 0 else { return [] }
        return Array(UnsafeBufferPointer(start: base + head, count: Swift.min(n, count)))
    }

    /// Room for one more at `end`: the live frames moved to the front when at least half the buffer is free
    /// there, else a buffer twice the size.
    private mutating func makeRoom() {
        if let base, head > 0, head >= capacity / 2 {
            let n = count
            base.moveInitialize(from: base + head, count: n)
            head = 0
            end = n
            return
        }
        let newCapacity = Swift.max(16, capacity * 2)
        let new = UnsafeMutablePointer<Frame>.allocate(capacity: newCapacity)
        if let base {
            new.moveInitialize(from: base + head, count: count)
            base.deallocate()
        }
        end = count
        head = 0
        base = new
        capacity = newCapacity
    }
}

/// Frames taken out of a `FrameQueue`, released (with their storage) when the batch is. Sendable: frames are
/// immutable once queued and their reference counts are atomic, so the batch may be dropped on another thread.
final class FrameBatch: @unchecked Sendable {
    private let base: UnsafeMutablePointer<Frame>?
    private let start: Int
    let count: Int

    init(base: UnsafeMutablePointer<Frame>?, start: Int, count: Int) {
        self.base = base
        self.start = start
        self.count = count
    }

    deinit {
        guard let base else { return }
        (base + start).deinitialize(count: count)
        base.deallocate()
    }
}
