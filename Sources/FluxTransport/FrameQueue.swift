import FluxCore

/// The frames queued for one connection's next write, in order: a growable buffer of `Frame`s that releases them
/// one by one with a specialised loop. (An `[Frame]`'s `removeAll(keepingCapacity:)` destroyed them through the
/// runtime's generic value witnesses on fluxd's hot path; figures in Benchmarks/PROFILE.md.)
///
/// No memory until the first frame is queued (an idle connection costs nothing here). Loop-thread only, like its
/// owner.
struct FrameQueue: ~Copyable {
    private var base: UnsafeMutablePointer<Frame>?
    private var capacity = 0
    /// Frames queued.
    private(set) var count = 0

    init() {}

    deinit {
        guard let base else { return }
        base.deinitialize(count: count)
        base.deallocate()
    }

    var isEmpty: Bool { count == 0 }

    mutating func append(_ frame: Frame) {
        if count == capacity { grow() }
        (base.unsafelyUnwrapped + count).initialize(to: frame)
        count &+= 1
    }

    /// The frame at `index` (`0 ..< count`).
    subscript(index: Int) -> Frame {
        get {
            precondition(index >= 0 && index < count, "FrameQueue index out of range")
            return base.unsafelyUnwrapped[index]
        }
        set {
            precondition(index >= 0 && index < count, "FrameQueue index out of range")
            base.unsafelyUnwrapped[index] = newValue
        }
    }

    /// Releases every frame; keeps the capacity.
    mutating func removeAll() {
        guard let base else { return }
        for i in 0..<count { _ = (base + i).move() }
        count = 0
    }

    /// The frames, in order, as an array (for a write that must keep them alive).
    var array: [Frame] {
        guard let base else { return [] }
        return Array(UnsafeBufferPointer(start: base, count: count))
    }

    private mutating func grow() {
        let newCapacity = Swift.max(16, capacity * 2)
        let new = UnsafeMutablePointer<Frame>.allocate(capacity: newCapacity)
        if let base {
            new.moveInitialize(from: base, count: count)
            base.deallocate()
        }
        base = new
        capacity = newCapacity
    }
}
