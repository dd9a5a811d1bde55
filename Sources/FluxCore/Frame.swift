#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// One complete, immutable wire frame: the 4-byte big-endian length prefix followed by the JSON body.
///
/// A `Frame` is encoded once and may be written to any number of connections: the transport writes straight
/// from `bytes` (its address never changes) and keeps the frame alive until the write completes. This is what
/// lets fluxd broadcast one snapshot to a thousand subscribers without copying it. Copies of a `Frame` share the
/// same bytes (it is a reference to one allocation that holds a small header and the bytes).
public struct Frame: @unchecked Sendable {
    // @unchecked: the storage is written only while the frame is built (`FrameBuilder`, `init(body:)`) and is
    // immutable once a `Frame` exists.
    let storage: FrameStorage

    init(storage: FrameStorage) {
        self.storage = storage
    }

    /// Frames `body` (a JSON object's bytes) by copying it behind a length prefix.
    public init<Body: Collection>(body: Body) where Body.Element == UInt8 {
        let total = 4 + body.count
        let storage = FrameStorage.allocate(capacity: total)
        storage.withUnsafeMutablePointers { header, elements in
            let buffer = UnsafeMutableRawBufferPointer(start: elements, count: total)
            storeBigEndianLength(UInt32(body.count), into: buffer)
            UnsafeMutableRawBufferPointer(rebasing: buffer[4...]).copyBytes(from: body)
            header.pointee.count = total
        }
        self.storage = storage
    }

    /// The whole frame, length prefix included.
    ///
    /// The memory lives only as long as this `Frame` (or a copy of it): keep the frame alive while the pointer is
    /// in use (the transport holds it until the write completes). To copy the bytes out, use `wireBytes` or
    /// `bodyArray`, never `Array(someTemporary().bytes)`, where Swift may release the frame before the copy.
    public var bytes: UnsafeRawBufferPointer {
        storage.withUnsafeMutablePointers { header, elements in
            UnsafeRawBufferPointer(start: elements, count: header.pointee.count)
        }
    }

    /// Whether a later frame may take this one's place while it waits, unwritten, in a connection's queue.
    public var coalescing: Coalescing {
        // Through the header's pointer: `ManagedBuffer.header` is checked for exclusive access at run time.
        storage.withUnsafeMutablePointerToHeader { $0.pointee.coalescing }
    }

    /// The JSON body, without the length prefix.
    public var body: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: bytes[4...]) }

    /// A copy of the whole frame, length prefix included (safe on a temporary frame).
    public var wireBytes: [UInt8] { withExtendedLifetime(storage) { Array(bytes) } }

    /// The body as an array (for tests and tools; the hot path uses `bytes`).
    public var bodyArray: [UInt8] { withExtendedLifetime(storage) { Array(body) } }

    /// The body as a string (for tests, logs and tools).
    public var text: String { withExtendedLifetime(storage) { String(decoding: body, as: UTF8.self) } }
}

/// A frame's one allocation: its header (bytes written, coalescing) followed by the bytes themselves.
@usableFromInline
final class FrameStorage: ManagedBuffer<FrameHeader, UInt8> {
    /// Room for `capacity` bytes, none written yet.
    @usableFromInline
    static func allocate(capacity: Int) -> FrameStorage {
        let buffer = FrameStorage.create(minimumCapacity: capacity) { _ in FrameHeader(count: 0, coalescing: .none) }
        return unsafeDowncast(buffer, to: FrameStorage.self)
    }

    /// Where the bytes start (stable for the object's life).
    @usableFromInline
    var elements: UnsafeMutablePointer<UInt8> { withUnsafeMutablePointerToElements { $0 } }
}

/// What a frame's storage records besides its bytes.
@usableFromInline
struct FrameHeader {
    var count: Int
    var coalescing: Coalescing
}

/// How a queued frame relates to frames queued after it on the same connection ("newest wins", SPEC §8.5).
///
/// A transport that cannot write to a connection as fast as frames are produced for it keeps them queued; a frame
/// marked `.newestWins(key)` then replaces the queued, still unwritten frame with the same key in place (same
/// position, so the order relative to every other frame is kept), unless a `.fence(key)` frame was queued after
/// it. fluxd keys a store's snapshots by the store, and fences them with the frames that change what a
/// subscription means (`subscribed`, `unsubscribed`, `store-up`, `store-down`).
public enum Coalescing: Sendable, Equatable {
    /// Always written.
    case none
    /// Supersedes the queued, unwritten frame with the same key (when there is one and no fence since).
    case newestWins(key: UInt32)
    /// Always written; frames with this key queued before it can no longer be superseded.
    case fence(key: UInt32)
}

@inline(__always)
func storeBigEndianLength(_ length: UInt32, into buffer: UnsafeMutableRawBufferPointer) {
    buffer[0] = UInt8(truncatingIfNeeded: length >> 24)
    buffer[1] = UInt8(truncatingIfNeeded: length >> 16)
    buffer[2] = UInt8(truncatingIfNeeded: length >> 8)
    buffer[3] = UInt8(truncatingIfNeeded: length)
}

/// Frames `body` into a fresh byte array (length prefix + body); used by clients that write with plain `write(2)`.
public func encodeFrame<Body: Collection>(_ body: Body) -> [UInt8] where Body.Element == UInt8 {
    let n = UInt32(body.count)
    var out: [UInt8] = [UInt8(truncatingIfNeeded: n >> 24), UInt8(truncatingIfNeeded: n >> 16),
                        UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n)]
    out.reserveCapacity(4 + body.count)
    out.append(contentsOf: body)
    return out
}

/// Whether two byte sequences are equal (`memcmp`, not an element-by-element generic comparison).
public func sameBytes(_ a: UnsafeRawBufferPointer, _ b: ArraySlice<UInt8>) -> Bool {
    guard a.count == b.count else { return false }
    guard a.count > 0 else { return true }
    return b.withUnsafeBytes { memcmp(a.baseAddress!, $0.baseAddress!, a.count) == 0 }
}

/// Whether two byte sequences are equal.
public func sameBytes(_ a: [UInt8], _ b: ArraySlice<UInt8>) -> Bool {
    a.withUnsafeBytes { sameBytes($0, b) }
}

/// Whether `a` sorts before `b` byte by byte (a prefix first), as `lexicographicallyPrecedes` would say, with one
/// `memcmp` instead of a generic element-by-element loop.
public func bytesPrecede(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    let n = min(a.count, b.count)
    if n > 0 {
        let c = a.withUnsafeBytes { x in b.withUnsafeBytes { y in memcmp(x.baseAddress!, y.baseAddress!, n) } }
        if c != 0 { return c < 0 }
    }
    return a.count < b.count
}
