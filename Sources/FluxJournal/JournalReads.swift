import FluxJSONValue
#if canImport(Glibc)
import Glibc
#endif

/// The journal's files as they were at one moment, for reading on another thread (fluxd's reader thread answers
/// `history` and `state-at` with these, SPEC §8.12, while its loop thread goes on appending to the journal and
/// deleting segments).
///
/// Thread-safety contract:
/// - `Journal.readView(historyFrom:)` and `Journal.readView()` make one, on the journal's thread (fluxd's loop
///   thread), like every other `Journal` method: they write what is staged, then open a descriptor of each file the
///   read needs and capture its length (the current segment: the bytes written so far). That costs a write of what
///   is staged and an `open` per segment, not a read of the files.
/// - After that the view never touches the `Journal`: it reads only through its own descriptors (`pread`) and
///   only below the captured lengths. The journal only ever appends to a segment past what it has written (its
///   zeros reserved ahead and a cut-back after a failed write are past it too), never rewrites a byte below, and
///   retention unlinks whole files: an unlinked file stays readable through the descriptor. So a view reads the
///   same bytes whatever the journal does meanwhile, and sees nothing newer than its capture.
/// - Its members are immutable: `history` and `stateAt` may run on any thread, even on two at once. Its
///   descriptors are closed when the last reference goes (`deinit`): a read dropped unanswered (its peer closed)
///   leaks nothing.
public final class JournalReadView: Sendable {
    struct File: Sendable {
        /// -1: not opened (not needed by the read, or it could not be opened: `openError`).
        var fd: Int32
        var path: String
        var length: Int
        var info: Journal.SegmentInfo?
        var isCurrent: Bool
        var openError: String?
    }

    /// The oldest seq retained when the view was made (0: none).
    public let first: UInt64
    let segments: [File]
    /// The newest checkpoint (`stateAt` reads it first), if the view was made with it.
    let checkpoint: File?

    init(first: UInt64, segments: [File], checkpoint: File?) {
        self.first = first
        self.segments = segments
        self.checkpoint = checkpoint
    }

    deinit {
        for file in segments where file.fd >= 0 { close(file.fd) }
        if let checkpoint, checkpoint.fd >= 0 { close(checkpoint.fd) }
    }

    /// Up to `limit` actions from seq `from` (nil: the oldest retained), with the results the journal held for
    /// them when the view was made. Reads from the segment that holds `from` on, a chunk at a time, and stops
    /// once the page is full and every action in it has all its results: a page costs about what its records
    /// (and those between them) take, not the journal.
    public func history(from: UInt64?, limit: Int) -> HistoryPage {
        let start = max(from ?? first, first)
        var entries: [HistoryEntry] = []
        var index: [UInt64: Int] = [:]
        var open = 0  // collected actions still missing a result
        var skippedDamage: String?  // damage in a segment passed over: the seqs right after it may be lost
        for file in segments {
            guard let info = file.info else { continue }
            if entries.isEmpty, info.lastSeq.map({ $0 < start }) ?? true {
                skippedDamage = info.damage ?? (info.lastSeq == nil ? skippedDamage : nil)
                continue
            }
            if entries.isEmpty, let damage = skippedDamage, (info.firstSeq ?? 0) > start {
                return HistoryPage(first: first, entries: [], damage: damage)
            }
            guard file.fd >= 0 else {
                return HistoryPage(first: first, entries: entries, damage: "\(file.path) cannot be read\(file.openError.map { ": \($0)" } ?? "")")
            }
            var stream = RecordStream(fd: file.fd, length: file.length)
            while let range = stream.next() {
                let bytes = stream.buffer
                for record in (try? RecordDecoder.decodeAll(bytes, range)) ?? [] {
                    switch record {
                    case .action(let a) where a.seq >= start && entries.count < limit:
                        index[a.seq] = entries.count
                        entries.append(HistoryEntry(action: a.owned(), results: []))
                        open += 1
                    case .result(let seq, let store, let outcome, let version):
                        guard let i = index[seq] else { continue }
                        entries[i].results.append(TargetResult(store: store, outcome: outcome.owned(), version: version))
                        if entries[i].results.count == entries[i].action.targets.count { open -= 1 }
                    default:
                        break
                    }
                    if entries.count == limit && open == 0 { return HistoryPage(first: first, entries: entries) }
                }
            }
            if let problem = stream.problem {
                return HistoryPage(first: first, entries: entries, damage: "\(file.path): \(problem)")
            }
            if let tornAt = stream.tornAt, !file.isCurrent, !stream.onlyZeros(from: tornAt) {
                return HistoryPage(first: first, entries: entries, damage: "\(file.path) ends in a record cut short at offset \(tornAt)")
            }
        }
        return HistoryPage(first: first, entries: entries)
    }

