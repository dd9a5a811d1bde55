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
    /// them. Reads the segment files (what is staged is written first, so the page is up to date).
    public func history(from: UInt64?, limit: Int) -> HistoryPage {
        if hasStaged { try? flushStaged() }
        let first = segmentInfos.first(where: { $0.firstSeq != nil })?.firstSeq ?? 0
        let start = max(from ?? first, first)
        var entries: [HistoryEntry] = []
        var index: [UInt64: Int] = [:]
        var open = 0  // collected actions still missing a result
        var skippedDamage: String?  // damage in a segment passed over: the seqs right after it may be lost
        for info in segmentInfos {
            if entries.isEmpty, info.lastSeq.map({ $0 < start }) ?? true {
                skippedDamage = info.damage ?? (info.lastSeq == nil ? skippedDamage : nil)
                continue
            }
            if entries.isEmpty, let damage = skippedDamage, (info.firstSeq ?? 0) > start {
                return HistoryPage(first: first, entries: [], damage: damage)
            }
            let path = options.directory + "/" + Self.segmentName(info.number)
            guard let bytes = readWholeFile(path) else {
                return HistoryPage(first: first, entries: entries, damage: "\(path) cannot be read")
            }
            let scan = JournalScan(bytes)
            for range in scan.records {
                guard let record = try? RecordDecoder.decode(bytes, range) else { continue }
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
                    continue
                }
            }
            let isCurrent = info.number == segmentInfos.last?.number
            if let problem = scan.problem {
                return HistoryPage(first: first, entries: entries, damage: "\(path): \(problem)")
            }
            if scan.tornBytes > 0 && !isCurrent && !isZeros(bytes, from: scan.validEnd) {
                return HistoryPage(first: first, entries: entries, damage: "\(path) ends in a record cut short at offset \(scan.validEnd)")
            }
            if entries.count == limit && open == 0 { break }
        }
        return HistoryPage(first: first, entries: entries)
    }

    /// Store `store`'s state at `version`, or the newest one whose seq is at most `seq`, from the retained
    /// segments (and the newest checkpoint, which holds the snapshot retained when it was written).
    public func stateAt(store: String, version: UInt64?, seq: UInt64?) -> PastState? {
        if hasStaged { try? flushStaged() }
        var best: PastState?
        func consider(_ v: UInt64, _ s: UInt64, _ state: ArraySlice<UInt8>) {
            if let version {
                if v == version { best = PastState(version: v, seq: s, state: Array(state)) }
            } else if let seq, s <= seq, v >= (best?.version ?? 0) {
                best = PastState(version: v, seq: s, state: Array(state))
            }
        }
        var files = Self.checkpoints(options.directory).suffix(1).map(\.path)
        files += segmentInfos.map { options.directory + "/" + Self.segmentName($0.number) }
        for path in files {
            guard let bytes = readWholeFile(path) else { continue }
            for range in JournalScan(bytes).records {
                guard range.count > 1, bytes[range.lowerBound] == RecordKind.snapshot.rawValue,
                      case .snapshot(let name, let v, let s, let state)? = try? RecordDecoder.decode(bytes, range),
                      name == store else { continue }
                consider(v, s, state)
            }
        }
        return best
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
