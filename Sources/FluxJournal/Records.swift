// The bodies of journal records (format version 1, docs/journal.md "Record bodies"): one kind byte, then the
// record's fields. Integers are unsigned LEB128 varints; byte strings (names, JSON texts, states) are a varint
// length and the bytes. The kinds of version 4 (`actionFixed`, `stateFixed`, `batch`) use fixed-width
// little-endian numbers and lengths instead, except in names and target lists. JSON texts (action types, payloads, states, store errors) are kept as the exact bytes
// fluxd forwarded, never re-encoded.

/// What a record is.
public enum RecordKind: UInt8, Sendable {
    /// `seq`s up to this one may be handed out: persisted (and synced) before any of them is revealed, so a `seq`
    /// is never reused even after a power loss.
    case seqReserve = 1
    /// A store's registration: name, patterns, waitFor.
    case register = 2
    /// An accepted action.
    case action = 3
    /// One store's final result for one action.
    case result = 4
    /// A new retained snapshot of a store.
    case snapshot = 5
    /// A store's position (checkpoints only): its version and the seq of the last action it answered.
    case storePosition = 6
    /// The outcome of a settled dispatch made under a session (checkpoints only, SPEC §15.4).
    case outcome = 7
    /// What a segment the checkpoint covers holds (checkpoints only): so a start reads no covered segment.
    case segmentSummary = 8
    /// Since format version 2 (SPEC §16): a store's change as a JSON Patch (RFC 6902), as the store wrote it: the
    /// version it made (the one before + 1), its seq and the patch bytes.
    case patch = 9
    /// Since format version 3 (SPEC §10, `forget`): a store forgotten for good (its name, state, versions and
    /// routes) when the seq given was the last accepted, and the version floor: the highest version a forgotten store reached, above which every store
    /// made later starts. A checkpoint carries the floor as a forget record of the empty name (no store's).
    case forget = 10
    /// Since format version 4 (issue 27): an accepted action whose numbers and lengths are fixed-width (`u64`,
    /// `u32`, little-endian), so fluxd writes it without sizing varints. Decodes as `action`.
    case actionFixed = 11
    /// Since format version 4: a store's new snapshot or patch with fixed-width numbers, which may also be the
    /// store's `done` result for the action `seq` (a flag): one record where version 3 wrote two. Decodes as
    /// `snapshot` or `patch`, then `result`.
    case stateFixed = 12
    /// Since format version 4: the records one loop iteration staged, framed and checksummed once: repeated `u32`
    /// length (little-endian) and a record body of any other kind.
    case batch = 13
}

/// An accepted action as journaled.
public struct ActionEntry: Sendable, Equatable {
    public var seq: UInt64
    /// Milliseconds since the Unix epoch when it was accepted.
    public var time: UInt64
    /// The type as the dispatcher wrote it (a JSON string, quotes included).
    public var typeJSON: ArraySlice<UInt8>
    public var origin: UInt64
    public var cause: UInt64?
    /// The dispatch id (a JSON string, quotes included) when settlement was asked for.
    public var id: ArraySlice<UInt8>?
    /// The dispatcher's session (`hello.session`, the raw JSON string) and uid, when it gave one.
    public var session: ArraySlice<UInt8>?
    public var uid: UInt32
    public var payload: ArraySlice<UInt8>
    /// Target store names, sorted.
    public var targets: [String]

    public init(seq: UInt64, time: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64, cause: UInt64?,
                id: ArraySlice<UInt8>?, session: ArraySlice<UInt8>?, uid: UInt32, payload: ArraySlice<UInt8>,
                targets: [String]) {
        self.seq = seq
        self.time = time
        self.typeJSON = typeJSON
        self.origin = origin
        self.cause = cause
        self.id = id
        self.session = session
        self.uid = uid
        self.payload = payload
        self.targets = targets
    }
}

/// A store's final result for an action, as journaled.
public enum ResultOutcome: Sendable, Equatable {
    case done
    /// The store's error object (JSON, as it sent it).
    case rejected(ArraySlice<UInt8>)
    /// Given up by fluxd: the code (e.g. `store-unavailable`) and message.
    case unavailable(code: String, message: String)
}

