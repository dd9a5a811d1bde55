#if canImport(Glibc)
import Glibc
#endif
import FluxCore
import FluxJournal
import FluxJSONValue
import FluxRouter

// SPEC §16 in the router target: stores publishing patches (`done` with `patch`, with `state` and `patch`, the
// `patch` op), delta subscriptions (`deltas`, `from`), path subscriptions (`path`), and peers whose connection is
// behind or whose writes are held back (frames queue and coalesce as FluxTransport's `Connection.send` does them).
//
// Two views are checked:
// - the router's effects, after every event: each new version goes to every whole-store subscriber exactly once,
//   as a `delta` exactly when SPEC §16.3 says (a patch, the subscription was sent the version before, the
//   connection not behind), else as the `snapshot`; a changed value at a subscribed path comes as a `subtree`;
//   every state fluxd sends (snapshot, got) is the state the harness's model predicts for that version;
// - what each client receives, after the transport's coalescing (newest wins in place, fences): a delta
//   subscription's frames form a chain (a `delta` from the version it holds to the next one; a `snapshot` may jump
//   ahead; never backwards); the client's state, made by applying each delta (FluxJSONValue's JSONPatch) and
//   replacing it with each snapshot, equals the retained state at that version; `subtree` versions never go back
//   per store and path and their values are the model's; R5 with deltas and paths at every `settled`.
//
// The model: per store, the state at each version (`StoreModel.history`), made from what the harness saw
// accepted: an initial state, a `done` with `state` (byte-identical: no version), with `patch` (applied with
// JSONPatch to the model's state; an empty patch makes no version), a `state`, a `patch`. Whether a patch must be
// refused with `patch-failed` (no retained state, a wrong `base`, a patch that does not parse or apply) is computed
// on the model.

/// A patch a store sends: its exact bytes, its `base`, and the operations (nil: it does not parse as a patch).
struct PatchInfo {
    var bytes: [UInt8]
    var base: Int64?
    var parsed: JSONPatch?
}

/// What the harness knows of one store's retained state.
final class StoreModel {
    /// The retained version (0: none) and the state at each version (its retained bytes and their value).
    var version: Int64 = 0
    var history: [Int64: (bytes: [UInt8], value: JSONValue)] = [:]
    /// Per version made by a patch: the patch's bytes (a `delta` carries them as the store wrote them).
    var patches: [Int64: [UInt8]] = [:]
    /// Versions made by a `done` with both `state` and a `patch` that does not turn the state before into it
    /// (SPEC §16.2: fluxd does not check): a delta subscriber's state is unknown after such a delta.
    var inconsistent: Set<Int64> = []
    /// Versions made by a whole state (a journal records them as snapshots; the others as patches).
    var wholeVersions: Set<Int64> = []
    /// The retained state's memory charge (SPEC §16.5: a patched state is charged as a tree) and whose it is.
    var cost = 0
    var uid: UInt32 = 0
    var isTree = false
    /// The largest state and patch this store had (bounds of a patched state's charge, SPEC §16.5).
    var largestState = 0
    var largestPatch = 0

    var current: (bytes: [UInt8], value: JSONValue)? { history[version] }
}

/// A frame held in a connection's queue while its writes are held back.
struct QueuedFrame {
    var env: Envelope
    var coalescing: Coalescing
    /// For a `subscribed`: the `from` its subscribe carried.
    var from: Int64?
}

/// A store and a path: one path subscription of a connection.
struct PathKey: Hashable {
    var store: String
    var path: String
}

/// What a client knows from the frames it received (after coalescing).
struct ClientView {
    struct Whole {
        var deltas: Bool
        /// The version it holds (nil: none yet) and its state (nil: unknown).
        var last: Int64?
        var state: JSONValue?
    }
    struct PathView {
        var version: Int64
        /// The value it holds: nil unknown, .some(nil) absent.
        var value: [UInt8]??
    }
    var whole: [String: Whole] = [:]
    var paths: [PathKey: PathView] = [:]
}

extension RouterHarness {
    // MARK: - Templates

