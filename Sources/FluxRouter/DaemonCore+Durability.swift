import FluxCore
import FluxJournal

// The host of durability (SPEC §15, issue 27): what a durable bus does around the router's journaling, in the
// core so that fluxd, the in-memory bus and the router tests run the same policy. The router stages records
// (`JournalWriting`); here, once per batch of events, before the batch's frames are written:
// - what was staged is written (`JournalCommitting.commit`); frames may go only once it is, so no frame ever
//   reveals an unwritten record;
// - a full disk holds every frame until a write succeeds (retried at each batch and from the adapter's timer),
//   and the records waiting in memory are charged to the memory budget (fluxd's own account);
// - a write or sync that failed for good stops new work (the journal refuses it) and, in `always` mode, keeps the
//   frames held: they were promised only after their records were durable;
// - the journal's notes and the turns of its refusals are logged, once each.
// The adapter calls `commitJournal` from its flush hook and `journalTimer` from a timer; nothing here does I/O.

/// What the host of durability keeps between batches.
struct DurabilityHost {
    /// Frames are held back: the journal could not write what they reveal (a full disk).
    var held = false
    var failureLogged = false
    var refusingDiskFull = false
    /// Staged bytes charged to the memory budget, and the account they are charged to.
    var charged = 0
    var account: MemoryBudget.Account?
    var uid: UInt32 = 0
    var notesLogged = 0
}

extension DaemonCore {
    /// Makes the bus durable on the journal it was made with (`init(config:transport:journal:)`), before any
    /// peer connects: the router takes over what the journal recovered (`recovered`: seqs, stores, states,
    /// outcomes) and from then journals every accepted action, result and state into it. Records held in memory
    /// while a full disk refuses them are charged to `uid`'s account (fluxd's own user).
    public func attachJournal(recovered: JournalState, chargedTo uid: UInt32, now: Millis) {
        guard let journal = committer else { preconditionFailure("attachJournal: this core was made without a journal") }
        for note in journal.notes { onLog?(.notice, "journal: \(note)") }
        durability.notesLogged = journal.notes.count
        router.restore(from: recovered, now: now)
        for problem in router.restoreProblems { onLog?(.error, "journal: \(problem)") }
        router.startJournaling()
        durability.uid = uid
        // The run's first block of seqs, reserved, written and synced here, before the adapter serves anyone: no
        // dispatch waits for a sync on the loop (the later blocks are made durable off the loop, ahead of need;
        // issue 27). A failed write is retried by the first commit, which then syncs as before.
        if router.reserveFirstSeqs(), journal.commit(now: UInt64(now)) == .written { journal.sync(now: UInt64(now)) }
    }

    /// Writes what the router journaled while handling this batch's events; call before any of its frames is
    /// written. Returns whether frames may be written now (false: hold them all and call again before the next
    /// flush: the write is retried then).
    public func commitJournal(now: Millis) -> Bool {
        // (`committer` is a `let`, called through in place: this runs at every loop iteration of a durable fluxd,
        // and a copy of the existential, from a `var` or into a local a `defer` captured, cost a retain and a
        // release each time.)
        guard committer != nil else { return true }
        let mayWrite = commitStaged(now: now)
        if durability.charged != 0 || durability.held { accountStagedJournal(committer!) }
        return mayWrite
    }

    private func commitStaged(now: Millis) -> Bool {
        if !committer!.hasStaged && !durability.held && !committer!.isRefusing { return true }
        switch committer!.commit(now: UInt64(now)) {
        case .written:
            if committer!.noteCount != durability.notesLogged { logNotes(committer!) }
            if durability.held {
                durability.held = false
                onLog?(.notice, "journal: written again; the frames held back go out")
            }
            if committer!.isRefusing || durability.refusingDiskFull { noteDiskFull(committer!) }
            return true
        case .diskFull:
            if !durability.held {
                durability.held = true
                onLog?(.error, "journal: the disk is full and the reserved space is used up; frames are held until a write succeeds")
            }
            return false
        case .failed:
            logFailure(committer!)
            return !committer!.holdsFramesWhenFailed
        }
    }

    /// The adapter's journal timer (every `syncInterval` in `batch` mode; often enough to retry a full disk):
    /// starts a sync that is due, retries a full disk. Returns whether a commit is wanted before the next flush
    /// (frames may be waiting for the space).
    public func journalTimer(now: Millis) -> Bool {
        guard let journal = committer else { return false }
        if !journal.syncIfDue(now: UInt64(now)) { logFailure(journal) }
        var wantsCommit = false
        if case .diskFull? = journal.refusal {
            journal.retrySpace(now: UInt64(now))
            wantsCommit = true
        }
        noteDiskFull(journal)
        return wantsCommit
    }

    /// Whether frames are held back now because the journal could not write what they reveal.
    public var holdsFramesForJournal: Bool { durability.held }

    private func logFailure(_ journal: any JournalCommitting) {
        if !durability.failureLogged, case .failed(let why)? = journal.refusal {
            durability.failureLogged = true
            onLog?(.critical, "journal: \(why)")
        }
    }

    private func logNotes(_ journal: any JournalCommitting) {
        let notes = journal.notes
        guard notes.count != durability.notesLogged else { return }
        if durability.notesLogged > notes.count { durability.notesLogged = notes.count; return }
        for note in notes[durability.notesLogged...] { onLog?(.warning, "journal: \(note)") }
        durability.notesLogged = notes.count
    }

    /// Logs when the journal starts or stops refusing work for a full disk.
    private func noteDiskFull(_ journal: any JournalCommitting) {
        guard journal.isRefusing || durability.refusingDiskFull else { return }
        var now = false
        if case .diskFull? = journal.refusal { now = true }
        guard now != durability.refusingDiskFull else { return }
        durability.refusingDiskFull = now
        if now, case .diskFull(let why)? = journal.refusal {
            onLog?(.warning, "journal: \(why); new dispatches are refused disk-full until space returns")
        } else {
            onLog?(.notice, "journal: space is back; accepting new work again")
        }
    }

    /// Charges the records waiting in memory to the memory budget (SPEC §12), as they change.
    private func accountStagedJournal(_ journal: any JournalCommitting) {
        let staged = journal.stagedBytes
        guard staged != durability.charged else { return }
        let memory = router.memory
        let account = durability.account ?? memory.userAccount(uid: durability.uid)
        durability.account = account
        if staged > durability.charged {
            memory.force(account, staged - durability.charged)
        } else {
            memory.release(account, durability.charged - staged)
        }
        durability.charged = staged
    }
}
