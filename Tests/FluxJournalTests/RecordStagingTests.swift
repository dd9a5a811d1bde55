import Testing
@testable import FluxJournal

/// The hot path's records (issue 27), encoded straight into the staging bytes in batches, are byte for byte what
/// `RecordEncoder` and `appendRecord` make (format version 4 of docs/journal.md), over random field values.
struct RecordStagingTests {
    struct Mix {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E3779B97F4A7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9
            z = (z ^ (z >> 27)) &* 0x94D049BB133111EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
        /// A number of every varint length, 0 and the largest included.
        mutating func number() -> UInt64 { [0, 1, 127, 128, 16_383, 16_384, UInt64.max, next() >> UInt64(below(64))][below(8)] }
        mutating func bytes() -> ArraySlice<UInt8> {
            let n = [0, 1, 5, 127, 128, 300, 20_000][below(7)]
            return ArraySlice((0..<n).map { _ in UInt8(truncatingIfNeeded: next()) })[...]
        }
        mutating func name() -> String { ["", "a", "todos", "é/ü:x", String(repeating: "s", count: 200)][below(5)] }
    }

    /// What the test staged, for the reference: record bodies per batch as `RecordEncoder` makes them, and the
    /// records they decode to.
    struct Reference {
        var batches: [[[UInt8]]] = []
        var open = false
        var records: [JournalRecord] = []
        /// The last body staged, when it is a state a `done` may still mark.
        var lastState: (seq: UInt64, version: UInt64, store: String)?

        /// Adds a body to the open batch, opening one as the writer does (none open, or past `batchBodyLimit`).
        mutating func add(_ body: [UInt8]) {
            let size = open ? 13 + batches.last!.reduce(0) { $0 + 4 + $1.count } : 0
            if !open || size + 4 + body.count > batchBodyLimit { batches.append([]); open = true }
            batches[batches.count - 1].append(body)
            lastState = nil
        }

        var framed: [UInt8] {
            var out: [UInt8] = []
            for bodies in batches {
                var body: [UInt8] = []
                RecordEncoder.batch(bodies, into: &body)
                appendRecord(body, to: &out)
            }
            return out
        }
    }

