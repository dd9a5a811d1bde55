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
    /// Stores it is subscribed to as a whole (`subscribed` without `path` arrived, `unsubscribed` not since).
    var subscriptions: Set<String> = []
    /// Its credentials (uid `UInt32.max` when the kernel did not say: the router's "unknown user").
    var uid: UInt32 = UInt32.max
    var pid: Int32?
    var connectedAt: Millis = 0
    /// When the router last heard a frame from it (`.frame` fed while it was not closing).
    var lastHeard: Millis = 0
    /// Heartbeats: asked for in the last hello (nil: not said; a non-boolean is refused), and on once `welcome`
    /// arrived (with a `pingInterval`); D->C pings sent since it last sent a frame, and their ids.
    var pendingHeartbeat: Bool?
    var heartbeat = false
    var pingsOut = 0
    var pingIDs: [String] = []
    /// Live queries (`query-ok` arrived, no `unquery-ok` nor close since), by id: store and the query's bytes.
    var queries: [String: (store: String, bytes: [UInt8])] = [:]
    var queryBytes: Int { queries.values.reduce(0) { $0 + $1.bytes.count } }
    /// The query just sent (live once its `query-ok` arrives).
    var pendingQuery: (id: String, store: String, bytes: [UInt8])?
    /// The register just sent (its body: `registered` takes `queryDeltas` from it).
    var pendingRegister: [UInt8]?
    /// Owned stores registered with `queryDeltas: true`, and per owned store the query set it knows (the last
    /// `queries`, with every `queries-changed` since applied).
    var deltaStores: Set<String> = []
    var queryViews: [String: [[UInt8]: Int]] = [:]
    /// Per owned store: when it last made progress (an answer accepted, or an action delivered with none
    /// unanswered), and whether it is reported stalled.
    var progressAt: [String: Millis] = [:]
    var stalled: Set<String> = []
    /// The connection counts towards the router's handshakes (connected, not refused, no hello seen, no timeout).
    var inHandshake = false
    /// SPEC §16 (RouterDeltas.swift), as the router's effects say: whole-store subscriptions that are delta ones and
    /// the version each was last sent; path subscriptions.
    var deltaSubs: Set<String> = []
    var deltaSent: [String: Int64] = [:]
    var pathSubs: Set<PathKey> = []
    /// The transport: while its writes are held, frames queue (and coalesce) here; what the client received.
    var writesStalled = false
    var outbox: [QueuedFrame] = []
    var replaceable: [UInt32: Int] = [:]
    var view = ClientView()

    init(id: PeerID, slot: Int) {
        self.id = id
        self.slot = slot
    }

    /// Forgets what the router forgets when it stops owning `store`.
    func disown(_ store: String) {
        owned.remove(store)
        deliveries[store] = nil
        deltaStores.remove(store)
        queryViews[store] = nil
        progressAt[store] = nil
        stalled.remove(store)
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

    var isPathSubscribe: Bool {
        guard let env = try? Envelope(body: body) else { return false }
        return env.string(.op).value == "subscribe" && env.string("path").value != nil
    }
}

/// LeakSanitizer's interface (the ASan runtime every fuzz target links): allocations between the two calls are
/// not leaks, and what they reference is reachable.
@_silgen_name("__lsan_disable") func __lsan_disable()
@_silgen_name("__lsan_enable") func __lsan_enable()

/// What the harness can predict about the router's answer to a message (checked in `afterEvent`).
enum Expectation {
    case nothing
    /// A hello asking for `role` (welcome then sets the peer's role).
    case hello(role: String)
    /// A dispatch with a fresh id: refused with an `error` whose `ref` is the id in this event, or accepted (and,
    /// with settle, settled exactly once later).
    case dispatch(id: String, settle: Bool)
    /// A well-formed `done`/`reject` naming `store`, which the peer owns, and `seq`: accepted (no error) exactly
    /// when `seq` is the oldest unanswered action delivered to it for that store (or refused with
    /// `memory-budget`, fatal, when its new `state` does not fit). `state`: a done's new state (retained).
    /// `patch` (SPEC §16.2): the done's patch (with or without `state`): its outcome is predicted on the model.
    case answer(store: String, seq: Int64, state: [UInt8]?, patch: PatchInfo? = nil)
    /// An unregister of a store the peer owns: no error, and the store is no longer the peer's.
    case unregister(store: String)
    /// A register of `store`; `limited`: the message is well-formed and `limit-exceeded` is expected exactly when
    /// this is true (nil: not predicted). `state`: its initial state (retained if the store is not resumed).
    case register(store: String, state: [UInt8]?, limited: Bool?)
    /// A well-formed subscribe: `limit-exceeded` exactly when `limited`.
    case subscribe(store: String, limited: Bool)
    /// A well-formed query with an id that is not live: `limit-exceeded` exactly when `limited`.
    case query(limited: Bool)
    /// A `state` for a store the peer owns (retained unless refused).
    case state(store: String, state: [UInt8])
    /// SPEC §16.2: a `patch` for a store the peer owns (outcome predicted on the model).
    case patch(store: String, patch: PatchInfo)
    /// A malformed message: refused with `code` (not fatal) from a peer with one of `roles` (nil: any role).
    case refused(code: String, roles: Set<String>?)
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
    /// Peers the input says are behind (SPEC §16.3: delta subscribers are sent snapshots then).
    var behind: Set<PeerID> = []
    func isBehind(_ peer: PeerID) -> Bool { behind.contains(peer) }
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
    var currentEvent = RouterEvent.tick

    static let storeWindows = [1, 2, 3, 64]
    static let queueLimits = [1, 2, 1024, 0]  // 0: every dispatch to a live store is refused (overloaded)
    static let timeouts: [Millis] = [1, 100, 5_000]
    static let maxPendings = [1, 3, 65_536]
    // Since 0.2.0 (bytes 2-5): index 0 is fluxd's default (or off), the others small enough to be reached.
    static let pingIntervals: [Millis] = [0, 10, 100, 1_000]
    static let storeTimeouts: [Millis] = [0, 10, 100, 2_000]
    /// (total, perUser, connectionAllowance).
    static let budgets: [(Int, Int, Int)] = [
        (1 << 30, 256 << 20, 64 << 10), (4_000, 2_500, 300), (2_000, 2_000, 0), (1_500, 800, 200),
        (10_000, 3_000, 1_000), (600, 600, 250), (3_000, 1_200, 500), (1_000_000, 1_000_000, 64 << 10),
    ]
    static let maxQueriesTable = [4_096, 1, 2, 3]
    static let maxQueryBytesTable = [1 << 20, 4, 16, 64]
    static let maxSubscriptionsTable = [4_096, 1, 2, 3]
    static let maxWaitForTable = [64, 0, 1, 2]
    static let maxStoresTable = [1_024, 1, 2, 3]
    static let maxConnectionsTable = [8_192, 2, 3, 4]
    static let maxConnectionsPerUserTable = [4_096, 1, 2, 3]
    static let handshakeLimits = [(1_024, 256), (1, 1), (2, 1), (3, 2)]
    static let maxPingsOutTable = [2, 0, 1, 3]
    static let fairPendings = [8, 0, 1, 2]

