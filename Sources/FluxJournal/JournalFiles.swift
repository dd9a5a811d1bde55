import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// The journal's files (docs/journal.md): names, the lock, the epoch, recovery from checkpoints and segments,
// atomic writes; and the small file helpers and the background sync they use. The journal's writing side is
// Journal.swift.

extension Journal {

    /// The file name of segment `n`.
    public static func segmentName(_ n: Int) -> String {
        let digits = String(n)
        return "journal-" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits + ".fjl"
    }

    /// The file name of the checkpoint of everything through segment `n`.
    public static func checkpointName(_ n: Int) -> String {
        let digits = String(n)
        return "checkpoint-" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits + ".fjc"
    }

    /// The checkpoints in `dir`, by number.
    public static func checkpoints(_ dir: String) -> [(number: Int, path: String)] {
        files(dir, prefix: "checkpoint-", suffix: ".fjc")
    }

    /// The segments in `dir`, by number.
    public static func segments(_ dir: String) -> [(number: Int, path: String)] {
        files(dir, prefix: "journal-", suffix: ".fjl")
    }

    static func files(_ dir: String, prefix: String, suffix: String) -> [(number: Int, path: String)] {
        guard let d = opendir(dir) else { return [] }
        defer { closedir(d) }
        var found: [(Int, String)] = []
        while let entry = readdir(d) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard name.hasPrefix(prefix), name.hasSuffix(suffix),
                  let n = Int(name.dropFirst(prefix.count).dropLast(suffix.count)) else { continue }
            found.append((n, dir + "/" + name))
        }
        return found.sorted { $0.0 < $1.0 }
    }

    static func makeDirectory(_ dir: String) throws(JournalError) {
        var path = ""
        for part in dir.split(separator: "/", omittingEmptySubsequences: false) {
            path += (path.isEmpty && dir.hasPrefix("/") ? "" : (path.isEmpty ? "" : "/")) + part
            if path.isEmpty { path = "/"; continue }
            if mkdir(path, 0o700) != 0 && errno != EEXIST {
                throw JournalError("cannot create the data directory \(dir): \(String(cString: strerror(errno)))")
            }
        }
        var st = stat()
        guard stat(dir, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
            throw JournalError("the data directory \(dir) is not a directory")
        }
        guard st.st_uid == geteuid() else {
            throw JournalError("the data directory \(dir) is owned by uid \(st.st_uid), not by fluxd's user (\(geteuid()))")
        }
        guard st.st_mode & 0o022 == 0 else {
            throw JournalError("the data directory \(dir) is writable by group or others (mode \(String(st.st_mode & 0o777, radix: 8))); chmod go-w it")
        }
    }

    /// Takes the directory's lock (held while the process lives; the kernel drops it when fluxd dies).
    static func lock(_ dir: String) throws(JournalError) -> Int32 {
        let path = dir + "/LOCK"
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw JournalError("cannot open \(path): \(String(cString: strerror(errno)))") }
        // A lock still held for a moment is no other fluxd: a process forked by the previous holder (a worker being
        // spawned) shares the lock's open file until it execs (O_CLOEXEC closes it then). So a held lock is tried
        // again for up to half a second before it counts as another fluxd's.
        var tries = 0
        while flock(fd, LOCK_EX | LOCK_NB) != 0 && (errno == EWOULDBLOCK || errno == EINTR) && tries < 50 {
            tries += 1
            usleep(10_000)
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let holder = readSmallFile(path).flatMap { Int32($0.trimmingCharacters(in: " \n")) }
            Glibc.close(fd)
            throw JournalError("the data directory \(dir) is in use by another fluxd\(holder.map { " (pid \($0))" } ?? ""); stop it, or give this one its own --data-dir (or --ephemeral)")
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        return fd
    }

    static func readOrMakeEpoch(_ dir: String) throws(JournalError) -> String {
        let path = dir + "/EPOCH"
        if let text = readSmallFile(path) {
            let epoch = text.trimmingCharacters(in: " \n")
            guard !epoch.isEmpty else { throw JournalError("\(path) is empty; restore it, or move the directory away to start a new history") }
            return epoch
        }
        guard segments(dir).isEmpty else {
            throw JournalError("\(path) is missing but the directory holds journal segments; restore it, or move the directory away to start a new history")
        }
        let epoch = randomHex(16)
        try writeFileAtomically(path, Array((epoch + "\n").utf8), dir: dir)
        return epoch
    }

    /// Reads every segment into `state`. Returns the last segment's number and valid length (nil: none).
    static func recover(_ dir: String, into state: inout JournalState, repair: Bool, notes: inout [String],
                        infos: inout [SegmentInfo])
        throws(JournalError) -> (Int?, Int?)
    {
        var all = segments(dir)
        // The newest checkpoint that reads whole (they are written atomically; an older one is the fallback),
        // then the segments after it.
        var covered = 0
        for candidate in checkpoints(dir).reversed() {
            guard let bytes = readWholeFile(candidate.path) else { continue }
            let scan = JournalScan(bytes)
            guard scan.problem == nil, scan.tornBytes == 0, !scan.records.isEmpty else {
                notes.append("skipped the checkpoint \(candidate.path): it does not read whole")
                continue
            }
            var loaded = JournalState(outcomes: state.outcomes)
            var ok = true
            for range in scan.records {
                guard let records = try? RecordDecoder.decodeAll(bytes, range) else { ok = false; break }
                for record in records { loaded.apply(record) }
            }
            guard ok else {
                notes.append("skipped the checkpoint \(candidate.path): a record does not decode")
                continue
            }
            state = loaded
            covered = candidate.number
            notes.append("loaded the checkpoint \(candidate.path) (\(scan.records.count) records)")
            break
        }
        // Segments the checkpoint covers are history only (kept for `history` until retention deletes them).
        for segment in all where segment.number <= covered {
            let info: SegmentInfo
            if let s = state.segmentSummaries[segment.number] {
                // Described by the checkpoint: not read now (damage in it is found, and said, when history reads it).
                info = SegmentInfo(number: segment.number, firstSeq: s.actions > 0 ? s.firstSeq : nil,
                                   lastSeq: s.actions > 0 ? s.lastSeq : nil, lastTime: s.lastTime, actions: s.actions)
            } else {
                info = scanInfo(segment)
            }
            if let damage = info.damage {
                notes.append("history behind the checkpoint is damaged: \(damage); what follows it in that segment cannot be read (history and state-at say so)")
            }
            infos.append(info)
        }
        all.removeAll { $0.number <= covered }
        if let first = all.first, first.number != covered + 1 {
            throw JournalError("the journal is missing segments \(covered + 1) to \(first.number - 1) (before \(first.path)); restore them, or move the data directory away to start a new history")
        }
        // A segment made ahead of a roll-over (`Journal.prepareNextSegment`: a header and zeros) that a crash left
        // without a record is not history: removed, so that the segment before it is the last one, whose torn
        // tail (a crash in the middle of its write) is then dropped as such rather than taken for corruption.
        while all.count > 1, let bytes = readWholeFile(all[all.count - 1].path) {
            let scan = JournalScan(bytes)
            guard scan.problem == nil, scan.records.isEmpty else { break }
            let path = all.removeLast().path
            unlink(path)
            notes.append("removed \(path): a segment started or made ahead of a roll-over that holds no record")
        }
        var last: (Int, Int)?
        for (index, segment) in all.enumerated() {
            guard let bytes = readWholeFile(segment.path) else {
                throw JournalError("cannot read \(segment.path): \(String(cString: strerror(errno)))")
            }
            let scan = JournalScan(bytes)
            let isLast = index == all.count - 1
            var cut: (offset: Int, why: String)?
            switch scan.problem {
            case .notASegment(let reason)?:
                throw JournalError("\(segment.path) is not a journal segment this fluxd can read: \(reason)")
            case .corrupt(let offset, let reason)?:
                cut = (offset, reason)
            case nil:
                if scan.tornBytes > 0 && !isLast && !isZeros(bytes, from: scan.validEnd) {
                    cut = (scan.validEnd, "a record cut short in a segment that later segments follow")
                }
            }
            var applied = 0
            var info = SegmentInfo(number: segment.number)
            for range in scan.records {
                if let c = cut, range.lowerBound >= c.offset { break }
                do {
                    for record in try RecordDecoder.decodeAll(bytes, range) {
                        if case .action(let a) = record {
                            if info.firstSeq == nil { info.firstSeq = a.seq }
                            info.lastSeq = a.seq
                            info.actions += 1
                            info.lastTime = a.time
                        }
                        state.apply(record)
                        applied += 1
                    }
                } catch {
                    cut = (range.lowerBound - recordHeaderSize, "a record that does not decode: \(error)")
                    break
                }
            }
            if let c = cut {
                let later = all[(index + 1)...].map(\.path)
                let lost = "the \(bytes.count - c.offset) bytes from offset \(c.offset) of \(segment.path)"
                    + (later.isEmpty ? "" : " and the later segments \(later.joined(separator: ", "))")
                guard repair else {
                    throw JournalError("the journal is corrupt: \(segment.path) at offset \(c.offset): \(c.why). fluxd --repair cuts it there, losing \(lost); or move the data directory away to start a new history")
                }
                try truncateFile(segment.path, to: c.offset)
                for path in later { unlink(path) }
                notes.append("repaired the journal: cut \(segment.path) at offset \(c.offset) (\(c.why)); lost \(lost)")
                infos.append(info)
                return (segment.number, c.offset)
            }
            if scan.tornBytes > 0 && isZeros(bytes, from: scan.validEnd) {
                // Zeros reserved ahead of the writes (not a record): the last segment goes on writing over them;
                // an earlier one (a crash before it was closed) gives them back.
                if !isLast { try truncateFile(segment.path, to: scan.validEnd) }
            } else if scan.tornBytes > 0 {
                try truncateFile(segment.path, to: scan.validEnd)
                notes.append("dropped a torn last record (\(scan.tornBytes) bytes at offset \(scan.validEnd) of \(segment.path)): a crash while it was written; it was never revealed to a peer in a durable mode")
            }
            if scan.validEnd < SegmentHeader.size {
                // A crash while a new segment was started (empty, or its header cut short): it goes, and the
                // segment before it stays the last one (full, so a new segment follows it).
                unlink(segment.path)
                notes.append("removed \(segment.path): a crash while it was started left no record in it")
                continue
            }
            last = (segment.number, scan.validEnd)
            infos.append(info)
            _ = applied
        }
        notes.append("read \(all.count) journal segment\(all.count == 1 ? "" : "s"): \(state.recordCount) records, \(state.actionCount) actions, \(state.stores.count) stores, \(state.pending.count) unsettled")
        return (last?.0, last?.1)
    }

    /// The actions' seqs and times of a segment, read without applying it (a segment behind a checkpoint).
    static func scanInfo(_ segment: (number: Int, path: String)) -> SegmentInfo {
        var info = SegmentInfo(number: segment.number)
        guard let bytes = readWholeFile(segment.path) else {
            info.damage = "\(segment.path) cannot be read"
            return info
        }
        let scan = JournalScan(bytes)
        switch scan.problem {
        case .corrupt(let offset, let reason)?: info.damage = "\(segment.path) is damaged at offset \(offset): \(reason)"
        case .notASegment(let reason)?: info.damage = "\(segment.path) is not a segment: \(reason)"
        case nil:
            if scan.tornBytes > 0 && !isZeros(bytes, from: scan.validEnd) {
                info.damage = "\(segment.path) ends in a record cut short at offset \(scan.validEnd)"
            }
        }
        for range in scan.records {
            for case .action(let a) in (try? RecordDecoder.decodeAll(bytes, range)) ?? [] {
                if info.firstSeq == nil { info.firstSeq = a.seq }
                info.lastSeq = a.seq
                info.lastTime = a.time
                info.actions += 1
            }
        }
        return info
    }

    static func open(_ dir: String, _ n: Int, existingLength: Int?,
                     _ makeFile: (String) throws(StorageError) -> any AppendFile) throws(JournalError) -> SegmentWriter {
        let path = dir + "/" + segmentName(n)
        do {
            let file = try makeFile(path)
            return try SegmentWriter(file: file, existingLength: existingLength)
        } catch {
            throw JournalError("cannot open the journal segment \(path): \(error)")
        }
    }

    static func syncDirectory(_ dir: String) throws(JournalError) {
        let fd = Glibc.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw JournalError("cannot open \(dir): \(String(cString: strerror(errno)))") }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else { throw JournalError("cannot sync \(dir): \(String(cString: strerror(errno)))") }
    }

    static func truncateFile(_ path: String, to length: Int) throws(JournalError) {
        guard Glibc.truncate(path, off_t(length)) == 0 else {
            throw JournalError("cannot truncate \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// Writes `bytes` to `path` atomically: a temporary file, fsync, rename, fsync of the directory.
    public static func writeFileAtomically(_ path: String, _ bytes: [UInt8], dir: String) throws(JournalError) {
        let temp = path + ".tmp"
        let fd = Glibc.open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw JournalError("cannot create \(temp): \(String(cString: strerror(errno)))") }
        var ok = bytes.withUnsafeBytes { raw in
            var at = 0
            while at < raw.count {
                let n = write(fd, raw.baseAddress! + at, raw.count - at)
                if n < 0 { if errno == EINTR { continue }; return false }
                at += n
            }
            return true
        }
        ok = ok && fsync(fd) == 0
        Glibc.close(fd)
        guard ok, rename(temp, path) == 0 else {
            let e = errno
            unlink(temp)
            throw JournalError("cannot write \(path): \(String(cString: strerror(e)))")
        }
        try syncDirectory(dir)
    }
}

/// An open file descriptor holding a `flock`, closed (and so unlocked) exactly once: by `release()` (a journal's
/// clean close) or when the object goes, whichever comes first.
final class LockFile {
    private var fd: Int32
    init(fd: Int32) { self.fd = fd }

    /// Unlocks now (a closed journal must not keep its data directory locked until it is deallocated).
    func release() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
    }

    deinit { release() }
}

