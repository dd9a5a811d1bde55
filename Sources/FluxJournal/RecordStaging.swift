import CFluxSys
#if canImport(Glibc)
import Glibc
#endif

// The journal's hot path (issue 27): a record is framed and encoded straight into the segment writer's staging
// bytes, its length computed first, the fields stored through a pointer, the body's checksum taken once. No
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

extension SegmentWriter {
    /// Stages one record whose body is `bodyLength` bytes that `fill` writes (exactly that many): its header,
    /// then the body, then the body's checksum in the header. Returns the record's bytes (header included).
    @inline(__always)
    func stageRecord(bodyLength: Int, _ fill: (inout RecordCursor) -> Void) -> Int {
        precondition(bodyLength <= maxRecordBytes, "journal record of \(bodyLength) bytes")
        let total = recordHeaderSize + bodyLength
        let start = buffer.reserve(total)
        var cursor = RecordCursor(at: start + recordHeaderSize)
        fill(&cursor)
        assert(cursor.at == start + total, "a record's fields did not fill its computed length")
        cfluxsys_seal_record(start, UInt32(bodyLength))  // the header: length and the two checksums
        buffer.count += total
        stagedCount += 1
        return total
    }

    // MARK: - The records of the hot path (the same bytes as `RecordEncoder`'s)

    /// An accepted action (`RecordEncoder.action`).
    func stageAction(seq: UInt64, time: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?,
                     id: ArraySlice<UInt8>?, session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>,
                     targets: JournalNameList) -> Int {
        var length = 1 + FieldSize.varint(seq) + FieldSize.varint(time) + FieldSize.bytes(typeJSON.count)
            + FieldSize.varint(origin) + 1 + FieldSize.bytes(payload.count) + targets.encoded.count
        var flags: UInt8 = 0
        if let cause { flags |= RecordEncoder.hasCause; length += FieldSize.varint(cause) }
        if let id { flags |= RecordEncoder.hasID; length += FieldSize.bytes(id.count) }
        if let session { flags |= RecordEncoder.hasSession; length += FieldSize.bytes(session.count) + FieldSize.varint(UInt64(uid)) }
        return stageRecord(bodyLength: length) { c in
            c.byte(RecordKind.action.rawValue)
            c.varint(seq)
            c.varint(time)
            c.bytes(typeJSON)
            c.varint(origin)
            c.byte(flags)
            if let cause { c.varint(cause) }
            if let id { c.bytes(id) }
            if let session {
                c.bytes(session)
                c.varint(UInt64(uid))
            }
            c.bytes(payload)
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
        return stageRecord(bodyLength: length) { c in
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

    /// A retained snapshot (`kind` .snapshot) or a patch (.patch): store, version, seq, the JSON bytes.
    func stageState(_ kind: RecordKind, store: JournalName, version: UInt64, seq: UInt64, bytes: ArraySlice<UInt8>) -> Int {
        let length = 1 + store.encoded.count + FieldSize.varint(version) + FieldSize.varint(seq) + FieldSize.bytes(bytes.count)
        return stageRecord(bodyLength: length) { c in
            c.byte(kind.rawValue)
            c.encoded(store.encoded)
            c.varint(version)
            c.varint(seq)
            c.bytes(bytes)
        }
    }
}
