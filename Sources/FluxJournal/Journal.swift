import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// When the journal's records are made durable (SPEC §15.2). In every mode records are written to the operating
/// system before any frame that reveals them leaves fluxd.
public enum Durability: String, Sendable, CaseIterable {
    /// Synced before the frames that reveal them are written (group commit: one `fdatasync` per loop iteration).
    case always
    /// Synced at most `syncInterval` ms after they were written.
    case batch
    /// Never synced by fluxd.
    case none
}

/// Why a data directory cannot be used.
public struct JournalError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// fluxd's journal in a data directory (docs/journal.md): a lock file, the epoch, and numbered segment files.
///
/// Opening it takes the directory's lock (a second fluxd is refused), reads every segment (a torn last record is
/// dropped and the file cut back, corruption refuses the start with the file and offset unless `repair`), and
/// leaves the recovered `JournalState` in `recovered`. Then the router stages records through `JournalWriting`,
/// and the host calls `commit` once per loop iteration before it writes frames, and `syncIfDue` on a timer.
/// Not thread-safe: fluxd's loop thread uses it.
public final class Journal: JournalCommitting {
    /// How a journal is kept.
    public struct Options: Sendable {
        public var directory: String
        public var durability: Durability = .batch
        /// `batch`: the longest time written records stay unsynced, in ms.
        public var syncInterval: UInt64 = 100
        /// A segment is closed and a new one started (with a checkpoint) once it holds this many bytes.
        public var segmentBytes = 64 << 20
        /// ... or once it holds this many bytes and at least as many as the last checkpoint took: a restart then
        /// reads at most about twice the checkpoint's size, and writing checkpoints costs at most as much as the
        /// records written between them (so restart time stays linear in what changed, not in one segment's
        /// worth of small patches).
        public var checkpointMinBytes = 8 << 20
        /// Disk space kept allocated ahead of the writes (SPEC §15.2: when it cannot be allocated, new work is
        /// refused `disk-full` while what was accepted still finishes in the space reserved).
        public var reserveBytes = 16 << 20
        /// Zeros written ahead at most per loop iteration (bounds how long one iteration spends on them).
        public var reserveStep = 1 << 20
        /// Seqs reserved at a time (each reservation is one synced record).
        public var seqBlock: UInt64 = 1 << 16
        /// Cut a corrupt journal back to its last good record instead of refusing to start.
        public var repair = false
        /// The outcome window (SPEC §15.4).
        public var outcomes = OutcomeLog()
        /// History kept (SPEC §15.6): a segment behind a checkpoint is deleted once every action in it is older
        /// than the newest `retainActions` actions or than `retainAge` ms.
        public var retainActions: UInt64 = 1_000_000
        public var retainAge: UInt64 = 7 * 24 * 3600 * 1000
        /// ... and the journal's files take at most this many bytes: segments behind a checkpoint are deleted,
        /// oldest first, once the files hold more, whatever `retainActions` and `retainAge` say. 0: half the data
        /// directory's file system, at most 4 GiB (`Journal.retainBytes` says what was chosen).
        public var retainBytes = 0
        /// Whether rollovers and checkpoints do their slow part (the closed segment's `fdatasync`, the directory's,
        /// encoding and writing the checkpoint, deleting what it makes unneeded) on the sync thread, in order,
        /// instead of on the caller's (the loop) thread. Needs `checkpointCapture`; not in `always` mode (its syncs
        /// are on the loop by design).
        public var backgroundCheckpoints = false
        /// The journal's bytes one user may hold (`Journal.diskUse(of:)`) before its new work is refused
        /// `disk-quota`: its records since the newest checkpoint and its part of the checkpoints kept. 0: a
        /// quarter of `retainBytes`, at least twice `checkpointMinBytes`.
        public var diskPerUser = 0

        public init(directory: String) { self.directory = directory }
    }

