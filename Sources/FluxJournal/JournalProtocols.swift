// What the router and the host of durability ask of a journal (`Journal` in fluxd, `MemoryJournal` in tests and
// the in-memory bus), and the types they exchange.

/// What the router writes to the journal, and asks of it. `Journal` writes segment files; `MemoryJournal` keeps
/// the records in memory for tests. The router calls these on its thread while it handles an event; the records
/// are written by the host before it writes that event's frames.
public protocol JournalWriting: AnyObject {
    /// Nil while new work may be accepted; otherwise why not (the disk is full, a sync failed).
    var refusal: JournalRefusal? { get }
    /// Persists (durably, before any of them is revealed) that seqs up to `upTo` may be handed out.
    func reserveSeq(upTo: UInt64)
    /// Each record is charged to the user (`uid`) whose work made it: an action to its dispatcher, a registration
    /// to the registering peer, a result, snapshot or patch to the store's owner (SPEC §15.2, disk shares).
    func register(store: String, handles: [String], waitFor: [String], uid: UInt32)
    /// (Store names come encoded once, `JournalName` and `JournalNameList`: these are the hot path's records.)
    func action(seq: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?, id: ArraySlice<UInt8>?,
                session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>, targets: JournalNameList)
    func result(seq: UInt64, store: JournalName, outcome: ResultOutcome, version: UInt64, uid: UInt32)
    func snapshot(store: JournalName, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>, uid: UInt32)
    /// SPEC §16: a store's change as a patch (the bytes it wrote).
    func patch(store: JournalName, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>, uid: UInt32)
    /// SPEC §10: a store forgotten for good when `seq` was the last accepted action, and the version floor after it (the highest version any forgotten
    /// store reached). Charged to the operator who asked (`uid`).
    func forget(store: String, seq: UInt64, versionFloor: UInt64, uid: UInt32)
    /// The journal's bytes user `uid` holds now: its records since the newest checkpoint and its part of the
    /// checkpoints kept (history behind a checkpoint is not counted: it is reclaimed when space is short).
    func diskUse(of uid: UInt32) -> Int
    /// The most a user may hold (`diskUse`) before its new work is refused `disk-quota`.
    var diskPerUser: Int { get }
    /// Whether `diskUse(of: uid)` is at least `diskPerUser` (cheap while the journal holds less than a share).
    func isOverDiskShare(_ uid: UInt32) -> Bool
    /// `refusal != nil || isOverDiskShare(uid)`: whether new work of `uid` is refused (one call per dispatch).
    func refusesWork(of uid: UInt32) -> Bool
}

/// What a commit did (`JournalCommitting.commit`).
public enum JournalCommitResult: Equatable, Sendable {
    /// Everything staged is written (and synced where the mode or a seq reservation asks): frames may go.
    case written
    /// The disk is full: nothing staged was written; frames that reveal it must wait; retried at the next
    /// commit.
    case diskFull
    /// Writing or syncing failed for good: fluxd must stop.
    case failed
}

/// The commit side of a journal: what the host of durability (`DaemonCore`, SPEC §15) calls once per batch of
/// events, before the frames of the batch are written, and from its timer. The router only stages records
/// (`JournalWriting`); whether the frames that reveal them may go is decided here: `Journal` writes to its
/// segments, `MemoryJournal` to memory (and fails writes when a test says so).
public protocol JournalCommitting: JournalWriting {
    /// Whether new work is refused (`refusal != nil`), read once per batch.
    var isRefusing: Bool { get }
    /// Records staged and not yet written.
    var hasStaged: Bool { get }
    /// Bytes of them, held in memory (charged to the memory budget while a full disk keeps them).
    var stagedBytes: Int { get }
    /// Whether frames must stay held after a write or sync failed for good: `always` promised every record
    /// durable before the frames that reveal it.
    var holdsFramesWhenFailed: Bool { get }
    /// Writes what is staged (and syncs where the mode says): frames may be written only after `.written`.
    func commit(now: UInt64) -> JournalCommitResult
    /// The timer: starts a sync that is due (`batch`); false when a sync failed (the journal refuses for good).
    func syncIfDue(now: UInt64) -> Bool
    /// Makes everything written durable, here and now (at start, before the loop serves anyone: the first seq
    /// reservation); false when it failed (for good).
    @discardableResult
    func sync(now: UInt64) -> Bool
    /// While the disk is full: tries again to write what waits and to reserve space. Returns whether the journal
    /// accepts work now.
    @discardableResult
    func retrySpace(now: UInt64) -> Bool
    /// What the journal has to say in the log, in order (opening it, history dropped to make room); the host logs
    /// the ones it has not logged yet.
    var notes: [String] { get }
    /// `notes.count` (read at every commit).
    var noteCount: Int { get }
}

extension JournalWriting {
    /// Records charged to no user (tests, and fluxd's own records).
    public func register(store: String, handles: [String], waitFor: [String]) {
        register(store: store, handles: handles, waitFor: waitFor, uid: .max)
    }
    public func action(seq: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?, id: ArraySlice<UInt8>?,
                       session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>, targets: [String]) {
        action(seq: seq, typeJSON: typeJSON, origin: origin, cause: cause, id: id, session: session, uid: uid,
               payload: payload, targets: JournalNameList(targets))
    }
    public func result(seq: UInt64, store: String, outcome: ResultOutcome, version: UInt64, uid: UInt32 = .max) {
        result(seq: seq, store: JournalName(store), outcome: outcome, version: version, uid: uid)
    }
    public func snapshot(store: String, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>, uid: UInt32 = .max) {
        snapshot(store: JournalName(store), version: version, seq: seq, state: state, uid: uid)
    }
    public func patch(store: String, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>, uid: UInt32 = .max) {
        self.patch(store: JournalName(store), version: version, seq: seq, patch: patch, uid: uid)
    }
}

/// A checkpoint's content taken on the loop thread, turned into records (each with the user it is charged to) on
/// whichever thread writes the checkpoint (`Journal.checkpointCapture`).
public protocol CheckpointContent: Sendable {
    func emit(_ emit: (JournalRecord, UInt32) -> Void)
}

/// Why the journal accepts no new work.
public enum JournalRefusal: Sendable, Equatable {
    /// A write failed for lack of space: retried; accepted work finishes; new work waits for space.
    case diskFull(String)
    /// A sync (or another write) failed in a way that is never retried: fluxd must be restarted.
    case failed(String)
}
