import Foundation
import Testing
@testable import FluxJournal
#if canImport(Glibc)
import Glibc
#endif

/// The storage seam: a real file, and a file that fails the writes and syncs a test chooses.
struct SegmentWriterTests {
    /// An in-memory `AppendFile` whose next writes or syncs fail with a chosen errno; a write that fails may have
    /// written part of its bytes first (as a full disk does).
    final class FaultyFile: AppendFile {
        let path = "faulty.seg"
        var bytes: [UInt8] = []
        var failWrites: Int32?
        var partialBytes = 0
        var failSyncs: Int32?
        var failReserves: Int32?
        var syncs = 0

        func write(_ raw: UnsafeRawBufferPointer, at offset: Int) throws(StorageError) {
            let data = failWrites == nil ? Array(raw) : Array(raw.prefix(partialBytes))
            if bytes.count < offset + data.count { bytes += [UInt8](repeating: 0, count: offset + data.count - bytes.count) }
            bytes.replaceSubrange(offset..<(offset + data.count), with: data)
            if let e = failWrites { throw StorageError(operation: "write", errno: e, path: path) }
        }
        func sync() throws(StorageError) {
            if let e = failSyncs { throw StorageError(operation: "fdatasync", errno: e, path: path) }
            syncs += 1
        }
        func truncate(to length: Int) throws(StorageError) {
            if length <= bytes.count { bytes.removeLast(bytes.count - length) } else { bytes += [UInt8](repeating: 0, count: length - bytes.count) }
        }
        func reserve(upTo end: Int, writeZeros: Bool) throws(StorageError) {
            if let e = failReserves { throw StorageError(operation: "write", errno: e, path: path) }
            if bytes.count < end { bytes += [UInt8](repeating: 0, count: end - bytes.count) }
        }
        func duplicateDescriptor() -> Int32? { nil }
        func length() throws(StorageError) -> Int { bytes.count }
        func close() {}
    }

    @Test("group commit: staged records go out in one write and one sync, and read back whole")
    func groupCommit() throws {
        let file = FaultyFile()
        let writer = try SegmentWriter(file: file)
        for i in 0..<64 { writer.append(Array("record \(i)".utf8)) }
        #expect(writer.stagedCount == 64 && file.bytes.count == SegmentHeader.size)
        try writer.write()
        try writer.sync()
        #expect(file.syncs == 1 && writer.synced == file.bytes.count)
        let scan = JournalScan(file.bytes)
        #expect(scan.problem == nil && scan.records.count == 64)
        #expect(String(decoding: file.bytes[scan.records[63]], as: UTF8.self) == "record 63")
    }

    @Test("a full disk mid-write leaves no torn record; the records stay staged and go out once space returns")
    func diskFullThenSpace() throws {
        let file = FaultyFile()
        let writer = try SegmentWriter(file: file)
        writer.append(Array("accepted".utf8))
        try writer.write()
        writer.append(Array("waiting for space".utf8))
        file.failWrites = ENOSPC
        file.partialBytes = 5
        #expect(throws: StorageError(operation: "write", errno: ENOSPC, path: "faulty.seg")) { try writer.write() }
        #expect(JournalScan(file.bytes).records.count == 1 && JournalScan(file.bytes).tornBytes == 0)
        #expect(writer.stagedCount == 1)
        file.failWrites = nil
        try writer.write()
        try writer.sync()
        #expect(JournalScan(file.bytes).records.map { String(decoding: file.bytes[$0], as: UTF8.self) }
                == ["accepted", "waiting for space"])
    }

    @Test("a failed sync is final: never retried, nothing more written")
    func failedSyncIsFinal() throws {
        let file = FaultyFile()
        let writer = try SegmentWriter(file: file)
        writer.append([1])
        try writer.write()
        file.failSyncs = EIO
        #expect(throws: StorageError(operation: "fdatasync", errno: EIO, path: "faulty.seg")) { try writer.sync() }
        file.failSyncs = nil
        #expect(throws: StorageError(operation: "fdatasync", errno: EIO, path: "faulty.seg")) { try writer.sync() }
        writer.append([2])
        #expect(throws: StorageError(operation: "fdatasync", errno: EIO, path: "faulty.seg")) { try writer.write() }
        #expect(file.syncs == 0)
    }

    @Test("a real file: written, synced, reopened, appended to, read back")
    func posixFile() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fluxjournal-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("00000001.seg").path
        do {
            let writer = try SegmentWriter(file: try PosixFile(path: path))
            writer.append(Array("one".utf8))
            try writer.write()
            try writer.sync()
            writer.file.close()
        }
        let existing = try Array(Data(contentsOf: URL(fileURLWithPath: path)))
        let scan = JournalScan(existing)
        let writer = try SegmentWriter(file: try PosixFile(path: path, create: false), existingLength: scan.validEnd)
        writer.append(Array("two".utf8))
        try writer.write()
        try writer.sync()
        writer.file.close()
        let bytes = try Array(Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(JournalScan(bytes).records.map { String(decoding: bytes[$0], as: UTF8.self) } == ["one", "two"])
        #expect(throws: StorageError.self) { _ = try PosixFile(path: dir.appendingPathComponent("missing/x.seg").path) }
    }
}