    public let options: Options
    /// The retention and share in force (`Options.retainBytes`, `Options.diskPerUser`, made concrete).
    public let retainBytes: Int
    public let diskPerUser: Int
    /// The history's identity (`welcome.epoch`): made when the directory is first used.
    public let epoch: String
    /// What the segments said when the journal was opened (taken by the daemon to restore the router).
    @exclusivity(unchecked) public var recovered: JournalState
    /// What opening it did, for the log: torn records dropped, segments read, repairs.
    @exclusivity(unchecked) public internal(set) var openingNotes: [String] = []
    @exclusivity(unchecked) public private(set) var refusal: JournalRefusal? {
        didSet { isRefusing = refusal != nil }
    }
    /// Whether it refuses new work (`refusal != nil`), read on every loop iteration: a stored Bool (reading the
    /// enum copies its message; from another module it cost a dynamic exclusivity check, ~76 instructions).
    @exclusivity(unchecked) public private(set) var isRefusing = false
    /// How many `notes` there are (read once per commit: cheaper than the array).
    public var noteCount: Int { openingNotes.count }
    /// Records staged and not yet written.
    public var hasStaged: Bool { writer.stagedCount > 0 }
    /// Bytes of them (held in memory: while a full disk refuses the write, they count against the memory budget).
    public var stagedBytes: Int { writer.stagedBytes }
    /// Whether written records wait for a sync (`batch`).
    public var hasUnsynced: Bool { writer.synced < writer.written }
    /// Counters for `info` and benchmarks.
    @exclusivity(unchecked) public private(set) var writes: UInt64 = 0
    @exclusivity(unchecked) public private(set) var syncs: UInt64 = 0
    @exclusivity(unchecked) public private(set) var bytesWritten: UInt64 = 0
    /// Told how long each successful sync took, in nanoseconds (fluxd's metrics: docs/metrics.md). Called on the
    /// loop thread, or on `batch` mode's sync thread: it must be thread-safe.
    @exclusivity(unchecked) public var syncObserver: (@Sendable (UInt64) -> Void)?

    /// What each segment holds (for retention and `history`): its first and last action's seq and the last
    /// one's time; nil seqs: no action in it.
    public struct SegmentInfo: Sendable, Equatable {
        public var number: Int
        public var firstSeq: UInt64?
        public var lastSeq: UInt64?
        public var lastTime: UInt64 = 0
        /// How many actions it holds (retention counts actions, not seqs: seqs jump after a restart).
        public var actions: UInt64 = 0
        /// Why its history cannot all be read (damage found in a segment behind a checkpoint), if so.
        public var damage: String?
        /// The file's size once it is closed (0 for the segment being written: `writer.written` is).
        public var bytes = 0
    }
    @exclusivity(unchecked) public internal(set) var segmentInfos: [SegmentInfo] = []
    /// The size of the last checkpoint written (see `Options.checkpointMinBytes`).
    @exclusivity(unchecked) public internal(set) var lastCheckpointBytes = 0
    /// Checkpoints written (and segments deleted by retention) since the journal was opened.
    @exclusivity(unchecked) public internal(set) var checkpoints = 0
    @exclusivity(unchecked) public internal(set) var segmentsDeleted = 0
    /// Produces a checkpoint's records, each with the user it is charged to (the router's `checkpointRecords`):
    /// set by the host; without it no checkpoint is written and no segment deleted.
    @exclusivity(unchecked) public var checkpointSource: (((JournalRecord, UInt32) -> Void) -> Void)?
    /// Takes a checkpoint's content (the router's `checkpointCapture`), cheaply, to be encoded where the
    /// checkpoint is written; preferred to `checkpointSource` when set.
    @exclusivity(unchecked) public var checkpointCapture: (() -> any CheckpointContent)?
    /// Checkpoints handed to the sync thread and not yet seen finished (loop thread).
    @exclusivity(unchecked) var checkpointsInFlight = 0
    let finished = FinishedCheckpoints()
    /// Whether slow work goes to the sync thread (`Options.backgroundCheckpoints`, not in `always` mode).
    var inBackground: Bool {
        options.backgroundCheckpoints && options.durability != .always && checkpointCapture != nil && !closing
    }
    @exclusivity(unchecked) private var closing = false
    /// Whether `close` is writing its checkpoint: a clean stop, with every record synced (the checkpoint's seq mark
    /// can then be the last seq itself: no seq above it was revealed, so the next start continues at the next one).
    public var isClosing: Bool { closing }
    /// A closed segment's sync was handed to the sync thread: a sync here waits for it first (the next segment's
    /// records must not be durable before the closed one's).
    @exclusivity(unchecked) var rolledInBackground = false
    /// The segment number `prepareNextSegment` asked the sync thread for (0: none), and where it comes back.
    @exclusivity(unchecked) var preparingSegment = 0
    let nextSegment = NextSegment()
    /// Segments deleted to make room (beyond `retainBytes`, or while the disk was full) since the journal opened.
    @exclusivity(unchecked) public internal(set) var segmentsReclaimed = 0

