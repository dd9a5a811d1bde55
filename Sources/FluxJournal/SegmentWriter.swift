/// Appends framed records to one segment through an `AppendFile`, with group commit: `append` stages records,
/// `write()` hands everything staged to the operating system in one write (fluxd calls it once per loop iteration,
/// before any frame that reveals those records leaves), `sync()` makes it durable with one `fdatasync`.
///
/// Failure rules (issue 15): a failed write leaves no half record behind (the file is cut back to the last whole
/// record) and the records stay staged, so a write that failed for a full disk is retried once space returns; a
/// failed sync is never retried — the writer is `failed` for good, and fluxd stops accepting.
public final class SegmentWriter {
    /// The file written.
    public let file: any AppendFile
    /// Bytes of whole records handed to the operating system (the segment's length).
    @exclusivity(unchecked) public private(set) var written: Int
    /// Bytes of those made durable by the last successful sync.
    @exclusivity(unchecked) public private(set) var synced: Int
    /// Records staged and not written yet, framed.
    @exclusivity(unchecked) public private(set) var staged: [UInt8] = []
    /// How many records are staged.
    @exclusivity(unchecked) public private(set) var stagedCount = 0
    /// Set when a sync failed: nothing more is written.
    @exclusivity(unchecked) public private(set) var failure: StorageError?

    /// A writer for a new segment (writes the header) or one that already holds `existingLength` valid bytes.
    public init(file: any AppendFile, existingLength: Int? = nil) throws(StorageError) {
        self.file = file
        if let existingLength {
            written = existingLength
            synced = existingLength
        } else {
            let header = SegmentHeader.bytes()
            try Self.write(header, to: file, at: 0)
            written = header.count
            synced = 0
        }
    }

    /// Stages one record.
    public func append<Body: Collection>(_ body: Body) where Body.Element == UInt8 {
        appendRecord(body, to: &staged)
        stagedCount += 1
    }

    /// A record header's placeholder (an array: appended with one copy, where a generic repetition cost ~550
    /// instructions a record).
    static let emptyHeader = [UInt8](repeating: 0, count: recordHeaderSize)

    /// Stages one record whose body `encode` appends (straight into the staged bytes: no copy of the body), then
    /// fills in its header.
    @inline(__always)
    public func appendEncoded(_ encode: (inout [UInt8]) -> Void) {
        let start = staged.count
        staged.append(contentsOf: Self.emptyHeader)
        encode(&staged)
        let length = staged.count - start - recordHeaderSize
        precondition(length <= maxRecordBytes, "journal record of \(length) bytes")
        staged.withUnsafeMutableBufferPointer { b in
            func put(_ v: UInt32, at i: Int) {
                b[i] = UInt8(v >> 24); b[i + 1] = UInt8((v >> 16) & 0xFF)
                b[i + 2] = UInt8((v >> 8) & 0xFF); b[i + 3] = UInt8(v & 0xFF)
            }
            put(UInt32(length), at: start)
            put(CRC32C.checksum(UnsafeBufferPointer(rebasing: b[start..<(start + 4)])), at: start + 4)
            put(CRC32C.checksum(UnsafeBufferPointer(rebasing: b[(start + recordHeaderSize)...])), at: start + 8)
        }
        stagedCount += 1
    }

    /// Writes what is staged, in one write. On failure nothing of it stays in the file and it stays staged.
    public func write() throws(StorageError) {
        if let failure { throw failure }
        guard !staged.isEmpty else { return }
        do {
            try Self.write(staged, to: file, at: written)
        } catch {
            // No torn record left by a failed write (ENOSPC mid-record): the file ends at the last whole record
            // (the zeros reserved past it go too; the journal reserves again).
            try? file.truncate(to: written)
            throw error
        }
        written += staged.count
        staged.removeAll(keepingCapacity: true)
        stagedCount = 0
    }

    private static func write(_ bytes: [UInt8], to file: any AppendFile, at offset: Int) throws(StorageError) {
        var failure: StorageError?
        bytes.withUnsafeBytes { raw in
            do throws(StorageError) { try file.write(raw, at: offset) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    /// Records that what is written now is being made durable elsewhere (a sync on another thread, whose failure
    /// the journal handles).
    func markSynced() { synced = written }

    /// Makes everything written durable. A failure is final (see the type's comment).
    public func sync() throws(StorageError) {
        if let failure { throw failure }
        guard synced < written else { return }
        do {
            try file.sync()
        } catch {
            failure = error
            throw error
        }
        synced = written
    }
}
