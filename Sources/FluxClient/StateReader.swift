import FluxCore
import FluxJSONValue
import Synchronization

// How subscribers turn what fluxd sends (whole snapshots, and on a delta subscription, SPEC §16.3, patches from
// the version they hold) into states. A subscriber holds the state as a JSONValue tree, applies each patch to it in
// place, and decodes the typed state incrementally: a `TrackedArray` the patch did not touch is the earlier value
// again, and one whose elements it touched decodes only those (`JSONIncrementalDecoder`).

/// What a reader makes of one snapshot or delta.
package enum ReadStep<S> {
    /// The state at the snapshot's version.
    case state(S)
    /// Nothing new (a resync's snapshot of the version held already).
    case skip
    /// The delta is not from the version held: ask fluxd for the whole state again.
    case resync
}

/// The state a reader holds between two events; taken out while a change is applied (no lock is held while the
/// patch is applied or user types decode), then put back.
struct HeldState<Codec>: @unchecked Sendable {
    /// The state as JSON, once a delta needed it (parsed lazily from `bytes`).
    var tree: JSONValue?
    /// The last whole snapshot's bytes, while `tree` is not made yet.
    var bytes: ArraySlice<UInt8>?
    var version = 0
    var era = 0
    /// What the reader decodes with (it keeps the earlier decoded state).
    var codec: Codec

    /// Takes in a whole snapshot (nil: it is the version held already).
    mutating func whole(_ raw: RawSnapshot) -> Bool {
        if raw.era != era {
            era = raw.era
            version = 0
        }
        if raw.version <= version && (tree != nil || bytes != nil) { return false }
        version = raw.version
        tree = nil
        bytes = raw.state
        return true
    }

    /// Applies a delta to the held tree; false when it is not from the version held (or does not apply).
    mutating func apply(_ raw: RawSnapshot, patch: JSONPatch) -> Bool {
        guard raw.era == era, raw.from == version else { return false }
        if tree == nil {
            guard let bytes, let parsed = try? JSONValue(parsing: bytes) else { return false }
            tree = parsed
            self.bytes = nil
        }
        do {
            try tree!.apply(patch)
        } catch {
            tree = nil
            version = 0
            return false
        }
        version = raw.version
        return true
    }
}

/// Reads snapshots and deltas for one consumer (one `Subscription`, or one callback subscriber). Single consumer:
/// the held state is taken out under a short lock and put back after the work.
package final class StateReader<S: Sendable, Codec>: Sendable {
    private let held: Mutex<HeldState<Codec>?>
    /// Decodes a whole state (bytes, and the tree when the reader has one).
    private let decodeWhole: @Sendable (inout Codec, ArraySlice<UInt8>) throws(FluxError) -> S
    /// Decodes the state after a patch (the tree after it, the patch).
    private let decodeAfter: @Sendable (inout Codec, JSONValue, JSONPatch) throws(FluxError) -> S
    /// Decodes a whole state from a tree (a waiting snapshot with deltas merged into it).
    private let decodeTree: @Sendable (inout Codec, JSONValue) throws(FluxError) -> S

    init(codec: Codec,
         whole: @escaping @Sendable (inout Codec, ArraySlice<UInt8>) throws(FluxError) -> S,
         after: @escaping @Sendable (inout Codec, JSONValue, JSONPatch) throws(FluxError) -> S,
         tree: @escaping @Sendable (inout Codec, JSONValue) throws(FluxError) -> S) {
        held = Mutex(HeldState(codec: codec))
        decodeWhole = whole
        decodeAfter = after
        decodeTree = tree
    }

    package func read(_ raw: RawSnapshot) throws(FluxError) -> ReadStep<S> {
        guard var state = held.withLock({ h -> HeldState<Codec>? in
            defer { h = nil }
            return h
        }) else {
            throw .invalidArgument("a subscription's snapshots were read by two consumers at once")
        }
        defer { held.withLock { $0 = state } }
        if raw.mustResync { return .resync }
        if let patch = raw.patch, !raw.state.isEmpty {
            // A whole snapshot with the deltas that came while it waited merged into it: the whole state, then
            // the patch, decoded whole (the earlier decoded state is of another version).
            var base = raw
            base.version = raw.from
            base.patch = nil
            _ = state.whole(base)
            guard state.apply(raw, patch: patch) else { return .resync }
            return .state(try decodeTree(&state.codec, state.tree!))
        }
        if let patch = raw.patch {
            guard state.apply(raw, patch: patch) else { return .resync }
            return .state(try decodeAfter(&state.codec, state.tree!, patch))
        }
        guard state.whole(raw) else { return .skip }
        return .state(try decodeWhole(&state.codec, raw.state))
    }
}

/// A typed reader's codec: the incremental decoder, which keeps the earlier decoded state's tracked arrays.
package struct TypedCodec<S: Decodable>: @unchecked Sendable {
    var decoder = JSONIncrementalDecoder<S>()
}

extension StateReader {
    /// Decodes states as `T`: whole snapshots with `JSONValueDecoder` (after parsing them to a tree), and deltas
    /// incrementally.
    package static func typed<T: Decodable & Sendable>(_ type: T.Type) -> StateReader<T, TypedCodec<T>> {
        StateReader<T, TypedCodec<T>>(
            codec: TypedCodec<T>(),
            whole: { codec, bytes throws(FluxError) in
                do {
                    return try codec.decoder.decode(try JSONValue(parsing: bytes))
                } catch {
                    throw .coding("cannot decode \(T.self): \(error)")
                }
            },
            after: { codec, tree, patch throws(FluxError) in
                do {
                    return try codec.decoder.decode(tree, after: patch.touches)
                } catch {
                    throw .coding("cannot decode \(T.self): \(error)")
                }
            },
            tree: { codec, tree throws(FluxError) in
                do {
                    return try codec.decoder.decode(tree)
                } catch {
                    throw .coding("cannot decode \(T.self): \(error)")
                }
            })
    }

    /// Hands out states as JSON bytes: whole snapshots as sent, deltas applied and rendered (compact).
    static func json() -> StateReader<RawJSON, Void> {
        StateReader<RawJSON, Void>(
            codec: (),
            whole: { _, bytes in RawJSON(Array(bytes)) },
            after: { _, tree, _ in RawJSON(tree.compactBytes) },
            tree: { _, tree in RawJSON(tree.compactBytes) })
    }

    /// Hands out whole snapshots as raw bytes (for callback subscribers).
    static func raw() -> StateReader<ArraySlice<UInt8>, Void> {
        StateReader<ArraySlice<UInt8>, Void>(
            codec: (),
            whole: { _, bytes in bytes },
            after: { _, tree, _ in tree.compactBytes[...] },
            tree: { _, tree in tree.compactBytes[...] })
    }
}

/// Turns a callback subscriber's deltas into whole snapshots (tools and followed stores read whole states).
final class WholeSnapshots: Sendable {
    enum Step {
        case deliver(RawSnapshot)
        case skip
        case resync
    }

    private let reader = StateReader<ArraySlice<UInt8>, Void>.raw()

    func take(_ raw: RawSnapshot) -> Step {
        guard raw.isDelta else {
            // Whole snapshots pass as they are (the reader remembers them), unless it holds that version already.
            if case .skip? = try? reader.read(raw) { return .skip }
            return .deliver(raw)
        }
        switch (try? reader.read(raw)) ?? .resync {
        case .state(let bytes):
            return .deliver(RawSnapshot(store: raw.store, version: raw.version, seq: raw.seq, state: bytes, era: raw.era))
        case .skip: return .skip
        case .resync: return .resync
        }
    }
}
