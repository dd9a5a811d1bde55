import FluxCore
import FluxJournal
@testable import FluxRouter

/// The router tests' adapter of the daemon core (`DaemonCore`, the one host of the semantics): frames in,
/// frames out, a fake clock, no sockets. Frames sent to each peer are decoded into envelopes and kept in that
/// peer's inbox.
final class TestBus: DaemonTransport {
    private(set) var core: DaemonCore!
    var router: Router { core.router }
    var now: Millis = 1_000
    private(set) var inbox: [PeerID: [Envelope]] = [:]
    private(set) var closedPeers: Set<PeerID> = []
    private(set) var logs: [String] = []
    /// Inside `batch`: events are one batch of reads, ended by one `.endOfBatch`.
    private var inBatch = false
    /// Peers the core closed during the event being fed, reported `.closed` after it.
    private var toClose: [PeerID] = []

    /// Feeds what `body` feeds as one batch of reads (as one 64 KiB read of several frames would be).
    func batch(_ body: () -> Void) {
        inBatch = true
        body()
        inBatch = false
        if router.hasDeferredWork { feed(.endOfBatch) }
        flush()
    }

    /// Stores reported stalled: (store, closing).
    private(set) var stalls: [(store: String, closing: Bool)] = []
    /// Store changes reported to the host.
    private(set) var storeChanges: [StoreChange] = []
    /// Every frame sent to each peer as (op, coalescing mark), in order; never cleared by `take`.
    private(set) var marks: [PeerID: [(op: String, coalescing: Coalescing)]] = [:]

    /// A durable bus's journal (`DaemonCore.attachJournal`): frames wait in `unflushed` until the end of their
    /// batch, when the core commits the journal (`DaemonCore.commitJournal`), as fluxd's flush hook does; while it
    /// cannot write, they stay there. Every frame delivered is checked against what the journal has written
    /// (`revealed`).
    private(set) var journal: MemoryJournal?
    private var unflushed: [(PeerID, Envelope)] = []
    private var depth = 0
    /// Frames delivered that revealed something the journal had not written (must stay empty).
    private(set) var revealedUnwritten: [String] = []

    /// `restoring`: what the journal recovered, when not `journal`'s own records (a previous run's).
    init(journal: MemoryJournal? = nil, restoring: JournalState? = nil, _ configure: (inout RouterConfig) -> Void = { _ in }) {
        var config = DaemonCoreConfig()
        configure(&config.router)
        core = DaemonCore(config: config, transport: self, journal: journal)
        core.onLog = { [unowned self] _, line in self.logs.append(line) }
        core.onStoreStalled = { [unowned self] store, _, closing in self.stalls.append((store, closing)) }
        core.onStoreChange = { [unowned self] change in self.storeChanges.append(change) }
        if let journal {
            self.journal = journal
            core.attachJournal(recovered: restoring ?? journal.recovered(), chargedTo: 0, now: now)
        }
    }

    /// Frames held back, waiting for the journal.
    var heldFrames: Int { unflushed.count }

    /// The end of a batch with a journal: commits it and delivers the frames if it wrote.
    private func flush() {
        guard journal != nil, !unflushed.isEmpty || core.holdsFramesForJournal || journal!.hasStaged else { return }
        guard core.commitJournal(now: now) else { return }
        let frames = unflushed
        unflushed = []
        for (peer, env) in frames {
            checkRevealed(env, to: peer)
            inbox[peer, default: []].append(env)
        }
    }

    /// What a frame reveals (an action's seq, a store's version) must be in a written record.
    private func checkRevealed(_ env: Envelope, to peer: PeerID) {
        guard let journal else { return }
        let written = journal.decodedWritten()
        var maxSeq: UInt64 = 0
        var versions: [String: UInt64] = [:]
        for r in written {
            switch r {
            case .action(let a): maxSeq = max(maxSeq, a.seq)
            case .snapshot(let store, let version, _, _), .patch(let store, let version, _, _):
                versions[store] = max(versions[store] ?? 0, version)
            default: break
            }
        }
        if ["action", "settled", "accepted"].contains(env.op), let seq = env.int("seq").value, UInt64(seq) > maxSeq {
            revealedUnwritten.append("\(env.op) to peer \(peer) reveals seq \(seq); the journal has written up to \(maxSeq)")
        }
        if ["snapshot", "delta"].contains(env.op), let store = env.str("store"), let version = env.int("version").value,
           UInt64(version) > versions[store] ?? 0 {
            revealedUnwritten.append("\(env.op) to peer \(peer) reveals \(store) version \(version); the journal has written up to \(versions[store] ?? 0)")
        }
    }