    /// The whole `queries` sets are deferred (`.deferred`); `.endOfBatch` is fed only at an `endOfBatch` step or
    /// before any other control step (when false: after every message step that leaves deferred work).
    let batching: Bool
    /// A `.deferred` effect came since the last `.endOfBatch`: `hasDeferredWork` must say the same.
    var deferredSeen = false
    /// Per store: its registration and retained snapshot as the router charges them (cost, uid), from the
    /// registrations and publications the harness saw accepted: after every connection closed, the memory budget
    /// holds exactly these.
    var registrationCharges: [String: (cost: Int, uid: UInt32)] = [:]
    /// In the current event: stores whose owners got `registered`, with `resumed`; owners told `.stalled`.
    var eventRegistered: [(peer: PeerID, store: String, resumed: Bool)] = []
    var eventStalledOwners: Set<PeerID> = []
    var eventStalled: Set<String> = []
    var eventPinged: Set<PeerID> = []
    /// SPEC §16 (RouterDeltas.swift): each store's state by version as the harness predicts it; the frames and the
    /// new versions of the current event; the `from` of the subscribe being sent.
    var models: [String: StoreModel] = [:]
    var eventFrames: [EventFrame] = []
    var eventVersions: [(store: String, version: Int64, withPatch: Bool)] = []
    var subscribeFrom: Int64?
    /// Inside `send`: the event's frames are checked and received after its expectation.
    var inSend = false

    init(_ reader: ByteReader) {
        r = reader
        let b0 = r.byte()
        let b1 = r.byte()
        let b2 = Int(r.byte()), b3 = Int(r.byte()), b4 = Int(r.byte()), b5 = Int(r.byte())
        var config = RouterConfig()
        config.pingInterval = Self.pingIntervals[b2 & 3]
        config.storeTimeout = Self.storeTimeouts[(b2 >> 2) & 3]
        config.closeStalledStores = b2 & 0x10 != 0
        let budget = Self.budgets[(b2 >> 5) & 7]
        config.memory.total = budget.0
        config.memory.perUser = budget.1
        config.memory.connectionAllowance = budget.2
        config.maxQueries = Self.maxQueriesTable[b3 & 3]
        config.maxQueryBytes = Self.maxQueryBytesTable[(b3 >> 2) & 3]
        config.maxSubscriptions = Self.maxSubscriptionsTable[(b3 >> 4) & 3]
        config.maxWaitFor = Self.maxWaitForTable[(b3 >> 6) & 3]
        config.maxStoresPerConnection = Self.maxStoresTable[b4 & 3]
        config.maxConnections = Self.maxConnectionsTable[(b4 >> 2) & 3]
        config.maxConnectionsPerUser = Self.maxConnectionsPerUserTable[(b4 >> 4) & 3]
        (config.maxHandshakes, config.maxHandshakesPerUser) = Self.handshakeLimits[(b4 >> 6) & 3]
        config.maxPingsOut = Self.maxPingsOutTable[b5 & 3]
        config.fairPending = Self.fairPendings[(b5 >> 2) & 3]
        batching = b5 & 0x10 != 0
        config.storeWindow = Self.storeWindows[Int(b0 & 3)]
        config.queueLimit = Self.queueLimits[Int(b0 >> 2) & 3]
        config.queueTimeout = Self.timeouts[Int(b0 >> 4) % 3]
        config.handshakeTimeout = Self.timeouts[Int(b1 & 3) % 3]
        config.maxPending = Self.maxPendings[Int(b1 >> 2) % 3]
        config.maxFrame = 4096
        config.hostOps = [.workers]
        // Large patches and parses are prepared off the loop (`.prepare`, run by the harness at once, as
        // DaemonCore does without threads): with a low threshold most of them are, and must do exactly what inline
        // work does.
        config.preparationBytes = Self.preparationBytesTable[(b5 >> 5) & 3]
        useSink = b0 & 0x80 != 0
        abandon = b1 & 0xF0 == 0xF0
        router = Router(config: config)
        slots = Array(repeating: nil, count: slotCount)
    }

    // MARK: - Names the templates draw from

    static let preparationBytesTable = [32 * 1024, 0, 48, 200]
    /// The bytes of the event that started each preparation (the work of its `.prepared` event is bounded by them).
    var preparationInput: [UInt64: Int] = [:]
    /// `.prepare` effects of the event being fed, run once it is checked.
    var preparations: [(PeerID, Preparation)] = []

