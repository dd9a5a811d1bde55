/// Records kept in memory (the router's tests, the in-memory bus, and `--ephemeral` runs that want to see what
/// would be journaled). Records are staged as the router journals them and written by `commit`, which fails while
/// `failWrites` is set, as a full disk would (or for good, as a failed sync would): the router tests run the
/// same durability policy as fluxd (frames held until the write succeeds) without a disk.
public final class MemoryJournal: JournalCommitting {
    /// Every record journaled, in order: the first `writtenCount` are written, the rest staged.
    public private(set) var records: [[UInt8]] = []
    public private(set) var writtenCount = 0
    public var refusal: JournalRefusal?
    /// How `commit` fails: `.diskFull` as a full disk (retried at each commit; new work refused `disk-full`
    /// meanwhile), `.failed` for good. Nil: writes succeed.
    public var failWrites: JournalCommitResult?
    /// Whether frames stay held after a failure for good (as `always` mode does).
    public var holdsFramesWhenFailed = false
    /// Commits that wrote something.
    public private(set) var commits = 0
    public private(set) var notes: [String] = []
    public var noteCount: Int { notes.count }
    /// Bytes of records per user (never reclaimed: tests set `diskPerUser` to see refusals).
    public private(set) var bytesByUser: [UInt32: Int] = [:]
    public var diskPerUser = Int.max

    public init() {}

    /// A journal that holds `written`: the records a previous run wrote, which a restart on it recovers
    /// (`recovered()`). (Charged to no user.)
    public init(written: [[UInt8]]) {
        records = written
        writtenCount = written.count
    }

    public func reserveSeq(upTo: UInt64) { add(.max) { RecordEncoder.seqReserve(upTo, into: &$0) } }
    public func register(store: String, handles: [String], waitFor: [String], uid: UInt32) {
        add(uid) { RecordEncoder.register(store: store, handles: handles, waitFor: waitFor, into: &$0) }
    }
    public func action(seq: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?, id: ArraySlice<UInt8>?,
                       session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>, targets: JournalNameList) {
        add(uid) {
            RecordEncoder.action(seq: seq, time: 0, typeJSON: typeJSON, origin: origin, cause: cause, id: id,
                                 session: session, uid: uid, payload: payload, targets: targets.strings, into: &$0)
        }
    }
    public func result(seq: UInt64, store: JournalName, outcome: ResultOutcome, version: UInt64, uid: UInt32) {
        add(uid) { RecordEncoder.result(seq: seq, store: store.string, outcome: outcome, version: version, into: &$0) }
    }
    public func snapshot(store: JournalName, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>, uid: UInt32) {
        add(uid) { RecordEncoder.snapshot(store: store.string, version: version, seq: seq, state: state, into: &$0) }
    }
    public func patch(store: JournalName, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>, uid: UInt32) {
        add(uid) { RecordEncoder.patch(store: store.string, version: version, seq: seq, patch: patch, into: &$0) }
    }
    public func forget(store: String, seq: UInt64, versionFloor: UInt64, uid: UInt32) {
        add(uid) { RecordEncoder.forget(store: store, seq: seq, versionFloor: versionFloor, into: &$0) }
    }
    public func diskUse(of uid: UInt32) -> Int { bytesByUser[uid] ?? 0 }
    public func isOverDiskShare(_ uid: UInt32) -> Bool { diskUse(of: uid) >= diskPerUser }
    public func refusesWork(of uid: UInt32) -> Bool { refusal != nil || isOverDiskShare(uid) }

    // MARK: Committing

    public var isRefusing: Bool { refusal != nil }
    public var hasStaged: Bool { writtenCount < records.count }
    public var stagedBytes: Int { records[writtenCount...].reduce(0) { $0 + $1.count + recordHeaderSize } }
    /// The records written so far (what a restart would find).
    public var written: ArraySlice<[UInt8]> { records[..<writtenCount] }

    public func commit(now: UInt64) -> JournalCommitResult {
        if case .failed? = refusal { return .failed }
        switch failWrites {
        case .diskFull?:
            if refusal == nil { refusal = .diskFull("the memory journal's writes fail (a test's full disk)") }
            return .diskFull
        case .failed?:
            refusal = .failed("the memory journal's writes failed (a test's failed sync)")
            return .failed
        case .written?, nil:
            if hasStaged { commits += 1 }
            writtenCount = records.count
            if case .diskFull? = refusal { refusal = nil }
            return .written
        }
    }

    public func syncIfDue(now: UInt64) -> Bool { refusal.map { if case .failed = $0 { false } else { true } } ?? true }
    @discardableResult
    public func sync(now: UInt64) -> Bool { syncIfDue(now: now) }
    @discardableResult
    public func retrySpace(now: UInt64) -> Bool { commit(now: now) == .written }
    /// Adds a line for the host's log (as `Journal` notes history it dropped).
    public func note(_ line: String) { notes.append(line) }

    private func add(_ uid: UInt32, _ encode: (inout [UInt8]) -> Void) {
        var body: [UInt8] = []
        encode(&body)
        bytesByUser[uid, default: 0] += body.count + recordHeaderSize
        records.append(body)
    }

    public func decoded() -> [JournalRecord] { Self.decode(records) }

    /// The state a fluxd restarted on the written records would recover (what `Journal` recovers from its
    /// segments).
    public func recovered(outcomes: OutcomeLog = OutcomeLog()) -> JournalState {
        Self.state(of: decodedWritten(), outcomes: outcomes)
    }

    /// The written records, decoded.
    public func decodedWritten() -> [JournalRecord] { Self.decode(written) }

    /// The state a fluxd restarted on these records would recover.
    public func state(outcomes: OutcomeLog = OutcomeLog()) -> JournalState {
        Self.state(of: decoded(), outcomes: outcomes)
    }

    private static func decode(_ bodies: some Collection<[UInt8]>) -> [JournalRecord] {
        bodies.map { try! RecordDecoder.decode($0, 0..<$0.count) }
    }

    private static func state(of records: [JournalRecord], outcomes: OutcomeLog) -> JournalState {
        var s = JournalState(outcomes: outcomes)
        for r in records { s.apply(r) }
        return s
    }
}
