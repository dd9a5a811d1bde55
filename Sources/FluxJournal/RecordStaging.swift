import CFluxSys
#if canImport(Glibc)
import Glibc
#endif

// The journal's hot path (issue 27): a record is encoded straight into the segment writer's staging bytes, in the
// open batch (format version 4: the records of one write share one frame and one checksum, taken when the batch is
// written), its length computed first, the fields stored through a pointer, numbers and lengths fixed-width. No
// growable-array appends per field (each paid a uniqueness check and a generic copy), no closure, no copy of a
// payload or state beyond the one into the staging bytes. The bytes are exactly `RecordEncoder`'s (the format of
// docs/journal.md), which `RecordStagingTests` checks field by field against it.

/// Bytes staged for one `write`: a buffer that grows by doubling and is kept between writes (its memory is
/// freed when the writer goes).
final class StagingBuffer {
    private(set) var base: UnsafeMutablePointer<UInt8>
    private(set) var capacity: Int
    /// Bytes staged.
    var count = 0

    init(capacity: Int = 64 << 10) {
        self.capacity = capacity
        base = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
    }

    deinit { base.deallocate() }

    /// Room for `n` more bytes; returns where they go.
    @inline(__always)
    func reserve(_ n: Int) -> UnsafeMutablePointer<UInt8> {
        if count + n > capacity { grow(count + n) }
        return base + count
    }

    private func grow(_ needed: Int) {
        var newCapacity = capacity * 2
        while newCapacity < needed { newCapacity *= 2 }
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: newCapacity)
        bigger.update(from: base, count: count)
        base.deallocate()
        base = bigger
        capacity = newCapacity
    }

    /// Forgets what is staged; a buffer grown far past the usual (a large state) goes back to its first size.
    func removeAll() {
        count = 0
        if capacity > 4 << 20 {
            base.deallocate()
            capacity = 64 << 10
            base = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        }
    }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }
}

/// Where the next field of a record goes (`SegmentWriter.stageRecord`).
struct RecordCursor {
    var at: UnsafeMutablePointer<UInt8>

    @inline(__always)
    mutating func byte(_ b: UInt8) {
        at.pointee = b
        at += 1
    }

    @inline(__always)
    mutating func varint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            at.pointee = UInt8(truncatingIfNeeded: v) | 0x80
            at += 1
            v >>= 7
        }
        at.pointee = UInt8(v)
        at += 1
    }

    @inline(__always)
    mutating func bytes(_ b: ArraySlice<UInt8>) {
        varint(UInt64(b.count))
        b.withUnsafeBufferPointer { source in
            if let s = source.baseAddress { at.update(from: s, count: source.count) }
        }
        at += b.count
    }

    @inline(__always)
    mutating func string(_ s: String) {
        var s = s
        s.withUTF8 { source in
            varint(UInt64(source.count))
            if let b = source.baseAddress { at.update(from: b, count: source.count) }
            at += source.count
        }
    }

    @inline(__always)
    mutating func u64(_ v: UInt64) {
        UnsafeMutableRawPointer(at).storeBytes(of: v.littleEndian, as: UInt64.self)
        at += 8
    }

    @inline(__always)
    mutating func u32(_ v: UInt32) {
        UnsafeMutableRawPointer(at).storeBytes(of: v.littleEndian, as: UInt32.self)
        at += 4
    }

    /// A byte string with a `u32` length (format version 4's fixed-width records).
    @inline(__always)
    mutating func fixed(_ b: ArraySlice<UInt8>) {
        u32(UInt32(truncatingIfNeeded: b.count))
        b.withUnsafeBufferPointer { source in
            if let s = source.baseAddress { at.update(from: s, count: source.count) }
        }
        at += b.count
    }

    /// Bytes encoded before (`JournalName`, `JournalNameList`), copied as they are.
    @inline(__always)
    mutating func encoded(_ b: [UInt8]) {
        b.withUnsafeBufferPointer { source in
            if let s = source.baseAddress { at.update(from: s, count: source.count) }
        }
        at += b.count
    }
}