    // Disk shares (SPEC §15.2). A user's bytes are its records in the segment being written (since the newest
    // checkpoint) plus its records in the checkpoints kept. History behind a checkpoint is charged to nobody: it
    // is what is let go of when space is short.
    /// Bytes per user in the current segment (what `payer` has staged since it changed is added when read).
    @exclusivity(unchecked) var tailUsers: [UInt32: Int] = [:]
    /// The user the last staged records were charged to, and their bytes not yet in `tailUsers` (one dictionary
    /// update per change of user, not per record).
    @exclusivity(unchecked) var payer: UInt32 = .max
    @exclusivity(unchecked) var payerBytes = 0
    /// The checkpoints kept (at most the newest two), oldest first: number, size, bytes per user (unknown for
    /// one written by an earlier run: charged to nobody).
    @exclusivity(unchecked) var checkpointFiles: [(number: Int, bytes: Int, users: [UInt32: Int])] = [] {
        didSet { updateHeldElsewhere() }
    }
    /// The users' bytes of closed segments whose checkpoint is not written yet (still theirs until it is).
    @exclusivity(unchecked) var retiredTails: [(number: Int, bytes: Int, users: [UInt32: Int])] = [] {
        didSet { updateHeldElsewhere() }
    }
    /// The bytes of `checkpointFiles` and `retiredTails` (kept, for the dispatch path's `isOverDiskShare`).
    @exclusivity(unchecked) var heldElsewhere = 0

    private func updateHeldElsewhere() {
        heldElsewhere = checkpointFiles.reduce(0) { $0 + $1.bytes } + retiredTails.reduce(0) { $0 + $1.bytes }
    }

    /// `batch` mode's syncs, on a thread of their own.
    let background = BackgroundSync()
    /// The data directory's lock: held while this object lives (closed once, by its deinit).
    private let lock: LockFile
    @exclusivity(unchecked) var writer: SegmentWriter { didSet { stager = Unmanaged.passUnretained(writer) } }
    /// `writer`, unretained, for the hot path's records (`stage`): a call through the strong `writer` retains and
    /// releases it each time (a class property may be replaced during the call), ~22 instructions per record
    /// (issue 27). `writer` keeps it alive; both change together.
    @exclusivity(unchecked) var stager: Unmanaged<SegmentWriter>

