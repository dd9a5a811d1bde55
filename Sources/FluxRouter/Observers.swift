import DequeModule
import FluxCore

// Observers: what monitors are told (SPEC §8.10). The semantics call one method per kind of event; each builds
// its frame only when a monitor is connected, so without monitors an event costs a branch. The host is told of
// store changes here too (`RouterEffect.storeChanged`). Counters are counted where frames go out (`Output`) and
// errors in `fail`.
extension Router {
    // MARK: - Monitor events

    /// Sends one `event` to every monitor; the frame is built only when a monitor is connected. (Inlined, so that
    /// without monitors the caller does not even build the closure and retain what it captures.)
    @inline(__always)
    func emit(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        guard !monitors.isEmpty else { return }
        emitNow(kind, &out, fields)
    }

    func emitNow(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        var b = FrameBuilder(op: "event")
        b.constant("kind", kind)
        b.int("t", now - (epoch ?? now))
        fields(&b)
        let frame = b.finish()
        for id in monitors {
            if let p = peers[id], !p.closing { out.append(.monitor(id, frame)) }
        }
    }

    @inline(__always)
    func observeConnect(_ peer: Peer, _ out: inout Output) {
        emit("connect", &out) { e in
            e.int("peer", peer.id)
            e.string("role", peer.role?.rawValue ?? "")
            e.string("name", peer.name)
            if let pid = peer.creds.pid { e.int("pid", pid) }
            if let uid = peer.creds.uid { e.int("uid", uid) }
        }
    }

    @inline(__always)
    func observeDisconnect(_ peer: Peer, _ out: inout Output) {
        emit("disconnect", &out) { e in
            e.int("peer", peer.id)
            e.string("name", peer.name)
        }
    }

    /// A store registered (monitors get `store-up`; the host a store change).
    func observeStoreUp(_ name: String, version: UInt64, owner: Peer, _ out: inout Output) {
        emit("store-up", &out) { e in
            e.string("store", name)
            e.int("version", version)
        }
        out.append(.storeChanged(StoreChange(store: name, status: .up, owner: owner.id, ownerPID: owner.creds.pid)))
    }

    /// A store went down (monitors get `store-down`; the host a store change).
    func observeStoreDown(_ store: StoreEntry, reason: StaticString, _ out: inout Output) {
        emit("store-down", &out) { e in
            e.string("store", store.name)
            e.constant("reason", reason)
        }
        out.append(.storeChanged(StoreChange(store: store.name, status: .down)))
    }

    @inline(__always)
    func observeDispatch(_ action: ActionRecord, type: String, from peer: Peer, _ out: inout Output) {
        emit("dispatch", &out) { e in
            e.int("seq", action.seq)
            e.string("type", type)
            e.int("origin", peer.id)
            e.string("originName", peer.name)
            if let cause = action.cause { e.int("cause", cause) }
            e.raw("payload", action.payload)
        }
    }

    @inline(__always)
    func observeSettle(_ action: ActionRecord, results: [UInt8], _ out: inout Output) {
        emit("settle", &out) { e in
            e.int("seq", action.seq)
            e.raw("results", results)
        }
    }

    @inline(__always)
    func observeSnapshot(_ store: StoreEntry, seq: UInt64, state: ArraySlice<UInt8>, _ out: inout Output) {
        emit("snapshot", &out) { e in
            e.string("store", store.name)
            e.int("version", store.version)
            e.int("seq", seq)
            e.raw("state", state)
        }
    }

    /// SPEC §16.5: a change that came as a patch only.
    func observeDelta(_ store: StoreEntry, seq: UInt64, patch: ArraySlice<UInt8>, _ out: inout Output) {
        emit("delta", &out) { e in
            e.string("store", store.name)
            e.int("from", store.version - 1)
            e.int("version", store.version)
            e.int("seq", seq)
            e.raw("patch", patch)
        }
    }

    @inline(__always)
    func observeError(_ peer: Peer, _ code: ErrorCode, _ message: String, _ out: inout Output) {
        emit("error", &out) { e in
            e.int("peer", peer.id)
            e.string("code", code.rawValue)
            e.string("message", message)
        }
    }

    func observeStall(_ name: String, seq: UInt64, waited: Millis, _ out: inout Output) {
        emit("store-stalled", &out) { e in
            e.string("store", name)
            e.int("seq", seq)
            e.int("waited", waited)
        }
    }

    func observeRecovery(_ store: StoreEntry, _ out: inout Output) {
        emit("store-recovered", &out) { e in e.string("store", store.name) }
    }
}