/// One decoded record.
public enum JournalRecord: Sendable, Equatable {
    case seqReserve(UInt64)
    case register(store: String, handles: [String], waitFor: [String])
    case action(ActionEntry)
    case result(seq: UInt64, store: String, outcome: ResultOutcome, version: UInt64)
    case snapshot(store: String, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>)
    case patch(store: String, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>)
    case storePosition(store: String, version: UInt64, seq: UInt64)
    case forget(store: String, seq: UInt64, versionFloor: UInt64)
    case outcome(uid: UInt32, session: [UInt8], id: [UInt8], seq: UInt64, results: [TargetResult])
    /// Segment `number` holds `actions` actions, seqs `firstSeq...lastSeq` (0, 0 when none), the last one accepted
    /// at `lastTime`.
    case segmentSummary(number: UInt64, firstSeq: UInt64, lastSeq: UInt64, lastTime: UInt64, actions: UInt64)
}

/// Why a record body could not be decoded (corruption the checksum did not catch, or a newer record kind).
public struct RecordDecodingError: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public var description: String { reason }
}

// MARK: - Encoding

/// Appends record bodies to a byte buffer (no framing: `SegmentWriter.append` frames them).
public enum RecordEncoder {
    public static func seqReserve(_ upTo: UInt64, into out: inout [UInt8]) {
        out.append(RecordKind.seqReserve.rawValue)
        varint(upTo, &out)
    }

    public static func register(store: String, handles: [String], waitFor: [String], into out: inout [UInt8]) {
        out.append(RecordKind.register.rawValue)
        string(store, &out)
        varint(UInt64(handles.count), &out)
        for h in handles { string(h, &out) }
        varint(UInt64(waitFor.count), &out)
        for w in waitFor { string(w, &out) }
    }

    /// Flags of an action record: which optional fields follow.
    static let hasCause: UInt8 = 1, hasID: UInt8 = 2, hasSession: UInt8 = 4
    /// Flags of a `stateFixed` record: a patch rather than a snapshot; also the store's `done` result for `seq`.
    static let stateIsPatch: UInt8 = 1, stateIsDone: UInt8 = 2

    /// An accepted action, format version 4 (`actionFixed`): kind, flags, `u64` seq, time and origin, `u64` cause
    /// if flagged, then `u32`-length byte strings: type, id if flagged, session (and `u32` uid) if flagged,
    /// payload; then the targets as in `action`.
    public static func actionFixed(seq: UInt64, time: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64,
                                   cause: UInt64?, id: ArraySlice<UInt8>?, session: ArraySlice<UInt8>?, uid: UInt32,
                                   payload: ArraySlice<UInt8>, targets: [String], into out: inout [UInt8]) {
        out.append(RecordKind.actionFixed.rawValue)
        var flags: UInt8 = 0
        if cause != nil { flags |= hasCause }
        if id != nil { flags |= hasID }
        if session != nil { flags |= hasSession }
        out.append(flags)
        u64(seq, &out)
        u64(time, &out)
        u64(origin, &out)
        if let cause { u64(cause, &out) }
        fixedBytes(typeJSON, &out)
        if let id { fixedBytes(id, &out) }
        if let session {
            fixedBytes(session, &out)
            u32(uid, &out)
        }
        fixedBytes(payload, &out)
        varint(UInt64(targets.count), &out)
        for t in targets { string(t, &out) }
    }

    /// A new snapshot (or, `isPatch`, a patch), format version 4 (`stateFixed`): kind, flags, `u64` version and
    /// seq, the store as a `str`, the bytes with a `u32` length. `isDone`: also the store's `done` result for
    /// `seq`, at `version`.
    public static func stateFixed(store: String, version: UInt64, seq: UInt64, bytes: ArraySlice<UInt8>,
                                  isPatch: Bool, isDone: Bool, into out: inout [UInt8]) {
        out.append(RecordKind.stateFixed.rawValue)
        out.append((isPatch ? stateIsPatch : 0) | (isDone ? stateIsDone : 0))
        u64(version, &out)
        u64(seq, &out)
        string(store, &out)
        fixedBytes(bytes, &out)
    }