    /// Feeds an event through the core; a peer it closed is answered with a `closed` event, as the transport does.
    func feed(_ event: RouterEvent) {
        depth += 1
        core.handle(event, now: now)
        let closing = toClose
        toClose = []
        for peer in closing where !closedPeers.contains(peer) {
            closedPeers.insert(peer)
            feed(.closed(peer))
        }
        // Each event is its own batch here, as if every frame came in a read of its own (unless inside `batch`).
        if router.hasDeferredWork && !inBatch { feed(.endOfBatch) }
        depth -= 1
        if depth == 0 && !inBatch { flush() }
    }

    /// The adapter's journal timer (`DaemonCore.journalTimer`), and the flush it asks for.
    func journalTimer() {
        if core.journalTimer(now: now) { flush() }
    }

    // MARK: DaemonTransport

    func write(_ frame: Frame, to peer: PeerID) -> Int {
        precondition(!closedPeers.contains(peer), "frame sent to closed peer \(peer)")
        let env = try! Envelope(body: frame.bodyArray)
        if journal != nil { unflushed.append((peer, env)) } else { inbox[peer, default: []].append(env) }
        marks[peer, default: []].append((env.op, frame.coalescing))
        return 0
    }

    /// Bytes a test says wait unwritten for a peer (a peer that is behind, SPEC §16.3).
    var queued: [PeerID: Int] = [:]
    func queuedBytes(of peer: PeerID) -> Int { queued[peer] ?? 0 }
    func accountableBytes(of peer: PeerID) -> Int { 0 }
    func charged(_ bytes: Int, for peer: PeerID) {}
    func discardQueued(of peer: PeerID) {}
    func close(_ peer: PeerID, cutOffAfter: Millis?) { toClose.append(peer) }
    func requestEndOfBatch() {}  // the batch ends after this event (or `batch`)

    /// Whether preparations wait in `preparations` until `runPreparations()` (as fluxd's run on another thread
    /// while the loop serves other peers); by default the core runs them right after the event.
    var deferPreparations = false
    private(set) var preparations: [(PeerID, Preparation)] = []
    func startPreparation(_ preparation: Preparation, for peer: PeerID) -> Bool {
        guard deferPreparations else { return false }
        preparations.append((peer, preparation))
        return true
    }

    /// Runs the waiting preparations, in order, and feeds their results (`.prepared`).
    func runPreparations() {
        while !preparations.isEmpty {
            let (peer, preparation) = preparations.removeFirst()
            feed(.prepared(peer, preparation.run()))
        }
    }

    func connect(_ id: PeerID) { feed(.connected(id, PeerCredentials(pid: Int32(id), uid: 1000))) }

    func send(_ id: PeerID, _ json: String) { feed(.frame(id, Array(json.utf8))) }

    /// Connects and completes the handshake; drops the welcome.
    func join(_ id: PeerID, role: String, name: String = "") {
        connect(id)
        send(id, #"{"op":"hello","protocol":1,"role":"\#(role)","name":"\#(name)"}"#)
        let got = take(id)
        precondition(got.count == 1 && got[0].op == "welcome", "handshake failed: \(got.map(\.text))")
    }

    /// A store peer that registers one store.
    func store(_ id: PeerID, _ name: String, handles: [String], waitFor: [String] = [], state: String? = nil) {
        join(id, role: "store", name: "\(name)-worker")
        register(id, name, handles: handles, waitFor: waitFor, state: state)
    }

    func register(_ id: PeerID, _ name: String, handles: [String], waitFor: [String] = [], state: String? = nil) {
        let h = handles.map { "\"\($0)\"" }.joined(separator: ",")
        let w = waitFor.map { "\"\($0)\"" }.joined(separator: ",")
        send(id, #"{"op":"register","store":"\#(name)","handles":[\#(h)],"waitFor":[\#(w)]\#(state.map { ",\"state\":\($0)" } ?? "")}"#)
    }

    /// Removes and returns everything sent to a peer so far.
    func take(_ id: PeerID) -> [Envelope] {
        defer { inbox[id] = [] }
        return inbox[id] ?? []
    }

    /// Removes and returns the ops sent to a peer so far.
    func ops(_ id: PeerID) -> [String] { take(id).map(\.op) }

    func disconnect(_ id: PeerID) {
        closedPeers.insert(id)
        feed(.closed(id))
    }

    func advance(_ ms: Millis) {
        now += ms
        feed(.tick)
    }
}

extension Envelope {
    var op: String { string("op").value ?? "?" }
    var text: String { String(decoding: body, as: UTF8.self) }
    func str(_ key: String) -> String? { string(key).value }
    func num(_ key: String) -> Int64? { int(key).value }
    func rawText(_ key: String) -> String? { raw(key).map { String(decoding: $0, as: UTF8.self) } }
}
