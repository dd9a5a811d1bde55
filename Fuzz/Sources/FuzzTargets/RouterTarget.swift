#if canImport(Glibc)
import Glibc
#endif
import FluxCore
import FluxRouter
import Foundation

/// Target c: the router driven by an "event program". The input is read as a sequence of steps over a few peer
/// slots; each step feeds one `RouterEvent` (a peer's message built from a template, a raw garbage frame, a
/// connection closing, time passing, drain, shutdown …) and checks every invariant against the effects.
///
/// Layout: byte 0-1 = router limits and options (`RouterHarness.init`); then steps. A step's first byte picks a
/// message template (below `RouterHarness.controlBase`) or a control step; the next byte a slot; templates read
/// their arguments from the bytes that follow. Past the end of the input every byte reads 0, and the program ends
/// with `shutdown` and every connection closed, after which no action may be pending.
///
/// To extend it for a new message or field: add a `MessageTemplate` to `RouterHarness.templates` (and, if the
/// router's answer to it can be predicted, an `Expectation` and its check in `RouterHarness.afterEvent`); for a
/// new frame fluxd sends, add its op to `RouterHarness.observe`.
enum RouterTarget {
    static func run(_ data: UnsafeBufferPointer<UInt8>) {
        let harness = RouterHarness(ByteReader(data))
        harness.runProgram()
    }
}

/// What the harness knows of one connection.
final class PeerModel {
    let id: PeerID
    let slot: Int
    /// The role asked for in the last hello (it holds once `welcome` arrives).
    var pendingRole: String?
    var role: String?
    /// The router asked to close it (`.close` effect): nothing may be sent to it from then on.
    var closeEffect = false
    /// `.closed` was fed: the router must have forgotten it.
    var closedEvent = false
    /// Stores it owns (a `registered` frame arrived; an unregister without error, or the end of the connection,
    /// ends that).
    var owned: Set<String> = []
    /// Per owned store: the actions delivered since it registered the store, and which of them are unanswered.
    var deliveries: [String: Deliveries] = [:]
    /// The newest snapshot version seen per store (snapshot, subscribed, registered, store-up, got).
    var versions: [String: Int64] = [:]
    /// Dispatch ids sent with `settle: true` and not yet settled or refused.
    var awaiting: Set<String> = []
    var nextID = 0
    var queryIDs: [String] = []
    /// Stores it is subscribed to (`subscribed` arrived, `unsubscribed` not since).
    var subscriptions: Set<String> = []

    init(id: PeerID, slot: Int) {
        self.id = id
        self.slot = slot
    }

    var isLive: Bool { !closedEvent }

    func freshID(_ prefix: String) -> String {
        nextID += 1
        return "\(prefix)\(nextID)"
    }
}

/// The actions one connection received for one store since it registered it (R1, R2).
struct Deliveries {
    /// The last seq delivered in this registration (they must increase).
    var last: Int64 = 0
    /// Whether a first-time (not `redelivered`) action came in this registration: redeliveries come first.
    var sawFresh = false
    /// Delivered and not answered yet, oldest first: the oldest is the only one an answer may name (R2).
    var outstanding: [Int64] = []
}

/// A message a peer sends: its body, and what the harness expects of the router's answer.
struct Outgoing {
    var body: [UInt8]
    var expect: Expectation = .nothing

    init(_ text: String, _ expect: Expectation = .nothing) {
        body = Array(text.utf8)
        self.expect = expect
    }

    init(bytes: [UInt8]) { body = bytes }
}

/// What the harness can predict about the router's answer to a message (checked in `afterEvent`).
enum Expectation {
    case nothing
    /// A hello asking for `role` (welcome then sets the peer's role).
    case hello(role: String)
    /// A dispatch with a fresh id: refused with an `error` whose `ref` is the id in this event, or accepted (and,
    /// with settle, settled exactly once later).
    case dispatch(id: String, settle: Bool)
    /// A well-formed `done`/`reject` naming `store`, which the peer owns, and `seq`: accepted (no error) exactly
    /// when `seq` is the oldest unanswered action delivered to it for that store.
    case answer(store: String, seq: Int64)
    /// An unregister of a store the peer owns: no error, and the store is no longer the peer's.
    case unregister(store: String)
}