    /// Record bodies in one `batch` record.
    public static func batch(_ bodies: [[UInt8]], into out: inout [UInt8]) {
        out.append(RecordKind.batch.rawValue)
        for body in bodies {
            u32(UInt32(body.count), &out)
            out.append(contentsOf: body)
        }
    }

    public static func action(seq: UInt64, time: UInt64, typeJSON: ArraySlice<UInt8>, origin: UInt64,
                              cause: UInt64?, id: ArraySlice<UInt8>?, session: ArraySlice<UInt8>?, uid: UInt32,
                              payload: ArraySlice<UInt8>, targets: [String], into out: inout [UInt8]) {
        out.append(RecordKind.action.rawValue)
        varint(seq, &out)
        varint(time, &out)
        bytes(typeJSON, &out)
        varint(origin, &out)
        var flags: UInt8 = 0
        if cause != nil { flags |= hasCause }
        if id != nil { flags |= hasID }
        if session != nil { flags |= hasSession }
        out.append(flags)
        if let cause { varint(cause, &out) }
        if let id { bytes(id, &out) }
        if let session {
            bytes(session, &out)
            varint(UInt64(uid), &out)
        }
        bytes(payload, &out)
        varint(UInt64(targets.count), &out)
        for t in targets { string(t, &out) }
    }

    public static func action(_ a: ActionEntry, into out: inout [UInt8]) {
        action(seq: a.seq, time: a.time, typeJSON: a.typeJSON, origin: a.origin, cause: a.cause, id: a.id,
               session: a.session, uid: a.uid, payload: a.payload, targets: a.targets, into: &out)
    }

    public static func result(seq: UInt64, store: String, outcome: ResultOutcome, version: UInt64,
                              into out: inout [UInt8]) {
        out.append(RecordKind.result.rawValue)
        varint(seq, &out)
        string(store, &out)
        varint(version, &out)
        outcomeBody(outcome, &out)
    }

    public static func snapshot(store: String, version: UInt64, seq: UInt64, state: ArraySlice<UInt8>,
                                into out: inout [UInt8]) {
        out.append(RecordKind.snapshot.rawValue)
        string(store, &out)
        varint(version, &out)
        varint(seq, &out)
        bytes(state, &out)
    }

    public static func patch(store: String, version: UInt64, seq: UInt64, patch: ArraySlice<UInt8>,
                             into out: inout [UInt8]) {
        out.append(RecordKind.patch.rawValue)
        string(store, &out)
        varint(version, &out)
        varint(seq, &out)
        bytes(patch, &out)
    }

    public static func forget(store: String, seq: UInt64, versionFloor: UInt64, into out: inout [UInt8]) {
        out.append(RecordKind.forget.rawValue)
        string(store, &out)
        varint(seq, &out)
        varint(versionFloor, &out)
    }

    public static func storePosition(store: String, version: UInt64, seq: UInt64, into out: inout [UInt8]) {
        out.append(RecordKind.storePosition.rawValue)
        string(store, &out)
        varint(version, &out)
        varint(seq, &out)
    }

    public static func outcome(uid: UInt32, session: [UInt8], id: [UInt8], seq: UInt64, results: [TargetResult],
                               into out: inout [UInt8]) {
        out.append(RecordKind.outcome.rawValue)
        varint(UInt64(uid), &out)
        bytes(session, &out)
        bytes(id, &out)
        varint(seq, &out)
        varint(UInt64(results.count), &out)
        for r in results {
            string(r.store, &out)
            varint(r.version, &out)
            outcomeBody(r.outcome, &out)
        }
    }

    static func outcomeBody(_ outcome: ResultOutcome, _ out: inout [UInt8]) {
        switch outcome {
        case .done:
            out.append(0)
        case .rejected(let error):
            out.append(1)
            bytes(error, &out)
        case .unavailable(let code, let message):
            out.append(2)
            string(code, &out)
            string(message, &out)
        }
    }

