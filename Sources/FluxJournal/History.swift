import FluxJSONValue

/// One journaled action and the results it has so far (SPEC §8.12 `history`).
public struct HistoryEntry: Sendable, Equatable {
    public var action: ActionEntry
    /// Results so far, in the order they were journaled.
    public var results: [TargetResult]
}

/// A page of history.
public struct HistoryPage: Sendable, Equatable {
    /// The oldest seq the journal still holds (0: none).
    public var first: UInt64
    public var entries: [HistoryEntry]
    /// Damage that cut the page short (a segment that does not read whole): the entries are those before it.
    public var damage: String?
}

/// A store's state as it was (SPEC §8.12 `state-at`).
public struct PastState: Sendable, Equatable {
    public var version: UInt64
    public var seq: UInt64
    public var state: [UInt8]
}

extension Journal {
    /// Up to `limit` actions from seq `from` (nil: the oldest retained), with the results the journal holds for
    /// them. Reads the segment files (what is staged is written first, so the page is up to date) through a
    /// `JournalReadView`, on this thread; fluxd reads on its reader thread with a view made on its loop thread.
    public func history(from: UInt64?, limit: Int) -> HistoryPage {
        readView(historyFrom: from).history(from: from, limit: limit)
    }

    /// Store `store`'s state at `version`, or the newest one whose seq is at most `seq` (`JournalReadView.stateAt`),
    /// read on this thread.
    public func stateAt(store: String, version: UInt64?, seq: UInt64?) -> PastState? {
        readView().stateAt(store: store, version: version, seq: seq)
    }

    /// Writes what is staged now (a read of the files must see it; writing early never breaks the rule that
    /// records reach the operating system before the frames that reveal them).
    func flushStaged() throws(StorageError) {
        try writerForReads.write()
    }
}

extension ActionEntry {
    /// A copy that holds its own bytes (not the segment buffer it was decoded from).
    func owned() -> ActionEntry {
        var a = self
        a.typeJSON = ArraySlice(Array(typeJSON))
        a.payload = ArraySlice(Array(payload))
        a.id = id.map { ArraySlice(Array($0)) }
        a.session = session.map { ArraySlice(Array($0)) }
        return a
    }
}

extension ResultOutcome {
    func owned() -> ResultOutcome {
        if case .rejected(let e) = self { return .rejected(ArraySlice(Array(e))) }
        return self
    }
}
