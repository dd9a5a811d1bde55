import Glibc

// The journal's disk shares (SPEC §15.2: what each user holds, reclaiming history when space is short) and its
// checkpoints (written here or on the sync thread, then taken in on the journal's thread, with retention).
extension Journal {
    // MARK: - Disk shares


    public func diskUse(of uid: UInt32) -> Int {
        var n = (tailUsers[uid] ?? 0) + (uid == payer ? payerBytes : 0)
        for c in checkpointFiles { n += c.users[uid] ?? 0 }
        for t in retiredTails { n += t.users[uid] ?? 0 }
        return n
    }

    @inline(__always)
    public func refusesWork(of uid: UInt32) -> Bool { isRefusing || isOverDiskShare(uid) }

    @inline(__always)
    public func isOverDiskShare(_ uid: UInt32) -> Bool {
        // (A user holds at most the current segment's bytes and the kept checkpoints': below a share, nobody is
        // over it, and the dispatch path pays two additions.)
        guard writer.written &+ writer.stagedBytes &+ heldElsewhere >= diskPerUser else { return false }
        return diskUse(of: uid) >= diskPerUser
    }

    /// Bytes the journal's files take: every segment, the one being written included, and the checkpoints kept.
    public var retainedBytes: Int {
        var n = writer.written
        for info in segmentInfos where info.number != segmentNumber { n += info.bytes }
        for c in checkpointFiles { n += c.bytes }
        return n
    }

    /// The newest checkpoint's number: segments up to it are history, and may be deleted.
    var coveredThrough: Int { checkpointFiles.last?.number ?? 0 }

    /// Deletes the oldest segment behind the newest checkpoint (whatever the retention window: space is short);
    /// false when there is none.
    func reclaimOldest(_ why: String, now: Bool = true) -> Bool {
        guard let first = segmentInfos.first, first.number <= coveredThrough, first.number < segmentNumber else { return false }
        deleteSegmentFile(first.number, now: now)
        segmentInfos.removeFirst()
        segmentsDeleted += 1
        segmentsReclaimed += 1
        if segmentsReclaimed == 1 || segmentsReclaimed % 64 == 0 {
            openingNotes.append("deleted history segment \(first.number) (seqs \(first.firstSeq ?? 0)-\(first.lastSeq ?? 0)) before its retention window ended: \(why) (\(segmentsReclaimed) so far)")
        }
        return true
    }