    /// Calls `body` with the segment writer at +0.
    @inline(__always)
    private func stage(_ body: (SegmentWriter) -> Int) -> Int {
        stager._withUnsafeGuaranteedRef(body)
    }
    var writerForReads: SegmentWriter { writer }
    /// The segment being written (`JournalReadView` reads it only up to what was written).
    var currentSegmentNumber: Int { segmentNumber }
    @exclusivity(unchecked) var segmentNumber: Int
    /// A sync is due at the next commit, whatever the mode (a seq above the durable reservation is staged).
    @exclusivity(unchecked) private var mustSync = false
    /// Seq reservations (SPEC §15.1: a seq is never reused, even after a power loss): the highest one staged,
    /// the highest written to the operating system, and the highest known durable (synced). A commit that stages
    /// an action whose seq is above the durable one syncs before its frames go (on the loop, as every reservation
    /// did before issue 27); the router reserves the next block while half of the current one is left, and that
    /// reservation is made durable off the loop (the `batch` timer's sync, or one started for it), so a steady
    /// flow of actions never waits for a sync on the loop. Durable is 0 at start: the first reservation of a run
    /// syncs on the loop, with whatever an earlier run left unsynced.
    @exclusivity(unchecked) private var stagedReserve: UInt64 = 0
    @exclusivity(unchecked) private var writtenReserve: UInt64 = 0
    @exclusivity(unchecked) private(set) var durableReserve: UInt64 = 0
    /// The highest action seq staged since the last commit.
    @exclusivity(unchecked) private var stagedSeq: UInt64 = 0
    @exclusivity(unchecked) private var lastSync: UInt64 = 0
    /// Where the disk space allocated ahead of the writes ends.
    @exclusivity(unchecked) var reservedEnd = 0
    /// Called to read the wall clock (ms since the Unix epoch) for action records, when a test sets one (nil:
    /// `systemClock`, called directly: a closure call per action cost ~25 instructions).
    let wallClock: (() -> UInt64)?

    /// The wall clock (ms since the Unix epoch).
    @inline(__always)
    func wallNow() -> UInt64 {
        if let wallClock { return wallClock() }
        return Self.systemClock()
    }
    let makeFile: (String) throws(StorageError) -> any AppendFile

    /// Opens (creating if needed) the journal in `options.directory`. `makeFile` opens a segment for appending
    /// (tests pass one that fails chosen writes or syncs).
    public init(options: Options, wallClock: (() -> UInt64)? = nil,
                makeFile: @escaping (String) throws(StorageError) -> any AppendFile = { path throws(StorageError) in try PosixFile(path: path) })
        throws(JournalError)
    {
        self.options = options
        self.wallClock = wallClock
        self.makeFile = makeFile
        let dir = options.directory
        try Self.makeDirectory(dir)
        var fs = statvfs()
        let fsBytes = statvfs(dir, &fs) == 0 ? Int(fs.f_blocks) * Int(fs.f_frsize) : Int.max
        retainBytes = options.retainBytes > 0 ? options.retainBytes : min(4 << 30, fsBytes / 2)
        diskPerUser = options.diskPerUser > 0 ? options.diskPerUser : max(retainBytes / 4, 2 * options.checkpointMinBytes)
        lock = LockFile(fd: try Self.lock(dir))
        do {
            epoch = try Self.readOrMakeEpoch(dir)
            var state = JournalState(outcomes: options.outcomes)
            var notes: [String] = []
            var infos: [SegmentInfo] = []
            let (number, length) = try Self.recover(dir, into: &state, repair: options.repair, notes: &notes,
                                                    infos: &infos)
            recovered = state
            openingNotes = notes
            segmentInfos = infos
            if let number, let length, length < options.segmentBytes {
                segmentNumber = number
                writer = try Self.open(dir, number, existingLength: length, makeFile)
            } else {
                segmentNumber = (number ?? Self.checkpoints(dir).last?.number ?? 0) + 1
                writer = try Self.open(dir, segmentNumber, existingLength: nil, makeFile)
                try Self.syncDirectory(dir)
                segmentInfos.append(SegmentInfo(number: segmentNumber))
            }
            stager = Unmanaged.passUnretained(writer)  // (observers do not run in init)
            reservedEnd = (try? writer.file.length()) ?? writer.written  // zeros a previous run reserved
            for i in segmentInfos.indices where segmentInfos[i].number != segmentNumber {
                segmentInfos[i].bytes = Self.fileSize(dir + "/" + Self.segmentName(segmentInfos[i].number))
            }
            checkpointFiles = Self.checkpoints(dir).suffix(2).map { ($0.number, Self.fileSize($0.path), [:]) }
            updateHeldElsewhere()  // (observers do not run in init)
            reserveSpace()  // at start too: a full disk is refused from the start (after reclaiming history)
        }
    }