/// A message template: builds what a peer in a given state sends, reading its choices from the input.
struct MessageTemplate: Sendable {
    let name: String
    let build: @Sendable (RouterHarness, PeerModel) -> Outgoing
}

/// Collects effects given to a `RouterEffectSink` (the harness runs the router through the sink API or the effect
/// array API, chosen by the input).
final class CollectingSink: RouterEffectSink {
    var effects: [RouterEffect] = []
    func send(_ frame: Frame, to peer: PeerID) { effects.append(.send(peer, frame)) }
    func perform(_ effect: RouterEffect) { effects.append(effect) }
}

final class RouterHarness {
    var r: ByteReader
    let router: Router
    let useSink: Bool
    /// The program ends without shutdown or closing anything: the router is simply released.
    let abandon: Bool
    let sink = CollectingSink()
    let slotCount = 5
    var slots: [PeerModel?]
    var peers: [PeerID: PeerModel] = [:]
    var nextPeerID: PeerID = 1
    var now: Millis = 1_000
    var shutDown = false
    /// `.close` effects whose `.closed` event has not been fed yet.
    var pendingCloses: [PeerID] = []
    /// Per store: the seqs whose answer the router accepted (they may never be delivered again).
    var answered: [String: Set<Int64>] = [:]
    /// Per store: every seq ever delivered (a first-time delivery must be new).
    var delivered: [String: Set<Int64>] = [:]
    var steps = 0
    /// FLUXBUS_FUZZ_TRACE=1: print every event and its frames (to read what an input does: run the target on
    /// that one file).
    static let trace = getenv("FLUXBUS_FUZZ_TRACE").map { String(cString: $0) == "1" } ?? false

    // Errors sent in the current event, by peer: (code, ref, fatal).
    var eventErrors: [PeerID: [(code: String, ref: String?, fatal: Bool)]] = [:]
    var eventDescription = ""

    static let storeWindows = [1, 2, 3, 64]
    static let queueLimits = [1, 2, 1024, 0]  // 0: every dispatch to a live store is refused (overloaded)
    static let timeouts: [Millis] = [1, 100, 5_000]
    static let maxPendings = [1, 3, 65_536]

    init(_ reader: ByteReader) {
        r = reader
        let b0 = r.byte()
        let b1 = r.byte()
        var config = RouterConfig()
        config.storeWindow = Self.storeWindows[Int(b0 & 3)]
        config.queueLimit = Self.queueLimits[Int(b0 >> 2) & 3]
        config.queueTimeout = Self.timeouts[Int(b0 >> 4) % 3]
        config.handshakeTimeout = Self.timeouts[Int(b1 & 3) % 3]
        config.maxPending = Self.maxPendings[Int(b1 >> 2) % 3]
        config.maxFrame = 4096
        config.hostOps = ["workers"]
        useSink = b0 & 0x80 != 0
        abandon = b1 & 0xF0 == 0xF0
        router = Router(config: config)
        slots = Array(repeating: nil, count: slotCount)
    }

    // MARK: - Names the templates draw from