    public static func record(_ r: JournalRecord, into out: inout [UInt8]) {
        switch r {
        case .seqReserve(let n): seqReserve(n, into: &out)
        case .register(let s, let h, let w): register(store: s, handles: h, waitFor: w, into: &out)
        case .action(let a): action(a, into: &out)
        case .result(let seq, let store, let outcome, let version):
            result(seq: seq, store: store, outcome: outcome, version: version, into: &out)
        case .snapshot(let store, let version, let seq, let state):
            snapshot(store: store, version: version, seq: seq, state: state, into: &out)
        case .patch(let store, let version, let seq, let p):
            patch(store: store, version: version, seq: seq, patch: p, into: &out)
        case .storePosition(let store, let version, let seq):
            storePosition(store: store, version: version, seq: seq, into: &out)
        case .outcome(let uid, let session, let id, let seq, let results):
            outcome(uid: uid, session: session, id: id, seq: seq, results: results, into: &out)
        case .forget(let store, let seq, let floor):
            forget(store: store, seq: seq, versionFloor: floor, into: &out)
        case .segmentSummary(let number, let firstSeq, let lastSeq, let lastTime, let actions):
            out.append(RecordKind.segmentSummary.rawValue)
            for v in [number, firstSeq, lastSeq, lastTime, actions] { varint(v, &out) }
        }
    }

    @inline(__always)
    static func varint(_ value: UInt64, _ out: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    @inline(__always)
    static func bytes<C: Collection>(_ b: C, _ out: inout [UInt8]) where C.Element == UInt8 {
        varint(UInt64(b.count), &out)
        out.append(contentsOf: b)
    }

    static func u64(_ v: UInt64, _ out: inout [UInt8]) {
        for i in 0..<8 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }

    static func u32(_ v: UInt32, _ out: inout [UInt8]) {
        for i in 0..<4 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt32(i)))) }
    }

    static func fixedBytes<C: Collection>(_ b: C, _ out: inout [UInt8]) where C.Element == UInt8 {
        u32(UInt32(b.count), &out)
        out.append(contentsOf: b)
    }

    @inline(__always)
    static func string(_ s: String, _ out: inout [UInt8]) {
        var s = s
        s.withUTF8 { bytes($0, &out) }
    }
}

// MARK: - Decoding

/// Reads one record body.
public struct RecordDecoder {
    let buffer: [UInt8]
    var at: Int
    let end: Int

    /// Decodes the body at `range` of `buffer` into the records it holds, in order: one, or for the kinds of
    /// format version 4 that carry several (`batch`, a `stateFixed` that is also a result), more.
    public static func decodeAll(_ buffer: [UInt8], _ range: Range<Int>) throws(RecordDecodingError) -> [JournalRecord] {
        var out: [JournalRecord] = []
        for body in try bodies(buffer, range) { try decodeHeld(buffer, body, into: &out) }
        return out
    }

    /// The record bodies the body at `range` holds, undecoded: a batch's records (format version 4), or the body
    /// itself. A reader that wants some kinds only looks at each one's first byte (`stateAt`).
    public static func bodies(_ buffer: [UInt8], _ range: Range<Int>) throws(RecordDecodingError) -> [Range<Int>] {
        guard !range.isEmpty else { throw RecordDecodingError(reason: "an empty record") }
        guard buffer[range.lowerBound] == RecordKind.batch.rawValue else { return [range] }
        var held: [Range<Int>] = []
        var d = RecordDecoder(buffer: buffer, at: range.lowerBound + 1, end: range.upperBound)
        while d.at < d.end {
            let n = Int(try d.u32())
            guard n <= d.end - d.at else { throw RecordDecodingError(reason: "a record runs past its batch") }
            guard n > 0 else { throw RecordDecodingError(reason: "an empty record") }
            guard buffer[d.at] != RecordKind.batch.rawValue else { throw RecordDecodingError(reason: "a batch inside a batch") }
            held.append(d.at..<(d.at + n))
            d.at += n
        }
        return held
    }