    @Test("the hot path's records, in batches: the same bytes as RecordEncoder's, and they decode as staged")
    func sameBytes() throws {
        var r = Mix(state: 27)
        let file = SegmentWriterTests.FaultyFile()
        let writer = try SegmentWriter(file: file)
        var ref = Reference()
        var merged = 0
        for round in 0..<3_000 {
            let before = writer.stagedBytes
            var staged = 0
            var wrote = false
            switch r.below(6) {
            case 0:
                let (seq, time, type, origin) = (r.number(), r.number(), r.bytes(), r.number())
                let cause = r.below(2) == 0 ? nil : r.number()
                let id = r.below(2) == 0 ? nil : r.bytes()
                let session = r.below(2) == 0 ? nil : r.bytes()
                let uid = session == nil ? 0 : UInt32(truncatingIfNeeded: r.number())
                let payload = r.bytes()
                let targets = (0..<r.below(4)).map { _ in r.name() }
                var body: [UInt8] = []
                RecordEncoder.actionFixed(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                          session: session, uid: uid, payload: payload, targets: targets, into: &body)
                ref.add(body)
                ref.records.append(.action(ActionEntry(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause,
                                                       id: id, session: session, uid: uid, payload: payload, targets: targets)))
                staged = writer.stageAction(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                            session: session, uid: uid, payload: payload, targets: JournalNameList(targets))
                #expect(JournalNameList(targets).strings == targets && JournalNameList(targets).count == targets.count)
            case 1, 2:
                // A result: often the `done` of the state just staged (merged into it), sometimes one that differs
                // in the store, the seq or the version (a record of its own).
                var outcome: ResultOutcome = [.done, .rejected(r.bytes()), .unavailable(code: r.name(), message: r.name())][r.below(3)]
                var (seq, store, version) = (r.number(), r.name(), r.number())
                if let last = ref.lastState, r.below(4) != 0 {
                    (seq, store, version) = (last.seq, last.store, last.version)
                    outcome = .done
                    switch r.below(6) {
                    case 0: seq &+= 1
                    case 1: version &+= 1
                    case 2: store += "x"
                    default: break
                    }
                }
                if outcome == .done, let last = ref.lastState, (last.seq, last.store, last.version) == (seq, store, version) {
                    // The state's record becomes its result too.
                    ref.batches[ref.batches.count - 1][ref.batches[ref.batches.count - 1].count - 1][1] |= RecordEncoder.stateIsDone
                    ref.records.append(.result(seq: seq, store: store, outcome: .done, version: version))
                    ref.lastState = nil
                    merged += 1
                    #expect(writer.markDone(seq: seq, store: JournalName(store), version: version))
                } else {
                    #expect(!writer.markDone(seq: seq, store: JournalName(store), version: version))
                    var body: [UInt8] = []
                    RecordEncoder.result(seq: seq, store: store, outcome: outcome, version: version, into: &body)
                    ref.add(body)
                    ref.records.append(.result(seq: seq, store: store, outcome: outcome, version: version))
                    staged = writer.stageResult(seq: seq, store: JournalName(store), outcome: outcome, version: version)
                }
                #expect(JournalName(store).string == store)
            case 3, 4:
                let (store, version, seq, bytes, isPatch) = (r.name(), r.number(), r.number(), r.bytes(), r.below(2) == 0)
                var body: [UInt8] = []
                RecordEncoder.stateFixed(store: store, version: version, seq: seq, bytes: bytes, isPatch: isPatch,
                                         isDone: false, into: &body)
                ref.add(body)
                ref.records.append(isPatch ? .patch(store: store, version: version, seq: seq, patch: bytes)
                                           : .snapshot(store: store, version: version, seq: seq, state: bytes))
                ref.lastState = (seq, version, store)
                staged = writer.stageState(isPatch: isPatch, store: JournalName(store), version: version, seq: seq, bytes: bytes)
            default:
                // A record off the hot path, in the same batch; or a write, which closes the batch.
                if r.below(3) == 0 {
                    try writer.write()
                    wrote = true
                    ref.open = false
                    ref.lastState = nil
                } else {
                    let n = r.number()
                    var body: [UInt8] = []
                    RecordEncoder.seqReserve(n, into: &body)
                    ref.add(body)
                    ref.records.append(.seqReserve(n))
                    staged = writer.appendEncoded { RecordEncoder.seqReserve(n, into: &$0) }
                }
            }
            if !wrote { #expect(staged == writer.stagedBytes - before, "round \(round)") }
        }
        try writer.write()
        #expect(merged > 100)
        let expected = SegmentHeader.bytes() + ref.framed
        #expect(file.bytes.count == expected.count)
        #expect(file.bytes == expected)
        // Written, they read back as whole batches holding the records staged, in order.
        let scan = JournalScan(file.bytes)
        #expect(scan.problem == nil && scan.records.count == ref.batches.count)
        var decoded: [JournalRecord] = []
        for range in scan.records { decoded += try RecordDecoder.decodeAll(file.bytes, range) }
        #expect(decoded.count == ref.records.count)
        #expect(decoded == ref.records)
    }

    @Test("a batch that would pass its limit is closed and a new one opened; a record larger than it has its own")
    func batchLimit() throws {
        let file = SegmentWriterTests.FaultyFile()
        let writer = try SegmentWriter(file: file)
        let big = ArraySlice(repeating: UInt8(ascii: "x"), count: batchBodyLimit / 4)
        for seq in 1...4 { _ = writer.stageState(isPatch: false, store: JournalName("s"), version: UInt64(seq), seq: UInt64(seq), bytes: big) }
        _ = writer.stageState(isPatch: false, store: JournalName("s"), version: 5, seq: 5, bytes: ArraySlice(repeating: 0x31, count: batchBodyLimit + 10))
        #expect(writer.stagedCount == 3)  // 3 states, then 1, then the large one alone
        try writer.write()
        let scan = JournalScan(file.bytes)
        #expect(scan.problem == nil && scan.records.map(\.count).allSatisfy { $0 <= batchBodyLimit + 64 })
        let counts = try scan.records.map { try RecordDecoder.decodeAll(file.bytes, $0).count }
        #expect(counts == [3, 1, 1])
    }

    @Test("a damaged batch does not decode: a length past its end, a batch inside a batch, unknown state flags")
    func damagedBatches() {
        var inner: [UInt8] = []
        RecordEncoder.seqReserve(7, into: &inner)
        var body: [UInt8] = []
        RecordEncoder.batch([inner], into: &body)
        #expect((try? RecordDecoder.decodeAll(body, 0..<body.count)) == [.seqReserve(7)])
        var long = body
        long[1] = 200  // the first length runs past the batch
        #expect(throws: RecordDecodingError.self) { try RecordDecoder.decodeAll(long, 0..<long.count) }
        var nested: [UInt8] = []
        RecordEncoder.batch([body], into: &nested)
        #expect(throws: RecordDecodingError.self) { try RecordDecoder.decodeAll(nested, 0..<nested.count) }
        var state: [UInt8] = []
        RecordEncoder.stateFixed(store: "s", version: 1, seq: 1, bytes: [0x31], isPatch: false, isDone: true, into: &state)
        #expect((try? RecordDecoder.decodeAll(state, 0..<state.count))?.count == 2)
        state[1] = 0x80
        #expect(throws: RecordDecodingError.self) { try RecordDecoder.decodeAll(state, 0..<state.count) }
        #expect(throws: RecordDecodingError.self) { try RecordDecoder.decode(body, 0..<body.count) }  // one record only
    }
}
