import FluxJournal
import FluxRouter
import Glibc

// The daemon's side of the journal: writing what the router staged before each iteration's frames, holding frames
// while a full disk refuses the write, charging staged bytes to the memory budget, the sync timer, and the log
// lines of its refusals and notes. Loop thread only, like the daemon.
extension Daemon {
    /// Logs when the journal starts or stops refusing work for a full disk.
    func noteDiskFull() {
        guard let journal, journal.isRefusing || refusingDiskFull else { return }
        var now = false
        if case .diskFull? = journal.refusal { now = true }
        guard now != refusingDiskFull else { return }
        refusingDiskFull = now
        if now, case .diskFull(let why)? = journal.refusal {
            logger.warning("journal: \(why); new dispatches are refused disk-full until space returns")
        } else {
            logger.notice("journal: space is back; accepting new work again")
        }
    }


    func accountStagedJournal() {
        guard let journal else { return }
        let staged = journal.stagedBytes
        guard staged != journalCharged else { return }
        let memory = core.router.memory
        let account = journalAccount ?? memory.userAccount(uid: geteuid())
        journalAccount = account
        if staged > journalCharged { memory.force(account, staged - journalCharged) } else { memory.release(account, journalCharged - staged) }
        journalCharged = staged
    }

    /// Writes what the router journaled while handling this iteration's events (before any frame is written):
    /// returns whether frames may be written now.
    func commitJournal() -> Bool {
        defer { if journalCharged != 0 || heldForJournal { accountStagedJournal() } }
        guard let journal else { return true }
        if !journal.hasStaged && !heldForJournal && !journal.isRefusing { return true }
        switch journal.commit(now: loop.now) {
        case .written:
            if journal.openingNotes.count != journalNotesLogged { logJournalNotes(journal) }
            if heldForJournal {
                heldForJournal = false
                logger.notice("journal: written again; the frames held back go out")
            }
            noteDiskFull()
            return true
        case .diskFull:
            if !heldForJournal {
                heldForJournal = true
                logger.error("journal: the disk is full and the reserved space is used up; frames are held until a write succeeds")
            }
            return false
        case .failed:
            if !journalFailureLogged, case .failed(let why)? = journal.refusal {
                journalFailureLogged = true
                logger.critical("journal: \(why)")
            }
            // `always` promised the records durable before their frames: they are not, so the frames stay.
            return journal.options.durability != .always
        }
    }


    func logJournalNotes(_ journal: Journal) {
        let notes = journal.openingNotes
        if journalNotesLogged > notes.count { journalNotesLogged = notes.count; return }
        for note in notes[journalNotesLogged...] { logger.warning("journal: \(note)") }
        journalNotesLogged = notes.count
    }

    /// The journal's timer: syncs in `batch` mode, and retries a full disk.
    func journalTimerFired() {
        guard let journal else { return }
        if !journal.syncIfDue(now: loop.now), !journalFailureLogged, case .failed(let why)? = journal.refusal {
            journalFailureLogged = true
            logger.critical("journal: \(why)")
        }
        if case .diskFull? = journal.refusal {
            journal.retrySpace(now: loop.now)
            loop.requestBeforeFlush()
        }
        noteDiskFull()
    }
}