    /// Decodes one body that is not a batch into its records (a `stateFixed` that is also a result: two).
    static func decodeHeld(_ buffer: [UInt8], _ range: Range<Int>, into out: inout [JournalRecord]) throws(RecordDecodingError) {
        guard buffer[range.lowerBound] == RecordKind.stateFixed.rawValue else {
            out.append(try decode(buffer, range))
            return
        }
        var d = RecordDecoder(buffer: buffer, at: range.lowerBound + 1, end: range.upperBound)
        let flags = try d.byte()
        let version = try d.u64(), seq = try d.u64()
        let store = try d.string()
        let bytes = try d.fixedBytes()
        guard d.at == d.end else { throw RecordDecodingError(reason: "\(d.end - d.at) bytes left after a record") }
        guard flags & ~(RecordEncoder.stateIsPatch | RecordEncoder.stateIsDone) == 0 else {
            throw RecordDecodingError(reason: "unknown state flags \(flags)")
        }
        if flags & RecordEncoder.stateIsPatch != 0 {
            out.append(.patch(store: store, version: version, seq: seq, patch: bytes))
        } else {
            out.append(.snapshot(store: store, version: version, seq: seq, state: bytes))
        }
        if flags & RecordEncoder.stateIsDone != 0 {
            out.append(.result(seq: seq, store: store, outcome: .done, version: version))
        }
    }

    /// Decodes the body at `range` of `buffer`, one record of a kind that holds one (slices of the result share
    /// `buffer`'s storage; `decodeAll` reads every kind).
    public static func decode(_ buffer: [UInt8], _ range: Range<Int>) throws(RecordDecodingError) -> JournalRecord {
        var d = RecordDecoder(buffer: buffer, at: range.lowerBound, end: range.upperBound)
        let r = try d.record()
        guard d.at == d.end else { throw RecordDecodingError(reason: "\(d.end - d.at) bytes left after a record") }
        return r
    }

    /// The kind and, for an action or result, the seq of the body at `range`, without decoding the rest.
    public static func peekSeq(_ buffer: [UInt8], _ range: Range<Int>) -> (RecordKind?, UInt64?) {
        var d = RecordDecoder(buffer: buffer, at: range.lowerBound, end: range.upperBound)
        guard let kindByte = try? d.byte(), let kind = RecordKind(rawValue: kindByte) else { return (nil, nil) }
        switch kind {
        case .action, .result: return (kind, try? d.varint())
        case .actionFixed: return (kind, (try? d.byte()).flatMap { _ in try? d.u64() })
        default: return (kind, nil)
        }
    }

    mutating func record() throws(RecordDecodingError) -> JournalRecord {
        let kindByte = try byte()
        guard let kind = RecordKind(rawValue: kindByte) else {
            throw RecordDecodingError(reason: "unknown record kind \(kindByte)")
        }
        switch kind {
        case .seqReserve:
            return .seqReserve(try varint())
        case .register:
            let store = try string()
            let handles = try strings()
            let waitFor = try strings()
            return .register(store: store, handles: handles, waitFor: waitFor)
        case .action:
            let seq = try varint(), time = try varint()
            let type = try bytes()
            let origin = try varint()
            let flags = try byte()
            let cause = flags & RecordEncoder.hasCause != 0 ? try varint() : nil
            let id = flags & RecordEncoder.hasID != 0 ? try bytes() : nil
            var session: ArraySlice<UInt8>?
            var uid: UInt32 = 0
            if flags & RecordEncoder.hasSession != 0 {
                session = try bytes()
                uid = UInt32(truncatingIfNeeded: try varint())
            }
            let payload = try bytes()
            let targets = try strings()
            return .action(ActionEntry(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                       session: session, uid: uid, payload: payload, targets: targets))
        case .result:
            let seq = try varint()
            let store = try string()
            let version = try varint()
            return .result(seq: seq, store: store, outcome: try outcomeBody(), version: version)
        case .snapshot:
            let store = try string()
            let version = try varint(), seq = try varint()
            return .snapshot(store: store, version: version, seq: seq, state: try bytes())
        case .patch:
            let store = try string()
            let version = try varint(), seq = try varint()
            return .patch(store: store, version: version, seq: seq, patch: try bytes())
        case .storePosition:
            let store = try string()
            let version = try varint(), seq = try varint()
            return .storePosition(store: store, version: version, seq: seq)
        case .outcome:
            let uid = UInt32(truncatingIfNeeded: try varint())
            let session = Array(try bytes()), id = Array(try bytes())
            let seq = try varint()
            let n = try varint()
            guard n <= UInt64(end - at) else { throw RecordDecodingError(reason: "a list runs past its record") }
            var results: [TargetResult] = []
            for _ in 0..<n {
                let store = try string()
                let version = try varint()
                results.append(TargetResult(store: store, outcome: try outcomeBody(), version: version))
            }
            return .outcome(uid: uid, session: session, id: id, seq: seq, results: results)
        case .forget:
            let store = try string()
            let seq = try varint()
            return .forget(store: store, seq: seq, versionFloor: try varint())
        case .segmentSummary:
            return .segmentSummary(number: try varint(), firstSeq: try varint(), lastSeq: try varint(),
                                   lastTime: try varint(), actions: try varint())
        case .actionFixed:
            let flags = try byte()
            let seq = try u64(), time = try u64(), origin = try u64()
            let cause = flags & RecordEncoder.hasCause != 0 ? try u64() : nil
            let type = try fixedBytes()
            let id = flags & RecordEncoder.hasID != 0 ? try fixedBytes() : nil
            var session: ArraySlice<UInt8>?
            var uid: UInt32 = 0
            if flags & RecordEncoder.hasSession != 0 {
                session = try fixedBytes()
                uid = try u32()
            }
            let payload = try fixedBytes()
            let targets = try strings()
            return .action(ActionEntry(seq: seq, time: time, typeJSON: type, origin: origin, cause: cause, id: id,
                                       session: session, uid: uid, payload: payload, targets: targets))
        case .stateFixed, .batch:
            throw RecordDecodingError(reason: "a \(kind) record holds more than one record (decodeAll reads it)")
        }
    }

