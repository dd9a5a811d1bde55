import Testing
@testable import FluxJournal

/// The hot path's records (issue 27), encoded straight into the staging bytes, are byte for byte what
/// `RecordEncoder` and `appendRecord` make (the format of docs/journal.md), over random field values.
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

    /// The framed bytes `RecordEncoder` gives for one record.
    static func reference(_ encode: (inout [UInt8]) -> Void) -> [UInt8] {
        var body: [UInt8] = []
        encode(&body)
        var framed: [UInt8] = []
        appendRecord(body, to: &framed)
        return framed
    }

    @Test("action, result, snapshot and patch records: the same bytes as RecordEncoder's, and they decode")
    func sameBytes() throws {
        var r = Mix(state: 27)
        let writer = try SegmentWriter(file: SegmentWriterTests.FaultyFile())
        for round in 0..<2_000 {
            let before = writer.staged.count
            let expected: [UInt8]
            let staged: Int
            switch round % 4 {
            case 0:
                let (seq, time, type, origin) = (r.number(), r.number(), r.bytes(), r.number())
                let cause = r.below(2) == 0 ? nil : r.number()
                let id = r.below(2) == 0 ? nil : r.bytes()
                let session = r.below(2) == 0 ? nil : r.bytes()
                let uid = UInt32(truncatingIfNeeded: r.number())
                let payload = r.bytes()
                let targets = (0..<r.below(4)).map { _ in r.name() }
                expected = Self.reference {
                    RecordEncoder.action(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                         session: session, uid: uid, payload: payload, targets: targets, into: &$0)
                }
                staged = writer.stageAction(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                            session: session, uid: uid, payload: payload, targets: JournalNameList(targets))
                #expect(JournalNameList(targets).strings == targets && JournalNameList(targets).count == targets.count)
            case 1:
                let outcome: ResultOutcome = [.done, .rejected(r.bytes()), .unavailable(code: r.name(), message: r.name())][r.below(3)]
                let (seq, store, version) = (r.number(), r.name(), r.number())
                expected = Self.reference { RecordEncoder.result(seq: seq, store: store, outcome: outcome, version: version, into: &$0) }
                staged = writer.stageResult(seq: seq, store: JournalName(store), outcome: outcome, version: version)
                #expect(JournalName(store).string == store)
            default:
                let (store, version, seq, bytes) = (r.name(), r.number(), r.number(), r.bytes())
                if round % 4 == 2 {
                    expected = Self.reference { RecordEncoder.snapshot(store: store, version: version, seq: seq, state: bytes, into: &$0) }
                    staged = writer.stageState(.snapshot, store: JournalName(store), version: version, seq: seq, bytes: bytes)
                } else {
                    expected = Self.reference { RecordEncoder.patch(store: store, version: version, seq: seq, patch: bytes, into: &$0) }
                    staged = writer.stageState(.patch, store: JournalName(store), version: version, seq: seq, bytes: bytes)
                }
            }
            let got = Array(writer.staged[before...])
            #expect(staged == got.count)
            #expect(got == expected, "round \(round)")
            if got != expected { return }
        }
        #expect(writer.stagedCount == 2_000)
        // Written, they read back as 2,000 whole records.
        try writer.write()
        let scan = JournalScan((writer.file as! SegmentWriterTests.FaultyFile).bytes)
        #expect(scan.problem == nil && scan.records.count == 2_000)
    }
}
