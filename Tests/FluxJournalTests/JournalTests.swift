import Foundation
import Testing
@testable import FluxJournal
#if canImport(Glibc)
import Glibc
#endif

/// The journal in a data directory: records round-trip, recovery, the lock, torn and corrupt segments,
/// checkpoints and retention, history, and a disk that fails (through the `AppendFile` seam).
struct JournalTests {
    /// A fresh directory under the system's temp folder, removed by `remove()`.
    final class Dir {
        let path: String
        init() {
            var template = Array((NSTemporaryDirectory() + "/fluxjournal.XXXXXX").utf8CString)
            path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        }
        func remove() { try? FileManager.default.removeItem(atPath: path) }
    }

    static func action(_ seq: UInt64, targets: [String] = ["todos"], session: String? = nil, id: String? = nil) -> ActionEntry {
        ActionEntry(seq: seq, time: 1000 + seq, typeJSON: ArraySlice(#""todo/add""#.utf8), origin: 7, cause: seq > 1 ? seq - 1 : nil,
                    id: id.map { ArraySlice("\"\($0)\"".utf8) }, session: session.map { ArraySlice("\"\($0)\"".utf8) },
                    uid: session == nil ? 0 : 1000, payload: ArraySlice(#"{"n":\#(seq)}"#.utf8), targets: targets)
    }

    @Test("every record kind encodes and decodes to itself")
    func recordsRoundTrip() throws {
        let records: [JournalRecord] = [
            .seqReserve(65536),
            .register(store: "todos", handles: ["todo/*", "x"], waitFor: ["auth"]),
            .action(Self.action(3, targets: ["a", "b"], session: "s", id: "c-1")),
            .action(Self.action(1)),
            .result(seq: 3, store: "a", outcome: .done, version: 9),
            .result(seq: 3, store: "b", outcome: .rejected(ArraySlice(#"{"code":"x"}"#.utf8)), version: 2),
            .result(seq: 4, store: "b", outcome: .unavailable(code: "store-unavailable", message: "down ✗"), version: 0),
            .snapshot(store: "todos", version: 4, seq: 3, state: ArraySlice(#"{"items":[]}"#.utf8)),
            .storePosition(store: "todos", version: 4, seq: 300),
            .outcome(uid: 1000, session: Array("s".utf8), id: Array("c-1".utf8), seq: 3,
                     results: [TargetResult(store: "a", outcome: .done, version: 9)]),
            .segmentSummary(number: 3, firstSeq: 70000, lastSeq: 70100, lastTime: 1_795_000_000_000, actions: 101),
            .forget(store: "bench.42.7", seq: 300, versionFloor: 1_000_000),
            .forget(store: "", seq: 0, versionFloor: 5),
        ]
        for r in records {
            var body: [UInt8] = []
            RecordEncoder.record(r, into: &body)
            #expect(try RecordDecoder.decode(body, 0..<body.count) == r)
            // Cut short anywhere, a body never decodes into something else silently.
            for cut in 0..<body.count {
                #expect((try? RecordDecoder.decode(body, 0..<cut)) == nil || cut == body.count, "\(r) cut at \(cut)")
            }
        }
    }

    static func fill(_ journal: some JournalWriting, actions: ClosedRange<UInt64>) {
        journal.register(store: "todos", handles: ["todo/*"], waitFor: [])
        for seq in actions {
            journal.action(seq: seq, typeJSON: ArraySlice(#""todo/add""#.utf8), origin: 1, cause: nil,
                           id: ArraySlice("\"c-\(seq)\"".utf8), session: ArraySlice(#""s""#.utf8), uid: 1000,
                           payload: ArraySlice(#"{"n":\#(seq)}"#.utf8), targets: ["todos"])
            if seq != actions.upperBound {
                journal.snapshot(store: "todos", version: seq, seq: seq, state: ArraySlice("[\(seq)]".utf8))
                journal.result(seq: seq, store: "todos", outcome: .done, version: seq)
            }
        }
    }

    @Test("what was committed is recovered after a restart; the directory is locked while open")
    func recoverAndLock() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path + "/data")
        options.durability = .always
        var journal: Journal? = try Journal(options: options)
        let epoch = journal!.epoch
        Self.fill(journal!, actions: 1...5)
        #expect(journal!.commit(now: 0) == .written)
        #expect(journal!.syncs >= 1)
        #expect(throws: JournalError.self) { try Journal(options: options) }  // locked
        journal = nil  // a crash: no clean close, no checkpoint
        let again = try Journal(options: options)
        #expect(again.epoch == epoch)
        let s = again.recovered
        #expect(s.stores["todos"]?.version == 4 && s.stores["todos"]?.seq == 4 && s.stores["todos"]?.registered == true)
        #expect(s.pending.keys.sorted() == [5])
        #expect(s.outcomes.count == 4)
        #expect(s.nextSeq == 6)
    }

    @Test("a torn last record is dropped (and the file cut back); a corrupt one refuses the start with file and offset, and --repair cuts there")
    func tornAndCorrupt() throws {
        let dir = Dir()
        defer { dir.remove() }
        let options = Journal.Options(directory: dir.path)
        var first: Journal? = try Journal(options: options)
        // One write per action, as a loop iteration each: three batch records (format version 4).
        Self.fill(first!, actions: 1...1)
        for seq: UInt64 in 1...2 {
            first!.snapshot(store: "todos", version: seq, seq: seq, state: ArraySlice("[\(seq)]".utf8))
            first!.result(seq: seq, store: "todos", outcome: .done, version: seq)
            #expect(first!.commit(now: 0) == .written)
            first!.action(seq: seq + 1, typeJSON: ArraySlice(#""todo/add""#.utf8), origin: 1, cause: nil,
                          id: ArraySlice("\"c-\(seq + 1)\"".utf8), session: ArraySlice(#""s""#.utf8), uid: 1000,
                          payload: ArraySlice(#"{"n":\#(seq + 1)}"#.utf8), targets: ["todos"])
        }
        #expect(first!.commit(now: 0) == .written)
        first = nil  // released here, and its lock with it (a do-scope left that to the optimizer)
        let segment = Journal.segments(dir.path)[0].path
        let whole = try [UInt8](Data(contentsOf: URL(fileURLWithPath: segment)))
        // Torn: cut the last record short (the file goes on past it with zeros reserved ahead: cut those too).
        let end = JournalScan(whole).validEnd
        #expect(whole[end...].allSatisfy { $0 == 0 } && whole.count > end, "zeros are reserved past the records")
        try Data(whole[..<(end - 3)]).write(to: URL(fileURLWithPath: segment))
        do {
            let journal = try Journal(options: options)
            #expect(journal.openingNotes.contains { $0.contains("dropped a torn last record") })
            // The last record was action 3 (1 and 2 were answered): gone whole.
            #expect(journal.recovered.pending.isEmpty && journal.recovered.actionCount == 2)
        }
        // Corrupt: flip a byte inside the first record after the header.
        var damaged = whole
        damaged[SegmentHeader.size + recordHeaderSize + 2] ^= 0x20
        try Data(damaged).write(to: URL(fileURLWithPath: segment))
        do {
            _ = try Journal(options: options)
            Issue.record("a corrupt journal was opened")
        } catch {
            #expect(error.message.contains(segment) && error.message.contains("offset \(SegmentHeader.size)"))
            #expect(error.message.contains("--repair"))
        }
        var repairing = options
        repairing.repair = true
        let repaired = try Journal(options: repairing)
        #expect(repaired.openingNotes.contains { $0.contains("repaired the journal") })
        #expect(repaired.recovered.actionCount == 0)
    }

    /// A checkpoint's content for the background path: one snapshot record charged to uid 7.
    struct OneSnapshot: CheckpointContent {
        func emit(_ emit: (JournalRecord, UInt32) -> Void) {
            emit(.snapshot(store: "big", version: 1, seq: 0, state: ArraySlice("[1]".utf8)), 7)
        }
    }

    @Test("a crash mid-write with the next segment made ahead: the torn record is dropped and the empty segment removed, not taken for corruption")
    func tornBeforeASegmentMadeAhead() throws {
        let dir = Dir()
        defer { dir.remove() }
        let options = Journal.Options(directory: dir.path)
        var first: Journal? = try Journal(options: options)
        Self.fill(first!, actions: 1...3)
        #expect(first!.commit(now: 0) == .written)
        first = nil
        let segment = Journal.segments(dir.path)[0].path
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: segment)))
        let end = JournalScan(bytes).validEnd
        // A write cut short by the crash: the start of a record (a header whose length says more), then zeros.
        var torn: [UInt8] = []
        appendRecord([UInt8](repeating: 0x41, count: 100), to: &torn)
        bytes.replaceSubrange(end..<(end + 40), with: torn.prefix(40))
        try Data(bytes).write(to: URL(fileURLWithPath: segment))
        // The next segment, made ahead: a header and zeros.
        try Data(SegmentHeader.bytes() + [UInt8](repeating: 0, count: 4096))
            .write(to: URL(fileURLWithPath: dir.path + "/" + Journal.segmentName(2)))
        let journal = try Journal(options: options)
        #expect(journal.openingNotes.contains { $0.contains("removed") && $0.contains(Journal.segmentName(2)) })
        #expect(journal.openingNotes.contains { $0.contains("dropped a torn last record") })
        #expect(journal.recovered.actionCount == 3 && journal.currentSegmentNumber == 1)
        #expect(Journal.segments(dir.path).count == 1)
    }

    @Test("the next segment is made on the sync thread once the current one is half full; the roll-over takes it, and the closed one is cut to its records there")
    func nextSegmentMadeAhead() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 64 << 10
        options.checkpointMinBytes = 16 << 10
        options.backgroundCheckpoints = true
        let payload = ArraySlice(("\"" + String(repeating: "x", count: 1000) + "\"").utf8)
        var seq: UInt64 = 0
        func one(_ journal: Journal) {
            seq += 1
            journal.action(seq: seq, typeJSON: ArraySlice(#""t""#.utf8), origin: 1, cause: nil, id: nil, session: nil,
                           uid: 1000, payload: payload, targets: ["s"])
            #expect(journal.commit(now: 0) == .written)
        }
        let second = dir.path + "/" + Journal.segmentName(2)
        do {
            let journal = try Journal(options: options)
            journal.checkpointCapture = { OneSnapshot() }
            while journal.writerForReads.written < 8 << 10 { one(journal) }
            journal.settleBackground()
            // Made ahead: a header and the first reserve, no record; still segment 1's turn.
            let made = try [UInt8](Data(contentsOf: URL(fileURLWithPath: second)))
            #expect(journal.currentSegmentNumber == 1)
            #expect(made.count == min(SegmentHeader.size + options.reserveBytes, options.segmentBytes + (256 << 10)))
            #expect(JournalScan(made).problem == nil && JournalScan(made).records.isEmpty && JournalScan(made).version == SegmentHeader.currentVersion)
            while journal.currentSegmentNumber == 1 { one(journal) }
            let closedBytes = journal.segmentInfos.first { $0.number == 1 }!.bytes
            one(journal)
            journal.settleBackground()
            // The roll-over took it (the records go on after its header); the closed segment lost its zeros.
            #expect(Journal.fileSize(dir.path + "/" + Journal.segmentName(1)) == closedBytes)
            let now = try [UInt8](Data(contentsOf: URL(fileURLWithPath: second)))
            #expect(JournalScan(now).records.count >= 1)
            journal.close(now: 0)
        }
        let reopened = try Journal(options: options)
        let entries = reopened.history(from: nil, limit: 1000).entries
        #expect(entries.count == Int(seq) && entries.last?.action.seq == seq, "every action, across the two segments")
    }

    @Test("background checkpoints: the closed segment's sync, the checkpoint and retention happen on the sync thread; a user's bytes stay charged until its checkpoint is written; a restart reads the checkpoint")
    func backgroundCheckpoints() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 8192
        options.checkpointMinBytes = 4096
        options.retainActions = 20
        options.backgroundCheckpoints = true
        do {
            let journal = try Journal(options: options)
            journal.checkpointCapture = { OneSnapshot() }
            let payload = ArraySlice(("\"" + String(repeating: "x", count: 1000) + "\"").utf8)
            for seq in 1...5 {
                journal.action(seq: UInt64(seq), typeJSON: ArraySlice(#""t""#.utf8), origin: 1, cause: nil, id: nil,
                               session: nil, uid: 1000, payload: payload, targets: ["s"])
            }
            #expect(journal.commit(now: 0) == .written)  // rolls over: the checkpoint is queued
            #expect(journal.diskUse(of: 1000) > 5000, "charged until its checkpoint is written")
            journal.settleBackground()
            #expect(journal.checkpoints == 1)
            #expect(journal.diskUse(of: 1000) == 0 && journal.diskUse(of: 7) > 0)
            for seq in 6...200 {
                journal.action(seq: UInt64(seq), typeJSON: ArraySlice(#""t""#.utf8), origin: 1, cause: nil, id: nil,
                               session: nil, uid: 1000, payload: payload, targets: ["s"])
                _ = journal.commit(now: 0)
            }
            journal.settleBackground()
            #expect(journal.checkpoints > 10)
            #expect(journal.segmentsDeleted > 0)
            journal.settleBackground()  // (the deletions were queued after the checkpoints)
            // (Plus, at most, the next segment, made ready on the sync thread ahead of the roll-over: a header and
            // reserved zeros.)
            let files = Journal.segments(dir.path)
            let ahead = files.filter { $0.number > journal.currentSegmentNumber }
            #expect(files.count - ahead.count == journal.segmentInfos.count)
            #expect(ahead.map(\.number).allSatisfy { $0 == journal.currentSegmentNumber + 1 } && ahead.count <= 1)
            #expect(ahead.allSatisfy { JournalScan((try? [UInt8](Data(contentsOf: URL(fileURLWithPath: $0.path)))) ?? []).records.isEmpty })
            #expect(Journal.checkpoints(dir.path).count == 2)
            journal.close(now: 0)
        }
        let reopened = try Journal(options: options)
        #expect(reopened.recovered.stores["big"]?.snapshot?.version == 1)
        #expect(reopened.history(from: nil, limit: 1000).entries.last?.action.seq == 200, "the history reads to the end")
    }

    @Test("disk shares: each record is charged to its user until a checkpoint holds it; --retain-bytes deletes covered history oldest first whatever the count and age")
    func diskSharesAndRetainBytes() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 8192
        options.checkpointMinBytes = 4096
        options.retainBytes = 40_000
        options.diskPerUser = 6000
        let journal = try Journal(options: options)
        journal.checkpointSource = { emit in emit(.snapshot(store: "big", version: 1, seq: 0, state: ArraySlice("[1]".utf8)), 7) }
        let payload = ArraySlice(("\"" + String(repeating: "x", count: 1000) + "\"").utf8)
        func dispatch(_ seq: UInt64, uid: UInt32) {
            journal.action(seq: seq, typeJSON: ArraySlice(#""t""#.utf8), origin: 1, cause: nil, id: nil, session: nil,
                           uid: uid, payload: payload, targets: ["s"])
        }
        // Five 1 KB actions of uid 1000 and one of uid 2000 in the current segment: charged to them.
        for seq in 1...5 { dispatch(UInt64(seq), uid: 1000) }
        dispatch(6, uid: 2000)
        #expect(journal.diskUse(of: 1000) > 5000 && journal.diskUse(of: 1000) < 5300)
        #expect(journal.diskUse(of: 2000) > 1000 && journal.diskUse(of: 2000) < 1100)
        #expect(!journal.isOverDiskShare(1000))
        dispatch(7, uid: 1000)
        #expect(journal.isOverDiskShare(1000))
        #expect(!journal.isOverDiskShare(2000))
        // The commit rolls the segment over (past 4096 bytes) and checkpoints it: the users' bytes are now
        // history, charged to nobody, and the checkpoint's records to the user they were emitted with.
        #expect(journal.commit(now: 0) == .written)
        #expect(journal.checkpoints == 1)
        #expect(journal.diskUse(of: 1000) == 0 && !journal.isOverDiskShare(1000))
        #expect(journal.diskUse(of: 7) > 0)
        // Far more history than --retain-bytes (with the default count and age windows, which would keep it all):
        // the oldest covered segments go, and the files stay within about the bound (plus one segment).
        for seq in 8...400 {
            dispatch(UInt64(seq), uid: 1000)
            _ = journal.commit(now: 0)
        }
        #expect(journal.segmentsReclaimed > 0)
        #expect(journal.retainedBytes <= 40_000 + 8192 + 2048)
        // (On disk, the segment being written also holds the zeros reserved past its records.)
        let closed = Journal.segments(dir.path).dropLast().map { Journal.fileSize($0.path) }.reduce(0, +)
            + Journal.checkpoints(dir.path).map { Journal.fileSize($0.path) }.reduce(0, +)
        #expect(closed <= 40_000 + 2048)
        let page = journal.history(from: nil, limit: 1)
        #expect(page.first > 100)  // the oldest seqs are gone
    }

    @Test("segments roll over with a checkpoint; a restart reads the checkpoint and what follows; retention deletes covered history beyond the window")
    func checkpointsAndRetention() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 4096
        options.retainActions = 50
        var reference = JournalState()
        do {
            let journal = try Journal(options: options)
            // The checkpoint source replays what was journaled so far (what the router's state would be).
            let mirror = MemoryJournal()
            journal.checkpointSource = { emitCharged in
                func emit(_ r: JournalRecord) { emitCharged(r, 0) }
                var s = JournalState()
                for r in mirror.decoded() { s.apply(r) }
                emit(.seqReserve(s.nextSeq - 1))
                for (name, store) in s.stores {
                    emit(.register(store: name, handles: store.handles, waitFor: store.waitFor))
                    if let snap = store.snapshot { emit(.snapshot(store: name, version: snap.version, seq: snap.seq, state: snap.state)) }
                    emit(.storePosition(store: name, version: store.version, seq: store.seq))
                }
                for (_, p) in s.pending.sorted(by: { $0.key < $1.key }) { emit(.action(p.action)) }
            }
            for batch in 0..<20 {
                let seqs = UInt64(batch * 10 + 1)...UInt64(batch * 10 + 10)
                Self.fill(journal, actions: seqs)
                Self.fill(mirror, actions: seqs)
                _ = journal.commit(now: 0)
            }
            #expect(journal.checkpoints > 0)
            #expect(journal.segmentsDeleted > 0)
            let page = journal.history(from: nil, limit: 5)
            #expect(page.first > 1 && page.first == page.entries.first?.action.seq)
            #expect(page.entries.count == 5)
            reference = mirror.state()
        }
        let again = try Journal(options: options)
        #expect(again.openingNotes.contains { $0.contains("loaded the checkpoint") })
        #expect(again.recovered.stores == reference.stores)
        #expect(again.recovered.nextSeq == reference.nextSeq)
        #expect(again.recovered.pending.keys.sorted() == reference.pending.keys.sorted())
        #expect(again.stateAt(store: "todos", version: 199, seq: nil)?.state == Array("[199]".utf8))
    }

    @Test("a read view sees the journal as it was when it was made: later appends, new segments and retention's deletes (of the very files it reads) change nothing it reads, on another thread")
    func readViewIsASnapshot() async throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 4096
        options.retainActions = 20
        let journal = try Journal(options: options)
        journal.checkpointSource = { emit in emit(.register(store: "todos", handles: ["todo/*"], waitFor: []), 0) }
        Self.fill(journal, actions: 1...40)
        _ = journal.commit(now: 0)
        let firstBefore = journal.history(from: nil, limit: 1).first
        let historyView = journal.readView(historyFrom: nil)
        let stateView = journal.readView()
        let expectedPage = historyView.history(from: nil, limit: 1000)
        let expectedState = stateView.stateAt(store: "todos", version: 30, seq: nil)
        #expect(expectedState?.state == Array("[30]".utf8))
        // The loop goes on: more actions, segments rolled over, checkpoints, old segments deleted.
        for batch in 0..<10 {
            Self.fill(journal, actions: UInt64(41 + batch * 10)...UInt64(50 + batch * 10))
            _ = journal.commit(now: 0)
        }
        #expect(journal.segmentsDeleted > 0)
        #expect(journal.history(from: nil, limit: 1).first > firstBefore, "retention deleted what the views hold")
        let (page, state) = await Task.detached {
            (historyView.history(from: nil, limit: 1000), stateView.stateAt(store: "todos", version: 30, seq: nil))
        }.value
        #expect(page == expectedPage)
        #expect(page.entries.first?.action.seq == firstBefore)
        #expect(page.entries.last?.action.seq == 40)
        #expect(state == expectedState)
        // A page from the oldest seq stops once full and answered.
        let small = historyView.history(from: nil, limit: 3)
        #expect(small.entries.map(\.action.seq) == [firstBefore, firstBefore + 1, firstBefore + 2])
        #expect(small.entries.allSatisfy { $0.results.count == 1 })
    }

    @Test("checkpoints come by bytes since the last one (at least checkpointMinBytes and the last checkpoint's size), not only when a segment fills")
    func checkpointsByBytes() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.segmentBytes = 1 << 30
        options.checkpointMinBytes = 8 << 10
        let journal = try Journal(options: options)
        // A checkpoint of about 64 KiB (one large retained state): the next one waits for as many bytes of records.
        let big = ArraySlice(Array("[\"\(String(repeating: "x", count: 64 << 10))\"]".utf8))
        journal.checkpointSource = { emit in emit(.snapshot(store: "big", version: 1, seq: 0, state: big), 0) }
        var writtenAtCheckpoint: [UInt64] = []
        for batch in 0..<400 {
            let seqs = UInt64(batch * 10 + 1)...UInt64(batch * 10 + 10)
            Self.fill(journal, actions: seqs)
            let before = journal.checkpoints
            _ = journal.commit(now: 0)
            if journal.checkpoints > before { writtenAtCheckpoint.append(journal.bytesWritten) }
        }
        #expect(writtenAtCheckpoint.count >= 3, "\(writtenAtCheckpoint.count) checkpoints in \(journal.bytesWritten) bytes of records")
        // The first came after checkpointMinBytes; the ones after it after at least the checkpoint's size.
        #expect(writtenAtCheckpoint[0] >= 8 << 10 && writtenAtCheckpoint[0] < 64 << 10)
        for (a, b) in zip(writtenAtCheckpoint, writtenAtCheckpoint.dropFirst()) { #expect(b - a >= 64 << 10) }
        #expect(journal.lastCheckpointBytes > 64 << 10)
    }

    /// Space and sync failures, through a file whose reservations, writes or syncs fail.
    final class FailingFile: AppendFile {
        let inner: PosixFile
        var path: String { inner.path }
        var failReserve = false, failWrite = false, failSync = false
        init(path: String) throws(StorageError) { inner = try PosixFile(path: path) }
        func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StorageError) {
            if failWrite { throw StorageError(operation: "write", errno: ENOSPC, path: path) }
            try inner.write(bytes, at: offset)
        }
        func sync() throws(StorageError) {
            if failSync { throw StorageError(operation: "fdatasync", errno: EIO, path: path) }
            try inner.sync()
        }
        func reserve(upTo end: Int, writeZeros: Bool) throws(StorageError) {
            if failReserve { throw StorageError(operation: "write", errno: ENOSPC, path: path) }
            try inner.reserve(upTo: end, writeZeros: writeZeros)
        }
        func truncate(to length: Int) throws(StorageError) { try inner.truncate(to: length) }
        func duplicateDescriptor() -> Int32? { nil }
        func length() throws(StorageError) -> Int { try inner.length() }
        func close() { inner.close() }
    }

    @Test("disk full: new work is refused while the reserve lasts, writes that fail hold their records, and both recover when space returns; a failed sync is final")
    func failingDisk() throws {
        let dir = Dir()
        defer { dir.remove() }
        var file: FailingFile?
        var options = Journal.Options(directory: dir.path)
        options.durability = .always
        options.reserveBytes = 8  // every commit reserves again
        let journal = try Journal(options: options, makeFile: { path throws(StorageError) in
            let f = try FailingFile(path: path)
            file = f
            return f
        })
        #expect(journal.refusal == nil)
        file!.failReserve = true
        journal.register(store: "a", handles: [], waitFor: [])
        #expect(journal.commit(now: 0) == .written)
        #expect(journal.retrySpace(now: 0) == false)
        if case .diskFull? = journal.refusal {} else { Issue.record("no disk-full refusal: \(String(describing: journal.refusal))") }
        file!.failWrite = true
        journal.register(store: "b", handles: [], waitFor: [])
        #expect(journal.commit(now: 0) == .diskFull)
        #expect(journal.hasStaged)
        file!.failWrite = false
        file!.failReserve = false
        #expect(journal.retrySpace(now: 1))
        #expect(!journal.hasStaged && journal.refusal == nil)
        file!.failSync = true
        journal.register(store: "c", handles: [], waitFor: [])
        #expect(journal.commit(now: 2) == .failed)
        file!.failSync = false
        journal.register(store: "d", handles: [], waitFor: [])
        #expect(journal.commit(now: 3) == .failed)  // never retried
        if case .failed? = journal.refusal {} else { Issue.record("a failed sync did not stop the journal") }
    }

    @Test("the default data directory is per socket, under XDG_STATE_HOME or ~/.local/state")
    func defaultDirectory() {
        let a = defaultDataDirectory(socketPath: "/run/user/1000/fluxbus/fluxd.sock", environment: ["XDG_STATE_HOME": "/s", "HOME": "/h"])
        let b = defaultDataDirectory(socketPath: "/tmp/other.sock", environment: ["HOME": "/h"])
        #expect(a?.hasPrefix("/s/fluxbus/run-user-1000-fluxbus-fluxd.sock-") == true)
        #expect(b?.hasPrefix("/h/.local/state/fluxbus/tmp-other.sock-") == true)
        #expect(defaultDataDirectory(socketPath: "/x.sock", environment: [:]) == nil)
        #expect(busName(socketPath: "/a/b.sock") != busName(socketPath: "/a-b.sock"))
    }
}

extension JournalTests {
    @Test("batch mode's sync on its own thread: a failure is kept for the journal's thread, taken once; a sync that works reports none")
    func backgroundSyncFailure() throws {
        let sync = BackgroundSync()
        sync.sync(-1, path: "bad")  // fdatasync(-1): EBADF
        sync.wait()
        #expect(sync.takeFailure()?.errno == EBADF)
        #expect(sync.takeFailure() == nil)
        let dir = Dir()
        defer { dir.remove() }
        let file = try PosixFile(path: dir.path + "/f")
        try [UInt8](repeating: 7, count: 100).withUnsafeBytes { try file.write($0, at: 0) }
        sync.sync(file.duplicateDescriptor()!, path: file.path)
        sync.wait()
        #expect(!sync.isBusy && sync.takeFailure() == nil)
    }

    @Test("a journal in batch mode syncs on the timer through the background thread, and a clean close waits for it")
    func batchSyncsInTheBackground() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.durability = .batch
        options.syncInterval = 10
        do {
            let journal = try Journal(options: options)
            Self.fill(journal, actions: 1...3)
            #expect(journal.commit(now: 0) == .written)
            let before = journal.syncs
            #expect(journal.syncIfDue(now: 100))
            #expect(journal.syncs == before + 1 && !journal.hasUnsynced)
            journal.close(now: 200)
        }
        let again = try Journal(options: options)
        #expect(again.recovered.actionCount >= 3 || again.openingNotes.contains { $0.contains("loaded the checkpoint") })
        #expect(again.recovered.nextSeq == 4)
    }
}

extension JournalTests {
    @Test("state-at a version a patch made: the snapshot before it with the patches after it applied (SPEC §16)")
    func stateAtPatchedVersions() throws {
        let dir = Dir()
        defer { dir.remove() }
        let journal = try Journal(options: Journal.Options(directory: dir.path))
        journal.register(store: "todos", handles: ["todo/*"], waitFor: [])
        journal.snapshot(store: "todos", version: 1, seq: 0, state: Array(#"{"n":1,"items":[]}"#.utf8)[...])
        journal.patch(store: "todos", version: 2, seq: 5, patch: Array(#"[{"op":"replace","path":"/n","value":2}]"#.utf8)[...])
        journal.patch(store: "todos", version: 3, seq: 9, patch: Array(#"[{"op":"add","path":"/items/-","value":"x"}]"#.utf8)[...])
        #expect(journal.commit(now: 0) == .written)
        #expect(journal.stateAt(store: "todos", version: 1, seq: nil)?.state == Array(#"{"n":1,"items":[]}"#.utf8))
        #expect(journal.stateAt(store: "todos", version: 2, seq: nil)?.state == Array(#"{"n":2,"items":[]}"#.utf8))
        let third = journal.stateAt(store: "todos", version: 3, seq: nil)
        #expect(third?.state == Array(#"{"n":2,"items":["x"]}"#.utf8) && third?.seq == 9)
        #expect(journal.stateAt(store: "todos", version: nil, seq: 7)?.version == 2)
        #expect(journal.stateAt(store: "todos", version: 4, seq: nil) == nil)
        journal.close(now: 1)
        let again = try Journal(options: Journal.Options(directory: dir.path))
        #expect(again.recovered.stores["todos"]?.version == 3)
        #expect(again.stateAt(store: "todos", version: 3, seq: nil)?.state == Array(#"{"n":2,"items":["x"]}"#.utf8),
                "after a clean close the checkpoint holds the rendered snapshot")
    }

    @Test("a forgotten store (SPEC §10): gone after a restart, the version floor kept (also through a checkpoint), state-at answers for the store of the name made later only")
    func forgottenStore() throws {
        let dir = Dir()
        defer { dir.remove() }
        let journal = try Journal(options: Journal.Options(directory: dir.path))
        journal.register(store: "todos", handles: ["todo/*"], waitFor: [])
        journal.snapshot(store: "todos", version: 1, seq: 0, state: Array(#"{"n":1}"#.utf8)[...])
        journal.snapshot(store: "todos", version: 2, seq: 2, state: Array(#"{"n":2}"#.utf8)[...])
        journal.forget(store: "todos", seq: 2, versionFloor: 2, uid: 1000)
        #expect(journal.commit(now: 0) == .written)
        #expect(journal.stateAt(store: "todos", version: 2, seq: nil) == nil, "the forgotten store's states are not the name's")
        journal.register(store: "todos", handles: ["todo/*"], waitFor: [])
        journal.snapshot(store: "todos", version: 3, seq: 0, state: Array(#"{"new":true}"#.utf8)[...])
        #expect(journal.commit(now: 1) == .written)
        #expect(journal.stateAt(store: "todos", version: nil, seq: 9)?.version == 3)
        #expect(journal.stateAt(store: "todos", version: 1, seq: nil) == nil)
        journal.close(now: 2)
        let again = try Journal(options: Journal.Options(directory: dir.path))
        #expect(again.recovered.versionFloor == 2)
        #expect(again.recovered.stores["todos"]?.version == 3)
        #expect(again.stateAt(store: "todos", version: 3, seq: nil)?.state == Array(#"{"new":true}"#.utf8))
        again.forget(store: "todos", seq: 3, versionFloor: 3, uid: 1000)
        #expect(again.commit(now: 3) == .written)
        again.close(now: 4)
        let third = try Journal(options: Journal.Options(directory: dir.path))
        #expect(third.recovered.stores["todos"] == nil)
        #expect(third.recovered.versionFloor == 3)
        third.close(now: 5)
    }

    @Test("seq reservations (issue 27): the first of a run is synced before its seqs are revealed; the next, made ahead, is synced off the loop, and actions within the durable one never sync")
    func reservationsAhead() throws {
        let dir = Dir()
        defer { dir.remove() }
        var options = Journal.Options(directory: dir.path)
        options.durability = .batch
        let journal = try Journal(options: options)
        func act(_ seq: UInt64) {
            journal.action(seq: seq, typeJSON: ArraySlice(#""t""#.utf8), origin: 1, cause: nil, id: nil, session: nil,
                           uid: 0, payload: ArraySlice("1".utf8), targets: ["s"])
        }
        journal.reserveSeq(upTo: 100)
        act(1)
        #expect(journal.commit(now: 1) == .written)
        #expect(journal.durableReserve == 100 && journal.writer.synced == journal.writer.written, "synced on the loop")
        act(2)
        #expect(journal.commit(now: 2) == .written)
        #expect(journal.writer.synced < journal.writer.written, "within the durable reservation: no sync")
        journal.reserveSeq(upTo: 200)  // ahead, at seq 60
        act(60)
        #expect(journal.commit(now: 3) == .written)
        journal.background.wait()
        #expect(journal.commit(now: 4) == .written)  // (reads what the sync thread did)
        #expect(journal.durableReserve == 200, "the reservation ahead is durable, synced off the loop")
        let syncedBefore = journal.writer.synced
        act(150)
        #expect(journal.commit(now: 5) == .written)
        #expect(journal.writer.synced == syncedBefore && journal.writer.synced < journal.writer.written,
                "seq 150 was within the durable reservation: nothing synced for it")
        act(201)  // beyond every reservation (a router never does this; the journal still syncs first)
        #expect(journal.commit(now: 6) == .written)
        #expect(journal.writer.synced == journal.writer.written)
        journal.close(now: 7)
    }
}
