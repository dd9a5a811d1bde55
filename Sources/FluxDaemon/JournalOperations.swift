import FluxCore
import FluxJournal
import FluxRouter

/// Answers `history` and `state-at` (SPEC §8.12) from the journal's files: registered with the daemon core as
/// host operations, so the router validates the requests and counts the replies like any other.
struct JournalOperations {
    let journal: Journal
    /// The newest seq accepted (for `history.last`).
    let lastSeq: () -> UInt64

    func answer(_ request: HostRequest) -> HostAnswer {
        switch request {
        case .history(let idRaw, let from, let limit):
            let page = journal.history(from: from, limit: limit)
            if let damage = page.damage, page.entries.isEmpty {
                // What reads before damage is answered (with `next`); a page from there on is this error, so a
                // reader following `next` never gets a silent gap.
                return .error(.notRetained, "the journal's history from seq \(from ?? page.first) on cannot be read: \(damage)")
            }
            let last = lastSeq()
            var j = JSONBuilder(capacity: 256 * page.entries.count + 64)
            j.array { list in
                for entry in page.entries {
                    list.object { o in
                        let a = entry.action
                        o.field("seq", a.seq)
                        o.field("time", a.time)
                        o.rawField("type", a.typeJSON)
                        o.field("origin", a.origin)
                        if let cause = a.cause { o.field("cause", cause) }
                        o.rawField("payload", a.payload)
                        o.field("targets", strings: a.targets)
                        o.array("results") { results in
                            for r in entry.results {
                                results.object { ro in Router.writeResult(r, to: &ro) }
                            }
                        }
                    }
                }
            }
            var b = FrameBuilder(op: "history", capacity: j.bytes.count + 128)
            if let idRaw { b.raw("id", idRaw[...]) }
            b.int("first", page.first)
            b.int("last", last)
            b.raw("entries", j.bytes)
            if let lastEntry = page.entries.last, lastEntry.action.seq < last { b.int("next", lastEntry.action.seq + 1) }
            return .reply(b.finish())
        case .stateAt(let idRaw, let store, let version, let seq):
            guard let past = journal.stateAt(store: store, version: version, seq: seq) else {
                let what = version.map { "version \($0)" } ?? "the state after seq \(seq ?? 0)"
                return .error(.notRetained, "\(what) of store \"\(store)\" is not in the journal's retention window")
            }
            var b = FrameBuilder(op: "state-at", capacity: past.state.count + 128)
            if let idRaw { b.raw("id", idRaw[...]) }
            b.string("store", store)
            b.int("version", past.version)
            b.int("seq", past.seq)
            b.raw("state", past.state)
            return .reply(b.finish())
        default:
            return .error(.unknownOp, "\(request.op.rawValue) is not a journal operation")
        }
    }
}
