import DequeModule
import FluxCore
import FluxJSONValue

// Work off the loop thread (issue 24: no event may hold fluxd's loop for long). Applying a large patch and parsing a
// large state are pure and may take tens of milliseconds (22,000 patch operations, a 1 MB state), so the router
// does not do them while it handles the frame that needs them. It hands the host a `Preparation` (the pure work,
// `run()` on any thread) and holds the peer: that frame and every later one from the same peer wait, in order,
// charged to the peer's memory budget, while every other peer is served. When the host feeds `.prepared` back, the
// router takes the held frames again, the first one with the prepared result in hand (`preparedWork`), so its
// semantics run exactly as if the work had been done inline. The only difference a peer can see is time.
//
// A prepared result is used only by the frame it was made for and only if the store's retained state is still
// the one it was made from (the same store entry and version; only the held peer's own frames change that); else
// the frame prepares again. Hosts without threads (the in-memory bus, the router tests' bus) run `run()` right
// after the event (`DaemonCore`), which makes the same sequence of events.

/// Pure work that one frame needs before the router takes it (see `Router+Preparation.swift`): built by the router
/// on its thread, carried out by the host on any thread with `run()`, and its result fed back to the router with
/// `RouterEvent.prepared`.
public struct Preparation: Sendable {
    /// Which preparation of the router this is (a result for another one is ignored).
    public let number: UInt64
    let work: Work

    /// A state's bytes: in the retained snapshot frame, or in an incoming frame's body.
    enum StateBytes: Sendable {
        case frame(Frame, Range<Int>)
        case body([UInt8], Range<Int>)

        var count: Int {
            switch self {
            case .frame(_, let range), .body(_, let range): return range.count
            }
        }

        func parsed() -> JSONTree {
            switch self {
            case .frame(let frame, let range):
                return JSONTree(scanned: withExtendedLifetime(frame) { Array(frame.bytes[range]) }[...])
            case .body(let body, let range):
                return JSONTree(scanned: body[range])
            }
        }
    }

    enum Work: Sendable {
        /// Parse a state (retained or incoming; scanned whole by fluxd already) into a tree.
        case parse(StateBytes)
        /// Apply the patch at `patch` of `body` to `base`, or to `state` parsed first (a store that published
        /// whole states so far), keeping the state within `maxBytes`.
        case patch(base: JSONTree?, state: StateBytes?, body: [UInt8], patch: Range<Int>, maxBytes: Int)
        /// Encode `info`'s `stores` list (`Router.info`: a bus of many stores).
        case info([InfoRow])
        /// Nothing: a turn for the held frames that one `.prepared` event did not take (`Router.heldPerTurn`).
        case turn
    }

    /// The bytes of input the work reads (for the host's logs and tests).
    public var inputBytes: Int {
        switch work {
        case .parse(let state): return state.count
        case .patch(_, let state, _, let patch, _): return patch.count + (state?.count ?? 0)
        case .info(let rows): return rows.reduce(0) { $0 + $1.nameJSON.count }  // (the names: a rough size)
        case .turn: return 0
        }
    }

    /// Does the work. Pure: runs on any thread, touches nothing of the router's.
    public func run() -> PreparationResult {
        switch work {
        case .turn:
            return PreparationResult(number: number, outcome: .turn)
        case .info(let rows):
            return PreparationResult(number: number, outcome: .info(InfoRow.encode(rows)))
        case .parse(let state):
            return PreparationResult(number: number, outcome: .parsed(state.parsed()))
        case .patch(let base, let state, let body, let patch, let maxBytes):
            let operations: JSONPatch
            do { operations = try JSONPatch(scanned: body[patch]) } catch {
                return PreparationResult(number: number, outcome: .invalidPatch(error))
            }
            if operations.isEmpty { return PreparationResult(number: number, outcome: .empty) }
            var tree: JSONTree
            if let base {
                tree = base
            } else if let state {
                tree = state.parsed()
            } else {
                return PreparationResult(number: number, outcome: .turn)  // (nothing to patch: found out on the loop)
            }
            var steps = 0
            do {
                let applied = try tree.apply(operations, limits: TreePatchLimits(maxBytes: maxBytes), steps: &steps)
                return PreparationResult(number: number, outcome: .patched(tree, applied: applied, steps: steps,
                                                                            parsedState: base == nil))
            } catch {
                return PreparationResult(number: number, outcome: .patchFailed(error, parsedState: base == nil))
            }
        }
    }
}

/// Values whose release is long work (a replaced state tree: releasing it frees every node it alone holds, and a
/// patch into a large object copies most of its key index, so the old version holds most of it), carried by the
/// `.discard` effect to be dropped off the loop thread.
public struct Garbage: Sendable {
    let items: [any Sendable]
    /// How many values it carries.
    public var count: Int { items.count }
}

/// What a `Preparation` made (fed back with `RouterEvent.prepared`).
public struct PreparationResult: Sendable {
    public let number: UInt64
    let outcome: Outcome

    enum Outcome: Sendable {
        case parsed(JSONTree)
        case patched(JSONTree, applied: [JSONPatchOperation], steps: Int, parsedState: Bool)
        /// The patch has no operations.
        case empty
        /// The patch does not apply (or would make the state too large).
        case patchFailed(JSONPatchError, parsedState: Bool)
        /// The bytes are not a patch.
        case invalidPatch(JSONPatchError)
        /// `info`'s `stores` list, encoded.
        case info([UInt8])
        case turn
    }
}