    static func fileSize(_ path: String) -> Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : 0
    }

    // MARK: - Checkpoints

    /// Writes the checkpoint of everything through segment `n` (the state right now: nothing is staged), then
    /// deletes what it makes unneeded: older checkpoints but the previous one, and segments it covers whose
    /// actions are all beyond the retention window. With `Options.backgroundCheckpoints` the content is taken
    /// here and the rest happens on the sync thread; `settleBackground` (or the next commit or timer) sees it done.
    public func checkpoint(through n: Int, now: UInt64) {
        let summaries: [JournalRecord] = segmentInfos.filter { $0.number <= n }.map { info in
            .segmentSummary(number: UInt64(info.number), firstSeq: info.firstSeq ?? 0, lastSeq: info.lastSeq ?? 0,
                            lastTime: info.lastTime, actions: info.actions)
        }
        let dir = options.directory
        if let checkpointCapture {
            let content = checkpointCapture()
            if inBackground {
                checkpointsInFlight += 1
                let finished = self.finished
                background.run {
                    finished.add(Self.writeCheckpoint(n, dir: dir, summaries: summaries) { content.emit($0) })
                }
                return
            }
            finish(Self.writeCheckpoint(n, dir: dir, summaries: summaries) { content.emit($0) })
        } else if let checkpointSource {
            finish(Self.writeCheckpoint(n, dir: dir, summaries: summaries, checkpointSource))
        }
    }

    /// A checkpoint written (or why not).
    struct WrittenCheckpoint: Sendable {
        var number: Int
        var bytes = 0
        var users: [UInt32: Int] = [:]
        var problem: String?
    }

    /// Encodes and writes checkpoint `n` atomically, then deletes older ones but the previous one (any thread).
    static func writeCheckpoint(_ n: Int, dir: String, summaries: [JournalRecord],
                                _ records: (((JournalRecord, UInt32) -> Void) -> Void)) -> WrittenCheckpoint {
        var file = SegmentHeader.bytes()
        var body: [UInt8] = []
        var oversized: Int?
        var result = WrittenCheckpoint(number: n)
        func add(_ record: JournalRecord, _ uid: UInt32) {
            body.removeAll(keepingCapacity: true)
            RecordEncoder.record(record, into: &body)
            // (fluxd refuses states a record cannot hold before accepting them; this keeps a defect from
            // crashing a stop: the checkpoint is not written, the segments stay and replay.)
            guard body.count <= maxRecordBytes else { oversized = body.count; return }
            appendRecord(body, to: &file)
            result.users[uid, default: 0] += body.count + recordHeaderSize
        }
        records { add($0, $1) }
        for summary in summaries { add(summary, .max) }
        if let oversized {
            result.problem = "no checkpoint written: a record of \(oversized) bytes is over the \(maxRecordBytes) a record may hold"
            return result
        }
        do {
            try writeFileAtomically(dir + "/" + checkpointName(n), file, dir: dir)
        } catch {
            result.problem = "could not write a checkpoint: \(error)"
            return result
        }
        result.bytes = file.count
        for old in checkpoints(dir).dropLast(2) { unlink(old.path) }
        return result
    }

    /// Takes in a written checkpoint (loop thread): its size and users, the closed segments' tails it covers, and
    /// retention.
    func finish(_ written: WrittenCheckpoint) {
        if let problem = written.problem {
            openingNotes.append(problem)
            return
        }
        let n = written.number
        lastCheckpointBytes = written.bytes
        checkpoints += 1
        checkpointFiles.append((n, written.bytes, written.users))
        if checkpointFiles.count > 2 { checkpointFiles.removeFirst(checkpointFiles.count - 2) }
        // What the segments through n held is in the checkpoint now: their users' bytes are the checkpoint's.
        retiredTails.removeAll { $0.number <= n }
        if n >= segmentNumber {
            tailUsers.removeAll(keepingCapacity: true)
            payerBytes = 0
        }
        applyRetention(coveredThrough: n)
    }

    /// Takes in the checkpoints the sync thread finished (loop thread; cheap when none is in flight).
    func takeFinished() {
        guard checkpointsInFlight > 0 else { return }
        for written in finished.take() {
            checkpointsInFlight -= 1
            finish(written)
        }
    }

    /// Waits for the sync thread's work and takes in what it finished (tests; a clean stop).
    public func settleBackground() {
        background.wait()
        takeFinished()
    }

    /// Deletes segments numbered at most `covered` (behind a checkpoint) whose newest action is older than the
    /// retention window, oldest first (history stays contiguous).
    func applyRetention(coveredThrough covered: Int) {
        let wall = wallNow()
        let keepFromTime = wall > options.retainAge ? wall - options.retainAge : 0
        while let first = segmentInfos.first, first.number <= covered, first.number < segmentNumber {
            // Beyond the count when the segments after it hold the newest `retainActions` actions already.
            let newer = segmentInfos.dropFirst().reduce(UInt64(0)) { $0 + $1.actions }
            let beyondCount = newer >= options.retainActions
            let beyondAge = first.lastTime < keepFromTime
            if !(beyondCount || beyondAge || first.lastSeq == nil && segmentInfos.count > 1) {
                guard retainedBytes > retainBytes else { break }
                guard reclaimOldest("the journal holds more than --retain-bytes \(retainBytes)", now: false) else { break }
                continue
            }
            deleteSegmentFile(first.number)
            segmentInfos.removeFirst()
            segmentsDeleted += 1
        }
    }

    /// Deletes a segment's file: on the sync thread when slow work goes there (after the checkpoint that covers
    /// it, which is queued before), else here.
    func deleteSegmentFile(_ number: Int, now: Bool = false) {
        let path = options.directory + "/" + Self.segmentName(number)
        if inBackground && !now { background.run { unlink(path) } } else { unlink(path) }
    }
}
