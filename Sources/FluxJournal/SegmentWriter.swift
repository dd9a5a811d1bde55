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
    /// Records staged and not written yet, framed (`RecordStaging.swift` encodes the hot path's records here).
    let buffer = StagingBuffer()
    /// Bytes staged.
    public var stagedBytes: Int { buffer.count }
    /// A copy of the staged bytes (tests).
    public var staged: [UInt8] { Array(buffer.bytes) }
    /// How many framed records are staged (an open batch counts as one).
    @exclusivity(unchecked) public internal(set) var stagedCount = 0
    /// Where the open batch record starts in `buffer` (its header), or -1: the hot path's records go into one
    /// batch per write (format version 4), sealed (framed, checksummed) when written.
    @exclusivity(unchecked) var batchStart = -1
    /// Where the body of the last record staged starts in `buffer` when it is a state (`stateFixed`) that a `done`
    /// result may still mark (`markDone`), else -1.
    @exclusivity(unchecked) var lastState = -1
    /// That state's seq and version.
    @exclusivity(unchecked) var lastStateSeq: UInt64 = 0
    @exclusivity(unchecked) var lastStateVersion: UInt64 = 0
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

    /// Stages one record, framed on its own (after the open batch, which is sealed first).
    public func append<Body: Collection>(_ body: Body) where Body.Element == UInt8 {
        sealBatch()
        var framed: [UInt8] = []
        appendRecord(body, to: &framed)
        framed.withUnsafeBufferPointer { b in
            buffer.reserve(b.count).update(from: b.baseAddress!, count: b.count)
        }
        buffer.count += framed.count
        stagedCount += 1
    }

    /// Stages one record whose body `encode` appends to an array (the records off the hot path: registrations,
    /// seq reservations, forgets) in the open batch; returns the bytes it added.
    public func appendEncoded(_ encode: (inout [UInt8]) -> Void) -> Int {
        var body: [UInt8] = []
        encode(&body)
        return stageInBatch(bodyLength: body.count) { c in
            body.withUnsafeBufferPointer { b in
                if let s = b.baseAddress { c.at.update(from: s, count: b.count) }
                c.at += b.count
            }
        }
    }

    /// `write()`, its failure returned (for a caller holding the writer at +0, in a closure that cannot throw
    /// a typed error).
    func writeStaged() -> StorageError? {
        do { try write() } catch { return error }
        return nil
    }

    /// Writes what is staged, in one write. On failure nothing of it stays in the file and it stays staged.
    public func write() throws(StorageError) {
        if let failure { throw failure }
        guard buffer.count > 0 else { return }
        sealBatch()
        do {
            try file.write(buffer.bytes, at: written)
        } catch {
            // No torn record left by a failed write (ENOSPC mid-record): the file ends at the last whole record
            // (the zeros reserved past it go too; the journal reserves again).
            try? file.truncate(to: written)
            throw error
        }
        written += buffer.count
        buffer.removeAll()
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