/// Whether every byte of `bytes` from `offset` on is zero (eight at a time).
func isZeros(_ bytes: [UInt8], from offset: Int) -> Bool {
    bytes.withUnsafeBytes { raw in
        var i = offset
        let n = raw.count
        while i < n && i % 8 != 0 { if raw[i] != 0 { return false }; i += 1 }
        while i + 8 <= n {
            if raw.loadUnaligned(fromByteOffset: i, as: UInt64.self) != 0 { return false }
            i += 8
        }
        while i < n { if raw[i] != 0 { return false }; i += 1 }
        return true
    }
}

func readWholeFile(_ path: String) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { return nil }
    let size = Int(st.st_size)
    var ok = true
    // Read into uninitialised storage (a zero-filled 64 MiB buffer cost a fifth of a restart).
    let out = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
        var at = 0
        while at < size {
            let n = read(fd, buffer.baseAddress! + at, size - at)
            if n < 0 { if errno == EINTR { continue }; ok = false; break }
            if n == 0 { break }
            at += n
        }
        count = at
    }
    return ok ? out : nil
}

func readSmallFile(_ path: String) -> String? {
    readWholeFile(path).map { String(decoding: $0, as: UTF8.self) }
}

func randomHex(_ bytes: Int) -> String {
    var g = SystemRandomNumberGenerator()
    return (0..<bytes).map { _ in
        let b = UInt8.random(in: 0...255, using: &g)
        let digits = Array("0123456789abcdef")
        return String([digits[Int(b >> 4)], digits[Int(b & 15)]])
    }.joined()
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        var s = Substring(self)
        while let f = s.first, chars.contains(f) { s = s.dropFirst() }
        while let l = s.last, chars.contains(l) { s = s.dropLast() }
        return String(s)
    }
}

