#if canImport(Glibc)
import Glibc
#endif

// The journal's segments roll over (issue 27): the next one is made ahead on the sync thread, and at the roll-over
// the loop only switches files; the closed one is synced, cut back to its records and checkpointed off the loop
// (in `none` and `batch`).

extension Journal {
    /// Where a segment rolls over: at `checkpointMinBytes`, or the size of the last checkpoint when larger (so
    /// checkpoints stay a fraction of the journal), and at most `segmentBytes`.
    var rollOverAt: Int { min(options.segmentBytes, max(options.checkpointMinBytes, lastCheckpointBytes)) }

    /// Opens the next segment on the sync thread, its header written and its first reserve allocated, once the
    /// current one is half full: a new segment's `fallocate` held the loop 1-3 ms at every roll-over (issue 27).
    /// Only where the slow work goes to the sync thread and segments are real files.
    func prepareNextSegment() {
        guard preparingSegment == 0, inBackground, writer.file is PosixFile, writer.written >= rollOverAt / 2 else { return }
        let number = segmentNumber + 1
        preparingSegment = number
        let path = options.directory + "/" + Self.segmentName(number)
        let reserveEnd = min(SegmentHeader.size + options.reserveBytes, options.segmentBytes + (256 << 10))
        let next = nextSegment
        background.run { next.put(number, PreparedSegment.make(path: path, number: number, reserveEnd: reserveEnd)) }
    }

    /// Starts a new segment after syncing the full one.
    func rollOver(now: UInt64) {
        // The next segment made ready on the sync thread (`prepareNextSegment`), when it was asked for.
        var prepared: PreparedSegment?
        if preparingSegment == segmentNumber + 1 {
            var made = nextSegment.take(preparingSegment)
            if made == nil {
                // Still being made: the roll-over waits for a later commit (a segment rolls over at about its
                // size), up to `segmentBytes`; there (the sync thread busy for a whole segment's writes: a slow
                // disk) it waits for it, rather than make the same file here too.
                guard writer.written >= options.segmentBytes else { return }
                background.wait()
                made = nextSegment.take(preparingSegment)
            }
            preparingSegment = 0
            prepared = made?.segment  // (nil: it could not be made; opened here, with the error handled as before)
        }
        // The closed segment is made durable before anything of the next one is (on the sync thread, in order,
        // when the slow work goes there).
        let fd = inBackground ? writer.file.duplicateDescriptor() : nil
        if fd == nil { guard sync(now: now) else { return } }
        do {
            let next: SegmentWriter
            do {
                if let prepared {
                    next = try SegmentWriter(file: prepared.file, existingLength: SegmentHeader.size)
                } else {
                    next = try Self.open(options.directory, segmentNumber + 1, existingLength: nil, makeFile)
                }
            } catch {
                if let fd { Glibc.close(fd) }
                throw error
            }
            if let fd {
                // A closed segment keeps no zeros past its records: cut on the sync thread (freeing the reserve
                // held the loop 1-2 ms), before its sync there, which closes `fd`.
                let end = off_t(writer.written)
                background.run { _ = ftruncate(fd, end) }
                if writer.synced < writer.written {
                    background.sync(fd, path: writer.file.path, observer: syncObserver)
                } else {
                    background.run { Glibc.close(fd) }
                }
                rolledInBackground = true
                let dir = options.directory
                background.run { try? Self.syncDirectory(dir) }
            } else {
                try? writer.file.truncate(to: writer.written)  // a closed segment keeps no zeros past its records
                try Self.syncDirectory(options.directory)
            }
            writer.file.close()
            flushPayer()
            retiredTails.append((segmentNumber, writer.written, tailUsers))
            tailUsers.removeAll(keepingCapacity: true)
            if let i = segmentInfos.lastIndex(where: { $0.number == segmentNumber }) { segmentInfos[i].bytes = writer.written }
            writer = next
            segmentNumber += 1
            segmentInfos.append(SegmentInfo(number: segmentNumber))
            reservedEnd = prepared?.reservedEnd ?? writer.written
            reserveSpace()
        } catch {
            // The full segment stays in use; the next commit tries again.
            openingNotes.append("could not start a new segment: \(error)")
            return
        }
        checkpoint(through: segmentNumber - 1, now: now)
    }
}
