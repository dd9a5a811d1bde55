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
    ///
    /// A version made by a patch (SPEC §16) is the newest snapshot before it with the patches after that applied
    /// (rendered as fluxd renders a patched state).
    public func stateAt(store: String, version: UInt64?, seq: UInt64?) -> PastState? {
        if hasStaged { try? flushStaged() }
        var best: (version: UInt64, seq: UInt64)?
        func wanted(_ v: UInt64, _ s: UInt64) -> Bool {
            if let version { return v == version }
            if let seq { return s <= seq && v >= (best?.version ?? 0) }
            return false
        }
        // The store's snapshots and patches, in journal order: the state at a version is the last snapshot at or
        // before it, with the patches between applied.
        var base: (version: UInt64, state: JSONValue?, bytes: [UInt8])?
        var result: PastState?
        var files = Self.checkpoints(options.directory).suffix(1).map(\.path)
        files += segmentInfos.map { options.directory + "/" + Self.segmentName($0.number) }
        for path in files {
            guard let bytes = readWholeFile(path) else { continue }
            for range in JournalScan(bytes).records {
                guard range.count > 1, bytes[range.lowerBound] == RecordKind.snapshot.rawValue
                        || bytes[range.lowerBound] == RecordKind.patch.rawValue else { continue }
                switch try? RecordDecoder.decode(bytes, range) {
                case .snapshot(let name, let v, let s, let state)? where name == store:
                    base = (v, nil, Array(state))
                    if wanted(v, s) {
                        best = (v, s)
                        result = PastState(version: v, seq: s, state: Array(state))
                    }
                case .patch(let name, let v, let s, let patch)? where name == store:
                    guard var current = base, current.version + 1 == v else { base = nil; continue }
                    if current.state == nil { current.state = try? JSONValue(parsing: current.bytes) }
                    guard var tree = current.state, let p = try? JSONPatch(parsing: patch), (try? tree.apply(p)) != nil else {
                        base = nil
                        continue
                    }
                    base = (v, tree, [])
                    if wanted(v, s) {
                        best = (v, s)
                        result = PastState(version: v, seq: s, state: tree.compactBytes)
                    }
                default:
                    continue
                }
            }
        }
        return result
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