/// Runs `fdatasync` on a second descriptor of a segment on a serial queue of its own, one at a time, and keeps
/// the first failure for the journal's thread to take (a failed sync is final: SPEC §15.2).
final class BackgroundSync: Sendable {
    private let queue = DispatchQueue(label: "fluxd.journal.sync")
    private let state = Mutex<(busy: Bool, failure: StorageError?, mark: UInt64)>((false, nil, 0))

    var isBusy: Bool { state.withLock { $0.busy } }

    /// The highest `mark` of a sync that succeeded: what the caller said the synced bytes held (the journal's seq
    /// reservation written before the sync started).
    var syncedMark: UInt64 { state.withLock { $0.mark } }

    func takeFailure() -> StorageError? {
        state.withLock { s in
            defer { s.failure = nil }
            return s.failure
        }
    }

    func sync(_ fd: Int32, path: String, observer: (@Sendable (UInt64) -> Void)? = nil, mark: UInt64 = 0) {
        state.withLock { $0.busy = true }
        queue.async { [self] in
            let started = monotonicNanoseconds()
            let failed = fdatasync(fd) != 0 ? StorageError(operation: "fdatasync", errno: errno, path: path) : nil
            if failed == nil { observer?(monotonicNanoseconds() &- started) }
            close(fd)
            self.state.withLock { s in
                s.busy = false
                if s.failure == nil, let failed { s.failure = failed }
                if failed == nil { s.mark = max(s.mark, mark) }
            }
        }
    }