    mutating func outcomeBody() throws(RecordDecodingError) -> ResultOutcome {
        switch try byte() {
        case 0: return .done
        case 1: return .rejected(try bytes())
        case 2: return .unavailable(code: try string(), message: try string())
        case let other: throw RecordDecodingError(reason: "unknown result kind \(other)")
        }
    }

    mutating func byte() throws(RecordDecodingError) -> UInt8 {
        guard at < end else { throw RecordDecodingError(reason: "record ends early") }
        defer { at += 1 }
        return buffer[at]
    }

    mutating func varint() throws(RecordDecodingError) -> UInt64 {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte()
            guard shift < 64 else { throw RecordDecodingError(reason: "varint too long") }
            value |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return value }
            shift += 7
        }
    }

    /// A fixed-width little-endian number (format version 4's fields).
    mutating func littleEndian<T: FixedWidthInteger & UnsignedInteger>(_: T.Type) throws(RecordDecodingError) -> T {
        let size = MemoryLayout<T>.size
        guard end - at >= size else { throw RecordDecodingError(reason: "record ends early") }
        var v: T = 0
        for i in 0..<size { v |= T(buffer[at + i]) << (8 * i) }
        at += size
        return v
    }

    mutating func u64() throws(RecordDecodingError) -> UInt64 { try littleEndian(UInt64.self) }

    mutating func u32() throws(RecordDecodingError) -> UInt32 { try littleEndian(UInt32.self) }

    mutating func fixedBytes() throws(RecordDecodingError) -> ArraySlice<UInt8> {
        let n = Int(try u32())
        guard n <= end - at else { throw RecordDecodingError(reason: "a field runs past its record") }
        defer { at += n }
        return buffer[at..<(at + n)]
    }

    mutating func bytes() throws(RecordDecodingError) -> ArraySlice<UInt8> {
        let n = try varint()
        guard n <= UInt64(end - at) else { throw RecordDecodingError(reason: "a field runs past its record") }
        defer { at += Int(n) }
        return buffer[at..<(at + Int(n))]
    }

    mutating func string() throws(RecordDecodingError) -> String {
        let b = try bytes()
        return String(decoding: b, as: UTF8.self)
    }

    mutating func strings() throws(RecordDecodingError) -> [String] {
        let n = try varint()
        guard n <= UInt64(end - at) else { throw RecordDecodingError(reason: "a list runs past its record") }
        var out: [String] = []
        out.reserveCapacity(Int(n))
        for _ in 0..<n { out.append(try string()) }
        return out
    }
}