    /// Store `store`'s state at `version`, or the newest one whose seq is at most `seq`, from the newest
    /// checkpoint (which holds the snapshot retained when it was written) and the segments, a chunk at a time.
    ///
    /// A version made by a patch (SPEC §16) is the newest snapshot before it with the patches after that applied
    /// (rendered as fluxd renders a patched state).
    public func stateAt(store: String, version: UInt64?, seq: UInt64?) -> PastState? {
        var best: (version: UInt64, seq: UInt64)?
        func wanted(_ v: UInt64, _ s: UInt64) -> Bool {
            if let version { return v == version }
            if let seq { return s <= seq && v >= (best?.version ?? 0) }
            return false
        }
        // The store's snapshots and patches, in journal order: the state at a version is the last snapshot at or
        // before it, with the patches between applied.
        var base: (version: UInt64, state: JSONValue?, bytes: [UInt8])?
        var result: PastState?
        let files = (checkpoint.map { [$0] } ?? []) + segments
        for file in files where file.fd >= 0 {
            var stream = RecordStream(fd: file.fd, length: file.length)
            while let range = stream.next() {
                let bytes = stream.buffer
                // (Only the records that can hold the store's states are decoded: a batch's actions and results are
                // passed over by their first byte.)
                var held: [JournalRecord] = []
                for body in (try? RecordDecoder.bodies(bytes, range)) ?? [] where body.count > 1 && Self.mayHoldStates(bytes[body.lowerBound]) {
                    try? RecordDecoder.decodeHeld(bytes, body, into: &held)
                }
                for record in held {
                    switch Optional(record) {
                    case .forget(let name, _, let floor)? where name == store:
                        // SPEC §10: the store was forgotten; `state-at` answers for the store of that name made later
                        // only (its versions are above `floor`: one read first from the checkpoint stays).
                        if (base?.version ?? 0) <= floor { base = nil }
                        if (result?.version ?? 0) <= floor {
                            best = nil
                            result = nil
                        }
                    case .snapshot(let name, let v, let s, let state)? where name == store:
                        base = (v, nil, Array(state))
                        if wanted(v, s) {
                            best = (v, s)
                            result = PastState(version: v, seq: s, state: Array(state))
                        }
                    case .patch(let name, let v, let s, let patch)? where name == store:
                        guard var current = base, current.version + 1 == v else { base = nil; continue }
                        if current.state == nil { current.state = try? JSONValue(parsing: current.bytes) }
                        guard var tree = current.state, let p = try? JSONPatch(parsing: patch), (try? tree.apply(p)) != nil else {
                            base = nil
                            continue
                        }
                        base = (v, tree, [])
                        if wanted(v, s) {
                            best = (v, s)
                            result = PastState(version: v, seq: s, state: tree.compactBytes)
                        }
                    default:
                        continue
                    }
                }
            }
        }
        return result
    }

    /// Whether a record of this kind may hold a snapshot, a patch or a forget (what `stateAt` reads).
    private static func mayHoldStates(_ kind: UInt8) -> Bool {
        switch RecordKind(rawValue: kind) {
        case .snapshot?, .patch?, .forget?, .stateFixed?: return true
        default: return false
        }
    }
}

extension Journal {
    /// A view of the segments `history(from:)` needs (those from the one holding seq `from` on; nil: all), for
    /// reading on another thread (`JournalReadView`'s contract). The journal's thread only.
    public func readView(historyFrom from: UInt64?) -> JournalReadView {
        makeReadView(from: from ?? 0, checkpoint: false)
    }

    /// A view of every segment and the newest checkpoint (what `stateAt` reads), for reading on another thread.
    /// The journal's thread only.
    public func readView() -> JournalReadView {
        makeReadView(from: 0, checkpoint: true)
    }

    private func makeReadView(from: UInt64, checkpoint: Bool) -> JournalReadView {
        if hasStaged { try? flushStaged() }
        let first = segmentInfos.first(where: { $0.firstSeq != nil })?.firstSeq ?? 0
        let dir = options.directory
        let current = currentSegmentNumber
        let written = writerForReads.written
        func opened(_ path: String, length: Int?, info: Journal.SegmentInfo?, isCurrent: Bool) -> JournalReadView.File {
            let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                let error = String(cString: strerror(errno))
                return .init(fd: -1, path: path, length: 0, info: info, isCurrent: isCurrent, openError: error)
            }
            var size = length ?? 0
            if length == nil {
                var st = stat()
                size = fstat(fd, &st) == 0 ? Int(st.st_size) : 0
            }
            return .init(fd: fd, path: path, length: size, info: info, isCurrent: isCurrent, openError: nil)
        }
        var files: [JournalReadView.File] = []
        var needed = from == 0
        for info in segmentInfos {
            let path = dir + "/" + Self.segmentName(info.number)
            if !needed, let last = info.lastSeq, last >= max(from, first) { needed = true }
            let isCurrent = info.number == current
            if needed {
                // A closed segment up to its records (its reserved zeros may still be being cut on the sync thread).
                let length = isCurrent ? written : (info.bytes > 0 ? info.bytes : nil)
                files.append(opened(path, length: length, info: info, isCurrent: isCurrent))
            } else {
                files.append(.init(fd: -1, path: path, length: 0, info: info, isCurrent: isCurrent, openError: nil))
            }
        }
        let newestCheckpoint = checkpoint ? Self.checkpoints(dir).last.map { opened($0.path, length: nil, info: nil, isCurrent: false) } : nil
        return JournalReadView(first: first, segments: files, checkpoint: newestCheckpoint)
    }
}