    static let stores = ["todos", "stats", "a", "b.c"]
    static let badStores = ["", "bad name", "x*", "é"]
    static let types = ["todo/add", "todo/del", "stats/reset", "a", "zzz"]
    static let patterns = ["todo/*", "todo/add", "stats/*", "*", "a"]
    static let states = [#"{}"#, #"{"n":1}"#, #"{"n":2}"#, #"[1,2]"#, #""s""#, "0", #"{"t":"\u00e9\n"}"#]
    static let queries = [#"{"site":1}"#, #"{"site":2}"#, "[]", #""x""#, "null", #"{"site":1 }"#,
                          #"{"pad":"\#(String(repeating: "p", count: 40))"}"#]
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
    /// checked about the answer. (New templates go at the end: a template's index is its first byte in the seeds.)
    static let templates: [MessageTemplate] = baseTemplates + templates16
    static let baseTemplates: [MessageTemplate] = [
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
            switch h.r.below(4) {  // since 0.2.0
            case 0: peer.pendingHeartbeat = nil
            case 1: fields.append(#""heartbeat":true"#); peer.pendingHeartbeat = true
            case 2: fields.append(#""heartbeat":false"#); peer.pendingHeartbeat = false
            default: fields.append(#""heartbeat":"yes""#); peer.pendingHeartbeat = nil
            }
            return Outgoing("{" + fields.joined(separator: ",") + "}", .hello(role: role))
        },
        MessageTemplate(name: "register") { h, peer in
            let name = h.anyStore()
            var wellFormed = stores.contains(name)
            var fields = [#""op":"register""#, #""store":\#(h.quoted(name))"#]
            switch h.r.below(6) {
            case 0: wellFormed = false  // handles is required (SPEC §8.2)
            case 1: fields.append(#""handles":["todo/*","a",1]"#); wellFormed = false
            default: fields.append(#""handles":\#(h.stringArray(patterns))"#)
            }
            var waitFor: [String] = []
            switch h.r.below(4) {
            case 0, 1: break
            case 2:
                let mask = h.r.byte()
                waitFor = stores.indices.filter { mask & (1 << UInt8($0)) != 0 }.map { stores[$0] }
                fields.append(#""waitFor":[\#(waitFor.map { h.quoted($0) }.joined(separator: ","))]"#)
            default:
                waitFor = [h.store()]
                fields.append(#""waitFor":[\#(h.quoted(waitFor[0]))]"#)
            }
            // (waiting for itself is a cycle, SPEC §8.2: refused after the well-formedness checks)
            switch h.r.below(4) {  // since 0.2.0
            case 0, 1: break
            case 2: fields.append(#""queryDeltas":true"#)
            default:
                if h.r.bool() { fields.append(#""queryDeltas":false"#) } else { fields.append(#""queryDeltas":1"#); wellFormed = false }
            }
            var state: [UInt8]? = nil
            switch h.r.below(4) {
            case 0, 1: break
            case 2:
                state = Array("null".utf8)  // null is a state like any other (SPEC §3.3)
                fields.append(#""state":null"#)
            default:
                let text = h.r.pick(states)
                state = Array(text.utf8)
                fields.append(#""state":\#(text)"#)
            }
            // Past the well-formedness checks come the limits: maxWaitFor, then maxStoresPerConnection.
            let c = h.router.config
            let limited = waitFor.count > c.maxWaitFor || (!peer.owned.contains(name) && peer.owned.count >= c.maxStoresPerConnection)
            let body = "{" + fields.joined(separator: ",") + "}"
            peer.pendingRegister = Array(body.utf8)
            return Outgoing(body, .register(store: name, state: state, limited: wellFormed ? limited : nil))
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
            case 3: fields.append(#""state":null"#)  // null is a state like any other (SPEC §3.3)
            default: fields.append(#""state":\#(h.r.pick(states))"#)
            }
            if h.r.below(16) == 0 { fields.remove(at: 2); wellFormed = false }
            let state = fields.count > 3 && wellFormed ? Array(fields[3].utf8.dropFirst(#""state":"#.utf8.count)) : nil
            let expect: Expectation = wellFormed && peer.owned.contains(name) ? .answer(store: name, seq: seq, state: state) : .nothing
            return Outgoing("{" + fields.joined(separator: ",") + "}", expect)
        },
        MessageTemplate(name: "reject") { h, peer in
            let name = h.answerStore(peer)
            let seq = h.answerSeq(peer, name)
            let errors = [#"{"code":"x/y","message":"no"}"#, #"{"code":"x/y"}"#, #"{"message":"no code"}"#, "null", #""e""#,
                          #"{"code":"x/y","message":5}"#, #"{"code":""}"#]
            let e = h.r.below(errors.count)
            let wellFormed = e < 2
            let expect: Expectation = wellFormed && peer.owned.contains(name) ? .answer(store: name, seq: seq, state: nil) : .nothing
            return Outgoing(#"{"op":"reject","store":\#(h.quoted(name)),"seq":\#(seq),"error":\#(errors[e])}"#, expect)
        },
        MessageTemplate(name: "state") { h, peer in
            let name = h.answerStore(peer)
            let state = h.r.below(8) == 0 ? "null" : h.r.pick(states)  // null is a state like any other (SPEC §3.3)
            let expect: Expectation = peer.owned.contains(name) ? .state(store: name, state: Array(state.utf8)) : .nothing
            return Outgoing(#"{"op":"state","store":\#(h.quoted(name)),"state":\#(state)}"#, expect)
        },
        MessageTemplate(name: "subscribe") { h, peer in
            let name = h.anyStore()
            let limited = !peer.subscriptions.contains(name) && peer.subscriptions.count + peer.pathSubs.count >= h.router.config.maxSubscriptions
            let expect: Expectation = stores.contains(name) ? .subscribe(store: name, limited: limited) : .nothing
            return Outgoing(#"{"op":"subscribe","store":\#(h.quoted(name))}"#, expect)
        },
        MessageTemplate(name: "unsubscribe") { h, _ in Outgoing(#"{"op":"unsubscribe","store":\#(h.quoted(h.anyStore()))}"#) },
        MessageTemplate(name: "query") { h, peer in
            let id: String
            if !peer.queryIDs.isEmpty && h.r.below(4) == 0 { id = h.r.pick(peer.queryIDs) } else {
                id = peer.freshID("q")
                peer.queryIDs.append(id)
                if peer.queryIDs.count > 8 { peer.queryIDs.removeFirst() }
            }
            let text: String? = h.r.below(8) == 0 ? nil : h.r.pick(queries)
            let name = h.anyStore()
            let q = text.map { #","query":\#($0)"# } ?? ""
            var expect = Expectation.nothing
            peer.pendingQuery = nil
            if let text, peer.queries[id] == nil, stores.contains(name) {
                let bytes = Array(text.utf8)
                peer.pendingQuery = (id, name, bytes)
                let c = h.router.config
                expect = .query(limited: peer.queries.count >= c.maxQueries || peer.queryBytes + bytes.count > c.maxQueryBytes)
            }
            return Outgoing(#"{"op":"query","id":"\#(id)","store":\#(h.quoted(name))\#(q)}"#, expect)
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
        // Since 0.2.0: the answer to fluxd's heartbeat ping (the last one's id, none, or one never sent).
        MessageTemplate(name: "pong") { h, peer in
            switch h.r.below(4) {
            case 0: return Outgoing(#"{"op":"pong"}"#)
            case 1: return Outgoing(#"{"op":"pong","id":"hb-0"}"#)
            default: return Outgoing(#"{"op":"pong","id":"\#(peer.pingIDs.last ?? "hb-1")"}"#)
            }
        },
    ]

    /// Control steps (not messages): connections, the transport's own events, time, drain and shutdown.
    enum Control: CaseIterable {
        case connect, closed, flushCloses, tick, drain, shutdown, emptyFrame, oversized, backlogged, rawBytes
        // since 0.2.0: `.endOfBatch` at any point; the transport's bytes (`accountTransport`, `.overBudget` when
        // refused); `.overBudget` as such; time passing by multiples of the liveness sweep's interval.
        case endOfBatch, transport, overBudget, sweepTick
        // since 0.4.0: the connection's writes held back or resumed, and whether it is behind (SPEC §16.3).
        case writes
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
                guard let peer = livePeer(slot) else { connect(slot); endBatch(); continue }
                subscribeFrom = nil
                let message = template.build(self, peer)
                send(peer, message, label: template.name)
                if !batching { endBatch() }
            } else {
                // A control step is another turn of fluxd's loop: the batch of reads before it has ended.
                endBatch()
                let controls = Control.allCases
                control(controls[Int(op - Self.controlBase) % controls.count], slot)
                endBatch()
            }
        }
        // Dropped with connections open (when byte 1 says so): everything must still be freed (LeakSanitizer).
        if abandon { return }
        // The end: each store's state read back (and every held frame received), shutdown, every connection
        // closed, nothing pending.
        endBatch()
        checkRestart()
        if !shutDown { finalGets() }
        endBatch()
        if !shutDown { feed(.shutdown, "shutdown (end)") }
        flushCloses()
        for peer in peers.values.sorted(by: { $0.id < $1.id }) where peer.isLive {
            feed(.closed(peer.id), "closed \(peer.id) (end)")
        }
        endBatch()
        fuzzCheck(router.pendingActionCount == 0, "\(router.pendingActionCount) actions pending after shutdown with every connection closed")
        fuzzCheck(router.isIdle && router.peerCount == 0, "\(router.peerCount) peers left after every connection closed")
        // Time may still pass (fluxd's timers): nothing settled by the shutdown may be settled again.
        now += 3_600_000
        feed(.tick, "tick to \(now) (end)")
        fuzzCheck(router.pendingActionCount == 0, "\(router.pendingActionCount) actions pending after shutdown, every connection closed and a tick")
        checkFinalMemory()
    }

    /// Feeds `.endOfBatch` if the router deferred work (fluxd does before writing what a batch of reads made).
    func endBatch() {
        if router.hasDeferredWork { feed(.endOfBatch, "end of batch") }
    }

    /// After every connection closed, the budget holds exactly what outlives connections: each registered name
    /// (charged to the last connection that registered it) and each retained snapshot (charged to the connection
    /// that published it), by user. Everything else (allowances, transport bytes, queries, subscriptions,
    /// unsettled actions) has been returned. With no store ever registered this is `used == 0`.
    func checkFinalMemory() {
        var byUser: [UInt32: Int] = [:]
        for (_, c) in registrationCharges { byUser[c.uid, default: 0] += c.cost }
        for (name, m) in models where m.version > 0 {
            // A retained state is charged as its bytes, or, once kept as a tree (patched, or parsed for path
            // subscribers, SPEC §16.5), as eight times the size it renders to: exactly one of the two.
            guard let charge = router.retainedCharge(of: name), let current = m.current else { continue }
            let base = 96 + quoted(name).utf8.count
            let asBytes = base + current.bytes.count, asTree = base + Self.treeOverhead * current.value.compactBytes.count
            fuzzCheck(charge.bytes == asTree || (!m.isTree && charge.bytes == asBytes),
                      "memory: \(name)'s retained state is charged \(charge.bytes) bytes, neither \(asBytes) (bytes) nor \(asTree) (tree)")
            m.cost = charge.bytes
            m.uid = charge.uid  // (moved to its owner's account when fluxd kept the tree for a path subscriber)
        }
        for (_, m) in models where m.version > 0 { byUser[m.uid, default: 0] += m.cost }
        // The patches kept for resuming (SPEC §16.5): charged to the retained state's user, their bytes plus a
        // fixed overhead each, within deltaHistory.
        for (name, m) in models {
            guard let h = router.historyCharge(of: name) else { continue }
            fuzzCheck(h.uid == m.uid, "memory: \(name)'s kept patches are charged to uid \(h.uid), its state to \(m.uid)")
            fuzzCheck(h.patchBytes <= router.config.deltaHistory && h.bytes == h.patchBytes + 64 * h.patches,
                      "memory: \(name)'s kept patches: \(h.patches) of \(h.patchBytes) bytes charged as \(h.bytes)")
            byUser[h.uid, default: 0] += h.bytes
        }
        let total = byUser.values.reduce(0, +)
        let m = router.memory
        fuzzCheck(m.used == total, "memory: \(m.used) bytes used after every connection closed; registrations and retained snapshots hold \(total) (\(registrationCharges.mapValues { $0.cost }), \(models.mapValues { $0.cost }))")
        for (uid, bytes) in byUser where bytes != 0 {
            fuzzCheck(m.byUser[uid] == bytes, "memory: uid \(uid) holds \(m.byUser[uid] ?? 0) bytes after every connection closed, expected \(bytes)")
        }
        fuzzCheck(m.byUser.count == byUser.values.filter { $0 != 0 }.count, "memory: users \(m.byUser) after every connection closed, expected \(byUser)")
    }

    /// The memory budget's own invariants, after every event.
    func checkMemory() {
        let m = router.memory
        let limits = router.config.memory
        fuzzCheck(m.used >= 0 && m.used <= limits.total, "memory: used \(m.used) outside 0...\(limits.total) (\(eventDescription))")
        fuzzCheck(m.peak >= m.used, "memory: peak \(m.peak) below used \(m.used)")
        var sum = 0
        for (uid, bytes) in m.byUser {
            fuzzCheck(bytes > 0 && bytes <= limits.perUser, "memory: uid \(uid) holds \(bytes) bytes (perUser \(limits.perUser)) (\(eventDescription))")
            sum += bytes
        }
        fuzzCheck(sum == m.used, "memory: users hold \(sum) bytes in all, used says \(m.used) (\(eventDescription))")
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
        let c = r.byte()
        let uid: UInt32 = c & 2 == 0 ? 1000 : 1001
        let creds = c & 1 == 1 ? PeerCredentials(pid: Int32(100 + slot), uid: uid, gid: uid) : PeerCredentials()
        peer.uid = creds.uid ?? UInt32.max
        peer.pid = creds.pid
        peer.connectedAt = now
        // Refused (`too-many-connections`) exactly when a limit is reached, counted before this connection.
        let cfg = router.config
        let open = peers.values.filter { $0.isLive && $0 !== peer }
        let refused = open.count >= cfg.maxConnections
            || open.filter { $0.uid == peer.uid }.count >= cfg.maxConnectionsPerUser
            || open.filter { $0.inHandshake }.count >= cfg.maxHandshakes
            || open.filter { $0.inHandshake && $0.uid == peer.uid }.count >= cfg.maxHandshakesPerUser
            || !router.memory.fits(peer.uid, cfg.memory.connectionAllowance)
        feed(.connected(id, creds), "connect \(id)")
        let codes = (eventErrors[id] ?? []).map(\.code)
        fuzzCheck(codes == (refused ? ["too-many-connections"] : []), "connect \(id): errors \(codes), but refusal predicted: \(refused) (\(open.count) open)")
        peer.inHandshake = !refused
    }

    func control(_ c: Control, _ slot: Int) {
        switch c {
        case .connect: connect(slot)
        case .closed:
            if let peer = livePeer(slot) { feed(.closed(peer.id), "closed \(peer.id)") }
        case .flushCloses: flushCloses()
        case .tick:
            advance(to: now + r.pick([0, 1, 50, 99, 100, 101, 4_999, 5_000, 5_001]))
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
        case .endOfBatch:
            feed(.endOfBatch, "end of batch (step)")
        case .transport:
            guard let peer = livePeer(slot) else { return }
            let bytes = r.pick([0, 0, 10, 100, 300, 1_000, 5_000, 70_000, 1 << 20])
            let ok = router.accountTransport(peer.id, bytes: bytes)
            if Self.trace { print("@\(now) accountTransport(\(peer.id), bytes: \(bytes)) -> \(ok)") }
            checkMemory()
            if !ok {
                fuzzCheck(bytes > 0, "accountTransport refused 0 bytes")
                overBudget(peer)
            }
        case .overBudget:
            if let peer = livePeer(slot) { overBudget(peer) }
        case .sweepTick:
            let interval = max(router.sweepInterval, 1)
            advance(to: now + interval * Millis(1 + r.below(4)))
        case .writes:
            if let peer = livePeer(slot) { writes(peer) }
        }
    }

    /// The transport's bytes for `peer` did not fit: it is closed with `memory-budget` (unless closing already).
    func overBudget(_ peer: PeerModel) {
        let wasClosing = peer.closeEffect
        feed(.overBudget(peer.id), "over budget \(peer.id)")
        if !wasClosing {
            let codes = (eventErrors[peer.id] ?? []).map { "\($0.code)\($0.fatal ? "!" : "")" }
            fuzzCheck(codes == ["memory-budget!"] && peer.closeEffect, "overBudget of \(peer.id): errors \(codes), close \(peer.closeEffect)")
        }
    }

    /// Time passes to `to` (a tick). When the liveness sweep is due, what it must do is predicted from the model:
    /// each heartbeat peer silent for `pingInterval` × (its unanswered pings + 1) is pinged, or, with
    /// `maxPingsOut` pings unanswered, closed as `unresponsive`; each up store whose oldest delivery has waited
    /// `storeTimeout` since its last progress is reported stalled (once).
    func advance(to t: Millis) {
        now = t
        let cfg = router.config
        var mustPing: [PeerModel] = []
        var mustClose: [PeerModel] = []
        var mustStall: Set<String> = []
        var stallOwners: [String: PeerModel] = [:]
        if router.needsSweep(now: now) {
            for peer in peers.values where peer.heartbeat && peer.isLive && !peer.closeEffect {
                let silentSince = max(peer.lastHeard, peer.connectedAt)
                guard now >= silentSince + cfg.pingInterval * Millis(peer.pingsOut + 1) else { continue }
                if peer.pingsOut >= cfg.maxPingsOut { mustClose.append(peer) } else { mustPing.append(peer) }
            }
            if cfg.storeTimeout > 0 {
                for peer in peers.values where peer.isLive && !peer.closeEffect {
                    for store in peer.owned where !peer.stalled.contains(store) {
                        guard let d = peer.deliveries[store], !d.outstanding.isEmpty, let since = peer.progressAt[store] else { continue }
                        if now >= since + cfg.storeTimeout { mustStall.insert(store); stallOwners[store] = peer }
                    }
                }
            }
        }
        feed(.tick, "tick to \(now)")
        for peer in peers.values where peer.inHandshake && peer.connectedAt + cfg.handshakeTimeout <= now {
            peer.inHandshake = false
        }
        for peer in mustPing {
            fuzzCheck(eventPinged.contains(peer.id), "heartbeat: peer \(peer.id) silent since \(max(peer.lastHeard, peer.connectedAt)) with \(peer.pingsOut) pings out was not pinged at \(now)")
        }
        for peer in mustClose {
            let codes = (eventErrors[peer.id] ?? []).map(\.code)
            fuzzCheck(codes.contains("unresponsive") && peer.closeEffect, "heartbeat: peer \(peer.id) silent since \(max(peer.lastHeard, peer.connectedAt)) with \(peer.pingsOut) pings out was not closed at \(now): \(codes)")
        }
        // A store whose owner this same sweep closed (a heartbeat it left unanswered) is not reported stalled: it
        // is going down anyway (Router.sweep skips closing owners).
        mustStall = mustStall.filter { !(stallOwners[$0]?.closeEffect ?? false) }
        fuzzCheck(mustStall.isSubset(of: eventStalled), "stores \(mustStall.subtracting(eventStalled).sorted()) stalled at \(now) but not reported")
        if router.hasDeadlines == false {
            fuzzCheck(router.nextDeadline == nil, "no deadlines, but nextDeadline \(String(describing: router.nextDeadline))")
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
        if !wasClosing {
            // The router hears from it (heartbeats start over); a hello ends its handshake.
            peer.lastHeard = now
            peer.pingsOut = 0
            if peer.role == nil, let env = try? Envelope(body: message.body), env.string(.op).value == "hello" {
                peer.inHandshake = false
            }
        }
        inSend = true
        // KNOWN (docs/fuzzing.md, Findings): a connection that closes holding a path subscription is leaked (the
        // subscription and its peer reference each other). What a path subscribe allocates is a LeakSanitizer root
        // unless strict, so that only that leak is tolerated.
        let ignoreLeaks = !Self.strict(.leak) && !wasClosing && message.isPathSubscribe
        if ignoreLeaks { __lsan_disable() }
        feed(.frame(peer.id, message.body), "\(label) from \(peer.id): \(String(decoding: message.body, as: UTF8.self))")
        if ignoreLeaks { __lsan_enable() }
        inSend = false
        subscribeFrom = nil
        // (a closing peer's frame is ignored by the router, and nothing was sent to it: checked in observe)
        if !wasClosing { afterEvent(peer, message.expect) }
        deliverPending()
    }

    // MARK: - Feeding events and checking effects

    func feed(_ event: RouterEvent, _ description: String) {
        eventDescription = description
        eventErrors.removeAll(keepingCapacity: true)
        eventRegistered.removeAll(keepingCapacity: true)
        eventStalledOwners.removeAll(keepingCapacity: true)
        eventStalled.removeAll(keepingCapacity: true)
        eventPinged.removeAll(keepingCapacity: true)
        currentEvent = event
        let stepsBefore = router.patchSteps &+ router.pathSteps
        defer {
            // Work per event (issue 24): patch operations and path matching cost what the frame holds (a few node
            // visits per byte at most) plus the path subscriptions it may touch, never more.
            let steps = Int(router.patchSteps &+ router.pathSteps &- stepsBefore)
            var bytes = 0
            if case .frame(_, let body) = event { bytes = body.count }
            if case .prepared(_, let result) = event { bytes = preparationInput.removeValue(forKey: result.number) ?? 0 }
            let subscriptions = peers.values.reduce(0) { $0 + $1.pathSubs.count }
            fuzzCheck(steps <= 4 * bytes + 8 * subscriptions + 64,
                      "work: \(steps) steps for an event of \(bytes) bytes with \(subscriptions) path subscriptions (\(description))")
        }
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
                case .host(let id, let request): print("    host \(id) \(request)")
                case .storeChanged(let change): print("    store changed \(change)")
                case .stalled(let store, let pid, let closing): print("    stalled \(store) pid \(pid.map { "\($0)" } ?? "nil") closing \(closing)")
                case .deferred: print("    deferred")
                case .prepare(let id, let p): print("    prepare #\(p.number) for \(id) (\(p.inputBytes) bytes)")
                case .discard(let g): print("    discard \(g.count)")
                case .log: break
                }
            }
        }
        if case .closed(let id) = event, let peer = peers[id] {
            // The router forgets the connection: its stores are down, it has no deliveries any more.
            peer.closedEvent = true
            peer.inHandshake = false
            for store in peer.owned { peer.disown(store) }
            // Its queries end: the stores that hold them are told (deltas at once, whole sets at the batch's end).
            peer.queries.removeAll()
            // The connection is gone: what was queued for it is never received.
            peer.outbox.removeAll()
            peer.replaceable.removeAll()
            sink.behind.remove(id)
        }
        if case .endOfBatch = event { deferredSeen = false }
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
            case .host(let id, let request):
                guard let peer = peers[id] else { fuzzFail("host effect for unknown peer \(id)") }
                fuzzCheck(peer.role != nil && !peer.closeEffect && !peer.closedEvent, "host effect for peer \(id) that may not send it (\(eventDescription))")
                fuzzCheck(request.op == .workers && Names.isValidID(request.id ?? ""), "host effect for \(request) (\(eventDescription))")
            case .storeChanged:
                break
            case .stalled(let store, let pid, let closing):
                observeStalled(store, pid: pid, closing: closing)
            case .deferred:
                fuzzCheck(!deferredSeen, "a second .deferred before .endOfBatch (\(eventDescription))")
                if case .endOfBatch = event { fuzzFail(".deferred during .endOfBatch") }
                deferredSeen = true
            case .log, .discard:
                break
            case .prepare(let id, let preparation):
                guard let peer = peers[id] else { fuzzFail("prepare for unknown peer \(id)") }
                fuzzCheck(!peer.closedEvent && !peer.closeEffect, "prepare for peer \(id) that is closing (\(eventDescription))")
                var bytes = 0
                if case .frame(_, let body) = event { bytes = body.count }
                if case .prepared(_, let result) = event { bytes = preparationInput[result.number] ?? 0 }
                preparationInput[preparation.number] = bytes
                preparations.append((id, preparation))
            }
        }
        fuzzCheck(fatalPending.isEmpty, "fatal error to \(fatalPending.sorted()) without a close (\(eventDescription))")
        fuzzCheck(router.pendingActionCount >= 0, "pendingActionCount \(router.pendingActionCount) (\(eventDescription))")
        fuzzCheck(router.hasDeferredWork == deferredSeen, "hasDeferredWork \(router.hasDeferredWork), but .deferred \(deferredSeen ? "came" : "did not come") since the last .endOfBatch (\(eventDescription))")
        checkMemory()
        // The work prepared off the loop is done at once: the held frame is taken again before anything else.
        while !preparations.isEmpty {
            let (id, preparation) = preparations.removeFirst()
            feed(.prepared(id, preparation.run()), "prepared #\(preparation.number) for \(id)")
        }
        // Liveness work is scheduled while it can have any: the host ticks every `sweepInterval` while
        // `needsSweep` says so, so the next sweep must be due within one interval.
        if !inSend { deliverPending() }
        let cfg = router.config
        let live = peers.values.filter { $0.isLive && !$0.closeEffect }
        if live.contains(where: { $0.heartbeat }) || (cfg.storeTimeout > 0 && live.contains(where: { !$0.owned.isEmpty })) {
            fuzzCheck(router.sweepInterval > 0 && router.needsSweep(now: now + router.sweepInterval), "liveness sweep not scheduled within \(router.sweepInterval) ms with heartbeat peers or up stores (\(eventDescription))")
        }
    }

    /// `.stalled(store:pid:closing:)`: a store a live connection owns, with an action unanswered for `storeTimeout`
    /// since its last progress, reported once per stall; `closing` as configured (the owner then gets
    /// `unresponsive`).
    func observeStalled(_ store: String, pid: Int32?, closing: Bool) {
        guard let owner = peers.values.first(where: { $0.isLive && $0.owned.contains(store) }) else {
            fuzzFail("stalled \(store), which no connection owns (\(eventDescription))")
        }
        let cfg = router.config
        fuzzCheck(cfg.storeTimeout > 0, "stalled \(store) with storeTimeout 0")
        fuzzCheck(closing == cfg.closeStalledStores, "stalled \(store) closing \(closing), closeStalledStores \(cfg.closeStalledStores)")
        fuzzCheck(pid == owner.pid, "stalled \(store) pid \(String(describing: pid)), owner's \(String(describing: owner.pid))")
        fuzzCheck(!owner.stalled.contains(store), "stalled \(store) reported twice in one stall (\(eventDescription))")
        // KNOWN (docs/fuzzing.md, "Findings"): the sweep also reports stores whose owner is closing (the router
        // keeps "delivering" to it, frames dropped, until its `closed`): nothing more is checked for those.
        if owner.closeEffect {
            owner.stalled.insert(store)
            eventStalled.insert(store)
            return
        }
        guard let d = owner.deliveries[store], !d.outstanding.isEmpty, let since = owner.progressAt[store] else {
            fuzzFail("stalled \(store) with no action unanswered (\(eventDescription))")
        }
        fuzzCheck(now >= since + cfg.storeTimeout, "stalled \(store) at \(now), last progress at \(since) (storeTimeout \(cfg.storeTimeout))")
        owner.stalled.insert(store)
        eventStalled.insert(store)
        if closing { eventStalledOwners.insert(owner.id) }
    }

    /// The query set the harness expects `store`'s owner to know: every live query on it, by bytes, with how many
    /// hold it.
    func expectedQueries(_ store: String) -> [[UInt8]: Int] {
        var set: [[UInt8]: Int] = [:]
        for peer in peers.values where peer.isLive {
            for q in peer.queries.values where q.store == store { set[q.bytes, default: 0] += 1 }
        }
        return set
    }

    /// The `[{"query": Q, "count": N}]` array of `queries` / `queries-changed`: each query's raw bytes and count,
    /// in order (the query's bytes must be kept exactly: two spellings of one value are two queries).
    func queryCounts(_ raw: ArraySlice<UInt8>?, _ frame: Frame) -> [(bytes: [UInt8], count: Int)] {
        guard let raw, let elements = splitArray(Array(raw)) else { fuzzFail("no array of queries: \(frame.text)") }
        var out: [(bytes: [UInt8], count: Int)] = []
        for element in elements {
            guard let env = try? Envelope(body: element), let q = env.raw("query"), case .value(let n) = env.int("count") else {
                fuzzFail("a query entry without query and integer count: \(frame.text)")
            }
            if let last = out.last {
                fuzzCheck(bytesBefore(last.bytes, Array(q)), "queries not sorted by bytes, or a query twice: \(frame.text)")
            }
            out.append((Array(q), Int(n)))
        }
        return out
    }

    func bytesBefore(_ a: [UInt8], _ b: [UInt8]) -> Bool { a.lexicographicallyPrecedes(b) }

    /// The elements of a JSON array (valid JSON: the router built it), split at its top-level commas.
    func splitArray(_ bytes: [UInt8]) -> [[UInt8]]? {
        guard bytes.first == UInt8(ascii: "["), bytes.last == UInt8(ascii: "]") else { return nil }
        var elements: [[UInt8]] = []
        var depth = 0, inString = false, escaped = false, start = 1
        for i in 1..<(bytes.count - 1) {
            let c = bytes[i]
            if inString {
                if escaped { escaped = false } else if c == UInt8(ascii: "\\") { escaped = true } else if c == UInt8(ascii: "\"") { inString = false }
                continue
            }
            switch c {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "["), UInt8(ascii: "{"): depth += 1
            case UInt8(ascii: "]"), UInt8(ascii: "}"): depth -= 1
            case UInt8(ascii: ",") where depth == 0:
                elements.append(Array(bytes[start..<i]))
                start = i + 1
            default: break
            }
        }
        if bytes.count > 2 { elements.append(Array(bytes[start..<(bytes.count - 1)])) }
        return elements
    }

    /// Checks one frame sent to a peer and updates the model from it.
    func observe(_ id: PeerID, _ frame: Frame, monitor: Bool, _ fatalPending: inout Set<PeerID>) {
        guard let peer = peers[id] else { fuzzFail("frame to unknown peer \(id): \(frame.text) (\(eventDescription))") }
        fuzzCheck(!fatalPending.contains(id), "frame to peer \(id) after a fatal error: \(frame.text) (\(eventDescription))")
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
        eventFrames.append(EventFrame(peer: id, env: env, coalescing: frame.coalescing, op: op, store: store,
                                      version: env.int("version").value, path: env.string("path").value,
                                      from: op == "subscribed" ? subscribeFrom : nil))
        switch op {
        case "welcome":
            fuzzCheck(peer.role == nil, "second welcome to peer \(id)")
            guard let role = peer.pendingRole else { fuzzFail("welcome to peer \(id) that sent no hello") }
            peer.role = role
            peer.heartbeat = peer.pendingHeartbeat == true && router.config.pingInterval > 0
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
            switch code {
            case "unresponsive":
                // A heartbeat peer silent through maxPingsOut pings, or the owner of a store just reported stalled.
                fuzzCheck(fatal, "unresponsive not fatal")
                if !eventStalledOwners.contains(id) {
                    let cfg = router.config
                    let silentSince = max(peer.lastHeard, peer.connectedAt)
                    fuzzCheck(peer.heartbeat && peer.pingsOut >= cfg.maxPingsOut && now >= silentSince + cfg.pingInterval * Millis(peer.pingsOut + 1),
                              "unresponsive to peer \(id) (heartbeat \(peer.heartbeat), \(peer.pingsOut) pings out, silent since \(silentSince), now \(now)) (\(eventDescription))")
                }
            case "memory-budget":
                // (`.overBudget` is fed at random too, not only after `accountTransport` refused.)
                if case .overBudget = currentEvent {} else {
                    fuzzCheck(router.config.memory.total < 1 << 30, "memory-budget with the default budget (\(eventDescription))")
                }
            default: break
            }
        case "action":
            guard let store, case .value(let seq) = env.int(.seq) else { fuzzFail("action without store and seq: \(frame.text)") }
            let redelivered = env.bool("redelivered").value ?? false
            fuzzCheck(peer.owned.contains(store), "action for store \(store) to peer \(id), which does not own it (\(eventDescription))")
            var d = peer.deliveries[store] ?? Deliveries()
            if d.outstanding.isEmpty { peer.progressAt[store] = now }
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
            peer.stalled.remove(store)
            // Its registration is charged to this connection from now on (it was refused if it did not fit).
            if let body = peer.pendingRegister, let reg = try? Envelope(body: body) {
                if reg.bool("queryDeltas").value == true { peer.deltaStores.insert(store) }
                let handles = reg.stringArray("handles").value ?? []
                let waitFor = reg.stringArray("waitFor").value ?? []
                let cost = 256 + store.utf8.count + handles.reduce(0) { $0 + $1.utf8.count + 16 } + waitFor.reduce(0) { $0 + $1.utf8.count + 16 }
                registrationCharges[store] = (cost, peer.uid)
            } else {
                fuzzFail("registered \(store) without a register")
            }
            eventRegistered.append((id, store, env.bool("resumed").value ?? false))
            checkVersion(peer, store, env, op)
        case "snapshot", "store-up", "got", "subtree":
            guard let store else { fuzzFail("\(op) without store: \(frame.text)") }
            checkVersion(peer, store, env, op)
        case "delta":
            guard let store else { fuzzFail("delta without store: \(frame.text)") }
            // (Not R4: a resuming subscribe is answered `subscribed` with the retained version, then the kept
            // patches from the version the subscriber holds, SPEC §16.3; the chain is checked in RouterDeltas.swift.)
            if case .value(let v) = env.int("version") { peer.versions[store] = max(peer.versions[store] ?? 0, v) }
            // SPEC §16.3: a connection that is behind is sent snapshots. (A resuming subscribe is answered with the
            // kept patches whether or not it is behind: §16.3 says nothing of that case; checked only when strict.)
            if isBehind(peer) {
                var resuming = false
                if case .frame(let from, let body) = currentEvent, from == id, (try? Envelope(body: body))?.string(.op).value == "subscribe" { resuming = true }
                fuzzCheck(resuming && !Self.strict(.resumeBehind), "delta to peer \(id), which is behind: \(frame.text) (\(eventDescription))")
            }
        case "settled":
            guard case .value(let sid) = env.string(.id) else { fuzzFail("settled without a string id: \(frame.text)") }
            fuzzCheck(peer.awaiting.remove(sid) != nil, "settled \(sid) to peer \(id), which is not waiting for it (settled twice, or never asked) (\(eventDescription))")
            checkResults(peer, env, frame)
        case "subscribed":
            guard let store else { fuzzFail("subscribed without store") }
            if let path = env.string("path").value {
                peer.pathSubs.insert(PathKey(store: store, path: path))
            } else {
                peer.subscriptions.insert(store)
                if env.bool("deltas").value == true { peer.deltaSubs.insert(store) } else { peer.deltaSubs.remove(store) }
            }
            checkVersion(peer, store, env, op)
        case "unsubscribed":
            guard let store else { fuzzFail("unsubscribed without store") }
            if let path = env.string("path").value {
                peer.pathSubs.remove(PathKey(store: store, path: path))
            } else {
                peer.subscriptions.remove(store)
                peer.deltaSubs.remove(store)
            }
        case "queries":
            guard let store else { fuzzFail("queries without store") }
            fuzzCheck(peer.owned.contains(store), "queries for \(store) to peer \(id), which does not own it")
            // A whole set: at registration (every store), or at the end of a batch (stores without deltas).
            let atRegistration = eventRegistered.contains { $0.peer == id && $0.store == store }
            if case .endOfBatch = currentEvent {} else {
                fuzzCheck(atRegistration, "queries for \(store) outside its registration and .endOfBatch (\(eventDescription))")
            }
            fuzzCheck(atRegistration || !peer.deltaStores.contains(store), "whole queries to \(store), registered with queryDeltas, after its registration (\(eventDescription))")
            var view: [[UInt8]: Int] = [:]
            for q in queryCounts(env.raw("queries"), frame) {
                fuzzCheck(q.count >= 1, "queries with count \(q.count): \(frame.text)")
                view[q.bytes] = q.count
            }
            peer.queryViews[store] = view
            checkQueryView(peer, store)
        case "queries-changed":
            guard let store else { fuzzFail("queries-changed without store") }
            fuzzCheck(peer.owned.contains(store) && peer.deltaStores.contains(store), "queries-changed for \(store) to peer \(id), which does not own it or did not ask for deltas (\(eventDescription))")
            guard var view = peer.queryViews[store] else { fuzzFail("queries-changed for \(store) before its whole set") }
            let changes = queryCounts(env.raw("changes"), frame)
            fuzzCheck(!changes.isEmpty, "queries-changed without changes: \(frame.text)")
            for q in changes {
                fuzzCheck(q.count >= 0, "queries-changed with count \(q.count): \(frame.text)")
                fuzzCheck(view[q.bytes] != (q.count == 0 ? nil : q.count), "queries-changed with a change that changes nothing: \(frame.text) (\(eventDescription))")
                view[q.bytes] = q.count == 0 ? nil : q.count
            }
            peer.queryViews[store] = view
            checkQueryView(peer, store)
        case "query-ok":
            guard case .value(let qid) = env.string(.id), let pending = peer.pendingQuery, pending.id == qid else {
                fuzzFail("query-ok for a query not just sent: \(frame.text) (\(eventDescription))")
            }
            peer.queries[qid] = (pending.store, pending.bytes)
            peer.pendingQuery = nil
        case "unquery-ok":
            guard case .value(let qid) = env.string(.id), peer.queries.removeValue(forKey: qid) != nil else {
                fuzzFail("unquery-ok for a query that is not live: \(frame.text) (\(eventDescription))")
            }
        case "ping":
            // Since 0.2.0: a heartbeat, only to peers that asked, after pingInterval × (pings out + 1) of silence.
            let cfg = router.config
            let silentSince = max(peer.lastHeard, peer.connectedAt)
            fuzzCheck(peer.heartbeat, "ping to peer \(id), which did not ask for heartbeats (\(eventDescription))")
            fuzzCheck(peer.pingsOut < cfg.maxPingsOut && now >= silentSince + cfg.pingInterval * Millis(peer.pingsOut + 1),
                      "ping to peer \(id) silent since \(silentSince) at \(now) with \(peer.pingsOut) pings out (\(eventDescription))")
            guard case .value(let pid) = env.string(.id), pid.hasPrefix("hb-") else { fuzzFail("ping without an hb- id: \(frame.text)") }
            fuzzCheck(!eventPinged.contains(id), "two pings to peer \(id) in one tick")
            peer.pingsOut += 1
            peer.pingIDs.append(pid)
            if peer.pingIDs.count > 4 { peer.pingIDs.removeFirst() }
            eventPinged.insert(id)
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

    /// A store's view of its query set equals the live queries the harness recorded (a `queries-changed` store:
    /// after applying every change to the last whole set).
    func checkQueryView(_ peer: PeerModel, _ store: String) {
        let view = peer.queryViews[store] ?? [:]
        let expected = expectedQueries(store)
        if view != expected {
            func show(_ s: [[UInt8]: Int]) -> String {
                s.map { "\(String(decoding: $0.key, as: UTF8.self))×\($0.value)" }.sorted().joined(separator: ", ")
            }
            fuzzFail("queries of \(store) as peer \(peer.id) knows them: [\(show(view))], live queries: [\(show(expected))] (\(eventDescription))")
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
        let codes = errors.map(\.code)
        switch expect {
        case .nothing, .hello, .dispatch:
            break
        case .answer(let store, let seq, let state, let patch):
            guard peer.role == "store" else { return }
            var d = peer.deliveries[store] ?? Deliveries()
            let oldest = d.outstanding.first
            if oldest == seq {
                if let patch, state == nil {
                    // SPEC §16.2: applied to the retained state, or patch-failed (fatal; the action stays unanswered).
                    guard checkPatchOutcome(peer, store, patch) else { return }
                } else {
                    if codes == ["memory-budget"] && state != nil {
                        // Its new state does not fit: closed, the action stays unanswered (redelivered, SPEC §10).
                        fuzzCheck(errors[0].fatal && peer.closeEffect, "memory-budget for a done's state, not fatal (\(eventDescription))")
                        return
                    }
                    fuzzCheck(errors.isEmpty, "R2: answer for the oldest unanswered seq \(seq) of \(store) refused: \(errors) (\(eventDescription))")
                }
                d.outstanding.removeFirst()
                answered[store, default: []].insert(seq)
                peer.deliveries[store] = d
                peer.progressAt[store] = now
                peer.stalled.remove(store)
                if let state { publishState(store, state, patch: patch, by: peer) }
            } else {
                fuzzCheck(!errors.isEmpty, "R2: answer for seq \(seq) of \(store) accepted, but the oldest unanswered is \(String(describing: oldest)) (\(eventDescription))")
            }
        case .unregister(let store):
            guard peer.role == "store" else { return }
            fuzzCheck(errors.isEmpty, "unregister of owned store \(store) refused: \(errors) (\(eventDescription))")
            peer.disown(store)
        case .register(let store, let state, let limited):
            guard peer.role == "store" else { return }
            if let limited {
                fuzzCheck(codes.contains("limit-exceeded") == limited, "register \(store): limit-exceeded expected \(limited), errors \(codes) (\(eventDescription))")
            }
            guard eventRegistered.contains(where: { $0.peer == peer.id && $0.store == store }) else { return }
            // The initial state is used only when no snapshot is retained (SPEC §8.2).
            if let state, models[store]?.current == nil, !codes.contains("memory-budget") { publishState(store, state, by: peer) }
        case .subscribe(let store, let limited):
            guard peer.role != nil else { return }
            fuzzCheck(codes.contains("limit-exceeded") == limited, "subscribe \(store): limit-exceeded expected \(limited), errors \(codes) (\(eventDescription))")
        case .query(let limited):
            guard peer.role == "client" || peer.role == "store" else { return }
            fuzzCheck(codes.contains("limit-exceeded") == limited, "query: limit-exceeded expected \(limited), errors \(codes) (\(eventDescription))")
        case .state(let store, let state):
            guard peer.role == "store" else { return }
            if errors.isEmpty { publishState(store, state, by: peer) }
        case .patch(let store, let patch):
            guard peer.role == "store" else { return }
            _ = checkPatchOutcome(peer, store, patch)
        case .refused(let code, let roles):
            guard let role = peer.role, roles?.contains(role) ?? true else { return }
            let summary = errors.map { "\($0.code)\($0.fatal ? "!" : "")" }
            fuzzCheck(summary == [code], "a malformed message answered \(summary), expected \(code) (\(eventDescription))")
        }
    }
}