/// A preparation the router is waiting for: whose, for which store, from which state.
struct PendingPreparation {
    let number: UInt64
    let store: StoreEntry?
    let version: UInt64
    /// The frame that needs it, taken again first once it is done (nil for a turn). Not charged: like the frame
    /// being handled, one per connection at most and within maxFrame (the frames behind it are).
    let frame: [UInt8]?
    /// The bytes of state parsed (a `.parse`), by which `preparedParse` knows its state.
    var stateBytes = 0
}

/// A prepared result, in hand while the frame it was made for is taken again.
struct PreparedWork {
    let peer: Peer
    let store: StoreEntry?
    let version: UInt64
    let stateBytes: Int
    let outcome: PreparationResult.Outcome
}

extension Router {
    /// Held frames one `.prepared` event takes before the peer waits for another turn (as a connection's reads
    /// are taken `framesPerTurn` at a time).
    static let heldPerTurn = 256

    /// The result prepared off the loop for the frame being taken again, if it was made for `peer` and for this
    /// store's current state.
    func preparedFor(_ peer: Peer, _ store: StoreEntry) -> PreparationResult.Outcome? {
        guard let work = preparedWork, work.peer === peer, work.store === store, work.version == store.version else { return nil }
        return work.outcome
    }

    /// The tree of a state of `bytes` bytes of `store` parsed off the loop for the frame being taken (an incoming
    /// state it publishes, or the retained one a path subscription needs), if that is what was prepared.
    func preparedParse(_ store: StoreEntry, bytes: Int) -> JSONTree? {
        guard let work = preparedWork, work.store === store, work.stateBytes == bytes,
              case .parsed(let tree) = work.outcome else { return nil }
        return tree
    }

    /// Starts `work` for `peer` off the loop and keeps `body`, the frame that needs it: nothing of the frame has
    /// been done yet, and it is taken again, before the frames held behind it, once the work is done.
    func prepare(_ peer: Peer, store: StoreEntry?, _ work: Preparation.Work, holding body: [UInt8], _ out: inout Output) {
        nextPreparation &+= 1
        peer.preparing = PendingPreparation(number: nextPreparation, store: store, version: store?.version ?? 0, frame: body)
        if case .parse(let state) = work { peer.preparing!.stateBytes = state.count }
        preparationsStarted &+= 1
        out.append(.prepare(peer.id, Preparation(number: nextPreparation, work: work)))
    }

    /// A frame from a peer whose preparation is running: kept, in order, charged to the peer's memory budget
    /// (`memory-budget` and the connection closed when it has no room).
    func hold(_ peer: Peer, _ body: [UInt8], _ out: inout Output) {
        guard memory.charge(peer.account, body.count) else {
            return fail(peer, .memoryBudget, "this connection's frames waiting behind its large patch or state outgrew fluxd's memory budget (uid \(peer.account.uid) holds \(memory.byUser[peer.account.uid] ?? 0) of \(config.memory.perUser) bytes)", &out, fatal: true)
        }
        peer.heldBytes += body.count
        peer.held.append(body)
    }

    /// The host's `.prepared`: the held frames are taken again in order, the first with the result in hand; a
    /// frame that needs another preparation holds the rest again.
    func prepared(_ id: PeerID, _ result: PreparationResult, now: Millis, _ out: inout Output) {
        guard let peer = peers[id], !peer.closing, let pending = peer.preparing, pending.number == result.number else { return }
        peer.preparing = nil
        if case .turn = result.outcome {} else {
            preparedWork = PreparedWork(peer: peer, store: pending.store, version: pending.version,
                                        stateBytes: pending.stateBytes, outcome: result.outcome)
        }
        if let frame = pending.frame {
            receive(peer, frame, now: now, &out)
            if let work = preparedWork { discard(work.outcome) }  // (the patch's operations, released off the loop)
            preparedWork = nil
        }
        var taken = 0
        while peer.preparing == nil, !peer.closing, let body = peer.held.popFirst() {
            if taken == Router.heldPerTurn {
                peer.held.prepend(body)
                nextPreparation &+= 1
                peer.preparing = PendingPreparation(number: nextPreparation, store: nil, version: 0, frame: nil)
                out.append(.prepare(peer.id, Preparation(number: nextPreparation, work: .turn)))
                break
            }
            taken += 1
            peer.heldBytes -= body.count
            memory.release(peer.account, body.count)
            receive(peer, body, now: now, &out)
            preparedWork = nil
        }
        preparedWork = nil
    }

    /// Has `value` released off the loop (`.discard`, at the end of the event).
    func discard(_ value: any Sendable) { garbage.append(value) }

    /// A closed peer's held frames are dropped (and their charge returned).
    func dropHeld(_ peer: Peer) {
        memory.release(peer.account, peer.heldBytes + peer.infoRowsCharge)
        peer.heldBytes = 0
        peer.infoRowsCharge = 0
        peer.held.removeAll()
        peer.preparing = nil
    }

    /// The retained state's bytes, for a parse off the loop (nil while a tree is newer).
    func retainedStateBytes(_ store: StoreEntry) -> Preparation.StateBytes? {
        guard store.tree == nil || store.treePayer != nil, let snapshot = store.snapshot else { return nil }
        return .frame(snapshot, store.stateRange)
    }
}