    /// Runs `work` on the sync thread, after everything queued before it.
    func run(_ work: @escaping @Sendable () -> Void) { queue.async(execute: work) }

    /// Waits until the sync under way (if any) is done.
    func wait() { queue.sync {} }
}

/// A segment file made ready on the sync thread for the loop's next roll-over: opened, its header written, space
/// reserved up to `reservedEnd`. `@unchecked Sendable`: made on the sync thread and handed over once, through
/// `NextSegment`'s lock; only the journal's thread uses it after.
final class PreparedSegment: @unchecked Sendable {
    let number: Int
    let file: PosixFile
    let reservedEnd: Int

    private init(number: Int, file: PosixFile, reservedEnd: Int) {
        self.number = number
        self.file = file
        self.reservedEnd = reservedEnd
    }

    /// Creates segment `number` at `path` (which must not hold anything: a file left there is not touched), or
    /// nil when it cannot (a full disk: the roll-over then opens the segment itself and handles the error).
    static func make(path: String, number: Int, reserveEnd: Int) -> PreparedSegment? {
        guard let file = try? PosixFile(path: path) else { return nil }
        guard (try? file.length()) == 0 else {
            file.close()
            return nil
        }
        do throws(StorageError) {
            let header = SegmentHeader.bytes()
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: header.count, alignment: 1)
            defer { buffer.deallocate() }
            buffer.copyBytes(from: header)
            try file.write(UnsafeRawBufferPointer(buffer), at: 0)
            try file.reserve(upTo: reserveEnd, writeZeros: false)
        } catch {
            file.close()
            unlink(path)
            return nil
        }
        return PreparedSegment(number: number, file: file, reservedEnd: reserveEnd)
    }
}