/// A store's name as journal records hold it (its UTF-8 length as a varint, then its UTF-8), encoded once per
/// store: the records of the hot path copy these bytes instead of encoding a `String` each time (issue 27).
public struct JournalName: Sendable, Hashable, CustomStringConvertible {
    /// The field's bytes, as `RecordEncoder.string` writes the name.
    public let encoded: [UInt8]

    public init(_ name: String) {
        var bytes: [UInt8] = []
        RecordEncoder.string(name, &bytes)
        encoded = bytes
    }

    /// The name.
    public var string: String {
        var d = RecordDecoder(buffer: encoded, at: 0, end: encoded.count)
        return (try? d.string()) ?? ""
    }

    public var description: String { string }
}

/// An action record's target stores as the record holds them (their count as a varint, then each name as
/// `JournalName` encodes it), encoded once per route rather than once per dispatch (issue 27).
public struct JournalNameList: Sendable, Hashable {
    /// The field's bytes, as `RecordEncoder.action` writes the targets.
    public let encoded: [UInt8]
    /// How many names.
    public let count: Int

    public init(_ names: [String]) {
        var bytes: [UInt8] = []
        RecordEncoder.varint(UInt64(names.count), &bytes)
        for n in names { RecordEncoder.string(n, &bytes) }
        encoded = bytes
        count = names.count
    }

    /// The names.
    public var strings: [String] {
        var d = RecordDecoder(buffer: encoded, at: 0, end: encoded.count)
        return (try? d.strings()) ?? []
    }
}

/// The size of a field as `RecordCursor` writes it.
enum FieldSize {
    @inline(__always)
    static func varint(_ value: UInt64) -> Int {
        // 1 byte per 7 bits, at least 1.
        (64 - (value | 1).leadingZeroBitCount + 6) / 7
    }

    @inline(__always)
    static func bytes(_ n: Int) -> Int { varint(UInt64(n)) + n }

    @inline(__always)
    static func string(_ s: String) -> Int { bytes(s.utf8.count) }
}

/// The most bytes of records one batch gathers before another starts (a record larger than that has a batch of its
/// own): one checksum per batch, and a torn batch loses at most what one write held.
let batchBodyLimit = 1 << 20

extension SegmentWriter {
    /// Stages one record whose body is `bodyLength` bytes that `fill` writes (exactly that many) in the open batch
    /// (opened here when there is none, or when this record would take it past `batchBodyLimit`), as its `u32`
    /// length and body. Returns the bytes it added (a batch's header included).
    @inline(__always)
    func stageInBatch(bodyLength: Int, _ fill: (inout RecordCursor) -> Void) -> Int {
        precondition(bodyLength <= maxRecordBytes - 5, "journal record of \(bodyLength) bytes")
        var added = 4 + bodyLength
        if batchStart < 0 || buffer.count - batchStart + added > batchBodyLimit {
            added += openBatch()
        }
        let start = buffer.reserve(4 + bodyLength)
        UnsafeMutableRawPointer(start).storeBytes(of: UInt32(truncatingIfNeeded: bodyLength).littleEndian, as: UInt32.self)
        var cursor = RecordCursor(at: start + 4)
        fill(&cursor)
        assert(cursor.at == start + 4 + bodyLength, "a record's fields did not fill its computed length")
        buffer.count += 4 + bodyLength
        lastState = -1
        return added
    }

    /// Seals the open batch (if any) and starts a new one; returns its header's bytes.
    private func openBatch() -> Int {
        sealBatch()
        let header = buffer.reserve(recordHeaderSize + 1)
        header[recordHeaderSize] = RecordKind.batch.rawValue
        batchStart = buffer.count
        buffer.count += recordHeaderSize + 1
        stagedCount += 1
        return recordHeaderSize + 1
    }

