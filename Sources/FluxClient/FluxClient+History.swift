import FluxCore

/// One action from fluxd's journal (SPEC §8.12 `history`): what was dispatched and the results it has, as the
/// JSON fluxd sent (payloads and results are not decoded).
public struct HistoryEntry: Sendable, Equatable {
    public var seq: Int
    /// When fluxd accepted it, in milliseconds since the Unix epoch.
    public var time: Int
    public var type: String
    public var origin: Int
    public var cause: Int?
    public var payload: RawJSON
    /// Target store names, sorted.
    public var targets: [String]
    /// The results so far (a JSON array of result objects, as in `settled`; fewer than `targets` while pending).
    public var results: RawJSON
    /// The entry as fluxd sent it (one JSON object): the line `fluxctl journal --json` prints.
    public var json: RawJSON
}

/// A page of fluxd's journal.
public struct HistoryPage: Sendable, Equatable {
    /// The oldest seq the journal holds, and the newest seq accepted.
    public var first: Int
    public var last: Int
    public var entries: [HistoryEntry]
    /// Where the next page starts (nil: this page reached `last`).
    public var next: Int?
}

extension FluxClient {
    /// Dispatches an action of a recorded session again with the seq it had (`dispatch.seq`, accepted only by a
    /// fluxd started with `--replay`, SPEC §8.3) and waits for its settlement: stores that keep seqs in their
    /// state then end in the same state as when it was recorded.
    public func replayDispatch(type: String, payloadJSON: [UInt8]?, seq: Int, cause: Int? = nil,
                               timeout: Duration? = nil) async throws(FluxError) -> Settlement {
        guard Names.isValidType(type) else { throw .invalidArgument("bad action type \"\(type)\"") }
        if let payloadJSON { try FluxJSON.validate(payloadJSON) }
        let id = nextID("s")
        var b = FrameBuilder(op: "dispatch", capacity: 80 + (payloadJSON?.count ?? 0))
        b.string("id", id)
        b.string("type", type)
        if let payloadJSON { b.raw("payload", payloadJSON) }
        b.bool("settle", true)
        if let cause { b.int("cause", cause) }
        b.int("seq", seq)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "the settlement of \(type)")
        return try Self.parseSettlement(reply, id: id)
    }

    /// Reads accepted actions and their outcomes from fluxd's journal, from seq `from` (nil: the oldest retained),
    /// at most `limit` (1-1000). An ephemeral fluxd refuses with `not-retained`.
    public func history(from: Int? = nil, limit: Int = 100, timeout: Duration? = nil) async throws(FluxError) -> HistoryPage {
        guard (1...1000).contains(limit) else { throw .invalidArgument("limit must be 1 to 1000, got \(limit)") }
        if let from, from < 1 { throw .invalidArgument("from must be a seq (at least 1), got \(from)") }
        let id = nextID("h")
        var b = FrameBuilder(op: "history")
        b.string("id", id)
        if let from { b.int("from", from) }
        b.int("limit", limit)
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "fluxd's history")
        guard reply.fluxString("op") == "history", let list = reply.raw("entries") else {
            throw .protocolViolation("bad history message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        var entries: [HistoryEntry] = []
        for object in try Self.objects(in: list) {
            guard let e = try? Envelope(body: Array(object)) else {
                throw .protocolViolation("bad history entry: \(String(decoding: object, as: UTF8.self))")
            }
            guard let seq = e.fluxInt("seq"), let type = e.fluxString("type"), let payload = e.raw("payload"),
                  let results = e.raw("results") else {
                throw .protocolViolation("bad history entry: \(String(decoding: object, as: UTF8.self))")
            }
            entries.append(HistoryEntry(
                seq: seq, time: e.fluxInt("time") ?? 0, type: type, origin: e.fluxInt("origin") ?? 0,
                cause: e.fluxInt("cause"), payload: RawJSON(Array(payload)),
                targets: e.stringArray("targets").value ?? [], results: RawJSON(Array(results)),
                json: RawJSON(Array(object))))
        }
        return HistoryPage(first: reply.fluxInt("first") ?? 0, last: reply.fluxInt("last") ?? 0, entries: entries,
                           next: reply.fluxInt("next"))
    }

    /// A store's state as it was: at `version`, or the newest one whose seq is at most `seq` (give one of them).
    /// Refused with `not-retained` when that state is older than the journal's retention window.
    public func stateAt(store: String, version: Int? = nil, seq: Int? = nil,
                        timeout: Duration? = nil) async throws(FluxError) -> Snapshot<RawJSON> {
        guard Names.isValidStore(store) else { throw .invalidArgument("bad store name \"\(store)\"") }
        guard (version == nil) != (seq == nil) else { throw .invalidArgument("give a version or a seq, not both") }
        let id = nextID("r")
        var b = FrameBuilder(op: "state-at")
        b.string("id", id)
        b.string("store", store)
        if let version { b.int("version", version) }
        if let seq { b.int("seq", seq) }
        let reply = try await request(key: id, frame: b.finish(), timeout: timeout, what: "a past state of \(store)")
        guard reply.fluxString("op") == "state-at", let v = reply.fluxInt("version"), let raw = reply.raw("state") else {
            throw .protocolViolation("bad state-at message: \(String(decoding: reply.body, as: UTF8.self))")
        }
        return Snapshot(store: store, version: v, seq: reply.fluxInt("seq") ?? 0, state: RawJSON(Array(raw)))
    }
}