/// Where the sync thread leaves the next segment it made (`Journal.prepareNextSegment`).
final class NextSegment: Sendable {
    /// The number asked for and what came of it (nil segment: it could not be made).
    private let slot = Mutex<(number: Int, segment: PreparedSegment?)?>(nil)

    func put(_ number: Int, _ segment: PreparedSegment?) { slot.withLock { $0 = (number, segment) } }

    /// What came of segment `number`: nil while it is still being made.
    func take(_ number: Int) -> (number: Int, segment: PreparedSegment?)? {
        slot.withLock { s in
            guard let done = s, done.number == number else { return nil }
            s = nil
            return done
        }
    }
}

/// Checkpoints the sync thread wrote, waiting for the loop thread to take them in.
final class FinishedCheckpoints: Sendable {
    private let list = Mutex<[Journal.WrittenCheckpoint]>([])

    func add(_ written: Journal.WrittenCheckpoint) { list.withLock { $0.append(written) } }

    func take() -> [Journal.WrittenCheckpoint] {
        list.withLock { l in
            defer { l = [] }
            return l
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (how long a sync took, for `Journal.syncObserver`; fluxd's metrics' clock).
public func monotonicNanoseconds() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return UInt64(t.tv_sec) &* 1_000_000_000 &+ UInt64(t.tv_nsec)
}