    static let patchPaths = ["", "/n", "/t", "/todos", "/todos/0", "/todos/1", "/todos/2", "/todos/-", "/todos/0/done",
                             "/todos/1/done", "/0", "/1", "/2", "/-", "/x", "/a~1b", "/n/x", "/todos/01",
                             // Canonically equivalent keys are two keys (SPEC §3.2), and copies' targets.
                             "/\u{e9}", "/e\u{301}", "/c0", "/c1", "/c0/c1"]
    static let patchValues = ["1", "2", "true", #""s""#, "null", #"{"done":false}"#, "[]", "[1,2]",
                              #"{"todos":[{"id":1,"done":false},{"id":2,"done":true}],"n":2}"#]
    static let invalidOperations = [
        #"{"op":"frobnicate","path":"/n"}"#, #"{"op":"add","path":"/n"}"#, #"{"op":"remove"}"#,
        #"{"op":"add","path":"n","value":1}"#, #"{"op":"replace","path":"/a~2","value":1}"#, #"{"op":"move","path":"/n"}"#,
        #"{"path":"/n","value":1}"#, #""replace""#, #"{"op":"copy","from":7,"path":"/n"}"#,
    ]
    /// Paths subscribers name (valid RFC 6901 pointers), and invalid ones (`bad-message`).
    static let subscribePaths = ["", "/n", "/t", "/todos", "/todos/0", "/todos/1", "/todos/2", "/todos/1/done", "/0", "/1",
                                 "/\u{e9}", "/e\u{301}", "/c0", "/c1/n",
                                 "/2", "/-", "/a~1b", "/x"]
    static let badPaths = ["n", "/a~2", "~", String(repeating: "/p", count: 513)]

    /// One patch operation, drawn from the input.
    func patchOperation() -> String {
        func path() -> String { quoted(r.pick(Self.patchPaths)) }
        func value() -> String { r.pick(Self.patchValues) }
        switch r.below(14) {
        case 0, 1: return #"{"op":"add","path":\#(path()),"value":\#(value())}"#
        case 2: return #"{"op":"remove","path":\#(path())}"#
        case 3, 4: return #"{"op":"replace","path":\#(path()),"value":\#(value())}"#
        case 5: return #"{"op":"move","from":\#(path()),"path":\#(path())}"#
        case 6: return #"{"op":"copy","from":\#(path()),"path":\#(path())}"#
        case 7: return #"{"op":"test","path":\#(path()),"value":\#(value())}"#
        case 8: return #"{"op":"add","path":"/todos/-","value":{"id":\#(r.below(9)),"done":\#(r.bool())}}"#
        case 9: return #"{"op":"replace","path":"/todos/\#(r.below(3))/done","value":\#(r.bool())}"#
        case 10: return #"{"op":"replace","path":"","value":\#(value())}"#
        // Chains of copies of the whole state (each doubles it: SPEC §16.5 charges them in full) and moves into them.
        case 11: return #"{"op":"copy","from":"","path":"/c\#(r.below(3))"}"#
        case 12: return #"{"op":"move","from":\#(path()),"path":"/c\#(r.below(3))"}"#
        default: return r.pick(Self.invalidOperations)
        }
    }

    /// A patch (0 to 3 operations, sometimes written with spaces: forwarded as written), and its `base`.
    func patch(for store: String) -> PatchInfo {
        let count = r.below(4)
        let ops = (0..<count).map { _ in patchOperation() }
        let text = r.below(4) == 0 ? "[ " + ops.joined(separator: " , ") + " ]" : "[" + ops.joined(separator: ",") + "]"
        let bytes = Array(text.utf8)
        let version = models[store]?.version ?? 0
        var base: Int64?
        switch r.below(8) {
        case 0, 1: base = version  // right (0 is not a version: written only when there is one)
        case 2: base = version + 1
        case 3: base = version - 1
        default: break
        }
        if base.map({ $0 < 1 }) ?? false { base = nil }
        return PatchInfo(bytes: bytes, base: base, parsed: try? JSONPatch(parsing: bytes))
    }

    func patchFields(_ p: PatchInfo) -> String {
        #","patch":\#(String(decoding: p.bytes, as: UTF8.self))"# + (p.base.map { #","base":\#($0)"# } ?? "")
    }

    /// A malformed `patch`/`base` (bad-message: nothing of the message is kept).
    func malformedPatchFields() -> String {
        r.pick([#","patch":{"op":"add","path":"/n","value":1}"#, #","patch":"[]""#, #","patch":null"#,
                #","patch":[],"base":0"#, #","patch":[],"base":"1""#, #","patch":[],"base":-3"#])
    }

    static let templates16: [MessageTemplate] = [
        // `done` with a patch: alone (with or without base, right or wrong), with a state (consistent with the
        // patch or not), or malformed.
        MessageTemplate(name: "done+patch") { h, peer in
            let name = h.answerStore(peer)
            let seq = h.answerSeq(peer, name)
            var text = #"{"op":"done","store":\#(h.quoted(name)),"seq":\#(seq)"#
            let mode = h.r.below(8)
            if mode == 7 {
                return Outgoing(text + h.malformedPatchFields() + "}", .refused(code: "bad-message", roles: ["store"]))
            }
            let p = h.patch(for: name)
            var state: [UInt8]?
            if mode >= 4 {
                // With a state: the patch applied to the retained state (the consistent case), or any state.
                if mode < 6, let ops = p.parsed, let now = h.models[name]?.current?.value, let after = try? now.applying(ops) {
                    state = after.compactBytes
                } else {
                    state = Array(h.r.pick(states).utf8)
                }
                text += #","state":\#(String(decoding: state!, as: UTF8.self))"#
            }
            text += h.patchFields(p) + "}"
            let expect: Expectation = peer.owned.contains(name) ? .answer(store: name, seq: seq, state: state, patch: p) : .nothing
            return Outgoing(text, expect)
        },
        // The `patch` op: a change outside an action.
        MessageTemplate(name: "patch") { h, peer in
            let name = h.answerStore(peer)
            let text = #"{"op":"patch","store":\#(h.quoted(name))"#
            if h.r.below(8) == 0 {
                return Outgoing(text + h.malformedPatchFields() + "}", .refused(code: "bad-message", roles: ["store"]))
            }
            let p = h.patch(for: name)
            return Outgoing(text + h.patchFields(p) + "}", peer.owned.contains(name) ? .patch(store: name, patch: p) : .nothing)
        },
        // `subscribe` with `deltas`, `from` and `path` (deltas and path together: bad-message).
        MessageTemplate(name: "subscribe16") { h, peer in
            let name = h.anyStore()
            var wellFormed = stores.contains(name)
            var text = #"{"op":"subscribe","store":\#(h.quoted(name))"#
            var deltas = false
            switch h.r.below(4) {
            case 0: break
            case 1, 2: text += #","deltas":true"#; deltas = true
            default:
                if h.r.bool() { text += #","deltas":false"# } else { text += #","deltas":"yes""#; wellFormed = false }
            }
            let version = h.models[name]?.version ?? 0
            var from: Int64?
            switch h.r.below(8) {
            case 0, 1, 2: break
            case 3: from = version
            case 4: from = max(0, version - 1)
            case 5: from = max(0, version - Int64(1 + h.r.below(4)))
            case 6: from = version + 1 + Int64(h.r.below(3))  // more than it has: the snapshot
            default: text += h.r.bool() ? #","from":-1"# : #","from":"1""#; wellFormed = false
            }
            if let from { text += #","from":\#(from)"# }
            var path: String?
            switch h.r.below(4) {
            case 0: break
            case 1, 2: path = h.r.pick(subscribePaths)
            default: text += #","path":\#(h.quoted(h.r.pick(badPaths)))"#; wellFormed = false
            }
            if let path {
                text += #","path":\#(h.quoted(path))"#
                if deltas { wellFormed = false }  // not in protocol 1 (SPEC §16.3)
            }
            text += "}"
            guard wellFormed else { return Outgoing(text, .refused(code: "bad-message", roles: nil)) }
            let count = peer.subscriptions.count + peer.pathSubs.count
            let isNew = path.map { !peer.pathSubs.contains(PathKey(store: name, path: $0)) } ?? !peer.subscriptions.contains(name)
            let limited = isNew && count >= h.router.config.maxSubscriptions
            h.subscribeFrom = from
            return Outgoing(text, .subscribe(store: name, limited: limited))
        },
        // `unsubscribe` with a path (one this connection holds, mostly).
        MessageTemplate(name: "unsubscribe16") { h, peer in
            let held = peer.pathSubs.sorted { ($0.store, $0.path) < ($1.store, $1.path) }
            if !held.isEmpty && h.r.below(4) != 0 {
                let key = held[h.r.below(held.count)]
                return Outgoing(#"{"op":"unsubscribe","store":\#(h.quoted(key.store)),"path":\#(h.quoted(key.path))}"#)
            }
            let name = h.anyStore()
            if h.r.below(4) == 0 {
                return Outgoing(#"{"op":"unsubscribe","store":\#(h.quoted(name)),"path":\#(h.quoted(h.r.pick(badPaths)))}"#,
                                .refused(code: "bad-message", roles: nil))
            }
            return Outgoing(#"{"op":"unsubscribe","store":\#(h.quoted(name)),"path":\#(h.quoted(h.r.pick(subscribePaths)))}"#)
        },
    ]

    // MARK: - The model of the stores' states

    func model(_ store: String) -> StoreModel {
        if let m = models[store] { return m }
        let m = StoreModel()
        models[store] = m
        return m
    }

    /// A whole state accepted from `peer` (initial state, done, state): a new version unless byte-identical to the
    /// retained state (however it was made); charged to `peer` (SPEC §16.2, `patch` with it: what delta
    /// subscribers are sent).
    func publishState(_ store: String, _ state: [UInt8], patch: PatchInfo? = nil, by peer: PeerModel) {
        let m = model(store)
        if m.current?.bytes == state { return }
        guard let value = try? JSONValue(parsing: state) else { fuzzFail("model: a state the router accepted does not parse: \(String(decoding: state, as: UTF8.self))") }
        let before = m.current?.value
        m.version += 1
        m.history[m.version] = (state, value)
        m.wholeVersions.insert(m.version)
        m.cost = 96 + quoted(store).utf8.count + state.count
        m.uid = peer.uid
        m.isTree = false
        if let patch {
            m.patches[m.version] = patch.bytes
            let consistent = before.flatMap { b in patch.parsed.flatMap { try? b.applying($0) } }.map { $0.compactBytes == value.compactBytes } ?? false
            if !consistent { m.inconsistent.insert(m.version) }
        }
        eventVersions.append((store, m.version, patch != nil))
    }

    /// What fluxd must do with a patch, computed on the model (SPEC §16.2).
    enum PatchPrediction {
        /// Refused before anything is charged: no retained state, a wrong base, a patch that does not parse.
        case failsEarly(String)
        case empty
        case applies(JSONValue)
        /// Parsed, but it does not apply (checked after its room was charged).
        case failsLate(String)
    }

    func predict(_ store: String, _ p: PatchInfo) -> PatchPrediction {
        guard let m = models[store], let current = m.current else { return .failsEarly("no retained state") }
        if let base = p.base, base != m.version { return .failsEarly("base \(base), retained version \(m.version)") }
        guard let ops = p.parsed else { return .failsEarly("not a patch") }
        if ops.isEmpty { return .empty }
        do { return .applies(try current.value.applying(ops)) } catch { return .failsLate("\(error)") }
    }

    /// Checks the answer to a patch (a `done`'s or the `patch` op's) against the prediction; true when it was
    /// accepted (the model then has the new version).
    func checkPatchOutcome(_ peer: PeerModel, _ store: String, _ p: PatchInfo) -> Bool {
        let errors = eventErrors[peer.id] ?? []
        let codes = errors.map(\.code)
        let what = "patch \(String(decoding: p.bytes, as: UTF8.self)) base \(p.base.map(String.init) ?? "none") for \(store)"
        func refusedFatally(_ code: String) -> Bool { codes == [code] && errors[0].fatal && peer.closeEffect }
        switch predict(store, p) {
        case .failsEarly(let why):
            fuzzCheck(refusedFatally("patch-failed"), "\(what): patch-failed (fatal) expected (\(why)), errors \(errors) (\(eventDescription))")
            return false
        case .empty:
            fuzzCheck(errors.isEmpty, "\(what): an empty patch refused: \(errors) (\(eventDescription))")
            return true
        case .applies(let value):
            if refusedFatally("memory-budget") { return false }  // its room did not fit
            fuzzCheck(errors.isEmpty, "\(what) applies to the retained state, but was refused: \(errors) (\(eventDescription))")
            let m = model(store)
            m.largestState = max(m.largestState, m.current!.bytes.count, value.compactBytes.count)
            m.largestPatch = max(m.largestPatch, p.bytes.count)
            m.isTree = true
            m.uid = peer.uid
            m.version += 1
            m.history[m.version] = (value.compactBytes, value)
            m.patches[m.version] = p.bytes
            eventVersions.append((store, m.version, true))
            // fluxd's charge for the tree follows when it last measured the state (its renderings, and once the
            // patches since outgrow it): taken from the router, bounded here (SPEC §16.5, "charged like the
            // retained snapshot": not growing with every patch).
            let charge = router.retainedCharge(of: store)
            fuzzCheck(charge?.uid == peer.uid, "the patched state of \(store) is charged to uid \(charge?.uid ?? 0), not its publisher's \(peer.uid) (\(eventDescription))")
            m.cost = charge?.bytes ?? 0
            if Self.strict(.treeCharge) {
                // Exactly its rendered size (SPEC §16.5), copies included.
                let exact = 96 + quoted(store).utf8.count + Self.treeOverhead * value.compactBytes.count
                fuzzCheck(m.cost == exact, "the retained tree of \(store) is charged \(m.cost) bytes, not \(exact) for its \(value.compactBytes.count) bytes (\(eventDescription))")
            }
            return true
        case .failsLate(let why):
            if refusedFatally("memory-budget") { return false }
            fuzzCheck(refusedFatally("patch-failed"), "\(what): patch-failed (fatal) expected (\(why)), errors \(errors) (\(eventDescription))")
            // KNOWN (docs/fuzzing.md, Findings): the room charged for the patched tree is handed back to the failing
            // connection's account, so the retained state is charged to it from then on.
            if Self.strict(.failedPatchCharge) {
                let charge = router.retainedCharge(of: store)
                fuzzCheck(charge?.uid == models[store]!.uid,
                          "a failed patch changed the charge of \(store)'s retained state: \(String(describing: charge)), it was uid \(models[store]!.uid) \(models[store]!.cost) bytes (\(eventDescription))")
            }
            return false
        }
    }

    /// A restart (SPEC §15.1, §16.5): a journal of what the model says was accepted (each store's last whole state
    /// as a snapshot, the patches after it) restored into a new router gives every store its current state, and
    /// replaying the patches costs a few node visits per byte of them (restart is linear in the journal).
    func checkRestart() {
        var state = JournalState()
        var patchBytes = 0
        var expected: [String: (version: Int64, bytes: [UInt8])] = [:]
        for name in models.keys.sorted() {
            let m = models[name]!
            guard m.version > 0, let current = m.current,
                  let base = stride(from: m.version, through: 1, by: -1).first(where: { m.wholeVersions.contains($0) }),
                  let snapshot = m.history[base] else { continue }
            state.apply(.register(store: name, handles: [], waitFor: []))
            state.apply(.snapshot(store: name, version: UInt64(base), seq: 0, state: ArraySlice(snapshot.bytes)))
            var v = base + 1
            while v <= m.version, let patch = m.patches[v] {
                state.apply(.patch(store: name, version: UInt64(v), seq: 0, patch: ArraySlice(patch)))
                patchBytes += patch.count
                v += 1
            }
            guard v > m.version else { continue }  // (a version the model cannot journal: not checked)
            expected[name] = (m.version, base == m.version ? snapshot.bytes : current.value.compactBytes)
        }
        let restored = Router(config: router.config)
        restored.restore(from: state, now: now)
        fuzzCheck(restored.restoreProblems.isEmpty, "restart: \(restored.restoreProblems)")
        fuzzCheck(restored.patchSteps <= UInt64(4 * patchBytes + 64),
                  "restart: \(restored.patchSteps) steps to replay \(patchBytes) bytes of patches")
        for (name, want) in expected {
            let got = restored.retainedState(of: name)
            fuzzCheck(got?.version == UInt64(want.version) && got?.state == want.bytes,
                      "restart: \(name) restored as version \(got?.version ?? 0) \(got.map { String(decoding: $0.state, as: UTF8.self) } ?? "none"), expected version \(want.version) \(String(decoding: want.bytes, as: UTF8.self))")
        }
    }

    /// SPEC §16.5: how many times its JSON size a patched state's tree is charged (`Router.treeOverhead`, internal).
    static let treeOverhead = 8

    /// The findings of docs/fuzzing.md (all fixed in the router): each is checked, unless FLUXBUS_FUZZ_STRICT
    /// names the ones to check (a comma list of these names; 0 for none, to look past one while it is open).
    enum Known: String, CaseIterable {
        case leak, overtaken, append, treeCharge = "tree-charge", failedPatchCharge = "failed-patch-charge"
        case deltaFromZero = "delta-from-0", resumeBehind = "resume-behind"
    }
    static let strictChecks: Set<Known> = {
        guard let text = getenvString("FLUXBUS_FUZZ_STRICT"), !text.isEmpty else { return Set(Known.allCases) }
        if text == "0" { return [] }
        if text == "1" || text == "all" { return Set(Known.allCases) }
        return Set(text.split(separator: ",").compactMap { Known(rawValue: String($0)) })
    }()
    static func strict(_ k: Known) -> Bool { strictChecks.contains(k) }

    // MARK: - After every event: the fan-out, the router's view, the clients' view

    /// Called after the event's expectation was checked (the model has this event's versions).
    func deliverPending() {
        let frames = eventFrames
        eventFrames.removeAll(keepingCapacity: true)
        let versions = eventVersions
        eventVersions.removeAll(keepingCapacity: true)
        // 1. Each new version reaches every subscriber as SPEC §16.3 and §16.4 say.
        for (store, version, withPatch) in versions {
            let m = models[store]!
            for peer in peers.values.sorted(by: { $0.id < $1.id }) where peer.isLive && !peer.closeEffect {
                if peer.subscriptions.contains(store) {
                    let got = frames.filter { $0.peer == peer.id && $0.store == store && ($0.op == "snapshot" || $0.op == "delta") && $0.version == version }
                    fuzzCheck(got.count == 1, "version \(version) of \(store) reached subscriber \(peer.id) \(got.count) times (\(eventDescription))")
                    var expected = "snapshot"
                    if peer.deltaSubs.contains(store), withPatch, peer.deltaSent[store] == version - 1, !isBehind(peer) {
                        expected = version - 1 >= 1 || !Self.strict(.deltaFromZero) ? "delta" : "snapshot"
                    }
                    fuzzCheck(got[0].op == expected, "version \(version) of \(store) (\(withPatch ? "a patch" : "a state")) to \(peer.deltaSubs.contains(store) ? "delta" : "full") subscriber \(peer.id) (sent \(peer.deltaSent[store].map(String.init) ?? "-"), behind \(isBehind(peer))) as \(got[0].op), expected \(expected) (\(eventDescription))")
                }
                for key in peer.pathSubs where key.store == store {
                    let before = valueAt(m.history[version - 1]?.value, key.path)
                    let after = valueAt(m.history[version]?.value, key.path)
                    guard before != after else { continue }
                    let sent = frames.contains { $0.peer == peer.id && $0.op == "subtree" && $0.store == store && $0.path == key.path && $0.version == version }
                    if !sent && !Self.strict(.append) && appendTouches(m, version, key.path) { continue }  // KNOWN (Findings)
                    fuzzCheck(sent, "the value at \(key.path) in \(store) changed at version \(version) (\(show(before)) -> \(show(after))), but path subscriber \(peer.id) was sent no subtree (\(eventDescription))")
                }
            }
        }
        // 2. The router's side, frame by frame: what it sends matches the model.
        for f in frames {
            guard let peer = peers[f.peer] else { continue }
            routerSide(peer, f)
        }
        // 3. The clients' side: frames go out now, or wait (and coalesce) while the connection's writes are held.
        for f in frames {
            guard let peer = peers[f.peer], !peer.closedEvent else { continue }
            enqueue(peer, QueuedFrame(env: f.env, coalescing: f.coalescing, from: f.from))
        }
        for peer in peers.values where peer.closeEffect && !peer.closedEvent && !peer.outbox.isEmpty {
            flush(peer)  // a connection fluxd closes is closed after its queued frames are written
        }
    }

    /// KNOWN (docs/fuzzing.md, Findings): `Router.touches` says an `add` at `A/-` touches no index of `A`, but the
    /// element it appends is at index `A.count` before the patch: a subscriber to that index is not told it now
    /// exists. Whether the change to `path` at `version` is such a case (so it is tolerated unless strict).
    func appendTouches(_ m: StoreModel, _ version: Int64, _ path: String) -> Bool {
        guard let patch = m.patches[version], let text = Optional(String(decoding: patch, as: UTF8.self)) else { return false }
        return text.contains("/-\"") || text.contains("/-,") || text.contains("\"/-")
    }

    func isBehind(_ peer: PeerModel) -> Bool { useSink && sink.behind.contains(peer.id) }

    func valueAt(_ value: JSONValue?, _ path: String) -> [UInt8]? {
        guard let value, let pointer = try? JSONPointer(parsing: path), let v = try? value.value(at: pointer.tokens) else { return nil }
        return v.compactBytes
    }

    func show(_ bytes: [UInt8]?) -> String { bytes.map { String(decoding: $0, as: UTF8.self) } ?? "absent" }

    /// One frame fluxd sent, against the model and the router-side view of the peer's subscriptions.
    func routerSide(_ peer: PeerModel, _ f: EventFrame) {
        let env = f.env
        guard let store = f.store else { return }
        let m = models[store]
        switch f.op {
        case "subscribed":
            fuzzCheck(f.version == (m?.version ?? 0), "subscribed to \(store) says version \(f.version ?? -1), the model has \(m?.version ?? 0) (\(eventDescription))")
            if f.path == nil {
                // What follows starts from the version it holds (`from`, if not above the retained one), or comes as
                // the retained snapshot (none when no state is retained: version 0).
                let v = f.version ?? 0
                if !peer.deltaSubs.contains(store) {
                    peer.deltaSent[store] = nil
                } else if let from = f.from, from <= v {
                    peer.deltaSent[store] = from
                } else {
                    peer.deltaSent[store] = v == 0 ? 0 : nil
                }
            }
        case "unsubscribed":
            if f.path == nil { peer.deltaSent[store] = nil }
        case "registered", "store-up":
            fuzzCheck(f.version == (m?.version ?? 0), "\(f.op) of \(store) says version \(f.version ?? -1), the model has \(m?.version ?? 0) (\(eventDescription))")
        case "snapshot", "got":
            guard let version = f.version, let state = env.raw("state") else { fuzzFail("\(f.op) without version and state: \(String(decoding: env.body, as: UTF8.self))") }
            guard let known = m?.history[version] else { fuzzFail("\(f.op) of \(store) version \(version), which the model does not know (it is at \(m?.version ?? 0)) (\(eventDescription))") }
            fuzzCheck(known.bytes.elementsEqual(state), "\(f.op) of \(store) version \(version): state \(String(decoding: state, as: UTF8.self)), the model has \(String(decoding: known.bytes, as: UTF8.self)) (\(eventDescription))")
            if f.op == "snapshot", peer.deltaSubs.contains(store) { peer.deltaSent[store] = version }
        case "delta":
            guard let version = f.version, case .value(let from) = env.int("from"), let patch = env.raw("patch") else {
                fuzzFail("delta without from, version and patch: \(String(decoding: env.body, as: UTF8.self))")
            }
            fuzzCheck(peer.deltaSubs.contains(store), "delta of \(store) to peer \(peer.id), which has no delta subscription to it (\(eventDescription))")
            fuzzCheck(version == from + 1, "delta of \(store) from \(from) to \(version) (\(eventDescription))")
            fuzzCheck(from >= 1 || !Self.strict(.deltaFromZero), "KNOWN: delta of \(store) from version \(from): a patch for a store that had no state (\(eventDescription))")
            fuzzCheck(peer.deltaSent[store] == from, "delta of \(store) from \(from) to subscriber \(peer.id), which was sent version \(peer.deltaSent[store].map(String.init) ?? "none") (\(eventDescription))")
            if let bytes = m?.patches[version] {
                fuzzCheck(bytes.elementsEqual(patch), "delta of \(store) to version \(version): patch \(String(decoding: patch, as: UTF8.self)), the store wrote \(String(decoding: bytes, as: UTF8.self))")
            } else {
                fuzzFail("delta of \(store) to version \(version), which no patch made (\(eventDescription))")
            }
            peer.deltaSent[store] = version
        case "subtree":
            guard let version = f.version, let path = f.path, case .value(let exists) = env.bool("exists") else {
                fuzzFail("subtree without version, path and exists: \(String(decoding: env.body, as: UTF8.self))")
            }
            fuzzCheck(peer.pathSubs.contains(PathKey(store: store, path: path)), "subtree of \(store) \(path) to peer \(peer.id), which does not subscribe to it (\(eventDescription))")
            let value = env.raw("value").map(Array.init)
            fuzzCheck(exists == (value != nil), "subtree with exists \(exists) and value \(show(value))")
            if let known = m?.history[version] {
                let expected = valueAt(known.value, path)
                fuzzCheck(expected == value, "subtree of \(store) \(path) at version \(version): \(show(value)), the model has \(show(expected)) (\(eventDescription))")
            } else {
                fuzzCheck(version == 0 && value == nil, "subtree of \(store) at version \(version), which the model does not know (\(eventDescription))")
            }
        default:
            break
        }
    }

    // MARK: - The transport's queue and the clients

    /// As `Connection.send` does: while writes are held, a newest-wins frame takes the place of the queued one with
    /// its key (unless a fence with that key came since); otherwise the frame is received at once.
    func enqueue(_ peer: PeerModel, _ frame: QueuedFrame) {
        guard peer.writesStalled else { return receive(peer, frame) }
        switch frame.coalescing {
        case .none: break
        case .newestWins(let key):
            if let index = peer.replaceable[key] {
                peer.outbox[index] = frame
                return
            }
            peer.replaceable[key] = peer.outbox.count
        case .fence(let key):
            peer.replaceable[key] = nil
        }
        peer.outbox.append(frame)
    }

    /// The held frames are written (in order).
    func flush(_ peer: PeerModel) {
        let queued = peer.outbox
        peer.outbox.removeAll()
        peer.replaceable.removeAll()
        for frame in queued { receive(peer, frame) }
    }

    /// A client receives one frame: a delta subscriber's chain and state, path values, R5.
    func receive(_ peer: PeerModel, _ q: QueuedFrame) {
        let env = q.env
        guard case .value(let op) = env.string(.op) else { return }
        let store = env.string(.store).value ?? ""
        let version = env.int("version").value
        let path = env.string("path").value
        var view = peer.view
        defer { peer.view = view }
        switch op {
        case "subscribed":
            let v = version ?? 0
            if let path {
                // Its value at version v follows (a subtree) when a state is retained; none is: absent.
                view.paths[PathKey(store: store, path: path)] = .init(version: v, value: v == 0 ? .some(nil) : nil)
            } else {
                let deltas = env.bool("deltas").value == true
                // With `from: F` it holds F (a version it may hold: not above the retained one); fluxd sends what
                // follows from there. Without, it holds nothing until the snapshot.
                var whole = ClientView.Whole(deltas: deltas, last: nil, state: nil)
                if let from = q.from, from <= v {
                    whole.last = from
                    whole.state = models[store]?.history[from]?.value
                }
                view.whole[store] = whole
            }
        case "unsubscribed":
            if let path { view.paths[PathKey(store: store, path: path)] = nil } else { view.whole[store] = nil }
        case "snapshot":
            guard var whole = view.whole[store], let version else { return }
            if let last = whole.last {
                fuzzCheck(version >= last, "client \(peer.id) of \(store) holds version \(last) and receives the snapshot of version \(version) (\(eventDescription))")
            }
            whole.last = version
            whole.state = env.raw("state").flatMap { try? JSONValue(parsing: $0) }
            view.whole[store] = whole
        case "delta":
            guard var whole = view.whole[store], whole.deltas else {
                fuzzFail("client \(peer.id) receives a delta of \(store) without a delta subscription (\(eventDescription))")
            }
            guard let version, case .value(let from) = env.int("from"), let patch = env.raw("patch") else { return }
            if !Self.strict(.overtaken), let last = whole.last, version <= last {
                // KNOWN (docs/fuzzing.md, Findings): a `delta` is not a fence, so a snapshot queued before it can be
                // replaced in place by a newer one: the client has the newer state first. (A library resyncs.)
                return
            }
            if !Self.strict(.deltaFromZero), from == 0 {
                // KNOWN: a done with state and patch for a store with no state is sent as a delta from 0.
                whole.last = version
                whole.state = nil
                view.whole[store] = whole
                return
            }
            guard whole.last == from else {
                fuzzFail("client \(peer.id) of \(store) holds version \(whole.last.map(String.init) ?? "none") and receives a delta from \(from) to \(version) (\(eventDescription))")
            }
            whole.last = version
            if let state = whole.state, let m = models[store], !m.inconsistent.contains(version) {
                guard let ops = try? JSONPatch(parsing: patch), let after = try? state.applying(ops) else {
                    fuzzFail("client \(peer.id): the delta of \(store) to version \(version) does not apply to the state it holds (\(eventDescription))")
                }
                if let expected = m.history[version] {
                    fuzzCheck(after.compactBytes == expected.value.compactBytes, "client \(peer.id) of \(store) at version \(version) after a delta holds \(String(decoding: after.compactBytes, as: UTF8.self)), the retained state is \(String(decoding: expected.bytes, as: UTF8.self)) (\(eventDescription))")
                }
                whole.state = after
            } else {
                whole.state = nil
            }
            view.whole[store] = whole
        case "subtree":
            guard let path, let version else { return }
            let key = PathKey(store: store, path: path)
            guard var p = view.paths[key] else {
                fuzzFail("client \(peer.id) receives a subtree of \(store) \(path) it does not subscribe to (\(eventDescription))")
            }
            fuzzCheck(version >= p.version, "client \(peer.id) holds \(store) \(path) at version \(p.version) and receives version \(version) (\(eventDescription))")
            p.version = version
            p.value = .some(env.raw("value").map(Array.init))
            view.paths[key] = p
        case "settled":
            // R5 with deltas and paths: a `done` result with version V is already in the dispatcher's state.
            guard let raw = env.raw("results"), let results = try? JSONValue(parsing: raw), case .array(let items) = results else { return }
            for item in items {
                guard item["status"]?.stringValue == "done", let s = item["store"]?.stringValue,
                      let v = item["version"]?.intValue.map(Int64.init) else { continue }
                if let whole = view.whole[s] {
                    fuzzCheck((whole.last ?? 0) >= v, "R5: client \(peer.id) is settled with \(s) version \(v) but holds version \(whole.last.map(String.init) ?? "none") (\(whole.deltas ? "delta" : "full") subscription) (\(eventDescription))")
                }
                for (key, p) in view.paths where key.store == s && p.version < v {
                    guard case .some(let held) = p.value, let m = models[s], let at = m.history[v] else { continue }
                    let expected = valueAt(at.value, key.path)
                    if held != expected && !Self.strict(.append) && (p.version + 1...v).contains(where: { appendTouches(m, $0, key.path) }) { continue }
                    fuzzCheck(held == expected, "R5: client \(peer.id) is settled with \(s) version \(v); its subtree \(key.path) (version \(p.version)) is \(show(held)), at version \(v) it is \(show(expected)) (\(eventDescription))")
                }
            }
        default:
            break
        }
    }

    /// The `writes` control step: the peer's writes are held back (frames queue and coalesce), and it may be
    /// behind (SPEC §16.3: delta subscribers get snapshots); or its writes resume (the queue is received).
    func writes(_ peer: PeerModel) {
        switch r.below(4) {
        case 0:
            peer.writesStalled = false
            sink.behind.remove(peer.id)
            flush(peer)
        case 1: peer.writesStalled = true
        case 2:
            peer.writesStalled = true
            sink.behind.insert(peer.id)
        default:
            sink.behind.remove(peer.id)
        }
        eventDescription = "writes of \(peer.id): held \(peer.writesStalled), behind \(sink.behind.contains(peer.id))"
        if Self.trace { print("@\(now) writes of \(peer.id): held \(peer.writesStalled), behind \(sink.behind.contains(peer.id))") }
    }

    /// At the end of a program: every live connection that can asks for each store's state (checked against the
    /// model), then every held frame is received.
    func finalGets() {
        if let asker = peers.values.sorted(by: { $0.id < $1.id }).first(where: { $0.isLive && !$0.closeEffect && $0.role != nil }) {
            for (name, m) in models.sorted(by: { $0.key < $1.key }) where m.version > 0 {
                send(asker, Outgoing(#"{"op":"get","id":"end","store":\#(quoted(name))}"#), label: "get (end)")
            }
        }
        for peer in peers.values.sorted(by: { $0.id < $1.id }) where peer.isLive {
            peer.writesStalled = false
            flush(peer)
        }
    }
}

/// One frame the router sent in the current event, read once.
struct EventFrame {
    var peer: PeerID
    var env: Envelope
    var coalescing: Coalescing
    var op: String
    var store: String?
    var version: Int64?
    var path: String?
    /// For a `subscribed`: the `from` of the subscribe that was answered.
    var from: Int64?
}

func getenvString(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