/// Reads a segment's records through a descriptor, a chunk at a time, up to a length captured before: what
/// `JournalScan` finds in a whole file, without holding the file in memory. A record's body is
/// `buffer[range]` for the range `next()` returned, until the next call.
struct RecordStream {
    static let chunk = 1 << 20
    let fd: Int32
    let length: Int
    private(set) var buffer: [UInt8] = []
    /// The file offset of `buffer[0]`.
    private var base = 0
    /// The index in `buffer` of the next record's header.
    private var pos = 0
    /// Why the file cannot be read on (a bad header, a corrupt record, a read that failed).
    private(set) var problem: String?
    /// Where a torn last record starts (the file ends in one, or in zeros), if it does.
    private(set) var tornAt: Int?
    private var started = false

    init(fd: Int32, length: Int) {
        self.fd = fd
        self.length = length
    }

    /// The next whole record's body, or nil at the end (see `problem` and `tornAt`).
    mutating func next() -> Range<Int>? {
        if !started {
            started = true
            guard readHeader() else { return nil }
        }
        guard problem == nil, tornAt == nil else { return nil }
        let at = base + pos
        if at >= length { return nil }
        guard length - at >= recordHeaderSize else { tornAt = at; return nil }
        guard ensure(recordHeaderSize) else { return nil }
        let bodyLength = Int(readBigEndian(buffer, pos))
        guard CRC32C.checksum(buffer[pos..<(pos + 4)]) == readBigEndian(buffer, pos + 4) else {
            if onlyZeros(from: at + 8) { tornAt = at } else {
                problem = "the length of the record at \(at) fails its checksum"
            }
            return nil
        }
        if bodyLength > maxRecordBytes {
            problem = "a record length of \(bodyLength) bytes (at most \(maxRecordBytes))"
            return nil
        }
        let end = at + recordHeaderSize + bodyLength
        if end > length { tornAt = at; return nil }
        guard ensure(recordHeaderSize + bodyLength) else { return nil }
        let crc = readBigEndian(buffer, pos + 8)
        let body = (pos + recordHeaderSize)..<(pos + recordHeaderSize + bodyLength)
        if CRC32C.checksum(buffer[body]) != crc {
            if end == length || onlyZeros(from: end) { tornAt = at } else {
                problem = "the checksum of the record at \(at) does not match its \(bodyLength) bytes"
            }
            return nil
        }
        pos = body.upperBound
        return body
    }

    /// Whether every byte of the file from `offset` to the captured length is zero.
    func onlyZeros(from offset: Int) -> Bool {
        var at = offset
        var chunk = [UInt8](repeating: 0, count: min(Self.chunk, max(0, length - offset)))
        while at < length {
            let want = min(chunk.count, length - at)
            let n = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(at)) }
            if n <= 0 { if n < 0 && errno == EINTR { continue }; return false }
            if !isZeros(Array(chunk[..<n]), from: 0) { return false }
            at += n
        }
        return true
    }

    private mutating func readHeader() -> Bool {
        guard length >= SegmentHeader.size else {
            tornAt = 0
            return false
        }
        guard ensure(SegmentHeader.size) else { return false }
        guard buffer.starts(with: SegmentHeader.magic) else {
            problem = "it does not start with FLUXJRNL"
            return false
        }
        let version = UInt16(buffer[8]) << 8 | UInt16(buffer[9])
        guard version >= 1, version <= SegmentHeader.currentVersion else {
            problem = "format version \(version); this fluxd reads 1 to \(SegmentHeader.currentVersion)"
            return false
        }
        pos = SegmentHeader.size
        return true
    }

    /// Makes `buffer[pos..<(pos + count)]` hold the file's bytes (the caller checked they are below `length`).
    private mutating func ensure(_ count: Int) -> Bool {
        if buffer.count - pos >= count { return true }
        if pos > 0 {
            buffer.removeSubrange(..<pos)
            base += pos
            pos = 0
        }
        let have = buffer.count
        let want = min(max(count - have, Self.chunk), length - base - have)
        guard want > 0 else { return false }
        var failed: Int32 = 0
        let fd = self.fd, offset = base + have
        let more = [UInt8](unsafeUninitializedCapacity: want) { out, filled in
            var got = 0
            while got < want {
                let n = pread(fd, out.baseAddress! + got, want - got, off_t(offset + got))
                if n < 0 { if errno == EINTR { continue }; failed = errno; break }
                if n == 0 { break }
                got += n
            }
            filled = got
        }
        buffer.append(contentsOf: more)
        if buffer.count - pos >= count { return true }
        problem = failed != 0 ? "cannot be read: \(String(cString: strerror(failed)))"
            : "is shorter than the \(length) bytes it had (offset \(base + buffer.count))"
        return false
    }
}