    /// Frames the open batch: its length and the two checksums in its header. Nothing is added to it after.
    func sealBatch() {
        guard batchStart >= 0 else { return }
        cfluxsys_seal_record(buffer.base + batchStart, UInt32(buffer.count - batchStart - recordHeaderSize))
        batchStart = -1
        lastState = -1
    }

    // MARK: - The records of the hot path (format version 4; the same bytes as `RecordEncoder`'s)

    /// An accepted action (`RecordEncoder.actionFixed`).
    func stageAction(seq: UInt64, time: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?,
                     id: ArraySlice<UInt8>?, session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>,
                     targets: JournalNameList) -> Int {
        var length = 2 + 24 + 4 + typeJSON.count + 4 + payload.count + targets.encoded.count
        var flags: UInt8 = 0
        if cause != nil { flags |= RecordEncoder.hasCause; length += 8 }
        if let id { flags |= RecordEncoder.hasID; length += 4 + id.count }
        if let session { flags |= RecordEncoder.hasSession; length += 8 + session.count }
        return stageInBatch(bodyLength: length) { c in
            c.byte(RecordKind.actionFixed.rawValue)
            c.byte(flags)
            c.u64(seq)
            c.u64(time)
            c.u64(origin)
            if let cause { c.u64(cause) }
            c.fixed(typeJSON)
            if let id { c.fixed(id) }
            if let session {
                c.fixed(session)
                c.u32(uid)
            }
            c.fixed(payload)
            c.encoded(targets.encoded)
        }
    }

    /// One store's final result for an action (`RecordEncoder.result`).
    func stageResult(seq: UInt64, store: JournalName, outcome: ResultOutcome, version: UInt64) -> Int {
        var length = 1 + FieldSize.varint(seq) + store.encoded.count + FieldSize.varint(version) + 1
        switch outcome {
        case .done: break
        case .rejected(let error): length += FieldSize.bytes(error.count)
        case .unavailable(let code, let message): length += FieldSize.string(code) + FieldSize.string(message)
        }
        return stageInBatch(bodyLength: length) { c in
            c.byte(RecordKind.result.rawValue)
            c.varint(seq)
            c.encoded(store.encoded)
            c.varint(version)
            switch outcome {
            case .done:
                c.byte(0)
            case .rejected(let error):
                c.byte(1)
                c.bytes(error)
            case .unavailable(let code, let message):
                c.byte(2)
                c.string(code)
                c.string(message)
            }
        }
    }

    /// A retained snapshot or (`isPatch`) a patch (`RecordEncoder.stateFixed`, not yet a result): store,
    /// version, seq, the JSON bytes.
    func stageState(isPatch: Bool, store: JournalName, version: UInt64, seq: UInt64, bytes: ArraySlice<UInt8>) -> Int {
        let length = 2 + 16 + store.encoded.count + 4 + bytes.count
        let added = stageInBatch(bodyLength: length) { c in
            c.byte(RecordKind.stateFixed.rawValue)
            c.byte(isPatch ? RecordEncoder.stateIsPatch : 0)
            c.u64(version)
            c.u64(seq)
            c.encoded(store.encoded)
            c.fixed(bytes)
        }
        lastState = buffer.count - length
        lastStateSeq = seq
        lastStateVersion = version
        return added
    }

    /// Makes the state just staged (nothing staged since) also `store`'s `done` result for `seq` at `version`,
    /// when it is that store's state for that action at that version; returns whether it did (else the result
    /// needs a record of its own).
    @inline(__always)
    func markDone(seq: UInt64, store: JournalName, version: UInt64) -> Bool {
        guard lastState >= 0, lastStateSeq == seq, lastStateVersion == version else { return false }
        let body = buffer.base + lastState
        let name = store.encoded
        guard buffer.count - lastState - 18 >= name.count,
              name.withUnsafeBufferPointer({ memcmp(body + 18, $0.baseAddress!, $0.count) == 0 }) else { return false }
        body[1] |= RecordEncoder.stateIsDone
        lastState = -1
        return true
    }
}