    static let stores = ["todos", "stats", "a", "b.c"]
    static let badStores = ["", "bad name", "x*", "é"]
    static let types = ["todo/add", "todo/del", "stats/reset", "a", "zzz"]
    static let patterns = ["todo/*", "todo/add", "stats/*", "*", "a"]
    static let states = [#"{}"#, #"{"n":1}"#, #"{"n":2}"#, #"[1,2]"#, #""s""#, "0", #"{"t":"\u00e9\n"}"#]
    static let queries = [#"{"site":1}"#, #"{"site":2}"#, "[]", #""x""#, "null", #"{"site":1 }"#]
    static let payloads = ["{}", "null", "[1]", #"{"t":"\u00e9"}"#, #""str""#]

    func store() -> String { r.pick(Self.stores) }
    func anyStore() -> String { r.below(8) == 0 ? r.pick(Self.badStores) : store() }
    func quoted(_ s: String) -> String {
        var out: [UInt8] = []
        appendEscaped(s, to: &out)
        return String(decoding: out, as: UTF8.self)
    }
    func stringArray(_ table: [String]) -> String {
        let mask = r.byte()
        let items = table.indices.filter { mask & (1 << UInt8($0)) != 0 }.map { quoted(table[$0]) }
        return "[" + items.joined(separator: ",") + "]"
    }

    /// The store an answer names: one the peer owns when it owns any (mostly), else any.
    func answerStore(_ peer: PeerModel) -> String {
        let owned = peer.owned.sorted()
        if !owned.isEmpty && r.below(8) != 0 { return owned[r.below(owned.count)] }
        return store()
    }

    /// The seq an answer names: the right one (the oldest unanswered), or a wrong one.
    func answerSeq(_ peer: PeerModel, _ store: String) -> Int64 {
        let outstanding = peer.deliveries[store]?.outstanding ?? []
        switch r.below(6) {
        case 0, 1, 2: return outstanding.first ?? 1
        case 3: return outstanding.count > 1 ? outstanding[1] : (outstanding.first ?? 0) + 1
        case 4: return outstanding.last.map { $0 + Int64(r.below(3)) } ?? 1
        default: return Int64(r.byte()) - 1
        }
    }

    /// Every message a peer can send. Each reads its choices from the input; the expectation says what can be
    /// checked about the answer.
    static let templates: [MessageTemplate] = [
        MessageTemplate(name: "hello") { h, peer in
            let role = h.r.pick(["client", "store", "monitor", "client", "store", "bogus"])
            let proto = h.r.pick(["1", "1", "1", "2", "\"1\"", "0"])
            var fields = [#""op":"hello""#]
            if h.r.below(8) != 0 { fields.append(#""protocol":\#(proto)"#) }
            if h.r.below(8) != 0 { fields.append(#""role":"\#(role)""#) }
            switch h.r.below(4) {
            case 0: break
            case 1: fields.append(#""name":"p\#(peer.slot)""#)
            case 2: fields.append(#""name":"\#(String(repeating: "n", count: 129))""#)
            default: fields.append(#""name":7"#)
            }
            return Outgoing("{" + fields.joined(separator: ",") + "}", .hello(role: role))
        },
        MessageTemplate(name: "register") { h, peer in
            let name = h.anyStore()
            var fields = [#""op":"register""#, #""store":\#(h.quoted(name))"#]
            switch h.r.below(6) {
            case 0: break
            case 1: fields.append(#""handles":["todo/*","a",1]"#)
            default: fields.append(#""handles":\#(h.stringArray(patterns))"#)
            }
            switch h.r.below(4) {
            case 0, 1: break
            case 2: fields.append(#""waitFor":\#(h.stringArray(stores))"#)
            default: fields.append(#""waitFor":[\#(h.quoted(h.store()))]"#)
            }
            switch h.r.below(4) {
            case 0, 1: break
            case 2: fields.append(#""state":null"#)
            default: fields.append(#""state":\#(h.r.pick(states))"#)
            }
            return Outgoing("{" + fields.joined(separator: ",") + "}")
        },
        MessageTemplate(name: "unregister") { h, peer in
            let name = h.r.bool() ? h.answerStore(peer) : h.anyStore()
            let expect: Expectation = peer.owned.contains(name) ? .unregister(store: name) : .nothing
            return Outgoing(#"{"op":"unregister","store":\#(h.quoted(name))}"#, expect)
        },
        MessageTemplate(name: "dispatch") { h, peer in
            var fields = [#""op":"dispatch""#]
            let t = h.r.below(10)
            fields.append(t < 8 ? #""type":\#(h.quoted(h.r.pick(types)))"# : t == 8 ? #""type":"bad type""# : #""type":3"#)
            if h.r.below(4) != 0 { fields.append(#""payload":\#(h.r.pick(payloads))"#) }
            var expect = Expectation.nothing
            let settleChoice = h.r.below(8)
            let settle = settleChoice < 4
            switch h.r.below(8) {
            case 0: if settle { fields.append(#""id":"""#) }
            case 1: fields.append(#""id":5"#)
            case 2: break
            default:
                let id = peer.freshID("d")
                fields.append(#""id":"\#(id)""#)
                if settleChoice != 7 { expect = .dispatch(id: id, settle: settle) }
            }
            switch settleChoice {
            case 0...3: fields.append(#""settle":true"#)
            case 4: fields.append(#""settle":false"#)
            case 7: fields.append(#""settle":"yes""#)
            default: break
            }
            switch h.r.below(8) {
            case 0: fields.append(#""cause":1"#)
            case 1: fields.append(#""cause":0"#)
            case 2: fields.append(#""cause":"x""#)
            default: break
            }
            return Outgoing("{" + fields.joined(separator: ",") + "}", expect)
        },
        MessageTemplate(name: "done") { h, peer in
            let name = h.answerStore(peer)
            let seq = h.answerSeq(peer, name)
            var fields = [#""op":"done""#, #""store":\#(h.quoted(name))"#, #""seq":\#(seq)"#]
            var wellFormed = true
            switch h.r.below(8) {
            case 0, 1, 2: break
            case 3: fields.append(#""state":null"#); wellFormed = false
            default: fields.append(#""state":\#(h.r.pick(states))"#)
            }
            if h.r.below(16) == 0 { fields.remove(at: 2); wellFormed = false }
            let expect: Expectation = wellFormed && peer.owned.contains(name) ? .answer(store: name, seq: seq) : .nothing
            return Outgoing("{" + fields.joined(separator: ",") + "}", expect)
        },
        MessageTemplate(name: "reject") { h, peer in
            let name = h.answerStore(peer)
            let seq = h.answerSeq(peer, name)
            let errors = [#"{"code":"x/y","message":"no"}"#, #"{"code":"x/y"}"#, #"{"message":"no code"}"#, "null", #""e""#]
            let e = h.r.below(errors.count)
            let wellFormed = e < 2
            let expect: Expectation = wellFormed && peer.owned.contains(name) ? .answer(store: name, seq: seq) : .nothing
            return Outgoing(#"{"op":"reject","store":\#(h.quoted(name)),"seq":\#(seq),"error":\#(errors[e])}"#, expect)
        },
        MessageTemplate(name: "state") { h, peer in
            let name = h.answerStore(peer)
            let state = h.r.below(8) == 0 ? "null" : h.r.pick(states)
            return Outgoing(#"{"op":"state","store":\#(h.quoted(name)),"state":\#(state)}"#)
        },
        MessageTemplate(name: "subscribe") { h, _ in Outgoing(#"{"op":"subscribe","store":\#(h.quoted(h.anyStore()))}"#) },
        MessageTemplate(name: "unsubscribe") { h, _ in Outgoing(#"{"op":"unsubscribe","store":\#(h.quoted(h.anyStore()))}"#) },
        MessageTemplate(name: "query") { h, peer in
            let id: String
            if !peer.queryIDs.isEmpty && h.r.below(4) == 0 { id = h.r.pick(peer.queryIDs) } else {
                id = peer.freshID("q")
                peer.queryIDs.append(id)
                if peer.queryIDs.count > 8 { peer.queryIDs.removeFirst() }
            }
            let q = h.r.below(8) == 0 ? "" : #","query":\#(h.r.pick(queries))"#
            return Outgoing(#"{"op":"query","id":"\#(id)","store":\#(h.quoted(h.anyStore()))\#(q)}"#)
        },
        MessageTemplate(name: "unquery") { h, peer in
            let id = peer.queryIDs.isEmpty || h.r.below(6) == 0 ? "q0" : h.r.pick(peer.queryIDs)
            return Outgoing(#"{"op":"unquery","id":"\#(id)"}"#)
        },
        MessageTemplate(name: "get") { h, _ in
            Outgoing(#"{"op":"get","id":"g","store":\#(h.quoted(h.anyStore()))}"#)
        },
        MessageTemplate(name: "info") { _, _ in Outgoing(#"{"op":"info","id":"i"}"#) },
        MessageTemplate(name: "ping") { h, _ in Outgoing(h.r.bool() ? #"{"op":"ping","id":"p"}"# : #"{"op":"ping","id":7}"#) },
        MessageTemplate(name: "bye") { _, _ in Outgoing(#"{"op":"bye"}"#) },
        MessageTemplate(name: "host op") { _, _ in Outgoing(#"{"op":"workers","id":"w"}"#) },
        MessageTemplate(name: "unknown op") { h, _ in Outgoing(h.r.pick([#"{"op":"frobnicate"}"#, #"{"op":7}"#, #"{"id":"x"}"#, #"{"op":"welcome"}"#])) },
        MessageTemplate(name: "garbage") { h, _ in
            let table = [
                "", "{", "[]", "null", "\"op\"", #"{"op":"dispatch","op":"ping"}"#, #"{"op":"ping",}"#,
                "{\"op\":\"ping\"} x", #"{"op":"\ud800"}"#, "{\"op\":\"p\u{1}\"}", #"{"op":"dispatch","type":"a","payload":[[[[[[[[[[]]]]]]]]]]}"#,
            ]
            if h.r.below(3) == 0 { return Outgoing(bytes: h.r.bytes(max: 48)) }
            return Outgoing(h.r.pick(table))
        },
    ]

    /// Control steps (not messages): connections, the transport's own events, time, drain and shutdown.
    enum Control: CaseIterable {
        case connect, closed, flushCloses, tick, drain, shutdown, emptyFrame, oversized, backlogged, rawBytes
    }

    /// First-byte values below this are messages (template = byte % templates.count); above, controls.
    static let controlBase: UInt8 = 200

    // MARK: - The program

    func runProgram() {
        while !r.isAtEnd && steps < 2_000 {
            steps += 1
            let op = r.byte()
            let slot = r.below(slotCount)
            if op < Self.controlBase {
                let template = Self.templates[Int(op) % Self.templates.count]
                guard let peer = livePeer(slot) else { connect(slot); continue }
                let message = template.build(self, peer)
                send(peer, message, label: template.name)
            } else {
                let controls = Control.allCases
                control(controls[Int(op - Self.controlBase) % controls.count], slot)
            }
        }
        // Dropped with connections open (when byte 1 says so): everything must still be freed (LeakSanitizer).
        if abandon { return }
        // The end: shutdown, every connection closed, nothing pending.
        if !shutDown { feed(.shutdown, "shutdown (end)") }
        flushCloses()
        for peer in peers.values.sorted(by: { $0.id < $1.id }) where peer.isLive {
            feed(.closed(peer.id), "closed \(peer.id) (end)")
        }
        fuzzCheck(router.pendingActionCount == 0, "\(router.pendingActionCount) actions pending after shutdown with every connection closed")
        fuzzCheck(router.isIdle && router.peerCount == 0, "\(router.peerCount) peers left after every connection closed")
        // Time may still pass (fluxd's timers): nothing settled by the shutdown may be settled again.
        now += 3_600_000
        feed(.tick, "tick to \(now) (end)")
        fuzzCheck(router.pendingActionCount == 0, "\(router.pendingActionCount) actions pending after shutdown, every connection closed and a tick")
    }

    func livePeer(_ slot: Int) -> PeerModel? {
        guard let p = slots[slot], p.isLive else { return nil }
        return p
    }

    func connect(_ slot: Int) {
        if livePeer(slot) != nil { return }
        let id = nextPeerID
        nextPeerID += 1
        let peer = PeerModel(id: id, slot: slot)
        slots[slot] = peer
        peers[id] = peer
        let creds = r.bool() ? PeerCredentials(pid: Int32(100 + slot), uid: 1000, gid: 1000) : PeerCredentials()
        feed(.connected(id, creds), "connect \(id)")
    }

    func control(_ c: Control, _ slot: Int) {
        switch c {
        case .connect: connect(slot)
        case .closed:
            if let peer = livePeer(slot) { feed(.closed(peer.id), "closed \(peer.id)") }
        case .flushCloses: flushCloses()
        case .tick:
            now += r.pick([0, 1, 50, 99, 100, 101, 4_999, 5_000, 5_001])
            feed(.tick, "tick to \(now)")
            if router.hasDeadlines == false {
                fuzzCheck(router.nextDeadline == nil, "no deadlines, but nextDeadline \(String(describing: router.nextDeadline))")
            }
        case .drain: feed(.drain, "drain")
        case .shutdown:
            // Rare: only when the next byte says so (a shutdown ends most of what a program can do).
            if r.below(4) == 0 { shutdownNow() }
        case .emptyFrame:
            if let peer = livePeer(slot) { feed(.emptyFrame(peer.id), "empty frame from \(peer.id)") }
        case .oversized:
            if let peer = livePeer(slot) { feed(.oversizedFrame(peer.id, length: router.config.maxFrame + 1), "oversized from \(peer.id)") }
        case .backlogged:
            if let peer = livePeer(slot) { feed(.backlogged(peer.id), "backlogged \(peer.id)") }
        case .rawBytes:
            if let peer = livePeer(slot) { send(peer, Outgoing(bytes: r.bytes(max: 64)), label: "raw") }
        }
    }

    func flushCloses() {
        let closes = pendingCloses
        pendingCloses = []
        for id in closes where peers[id]?.isLive == true { feed(.closed(id), "closed \(id) (after close effect)") }
    }

    func shutdownNow() {
        let before = peers.values.filter { $0.isLive && !$0.closeEffect }
        feed(.shutdown, "shutdown")
        shutDown = true
        // Every dispatch with settle of a connection that was open must have been settled before the bye.
        for peer in before where !peer.awaiting.isEmpty {
            fuzzFail("shutdown: peer \(peer.id) never got a settlement for \(peer.awaiting.sorted())")
        }
    }

    func send(_ peer: PeerModel, _ message: Outgoing, label: String) {
        if case .dispatch(let id, let settle) = message.expect, settle, !peer.closeEffect { peer.awaiting.insert(id) }
        if case .hello(let role) = message.expect { peer.pendingRole = role }
        let wasClosing = peer.closeEffect
        feed(.frame(peer.id, message.body), "\(label) from \(peer.id): \(String(decoding: message.body, as: UTF8.self))")
        if wasClosing { return }  // ignored by the router (and nothing was sent to it: checked in observe)
        afterEvent(peer, message.expect)
    }

    // MARK: - Feeding events and checking effects

    func feed(_ event: RouterEvent, _ description: String) {
        eventDescription = description
        eventErrors.removeAll(keepingCapacity: true)
        let effects: [RouterEffect]
        if useSink {
            sink.effects.removeAll(keepingCapacity: true)
            router.handle(event, now: now, sink: sink)
            effects = sink.effects
        } else {
            effects = router.handle(event, now: now)
        }
        if Self.trace {
            print("@\(now) \(description)")
            for effect in effects {
                switch effect {
                case .send(let id, let frame): print("    -> \(id) \(frame.text)")
                case .monitor(let id, let frame): print("    -> \(id) (monitor) \(frame.text)")
                case .close(let id): print("    close \(id)")
                case .host(let id, let env): print("    host \(id) \(String(decoding: env.body, as: UTF8.self))")
                case .log: break
                }
            }
        }
        if case .closed(let id) = event, let peer = peers[id] {
            // The router forgets the connection: its stores are down, it has no deliveries any more.
            peer.closedEvent = true
            peer.owned.removeAll()
            peer.deliveries.removeAll()
        }
        var fatalPending: Set<PeerID> = []
        for effect in effects {
            switch effect {
            case .send(let id, let frame):
                observe(id, frame, monitor: false, &fatalPending)
            case .monitor(let id, let frame):
                observe(id, frame, monitor: true, &fatalPending)
            case .close(let id):
                guard let peer = peers[id] else { fuzzFail("close of unknown peer \(id) (\(eventDescription))") }
                fuzzCheck(!peer.closedEvent, "close of peer \(id) after its closed event (\(eventDescription))")
                fuzzCheck(!peer.closeEffect, "second close of peer \(id) (\(eventDescription))")
                peer.closeEffect = true
                pendingCloses.append(id)
                fatalPending.remove(id)
            case .host(let id, let env):
                guard let peer = peers[id] else { fuzzFail("host effect for unknown peer \(id)") }
                fuzzCheck(peer.role != nil && !peer.closeEffect && !peer.closedEvent, "host effect for peer \(id) that may not send it (\(eventDescription))")
                fuzzCheck(env.string(.op).value == "workers", "host effect for op \(String(describing: env.string(.op).value))")
            case .log:
                break
            }
        }
        fuzzCheck(fatalPending.isEmpty, "fatal error to \(fatalPending.sorted()) without a close (\(eventDescription))")
        fuzzCheck(router.pendingActionCount >= 0, "pendingActionCount \(router.pendingActionCount) (\(eventDescription))")
    }

    /// Checks one frame sent to a peer and updates the model from it.
    func observe(_ id: PeerID, _ frame: Frame, monitor: Bool, _ fatalPending: inout Set<PeerID>) {
        guard let peer = peers[id] else { fuzzFail("frame to unknown peer \(id): \(frame.text) (\(eventDescription))") }
        fuzzCheck(!peer.closedEvent, "frame to peer \(id) after its closed event: \(frame.text) (\(eventDescription))")
        fuzzCheck(!peer.closeEffect, "frame to peer \(id) after its close effect: \(frame.text) (\(eventDescription))")
        let wire = frame.wireBytes
        fuzzCheck(wire.count >= 4, "frame shorter than its length prefix")
        let length = Int(wire[0]) << 24 | Int(wire[1]) << 16 | Int(wire[2]) << 8 | Int(wire[3])
        fuzzCheck(length == wire.count - 4 && length > 0, "length prefix \(length) for a body of \(wire.count - 4) bytes")
        let env: Envelope
        do { env = try Envelope(body: Array(wire[4...])) } catch {
            fuzzFail("frame to peer \(id) is not a valid message (\(error.message)): \(frame.text) (\(eventDescription))")
        }
        guard case .value(let op) = env.string(.op) else { fuzzFail("frame without a string op: \(frame.text)") }
        if monitor {
            fuzzCheck(op == "event", "monitor effect with op \(op)")
            fuzzCheck(peer.role == "monitor", "monitor event to peer \(id) with role \(peer.role ?? "none") (\(eventDescription))")
            return
        }
        if peer.role == nil {
            fuzzCheck(op == "welcome" || op == "error" || op == "bye", "\(op) to peer \(id) before its handshake: \(frame.text) (\(eventDescription))")
        }
        let store = env.string(.store).value
        switch op {
        case "welcome":
            fuzzCheck(peer.role == nil, "second welcome to peer \(id)")
            guard let role = peer.pendingRole else { fuzzFail("welcome to peer \(id) that sent no hello") }
            peer.role = role
        case "error":
            guard case .value(let code) = env.string("code"), case .value(let fatal) = env.bool("fatal") else {
                fuzzFail("error without a string code and boolean fatal: \(frame.text)")
            }
            let ref = env.string("ref").value
            eventErrors[id, default: []].append((code, ref, fatal))
            if let ref, peer.awaiting.remove(ref) != nil {
                fuzzCheck(eventDescription.contains("\"id\":\"\(ref)\""), "error with ref \(ref) outside the event of that dispatch (\(eventDescription))")
            }
            if fatal { fatalPending.insert(id) }
        case "action":
            guard let store, case .value(let seq) = env.int(.seq) else { fuzzFail("action without store and seq: \(frame.text)") }
            let redelivered = env.bool("redelivered").value ?? false
            fuzzCheck(peer.owned.contains(store), "action for store \(store) to peer \(id), which does not own it (\(eventDescription))")
            var d = peer.deliveries[store] ?? Deliveries()
            fuzzCheck(seq > d.last, "R1: action seq \(seq) for \(store) to peer \(id) after seq \(d.last) in the same registration (\(eventDescription))")
            fuzzCheck(!answered[store, default: []].contains(seq), "R2: action seq \(seq) for \(store) delivered again after its answer was accepted (\(eventDescription))")
            if redelivered {
                fuzzCheck(!d.sawFresh, "redelivered seq \(seq) for \(store) after a first delivery in the same registration (\(eventDescription))")
            } else {
                fuzzCheck(!delivered[store, default: []].contains(seq), "R1: seq \(seq) for \(store) delivered a second time without redelivered (\(eventDescription))")
                d.sawFresh = true
            }
            delivered[store, default: []].insert(seq)
            d.last = seq
            d.outstanding.append(seq)
            peer.deliveries[store] = d
        case "registered":
            guard let store else { fuzzFail("registered without store") }
            fuzzCheck(!peer.owned.contains(store), "registered \(store) to peer \(id), which owns it already")
            peer.owned.insert(store)
            peer.deliveries[store] = Deliveries()
            checkVersion(peer, store, env, op)
        case "snapshot", "store-up", "got":
            guard let store else { fuzzFail("\(op) without store: \(frame.text)") }
            checkVersion(peer, store, env, op)
        case "settled":
            guard case .value(let sid) = env.string(.id) else { fuzzFail("settled without a string id: \(frame.text)") }
            fuzzCheck(peer.awaiting.remove(sid) != nil, "settled \(sid) to peer \(id), which is not waiting for it (settled twice, or never asked) (\(eventDescription))")
            checkResults(peer, env, frame)
        case "subscribed":
            guard let store else { fuzzFail("subscribed without store") }
            peer.subscriptions.insert(store)
            checkVersion(peer, store, env, op)
        case "unsubscribed":
            guard let store else { fuzzFail("unsubscribed without store") }
            peer.subscriptions.remove(store)
        case "queries":
            guard let store else { fuzzFail("queries without store") }
            fuzzCheck(peer.owned.contains(store), "queries for \(store) to peer \(id), which does not own it")
        default:
            break
        }
    }

    /// A settlement's results: one per target store, sorted by name, each with a status; R5 (read your writes):
    /// a `done` result's version is already in the dispatcher's subscription to that store.
    func checkResults(_ peer: PeerModel, _ env: Envelope, _ frame: Frame) {
        guard let raw = env.raw("results"),
              let results = try? JSONSerialization.jsonObject(with: Data(raw)) as? [[String: Any]], !results.isEmpty
        else { fuzzFail("settled without a non-empty array of results: \(frame.text)") }
        var previous = ""
        for result in results {
            guard let store = result["store"] as? String, let status = result["status"] as? String else {
                fuzzFail("a result without store and status: \(frame.text)")
            }
            fuzzCheck(store > previous, "results not sorted by store, or a store twice: \(frame.text)")
            previous = store
            switch status {
            case "done":
                guard let version = result["version"] as? Int else { fuzzFail("done without a version: \(frame.text)") }
                if peer.subscriptions.contains(store) {
                    let seen = peer.versions[store] ?? 0
                    fuzzCheck(seen >= Int64(version), "R5: settled with \(store) version \(version), but the subscriber has seen version \(seen) (\(eventDescription))")
                }
            case "rejected", "unavailable":
                fuzzCheck(result["error"] is [String: Any], "\(status) without an error object: \(frame.text)")
            default:
                fuzzFail("result status \(status): \(frame.text)")
            }
        }
    }

    /// Snapshot versions a connection sees for one store never go down (R4).
    func checkVersion(_ peer: PeerModel, _ store: String, _ env: Envelope, _ op: String) {
        guard case .value(let v) = env.int("version") else { fuzzFail("\(op) without an integer version") }
        let before = peer.versions[store] ?? 0
        fuzzCheck(v >= before, "R4: \(op) version \(v) of \(store) to peer \(peer.id) after version \(before) (\(eventDescription))")
        peer.versions[store] = v
    }

    /// Checks what can be predicted about the router's answer to one message.
    func afterEvent(_ peer: PeerModel, _ expect: Expectation) {
        let errors = eventErrors[peer.id] ?? []
        switch expect {
        case .nothing, .hello, .dispatch:
            break
        case .answer(let store, let seq):
            guard peer.role == "store", !peer.closeEffect else { return }
            var d = peer.deliveries[store] ?? Deliveries()
            let oldest = d.outstanding.first
            if oldest == seq {
                fuzzCheck(errors.isEmpty, "R2: answer for the oldest unanswered seq \(seq) of \(store) refused: \(errors) (\(eventDescription))")
                d.outstanding.removeFirst()
                answered[store, default: []].insert(seq)
                peer.deliveries[store] = d
            } else {
                fuzzCheck(!errors.isEmpty, "R2: answer for seq \(seq) of \(store) accepted, but the oldest unanswered is \(String(describing: oldest)) (\(eventDescription))")
            }
        case .unregister(let store):
            guard peer.role == "store", !peer.closeEffect else { return }
            fuzzCheck(errors.isEmpty, "unregister of owned store \(store) refused: \(errors) (\(eventDescription))")
            peer.owned.remove(store)
            peer.deliveries[store] = nil
        }
    }
}
