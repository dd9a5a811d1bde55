import FluxCore
import FluxJournal
import FluxRouter
import Glibc

/// Answers `history` and `state-at` (SPEC §8.12) from the journal's files: registered with the daemon core as
/// host operations, so the router validates the requests and counts the replies like any other.
///
/// The files are read off the loop thread: `prepare`, on the loop thread, captures what the read needs (a
/// `JournalReadView`: descriptors and lengths, `Journal.readView`'s contract, and the newest seq accepted), and
/// returns the read itself, which the daemon runs on its reader thread (`Daemon.offLoop`); the answer comes back
/// to the loop thread through `DaemonCore.complete`.
struct JournalOperations {
    let journal: Journal
    /// The newest seq accepted (for `history.last`).
    let lastSeq: () -> UInt64
    /// Test seam (`FLUXD_TEST_HOLD_READS`, the path of a FIFO): each read first waits for a byte from it, so a
    /// test can hold a read in progress for as long as it likes, without timing.
    let holdPath: String?

    /// On the journal's (loop) thread: what `request` needs captured; the returned work reads on any thread.
    func prepare(_ request: HostRequest) -> @Sendable () -> HostAnswer {
        let holdPath = self.holdPath
        switch request {
        case .history(let idRaw, let from, let limit):
            let view = journal.readView(historyFrom: from)
            let last = lastSeq()
            return {
                Self.hold(holdPath)
                return Self.history(view.history(from: from, limit: limit), id: idRaw, from: from, last: last)
            }
        case .stateAt(let idRaw, let store, let version, let seq):
            let view = journal.readView()
            return {
                Self.hold(holdPath)
                return Self.stateAt(view.stateAt(store: store, version: version, seq: seq), id: idRaw, store: store,
                                    version: version, seq: seq)
            }
        default:
            let op = request.op.rawValue
            return { .error(.unknownOp, "\(op) is not a journal operation") }
        }
    }

    /// The answer to one request, read on this thread (tests).
    func answer(_ request: HostRequest) -> HostAnswer { prepare(request)() }

    private static func hold(_ path: String?) {
        guard let path else { return }
        let fd = open(path, O_RDONLY | O_CLOEXEC)  // blocks until the test opens it to write
        guard fd >= 0 else { return }
        var byte: UInt8 = 0
        while read(fd, &byte, 1) < 0 && errno == EINTR {}
        close(fd)
    }

    static func history(_ page: HistoryPage, id idRaw: [UInt8]?, from: UInt64?, last: UInt64) -> HostAnswer {
        if let damage = page.damage, page.entries.isEmpty {
            // What reads before damage is answered (with `next`); a page from there on is this error, so a
            // reader following `next` never gets a silent gap.
            return .error(.notRetained, "the journal's history from seq \(from ?? page.first) on cannot be read: \(damage)")
        }
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
    }

    static func stateAt(_ past: PastState?, id idRaw: [UInt8]?, store: String, version: UInt64?, seq: UInt64?) -> HostAnswer {
        guard let past else {
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
    }
}