    deinit {
        writer.file.close()
    }

    public static func systemClock() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME_COARSE, &ts)
        return UInt64(ts.tv_sec) * 1000 + UInt64(ts.tv_nsec) / 1_000_000
    }

    // MARK: - JournalWriting

    public func reserveSeq(upTo: UInt64) {
        stage(.max) { RecordEncoder.seqReserve(upTo, into: &$0) }
        stagedReserve = max(stagedReserve, upTo)
    }

    public func register(store: String, handles: [String], waitFor: [String], uid: UInt32) {
        stage(uid) { RecordEncoder.register(store: store, handles: handles, waitFor: waitFor, into: &$0) }
    }

    public func action(seq: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?, id: ArraySlice<UInt8>?,
                       session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>, targets: JournalNameList) {
        stagedSeq = seq
        let time = wallNow()
        if segmentInfos.isEmpty { segmentInfos.append(SegmentInfo(number: segmentNumber)) }
        Self.count(seq: seq, time: time, in: &segmentInfos[segmentInfos.count - 1])  // (one access to the array)
        charge(uid, stage { $0.stageAction(seq: seq, time: time, typeJSON: typeJSON, origin: origin, cause: cause, id: id,
                                           session: session, uid: uid, payload: payload, targets: targets) })
    }

    @inline(__always)
    private static func count(seq: UInt64, time: UInt64, in info: inout SegmentInfo) {
        if info.firstSeq == nil { info.firstSeq = seq }
        info.lastSeq = seq
        info.actions += 1
        info.lastTime = time
    }

    public func result(seq: UInt64, store: JournalName, outcome: ResultOutcome, version: UInt64, uid: UInt32) {
        // A `done` that follows the store's new state for this action marks that state's record (format
        // version 4): no record of its own.
        if case .done = outcome, stage({ $0.markDone(seq: seq, store: store, version: version) ? 1 : 0 }) == 1 { return }
        charge(uid, stage { $0.stageResult(seq: seq, store: store, outcome: outcome, version: version) })
    }

    public func snapshot(store: JournalName, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>, uid: UInt32) {
        charge(uid, stage { $0.stageState(isPatch: false, store: store, version: version, seq: seq, bytes: state) })
    }

    public func patch(store: JournalName, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>, uid: UInt32) {
        charge(uid, stage { $0.stageState(isPatch: true, store: store, version: version, seq: seq, bytes: patch) })
    }

    public func forget(store: String, seq: UInt64, versionFloor: UInt64, uid: UInt32) {
        stage(uid) { RecordEncoder.forget(store: store, seq: seq, versionFloor: versionFloor, into: &$0) }
    }

    private func stage(_ uid: UInt32, _ encode: (inout [UInt8]) -> Void) {
        charge(uid, writer.appendEncoded(encode))
    }

    /// Charges a staged record's bytes to `uid` (the user whose work made it).
    @inline(__always)
    private func charge(_ uid: UInt32, _ bytes: Int) {
        if uid == payer { payerBytes += bytes } else { chargeTail(uid, bytes) }
    }

    func flushPayer() {
        if payerBytes > 0 { tailUsers[payer, default: 0] += payerBytes }
        payerBytes = 0
    }

    private func chargeTail(_ uid: UInt32, _ bytes: Int) {
        if payerBytes > 0 { tailUsers[payer, default: 0] += payerBytes }
        payer = uid
        payerBytes = bytes
    }

    // MARK: - Committing

    /// What a commit did.
    public typealias CommitResult = JournalCommitResult

    /// `always`: records are promised durable before their frames, so frames stay held once a write failed.
    public var holdsFramesWhenFailed: Bool { options.durability == .always }
    /// `openingNotes` (the host logs those it has not logged yet).
    public var notes: [String] { openingNotes }

    /// Writes what is staged in one write, and syncs it in `always` mode (or when a seq reservation is staged).
    /// Call before writing the frames of this loop iteration; frames may be written only after `.written`.
    public func commit(now: UInt64) -> CommitResult {
        if isRefusing, case .failed? = refusal { return .failed }
        if checkpointsInFlight > 0 { takeFinished() }
        // (`writer` read in place, and written through the +0 `stager`: a local copy of the class reference
        // retained and released it at every commit. After a roll-over below, `writer` is the new segment's.)
        if writer.stagedCount > 0 {
            let bytes = writer.stagedBytes
            do throws(StorageError) {
                while true {
                    guard let error = stager._withUnsafeGuaranteedRef({ $0.writeStaged() }) else { break }
                    guard error.isDiskFull, reclaimOldest("the disk is full") else { throw error }
                }
            } catch {
                if error.isDiskFull {
                    reservedEnd = writer.written  // the writer cut the file back to its last whole record
                    if refusal == nil { refusal = .diskFull("the journal's disk is full (\(error)); retrying") }
                    return .diskFull
                }
                refusal = .failed("the journal could not be written: \(error)")
                return .failed
            }
            writes += 1
            bytesWritten += UInt64(bytes)
            if isRefusing, case .diskFull? = refusal { refusal = nil }
            writtenReserve = max(writtenReserve, stagedReserve)
        }
        // An action's seq above the durable reservation: sync before its frames reveal it. (A journal written
        // without reservations, as some tests do, is synced as its mode says.)
        if stagedSeq > durableReserve && stagedReserve > 0 {
            durableReserve = max(durableReserve, background.syncedMark)
            if stagedSeq > durableReserve { mustSync = true }
        }
        stagedSeq = 0
        if mustSync || options.durability == .always {
            guard sync(now: now) else { return .failed }
            mustSync = false
        } else if writtenReserve > durableReserve {
            syncReservationAhead(now: now)
        }
        if writer.written >= rollOverAt {
            rollOver(now: now)
        } else if preparingSegment == 0 && writer.written >= rollOverAt / 2 {
            prepareNextSegment()
        }
        // More zeros ahead once less than half the reserve is left (never past the segment's end; while the
        // disk is full the timer retries, `retrySpace`).
        let lowWater = min(options.reserveBytes / 2, max(0, options.segmentBytes - writer.written))
        if reservedEnd - writer.written < lowWater, !isDiskFull { reserveSpace() }
        return .written
    }

    private var isDiskFull: Bool {
        if case .diskFull? = refusal { return true }
        return false
    }

    /// How far the segment should hold zeros: `reserveBytes` past the writes, but not past the segment's end
    /// and a little more (the record that crosses it; the next segment reserves its own).
    private var reserveTarget: Int {
        min(writer.written + options.reserveBytes, options.segmentBytes + (256 << 10))
    }

    /// Grows the zeros ahead of the writes towards `reserveTarget`, by at most `reserveStep` a call (a loop
    /// iteration writes and syncs at most that much of them); a failure for lack of space refuses new work
    /// until a later reservation succeeds (`retrySpace`), while what was accepted finishes in the zeros there.
    func reserveSpace() {
        // `always` writes the zeros, a step at a time, at start too (they are written and synced on the loop
        // thread); the other modes only allocate them, all at once.
        let writeZeros = options.durability == .always
        let step = !writeZeros ? Int.max / 2 : options.reserveStep
        let end = min(reserveTarget, max(reservedEnd, writer.written) + step)
        guard end > reservedEnd else {
            if isDiskFull { refusal = nil }
            return
        }
        do throws(StorageError) {
            while true {
                do {
                    try writer.file.reserve(upTo: end, writeZeros: writeZeros)
                    break
                } catch {
                    // Space is short: history behind the newest checkpoint goes first, oldest first.
                    guard error.isDiskFull, reclaimOldest("the disk is full") else { throw error }
                }
            }
            reservedEnd = end
            if isDiskFull { refusal = nil }
        } catch {
            reservedEnd = max(writer.written, (try? writer.file.length()) ?? reservedEnd)  // the zeros that made it
            if error.isDiskFull {
                if refusal == nil { refusal = .diskFull("no space to reserve for the journal (\(error))") }
            } else if refusal == nil {
                refusal = .failed("the journal could not reserve space: \(error)")
            }
        }
    }

    /// While the disk is full: tries again to reserve space (and to write what waits); new work is accepted again
    /// once it succeeds. Returns whether the journal accepts work now.
    @discardableResult
    public func retrySpace(now: UInt64) -> Bool {
        guard case .diskFull? = refusal else { return refusal == nil }
        if hasStaged, case .diskFull = commit(now: now) { return false }
        reserveSpace()
        return refusal == nil
    }

    /// `batch`: syncs what was written if the oldest unsynced write is `syncInterval` old (call from a timer).
    /// Returns false if the sync failed (fluxd stops accepting).
    @discardableResult
    public func syncIfDue(now: UInt64) -> Bool {
        if checkpointsInFlight > 0 { takeFinished() }
        if let failure = background.takeFailure() {
            refusal = .failed("the journal could not be synced (\(failure)); fluxd accepts nothing more and must be restarted")
            return false
        }
        guard options.durability == .batch, hasUnsynced, now >= lastSync + options.syncInterval else { return true }
        // On another thread, through a second descriptor of the segment (the loop goes on writing; a segment
        // closed meanwhile is still synced): `batch` promises only that records reach the disk within about
        // `syncInterval`, and a sync of 100 ms of writes held the loop for milliseconds.
        if background.isBusy { return true }
        if let fd = writer.file.duplicateDescriptor() {
            background.sync(fd, path: writer.file.path, observer: syncObserver, mark: writtenReserve)
            writer.markSynced()
            lastSync = now
            syncs += 1
            return true
        }
        return sync(now: now)
    }

    /// Syncs everything written. A failure is final (never retried: SPEC §15.2).
    @discardableResult
    public func sync(now: UInt64) -> Bool {
        if case .failed = refusal { return false }
        if rolledInBackground {
            rolledInBackground = false
            background.wait()
            if let failure = background.takeFailure() {
                refusal = .failed("the journal could not be synced (\(failure)); fluxd accepts nothing more and must be restarted")
                return false
            }
        }
        guard hasUnsynced else { lastSync = now; return true }
        let started = syncObserver != nil ? monotonicNanoseconds() : 0
        do {
            try writer.sync()
            syncObserver?(monotonicNanoseconds() &- started)
        } catch {
            refusal = .failed("the journal could not be synced (\(error)); fluxd accepts nothing more and must be restarted")
            return false
        }
        syncs += 1
        lastSync = now
        durableReserve = max(durableReserve, writtenReserve)
        return true
    }

    /// A reservation written ahead of its use is made durable off the loop: by a sync on the sync thread (started
    /// now when none is under way, else at a later commit), whose success the next commits read.
    private func syncReservationAhead(now: UInt64) {
        durableReserve = max(durableReserve, background.syncedMark)
        guard writtenReserve > durableReserve, !background.isBusy else { return }
        if let fd = writer.file.duplicateDescriptor() {
            background.sync(fd, path: writer.file.path, observer: syncObserver, mark: writtenReserve)
            writer.markSynced()
            lastSync = now
            syncs += 1
        }
    }

    /// Syncs, writes a checkpoint of everything (so the next start reads just that), and closes: a clean stop.
    /// The data directory is unlocked when it returns (another journal may open it).
    public func close(now: UInt64) {
        settleBackground()
        closing = true  // (its checkpoint is written here, before the lock goes)
        defer { lock.release() }
        guard commit(now: now) == .written, sync(now: now) else {
            writer.file.close()
            return
        }
        checkpoint(through: segmentNumber, now: now)
        try? writer.file.truncate(to: writer.written)
        writer.file.close()
    }
}
